"""The one bidirectional transformer model, `EncoderModel`: every encoder family (BERT, RoBERTa, XLM-R, ELECTRA,
ALBERT, DistilBERT, Longformer, ModernBERT) and an encoder-decoder's encoder side alone (T5EncoderModel) as the one
`Stack` (bertology.model.stack), plus the optional [CLS] pooler. A family is a config (norm placement, positions,
token types, pooler, where the embeddings live) plus its checkpoint tables; BERT's, post-LayerNorm:

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
    SegmentCosineHead,
    TiedLMBiasHead,
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
    """An encoder: the one bidirectional `Stack` (per-layer windows, ALBERT's shared layers, pruned heads), with its
    own embeddings (word, position, token type, norm, projection) where the config keeps them in the stack
    (`stack_embeddings`, BERT's layout), plus the optional [CLS] pooler. Returns an `EncoderOutput`."""

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__(config, embeddings=bool(config.stack_embeddings), block=EncoderLayer)
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
        """Stack.forward on token ids (on the embedded tokens [B, L, H] when the model holds the token table):
        `layout` the packing of `attention_mask` built already by the caller, `global_attention_mask` [B, L] a
        windowed model's global tokens, `last_layer_at` (flat indices into [B * L]) where the last layer must run,
        `head_mask` [layer calls, num_heads] (layer calls = num_layers, times inner_group_size for ALBERT)
        multiplying each head's output (see Stack.forward)."""
        out = super().forward(input_ids, attention_mask, token_type_ids=token_type_ids, position_ids=position_ids,
                              output_hidden_states=output_hidden_states, output_attentions=output_attentions,
                              packed=packed, last_layer_at=last_layer_at, head_mask=head_mask, layout=layout,
                              global_attention_mask=global_attention_mask)
        last = out.last_hidden_state
        pooled = torch.tanh(self.pooler(last[:, 0])) if self.pooler is not None else None
        return EncoderOutput(last_hidden_state=last, pooler_output=pooled, hidden_states=out.hidden_states,
                             attentions=out.attentions)


class EncoderModel(BaseModel):
    """The one bidirectional model, with zero or more heads: every BERT-family encoder, ModernBERT, and an
    encoder-decoder's encoder side alone (T5EncoderModel; a tagger fine-tunes BART's or T5's encoder). Its config
    says what it has: the pooler (`pooler`), token types (`type_vocab_size`), and where the input embeddings are
    (`stack_embeddings`): in the stack (`encoder.embeddings.*`, BERT's layout) or one token table of the model's
    (`embeddings`, named as in `Seq2SeqModel`, so that an encoder-decoder's checkpoint loads its encoder into it).

    The first head is the primary one: its logits are `output.logits`. Under a scalar mix (`mix`) the heads read it
    instead of the last layer; the pooler still reads the last layer's [CLS]."""

    config_class = TransformerConfig
    CAPABILITIES = frozenset({ATTENTIONS, LORA, SCALAR_MIX, BLOCKS})
    lora_targets = ("query", "key", "value", "attn_out", "ffn_in", "ffn_gate", "ffn_out")

    def conditional_capabilities(self) -> frozenset[str]:
        return self.config_capabilities(self.config) | frozenset({MASKED_LM} if "mlm" in self.heads else ())

    @staticmethod
    def config_capabilities(config: TransformerConfig) -> frozenset[str]:
        """What every model of this class with `config` can do beyond CAPABILITIES, whatever its heads: the BERT
        layout (its stack's own embeddings) gives the `encoder.embeddings` others build on, transformers' head masks
        and, unwindowed, pruning; a pooler; token types; global tokens where the windows have their projections."""
        own = bool(config.stack_embeddings)
        windowed = config.attention_window is not None
        return frozenset({ENCODER, HEAD_MASK} if own else ()) \
            | frozenset({POOLER} if config.pooler else ()) \
            | frozenset({TOKEN_TYPES} if own and config.type_vocab_size else ()) \
            | frozenset({GLOBAL_TOKENS} if windowed and config.global_projections else ()) \
            | frozenset({PRUNES_HEADS} if own and not windowed else ())

    def __init__(self, config: TransformerConfig, heads: Sequence[HeadSpec] = ()) -> None:
        super().__init__(config)
        # Module order is the parameters' initialisation order (init_weights): each layout keeps the one it has had.
        if config.stack_embeddings:
            self.encoder = Encoder(config)
            self.init_heads(heads)
        else:
            self.embeddings = nn.Embedding(config.vocab_size, config.hidden_size)
            self.init_heads(heads)
            self.encoder = Encoder(config)

    def embedded(self, input_ids: Tensor, token_type_ids: Tensor | None) -> Tensor:
        """What the stack reads: the token ids where it embeds them itself, else the model's token embeddings
        (scaled by embedding_scale), after checking the ids; such a model has no token types, so only zeros (or
        none) are taken (callers that frame a pair pass its segments; the model reads the pair from its
        separators)."""
        if self.config.stack_embeddings:
            return input_ids
        self.encoder.check_inputs(input_ids)
        if token_type_ids is not None and input_ids.device.type == "cpu" and bool(token_type_ids.any()):
            raise InputError("token_type_ids: this model has no token type embeddings; give zeros or none")
        x = self.embeddings(input_ids)
        return x * self.config.embedding_scale if self.config.embedding_scale != 1.0 else x

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
        `head_mask` [layers, heads]: multiplies each head's output (see Encoder.forward). `position_ids`: the
        stack's own embeddings' positions (a model holding the token table counts the mask's real tokens).

        `last_layer_at` [N, 2] (row, column), possibly empty: the positions where the caller will read
        `last_hidden_state`. Given it, the last layer runs only at those positions plus the ones the heads read
        (`masked_positions` for a masked-LM head, the first token of every row for the pooler or a first_token head),
        as pretraining wants; `last_hidden_state` is then zero everywhere else. Nothing is pruned (every position is
        computed) when it is None, when a head reads every token (kinds token, token_mlp), when a masked-LM head has
        no `masked_positions`, when hidden states or attentions are requested, with `packed=False`, or where the
        stack runs its last layer whole (windows, relative or rotary positions: Stack.forward)."""
        flat_at = None if self.mix is not None else self.last_layer_positions(input_ids, masked_positions,
                                                                              last_layer_at)
        out = self.encoder(
            self.embedded(input_ids, token_type_ids),
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
                hidden=h, word_embeddings=self.word_embeddings.weight,
                attention_mask=attention_mask if attention_mask is not None else torch.ones_like(input_ids),
                pooled=out.pooler_output, masked_positions=masked_positions, input_ids=input_ids,
                token_type_ids=token_type_ids, logit_scale=self.config.logit_scale))
        return out

    def forward_inputs(self, batch: Any) -> dict[str, Any]:
        """The forward's arguments for a training batch: ids, mask, and the segment ids (a model with token types,
        or the stack's own embeddings, which take them whatever they hold), masked positions and packing (`layout`,
        set by the trainer on a GPU) when the batch has them."""
        return {"input_ids": batch.input_ids, "attention_mask": batch.attention_mask,
                "token_type_ids": getattr(batch, "token_type_ids", None) if self.config.stack_embeddings else None,
                "masked_positions": getattr(batch, "masked_positions", None),
                "layout": getattr(batch, "layout", None)}

    def blocks(self) -> list[nn.Module]:
        return list(self.encoder.layers)

    def layer_states(self, input_ids: Tensor, attention_mask: Tensor, token_type_ids: Tensor | None = None, *,
                     global_attention_mask: Tensor | None = None) -> tuple[Tensor, ...]:
        """The contextual representations embed and the analyses read: the embedding output, then every layer
        call's output, [B, L, H] each. `global_attention_mask`: a windowed model's global tokens."""
        out = self.encoder(self.embedded(input_ids, token_type_ids), attention_mask, token_type_ids,
                           output_hidden_states=True, global_attention_mask=global_attention_mask)
        assert out.hidden_states is not None
        return out.hidden_states

    @property
    def word_embeddings(self) -> nn.Embedding:
        return self.encoder.embeddings.word if self.config.stack_embeddings else self.embeddings

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
        if not config.stack_embeddings:
            raise ConfigError(f"prune_heads: the heads of a {config.family} model cannot be pruned (its checkpoints "
                              "have no pruned_heads; capability 'prunes-heads')")
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
        """The family's initialisation where its checkpoint table has one (T5's encoder alone:
        bertology.model.families.t5), else BERT's (bertology.model.blocks.init_parameters) and zero vocabulary
        biases."""
        from bertology.model.convert import family_init  # the tables import the model classes

        init = family_init(self.config.family)
        if init is not None:
            init(self, generator)
            return
        init_parameters(self, self.config.initializer_range, generator)
        for head in self.heads.values():
            if isinstance(head, (MaskedLMHead, TiedLMBiasHead)):
                head.bias.zero_()
            if isinstance(head, SegmentCosineHead):
                head.reset_parameters()


class StackStates(nn.Module):
    """A bare BERT-family encoder stack (`bertology.model.encoder.Encoder`, which `embed` also takes) read as a
    headless model: its `config`, `capabilities` and `layer_states`."""

    def __init__(self, stack: nn.Module) -> None:
        super().__init__()
        self.encoder = stack
        self.config = stack.config
        self.training = stack.training
        self.capabilities = EncoderModel.config_capabilities(stack.config) & {ENCODER, GLOBAL_TOKENS}

    def layer_states(self, input_ids: Tensor, attention_mask: Tensor, token_type_ids: Tensor | None = None, *,
                     global_attention_mask: Tensor | None = None) -> tuple[Tensor, ...]:
        return self.encoder(input_ids, attention_mask, token_type_ids, output_hidden_states=True,
                            global_attention_mask=global_attention_mask).hidden_states


def as_model(module: Any) -> Any:
    """`module` itself, or a bare BERT-family encoder stack (one embedding its tokens itself) in a `StackStates`
    reading it."""
    return StackStates(module) if isinstance(module, Encoder) and module.embeddings is not None else module
