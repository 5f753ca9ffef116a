"""The bidirectional transformer encoder: every family (BERT, RoBERTa, XLM-R, ELECTRA, ALBERT, DistilBERT) as the
one `Stack` (bertology.model.stack) with its own embeddings, plus the [CLS] pooler; post-LayerNorm:

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
from bertology.model.attention import attend, scatter_attention
from bertology.model.base import BaseModel
from bertology.model.blocks import Block, init_parameters, plain_linear
from bertology.model.config import TransformerConfig
from bertology.model.extensions import EXTENSIONS, register_extension
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
                                      PRUNES_HEADS, SCALAR_MIX, TOKEN_TYPES)
from bertology.model.stack import Stack

__all__ = [
    "EXTENSIONS", "HEAD_KINDS", "Encoder", "EncoderLayer", "EncoderModel", "EncoderOutput",
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


class EncoderLayer(Block):
    """The encoder's block (see bertology.model.blocks.Block): what int8 quantization replaces the linear maps of."""


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


class Encoder(Stack):
    """An encoder: the one bidirectional `Stack` with its own embeddings (word, position, token type, norm,
    projection; per-layer windows, ALBERT's shared layers, pruned heads), plus the optional [CLS] pooler. Returns
    an `EncoderOutput`."""

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__(config, embeddings=True, block=EncoderLayer)
        self.pooler = nn.Linear(config.hidden_size, config.hidden_size) if config.pooler else None

    def forward(  # type: ignore[override]
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
        """Stack.forward on token ids: `layout` the packing of `attention_mask` built already by the caller,
        `global_attention_mask` [B, L] a windowed model's global tokens, `last_layer_at` (flat indices into [B * L])
        where the last layer must run, `head_mask` [layer calls, num_heads] (layer calls = num_layers, times
        inner_group_size for ALBERT) multiplying each head's output (see Stack.forward)."""
        out = super().forward(input_ids, attention_mask, token_type_ids=token_type_ids, position_ids=position_ids,
                              output_hidden_states=output_hidden_states, output_attentions=output_attentions,
                              packed=packed, last_layer_at=last_layer_at, head_mask=head_mask, layout=layout,
                              global_attention_mask=global_attention_mask)
        last = out.last_hidden_state
        pooled = torch.tanh(self.pooler(last[:, 0])) if self.pooler is not None else None
        return EncoderOutput(last_hidden_state=last, pooler_output=pooled, hidden_states=out.hidden_states,
                             attentions=out.attentions)


class EncoderModel(BaseModel):
    """An encoder with zero or more heads. The first head is the primary one: its logits are `output.logits`.
    Under a scalar mix (`mix`) the heads read it instead of the last layer; the pooler still reads the last layer's
    [CLS]."""

    config_class = TransformerConfig
    CAPABILITIES = frozenset({ENCODER, ATTENTIONS, HEAD_MASK, LORA, SCALAR_MIX, BLOCKS})
    lora_targets = ("query", "key", "value", "attn_out", "ffn_in", "ffn_gate", "ffn_out")

    def conditional_capabilities(self) -> frozenset[str]:
        config = self.config
        return frozenset({MASKED_LM} if "mlm" in self.heads else ()) \
            | frozenset({POOLER} if config.pooler else ()) \
            | frozenset({TOKEN_TYPES} if config.type_vocab_size else ()) \
            | frozenset({GLOBAL_TOKENS} if config.attention_window is not None else {PRUNES_HEADS})

    def __init__(self, config: TransformerConfig, heads: Sequence[HeadSpec] = ()) -> None:
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
            narrowed = ("query", "key", "value") + tuple(  # DeBERTa's relative projections share the heads
                name for name in ("pos_key", "pos_query") if hasattr(layer, name))
            modules = {name: getattr(layer, name) for name in (*narrowed, "attn_out")}
            if not all(plain_linear(m) for m in modules.values()) or layer.prefix is not None:
                raise ConfigError(f"layer {index}: heads cannot be pruned under extensions (LoRA, prefixes); prune "
                                  "before adding them")
            d = layer.head_dim
            columns = torch.tensor([position * d + j for position in keep for j in range(d)], dtype=torch.long,
                                   device=layer.query.weight.device)
            for name in narrowed:
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


class StackStates(nn.Module):
    """A bare BERT-family encoder stack (`bertology.model.encoder.Encoder`, which `embed` also takes) read as a
    headless model: its `config`, `capabilities` and `layer_states`."""

    def __init__(self, stack: nn.Module) -> None:
        super().__init__()
        self.encoder = stack
        self.config = stack.config
        self.training = stack.training
        self.capabilities = frozenset({ENCODER} | ({GLOBAL_TOKENS} if stack.config.attention_window is not None
                                                   else set()))

    def layer_states(self, input_ids: Tensor, attention_mask: Tensor, token_type_ids: Tensor | None = None, *,
                     global_attention_mask: Tensor | None = None) -> tuple[Tensor, ...]:
        return self.encoder(input_ids, attention_mask, token_type_ids, output_hidden_states=True,
                            global_attention_mask=global_attention_mask).hidden_states


def as_model(module: Any) -> Any:
    """`module` itself, or a bare BERT-family encoder stack in a `StackStates` reading it."""
    return StackStates(module) if isinstance(module, Encoder) else module
