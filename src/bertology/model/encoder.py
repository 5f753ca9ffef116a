"""The bidirectional transformer encoder: every family (BERT, RoBERTa, XLM-R, ELECTRA, ALBERT, DistilBERT) as one
stack of the shared blocks (bertology.model.blocks), post-LayerNorm:

    x_0 = LayerNorm(E_word[w] + E_pos[p] + E_type[t])        (then a linear projection if embedding_size != hidden)
    a   = softmax(Q K^T / sqrt(d_k)) V, per head, Q = x W_q, K = x W_k, V = x W_v
    x'  = LayerNorm(x + a W_o)
    x'' = LayerNorm(x' + act(x' W_1) W_2)

(Adapters, when a layer has them, act on a W_o and on act(x' W_1) W_2 before the residual add; prefix keys and
values, when it has them, are attended beside each sequence's own: see bertology.model.blocks.)

Padding costs nothing: the real tokens of a padded [B, L] batch are packed into [T, H] for every linear layer, and
attention runs per sequence (bertology.model.attention.packed_attention: equal-length groups on CPU, one
variable-length kernel per layer on CUDA). `packed=False` runs the classic padded computation instead; both give the
same outputs at real tokens.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from bertology.errors import ConfigError, InputError
from bertology.model.attention import BIDIRECTIONAL, attend, scatter_attention, sliding_window
from bertology.model.blocks import Block, BlockSpec, init_parameters, plain_linear
from bertology.model.config import EncoderConfig
from bertology.model.dropout import fast_dropout
from bertology.model.base import BaseModel
from bertology.model.extensions import BUILTIN_EXTENSIONS, EXTENSIONS, register_extension
from bertology.model.heads import (
    HEAD_KINDS,
    HeadInputs,
    HeadSpec,
    MaskedLMHead,
    activation,
    head_reads,
)
from bertology.model.packing import Layout
from bertology.model.protocol import (ATTENTIONS, BLOCKS, ENCODER, GLOBAL_TOKENS, HEAD_MASK, LORA, MASKED_LM, POOLER,
                                      PRUNES_HEADS, SCALAR_MIX, TOKEN_TYPES, check_id_range)

__all__ = [
    "BUILTIN_EXTENSIONS", "EXTENSIONS", "HEAD_KINDS", "Encoder", "EncoderLayer", "EncoderModel", "EncoderOutput",
    "HeadSpec", "Layout", "activation", "attend", "plain_linear", "register_extension", "scatter_attention",
]


@dataclass
class EncoderOutput:
    """What a forward pass returns, named as in transformers. Padded layout [B, L, ...]; zeros at padding when packed."""

    last_hidden_state: Tensor
    pooler_output: Tensor | None = None
    hidden_states: tuple[Tensor, ...] | None = None  # embedding output, then every layer's output
    attentions: tuple[Tensor, ...] | None = None  # attention probabilities [B, heads, L, L], one per layer
    logits: Tensor | None = None  # the primary head's logits (a head model's task)
    head_logits: dict[str, Tensor] = field(default_factory=dict)  # every head's logits by head name


def encoder_block_spec(config: EncoderConfig, index: int = 0) -> BlockSpec:
    """The block of layer `index`: post-LayerNorm, dense feed-forward, biases; a pruned layer keeps fewer heads of
    the same size (config.pruned_heads), so its projections are narrower; a windowed one (Longformer's
    attention_window) has the global tokens' projections."""
    return BlockSpec(hidden_size=config.hidden_size, num_heads=config.heads_in_layer(index), head_dim=config.head_dim,
                     intermediate_size=config.intermediate_size, activation=config.hidden_act,
                     norm_eps=config.layer_norm_eps, dropout=config.hidden_dropout,
                     attention_dropout=config.attention_dropout,
                     global_projections=config.attention_window is not None)


class EncoderLayer(Block):
    """The encoder's block (see bertology.model.blocks.Block), built from an EncoderConfig."""

    def __init__(self, config: EncoderConfig, index: int = 0) -> None:
        super().__init__(encoder_block_spec(config, index))


def narrowed_linear(linear: nn.Linear, index: Tensor, dim: int) -> nn.Linear:
    """A copy of `linear` keeping only the outputs (dim 0) or inputs (dim 1) at `index`."""
    weight = linear.weight.index_select(dim, index)
    with warnings.catch_warnings():  # no heads left: an empty layer, nothing to initialise
        warnings.filterwarnings("ignore", "Initializing zero-element tensors")
        out = nn.Linear(weight.shape[1], weight.shape[0], bias=linear.bias is not None, device="meta",
                        dtype=weight.dtype)  # the meta device: no initialisation to throw away
    out = out.to_empty(device=weight.device)
    out.weight.copy_(weight)
    if linear.bias is not None:
        out.bias.copy_(linear.bias.index_select(0, index) if dim == 0 else linear.bias)
    out.requires_grad_(linear.weight.requires_grad)
    return out


class Embeddings(nn.Module):
    def __init__(self, config: EncoderConfig) -> None:
        super().__init__()
        width = config.token_embedding_size
        self.word = nn.Embedding(config.vocab_size, width, padding_idx=config.pad_token_id)
        self.position = nn.Embedding(config.max_position_embeddings, width)
        self.token_type = nn.Embedding(config.type_vocab_size, width) if config.type_vocab_size > 0 else None
        self.norm = nn.LayerNorm(width, eps=config.layer_norm_eps)
        self.project = nn.Linear(width, config.hidden_size) if config.embedding_size is not None else None
        self.dropout = config.hidden_dropout

    def forward(self, input_ids: Tensor, position_ids: Tensor, token_type_ids: Tensor | None) -> Tensor:
        x = self.word(input_ids) + self.position(position_ids)
        if self.token_type is not None:
            x = x + self.token_type(token_type_ids if token_type_ids is not None else torch.zeros_like(input_ids))
        x = fast_dropout(self.norm(x), self.dropout, self.training)
        return self.project(x) if self.project is not None else x


class Encoder(nn.Module):
    """Embeddings, a stack of (possibly shared) layers, and the optional [CLS] pooler."""

    def __init__(self, config: EncoderConfig) -> None:
        super().__init__()
        self.config = config
        self.embeddings = Embeddings(config)
        self.layers = nn.ModuleList(EncoderLayer(config, i) for i in range(config.num_unique_layers))
        self.plan = [index for step in config.layer_plan() for index in step]  # unique-layer index per call
        # Per layer call, who attends to whom: everyone, or Longformer's window (half of it on each side).
        self.policies = [sliding_window(w // 2) if (w := config.window_of(i)) is not None else BIDIRECTIONAL
                         for i in self.plan]
        self.pooler = nn.Linear(config.hidden_size, config.hidden_size) if config.pooler else None

    def position_ids(self, input_ids: Tensor) -> Tensor:
        if self.config.positions_after_padding:  # fairseq: real tokens count from pad + 1, padding sits at pad
            real = input_ids.ne(self.config.pad_token_id).long()
            return torch.cumsum(real, 1) * real + self.config.pad_token_id
        return torch.arange(input_ids.shape[1], device=input_ids.device).expand_as(input_ids)

    @property
    def max_length(self) -> int:
        """The longest sequence the position embeddings cover (EncoderConfig.max_length)."""
        return self.config.max_length

    def check_inputs(self, input_ids: Tensor) -> None:
        if input_ids.dim() != 2:
            raise InputError(f"input_ids must be [batch, length], got shape {tuple(input_ids.shape)}")
        if input_ids.shape[1] > self.max_length:
            raise InputError(f"a sequence of {input_ids.shape[1]} tokens is longer than the model's {self.max_length} "
                             "positions: truncate it, or embed it in windows (bertology.embed)")
        check_id_range(input_ids, self.config.vocab_size, "token ids")

    def global_tokens(self, global_attention_mask: Tensor | None, attention_mask: Tensor) -> Tensor | None:
        """The global tokens [B, L] as booleans after checking them, None when there are none."""
        if global_attention_mask is None:
            return None
        if self.config.attention_window is None:
            raise InputError("global_attention_mask: this model attends from every token to every token (it has no "
                             "attention_window); global tokens need a windowed model such as a Longformer")
        if global_attention_mask.shape != attention_mask.shape:
            raise InputError(f"global_attention_mask must have the shape of input_ids {tuple(attention_mask.shape)}, "
                             f"got {tuple(global_attention_mask.shape)}")
        flags = global_attention_mask.bool()
        if global_attention_mask.device.type == "cpu":
            if not ((global_attention_mask == 0) | (global_attention_mask == 1)).all():
                raise InputError("global_attention_mask: expected 0 (local) or 1 (global) at every position")
            on_padding = (flags & ~attention_mask.bool()).nonzero()
            if len(on_padding):
                row, column = on_padding[0].tolist()
                raise InputError(f"global_attention_mask: row {row} puts a global token on padding (column {column}, "
                                 "where attention_mask is 0); mark real tokens only")
        return flags if bool(flags.any()) else None

    def head_scales(self, head_mask: Tensor | None) -> list[Tensor | None]:
        """Per layer call, the mask entries of the heads that layer has (None everywhere without a mask)."""
        if head_mask is None:
            return [None] * len(self.plan)
        expected = (len(self.plan), self.config.num_heads)
        if tuple(head_mask.shape) != expected:
            raise InputError(f"head_mask must be [layer calls, heads] = {list(expected)}, got {list(head_mask.shape)}")
        scales = []
        for call, index in enumerate(self.plan):
            kept = self.config.kept_heads(index)
            scales.append(head_mask[call] if len(kept) == self.config.num_heads else head_mask[call, kept])
        return scales

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
        position_ids: Tensor | None = None,
        *,
        output_hidden_states: bool = False,
        output_attentions: bool = False,
        packed: bool = True,
        last_layer_at: Tensor | None = None,
        head_mask: Tensor | None = None,
        layout: Layout | None = None,
        global_attention_mask: Tensor | None = None,
    ) -> EncoderOutput:
        """`layout`: the packing of `attention_mask`, when the caller built it already (from the CPU mask, before
        moving the batch to a GPU: then nothing in the forward waits for the device).

        `global_attention_mask` [B, L] (a windowed model's, 1 = global): tokens that attend to every token and that
        every token attends to, with the layers' global projections (Longformer); on real tokens only.

        `last_layer_at` (flat indices into [B * L], packed path only, without hidden states or attentions): run
        the last layer only at these positions; `last_hidden_state` is then zero everywhere else.

        `head_mask` [layer calls, num_heads] (layer calls = num_layers, times inner_group_size for ALBERT): each
        head's output is multiplied by its entry (0 removes the head, as transformers' head_mask did; a mask that
        requires grad gives Michel et al.'s head importance). Heads keep their original numbering in a pruned
        model: the entries of pruned heads are ignored."""
        self.check_inputs(input_ids)
        head_scales = self.head_scales(head_mask)
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        if position_ids is None:
            position_ids = self.position_ids(input_ids)
        flags = self.global_tokens(global_attention_mask, attention_mask)
        if packed and layout is None:
            layout = Layout(attention_mask)
        elif not packed:
            layout = None
        key_mask = None if packed else attention_mask.bool()
        if flags is not None and layout is not None:
            flags = layout.pack(flags)
        if layout is not None:
            tt = layout.pack(token_type_ids) if token_type_ids is not None else None
            x = self.embeddings(layout.pack(input_ids), layout.pack(position_ids), tt)
        else:
            x = self.embeddings(input_ids, position_ids, token_type_ids)

        to_padded = layout.unpack if layout is not None else (lambda t: t)
        hidden_states = [to_padded(x)] if output_hidden_states else None
        attentions = [] if output_attentions else None
        plan = self.plan
        # Only the rows a head reads need the last layer's queries and feed-forward. Choosing them is data-dependent
        # (a host synchronisation), which on a GPU costs more than the rows saved: there the last layer runs whole.
        # A windowed layer (Longformer) runs whole too.
        prune = (last_layer_at is not None and layout is not None and x.device.type == "cpu"
                 and not (output_hidden_states or output_attentions) and self.config.attention_window is None)
        if prune:
            plan = plan[:-1]
        for call, index in enumerate(plan):
            x, probs = self.layers[index](x, layout, key_mask, output_attentions, head_scale=head_scales[call],
                                          policy=self.policies[call], global_tokens=flags)
            if attentions is not None:
                attentions.append(probs)
            if hidden_states is not None:  # one per layer call, as transformers records them (ALBERT groups too)
                hidden_states.append(to_padded(x))

        if prune:
            assert layout is not None and last_layer_at is not None
            packed_of_flat = torch.empty(layout.batch_size * layout.seq_len, dtype=torch.long, device=x.device)
            packed_of_flat[layout.flat_index] = torch.arange(layout.num_tokens, device=x.device)
            real = last_layer_at[attention_mask.flatten()[last_layer_at].bool()]  # padding has no packed token
            queries = torch.unique(packed_of_flat[real])  # sorted, each once
            out = x.new_zeros(layout.batch_size * layout.seq_len, x.shape[-1])
            out[layout.flat_index[queries]] = self.layers[self.plan[-1]](x, layout, key_mask, queries=queries,
                                                                         head_scale=head_scales[-1])[0]
            last = out.view(layout.batch_size, layout.seq_len, -1)
        else:
            last = hidden_states[-1] if hidden_states is not None else to_padded(x)
        pooled = torch.tanh(self.pooler(last[:, 0])) if self.pooler is not None else None
        return EncoderOutput(
            last_hidden_state=last,
            pooler_output=pooled,
            hidden_states=tuple(hidden_states) if hidden_states is not None else None,
            attentions=tuple(attentions) if attentions is not None else None,
        )


class EncoderModel(BaseModel):
    """An encoder with zero or more heads. The first head is the primary one: its logits are `output.logits`.
    Under a scalar mix (`mix`) the heads read it instead of the last layer; the pooler still reads the last layer's
    [CLS]."""

    config_class = EncoderConfig
    CAPABILITIES = frozenset({ENCODER, ATTENTIONS, HEAD_MASK, LORA, SCALAR_MIX, BLOCKS})
    lora_targets = ("query", "key", "value", "attn_out", "ffn_in", "ffn_gate", "ffn_out")

    def conditional_capabilities(self) -> frozenset[str]:
        config = self.config
        return frozenset({MASKED_LM} if "mlm" in self.heads else ()) \
            | frozenset({POOLER} if config.pooler else ()) \
            | frozenset({TOKEN_TYPES} if config.type_vocab_size else ()) \
            | frozenset({GLOBAL_TOKENS} if config.attention_window is not None else {PRUNES_HEADS})

    def __init__(self, config: EncoderConfig, heads: Sequence[HeadSpec] = ()) -> None:
        super().__init__(config)
        self.encoder = Encoder(config)
        self.init_heads(heads)

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        token_type_ids: Tensor | None = None,
        position_ids: Tensor | None = None,
        *,
        masked_positions: Tensor | None = None,
        output_hidden_states: bool = False,
        output_attentions: bool = False,
        packed: bool = True,
        last_layer_at: Tensor | None = None,
        head_mask: Tensor | None = None,
        layout: Layout | None = None,
        global_attention_mask: Tensor | None = None,
    ) -> EncoderOutput:
        """`global_attention_mask` [B, L]: a windowed model's global tokens (see Encoder.forward).
        `masked_positions` [N, 2] (row, column): MLM logits only there ([N, V]), else at every position.
        `layout`: the packing of `attention_mask`, built already by the caller (see Encoder.forward).
        `head_mask` [layers, heads]: multiplies each head's output (see Encoder.forward).

        `last_layer_at` [N, 2] (row, column), possibly empty: the positions where the caller will read
        `last_hidden_state`. Given it, the last layer runs only at those positions plus the ones the heads read
        (`masked_positions` for a masked-LM head, the first token of every row for the pooler or a first_token head),
        as pretraining wants; `last_hidden_state` is then zero everywhere else. Nothing is pruned (every position is
        computed) when it is None, when a head reads every token (kinds token, token_mlp), when a masked-LM head has
        no `masked_positions`, when hidden states or attentions are requested, or with `packed=False`."""
        flat_at = None if self.mix is not None else self.last_layer_positions(input_ids, masked_positions,
                                                                              last_layer_at)
        out = self.encoder(
            input_ids,
            attention_mask,
            token_type_ids,
            position_ids,
            output_hidden_states=output_hidden_states or self.mix is not None,
            output_attentions=output_attentions,
            packed=packed,
            last_layer_at=flat_at,
            head_mask=head_mask,
            layout=layout,
            global_attention_mask=global_attention_mask,
        )
        h = self.mixed_states(out, output_hidden_states)
        if self.head_specs:
            self.apply_heads(out, HeadInputs(
                hidden=h, word_embeddings=self.encoder.embeddings.word.weight,
                attention_mask=attention_mask if attention_mask is not None else torch.ones_like(input_ids),
                pooled=out.pooler_output, masked_positions=masked_positions))
        return out

    def forward_inputs(self, batch: Any) -> dict[str, Any]:
        """The forward's arguments for a training batch: ids, mask, and the segment ids, masked positions and
        packing (`layout`, set by the trainer on a GPU) when the batch has them."""
        return {"input_ids": batch.input_ids, "attention_mask": batch.attention_mask,
                "token_type_ids": getattr(batch, "token_type_ids", None),
                "masked_positions": getattr(batch, "masked_positions", None),
                "layout": getattr(batch, "layout", None)}

    def blocks(self) -> list[nn.Module]:
        return list(self.encoder.layers)

    def reused_blocks(self) -> list[nn.Module]:
        plan = self.encoder.plan
        return [layer for index, layer in enumerate(self.encoder.layers) if plan.count(index) != 1]

    def layer_states(self, input_ids: Tensor, attention_mask: Tensor, token_type_ids: Tensor | None = None, *,
                     global_attention_mask: Tensor | None = None) -> tuple[Tensor, ...]:
        """The contextual representations embed and the analyses read: the embedding output, then every layer
        call's output, [B, L, H] each. `global_attention_mask`: a windowed model's global tokens."""
        out = self.encoder(input_ids, attention_mask, token_type_ids, output_hidden_states=True,
                           global_attention_mask=global_attention_mask)
        assert out.hidden_states is not None
        return out.hidden_states

    @property
    def word_embeddings(self) -> nn.Embedding:
        return self.encoder.embeddings.word

    def attention_heads(self) -> tuple[list[list[int]], dict[int, list[int]]]:
        """Per layer call, the heads it has (original numbering), and the pruned heads."""
        return [self.config.kept_heads(index) for index in self.encoder.plan], self.config.pruned_heads

    @torch.no_grad()
    def prune_heads(self, heads: dict[int, Sequence[int]]) -> None:
        """Remove attention heads for good. `heads` maps a layer index to head indices in the unpruned numbering
        (heads pruned already are ignored). Those heads' rows of query, key and value and their columns of the
        attention output are dropped, so the model is smaller and computes what it computed with them masked to 0;
        `config.pruned_heads` records them (transformers' config.json `pruned_heads`)."""
        config = self.config
        if config.attention_window is not None:
            raise ConfigError("prune_heads: heads of a windowed model (attention_window) cannot be pruned")
        wanted = {int(layer): set(config.pruned_heads.get(int(layer), ())) | {int(h) for h in chosen}
                  for layer, chosen in heads.items()}
        pruned = config.checked_pruned_heads({**config.pruned_heads, **wanted})
        for index, removed in pruned.items():
            layer = self.encoder.layers[index]
            kept_before = config.kept_heads(index)
            keep = [position for position, head in enumerate(kept_before) if head not in removed]
            if len(keep) == len(kept_before):
                continue
            modules = {name: getattr(layer, name) for name in ("query", "key", "value", "attn_out")}
            if not all(plain_linear(m) for m in modules.values()) or layer.prefix is not None:
                raise ConfigError(f"layer {index}: heads cannot be pruned under extensions (LoRA, prefixes); prune "
                                  "before adding them")
            d = layer.head_dim
            columns = torch.tensor([position * d + j for position in keep for j in range(d)], dtype=torch.long,
                                   device=layer.query.weight.device)
            for name in ("query", "key", "value"):
                setattr(layer, name, narrowed_linear(modules[name], columns, dim=0))
            layer.attn_out = narrowed_linear(modules["attn_out"], columns, dim=1)
            layer.num_heads = len(keep)
        config.pruned_heads = pruned

    def last_layer_positions(self, input_ids: Tensor, masked_positions: Tensor | None,
                             last_layer_at: Tensor | None) -> Tensor | None:
        """Flat indices into [B * L] where the last layer must run (see forward), or None where it must run at all."""
        if last_layer_at is None or input_ids.dim() != 2:  # the encoder names a wrong input_ids rank
            return None
        batch, width = input_ids.shape
        if last_layer_at.dim() != 2 or last_layer_at.shape[1] != 2 or last_layer_at.dtype.is_floating_point \
                or last_layer_at.dtype == torch.bool:
            raise InputError(f"last_layer_at must be integer (row, column) pairs [N, 2], got "
                             f"{last_layer_at.dtype} of shape {tuple(last_layer_at.shape)}")
        if last_layer_at.numel() and last_layer_at.device.type == "cpu" and not (0 <= int(last_layer_at.min()) and int(last_layer_at[:, 0].max()) < batch
                                          and int(last_layer_at[:, 1].max()) < width):
            raise InputError(f"last_layer_at holds a position outside the [{batch}, {width}] batch")
        reads = {head_reads(spec.kind) for spec in self.head_specs}
        if "every_token" in reads or ("masked_positions" in reads and masked_positions is None):
            return None
        at = [last_layer_at[:, 0] * width + last_layer_at[:, 1]]
        if "masked_positions" in reads:
            assert masked_positions is not None
            at.append(masked_positions[:, 0] * width + masked_positions[:, 1])
        if self.encoder.pooler is not None or "first_token" in reads:
            at.append(torch.arange(batch, device=input_ids.device) * width)
        return torch.cat([t.to(input_ids.device, torch.long) for t in at])

    @torch.no_grad()
    def init_weights(self, generator: torch.Generator | None = None) -> None:
        """BERT's initialisation (bertology.model.blocks.init_parameters) and zero vocabulary biases."""
        init_parameters(self, self.config.initializer_range, generator)
        for head in self.heads.values():
            if isinstance(head, MaskedLMHead):
                head.bias.zero_()
