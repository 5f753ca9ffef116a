"""The attention context: everything a block's attention needs to know about the batch, built once per forward by
the `Stack` and passed to every block (`block(x, context.at(call))`).

A context holds the per-batch facts (the packed `Layout`, or the padded key mask; global tokens; a prefix LM's
prefix; an arbitrary boolean mask; the memory cross-attention reads, its mask and packing; whether probabilities are
wanted), the per-layer-call facts as one entry a call (mask policies, key/value caches, head scales) and a
`ScoreProvider` for the additive score bias. `at(call)` gives the context one layer call sees: the same facts with
that call's policy, cache and head scale picked out. The kernels (`bertology.model.attention.choose_kernel`) are
chosen from what the context holds.

What a block owns itself (its attention scale, dropout rate, prefix-tuning keys, Longformer's global projections)
is not in the context: the block passes it to `attention` / `packed_attention` beside the context."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from torch import Tensor, nn

from bertology.model.packing import Layout


@dataclass(frozen=True)
class MaskPolicy:
    """Which keys a query may attend to, by position. `window` (left, right): query i sees keys i - left .. i + right
    (a negative side is unbounded); `causal` caps right at 0. The default sees everything."""

    causal: bool = False
    window: tuple[int, int] | None = None

    @property
    def bounds(self) -> tuple[int, int]:
        """(left, right) reach; -1 for unbounded (the variable-length kernel's `window_size` convention)."""
        left, right = self.window if self.window is not None else (-1, -1)
        if self.causal:
            right = 0
        return left, right

    @property
    def restricts(self) -> bool:
        return self.bounds != (-1, -1)

    def allowed(self, num_queries: int, num_keys: int, query_offset: int, device: torch.device) -> Tensor | None:
        """[Lq, Lk] True where query i (at key position query_offset + i) may see key j; None when all may."""
        if not self.restricts:
            return None
        left, right = self.bounds
        q = torch.arange(num_queries, device=device)[:, None] + query_offset
        k = torch.arange(num_keys, device=device)[None, :]
        ok = torch.ones(num_queries, num_keys, dtype=torch.bool, device=device)
        if left >= 0:
            ok &= k >= q - left
        if right >= 0:
            ok &= k <= q + right
        return ok


BIDIRECTIONAL = MaskPolicy()
CAUSAL = MaskPolicy(causal=True)


def sliding_window(left: int, right: int | None = None) -> MaskPolicy:
    """Each query sees `left` keys before it and `right` (default: `left`) after it, and itself."""
    return MaskPolicy(window=(left, left if right is None else right))


class KVCache:
    """One block's keys and values of the positions decoded so far, [B, heads, L, head_dim] each, and the keys and
    values of the encoder memory for cross-attention (computed once).

    They live in buffers with room to spare (doubled when full), so a decoding step writes its position instead of
    copying the whole cache into a new tensor, which made decoding quadratic in copies."""

    def __init__(self) -> None:
        self._buffers: tuple[Tensor, Tensor] | None = None  # [B, heads, capacity, head_dim] each
        self._length = 0
        self.memory: tuple[Tensor, Tensor] | None = None

    @property
    def keys(self) -> Tensor | None:
        return None if self._buffers is None else self._buffers[0][..., :self._length, :]

    @property
    def values(self) -> Tensor | None:
        return None if self._buffers is None else self._buffers[1][..., :self._length, :]

    def extend(self, keys: Tensor, values: Tensor) -> tuple[Tensor, Tensor]:
        start, end = self._length, self._length + keys.shape[-2]
        if self._buffers is None or end > self._buffers[0].shape[-2]:
            capacity = max(2 * end, end + 64)
            grown = tuple(t.new_empty(*t.shape[:-2], capacity, t.shape[-1]) for t in (keys, values))
            if self._buffers is not None:
                for new, old in zip(grown, self._buffers):
                    new[..., :start, :] = old[..., :start, :]
            self._buffers = grown  # type: ignore[assignment]
        assert self._buffers is not None
        self._buffers[0][..., start:end, :] = keys
        self._buffers[1][..., start:end, :] = values
        self._length = end
        return self.keys, self.values  # type: ignore[return-value]

    @property
    def length(self) -> int:
        return self._length

    def reorder(self, rows: Tensor) -> None:
        """Keep the batch rows `rows` (in that order): beam search's surviving hypotheses."""
        if self._buffers is not None:
            self._buffers = (self._buffers[0][rows], self._buffers[1][rows])
        if self.memory is not None:
            self.memory = (self.memory[0][rows], self.memory[1][rows])


class ScoreProvider(Protocol):
    """The additive score bias of one layer call over one group of queries and keys:

        a = softmax(Q K^T * scale + bias(call, Q, K, offset) + mask) V

    `q` [N, heads, L_q, d] and `k` [N, heads, L_k, d] are the layer's queries and keys (after projection and any
    rotation, before the scale) of N sequences attended in one call: on the padded path the batch's rows; on the
    packed path one group of equal-length sequences (each row one sequence, or one document of a packed row) or one
    bucket of rows padded to its width (padding keys are masked after the bias is added: what the provider returns
    there is never seen). Row n's query i sits at key position `query_offset` + i of its sequence, key j at position j
    (positions count from 0 at each sequence's start; with a key/value cache the queries are the last L_q positions).
    The result broadcasts to [N, heads, L_q, L_k].

    A provider that depends on the lengths only (T5's relative buckets, `RelativeScores`) ignores q and k but for
    their shapes and device. One that needs the content uses them: DeBERTa's content-to-position term is
    c2p[n, h, i, j] = q[n, h, i] . P_k[h, delta(i, j)], with P_k the layer's projected relative-position
    embeddings and delta the bucketed distance j - (offset + i): one product q @ P_k^T [N, heads, L_q, 2 buckets]
    gathered at delta; position-to-content the same with k and P_q, transposed. XLNet's relative term is the same
    shape of computation with its own position encodings, and its segment term needs each token's segment id
    besides: `bertology.model.xlnet.XLNetScores` holds them for one group of rows (the padded batch, or one bucket
    of XLNet's packed joint stream, one provider a bucket in packed order). A provider scales its own terms
    (DeBERTa divides by sqrt(3 d)): the bias is added to the scores after the attention scale.

    `call` is the layer call (an index into the stack's plan), so per-layer parameters can be looked up; a provider
    shared by every layer (T5's) ignores it."""

    def bias(self, call: int, q: Tensor, k: Tensor, query_offset: int) -> Tensor: ...


class RelativeScores:
    """T5's relative position buckets as a score provider, one table for every layer of one forward.

    The bias depends on the distance key - query alone, so one table [1, heads, L_q, L_k] computed at the widest
    request serves every smaller group: a packed group of n tokens reads its top-left n x n corner, a cached decoding
    step its last rows. Each corner is cut once a forward, so the backward adds every layer's gradient there before
    one pass into the table."""

    def __init__(self, relative: nn.Module, num_queries: int, num_keys: int) -> None:
        self.relative = relative
        self.shape = (num_queries, num_keys)  # the table's extent, its queries at the last positions
        self.table: Tensor | None = None
        self.cut: dict[tuple[int, int, int], Tensor] = {}

    def bias(self, call: int, q: Tensor, k: Tensor, query_offset: int) -> Tensor:
        num_queries, num_keys = q.shape[-2], k.shape[-2]
        request = (num_queries, num_keys, query_offset)
        if request in self.cut:
            return self.cut[request]
        full_queries, full_keys = self.shape
        first = query_offset - (full_keys - full_queries)  # the table row of this request's first query
        if 0 <= first and first + num_queries <= full_queries and num_keys <= full_keys:
            if self.table is None:
                self.table = self.relative(full_queries, full_keys)[None]
            part = self.table[..., first:first + num_queries, :num_keys]
        else:
            part = self.relative(num_queries, num_keys, query_offset)[None]
        self.cut[request] = part
        return part


@dataclass
class AttentionContext:
    """What every attention call of one forward shares (see the module docstring); `at(call)` is one layer call's.

    Padded input: `key_mask` [B, L_keys] (True at real keys; with a cache the cached positions count too). Packed
    input: `layout` (its documents included). `global_tokens` (packed [T] or padded [B, L], bool): tokens that
    attend to and are attended by every token (Longformer). `lm_prefix` (packed [T] or padded [B, L_keys], bool): a
    prefix LM's prefix. `documents` [B, L_keys] (padded): each document attends within itself. `mask` (padded,
    broadcastable to [B, heads, L_q, L_k], bool): any further restriction (XLNet's permutations). `scores`: the
    score bias (`ScoreProvider`). `need_weights`: return the probabilities. `memory` [B, M, H] with `memory_mask`
    [B, M], packed [T_mem, H] with `memory_layout`: what cross-attention reads. `streams`: a two-stream block's
    plan of the forward (XLNet's `bertology.model.xlnet.PaddedStreams` or `Packed`: where each stream's rows sit in
    the block's input, which keys each row attends and its groups' score providers).

    Per layer call: `policies`, `caches`, `head_scales`, `rotaries`, `mems` (one entry a call, or empty: the
    defaults below; a rotary entry is the (cos, sin) tables of the input's positions at that call's base, [T,
    head_dim] packed or [B, L, head_dim] padded, the tables of one base shared by the calls that use it; a `mems`
    entry is Transformer-XL's memory of that call, the layer's inputs of earlier segments [B, M, H], whose keys and
    values its queries attend before the input's own, or None). The fields `call`, `policy`, `cache`, `head_scale`,
    `rotary`, `mem` and `queries` (sorted packed token indices at which the layer's output is wanted: the pruned
    last layer, or a two-stream block's query-stream rows alone) are the ones `at` sets."""

    layout: Layout | None = None
    key_mask: Tensor | None = None
    documents: Tensor | None = None
    global_tokens: Tensor | None = None
    lm_prefix: Tensor | None = None
    mask: Tensor | None = None
    scores: ScoreProvider | None = None
    need_weights: bool = False
    memory: Tensor | None = None
    memory_mask: Tensor | None = None
    memory_layout: Layout | None = None
    policies: Sequence[MaskPolicy] = ()
    caches: Sequence[KVCache] | None = None
    head_scales: Sequence[Tensor | None] = ()
    rotaries: Sequence[tuple[Tensor, Tensor]] = ()
    streams: Any = None
    mems: Sequence[Tensor | None] = ()
    # one layer call's
    call: int = 0
    policy: MaskPolicy = BIDIRECTIONAL
    cache: KVCache | None = None
    head_scale: Tensor | None = None
    rotary: tuple[Tensor, Tensor] | None = None
    mem: Tensor | None = None
    queries: Tensor | None = None
    # what the views of one forward's context share (built once for all of them): the memory's context
    _shared: dict[str, AttentionContext] = field(default_factory=dict, repr=False, compare=False)

    def at(self, call: int, queries: Tensor | None = None) -> AttentionContext:
        """The context layer call `call` sees: its policy, cache and head scale; `queries` its output rows."""
        view = copy.copy(self)
        view.call = call
        if self.policies:
            view.policy = self.policies[call]
        if self.caches is not None:
            view.cache = self.caches[call]
        if self.head_scales:
            view.head_scale = self.head_scales[call]
        if self.rotaries:
            view.rotary = self.rotaries[call]
        if self.mems:
            view.mem = self.mems[call]
        view.queries = queries
        return view

    def memory_context(self) -> AttentionContext:
        """The context of cross-attention over the memory: bidirectional, the memory's padding masked."""
        if "memory" not in self._shared:
            self._shared["memory"] = AttentionContext(key_mask=self.memory_mask)
        return self._shared["memory"]

    def bias(self, q: Tensor, k: Tensor, query_offset: int) -> Tensor | None:
        """This call's score bias over a group of queries and keys (see ScoreProvider), None without a provider."""
        return self.scores.bias(self.call, q, k, query_offset) if self.scores is not None else None
