"""Blocks: self-attention, optional cross-attention and a feed-forward, each with a residual and a norm.

    post-norm (BERT, BART):     h = Norm(x + Attn(x));          y = Norm(h + FFN(h))
    pre-norm  (GPT-2, T5):      h = x + Attn(Norm(x));          y = h + FFN(Norm(h))
    FFN: act(x W_in) W_out, or gated act(x W_gate) * (x W_in) W_out (T5 v1.1)

Norms are LayerNorm or RMSNorm; linear biases are optional. One `BlockSpec` says which. Every family's stack is a
list of these blocks; the parameter slots keep the same names in all of them (query, key, value, attn_out, attn_norm,
cross_query, cross_key, cross_value, cross_out, cross_norm, ffn_in, ffn_gate, ffn_out, ffn_norm; Longformer's
query_global, key_global, value_global: the global tokens' own projections), so extensions
address them by path whatever the family: `attn_adapter` and `ffn_adapter` map a sublayer's output [.., H] before
the residual add (bottleneck adapters), `prefix` returns (keys, values), each [P, heads, head_dim], attended by every
query beside its own sequence (prefix tuning), and any projection may be replaced by a wrapper (LoRA)."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from bertology.errors import InputError
from bertology.model.attention import (
    EVERYTHING,
    GlobalProjections,
    GlobalQKV,
    attend,
    attention,
    packed_attention,
    scatter_attention,
)
from bertology.model.context import AttentionContext, KVCache
from bertology.model.dropout import fast_dropout
from bertology.model.heads import activation
from bertology.model.packing import Layout
from bertology.model.positions import apply_rotary

# KVCache lives with the context it is part of; re-exported here, where the blocks that fill it are.
__all__ = ["COMPILED_METHODS", "Block", "BlockSpec", "KVCache", "compile_blocks", "init_parameters", "norm_layer",
           "plain_linear"]


@dataclass(frozen=True)
class BlockSpec:
    """The shape and behaviour of one block."""

    hidden_size: int
    num_heads: int
    head_dim: int
    intermediate_size: int
    activation: str = "gelu"
    norm: Literal["layernorm", "rmsnorm"] = "layernorm"
    norm_eps: float = 1e-12
    pre_norm: bool = False
    gated: bool = False
    bias: bool = True
    attention_bias: bool | None = None  # the attention projections' biases; None: as `bias` (XLNet has none there)
    cross_attention: bool = False
    dropout: float = 0.1
    attention_dropout: float = 0.1
    attention_scale: float | None = None  # None: 1 / sqrt(head_dim); T5 uses 1
    activation_dropout: float = 0.0  # dropout after the feed-forward's activation (BART's activation_dropout)
    global_projections: bool = False  # Longformer: the global tokens' rows attend with projections of their own
    norm_bias: bool = True  # the LayerNorms' biases (ModernBERT has none)
    attention_norm: bool = True  # False (pre-norm only): no norm before the attention, an identity in `attn_norm`
    # DeBERTa's projections of the relative-position embeddings of their own: "key" (pos_key), "query" (pos_query)
    relative_projections: tuple[str, ...] = ()


def norm_layer(kind: str, width: int, eps: float, bias: bool = True) -> nn.Module:
    """A LayerNorm (with a bias or not) or an RMSNorm (never one)."""
    if kind == "rmsnorm":
        return nn.RMSNorm(width, eps=eps)
    return nn.LayerNorm(width, eps=eps, bias=bias)


def plain_linear(module: nn.Module | None) -> bool:
    """True for an nn.Linear itself (not a subclass or a wrapper) without hooks: its output is x W^T + b."""
    return type(module) is nn.Linear and not (module._forward_hooks or module._forward_pre_hooks)


class Block(nn.Module):
    """One transformer block (see the module docstring). Padded input x [B, L, H], or packed [T, H] with a `Layout`."""

    def __init__(self, spec: BlockSpec) -> None:
        super().__init__()
        self.spec = spec
        hidden, eps, bias = spec.hidden_size, spec.norm_eps, spec.bias
        attention_bias = bias if spec.attention_bias is None else spec.attention_bias
        self.num_heads, self.head_dim = spec.num_heads, spec.head_dim
        width = spec.num_heads * spec.head_dim
        with warnings.catch_warnings():  # a layer with every head pruned has empty projections: nothing to initialise
            warnings.filterwarnings("ignore", "Initializing zero-element tensors")
            self.query = nn.Linear(hidden, width, bias=attention_bias)
            self.key = nn.Linear(hidden, width, bias=attention_bias)
            self.value = nn.Linear(hidden, width, bias=attention_bias)
            self.attn_out = nn.Linear(width, hidden, bias=attention_bias)
            for side in spec.relative_projections:  # DeBERTa's, read by its score provider
                setattr(self, f"pos_{side}", nn.Linear(hidden, width, bias=attention_bias))
            if spec.global_projections:
                self.query_global = nn.Linear(hidden, width, bias=attention_bias)
                self.key_global = nn.Linear(hidden, width, bias=attention_bias)
                self.value_global = nn.Linear(hidden, width, bias=attention_bias)
        if not spec.attention_norm and not spec.pre_norm:
            raise ValueError("a block without an attention norm must be pre-norm")
        norm_bias = spec.norm_bias
        self.attn_norm = norm_layer(spec.norm, hidden, eps, norm_bias) if spec.attention_norm else nn.Identity()
        if spec.cross_attention:
            self.cross_query = nn.Linear(hidden, width, bias=bias)
            self.cross_key = nn.Linear(hidden, width, bias=bias)
            self.cross_value = nn.Linear(hidden, width, bias=bias)
            self.cross_out = nn.Linear(width, hidden, bias=bias)
            self.cross_norm = norm_layer(spec.norm, hidden, eps, norm_bias)
        self.ffn_in = nn.Linear(hidden, spec.intermediate_size, bias=bias)
        self.ffn_gate = nn.Linear(hidden, spec.intermediate_size, bias=bias) if spec.gated else None
        self.ffn_out = nn.Linear(spec.intermediate_size, hidden, bias=bias)
        self.ffn_norm = norm_layer(spec.norm, hidden, eps, norm_bias)
        self.attn_adapter: nn.Module | None = None
        self.ffn_adapter: nn.Module | None = None
        self.prefix: nn.Module | None = None
        self.act = activation(spec.activation)
        self.dropout = spec.dropout
        self.attention_dropout = spec.attention_dropout

    def forward(self, x: Tensor, context: AttentionContext | None = None) -> tuple[Tensor, Tensor | None]:
        """x is packed [T, H] when the context has a `layout`, else padded [B, L, H] with the context's `key_mask`
        [B, L_keys] (with a cache, L_keys counts the cached positions too). `context`: one layer call's
        (`AttentionContext.at`; default: bidirectional, every key real); the block reads from it its policy, score
        provider, head scale, cache, global tokens (their rows with the block's global projections when it has
        them: Longformer), prefix LM's prefix, the memory cross-attention reads and whether probabilities are
        wanted.

        The context's `queries` (packed, bidirectional only): sorted indices of packed tokens; the block's output is
        computed only at these rows ([len(queries), H]), attending to the keys and values of every token (the
        pruned last layer). With the context's `memory_layout` (the packing of `memory_mask`, no cache) the memory
        comes packed, [T_mem, H], and its keys and values are projected at its real tokens alone. The context's
        `rotary` (cos, sin), [T, head_dim] packed or [B, L, head_dim] padded (`positions.rotary_tables` of the
        input's positions, this layer call's base): the queries and keys are rotated by them before attention."""
        context = context if context is not None else EVERYTHING
        queries, layout = context.queries, context.layout
        if queries is not None and layout is None:
            raise InputError("queries select packed tokens: they need the packed layout")
        if queries is not None and context.rotary is not None:
            raise InputError("queries (the pruned last layer) take no rotary positions")
        pre = self.spec.pre_norm
        rows = x if queries is None else x[queries]
        z = self.attn_norm(x) if pre else x
        if queries is None:
            a, probs = self.self_attention(z, context)
        else:
            assert layout is not None
            a, probs = self.attention_at(z, layout, queries, context.head_scale), None
        h = self.attention_residual(rows, a)
        if self.spec.cross_attention:
            if context.memory is None:
                raise InputError("this block cross-attends: it needs the encoder's memory")
            c = self.cross_attention(self.cross_norm(h) if pre else h, context)
            h = h + self.sublayer_output(self.cross_out(c), None)
            if not pre:
                h = self.cross_norm(h)
        return self.feed_forward_residual(h), probs

    # The token-wise work around attention: what `compile_blocks` compiles (any number of tokens, one graph).
    def attention_residual(self, rows: Tensor, a: Tensor) -> Tensor:
        h = rows + self.sublayer_output(self.attn_out(a), self.attn_adapter)
        return h if self.spec.pre_norm else self.attn_norm(h)

    def feed_forward_residual(self, h: Tensor) -> Tensor:
        if self.spec.pre_norm:
            return h + self.sublayer_output(self.feed_forward(self.ffn_norm(h)), self.ffn_adapter)
        return self.ffn_norm(h + self.sublayer_output(self.feed_forward(h), self.ffn_adapter))

    def feed_forward(self, h: Tensor) -> Tensor:
        if self.ffn_gate is not None:
            inner = self.act(self.ffn_gate(h)) * self.ffn_in(h)
        else:
            inner = self.act(self.ffn_in(h))
        return self.ffn_out(fast_dropout(inner, self.spec.activation_dropout, self.training))

    def sublayer_output(self, y: Tensor, adapter: nn.Module | None) -> Tensor:
        y = fast_dropout(y, self.dropout, self.training)
        return adapter(y) if adapter is not None else y

    def project(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Queries, keys and values of x. When all three projections are plain nn.Linear (no wrapper has replaced
        one), they run as one matmul on their concatenated weights: one larger product is faster on CPU than three
        (benchmarks/RESULTS.md, "Separate q/k/v projections"). Otherwise each module is called."""
        q, k, v = self.query, self.key, self.value
        if plain_linear(q) and plain_linear(k) and plain_linear(v):
            biases = (q.bias, k.bias, v.bias)
            if all(b is not None for b in biases) or all(b is None for b in biases):
                fused = self.fused_qkv()
                if fused is not None:
                    return F.linear(x, *fused).chunk(3, -1)
        return q(x), k(x), v(x)

    def fused_qkv(self) -> tuple[Tensor, Tensor | None] | None:
        """The query, key and value weights (and biases) concatenated. In eval mode without gradients (inference,
        decoding; one process) the concatenation is kept until a weight changes (its version or storage) or the block
        trains again: a decoding step of a few tokens otherwise spends more time copying the weights than
        multiplying by them.

        Weights made under `torch.inference_mode()` (inference tensors) have no version counter, so an in-place
        change to one (possible inside inference mode) could not be seen: nothing is kept for them, and None is
        returned: the caller multiplies by the three weights apart. Concatenating afresh for one product does not pay
        (measured, 2 threads, 128-8,192 rows: at hidden 768 1-17 % slower than three products, at hidden 256 from
        8 % slower to 9 % faster)."""
        parts = [(m.weight, m.bias) for m in (self.query, self.key, self.value)]
        tensors = [t for pair in parts for t in pair if t is not None]

        def fused() -> tuple[Tensor, Tensor | None]:
            weight = torch.cat([w for w, _ in parts])
            return weight, (torch.cat([b for _, b in parts]) if parts[0][1] is not None else None)

        if self.training or (torch.is_grad_enabled() and any(t.requires_grad for t in tensors)) or (
                torch.distributed.is_available() and torch.distributed.is_initialized()):  # FSDP swaps storages
            return fused()
        if any(t.is_inference() for t in tensors):
            self.__dict__.pop("_fused_qkv", None)
            return None
        key = tuple((t.data_ptr(), t._version, t.dtype, t.device) for t in tensors)
        cached = self.__dict__.get("_fused_qkv")
        if cached is None or cached[0] != key:
            cached = (key, fused())
            self.__dict__["_fused_qkv"] = cached
        return cached[1]

    def train(self, mode: bool = True) -> Block:
        self.__dict__.pop("_fused_qkv", None)  # a training block concatenates afresh: no stale copy held
        return super().train(mode)

    def global_projection(self, x: Tensor, global_tokens: Tensor | None
                          ) -> GlobalProjections | tuple[Tensor, Tensor, Tensor] | None:
        """The global projections of x, applied where attention needs them (`GlobalProjections`) when they are plain
        linear layers; else (a wrapper such as LoRA replaced one) the global tokens' queries (zero at the other rows:
        only theirs are read) and every token's global keys and values, [..., heads x d] each. None without global
        tokens or global projections."""
        if global_tokens is None or not self.spec.global_projections:
            return None
        modules = (self.query_global, self.key_global, self.value_global)
        if all(plain_linear(m) for m in modules):
            return GlobalProjections(x, self.num_heads,
                                     (modules[0].weight, modules[1].weight, modules[2].weight),
                                     (modules[0].bias, modules[1].bias, modules[2].bias))
        rows = global_tokens.nonzero(as_tuple=True)
        queries = x.new_zeros(*x.shape[:-1], self.query_global.out_features)
        queries[rows] = self.query_global(x[rows]).to(queries.dtype)
        return queries, self.key_global(x), self.value_global(x)

    def prefix_states(self) -> tuple[Tensor, Tensor] | None:
        """The prefix module's keys and values as [heads, P, head_dim], or None without one."""
        if self.prefix is None:
            return None
        keys, values = self.prefix()
        return keys.transpose(0, 1), values.transpose(0, 1)

    def heads_first(self, t: Tensor) -> Tensor:
        """[B, L, heads x d] -> [B, heads, L, d]."""
        return t.unflatten(-1, (self.num_heads, self.head_dim)).transpose(1, 2)

    def self_attention(self, x: Tensor, context: AttentionContext) -> tuple[Tensor, Tensor | None]:
        heads, head_dim = self.num_heads, self.head_dim
        layout, cache, need_weights, rotary = context.layout, context.cache, context.need_weights, context.rotary
        p = self.attention_dropout if self.training else 0.0
        scale = self.spec.attention_scale
        q, k, v = self.project(x)
        if heads == 0:  # every head pruned: the sublayer adds attn_out's bias alone
            batch, length = (layout.batch_size, layout.seq_len) if layout is not None else x.shape[:2]
            return q, (x.new_zeros(batch, 0, length, length) if need_weights else None)
        prefix = self.prefix_states()
        global_qkv = self.global_projection(x, context.global_tokens)
        if layout is None:  # padded: [B, L, H] -> [B, heads, L, d]
            q, k, v = (self.heads_first(t) for t in (q, k, v))
            if rotary is not None:  # [B, L, d] tables, the same for every head
                cos, sin = rotary[0][:, None], rotary[1][:, None]
                q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
            if cache is not None:
                k, v = cache.extend(k, v)
            qkv_g: GlobalQKV | None = global_qkv if not isinstance(global_qkv, tuple) else None
            if isinstance(global_qkv, tuple):
                gq, gk, gv = (self.heads_first(t) for t in global_qkv)
                qkv_g = (gq, gk, gv)
            out, probs = attention(q, k, v, context, scale=scale, dropout=p, prefix=prefix, global_qkv=qkv_g)
            return out.transpose(1, 2).flatten(2), probs
        if cache is not None:
            raise InputError("a key/value cache needs the padded layout")
        packed_g: GlobalQKV | None = global_qkv if not isinstance(global_qkv, tuple) else None
        if isinstance(global_qkv, tuple):
            gq, gk, gv = (t.view(-1, heads, head_dim) for t in global_qkv)
            packed_g = (gq, gk, gv)
        q, k, v = (t.view(-1, heads, head_dim) for t in (q, k, v))
        if rotary is not None:  # [T, d] tables, the same for every head
            cos, sin = rotary[0][:, None], rotary[1][:, None]
            q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        out, probs_by_group = packed_attention(q, k, v, context, scale=scale, dropout=p, prefix=prefix,
                                               global_qkv=packed_g)
        return out.reshape(-1, heads * head_dim), (
            scatter_attention(probs_by_group, layout, heads, x) if need_weights else None)

    def cross_attention(self, h: Tensor, context: AttentionContext) -> Tensor:
        """Queries from h (packed or padded) over the context's memory's keys and values: padded [B, M, H], or packed
        [T_mem, H] with its `memory_layout`. Every projection runs on packed tokens where it can (the real ones
        alone); attention itself runs once over the padded rows, the memory's padding masked."""
        layout, memory, cache, memory_layout = context.layout, context.memory, context.cache, context.memory_layout
        assert memory is not None
        p = self.attention_dropout if self.training else 0.0
        q = self.cross_query(h)
        if layout is not None:
            q = layout.unpack(q)
        if cache is not None and cache.memory is not None:
            k, v = cache.memory
        elif memory_layout is not None:
            if cache is not None:
                raise InputError("a packed memory takes no key/value cache")
            k, v = (self.heads_first(t) for t in memory_layout.unpack(self.cross_key_value(memory)).chunk(2, -1))
        else:
            k, v = self.heads_first(self.cross_key(memory)), self.heads_first(self.cross_value(memory))
            if cache is not None:
                cache.memory = (k, v)
        out, _ = attention(self.heads_first(q), k, v, context.memory_context(), scale=self.spec.attention_scale,
                           dropout=p)
        out = out.transpose(1, 2).flatten(2)
        return layout.pack(out) if layout is not None else out

    def cross_key_value(self, memory: Tensor) -> Tensor:
        """The memory's cross-attention keys and values side by side, [..., 2 x heads x d]: one product on the
        concatenated weights when both projections are plain nn.Linear with alike biases (as `project`)."""
        k, v = self.cross_key, self.cross_value
        if plain_linear(k) and plain_linear(v) and (k.bias is None) == (v.bias is None):
            bias = torch.cat([k.bias, v.bias]) if k.bias is not None and v.bias is not None else None
            return F.linear(memory, torch.cat([k.weight, v.weight]), bias)
        return torch.cat([k(memory), v(memory)], -1)

    def attention_at(self, x: Tensor, layout: Layout, queries: Tensor, head_scale: Tensor | None = None) -> Tensor:
        """Attention output [len(queries), heads x head_dim] at the packed tokens `queries` (sorted), bidirectional:
        keys and values come from every token, the query projection runs on the selected rows alone."""
        heads, head_dim = self.num_heads, self.head_dim
        hidden = heads * head_dim
        p = self.attention_dropout if self.training else 0.0
        q = self.query(x[queries])
        if heads == 0:
            return q
        k, v = (self.heads_first(layout.unpack(t)) for t in (self.key(x), self.value(x)))
        # Each sequence's selected queries side by side: [B, Q_max, H], slots past a row's count are zeros. A
        # sequence's tokens are contiguous in packed order, so its queries form one run of `queries`.
        row = layout.flat_index[queries] // layout.seq_len
        position = torch.arange(len(queries), device=x.device)
        run_start = torch.ones_like(row, dtype=torch.bool)
        run_start[1:] = row[1:] != row[:-1]
        slot = position - torch.cummax(torch.where(run_start, position, 0), 0).values
        # The widest row's query count; on a GPU the longest sequence bounds it without a host sync.
        width = (int(slot.max()) + 1 if x.device.type == "cpu" else layout.max_seqlen) if len(queries) else 0
        q_padded = q.new_zeros(layout.batch_size, width, hidden)
        q_padded[row, slot] = q
        mask = layout.unpack(torch.ones(len(x), dtype=torch.bool, device=x.device))[:, None, None, :]
        o, _ = attend(self.heads_first(q_padded), k, v, mask, p, False, self.prefix_states(), head_scale,
                      self.spec.attention_scale)
        return o.transpose(1, 2).flatten(2)[row, slot]


COMPILED_METHODS = ("project", "attention_residual", "feed_forward_residual")


def compile_blocks(blocks: Sequence[nn.Module], **options: Any) -> None:
    """torch.compile each block's token-wise work (the q/k/v projection, the output projection with its residual and
    norm, the feed-forward with its) with the token count dynamic: one graph serves every batch, whatever its mix of
    sequence lengths. Attention stays eager: its kernels are fused already, and its per-sequence structure (groups,
    cumulative lengths) would otherwise recompile for every new mix of lengths."""
    for block in blocks:
        for name in COMPILED_METHODS:
            setattr(block, name, torch.compile(getattr(block, name), dynamic=True, **options))


@torch.no_grad()
def init_parameters(model: nn.Module, std: float, generator: torch.Generator | None = None) -> None:
    """BERT's initialisation, which every model here uses but T5 (a family's own, `CheckpointFamily.init`:
    bertology.model.families.t5.init_weights): N(0, std) linear weights and embeddings (the padding row
    of an embedding that has one zeroed), zero linear biases, unit norms with zero biases. Modules are visited in
    registration order, so the same seed gives the same weights however the model was built (on the meta device or
    not). Parameters of other kinds (a head's vocabulary bias) are their owner's to set."""
    for module in model.modules():
        if isinstance(module, (nn.Linear, nn.Embedding)):
            module.weight.normal_(0.0, std, generator=generator)
        if isinstance(module, nn.Linear) and module.bias is not None:
            module.bias.zero_()
        if isinstance(module, nn.Embedding) and module.padding_idx is not None:
            module.weight[module.padding_idx].zero_()
        if isinstance(module, (nn.LayerNorm, nn.RMSNorm)):
            if module.weight is not None:
                module.weight.fill_(1.0)
            if getattr(module, "bias", None) is not None:
                module.bias.zero_()
