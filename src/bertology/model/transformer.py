"""Causal decoders and encoder-decoders assembled from the shared parts: `DecoderModel` (GPT-style, with a key/value
cache) and `Seq2SeqModel` (BART/T5-style). A family is a `TransformerConfig` (norm placement and kind, gated or
dense feed-forward, biases, position kind, embedding scale) plus its checkpoint tables; no family has a class here.

    x_0 = s * E_word[w] (+ E_pos[p]) (-> Norm if embedding_norm)
    x_l = Block_l(x_{l-1})              causal self-attention (decoder), + cross-attention over the encoder's output
    h   = Norm(x_N) if final_norm

Forward passes take transformers' keyword names (input_ids, attention_mask, decoder_input_ids,
decoder_attention_mask, labels, past_key_values, use_cache) and return logits and the cache under the same names."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from bertology.errors import ConfigError, InputError
from bertology.model.attention import BIDIRECTIONAL, CAUSAL
from bertology.model.blocks import Block, BlockSpec, KVCache, init_parameters, norm_layer
from bertology.model.config import ACTIVATIONS, config_from_dict, config_to_dict
from bertology.model.dropout import fast_dropout
from bertology.model.base import BaseModel
from bertology.model.heads import HeadInputs, HeadSpec, MaskedLMHead, TiedLMBiasHead
from bertology.model.packing import Layout
from bertology.model.positions import LearnedPositions, RelativePositionBias, SinusoidalPositions
from bertology.model.protocol import (BLOCKS, DECODER_ONLY, ENCODER_DECODER, GENERATES, LORA, SCALAR_MIX,
                                      check_id_range)
from bertology.model.registry import register_model

PositionKind = Literal["learned", "sinusoidal", "relative", "none"]


@dataclass
class TransformerConfig:
    """Shape and behaviour of a decoder or an encoder-decoder built from the shared blocks."""

    family: str = "transformer"
    vocab_size: int = 50257
    hidden_size: int = 768
    num_layers: int = 12  # the decoder's depth for DecoderModel, the encoder's for Seq2SeqModel
    num_decoder_layers: int | None = None  # Seq2SeqModel's decoder depth (None: num_layers)
    num_heads: int = 12
    attention_head_size: int | None = None  # None: hidden_size // num_heads (T5's d_kv)
    intermediate_size: int = 3072
    hidden_act: str = "gelu_new"
    max_position_embeddings: int = 1024
    positions: PositionKind = "learned"
    position_offset: int = 0  # BART: 2 unused rows before position 0
    relative_attention_num_buckets: int = 32
    relative_attention_max_distance: int = 128
    norm: Literal["layernorm", "rmsnorm"] = "layernorm"
    layer_norm_eps: float = 1e-5
    pre_norm: bool = True
    embedding_norm: bool = False  # a norm right after the embeddings (BART's layernorm_embedding)
    final_norm: bool = True  # a norm after the last block (GPT-2's ln_f, T5's final_layer_norm)
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
    # A prefix LM (DecoderModel; the T5 paper's): an input read with no cache yet and no `lm_prefix` given is all
    # prefix, seen in both directions (fine-tuning on a whole input, a prompt before generation); tokens fed after
    # it through the cache are causal. Training passes its own split (`lm_prefix`).
    prefix_lm: bool = False
    initializer_range: float = 0.02
    extra: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        for name in ("vocab_size", "hidden_size", "num_layers", "num_heads", "intermediate_size"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be positive, got {getattr(self, name)}")
        if self.hidden_act not in ACTIVATIONS:
            raise ConfigError(f"unknown activation {self.hidden_act!r}; expected one of {', '.join(ACTIVATIONS)}")
        if self.num_decoder_layers is not None and self.num_decoder_layers <= 0:
            raise ConfigError(f"num_decoder_layers must be positive, got {self.num_decoder_layers}")
        if self.attention_head_size is None and self.hidden_size % self.num_heads:
            raise ConfigError(f"hidden_size {self.hidden_size} is not divisible by num_heads {self.num_heads}")
        if self.positions not in ("learned", "sinusoidal", "relative", "none"):
            raise ConfigError(f"positions: expected learned, sinusoidal, relative or none, got {self.positions!r}")
        if self.norm not in ("layernorm", "rmsnorm"):
            raise ConfigError(f"norm: expected layernorm or rmsnorm, got {self.norm!r}")

    @property
    def head_dim(self) -> int:
        return self.attention_head_size or self.hidden_size // self.num_heads

    @property
    def decoder_depth(self) -> int:
        """Seq2SeqModel's decoder depth."""
        return self.num_decoder_layers or self.num_layers

    @property
    def token_embedding_size(self) -> int:
        return self.hidden_size

    @property
    def head_dropout(self) -> float:
        return self.classifier_dropout if self.classifier_dropout is not None else self.hidden_dropout

    @property
    def max_length(self) -> int:
        return self.max_position_embeddings if self.positions in ("learned", "sinusoidal") else 1 << 30

    def block_spec(self, cross_attention: bool) -> BlockSpec:
        return BlockSpec(hidden_size=self.hidden_size, num_heads=self.num_heads, head_dim=self.head_dim,
                         intermediate_size=self.intermediate_size, activation=self.hidden_act, norm=self.norm,
                         norm_eps=self.layer_norm_eps, pre_norm=self.pre_norm, gated=self.gated_ffn, bias=self.bias,
                         cross_attention=cross_attention, dropout=self.hidden_dropout,
                         attention_dropout=self.attention_dropout, attention_scale=self.attention_scale,
                         activation_dropout=self.activation_dropout)

    def to_dict(self) -> dict[str, Any]:
        return config_to_dict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TransformerConfig:
        return config_from_dict(cls, data, "transformer")


@dataclass
class ModelOutput:
    """What a decoder or encoder-decoder forward returns, named as in transformers."""

    last_hidden_state: Tensor
    logits: Tensor | None = None
    head_logits: dict[str, Tensor] = field(default_factory=dict)
    loss: Tensor | None = None  # mean cross-entropy of `labels` (when given)
    past_key_values: list[KVCache] | None = None
    hidden_states: tuple[Tensor, ...] | None = None
    encoder_last_hidden_state: Tensor | None = None


def position_ids_from_mask(attention_mask: Tensor, length: int) -> Tensor:
    """Positions counting real tokens only (left padding then starts at 0), for the last `length` columns."""
    positions = (attention_mask.long().cumsum(1) - 1).clamp(min=0)
    return positions[:, -length:]


def position_ids_in_documents(documents: Tensor) -> Tensor:
    """Positions counting from 0 at the start of every document of a packed row (`documents` [B, L]: an id per
    token, a new id where a new document starts; right padding)."""
    columns = torch.arange(documents.shape[1], device=documents.device).expand_as(documents)
    starts = torch.ones_like(documents, dtype=torch.bool)
    starts[:, 1:] = documents[:, 1:] != documents[:, :-1]
    return columns - torch.where(starts, columns, torch.zeros_like(columns)).cummax(1).values


class Stack(nn.Module):
    """Positions, a list of blocks and the final norm; the token embeddings are the model's (they may be shared)."""

    def __init__(self, config: TransformerConfig, num_layers: int, *, causal: bool, cross_attention: bool) -> None:
        super().__init__()
        self.config = config
        self.policy = CAUSAL if causal else BIDIRECTIONAL
        hidden = config.hidden_size
        self.positions: nn.Module | None = None
        if config.positions == "learned":
            self.positions = LearnedPositions(config.max_position_embeddings, hidden, config.position_offset)
        elif config.positions == "sinusoidal":
            self.positions = SinusoidalPositions(config.max_position_embeddings, hidden)
        self.relative = (RelativePositionBias(config.num_heads, config.relative_attention_num_buckets,
                                              config.relative_attention_max_distance, bidirectional=not causal)
                         if config.positions == "relative" else None)
        self.embedding_norm = norm_layer(config.norm, hidden, config.layer_norm_eps) if config.embedding_norm else None
        self.layers = nn.ModuleList(Block(config.block_spec(cross_attention)) for _ in range(num_layers))
        self.final_norm = norm_layer(config.norm, hidden, config.layer_norm_eps) if config.final_norm else None

    def forward(self, embedded: Tensor, attention_mask: Tensor, *, memory: Tensor | None = None,
                memory_mask: Tensor | None = None, caches: list[KVCache] | None = None, packed: bool = True,
                output_hidden_states: bool = False, documents: Tensor | None = None,
                lm_prefix: Tensor | None = None, layout: Layout | None = None,
                memory_layout: Layout | None = None) -> tuple[Tensor, tuple[Tensor, ...] | None]:
        """`embedded` [B, L, H] (token embeddings, scaled); `attention_mask` [B, past + L] (real tokens, the cached
        positions included). Returns the last hidden state [B, L, H] (zeros at padding when packed) and, when asked,
        the hidden states (after the embeddings, then after every block; the last one after the final norm).
        `documents` [B, L] (packed documents, see `bertology.model.packing`): each document attends within itself
        and counts its positions from 0. `lm_prefix` [B, past + L] bool (a causal stack only): a prefix LM's prefix,
        whose tokens see each other in both directions (bertology.model.attention.combined_mask). `layout`: the
        packing of `attention_mask` (and `documents`), built already from the host's mask (the trainer does, so that
        nothing in the forward waits for a GPU); else worked out here. `memory_layout`: the packing of `memory_mask`
        (packed, without a cache): cross-attention then projects the memory's real tokens alone."""
        length = embedded.shape[1]
        past = caches[0].length if caches else 0
        if attention_mask.shape[1] != past + length:
            raise InputError(f"attention_mask covers {attention_mask.shape[1]} positions; the cache holds {past} and "
                             f"the input adds {length}")
        if documents is not None and (not packed or caches is not None):
            raise InputError("documents (packed documents) need the packed layout, without a key/value cache")
        if lm_prefix is not None and lm_prefix.shape != attention_mask.shape:
            raise InputError(f"lm_prefix has shape {tuple(lm_prefix.shape)}; it marks the positions of the attention "
                             f"mask, {tuple(attention_mask.shape)}")
        x = embedded
        if self.positions is not None:
            if past + length > self.config.max_length:
                raise InputError(f"{past + length} positions exceed the model's {self.config.max_length}")
            positions = (position_ids_in_documents(documents) if documents is not None
                         else position_ids_from_mask(attention_mask, length))
            x = x + self.positions(positions)
        if self.embedding_norm is not None:
            x = self.embedding_norm(x)
        dropout = self.config.embedding_dropout
        x = fast_dropout(x, self.config.hidden_dropout if dropout is None else dropout, self.training)
        if not packed or caches is not None:
            layout = None
        elif layout is None:
            layout = Layout(attention_mask, documents)
        if layout is not None:
            x = layout.pack(x)
            if lm_prefix is not None:
                lm_prefix = layout.pack(lm_prefix)
            bias = (corners(self.relative(layout.seq_len, layout.seq_len)[None])
                    if self.relative is not None else None)
            key_mask = None
        else:
            bias = self.relative(length, past + length)[None] if self.relative is not None else None
            key_mask = attention_mask
        if memory is not None and memory_layout is not None and layout is not None:
            memory = memory_layout.pack(memory)  # once for every layer's cross-attention
        else:
            memory_layout = None
        to_padded = layout.unpack if layout is not None else (lambda t: t)
        hidden_states = [to_padded(x)] if output_hidden_states else None
        for index, block in enumerate(self.layers):
            x, _ = block(x, layout, key_mask, policy=self.policy, bias=bias, memory=memory, memory_mask=memory_mask,
                         cache=caches[index] if caches is not None else None, lm_prefix=lm_prefix,
                         memory_layout=memory_layout)
            if hidden_states is not None:
                hidden_states.append(to_padded(x))
        if self.final_norm is not None:
            x = self.final_norm(x)
            if hidden_states is not None:
                hidden_states[-1] = to_padded(x)
        return to_padded(x), (tuple(hidden_states) if hidden_states is not None else None)


def corners(table: Tensor) -> Callable[[int, int], Tensor]:
    """The score bias of a packed stream's sequences from one relative-position table [1, heads, L, L] for the
    padded rows, computed once for every layer and group: a sequence of n tokens reads its top-left n x n corner
    (the bias depends on key - query only; the padded kernel reads the whole table). Each corner is cut once, so the backward adds every layer's gradient there
    before one pass into the table."""
    cut: dict[tuple[int, int], Tensor] = {}

    def bias(queries: int, keys: int) -> Tensor:
        if (queries, keys) not in cut:
            cut[queries, keys] = table[..., :queries, :keys]
        return cut[queries, keys]

    return bias


def check_ids(input_ids: Tensor, vocab_size: int, what: str = "input_ids") -> None:
    if input_ids.dim() != 2:
        raise InputError(f"{what} must be [batch, length], got shape {tuple(input_ids.shape)}")
    check_id_range(input_ids, vocab_size, what)


def lm_loss(logits: Tensor, labels: Tensor) -> Tensor:
    """Mean cross-entropy over the labels that are not -100 (transformers' convention)."""
    return F.cross_entropy(logits.flatten(0, -2).float(), labels.flatten(), ignore_index=-100)


class TransformerModel(BaseModel):
    """What decoders and encoder-decoders share: token embeddings, heads, extensions and initialisation."""

    config_class = TransformerConfig
    CAPABILITIES = frozenset({LORA, BLOCKS})
    lora_targets = ("query", "key", "value", "attn_out", "cross_query", "cross_key", "cross_value", "cross_out",
                    "ffn_in", "ffn_gate", "ffn_out")

    def __init__(self, config: TransformerConfig, heads: Sequence[HeadSpec]) -> None:
        super().__init__(config)
        self.embeddings = nn.Embedding(config.vocab_size, config.hidden_size)
        self.init_heads(heads)

    @property
    def word_embeddings(self) -> nn.Embedding:
        return self.embeddings

    def embed(self, input_ids: Tensor) -> Tensor:
        x = self.embeddings(input_ids)
        return x * self.config.embedding_scale if self.config.embedding_scale != 1.0 else x

    def run_heads(self, out: ModelOutput, attention_mask: Tensor, masked_positions: Tensor | None,
                  input_ids: Tensor | None = None, hidden: Tensor | None = None) -> None:
        """The heads on `hidden` (default: the last hidden state)."""
        if not self.head_specs:
            return
        self.apply_heads(out, HeadInputs(
            hidden=out.last_hidden_state if hidden is None else hidden, attention_mask=attention_mask,
            word_embeddings=self.embeddings.weight, masked_positions=masked_positions, input_ids=input_ids,
            logit_scale=self.config.logit_scale))

    @torch.no_grad()
    def init_weights(self, generator: torch.Generator | None = None) -> None:
        """BERT's initialisation (bertology.model.blocks.init_parameters) and zero vocabulary biases."""
        init_parameters(self, self.config.initializer_range, generator)
        for head in self.heads.values():
            if isinstance(head, (MaskedLMHead, TiedLMBiasHead)):
                head.bias.zero_()


class DecoderModel(TransformerModel):
    """A causal decoder (GPT-style) with heads; the first head is the primary one (`logits`)."""

    CAPABILITIES = TransformerModel.CAPABILITIES | {GENERATES, DECODER_ONLY, SCALAR_MIX}

    def __init__(self, config: TransformerConfig, heads: Sequence[HeadSpec] = ()) -> None:
        super().__init__(config, heads)
        self.decoder = Stack(config, config.num_layers, causal=True, cross_attention=False)

    def blocks(self) -> list[nn.Module]:
        return list(self.decoder.layers)

    def forward_inputs(self, batch: Any) -> dict[str, Any]:
        inputs = {"input_ids": batch.input_ids, "attention_mask": batch.attention_mask,
                  "masked_positions": getattr(batch, "masked_positions", None),
                  "layout": getattr(batch, "layout", None)}
        for name in ("documents", "lm_prefix"):  # packed documents, a prefix LM's prefix (bertology.data.causal)
            value = getattr(batch, name, None)
            if value is not None:
                inputs[name] = value
        return inputs

    def layer_states(self, input_ids: Tensor, attention_mask: Tensor,
                     token_type_ids: Tensor | None = None) -> tuple[Tensor, ...]:
        """The contextual representations embed and the analyses read: the embedding output, then every block's
        (the last after the final norm), [B, L, H] each."""
        check_ids(input_ids, self.config.vocab_size)
        states = self.decoder(self.embed(input_ids), attention_mask, output_hidden_states=True)[1]
        assert states is not None
        return states

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None, *, labels: Tensor | None = None,
                past_key_values: list[KVCache] | None = None, use_cache: bool = False,
                masked_positions: Tensor | None = None, output_hidden_states: bool = False,
                packed: bool = True, last_layer_at: Tensor | None = None,
                documents: Tensor | None = None, lm_prefix: Tensor | None = None,
                layout: Layout | None = None) -> ModelOutput:
        """`attention_mask` [B, past + L] covers the cached positions too (as transformers'). `labels` [B, L]: the
        loss of predicting token t + 1 at position t (-100 ignored). `masked_positions` [N, 2]: logits only there.
        With `use_cache`, `past_key_values` holds the cache after this call (a new one when none was given).
        `last_layer_at`: where the caller reads the last layer (the Model protocol lets a model skip the rest); a
        language model reads nearly every position, so this one computes them all. `documents` [B, L]: several
        documents packed in each row (see `Stack.forward`); `labels` then ignore the boundaries only if the caller
        sets the first label of each document to -100. `lm_prefix` [B, past + L] bool: a prefix LM's prefix, seen in
        both directions by its own tokens (causal after it). `layout`: the packing of `attention_mask` and
        `documents`, built already (see `Stack.forward`)."""
        check_ids(input_ids, self.config.vocab_size)
        caches = past_key_values
        if use_cache and caches is None:
            caches = [KVCache() for _ in self.decoder.layers]
        past = caches[0].length if caches else 0
        if attention_mask is None:
            attention_mask = torch.ones(input_ids.shape[0], past + input_ids.shape[1], dtype=torch.long,
                                        device=input_ids.device)
        if self.config.prefix_lm and lm_prefix is None and past == 0:
            lm_prefix = attention_mask.bool()
        hidden, hidden_states = self.decoder(self.embed(input_ids), attention_mask, caches=caches, packed=packed,
                                             output_hidden_states=output_hidden_states or self.mix is not None,
                                             documents=documents, lm_prefix=lm_prefix, layout=layout)
        out = ModelOutput(last_hidden_state=hidden, hidden_states=hidden_states,
                          past_key_values=caches if use_cache else None)
        self.run_heads(out, attention_mask[:, -input_ids.shape[1]:], masked_positions,
                       hidden=self.mixed_states(out, output_hidden_states))
        if labels is not None and out.logits is not None and masked_positions is None:
            out.loss = lm_loss(out.logits[:, :-1], labels[:, 1:])
        return out


def shift_right(labels: Tensor, start: int, pad: int) -> Tensor:
    """Decoder inputs from labels: the start token, then the labels but the last, -100 replaced by padding."""
    out = labels.new_full(labels.shape, pad)
    out[:, 1:] = labels[:, :-1]
    out[:, 0] = start
    return out.masked_fill(out == -100, pad)


class Seq2SeqModel(TransformerModel):
    """An encoder-decoder (BART/T5-style) sharing one token embedding; the decoder cross-attends to the encoder's
    last hidden state."""

    CAPABILITIES = TransformerModel.CAPABILITIES | {GENERATES, ENCODER_DECODER}

    def __init__(self, config: TransformerConfig, heads: Sequence[HeadSpec] = ()) -> None:
        super().__init__(config, heads)
        self.encoder = Stack(config, config.num_layers, causal=False, cross_attention=False)
        self.decoder = Stack(config, config.num_decoder_layers or config.num_layers, causal=True, cross_attention=True)

    def blocks(self) -> list[nn.Module]:
        return [*self.encoder.layers, *self.decoder.layers]

    def forward_inputs(self, batch: Any) -> dict[str, Any]:
        """A training batch's encoder and decoder inputs (the decoder's its own `decoder_input_ids`, else the input
        shifted right where the config says so) and `masked_positions`. A batch's `labels` are its objectives' to
        read (class ids, token labels): the objectives take the loss from the heads' logits."""
        return {"input_ids": batch.input_ids, "attention_mask": batch.attention_mask,
                "decoder_input_ids": getattr(batch, "decoder_input_ids", None),
                "decoder_attention_mask": getattr(batch, "decoder_attention_mask", None),
                "masked_positions": getattr(batch, "masked_positions", None),
                "layout": getattr(batch, "layout", None), "decoder_layout": getattr(batch, "decoder_layout", None)}

    def layer_states(self, input_ids: Tensor, attention_mask: Tensor,
                     token_type_ids: Tensor | None = None) -> tuple[Tensor, ...]:
        """The encoder's contextual representations (what embed and the analyses read): the embedding output, then
        every encoder block's (the last after the final norm), [B, L, H] each."""
        check_ids(input_ids, self.config.vocab_size)
        states = self.encoder(self.embed(input_ids), attention_mask, output_hidden_states=True)[1]
        assert states is not None
        return states

    def encode(self, input_ids: Tensor, attention_mask: Tensor | None = None, packed: bool = True,
               layout: Layout | None = None) -> Tensor:
        check_ids(input_ids, self.config.vocab_size)
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        return self.encoder(self.embed(input_ids), attention_mask, packed=packed, layout=layout)[0]

    def forward(self, input_ids: Tensor | None = None, attention_mask: Tensor | None = None,
                decoder_input_ids: Tensor | None = None, decoder_attention_mask: Tensor | None = None, *,
                encoder_outputs: Tensor | None = None, labels: Tensor | None = None,
                past_key_values: list[KVCache] | None = None, use_cache: bool = False,
                masked_positions: Tensor | None = None, packed: bool = True,
                last_layer_at: Tensor | None = None, layout: Layout | None = None,
                decoder_layout: Layout | None = None) -> ModelOutput:
        """`labels` [B, L_dec]: the loss of each decoder position (-100 ignored); without `decoder_input_ids` they
        are the labels shifted right behind `decoder_start_token_id`. `encoder_outputs`: the encoder's last hidden
        state from an earlier call (decoding step by step). `last_layer_at` (the Model protocol's): every decoder
        position is computed. `layout`, `decoder_layout`: the packings of the two masks, built already (Stack);
        without a cache the encoder's packs the memory too, so that cross-attention projects its real tokens alone."""
        if encoder_outputs is None:
            if input_ids is None:
                raise InputError("give input_ids or encoder_outputs")
            check_ids(input_ids, self.config.vocab_size)
        if attention_mask is None:
            source = encoder_outputs if encoder_outputs is not None else input_ids
            assert source is not None
            attention_mask = torch.ones(source.shape[:2], dtype=torch.long, device=source.device)
        packed_memory = packed and past_key_values is None and not use_cache
        if layout is None and packed_memory:  # one layout for the encoder and the decoder's cross-attention
            layout = Layout(attention_mask)
        if decoder_input_ids is None:
            shifted = labels if labels is not None else input_ids if self.config.shifted_decoder_inputs else None
            if shifted is None:
                raise InputError("give decoder_input_ids or labels")
            start = self.config.decoder_start_token_id
            if start is None:
                raise ConfigError("decoder_start_token_id is not set: decoder inputs cannot be made from "
                                  f"{'labels' if labels is not None else 'input_ids'}")
            decoder_input_ids = shift_right(shifted, start, self.config.pad_token_id)
        check_ids(decoder_input_ids, self.config.vocab_size, "decoder_input_ids")
        if encoder_outputs is None:
            assert input_ids is not None
            # Both sides' tokens in one lookup: the table's gradient is then one scatter into a [V, H] matrix (and
            # one sum with the tied head's) instead of two.
            both = self.embed(torch.cat([input_ids.reshape(-1), decoder_input_ids.reshape(-1)]))
            source, target = both.split([input_ids.numel(), decoder_input_ids.numel()])
            encoder_outputs = self.encoder(source.view(*input_ids.shape, -1), attention_mask, packed=packed,
                                           layout=layout)[0]
            embedded = target.view(*decoder_input_ids.shape, -1)
        else:
            embedded = self.embed(decoder_input_ids)
        caches = past_key_values
        if use_cache and caches is None:
            caches = [KVCache() for _ in self.decoder.layers]
        past = caches[0].length if caches else 0
        if decoder_attention_mask is None:
            decoder_attention_mask = torch.ones(decoder_input_ids.shape[0], past + decoder_input_ids.shape[1],
                                                dtype=torch.long, device=decoder_input_ids.device)
        hidden, _ = self.decoder(embedded, decoder_attention_mask, memory=encoder_outputs,
                                 memory_mask=attention_mask, caches=caches, packed=packed, layout=decoder_layout,
                                 memory_layout=layout if packed_memory else None)
        out = ModelOutput(last_hidden_state=hidden, encoder_last_hidden_state=encoder_outputs,
                          past_key_values=caches if use_cache else None)
        # Heads that pick tokens by id (BART's classifier: the last EOS) read the encoder's input_ids.
        self.run_heads(out, decoder_attention_mask[:, -decoder_input_ids.shape[1]:], masked_positions, input_ids)
        if labels is not None and out.logits is not None and masked_positions is None:
            out.loss = lm_loss(out.logits, labels)
        return out


class EncoderStackModel(TransformerModel):
    """An encoder-decoder's encoder side alone (T5EncoderModel): the token embeddings and a bidirectional `Stack`,
    named as in `Seq2SeqModel`, so that a seq2seq checkpoint's encoder loads into it."""

    CAPABILITIES = TransformerModel.CAPABILITIES | {SCALAR_MIX}

    def __init__(self, config: TransformerConfig, heads: Sequence[HeadSpec] = ()) -> None:
        super().__init__(config, heads)
        self.encoder = Stack(config, config.num_layers, causal=False, cross_attention=False)

    def blocks(self) -> list[nn.Module]:
        return list(self.encoder.layers)

    def forward_inputs(self, batch: Any) -> dict[str, Any]:
        return {"input_ids": batch.input_ids, "attention_mask": batch.attention_mask,
                "masked_positions": getattr(batch, "masked_positions", None)}

    def layer_states(self, input_ids: Tensor, attention_mask: Tensor,
                     token_type_ids: Tensor | None = None) -> tuple[Tensor, ...]:
        """The embedding output, then every block's (the last after the final norm), [B, L, H] each."""
        return self(input_ids, attention_mask, output_hidden_states=True).hidden_states  # type: ignore[return-value]

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None, *,
                masked_positions: Tensor | None = None, output_hidden_states: bool = False,
                packed: bool = True, last_layer_at: Tensor | None = None) -> ModelOutput:
        """`last_layer_at` (the Model protocol's): every position is computed."""
        check_ids(input_ids, self.config.vocab_size)
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        hidden, states = self.encoder(self.embed(input_ids), attention_mask, packed=packed,
                                      output_hidden_states=output_hidden_states or self.mix is not None)
        out = ModelOutput(last_hidden_state=hidden, hidden_states=states)
        self.run_heads(out, attention_mask, masked_positions, hidden=self.mixed_states(out, output_hidden_states))
        return out


Seq2SeqModel.encoder_alone = EncoderStackModel  # a tagger fine-tunes an encoder-decoder's encoder alone

register_model("decoder", DecoderModel)
register_model("seq2seq", Seq2SeqModel)
register_model("encoder-stack", EncoderStackModel)
