"""The encoder's configuration: one dataclass covers BERT, RoBERTa, XLM-R, ELECTRA, ALBERT, DistilBERT and
Longformer."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal

from bertology.errors import ConfigError

Family = Literal["bert", "roberta", "xlm-roberta", "electra", "albert", "distilbert", "longformer"]
FAMILIES: tuple[str, ...] = ("bert", "roberta", "xlm-roberta", "electra", "albert", "distilbert", "longformer")
ACTIVATIONS: tuple[str, ...] = ("gelu", "gelu_new", "gelu_pytorch_tanh", "gelu_fast", "relu", "silu", "swish", "tanh")


@dataclass
class EncoderConfig:
    """Shape and behaviour of a bidirectional transformer encoder (post-LayerNorm, as all these families are)."""

    family: Family = "bert"
    vocab_size: int = 30522
    hidden_size: int = 768
    num_layers: int = 12
    num_heads: int = 12
    intermediate_size: int = 3072
    hidden_act: str = "gelu"
    max_position_embeddings: int = 512
    # Number of segment (token type) embeddings; 0 means the model has none (DistilBERT).
    type_vocab_size: int = 2
    # Width of the token embeddings when a projection to hidden_size follows them (ELECTRA small, ALBERT);
    # None: embeddings are hidden_size wide and nothing is projected.
    embedding_size: int | None = None
    # ALBERT's cross-layer sharing: depth is num_layers, but only num_layer_groups x inner_group_size layers exist.
    num_layer_groups: int | None = None
    inner_group_size: int = 1
    layer_norm_eps: float = 1e-12
    pad_token_id: int = 0
    # RoBERTa and XLM-R number positions from pad_token_id + 1 (fairseq's convention); BERT from 0.
    positions_after_padding: bool = False
    hidden_dropout: float = 0.1
    attention_dropout: float = 0.1
    classifier_dropout: float | None = None
    pooler: bool = True
    initializer_range: float = 0.02
    # Heads removed from each layer (layer index -> head indices in the unpruned numbering), as transformers'
    # config.json `pruned_heads` says: those layers' query/key/value and attention output are narrower.
    pruned_heads: dict[int, list[int]] = field(default_factory=dict)
    # Longformer's sliding window: per layer, the number of neighbours a token attends to (even: half on each
    # side), each layer with separate query/key/value projections for the global tokens; None: every token attends
    # to every token. One number stands for every layer. (Typed as TransformerConfig's, whose null entries are global
    # layers, so that a run config's model section reads either; an encoder's windows are numbers.)
    attention_window: list[int | None] | None = None
    # Keys of the published config.json that bertology does not use, kept so that a saved checkpoint round-trips.
    extra: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.family not in FAMILIES:
            raise ConfigError(f"unknown model family {self.family!r}; expected one of {', '.join(FAMILIES)}")
        if self.hidden_act not in ACTIVATIONS:
            raise ConfigError(f"unknown activation {self.hidden_act!r}; expected one of {', '.join(ACTIVATIONS)}")
        if self.hidden_size % self.num_heads:
            raise ConfigError(f"hidden_size {self.hidden_size} is not divisible by num_heads {self.num_heads}")
        if self.num_layer_groups is not None and self.num_layers % self.num_layer_groups:
            raise ConfigError(
                f"num_layers {self.num_layers} is not divisible by num_layer_groups {self.num_layer_groups}"
            )
        for name in ("vocab_size", "hidden_size", "num_layers", "num_heads", "intermediate_size"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be positive, got {getattr(self, name)}")
        self.pruned_heads = self.checked_pruned_heads(self.pruned_heads)
        self.attention_window = self.checked_windows(self.attention_window)

    def checked_windows(self, windows: Any) -> list[int] | None:
        """`attention_window` as one even, positive window per layer (a number stands for every layer)."""
        if windows is None:
            return None
        if isinstance(windows, int) and not isinstance(windows, bool):
            windows = [windows] * self.num_layers
        if not isinstance(windows, (list, tuple)) or not all(
                isinstance(w, int) and not isinstance(w, bool) for w in windows):
            raise ConfigError(f"attention_window: expected a number or one number per layer, got {windows!r}")
        if len(windows) != self.num_layers:
            raise ConfigError(f"attention_window: {len(windows)} windows for {self.num_layers} layers")
        for layer, window in enumerate(windows):
            if window <= 0 or window % 2:
                raise ConfigError(f"attention_window: the window of layer {layer} is {window}; it must be even and "
                                  "positive (half of it on each side of a token)")
        if self.num_layer_groups is not None or self.pruned_heads:
            raise ConfigError("attention_window: windows are not supported with shared layers (num_layer_groups) "
                              "or pruned heads")
        return list(windows)

    def window_of(self, layer: int) -> int | None:
        """The attention window of layer `layer` (a layer call's unique layer), None for full attention."""
        return self.attention_window[layer] if self.attention_window is not None else None

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
        return self.hidden_size // self.num_heads

    @property
    def head_dropout(self) -> float:
        """Dropout before classification heads: classifier_dropout when set, else hidden_dropout (as transformers)."""
        return self.classifier_dropout if self.classifier_dropout is not None else self.hidden_dropout

    @property
    def position_offset(self) -> int:
        """Index of the first real token's position: pad_token_id + 1 with fairseq's positions, else 0."""
        return self.pad_token_id + 1 if self.positions_after_padding else 0

    @property
    def max_length(self) -> int:
        """The longest sequence (special tokens included) the position embeddings cover."""
        return self.max_position_embeddings - self.position_offset

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
    def from_dict(cls, data: dict[str, Any]) -> EncoderConfig:
        return config_from_dict(cls, data, "encoder")


def config_to_dict(config: Any) -> dict[str, Any]:
    """A model config dataclass as the native format stores it: every field but `extra` (the unused keys of a
    published config.json, which only its own format keeps)."""
    data = dataclasses.asdict(config)
    data.pop("extra", None)
    return data


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


def preset(name: str, **overrides: Any) -> EncoderConfig:
    """A BERT config of a published size: hidden/64 heads and a 4 x hidden feed-forward, as in the papers."""
    if name not in PRESET_SIZES:
        raise ConfigError(f"unknown preset {name!r}; expected one of {', '.join(PRESET_SIZES)}")
    layers, hidden = PRESET_SIZES[name]
    values: dict[str, Any] = dict(
        num_layers=layers, hidden_size=hidden, num_heads=hidden // 64, intermediate_size=4 * hidden
    )
    values.update(overrides)
    return EncoderConfig(**values)
