"""The one model configuration of the transformer families: a `TransformerConfig` says the shape and behaviour of
every encoder (BERT, RoBERTa, XLM-R, ELECTRA, ALBERT, DistilBERT, Longformer), decoder (GPT-2) and encoder-decoder
(BART, T5) built from the shared parts. A family is a config plus its checkpoint tables.

The dataclass defaults are BERT's (post-norm, learned positions, token types, an embedding norm, a pooler);
`TransformerConfig.decoder(...)` starts from a GPT-2-shaped decoder's instead (pre-norm, a final norm, no token
types, no pooler), and `preset(name, ...)` gives BERT at one of the published sizes."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal

from bertology.errors import ConfigError

Family = Literal["bert", "roberta", "xlm-roberta", "electra", "albert", "distilbert", "longformer", "transformer", "modernbert",
                 "gpt2", "t5", "bart", "deberta-v2"]
# The encoder families (bidirectional, BERT's layout of parameters) and the decoder and encoder-decoder ones.
ENCODER_FAMILIES: tuple[str, ...] = ("bert", "roberta", "xlm-roberta", "electra", "albert", "distilbert",
                                     "longformer")
FAMILIES: tuple[str, ...] = (*ENCODER_FAMILIES, "transformer", "gpt2", "t5", "bart", "modernbert", "deberta-v2")
ACTIVATIONS: tuple[str, ...] = ("gelu", "gelu_new", "gelu_pytorch_tanh", "gelu_fast", "relu", "silu", "swish", "tanh")
PositionKind = Literal["learned", "sinusoidal", "relative", "rotary", "none"]
POSITION_KINDS = ("learned", "sinusoidal", "relative", "rotary", "none")
DEFAULT_ROTARY_THETA = 10000.0
# DeBERTa's disentangled attention terms (`pos_att_type`): content-to-position and position-to-content.
RELATIVE_TERMS = ("c2p", "p2c")


@dataclass
class TransformerConfig:
    """Shape and behaviour of a transformer stack (or two, an encoder-decoder's) built from the shared blocks."""

    family: Family = "bert"
    vocab_size: int = 30522
    hidden_size: int = 768
    num_layers: int = 12  # the stack's depth; an encoder-decoder's encoder depth
    num_decoder_layers: int | None = None  # an encoder-decoder's decoder depth (None: num_layers)
    num_heads: int = 12
    attention_head_size: int | None = None  # None: hidden_size // num_heads (T5's d_kv)
    intermediate_size: int = 3072
    hidden_act: str = "gelu"
    max_position_embeddings: int = 512
    positions: PositionKind = "learned"
    # BART: the learned table has this many unused rows before position 0 (beyond max_position_embeddings).
    position_offset: int = 0
    # RoBERTa and XLM-R number positions from pad_token_id + 1 (fairseq's convention), within
    # max_position_embeddings rows; BERT from 0.
    positions_after_padding: bool = False
    relative_attention_num_buckets: int = 32
    relative_attention_max_distance: int = 128
    # Number of segment (token type) embeddings; 0 means the model has none (DistilBERT, the decoders).
    type_vocab_size: int = 2
    # Width of the token embeddings when a projection to hidden_size follows them (ELECTRA small, ALBERT);
    # None: embeddings are hidden_size wide and nothing is projected.
    embedding_size: int | None = None
    # ALBERT's cross-layer sharing: depth is num_layers, but only num_layer_groups x inner_group_size layers exist.
    num_layer_groups: int | None = None
    inner_group_size: int = 1
    norm: Literal["layernorm", "rmsnorm"] = "layernorm"
    layer_norm_eps: float = 1e-12
    pre_norm: bool = False
    embedding_norm: bool = True  # a norm right after the embeddings (BERT's, BART's layernorm_embedding)
    final_norm: bool = False  # a norm after the last block (GPT-2's ln_f, T5's final_layer_norm)
    final_dropout: bool = False  # hidden_dropout after the final norm (T5's stacks drop out their output)
    gated_ffn: bool = False
    bias: bool = True
    attention_scale: float | None = None  # None: 1 / sqrt(head_dim)
    embedding_scale: float = 1.0  # token embeddings multiplied by this (BART with scale_embedding: sqrt(hidden))
    logit_scale: float = 1.0  # tied LM logits multiplied by this (T5 v1.0: hidden ** -0.5)
    hidden_dropout: float = 0.1
    attention_dropout: float = 0.1
    embedding_dropout: float | None = None  # None: hidden_dropout (GPT-2's embd_pdrop)
    activation_dropout: float = 0.0  # after the feed-forward's activation (BART)
    classifier_dropout: float | None = None
    pad_token_id: int = 0
    bos_token_id: int | None = None
    eos_token_id: int | None = None
    decoder_start_token_id: int | None = None
    # BART: given neither decoder_input_ids nor labels, the decoder reads input_ids shifted right behind the start
    shifted_decoder_inputs: bool = False
    # A prefix LM (a decoder; the T5 paper's): an input read with no cache yet and no `lm_prefix` given is all
    # prefix, seen in both directions (fine-tuning on a whole input, a prompt before generation); tokens fed after
    # it through the cache are causal. Training passes its own split (`lm_prefix`).
    prefix_lm: bool = False
    pooler: bool = True  # an encoder model's [CLS] pooler
    # Where an encoder's input embeddings live: True, in its stack (BERT's layout, `encoder.embeddings.{word,
    # position, token_type, norm, project}`); False, one token table of the model's (`embeddings`, what an
    # encoder-decoder shares between its sides: T5's and BART's encoder alone, ModernBERT), the stack adding the
    # positions and the embedding norm itself (`encoder.embedding_norm`). None: the family's layout (the BERT-family
    # encoders of ENCODER_FAMILIES and DeBERTa the stack's, every other family the model's). Decoders and encoder-decoders always
    # hold the table in the model.
    stack_embeddings: bool | None = None
    initializer_range: float = 0.02
    # Heads removed from each layer (layer index -> head indices in the unpruned numbering), as transformers'
    # config.json `pruned_heads` says: those layers' query/key/value and attention output are narrower.
    pruned_heads: dict[int, list[int]] = field(default_factory=dict)
    # Per layer, the width of its sliding attention window (even: half on each side; Longformer's), or None for
    # attention from every token to every token; a windowed layer has separate query/key/value projections for the
    # global tokens. One number stands for every layer; None (the whole field): no window anywhere.
    attention_window: list[int | None] | None = None
    # Whether a windowed layer has the global tokens' own projections (Longformer's); ModernBERT's windows have none.
    global_projections: bool = True
    # Rotary positions (positions "rotary"): the base of the angles of the layers attending globally, and of those
    # with a window (None: the same); None: 10,000. Set only with rotary positions.
    rotary_theta: float | None = None
    rotary_theta_local: float | None = None
    norm_bias: bool = True  # the LayerNorms' biases
    first_attention_norm: bool = True  # False (pre-norm): layer 0 has no norm before its attention
    # The heads' dense layer before their norm (masked-LM transform, prediction heads) has a bias
    head_bias: bool = True
    classifier_pooling: Literal["cls", "mean"] = "cls"  # what a "prediction_pooled" sentence head reads
    # DeBERTa's disentangled attention (bertology.model.disentangled): with `relative_attention`, a table of
    # relative-position embeddings (2 x span rows: span = position_buckets when positive, else
    # max_relative_positions, itself max_position_embeddings when not positive), layer-normed when `relative_norm`,
    # projected per layer by the block's key / query projections (`share_att_key`) or by its own `pos_key` /
    # `pos_query`, and the terms of `pos_att_type` ("c2p", "p2c") added to the scores. The attention scale is
    # 1 / sqrt(head_dim x (1 + number of terms)) whenever terms are named (as transformers scales them).
    relative_attention: bool = False
    pos_att_type: tuple[str, ...] = ()
    position_buckets: int = -1  # log-bucketed distances (positive: the buckets on each side), else exact ones
    max_relative_positions: int = -1
    share_att_key: bool = False
    relative_norm: bool = False
    # DeBERTa-v2's convolution beside layer 0 (conv_kernel_size > 0): LayerNorm(layer 0's output + act(conv(x_0)))
    conv_kernel_size: int = 0
    conv_groups: int = 1
    conv_act: str = "tanh"
    # Keys of the published config.json that bertology does not use, kept so that a saved checkpoint round-trips.
    extra: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.family not in FAMILIES:
            raise ConfigError(f"unknown model family {self.family!r}; expected one of {', '.join(FAMILIES)}")
        for name in ("vocab_size", "hidden_size", "num_layers", "num_heads", "intermediate_size"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be positive, got {getattr(self, name)}")
        if self.hidden_act not in ACTIVATIONS:
            raise ConfigError(f"unknown activation {self.hidden_act!r}; expected one of {', '.join(ACTIVATIONS)}")
        if self.num_decoder_layers is not None and self.num_decoder_layers <= 0:
            raise ConfigError(f"num_decoder_layers must be positive, got {self.num_decoder_layers}")
        if self.attention_head_size is None and self.hidden_size % self.num_heads:
            raise ConfigError(f"hidden_size {self.hidden_size} is not divisible by num_heads {self.num_heads}")
        if self.positions not in POSITION_KINDS:
            raise ConfigError(f"positions: expected {', '.join(POSITION_KINDS)}, got {self.positions!r}")
        for name in ("rotary_theta", "rotary_theta_local"):
            value = getattr(self, name)
            if value is None:
                continue
            if self.positions != "rotary":
                raise ConfigError(f"{name}: {value!r} is a setting of rotary positions; this config's positions are "
                                  f"{self.positions!r}")
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ConfigError(f"{name}: expected a positive number, got {value!r}")
        if self.positions == "rotary" and self.head_dim % 2:
            raise ConfigError(f"positions: rotary positions need an even head size, got {self.head_dim}")
        if not self.first_attention_norm and not self.pre_norm:
            raise ConfigError("first_attention_norm: false (no norm before layer 0's attention) needs pre_norm")
        if self.classifier_pooling not in ("cls", "mean"):
            raise ConfigError(f"classifier_pooling: expected cls or mean, got {self.classifier_pooling!r}")
        if self.norm not in ("layernorm", "rmsnorm"):
            raise ConfigError(f"norm: expected layernorm or rmsnorm, got {self.norm!r}")
        if self.num_layer_groups is not None and self.num_layers % self.num_layer_groups:
            raise ConfigError(
                f"num_layers {self.num_layers} is not divisible by num_layer_groups {self.num_layer_groups}"
            )
        if self.stack_embeddings is None:
            self.stack_embeddings = self.family in (*ENCODER_FAMILIES, "deberta-v2")
        elif not isinstance(self.stack_embeddings, bool):
            raise ConfigError(f"stack_embeddings: expected true, false or null, got {self.stack_embeddings!r}")
        self.pruned_heads = self.checked_pruned_heads(self.pruned_heads)
        self.attention_window = self.checked_windows(self.attention_window)
        self.check_relative_terms()

    def check_relative_terms(self) -> None:
        """DeBERTa's settings: known terms, a span the buckets fit in, a convolution's width."""
        terms = self.pos_att_type
        if isinstance(terms, str):
            terms = [t.strip() for t in terms.lower().split("|") if t.strip()]
        if not isinstance(terms, (list, tuple)) or not all(isinstance(t, str) for t in terms):
            raise ConfigError(f"pos_att_type: expected a list of {', '.join(RELATIVE_TERMS)}, got {terms!r}")
        unknown = [t for t in terms if t not in RELATIVE_TERMS]
        if unknown:
            raise ConfigError(f"pos_att_type: unknown entry {unknown[0]!r}; expected any of {', '.join(RELATIVE_TERMS)} "
                              "(content-to-position, position-to-content)")
        self.pos_att_type = tuple(dict.fromkeys(terms))
        for name in ("position_buckets", "max_relative_positions", "conv_kernel_size", "conv_groups"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ConfigError(f"{name}: expected a whole number, got {value!r}")
        if self.relative_attention and self.position_buckets > 0:
            if self.position_buckets > self.relative_distance:
                raise ConfigError(f"position_buckets: {self.position_buckets} buckets on each side for relative "
                                  f"distances up to {self.relative_distance} (max_relative_positions): the buckets "
                                  "must not outnumber the distances they bucket")
            if self.position_buckets < 2:
                raise ConfigError(f"position_buckets: expected at least 2 buckets, got {self.position_buckets}")
        if self.conv_kernel_size < 0 or (self.conv_kernel_size and self.conv_kernel_size % 2 == 0):
            raise ConfigError(f"conv_kernel_size: expected 0 (no convolution) or an odd width, got "
                              f"{self.conv_kernel_size}")
        if self.conv_kernel_size and (self.conv_groups <= 0 or self.hidden_size % self.conv_groups):
            raise ConfigError(f"conv_groups: {self.conv_groups} does not divide hidden_size {self.hidden_size}")
        if self.conv_kernel_size and self.conv_act not in ACTIVATIONS:
            raise ConfigError(f"conv_act: unknown activation {self.conv_act!r}; expected one of {', '.join(ACTIVATIONS)}")

    @property
    def relative_distance(self) -> int:
        """The largest relative distance DeBERTa's table tells apart (max_relative_positions, or the absolute
        positions' count when that is not positive)."""
        return self.max_relative_positions if self.max_relative_positions > 0 else self.max_position_embeddings

    @property
    def learned_positions(self) -> bool:
        """Whether the model has a learned table of absolute positions."""
        return self.positions == "learned"

    @property
    def relative_key_projection(self) -> bool:
        """Whether DeBERTa's layers project the relative positions' keys with a projection of their own."""
        return self.relative_attention and not self.share_att_key and "c2p" in self.pos_att_type

    @property
    def relative_query_projection(self) -> bool:
        """Whether DeBERTa's layers project the relative positions' queries with a projection of their own."""
        return self.relative_attention and not self.share_att_key and "p2c" in self.pos_att_type

    @property
    def relative_span(self) -> int:
        """Half the rows of DeBERTa's relative-position table: the buckets on each side, else the distance."""
        return self.position_buckets if self.position_buckets > 0 else self.relative_distance

    @classmethod
    def decoder(cls, **values: Any) -> TransformerConfig:
        """A config starting from a GPT-2-shaped decoder's defaults (DECODER_DEFAULTS), then `values`."""
        return cls(**{**DECODER_DEFAULTS, **values})

    @classmethod
    def bert(cls, **values: Any) -> TransformerConfig:
        """A config starting from BERT's defaults (the dataclass's), then `values`."""
        return cls(**values)

    def checked_windows(self, windows: Any) -> list[int | None] | None:
        """`attention_window` as one even, positive window (or None: global attention) per layer (a number stands
        for every layer)."""
        if windows is None:
            return None
        if isinstance(windows, int) and not isinstance(windows, bool):
            windows = [windows] * self.num_layers
        if not isinstance(windows, (list, tuple)) or not all(
                w is None or (isinstance(w, int) and not isinstance(w, bool)) for w in windows):
            raise ConfigError(f"attention_window: expected a number or one number (or null) per layer, got "
                              f"{windows!r}")
        if len(windows) != self.num_layers:
            raise ConfigError(f"attention_window: {len(windows)} windows for {self.num_layers} layers")
        for layer, window in enumerate(windows):
            if window is not None and (window <= 0 or window % 2):
                raise ConfigError(f"attention_window: the window of layer {layer} is {window}; it must be even and "
                                  "positive (half of it on each side of a token)")
        if self.num_layer_groups is not None or self.pruned_heads:
            raise ConfigError("attention_window: windows are not supported with shared layers (num_layer_groups) "
                              "or pruned heads")
        return list(windows)

    def window_of(self, layer: int) -> int | None:
        """The attention window of layer `layer` (a layer call's unique layer), None for full attention."""
        return self.attention_window[layer] if self.attention_window is not None else None

    @property
    def theta_of_global(self) -> float:
        """The rotary base of the layers that attend globally."""
        return self.rotary_theta if self.rotary_theta is not None else DEFAULT_ROTARY_THETA

    def theta_of(self, layer: int) -> float:
        """The rotary base of layer `layer`: rotary_theta_local for a windowed layer when set, else rotary_theta."""
        theta = self.rotary_theta if self.rotary_theta is not None else DEFAULT_ROTARY_THETA
        if self.window_of(layer) is not None and self.rotary_theta_local is not None:
            return self.rotary_theta_local
        return theta

    def checked_pruned_heads(self, pruned: Any) -> dict[int, list[int]]:
        """`pruned` with int layer keys (JSON writes them as strings) and sorted, distinct head lists; empty lists
        dropped. Layers and heads out of range are a ConfigError."""
        if not isinstance(pruned, dict):
            raise ConfigError(f"pruned_heads must be a mapping of layer -> heads, got {type(pruned).__name__}")
        if pruned and self.num_layer_groups is not None:
            raise ConfigError("pruned_heads: pruning the heads of shared layers (ALBERT) is not supported")
        out: dict[int, list[int]] = {}
        for layer, heads in pruned.items():
            try:
                index = int(layer)
                chosen = sorted({int(h) for h in heads})
            except (TypeError, ValueError):
                raise ConfigError(f"pruned_heads[{layer!r}]: expected a layer index and a list of head indices, "
                                  f"got {heads!r}") from None
            if not 0 <= index < self.num_layers:
                raise ConfigError(f"pruned_heads: layer {layer!r} is not in [0, {self.num_layers})")
            if chosen and not (0 <= chosen[0] and chosen[-1] < self.num_heads):
                raise ConfigError(f"pruned_heads[{layer!r}]: heads {chosen} are not all in [0, {self.num_heads})")
            if chosen:
                out[index] = chosen
        return dict(sorted(out.items()))

    def kept_heads(self, layer: int) -> list[int]:
        """The heads (unpruned numbering) that layer `layer` has, in order."""
        pruned = set(self.pruned_heads.get(layer, ()))
        return [h for h in range(self.num_heads) if h not in pruned]

    def heads_in_layer(self, layer: int) -> int:
        return self.num_heads - len(self.pruned_heads.get(layer, ()))

    @property
    def head_dim(self) -> int:
        return self.attention_head_size or self.hidden_size // self.num_heads

    @property
    def decoder_depth(self) -> int:
        """An encoder-decoder's decoder depth."""
        return self.num_decoder_layers or self.num_layers

    @property
    def head_dropout(self) -> float:
        """Dropout before classification heads: classifier_dropout when set, else hidden_dropout (as transformers)."""
        return self.classifier_dropout if self.classifier_dropout is not None else self.hidden_dropout

    @property
    def first_position(self) -> int:
        """The row of the position table the first real token reads: pad_token_id + 1 with fairseq's positions,
        else position_offset (BART's 2, else 0)."""
        return self.pad_token_id + 1 if self.positions_after_padding else self.position_offset

    @property
    def max_length(self) -> int:
        """The longest sequence (special tokens included) the absolute positions cover; unbounded without them."""
        if self.positions not in ("learned", "sinusoidal", "rotary"):
            return 1 << 30
        return self.max_position_embeddings - (self.pad_token_id + 1 if self.positions_after_padding else 0)

    @property
    def token_embedding_size(self) -> int:
        return self.embedding_size or self.hidden_size

    @property
    def num_unique_layers(self) -> int:
        if self.num_layer_groups is None:
            return self.num_layers
        return self.num_layer_groups * self.inner_group_size

    def layer_plan(self) -> list[tuple[int, ...]]:
        """For each step of depth, the indices of the (possibly shared) layers it runs, in order."""
        if self.num_layer_groups is None:
            return [(i,) for i in range(self.num_layers)]
        per_group = self.num_layers // self.num_layer_groups
        plan = []
        for depth in range(self.num_layers):
            group = depth // per_group
            start = group * self.inner_group_size
            plan.append(tuple(range(start, start + self.inner_group_size)))
        return plan

    def to_dict(self) -> dict[str, Any]:
        return config_to_dict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TransformerConfig:
        """The config a native-format dict describes. A dict written before the encoders' and the decoders' configs
        were one class lacks the other half's fields: a decoder's (no `type_vocab_size`) takes DECODER_DEFAULTS for
        them, an encoder's BERT's."""
        if data and "type_vocab_size" not in data and "pre_norm" in data:
            data = {**{k: v for k, v in DECODER_DEFAULTS.items() if k in ENCODER_ONLY_FIELDS}, **data}
        what = "encoder" if data.get("family", "bert") in ENCODER_FAMILIES else "transformer"
        return config_from_dict(cls, data, what)


# A decoder's defaults where they differ from BERT's (GPT-2's shape: pre-norm, a final norm, no token types).
DECODER_DEFAULTS: dict[str, Any] = dict(
    family="transformer", vocab_size=50257, hidden_act="gelu_new", max_position_embeddings=1024,
    layer_norm_eps=1e-5, pre_norm=True, embedding_norm=False, final_norm=True, type_vocab_size=0, pooler=False,
)

# The fields only the encoders' settings cover, and those only the decoders' and encoder-decoders' do (the run
# config's two model schemas).
ENCODER_ONLY_FIELDS: tuple[str, ...] = (
    "type_vocab_size", "embedding_size", "num_layer_groups", "inner_group_size", "positions_after_padding",
    "pooler", "pruned_heads",
)
DECODER_ONLY_FIELDS: tuple[str, ...] = (
    "num_decoder_layers", "attention_head_size", "positions", "position_offset", "relative_attention_num_buckets",
    "relative_attention_max_distance", "norm", "pre_norm", "embedding_norm", "final_norm", "final_dropout",
    "gated_ffn", "bias", "attention_scale", "embedding_scale", "logit_scale", "embedding_dropout", "activation_dropout", "bos_token_id",
    "eos_token_id", "decoder_start_token_id", "shifted_decoder_inputs", "prefix_lm",
)


def config_to_dict(config: Any) -> dict[str, Any]:
    """A model config dataclass as the native format stores it: every field but `extra` (the unused keys of a
    published config.json, which only its own format keeps). Tuples are written as the lists JSON reads back."""
    data = dataclasses.asdict(config)
    data.pop("extra", None)
    return {key: list(value) if isinstance(value, tuple) else value for key, value in data.items()}


def config_from_dict(cls: type, data: dict[str, Any], what: str) -> Any:
    """`cls(**data)`, with keys the dataclass lacks named in one ConfigError."""
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ConfigError(f"unknown {what} config key(s): {', '.join(unknown)}")
    return cls(**data)


# The model sizes of the BERT paper and of Turc et al. (2019) "Well-Read Students Learn Better": (layers, hidden).
PRESET_SIZES: dict[str, tuple[int, int]] = {
    "tiny": (2, 128),
    "mini": (4, 256),
    "small": (4, 512),
    "medium": (8, 512),
    "base": (12, 768),
    "large": (24, 1024),
}


def preset(name: str, **overrides: Any) -> TransformerConfig:
    """A BERT config of a published size: hidden/64 heads and a 4 x hidden feed-forward, as in the papers."""
    if name not in PRESET_SIZES:
        raise ConfigError(f"unknown preset {name!r}; expected one of {', '.join(PRESET_SIZES)}")
    layers, hidden = PRESET_SIZES[name]
    values: dict[str, Any] = dict(
        num_layers=layers, hidden_size=hidden, num_heads=hidden // 64, intermediate_size=4 * hidden
    )
    values.update(overrides)
    return TransformerConfig(**values)
