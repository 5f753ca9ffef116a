"""The bidirectional transformer encoder: every family (BERT, RoBERTa, XLM-R, ELECTRA, ALBERT, DistilBERT) in one file.

    x_0 = LayerNorm(E_word[w] + E_pos[p] + E_type[t])        (then a linear projection if embedding_size != hidden)
    a   = softmax(Q K^T / sqrt(d_k)) V, per head, Q K V = x W_qkv
    x'  = LayerNorm(x + a W_o)
    x'' = LayerNorm(x' + act(x' W_1) W_2)

Padding costs nothing: the real tokens of a padded [B, L] batch are packed into [T, H] for every linear layer, and
attention runs per sequence (sequences of equal length share one call). `packed=False` runs the classic padded
computation instead; both give the same outputs at real tokens.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from bertology.errors import InputError
from bertology.model.config import EncoderConfig


def activation(name: str) -> Callable[[Tensor], Tensor]:
    if name == "gelu":
        return F.gelu
    if name in ("gelu_new", "gelu_pytorch_tanh", "gelu_fast"):
        return functools.partial(F.gelu, approximate="tanh")
    return {"relu": F.relu, "silu": F.silu, "swish": F.silu, "tanh": torch.tanh}[name]


@dataclass
class EncoderOutput:
    """What a forward pass returns, named as in transformers. Padded layout [B, L, ...]; zeros at padding when packed."""

    last_hidden_state: Tensor
    pooler_output: Tensor | None = None
    hidden_states: tuple[Tensor, ...] | None = None  # embedding output, then every layer's output
    attentions: tuple[Tensor, ...] | None = None  # attention probabilities [B, heads, L, L], one per layer
    logits: Tensor | None = None  # the primary head's logits (a head model's task)
    head_logits: dict[str, Tensor] = field(default_factory=dict)  # every head's logits by head name


class Layout:
    """Where the real tokens of a padded batch are, and how to pack them into [T] and scatter them back.

    Packed order sorts the sequences by length, so the n sequences of one length are one contiguous slice of the
    packed tokens: attention reads each group as a view, with no gather and no scatter."""

    def __init__(self, attention_mask: Tensor) -> None:
        self.batch_size, self.seq_len = attention_mask.shape
        lengths = attention_mask.sum(1)
        order = torch.argsort(lengths, stable=True)
        rows, cols = attention_mask[order].nonzero(as_tuple=True)
        self.flat_index = order[rows] * self.seq_len + cols  # packed token -> position in the flat [B * L]
        self.num_tokens = int(self.flat_index.numel())
        self.full = self.num_tokens == self.batch_size * self.seq_len  # no padding: pack and unpack are views
        # (start, count, length) of each group of equal-length sequences in the packed tokens.
        sizes, counts = torch.unique_consecutive(lengths[order], return_counts=True)
        self.groups: list[tuple[int, int, int]] = []
        start = 0
        for length, count in zip(sizes.tolist(), counts.tolist()):
            if length > 0:
                self.groups.append((start, count, length))
            start += count * length

    def pack(self, padded: Tensor) -> Tensor:
        flat = padded.reshape(self.batch_size * self.seq_len, *padded.shape[2:])
        return flat if self.full else flat[self.flat_index]

    def unpack(self, packed: Tensor) -> Tensor:
        if self.full:
            return packed.view(self.batch_size, self.seq_len, *packed.shape[1:])
        out = packed.new_zeros(self.batch_size * self.seq_len, *packed.shape[1:])
        out[self.flat_index] = packed
        return out.view(self.batch_size, self.seq_len, *packed.shape[1:])


def attend(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, dropout: float, need_weights: bool):
    """Scaled dot-product attention on [..., heads, len, head_dim]; `mask` is True where a key may be attended."""
    if not need_weights:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout), None
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    probs = scores.softmax(-1)
    return F.dropout(probs, dropout, training=dropout > 0) @ v, probs


class EncoderLayer(nn.Module):
    def __init__(self, config: EncoderConfig) -> None:
        super().__init__()
        hidden, eps = config.hidden_size, config.layer_norm_eps
        self.num_heads = config.num_heads
        self.qkv = nn.Linear(hidden, 3 * hidden)  # query, key and value fused in one matmul
        self.attn_out = nn.Linear(hidden, hidden)
        self.attn_norm = nn.LayerNorm(hidden, eps=eps)
        self.ffn_in = nn.Linear(hidden, config.intermediate_size)
        self.ffn_out = nn.Linear(config.intermediate_size, hidden)
        self.ffn_norm = nn.LayerNorm(hidden, eps=eps)
        self.act = activation(config.hidden_act)
        self.dropout = config.hidden_dropout
        self.attention_dropout = config.attention_dropout

    def forward(self, x: Tensor, layout: Layout | None, key_mask: Tensor | None, need_weights: bool = False):
        """x is packed [T, H] when `layout` is given, else padded [B, L, H] with `key_mask` [B, 1, 1, L]."""
        a, probs = self.attention(x, layout, key_mask, need_weights)
        x = self.attn_norm(x + F.dropout(self.attn_out(a), self.dropout, self.training))
        h = self.ffn_out(self.act(self.ffn_in(x)))
        return self.ffn_norm(x + F.dropout(h, self.dropout, self.training)), probs

    def forward_at(self, x: Tensor, layout: Layout, queries: Tensor) -> Tensor:
        """The layer's output only at the packed tokens `queries` (sorted): keys and values still come from every
        token, but the query projection, attention output and feed-forward run on the selected rows alone."""
        hidden = x.shape[-1]
        heads, head_dim = self.num_heads, hidden // self.num_heads
        p = self.attention_dropout if self.training else 0.0
        w, b = self.qkv.weight, self.qkv.bias
        kv = layout.unpack(F.linear(x, w[hidden:], b[hidden:]))  # [B, L, 2H], padded for one batched call
        q_rows = x[queries]
        q = F.linear(q_rows, w[:hidden], b[:hidden])
        # Each sequence's selected queries side by side: [B, Q_max, H], slots past a row's count are zeros. A
        # sequence's tokens are contiguous in packed order, so its queries form one run of `queries`.
        row = layout.flat_index[queries] // layout.seq_len
        position = torch.arange(len(queries), device=x.device)
        run_start = torch.ones_like(row, dtype=torch.bool)
        run_start[1:] = row[1:] != row[:-1]
        slot = position - torch.cummax(torch.where(run_start, position, 0), 0).values
        q_padded = q.new_zeros(layout.batch_size, int(slot.max()) + 1 if len(queries) else 0, hidden)
        q_padded[row, slot] = q
        k, v = kv.unflatten(-1, (2, heads, head_dim)).permute(2, 0, 3, 1, 4)
        mask = (layout.unpack(torch.ones(len(x), dtype=torch.bool, device=x.device)))[:, None, None, :]
        o = F.scaled_dot_product_attention(q_padded.unflatten(-1, (heads, head_dim)).transpose(1, 2), k, v,
                                           attn_mask=mask, dropout_p=p)
        a = o.transpose(1, 2).flatten(2)[row, slot]
        h = self.attn_norm(q_rows + F.dropout(self.attn_out(a), self.dropout, self.training))
        f = self.ffn_out(self.act(self.ffn_in(h)))
        return self.ffn_norm(h + F.dropout(f, self.dropout, self.training))

    def attention(self, x: Tensor, layout: Layout | None, key_mask: Tensor | None, need_weights: bool):
        heads, head_dim = self.num_heads, x.shape[-1] // self.num_heads
        p = self.attention_dropout if self.training else 0.0
        qkv = self.qkv(x)
        if layout is None:  # padded: [B, L, 3, heads, d] -> three [B, heads, L, d]
            q, k, v = qkv.unflatten(-1, (3, heads, head_dim)).permute(2, 0, 3, 1, 4)
            out, probs = attend(q, k, v, key_mask, p, need_weights)
            return out.transpose(1, 2).flatten(2), probs
        outs, probs_by_group = [], []
        for start, count, length in layout.groups:  # `count` sequences of `length` tokens, contiguous in x
            q, k, v = qkv[start:start + count * length].view(count, length, 3, heads, head_dim).permute(2, 0, 3, 1, 4)
            o, probs = attend(q, k, v, None, p, need_weights)
            outs.append(o.transpose(1, 2).reshape(count * length, -1))
            probs_by_group.append(probs)
        out = outs[0] if len(outs) == 1 else torch.cat(outs or [x[:0]])  # one group: no copy; none: no tokens
        return out, (scatter_attention(probs_by_group, layout, heads, x) if need_weights else None)


def scatter_attention(probs_by_group: list[Tensor], layout: Layout, heads: int, like: Tensor) -> Tensor:
    """Per-group attention probabilities back into the padded [B, heads, L, L] layout (zeros at padding)."""
    out = like.new_zeros(layout.batch_size, heads, layout.seq_len, layout.seq_len)
    for (start, count, length), probs in zip(layout.groups, probs_by_group):
        positions = layout.flat_index[start:start + count * length].view(count, length)  # flat positions in [B * L]
        rows, cols = positions[:, 0] // layout.seq_len, positions % layout.seq_len
        out[rows[:, None, None], :, cols[:, :, None], cols[:, None, :]] = probs.permute(0, 2, 3, 1).reshape(
            len(rows), length, length, heads
        )
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
        x = F.dropout(self.norm(x), self.dropout, self.training)
        return self.project(x) if self.project is not None else x


class Encoder(nn.Module):
    """Embeddings, a stack of (possibly shared) layers, and the optional [CLS] pooler."""

    def __init__(self, config: EncoderConfig) -> None:
        super().__init__()
        self.config = config
        self.embeddings = Embeddings(config)
        self.layers = nn.ModuleList(EncoderLayer(config) for _ in range(config.num_unique_layers))
        self.plan = [index for step in config.layer_plan() for index in step]  # unique-layer index per call
        self.pooler = nn.Linear(config.hidden_size, config.hidden_size) if config.pooler else None

    def position_ids(self, input_ids: Tensor) -> Tensor:
        if self.config.positions_after_padding:  # fairseq: real tokens count from pad + 1, padding sits at pad
            real = input_ids.ne(self.config.pad_token_id).long()
            return torch.cumsum(real, 1) * real + self.config.pad_token_id
        return torch.arange(input_ids.shape[1], device=input_ids.device).expand_as(input_ids)

    @property
    def max_length(self) -> int:
        """The longest sequence the position embeddings cover."""
        offset = self.config.pad_token_id + 1 if self.config.positions_after_padding else 0
        return self.config.max_position_embeddings - offset

    def check_inputs(self, input_ids: Tensor) -> None:
        if input_ids.dim() != 2:
            raise InputError(f"input_ids must be [batch, length], got shape {tuple(input_ids.shape)}")
        if input_ids.shape[1] > self.max_length:
            raise InputError(f"a sequence of {input_ids.shape[1]} tokens is longer than the model's {self.max_length} "
                             "positions: truncate it, or embed it in windows (bertology.embed)")
        if input_ids.numel() and (int(input_ids.min()) < 0 or int(input_ids.max()) >= self.config.vocab_size):
            raise InputError(f"token ids must lie in [0, {self.config.vocab_size}), got "
                             f"[{int(input_ids.min())}, {int(input_ids.max())}]: does the tokenizer match the model?")

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
    ) -> EncoderOutput:
        """`last_layer_at` (flat indices into [B * L], packed path only, without hidden states or attentions): run
        the last layer only at these positions; `last_hidden_state` is then zero everywhere else."""
        self.check_inputs(input_ids)
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        if position_ids is None:
            position_ids = self.position_ids(input_ids)
        layout = Layout(attention_mask) if packed else None
        key_mask = None if packed else attention_mask.bool()[:, None, None, :]
        if layout is not None:
            tt = layout.pack(token_type_ids) if token_type_ids is not None else None
            x = self.embeddings(layout.pack(input_ids), layout.pack(position_ids), tt)
        else:
            x = self.embeddings(input_ids, position_ids, token_type_ids)

        to_padded = layout.unpack if layout is not None else (lambda t: t)
        hidden_states = [to_padded(x)] if output_hidden_states else None
        attentions = [] if output_attentions else None
        plan = self.plan
        prune = last_layer_at is not None and layout is not None and not (output_hidden_states or output_attentions)
        if prune:
            plan = plan[:-1]
        for index in plan:
            x, probs = self.layers[index](x, layout, key_mask, output_attentions)
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
            out[layout.flat_index[queries]] = self.layers[self.plan[-1]].forward_at(x, layout, queries)
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


# ---------------------------------------------------------------------------------------------------------------
# Heads. Which kind each family uses for each task, and the weight names, are data in bertology.model.checkpoint.

HeadKind = Literal["masked_lm", "pooled", "first_token", "token", "token_mlp"]


@dataclass(frozen=True)
class HeadSpec:
    """A head on the encoder. `name` keys it in `EncoderModel.heads` and in `EncoderOutput.head_logits`."""

    name: str  # "mlm", "nsp", "sop", "rtd", "classifier", "token_classifier", "qa", or a user's own
    kind: HeadKind
    num_labels: int = 2
    activation: str = "gelu"


class MaskedLMHead(nn.Module):
    """dense -> act -> LayerNorm -> vocabulary logits, the decoder tied to the input embeddings (plus a bias)."""

    def __init__(self, config: EncoderConfig, spec: HeadSpec) -> None:
        super().__init__()
        width = config.token_embedding_size
        self.dense = nn.Linear(config.hidden_size, width)
        self.act = activation(spec.activation)
        self.norm = nn.LayerNorm(width, eps=config.layer_norm_eps)
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))

    def forward(self, h: Tensor, word_embeddings: Tensor) -> Tensor:
        return F.linear(self.norm(self.act(self.dense(h))), word_embeddings, self.bias)


class LinearHead(nn.Module):
    """Dropout then a linear layer. On the pooled [CLS] vector ("pooled": NSP, SOP, BERT and ALBERT sequence
    classification) or on every token ("token": token classification, QA start/end with num_labels=2)."""

    def __init__(self, config: EncoderConfig, spec: HeadSpec) -> None:
        super().__init__()
        self.out = nn.Linear(config.hidden_size, spec.num_labels)
        self.dropout = config.head_dropout

    def forward(self, x: Tensor) -> Tensor:
        return self.out(F.dropout(x, self.dropout, self.training))


class FirstTokenHead(nn.Module):
    """dense -> act -> out on the first token: RoBERTa (tanh), ELECTRA (gelu), DistilBERT (relu) classification."""

    def __init__(self, config: EncoderConfig, spec: HeadSpec) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.act = activation(spec.activation)
        self.out = nn.Linear(config.hidden_size, spec.num_labels)
        self.dropout = config.head_dropout

    def forward(self, h: Tensor) -> Tensor:
        x = self.act(self.dense(F.dropout(h[:, 0], self.dropout, self.training)))
        return self.out(F.dropout(x, self.dropout, self.training))


class TokenMLPHead(nn.Module):
    """dense -> act -> one logit per token: ELECTRA's replaced-token discriminator."""

    def __init__(self, config: EncoderConfig, spec: HeadSpec) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.act = activation(spec.activation)
        self.out = nn.Linear(config.hidden_size, 1)

    def forward(self, h: Tensor) -> Tensor:
        return self.out(self.act(self.dense(h))).squeeze(-1)


HEAD_CLASSES: dict[str, type[nn.Module]] = {
    "masked_lm": MaskedLMHead,
    "pooled": LinearHead,
    "first_token": FirstTokenHead,
    "token": LinearHead,
    "token_mlp": TokenMLPHead,
}


# Heads that read only the masked positions and the first token, so the last layer can skip every other token.
SPARSE_HEAD_KINDS = frozenset({"masked_lm", "pooled", "first_token"})


class EncoderModel(nn.Module):
    """An encoder with zero or more heads. The first head is the primary one: its logits are `output.logits`."""

    def __init__(self, config: EncoderConfig, heads: Sequence[HeadSpec] = ()) -> None:
        super().__init__()
        self.config = config
        self.encoder = Encoder(config)
        self.head_specs = tuple(heads)
        self.heads = nn.ModuleDict({spec.name: HEAD_CLASSES[spec.kind](config, spec) for spec in heads})

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
        heads_only: bool = False,
    ) -> EncoderOutput:
        """`masked_positions` [N, 2] (row, column): MLM logits only there ([N, V]), else at every position.

        `heads_only`: when every head reads only the masked positions and the first token (MLM, NSP/SOP, sentence
        classification), run the last layer only there, as pretraining needs; `last_hidden_state` is then zero
        elsewhere. Ignored when a head reads every token or hidden states or attentions are requested."""
        last_layer_at = None
        if heads_only and masked_positions is not None and all(s.kind in SPARSE_HEAD_KINDS for s in self.head_specs):
            width = input_ids.shape[1]
            first = torch.arange(input_ids.shape[0], device=input_ids.device) * width
            last_layer_at = torch.cat([masked_positions[:, 0] * width + masked_positions[:, 1], first])
        out = self.encoder(
            input_ids,
            attention_mask,
            token_type_ids,
            position_ids,
            output_hidden_states=output_hidden_states,
            output_attentions=output_attentions,
            packed=packed,
            last_layer_at=last_layer_at,
        )
        h = out.last_hidden_state
        for spec in self.head_specs:
            head = self.heads[spec.name]
            if spec.kind == "masked_lm":
                at = h[masked_positions[:, 0], masked_positions[:, 1]] if masked_positions is not None else h
                out.head_logits[spec.name] = head(at, self.encoder.embeddings.word.weight)
            elif spec.kind == "pooled":
                if out.pooler_output is None:
                    raise ValueError(f"head {spec.name!r} needs the pooler, which this encoder does not have")
                out.head_logits[spec.name] = head(out.pooler_output)
            else:
                out.head_logits[spec.name] = head(h)
        if self.head_specs:
            out.logits = out.head_logits[self.head_specs[0].name]
        return out

    @torch.no_grad()
    def init_weights(self, generator: torch.Generator | None = None) -> None:
        """BERT's initialisation: N(0, initializer_range) weights, zero biases, unit LayerNorms, zero padding row."""
        std = self.config.initializer_range
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                module.weight.normal_(0.0, std, generator=generator)
            if isinstance(module, nn.Linear) and module.bias is not None:
                module.bias.zero_()
            if isinstance(module, nn.Embedding) and module.padding_idx is not None:
                module.weight[module.padding_idx].zero_()
            if isinstance(module, nn.LayerNorm):
                module.weight.fill_(1.0)
                module.bias.zero_()
        for head in self.heads.values():
            if isinstance(head, MaskedLMHead):
                head.bias.zero_()
