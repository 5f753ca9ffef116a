"""Attention: scaled dot-product attention under every family's mask policy, padded or packed.

    a = softmax(Q K^T * scale + bias + mask) V, per head

What a query may see is one `MaskPolicy` (bidirectional, causal, a sliding window) combined with per-batch facts:
key padding, document ids of a packed stream, global tokens (Longformer), a prefix LM's prefix (its tokens see each
other in both directions under a causal policy) and an arbitrary boolean mask (XLNet's permutations). The additive
score bias comes from the context's score provider (T5's relative positions; see `ScoreProvider`), asked for each
group of queries and keys attended in one call; keys and values may be longer than the queries (a key/value cache,
memory, cross-attention), the queries then sitting at the end (`query_offset`). All of these facts arrive as one
`AttentionContext` (bertology.model.context), the Stack's for the layer call; what the block owns (its scale,
dropout rate, prefix-tuning keys, global projections) comes beside it.

`attention` works on padded [B, heads, L, d] tensors. `packed_attention` works on the packed [T, heads, d] stream of
a `Layout`: on CPU one call per group of equal-length sequences (the fastest there; with a score bias, a few calls
over buckets of nearby lengths padded alike, whose padding costs less than the calls it saves), on CUDA one
variable-length kernel for the whole stream when the policy allows it (`torch.nn.attention.varlen`; with attention
dropout the flash kernel under it, called directly: SDPA on a jagged nested tensor reaches the same kernel through
many small Python-dispatched operations, which made a training step CPU-bound on a GPU).

A window narrower than the sequence runs blocked (`windowed_attention`): queries in blocks of the window's width,
each attending to the keys its block can reach plus the global tokens, the global tokens' own rows attending to
every key; time and memory grow linearly with the length, and no [L, L] tensor is made. Longformer's global rows
may use projections of their own (`global_qkv`)."""

from __future__ import annotations

import functools
import inspect
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from bertology.model.context import (
    BIDIRECTIONAL,
    CAUSAL,
    AttentionContext,
    MaskPolicy,
    ScoreProvider,
    sliding_window,
)
from bertology.model.dropout import fast_dropout
from bertology.model.packing import Bucket, Layout

# the policies and the context are context.py's, re-exported: attention's callers import them from here too
__all__ = [
    "BIDIRECTIONAL",
    "BUCKET_OVERHEAD",
    "CAUSAL",
    "EVERYTHING",
    "AttentionContext",
    "GlobalProjections",
    "GlobalQKV",
    "MaskPolicy",
    "ScoreProvider",
    "additive_mask",
    "attend",
    "attention",
    "bucketed_attention",
    "choose_kernel",
    "combined_mask",
    "dense_attention",
    "flagged_positions",
    "flash_available",
    "gather_rows",
    "global_rows",
    "packed_attention",
    "padded_attention",
    "scatter_attention",
    "scatter_rows",
    "sliding_window",
    "varlen_available",
    "varlen_takes_windows",
    "windowed_attention",
]

# The context of attention with nothing restricted: every key real, bidirectional, no bias.
EVERYTHING = AttentionContext()


def combined_mask(policy: MaskPolicy, num_queries: int, num_keys: int, device: torch.device, *,
                  query_offset: int = 0, key_mask: Tensor | None = None, documents: Tensor | None = None,
                  global_tokens: Tensor | None = None, mask: Tensor | None = None,
                  lm_prefix: Tensor | None = None) -> Tensor | None:
    """The boolean [B or 1, 1, Lq, Lk] mask (True = may attend) that the policy and the per-batch facts give, or None
    when every query sees every key. `key_mask` [B, Lk] (real keys), `documents` [B, Lk] (document id of each key;
    the queries' are the last Lq), `global_tokens` [B, Lk] (tokens that see and are seen by all, before the key
    mask applies), `mask` broadcastable to [B, heads, Lq, Lk], `lm_prefix` [B, Lk] (a prefix LM's prefix: a prefix
    query also sees every prefix key, whatever the policy; documents and key padding still apply)."""
    allowed = policy.allowed(num_queries, num_keys, query_offset, device)
    allowed = allowed[None, None] if allowed is not None else None
    if lm_prefix is not None and allowed is not None:
        p = lm_prefix.bool()
        allowed = allowed | (p[:, None, query_offset:, None] & p[:, None, None, :])

    def both(extra: Tensor) -> None:
        nonlocal allowed
        allowed = extra if allowed is None else allowed & extra

    if documents is not None:
        both(documents[:, None, query_offset:, None] == documents[:, None, None, :])
    if global_tokens is not None and allowed is not None:
        g = global_tokens.bool()
        allowed = allowed | g[:, None, query_offset:, None] | g[:, None, None, :]
    if key_mask is not None:
        both(key_mask.bool()[:, None, None, :])
    if mask is not None:
        both(mask.bool())
    return allowed


def attention(q: Tensor, k: Tensor, v: Tensor, context: AttentionContext | None = None, *,
              scale: float | None = None, dropout: float = 0.0, prefix: tuple[Tensor, Tensor] | None = None,
              global_qkv: GlobalQKV | None = None, query_offset: int | None = None) -> tuple[Tensor, Tensor | None]:
    """Attention of q [B, heads, Lq, d] over k, v [B, heads, Lk, d] under `context` (padded: its policy, key mask,
    documents, global tokens, boolean mask, prefix LM's prefix, score provider, head scale and need_weights; default
    none of them); returns (output [B, heads, Lq, d], the probabilities [B, heads, Lq, Lk] when the context wants
    them). `query_offset` defaults to Lk - Lq (queries are the last positions, as with a key/value cache). See
    `combined_mask` for the masks; the provider's bias is added to the scores.

    The block's own: `scale` (None: 1 / sqrt(d)), `dropout`, `prefix` (prefix tuning's keys and values, see
    `attend`), `global_qkv` (with global tokens, queries and keys of one length): the global tokens' rows attend
    with these queries, keys and values instead (Longformer's separate projections), to every real key. A window
    narrower than the sequence runs blocked (`windowed_attention`), linear in the length, where nothing it lacks is
    asked for (probabilities, documents, a boolean mask, a bias, a prefix, a key/value cache, a prefix LM's
    prefix)."""
    c = context if context is not None else EVERYTHING
    offset = k.shape[-2] - q.shape[-2] if query_offset is None else query_offset
    return padded_attention(q, k, v, c.policy, c.key_mask, c.documents, c.global_tokens, c.mask, c.bias(q, k, offset),
                            scale, dropout, c.need_weights, prefix, c.head_scale, offset, global_qkv, c.lm_prefix)


def padded_attention(q: Tensor, k: Tensor, v: Tensor, policy: MaskPolicy, key_mask: Tensor | None,
                     documents: Tensor | None, global_tokens: Tensor | None, mask: Tensor | None,
                     bias: Tensor | None, scale: float | None, dropout: float, need_weights: bool,
                     prefix: tuple[Tensor, Tensor] | None, head_scale: Tensor | None, offset: int,
                     global_qkv: GlobalQKV | None, lm_prefix: Tensor | None) -> tuple[Tensor, Tensor | None]:
    """`attention` with the context's facts spelled out and the bias computed (what the packed kernels call per
    group)."""
    num_queries, num_keys = q.shape[-2], k.shape[-2]
    left, right = policy.bounds
    if (0 <= left and 0 <= right and left + right + 1 < num_keys and num_queries == num_keys and offset == 0
            and documents is None and mask is None and bias is None and prefix is None and not need_weights
            and lm_prefix is None):
        out = windowed_attention(q, k, v, left, right, key_mask=key_mask, global_tokens=global_tokens,
                                 global_qkv=global_qkv, scale=scale, dropout=dropout)
        return (out * head_scale.to(out.dtype)[:, None, None] if head_scale is not None else out), None
    out, probs = dense_attention(q, k, v, policy, key_mask, documents, global_tokens, mask, bias, scale, dropout,
                                 need_weights, prefix, head_scale, offset, lm_prefix)
    if global_qkv is not None and global_tokens is not None:
        if num_queries != num_keys:
            raise ValueError("global_qkv needs as many queries as keys")
        out, probs = global_rows(out, probs, global_qkv, global_tokens.bool(), key_mask, scale, dropout,
                                 head_scale)
    return out, probs


def dense_attention(q: Tensor, k: Tensor, v: Tensor, policy: MaskPolicy, key_mask: Tensor | None,
                    documents: Tensor | None, global_tokens: Tensor | None, mask: Tensor | None, bias: Tensor | None,
                    scale: float | None, dropout: float, need_weights: bool, prefix: tuple[Tensor, Tensor] | None,
                    head_scale: Tensor | None, offset: int,
                    lm_prefix: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
    """`attention` with the whole [Lq, Lk] mask at once."""
    num_queries, num_keys = q.shape[-2], k.shape[-2]
    allowed = combined_mask(policy, num_queries, num_keys, q.device, query_offset=offset, key_mask=key_mask,
                            documents=documents, global_tokens=global_tokens, mask=mask, lm_prefix=lm_prefix)
    if bias is not None or (allowed is not None and (policy.restricts or documents is not None or mask is not None)):
        # An additive mask with the dtype's lowest value instead of -inf: a query that may see nothing (padding
        # under a causal or document mask) gets a uniform row instead of NaN, which would leak into the keys'
        # gradients through 0 * NaN.
        additive = bias.to(q.dtype) if bias is not None else None
        if allowed is not None:
            mask_values = additive_mask(allowed, q.dtype)
            additive = mask_values if additive is None else additive + mask_values
        return attend(q, k, v, additive, dropout, need_weights, prefix, head_scale, scale)
    return attend(q, k, v, allowed, dropout, need_weights, prefix, head_scale, scale)


def additive_mask(allowed: Tensor, dtype: torch.dtype) -> Tensor:
    """A boolean mask as scores to add: 0 where allowed, the dtype's lowest value elsewhere (a row that may see
    nothing then gets a uniform mix instead of NaN)."""
    return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill(~allowed, torch.finfo(dtype).min)


def flagged_positions(flags: Tensor) -> tuple[Tensor, Tensor]:
    """The flagged positions of each row of `flags` [B, L], in order: (indices [B, G], valid [B, G]), G the most
    flags in a row; slots past a row's count hold index 0 and valid False."""
    counts = flags.sum(1)
    width = int(counts.max()) if flags.numel() else 0
    order = torch.argsort(flags.to(torch.uint8), dim=1, descending=True, stable=True)[:, :width]
    valid = torch.arange(width, device=flags.device)[None, :] < counts[:, None]
    return order.masked_fill(~valid, 0), valid


def gather_rows(t: Tensor, index: Tensor) -> Tensor:
    """Rows `index` [B, G] of t [B, heads, L, d] -> [B, heads, G, d]."""
    return t.gather(2, index[:, None, :, None].expand(-1, t.shape[1], -1, t.shape[-1]))


def scatter_rows(t: Tensor, index: Tensor, valid: Tensor, rows: Tensor) -> Tensor:
    """t [B, heads, L, n] with its rows `index` [B, G] (where `valid`) replaced by `rows` [B, heads, G, n] (a copy).
    The slots that are not valid write to one row past the end, dropped after: no host read (boolean indexing
    would wait for the device to count the valid slots)."""
    batch, heads, length, width = t.shape
    out = torch.cat([t, t.new_zeros(batch, heads, 1, width)], 2)
    target = torch.where(valid, index, length)[:, None, :, None].expand(-1, heads, -1, width)
    return out.scatter(2, target, rows.to(t.dtype))[:, :, :length]


@dataclass(frozen=True)
class GlobalProjections:
    """The global rows' queries, keys and values as projections of the hidden states `x` [B, L, H] (weights
    [heads x d, H], optional biases), applied only where needed. With G global tokens a row, projecting every
    token's keys and values costs O(L H^2); when heads * G < H it is cheaper to fold the key projection into the
    queries and the value projection after the probabilities, O(heads G L H):

        q_g . (W_k x + b_k) = (W_k^T q_g) . x + q_g . b_k        P (x W_v^T + b_v) = (P x) W_v^T + (P 1) b_v"""

    x: Tensor  # [B, L, H]; [T, H] for a packed stream, which `group` cuts into its groups
    heads: int
    weights: tuple[Tensor, Tensor, Tensor]
    biases: tuple[Tensor | None, Tensor | None, Tensor | None]

    def group(self, rows: slice, count: int, length: int) -> GlobalProjections:
        """These projections over the packed tokens `rows`, [count, length, H] (one group of a packed stream)."""
        return GlobalProjections(self.x[rows].view(count, length, -1), self.heads, self.weights, self.biases)

    def attend(self, index: Tensor, key_mask: Tensor | None, scale: float | None, dropout: float,
               need_weights: bool, head_scale: Tensor | None) -> tuple[Tensor, Tensor | None]:
        """Attention of the rows `index` [B, G] over every real key: ([B, heads, G, d], probabilities)."""
        x, heads = self.x, self.heads
        batch, length, hidden = x.shape
        (w_q, w_k, w_v), (b_q, b_k, b_v) = self.weights, self.biases
        dim = w_q.shape[0] // heads
        count = index.shape[1]
        rows = x.gather(1, index[:, :, None].expand(-1, -1, hidden))
        q = F.linear(rows, w_q, b_q).view(batch, count, heads, dim).transpose(1, 2)  # [B, heads, G, d]
        mask = additive_mask(key_mask.bool()[:, None, None, :], x.dtype) if key_mask is not None else None
        if heads * count >= hidden:  # few tokens are global in name only: project every key and value
            k, v = (F.linear(x, w, b).view(batch, length, heads, dim).transpose(1, 2)
                    for w, b in ((w_k, b_k), (w_v, b_v)))
            return attend(q, k, v, mask, dropout, need_weights, head_scale=head_scale, scale=scale)
        folded = torch.einsum("bhgd,hdk->bhgk", q, w_k.view(heads, dim, hidden))
        scores = (folded.flatten(1, 2) @ x.transpose(1, 2)).view(batch, heads, count, length)
        if b_k is not None:
            scores = scores + (q * b_k.view(heads, dim)[None, :, None, :]).sum(-1, keepdim=True)
        scores = scores * (scale if scale is not None else dim ** -0.5)
        probs = (scores + mask if mask is not None else scores).softmax(-1)
        used = fast_dropout(probs, dropout, dropout > 0)
        mixed = (used.flatten(1, 2) @ x).view(batch, heads, count, hidden)
        out = torch.einsum("bhgk,hdk->bhgd", mixed, w_v.view(heads, dim, hidden))
        if b_v is not None:
            out = out + used.sum(-1, keepdim=True) * b_v.view(heads, dim)[None, :, None, :]
        if head_scale is not None:
            factor = head_scale.to(out.dtype)[:, None, None]
            return out * factor, (probs * factor if need_weights else None)
        return out, (probs if need_weights else None)


# The global rows' queries, keys and values: [B, heads, L, d] tensors, or projections applied where needed.
GlobalQKV = tuple[Tensor, Tensor, Tensor] | GlobalProjections


def global_rows(out: Tensor, probs: Tensor | None, source: GlobalQKV, global_tokens: Tensor,
                key_mask: Tensor | None, scale: float | None, dropout: float,
                head_scale: Tensor | None = None,
                positions: tuple[Tensor, Tensor] | None = None) -> tuple[Tensor, Tensor | None]:
    """`out` (and `probs`) with the rows of the global tokens [B, L] replaced by their attention with `source`'s
    queries, keys and values over every real key (`key_mask` [B, L]): O(G * L) for G global tokens a row.
    `positions`: `flagged_positions(global_tokens)` when the caller has them already."""
    index, valid = positions if positions is not None else flagged_positions(global_tokens)
    if index.shape[1] == 0:
        return out, probs
    if isinstance(source, GlobalProjections):
        rows, row_probs = source.attend(index, key_mask, scale, dropout, probs is not None, head_scale)
    else:
        q, k, v = source
        real = key_mask.bool()[:, None, None, :] if key_mask is not None else None
        rows, row_probs = attend(gather_rows(q, index), k, v,
                                 additive_mask(real, q.dtype) if real is not None else None, dropout,
                                 probs is not None, head_scale=head_scale, scale=scale)
    out = scatter_rows(out, index, valid, rows)
    if probs is not None and row_probs is not None:
        probs = scatter_rows(probs, index, valid, row_probs)
    return out, probs


def windowed_attention(q: Tensor, k: Tensor, v: Tensor, left: int, right: int, *, key_mask: Tensor | None = None,
                       global_tokens: Tensor | None = None, global_qkv: GlobalQKV | None = None,
                       scale: float | None = None, dropout: float = 0.0, block: int | None = None) -> Tensor:
    """Banded + global attention of q, k, v [B, heads, L, d] in O(L * (left + right + G)) time and memory: query i
    sees the real keys (`key_mask` [B, L]) i - left .. i + right and every global token (`global_tokens` [B, L]);
    a global token's query sees every real key, with `global_qkv`'s queries, keys and values when given (else q, k,
    v). The same as `attention` under a context of policy `MaskPolicy(window=(left, right))`, that key mask and
    those global tokens at every row that sees a key; no [L, L] tensor is made.

    Queries go in blocks of `block` (default: the wider side of the window); block b's queries b*block ..
    b*block + block - 1 reach the keys b*block - left .. b*block + block - 1 + right, a strided view of the padded
    keys, to which the global keys are appended (G of them: the most global tokens in a row)."""
    batch, heads, length, dim = q.shape
    block = block or max(left, right, 1)
    count = -(-length // block)
    span = block + left + right
    tail = count * block - length
    real = key_mask.bool() if key_mask is not None else torch.ones(batch, length, dtype=torch.bool, device=q.device)
    flags = global_tokens.bool() if global_tokens is not None else None
    local = real if flags is None else real & ~flags  # a global key is attended once, among the global keys

    # Token-major [B, L, heads, d] (the projections' own layout), so that blocks are one batch dimension of a 4-D
    # call, the shape SDPA's fused CPU kernel takes.
    def windows(t: Tensor) -> Tensor:  # [B, heads, L, d] -> [B, count, heads, span, d], a view
        return F.pad(t.transpose(1, 2), (0, 0, 0, 0, left, tail + right)).unfold(1, span, block).transpose(-1, -2)

    queries = q.transpose(1, 2) if not tail else F.pad(q.transpose(1, 2), (0, 0, 0, 0, 0, tail))
    queries = queries.view(batch, count, block, heads, dim).transpose(2, 3)
    keys, values = windows(k), windows(v)
    offsets = torch.arange(span, device=q.device)[None, :] - torch.arange(block, device=q.device)[:, None]
    band = (offsets >= 0) & (offsets <= left + right)  # key - query = offset - left, in [-left, right]
    allowed = band & F.pad(local, (left, tail + right), value=False).unfold(1, span, block)[:, :, None, :]
    index, valid = flagged_positions(flags & real) if flags is not None else (None, None)
    if index is not None and index.shape[1]:
        keys = torch.cat([keys, gather_rows(k, index)[:, None].expand(-1, count, -1, -1, -1)], -2)
        values = torch.cat([values, gather_rows(v, index)[:, None].expand(-1, count, -1, -1, -1)], -2)
        allowed = torch.cat([allowed, valid[:, None, None, :].expand(-1, count, block, -1)], -1)
    out, _ = attend(*(t.reshape(batch * count, heads, -1, dim) for t in (queries, keys, values)),
                    additive_mask(allowed, q.dtype).view(batch * count, 1, block, -1), dropout, False, scale=scale)
    out = out.view(batch, count, heads, block, dim).transpose(2, 3).reshape(batch, count * block, heads, dim)
    out = out[:, :length].transpose(1, 2)
    if flags is None:
        return out
    # without padding the global keys above are the global queries too: one host read for both
    return global_rows(out, None, global_qkv if global_qkv is not None else (q, k, v), flags, key_mask, scale,
                       dropout, positions=(index, valid) if key_mask is None else None)[0]


def attend(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, dropout: float, need_weights: bool,
           prefix: tuple[Tensor, Tensor] | None = None, head_scale: Tensor | None = None,
           scale: float | None = None) -> tuple[Tensor, Tensor | None]:
    """Scaled dot-product attention on [..., heads, len, head_dim]. `mask`: boolean (True where a key may be
    attended) or additive (added to the scores).

    `prefix` (keys, values), each [heads, P, head_dim]: P more positions that every query attends to, in front of
    its own keys (prefix tuning). The probabilities returned cover the sequence's own keys only, so with a prefix a
    row sums to 1 minus the share that went to the prefix positions.

    `head_scale` [heads]: each head's output (and its returned probabilities) multiplied by its entry, as
    transformers' `head_mask` multiplies the probabilities (Michel et al. 2019's mask variables)."""
    if head_scale is not None:
        out, probs = attend(q, k, v, mask, dropout, need_weights, prefix, None, scale)
        factor = head_scale.to(out.dtype)[:, None, None]
        return out * factor, (probs * factor if probs is not None else None)
    num_prefix = prefix[0].shape[-2] if prefix is not None else 0
    if num_prefix:
        assert prefix is not None
        k = torch.cat([prefix[0].expand(*k.shape[:-2], -1, -1), k], -2)
        v = torch.cat([prefix[1].expand(*v.shape[:-2], -1, -1), v], -2)
        if mask is not None:
            seen = mask.new_ones(()) if mask.dtype == torch.bool else mask.new_zeros(())
            mask = torch.cat([seen.expand(*mask.shape[:-1], num_prefix), mask], -1)
    # With dropout on CPU, SDPA falls back to its math kernel with a Bernoulli mask: the explicit product with the
    # byte-mask dropout is faster (benchmarks/RESULTS.md, "Training").
    if not need_weights and not (dropout > 0 and q.device.type == "cpu"):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout, scale=scale), None
    scale = scale if scale is not None else 1 / math.sqrt(q.shape[-1])
    # The scores are the product's own fresh tensor: scaled and masked in place (the product's backward reads q and
    # k, not its output), with the same values as out of place and one [.., Lq, Lk] tensor fewer to allocate (on
    # CPU a fresh one of a few MB costs more in first-touch page faults than the multiplication itself).
    scores = q @ k.transpose(-1, -2)
    if scale != 1.0:  # T5 folds it into its weights
        scores = scores.mul_(scale)
    if mask is not None:
        if torch.broadcast_shapes(scores.shape, mask.shape) != scores.shape or (
                mask.dtype != torch.bool and mask.dtype != scores.dtype):
            scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask
        else:
            scores = scores.masked_fill_(~mask, float("-inf")) if mask.dtype == torch.bool else scores.add_(mask)
    probs = scores.softmax(-1)
    out = fast_dropout(probs, dropout, dropout > 0) @ v
    return out, (probs[..., num_prefix:] if need_weights else None)


def packed_attention(q: Tensor, k: Tensor, v: Tensor, context: AttentionContext, *, scale: float | None = None,
                     dropout: float = 0.0, prefix: tuple[Tensor, Tensor] | None = None,
                     global_qkv: GlobalQKV | None = None, kernel: str = "auto"
                     ) -> tuple[Tensor, list[Tensor | None]]:
    """Attention within each sequence of a packed stream: q, k, v [T, heads, d] -> ([T, heads, d], per-group
    probabilities [count, heads, length, length] when the context wants them, for `scatter_attention`). From the
    context: its `layout` (required), policy, score provider, head scale, need_weights, `global_tokens` [T] (with
    the block's `global_qkv`, [T, heads, d] each: Longformer's global tokens and their projections, see
    `attention`) and `lm_prefix` [T] bool (a prefix LM's prefix tokens, see `combined_mask`), which the
    variable-length kernels cannot express: the group loop then runs, each group with its boolean mask. The score
    provider is asked once per group (or bucket, or the padded rows) with that group's queries and keys.

    `kernel`: "groups" (one call per group of equal-length sequences), "varlen" (one variable-length kernel call,
    CUDA), "flash" (the variable-length flash kernel with dropout, CUDA, half precision), "nested" (SDPA on a jagged
    nested tensor: one call, with dropout, any precision), "padded" (one dense call over the padded rows with the
    bias in the mask: T5's relative positions on CUDA, where the variable-length kernels take no bias), "buckets"
    (the groups merged into a few buckets of nearby lengths, one padded call each: T5's relative positions on CPU)
    or "auto": one of those where nothing the kernels lack is asked for (probabilities, a prefix, a head mask), else
    groups."""
    layout, policy, need_weights, head_scale = context.layout, context.policy, context.need_weights, context.head_scale
    global_tokens, lm_prefix, scored = context.global_tokens, context.lm_prefix, context.scores is not None
    if layout is None:
        raise ValueError("packed attention needs the context's layout")
    if kernel == "auto":
        others = prefix is not None or head_scale is not None or global_tokens is not None or lm_prefix is not None
        kernel = choose_kernel(q.device, policy, dropout, need_weights, scored or others,
                               q.dtype, scale, q.shape[-1], bias_only=scored and not others and layout.per_row)
    if kernel == "varlen":
        from torch.nn.attention.varlen import varlen_attn

        lengths = (layout.cu_seqlens, layout.cu_seqlens, layout.max_seqlen, layout.max_seqlen)
        if varlen_takes_windows():
            return varlen_attn(q, k, v, *lengths, scale=scale, window_size=policy.bounds), []
        if policy.window is not None or scale is not None:
            raise ValueError("this torch's varlen_attn takes no window or scale: use the groups kernel")
        return varlen_attn(q, k, v, *lengths, is_causal=policy.causal), []
    if kernel == "flash":
        left, right = policy.bounds
        out = torch.ops.aten._flash_attention_forward(
            q, k, v, layout.cu_seqlens, layout.cu_seqlens, layout.max_seqlen, layout.max_seqlen, dropout, False,
            False, scale=scale, window_size_left=left, window_size_right=right)[0]
        return out, []
    if kernel == "padded":  # one call over the padded rows, the policy, padding and bias as one additive mask
        if not scored or not layout.per_row:
            raise ValueError("the padded kernel is for a score bias on a layout of one sequence a row")
        qp, kp, vp = (layout.unpack(t).transpose(1, 2) for t in (q, k, v))  # [B, heads, L, d]
        real = layout.unpack(torch.ones(len(q), dtype=torch.bool, device=q.device))
        out, _ = padded_attention(qp, kp, vp, policy, real, None, None, None, context.bias(qp, kp, 0), scale,
                                  dropout, False, None, None, 0, None, None)
        return layout.pack(out.transpose(1, 2)), []
    if kernel == "buckets":  # the same over a few buckets of rows of nearby lengths (built on the host: CPU)
        if not scored or not layout.per_row:
            raise ValueError("the buckets kernel is for a score bias on a layout of one sequence a row")
        return bucketed_attention(q, k, v, layout.buckets(BUCKET_OVERHEAD / q.shape[1]), context, scale,
                                  dropout), []
    if kernel == "nested":
        if policy.restricts:
            raise ValueError("the nested-tensor kernel attends bidirectionally only")
        offsets = layout.cu_seqlens.to(torch.int64)
        nq, nk, nv = (torch.nested.nested_tensor_from_jagged(t, offsets, max_seqlen=layout.max_seqlen).transpose(1, 2)
                      for t in (q, k, v))
        out = F.scaled_dot_product_attention(nq, nk, nv, dropout_p=dropout, scale=scale)
        return out.transpose(1, 2).values(), []
    if kernel != "groups":
        raise ValueError(f"unknown attention kernel {kernel!r}; expected auto, groups, varlen, flash, nested, padded "
                         "or buckets")
    outs, probs_by_group = [], []
    heads, head_dim = q.shape[1], q.shape[2]
    if not layout.groups:  # no tokens
        return q[:0], probs_by_group
    # One split of each stream, its backward one concatenation; a slice a group would give each slice's backward a
    # zero gradient of the whole stream, summed over the groups (about a tenth of a retriever's training step on CPU:
    # benchmarks/RESULTS.md, "Retrieval speed").
    sizes = [count * length for _, count, length in layout.groups]
    for (start, count, length), *qkv in zip(layout.groups, q.split(sizes), k.split(sizes), v.split(sizes)):
        rows = slice(start, start + count * length)  # `count` sequences of `length` tokens, contiguous in the stream
        q_g, k_g, v_g = (t.view(count, length, heads, head_dim).transpose(1, 2) for t in qkv)
        g_g = global_tokens[rows].view(count, length) if global_tokens is not None else None
        p_g = lm_prefix[rows].view(count, length) if lm_prefix is not None else None
        qkv_g: GlobalQKV | None = None
        if isinstance(global_qkv, GlobalProjections):
            qkv_g = global_qkv.group(rows, count, length)
        elif global_qkv is not None:
            gq, gk, gv = (t[rows].view(count, length, heads, head_dim).transpose(1, 2) for t in global_qkv)
            qkv_g = (gq, gk, gv)
        o, probs = padded_attention(q_g, k_g, v_g, policy, None, None, g_g, None,
                                    context.bias(q_g, k_g, 0) if scored else None, scale, dropout, need_weights,
                                    prefix, head_scale, 0, qkv_g, p_g)
        outs.append(o.transpose(1, 2).reshape(count * length, heads, head_dim))
        probs_by_group.append(probs)
    out = outs[0] if len(outs) == 1 else torch.cat(outs)  # one group: no copy
    return out, probs_by_group


# What one more attention call costs on CPU, in score entries x heads: about 0.2 ms forward and backward (with
# dropout) against about 25 ns an entry and head at one thread (benchmarks/RESULTS.md, "T5 on CPU: attention in
# buckets").
BUCKET_OVERHEAD = 8192


def bucketed_attention(q: Tensor, k: Tensor, v: Tensor, buckets: list[Bucket], context: AttentionContext,
                       scale: float | None, dropout: float) -> Tensor:
    """Attention of a packed stream's sequences ([T, heads, d] each) by buckets of rows (`Layout.buckets`): each
    bucket's rows padded to its width and attended in one dense call under the context's policy, the padding keys
    masked, the provider's bias for the bucket's queries and keys added."""
    heads, dim = q.shape[1], q.shape[2]
    # One split of each stream (its backward one concatenation), not a slice a bucket (each slice's backward a zero
    # gradient of the whole stream, summed).
    sizes = [b.stop - b.start for b in buckets]
    outs = []
    for b, *tokens in zip(buckets, q.split(sizes), k.split(sizes), v.split(sizes)):
        def rows(t: Tensor, b: Bucket = b) -> Tensor:  # the bucket's tokens as [count, heads, width, d]
            if b.index is not None:
                t = t.new_zeros(b.count * b.width, heads, dim).index_copy(0, b.index, t)
            return t.view(b.count, b.width, heads, dim).transpose(1, 2)

        qb, kb, vb = (rows(t) for t in tokens)
        out, _ = padded_attention(qb, kb, vb, context.policy, b.real, None, None, None, context.bias(qb, kb, 0),
                                  scale, dropout, False, None, None, 0, None, None)
        out = out.transpose(1, 2).reshape(b.count * b.width, heads, dim)
        outs.append(out if b.index is None else out[b.index])
    return outs[0] if len(outs) == 1 else torch.cat(outs or [q[:0]])


def choose_kernel(device: torch.device, policy: MaskPolicy, dropout: float, need_weights: bool,
                  extras: bool, dtype: torch.dtype = torch.bfloat16, scale: float | None = None,
                  head_dim: int = 64, bias_only: bool = False) -> str:
    """The packed kernel "auto" picks (see packed_attention). The variable-length kernels are flash attention: half
    precision, head sizes a multiple of 8 up to 256, a GPU of compute capability 8 or more (otherwise the
    nested-tensor kernel or the group loop). `bias_only`: the one extra is a score bias, on a layout of one sequence
    a row: on CUDA the padded kernel, whose one call beats a launch per group of lengths; elsewhere the buckets,
    since on CPU padding every row to the longest costs more than the calls it saves (T5's paragraphs: about 30
    lengths a batch from 1 to 115 tokens), while a bucket a length pays each call's fixed cost (about 0.2 ms forward
    and backward, `BUCKET_OVERHEAD`) some thirty times a layer. The choice depends on the device and the layout
    only, so "auto" is deterministic."""
    if device.type != "cuda" or need_weights:
        return "buckets" if bias_only and not need_weights else "groups"
    if extras:
        return "padded" if bias_only else "groups"
    if dtype in (torch.float16, torch.bfloat16) and head_dim % 8 == 0 and head_dim <= 256:
        if dropout == 0 and varlen_available() and (
                varlen_takes_windows() or (policy.window is None and scale is None)):
            return "varlen"
        if flash_available(device):
            return "flash"
    return "nested" if not policy.restricts else "groups"


@functools.cache
def flash_available(device: torch.device) -> bool:
    """Whether this torch has the flash kernel and `device` runs it (compute capability 8.0 on)."""
    return (torch.backends.cuda.is_flash_attention_available()
            and torch.cuda.get_device_capability(device)[0] >= 8)


@functools.cache
def varlen_available() -> bool:
    try:
        from torch.nn.attention.varlen import varlen_attn  # noqa: F401
    except ImportError:
        return False
    return True


@functools.cache
def varlen_takes_windows() -> bool:
    """Whether this torch's varlen_attn takes `window_size` and `scale` (2.10 on); the first release took only
    `is_causal`."""
    from torch.nn.attention.varlen import varlen_attn

    return "window_size" in inspect.signature(varlen_attn).parameters


def scatter_attention(probs_by_group: list[Tensor | None], layout: Layout, heads: int, like: Tensor) -> Tensor:
    """Per-group probabilities [count, heads, length, length] into one padded [B, heads, L, L] (zeros at padding)."""
    out = like.new_zeros(layout.batch_size, heads, layout.seq_len, layout.seq_len)
    for probs, (start, count, length) in zip(probs_by_group, layout.groups):
        assert probs is not None
        positions = layout.group_positions(start, count, length)  # flat positions in [B * L]
        rows, cols = positions[:, 0] // layout.seq_len, positions % layout.seq_len
        out[rows[:, None, None], :, cols[:, :, None], cols[:, None, :]] = probs.permute(0, 2, 3, 1).reshape(
            len(rows), length, length, heads
        )
    return out
