"""The bidirectional transformer encoder: every family (BERT, RoBERTa, XLM-R, ELECTRA, ALBERT, DistilBERT) in one file.

    x_0 = LayerNorm(E_word[w] + E_pos[p] + E_type[t])        (then a linear projection if embedding_size != hidden)
    a   = softmax(Q K^T / sqrt(d_k)) V, per head, Q = x W_q, K = x W_k, V = x W_v
    x'  = LayerNorm(x + a W_o)
    x'' = LayerNorm(x' + act(x' W_1) W_2)

(Adapters, when a layer has them, act on a W_o and on act(x' W_1) W_2 before the residual add; prefix keys and
values, when it has them, are attended beside each sequence's own: see EncoderLayer.)

Padding costs nothing: the real tokens of a padded [B, L] batch are packed into [T, H] for every linear layer, and
attention runs per sequence (sequences of equal length share one call). `packed=False` runs the classic padded
computation instead; both give the same outputs at real tokens.
"""

from __future__ import annotations

import functools
import importlib
import json
import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from bertology.errors import ConfigError, InputError
from bertology.model.config import EncoderConfig
from bertology.model.dropout import fast_dropout


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


def attend(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, dropout: float, need_weights: bool,
           prefix: tuple[Tensor, Tensor] | None = None, head_scale: Tensor | None = None):
    """Scaled dot-product attention on [..., heads, len, head_dim]; `mask` is True where a key may be attended.

    `prefix` (keys, values), each [heads, P, head_dim]: P more positions that every query attends to, in front of
    its own keys (prefix tuning). The probabilities returned cover the sequence's own keys only, so with a prefix a
    row sums to 1 minus the share that went to the prefix positions.

    `head_scale` [heads]: each head's output (and its returned probabilities) multiplied by its entry, as
    transformers' `head_mask` multiplies the probabilities (Michel et al. 2019's mask variables)."""
    if head_scale is not None:
        out, probs = attend(q, k, v, mask, dropout, need_weights, prefix)
        scale = head_scale.to(out.dtype)[:, None, None]
        return out * scale, (probs * scale if probs is not None else None)
    num_prefix = prefix[0].shape[-2] if prefix is not None else 0
    if num_prefix:
        k = torch.cat([prefix[0].expand(*k.shape[:-2], -1, -1), k], -2)
        v = torch.cat([prefix[1].expand(*v.shape[:-2], -1, -1), v], -2)
        if mask is not None:
            mask = torch.cat([mask.new_ones(*mask.shape[:-1], num_prefix), mask], -1)
    # With dropout on CPU, SDPA falls back to its math kernel with a Bernoulli mask: the explicit product with the
    # byte-mask dropout is faster (benchmarks/RESULTS.md, "Training").
    if not need_weights and not (dropout > 0 and q.device.type == "cpu"):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout), None
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    probs = scores.softmax(-1)
    out = fast_dropout(probs, dropout, dropout > 0) @ v
    return out, (probs[..., num_prefix:] if need_weights else None)


def plain_linear(module: nn.Module | None) -> bool:
    """True for an nn.Linear itself (not a subclass or a wrapper) without hooks: its output is x W^T + b."""
    return type(module) is nn.Linear and not (module._forward_hooks or module._forward_pre_hooks)


class EncoderLayer(nn.Module):
    """Self-attention then a feed-forward, each followed by dropout, an optional adapter, the residual and LayerNorm.

    Extension points (None by default; then nothing changes): `attn_adapter` and `ffn_adapter` map a sublayer's
    output [.., H] to [.., H] before the residual add (bottleneck adapters); `prefix` returns (keys, values), each
    [P, heads, head_dim], attended by every query beside its own sequence (prefix tuning). `query`, `key` and `value`
    are separate modules, so a wrapper (LoRA) can replace any of them."""

    def __init__(self, config: EncoderConfig, index: int = 0) -> None:
        super().__init__()
        hidden, eps = config.hidden_size, config.layer_norm_eps
        # A pruned layer (config.pruned_heads) keeps fewer heads of the same size: its projections are narrower.
        self.num_heads = config.heads_in_layer(index)
        self.head_dim = config.head_dim
        width = self.num_heads * self.head_dim
        with warnings.catch_warnings():  # a layer with every head pruned has empty projections: nothing to initialise
            warnings.filterwarnings("ignore", "Initializing zero-element tensors")
            self.query = nn.Linear(hidden, width)
            self.key = nn.Linear(hidden, width)
            self.value = nn.Linear(hidden, width)
            self.attn_out = nn.Linear(width, hidden)
        self.attn_norm = nn.LayerNorm(hidden, eps=eps)
        self.ffn_in = nn.Linear(hidden, config.intermediate_size)
        self.ffn_out = nn.Linear(config.intermediate_size, hidden)
        self.ffn_norm = nn.LayerNorm(hidden, eps=eps)
        self.attn_adapter: nn.Module | None = None
        self.ffn_adapter: nn.Module | None = None
        self.prefix: nn.Module | None = None
        self.act = activation(config.hidden_act)
        self.dropout = config.hidden_dropout
        self.attention_dropout = config.attention_dropout

    def forward(self, x: Tensor, layout: Layout | None, key_mask: Tensor | None, need_weights: bool = False,
                queries: Tensor | None = None, head_scale: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
        """x is packed [T, H] when `layout` is given, else padded [B, L, H] with `key_mask` [B, 1, 1, L].

        `queries` (packed path only): sorted indices of packed tokens; the layer's output is computed only at these
        rows ([len(queries), H]), attending to the keys and values of every token (the pruned last layer).
        `head_scale` [num_heads]: multiplies each head's output (a head mask)."""
        if queries is None:
            a, probs = self.attention(x, layout, key_mask, need_weights, head_scale)
            rows = x
        else:
            if layout is None:
                raise InputError("queries select packed tokens: they need the packed layout")
            a, probs = self.attention_at(x, layout, queries, head_scale), None
            rows = x[queries]
        h = self.attn_norm(rows + self.sublayer_output(self.attn_out(a), self.attn_adapter))
        f = self.ffn_out(self.act(self.ffn_in(h)))
        return self.ffn_norm(h + self.sublayer_output(f, self.ffn_adapter)), probs

    def sublayer_output(self, y: Tensor, adapter: nn.Module | None) -> Tensor:
        y = fast_dropout(y, self.dropout, self.training)
        return adapter(y) if adapter is not None else y

    def project(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Queries, keys and values of x. When all three projections are plain nn.Linear (no wrapper has replaced
        one), they run as one matmul on their concatenated weights: one larger product is faster on CPU than three
        (benchmarks/RESULTS.md, "Separate q/k/v projections"). Otherwise each module is called."""
        q, k, v = self.query, self.key, self.value
        if plain_linear(q) and plain_linear(k) and plain_linear(v) and q.bias is not None and k.bias is not None \
                and v.bias is not None:
            w = torch.cat([q.weight, k.weight, v.weight])
            b = torch.cat([q.bias, k.bias, v.bias])
            return F.linear(x, w, b).chunk(3, -1)
        return q(x), k(x), v(x)

    def prefix_states(self) -> tuple[Tensor, Tensor] | None:
        """The prefix module's keys and values as [heads, P, head_dim], or None without one."""
        if self.prefix is None:
            return None
        keys, values = self.prefix()
        return keys.transpose(0, 1), values.transpose(0, 1)

    def attention(self, x: Tensor, layout: Layout | None, key_mask: Tensor | None, need_weights: bool,
                  head_scale: Tensor | None = None):
        heads, head_dim = self.num_heads, self.head_dim
        p = self.attention_dropout if self.training else 0.0
        q, k, v = self.project(x)
        prefix = self.prefix_states()
        if heads == 0:  # every head pruned: the sublayer adds attn_out's bias alone
            batch, length = (layout.batch_size, layout.seq_len) if layout is not None else x.shape[:2]
            return q, (x.new_zeros(batch, 0, length, length) if need_weights else None)
        if layout is None:  # padded: [B, L, H] -> [B, heads, L, d]
            q, k, v = (t.unflatten(-1, (heads, head_dim)).transpose(1, 2) for t in (q, k, v))
            out, probs = attend(q, k, v, key_mask, p, need_weights, prefix, head_scale)
            return out.transpose(1, 2).flatten(2), probs
        outs, probs_by_group = [], []
        for start, count, length in layout.groups:  # `count` sequences of `length` tokens, contiguous in x
            q_g, k_g, v_g = (t[start:start + count * length].view(count, length, heads, head_dim).transpose(1, 2)
                             for t in (q, k, v))
            o, probs = attend(q_g, k_g, v_g, None, p, need_weights, prefix, head_scale)
            outs.append(o.transpose(1, 2).reshape(count * length, -1))
            probs_by_group.append(probs)
        out = outs[0] if len(outs) == 1 else torch.cat(outs or [q[:0]])  # one group: no copy; none: no tokens
        return out, (scatter_attention(probs_by_group, layout, heads, x) if need_weights else None)

    def attention_at(self, x: Tensor, layout: Layout, queries: Tensor, head_scale: Tensor | None = None) -> Tensor:
        """Attention output [len(queries), heads x head_dim] at the packed tokens `queries` (sorted): keys and
        values come from every token, the query projection runs on the selected rows alone."""
        heads, head_dim = self.num_heads, self.head_dim
        hidden = heads * head_dim
        p = self.attention_dropout if self.training else 0.0
        q = self.query(x[queries])
        if heads == 0:
            return q
        k, v = (layout.unpack(t).unflatten(-1, (heads, head_dim)).transpose(1, 2) for t in (self.key(x), self.value(x)))
        # Each sequence's selected queries side by side: [B, Q_max, H], slots past a row's count are zeros. A
        # sequence's tokens are contiguous in packed order, so its queries form one run of `queries`.
        row = layout.flat_index[queries] // layout.seq_len
        position = torch.arange(len(queries), device=x.device)
        run_start = torch.ones_like(row, dtype=torch.bool)
        run_start[1:] = row[1:] != row[:-1]
        slot = position - torch.cummax(torch.where(run_start, position, 0), 0).values
        q_padded = q.new_zeros(layout.batch_size, int(slot.max()) + 1 if len(queries) else 0, hidden)
        q_padded[row, slot] = q
        mask = layout.unpack(torch.ones(len(x), dtype=torch.bool, device=x.device))[:, None, None, :]
        o, _ = attend(q_padded.unflatten(-1, (heads, head_dim)).transpose(1, 2), k, v, mask, p, False,
                      self.prefix_states(), head_scale)
        return o.transpose(1, 2).flatten(2)[row, slot]


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
        if input_ids.numel() and (int(input_ids.min()) < 0 or int(input_ids.max()) >= self.config.vocab_size):
            raise InputError(f"token ids must lie in [0, {self.config.vocab_size}), got "
                             f"[{int(input_ids.min())}, {int(input_ids.max())}]: does the tokenizer match the model?")

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
    ) -> EncoderOutput:
        """`last_layer_at` (flat indices into [B * L], packed path only, without hidden states or attentions): run
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
        for call, index in enumerate(plan):
            x, probs = self.layers[index](x, layout, key_mask, output_attentions, head_scale=head_scales[call])
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


# ---------------------------------------------------------------------------------------------------------------
# Heads. Which kind each family uses for each task, and the weight names, are data in bertology.model.checkpoint.

HeadKind = Literal["masked_lm", "pooled", "first_token", "mean_pooled", "token", "token_mlp"]
HEAD_KINDS: tuple[str, ...] = ("masked_lm", "pooled", "first_token", "mean_pooled", "token", "token_mlp")


@dataclass(frozen=True)
class HeadSpec:
    """A head on the encoder. `name` keys it in `EncoderModel.heads` and in `EncoderOutput.head_logits`."""

    name: str  # "mlm", "nsp", "sop", "rtd", "classifier", "token_classifier", "qa", or a user's own
    kind: HeadKind
    num_labels: int = 2
    activation: str = "gelu"

    def __post_init__(self) -> None:
        if self.kind not in HEAD_KINDS:
            raise ConfigError(f"head {self.name!r}: unknown kind {self.kind!r}; expected one of {', '.join(HEAD_KINDS)}")


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
        return self.out(fast_dropout(x, self.dropout, self.training))


class FirstTokenHead(nn.Module):
    """dense -> act -> out on the first token: RoBERTa (tanh), ELECTRA (gelu), DistilBERT (relu) classification."""

    def __init__(self, config: EncoderConfig, spec: HeadSpec) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.act = activation(spec.activation)
        self.out = nn.Linear(config.hidden_size, spec.num_labels)
        self.dropout = config.head_dropout

    def forward(self, h: Tensor) -> Tensor:
        x = self.act(self.dense(fast_dropout(h[:, 0], self.dropout, self.training)))
        return self.out(fast_dropout(x, self.dropout, self.training))


class MeanPooledHead(nn.Module):
    """Dropout then a linear layer on the mean of the real tokens' vectors (sentence-transformers' pooling):
    sequence classification that reads every token instead of [CLS]."""

    def __init__(self, config: EncoderConfig, spec: HeadSpec) -> None:
        super().__init__()
        self.out = nn.Linear(config.hidden_size, spec.num_labels)
        self.dropout = config.head_dropout

    def forward(self, h: Tensor, attention_mask: Tensor) -> Tensor:
        real = attention_mask.to(h.dtype).unsqueeze(-1)
        mean = (h * real).sum(1) / real.sum(1).clamp(min=1)
        return self.out(fast_dropout(mean, self.dropout, self.training))


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
    "mean_pooled": MeanPooledHead,
    "token": LinearHead,
    "token_mlp": TokenMLPHead,
}


# Factories of modules plugged into a model (adapters, prefixes, projection wrappers), by name. A factory is called as
# factory(config, current_module_or_None, **options) and returns the module to put in its place.
EXTENSIONS: dict[str, Callable[..., nn.Module]] = {}
# Factories bertology ships, by the module that registers them when imported: a checkpoint naming one loads without
# the caller importing that module first.
BUILTIN_EXTENSIONS: dict[str, str] = {
    "lora": "bertology.peft.lora",
    "bottleneck_adapter": "bertology.peft.adapters",
    "prefix": "bertology.peft.prefix",
    "span_classifier": "bertology.tasks.spans",
    "scalar_mix": "bertology.peft.scalar_mix",
}


def register_extension(name: str, factory: Callable[..., nn.Module]) -> None:
    """Make `factory` available to EncoderModel.add_extension under `name`. A checkpoint in the native format names
    its extensions' factories: register them before loading it."""
    EXTENSIONS[name] = factory


# Heads that read every token of the last layer: with one of them the last layer is never pruned.
DENSE_HEAD_KINDS = frozenset({"token", "token_mlp", "mean_pooled"})


class EncoderModel(nn.Module):
    """An encoder with zero or more heads. The first head is the primary one: its logits are `output.logits`."""

    def __init__(self, config: EncoderConfig, heads: Sequence[HeadSpec] = ()) -> None:
        super().__init__()
        self.config = config
        self.encoder = Encoder(config)
        self.head_specs = tuple(heads)
        self.heads = nn.ModuleDict({spec.name: HEAD_CLASSES[spec.kind](config, spec) for spec in heads})
        # Modules plugged in with add_extension: module path -> (factory name, options), to rebuild them on load.
        self.extensions: dict[str, tuple[str, dict[str, Any]]] = {}
        # An optional mix of all hidden states (ELMo's scalar mix, the extension "scalar_mix" at "mix"): when set,
        # the heads read it instead of the last layer; the pooler still reads the last layer's [CLS].
        self.mix: nn.Module | None = None

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
    ) -> EncoderOutput:
        """`masked_positions` [N, 2] (row, column): MLM logits only there ([N, V]), else at every position.
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
        )
        h = out.last_hidden_state if self.mix is None else self.mix(out.hidden_states)
        if self.mix is not None and not output_hidden_states:
            out.hidden_states = None
        for spec in self.head_specs:
            head = self.heads[spec.name]
            if spec.kind == "masked_lm":
                at = h[masked_positions[:, 0], masked_positions[:, 1]] if masked_positions is not None else h
                out.head_logits[spec.name] = head(at, self.encoder.embeddings.word.weight)
            elif spec.kind == "mean_pooled":
                mask = attention_mask if attention_mask is not None else torch.ones_like(input_ids)
                out.head_logits[spec.name] = head(h, mask)
            elif spec.kind == "pooled":
                if out.pooler_output is None:
                    raise ValueError(f"head {spec.name!r} needs the pooler, which this encoder does not have")
                out.head_logits[spec.name] = head(out.pooler_output)
            else:
                out.head_logits[spec.name] = head(h)
        if self.head_specs:
            out.logits = out.head_logits[self.head_specs[0].name]
        return out

    def add_extension(self, where: str, factory: str, **options: Any) -> nn.Module:
        """Plug `EXTENSIONS[factory](self.config, current, **options)` in at the module path `where` (for example
        "encoder.layers.3.attn_adapter", or "encoder.layers.0.query" to wrap that projection; `current` is what is
        there now) and record it in `self.extensions`, so that the native checkpoint format can rebuild it. Options
        must be JSON values. Returns the new module."""
        if factory not in EXTENSIONS and factory in BUILTIN_EXTENSIONS:
            importlib.import_module(BUILTIN_EXTENSIONS[factory])
        if factory not in EXTENSIONS:
            raise ConfigError(f"unknown extension {factory!r}; registered: {', '.join(sorted(EXTENSIONS)) or 'none'} "
                              "(bertology.model.register_extension)")
        try:
            json.dumps(options)
        except (TypeError, ValueError) as error:
            raise ConfigError(f"extension {where!r}: options must be JSON values ({error})") from None
        parent_path, _, attribute = where.rpartition(".")
        try:
            parent = self.get_submodule(parent_path)
        except AttributeError:
            raise ConfigError(f"extension {where!r}: the model has no module {parent_path!r}") from None
        if not hasattr(parent, attribute):
            raise ConfigError(f"extension {where!r}: {type(parent).__name__} has no attribute {attribute!r}")
        module = EXTENSIONS[factory](self.config, getattr(parent, attribute), **options)
        setattr(parent, attribute, module)
        self.extensions[where] = (factory, dict(options))
        return module

    @torch.no_grad()
    def prune_heads(self, heads: dict[int, Sequence[int]]) -> None:
        """Remove attention heads for good. `heads` maps a layer index to head indices in the unpruned numbering
        (heads pruned already are ignored). Those heads' rows of query, key and value and their columns of the
        attention output are dropped, so the model is smaller and computes what it computed with them masked to 0;
        `config.pruned_heads` records them (transformers' config.json `pruned_heads`)."""
        config = self.config
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
        if last_layer_at.numel() and not (0 <= int(last_layer_at.min()) and int(last_layer_at[:, 0].max()) < batch
                                          and int(last_layer_at[:, 1].max()) < width):
            raise InputError(f"last_layer_at holds a position outside the [{batch}, {width}] batch")
        kinds = {spec.kind for spec in self.head_specs}
        if kinds & DENSE_HEAD_KINDS or ("masked_lm" in kinds and masked_positions is None):
            return None
        at = [last_layer_at[:, 0] * width + last_layer_at[:, 1]]
        if "masked_lm" in kinds:
            assert masked_positions is not None
            at.append(masked_positions[:, 0] * width + masked_positions[:, 1])
        if self.encoder.pooler is not None or "first_token" in kinds:
            at.append(torch.arange(batch, device=input_ids.device) * width)
        return torch.cat([t.to(input_ids.device, torch.long) for t in at])

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
