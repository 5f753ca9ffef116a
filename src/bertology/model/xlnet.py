"""XLNet (Yang et al. 2019): a permutation language model on Transformer-XL's relative positions and memory, built
from the shared block (post-norm, its attention projections without bias) and the shared masked attention.

Two streams run through every layer with the same weights. The content stream h_i sees the content of the tokens
its factorisation order lets it see, and itself; the query stream g_i (started from one learned vector, only where
`target_mapping` asks for predictions) sees the same tokens but never its own content: it knows only its position.
The query stream is computed at the P targets alone (transformers' computes it at every position and keeps the
targets'), so `target_mapping` rows must be one-hot (or empty), no token predicted twice.

    score(i, j) = [(q_i + u) k_j + rel_shift((q_i + v) R)_ij + (q_i + s) e_{[seg_i != seg_j]}] / sqrt(d)

with R the projected sinusoids of the relative distances (Transformer-XL), u, v, s the per-head biases r_w_bias,
r_r_bias, r_s_bias, and e the two relative segment vectors (same segment or not). Each layer's input is kept as the
next call's memory (`mems`, transformers' layout [M, B, H] per layer): memory positions come before the input, are
visible to every query and count as segment 0.

Without a memory (none read, none kept) the streams run on the real tokens alone (`Layout`), as one joint stream:
the rows go into a few buckets padded to their longest (`plan_buckets`), each row's content positions followed by
the query stream's slots at its targets, in the row's own coordinates (relative positions make a row's padding
irrelevant). Every linear layer runs once over the joint stream and attention once per bucket for both streams; the
content stream's output is zero at padding (transformers' runs its padding positions too), and the empty slots past
a bucket's most targets share one row (with dropout, one draw: they predict nothing). With a memory, attention
probabilities, "uni" attention or bi_data the rows run padded, both streams in one input [B, L + P, H].

On the one stack's parts: the layers run in the stack's layer loop (`bertology.model.stack.run_layers`, each as
`layer(x, context.at(call))`), one `AttentionContext` a forward holding the two-stream plan (`streams`: where each
stream's rows sit, each group's boolean mask of permutations, padding and "uni", the empty targets), each layer
call's memory (`mems`) and the relative-position and segment terms as score providers (`XLNetScores`: the padded
batch's, or one per bucket in packed order). Each group of rows attends through the shared `attention` with that
mask and provider. What stays XLNet's own, and why:

- The grouping of the packed rows. A query-stream row attends to the content stream's keys and values but is no
  key itself (it must not see its own content), so a group's keys are a subset of its rows. The packed `Layout`
  and its kernels (`packed_attention`: groups, buckets, variable-length calls) pair every row with the keys of its
  own sequence, each row a key; XLNet's joint stream is cut into its own buckets (`Packed`), each bucket then one
  call of the shared padded `attention`.
- The input. `Stack.forward` embeds (absolute positions, token types) and packs by a `Layout`; XLNet adds no
  position to its embeddings (distances enter through R) and no token-type embedding (segments enter as the
  relative term), its query stream starts from one learned vector at the targets, and its rows are packed as
  above. So the model embeds, packs and builds the context itself, then runs the stack's loop; its layers stay
  the model's own `layers` (a `Stack` would hold them under its own name, and the checkpoints' keys are
  `layers.N.*`).

The forward pass takes transformers' keyword names (input_ids, attention_mask, token_type_ids, perm_mask,
target_mapping, mems, use_mems) and returns `last_hidden_state`, `logits` and `mems` under the same names."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from bertology.errors import ConfigError, InputError
from bertology.model.attention import attention
from bertology.model.blocks import Block, BlockSpec, init_parameters
from bertology.model.config import ACTIVATIONS, config_from_dict, config_to_dict
from bertology.model.context import AttentionContext
from bertology.model.dropout import fast_dropout
from bertology.model.base import BaseModel
from bertology.model.heads import HeadInputs, HeadSpec, TiedLMBiasHead, activation
from bertology.model.packing import Layout, plan_buckets
from bertology.model.positions import relative_sinusoids
from bertology.model.protocol import ATTENTIONS, BLOCKS, MEMORY, PERMUTATION_LM, TOKEN_TYPES
from bertology.model.stack import run_layers
from bertology.model.transformer import check_ids


@dataclass
class XLNetConfig:
    """Shape and behaviour of an XLNet model (transformers' XLNetConfig, under bertology's names)."""

    family: str = "xlnet"
    vocab_size: int = 32000
    hidden_size: int = 1024
    num_layers: int = 24
    num_heads: int = 16
    attention_head_size: int | None = None  # None: hidden_size // num_heads
    intermediate_size: int = 4096
    hidden_act: str = "gelu"
    attn_type: str = "bi"  # "bi": every query sees every key; "uni": causal (Transformer-XL)
    bi_data: bool = False  # half of the batch reads its relative distances backwards
    clamp_len: int = -1  # distances clamped to [-clamp_len, clamp_len] when positive
    same_length: bool = False  # "uni": every query sees the same number of keys
    mem_len: int | None = 512  # positions kept as memory (None or 0: all)
    reuse_len: int | None = None  # only the first reuse_len positions of an input become memory (None or 0: all)
    use_mems_eval: bool = True  # use_mems when not given, in eval mode
    use_mems_train: bool = False  # ... in training mode
    layer_norm_eps: float = 1e-12
    hidden_dropout: float = 0.1  # transformers' `dropout`: embeddings, positions, attention, sublayers, output
    summary_last_dropout: float = 0.1  # after the sequence summary's tanh
    initializer_range: float = 0.02
    pad_token_id: int = 5
    bos_token_id: int | None = 1
    eos_token_id: int | None = 2
    extra: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        for name in ("vocab_size", "hidden_size", "num_layers", "num_heads", "intermediate_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ConfigError(f"{name} must be a positive integer, got {value!r}")
        if self.hidden_act not in ACTIVATIONS:
            raise ConfigError(f"hidden_act: unknown activation {self.hidden_act!r}; expected one of "
                              f"{', '.join(ACTIVATIONS)}")
        if self.attention_head_size is None and self.hidden_size % self.num_heads:
            raise ConfigError(f"hidden_size {self.hidden_size} is not divisible by num_heads {self.num_heads}")
        if self.attn_type not in ("bi", "uni"):
            raise ConfigError(f"attn_type: expected 'bi' or 'uni', got {self.attn_type!r}")
        for name in ("mem_len", "reuse_len"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
                raise ConfigError(f"{name}: expected a length >= 0 or null, got {value!r}")
        for name in ("hidden_dropout", "summary_last_dropout"):
            if not 0 <= getattr(self, name) < 1:
                raise ConfigError(f"{name}: expected a dropout rate in [0, 1), got {getattr(self, name)!r}")

    @property
    def head_dim(self) -> int:
        return self.attention_head_size or self.hidden_size // self.num_heads

    @property
    def token_embedding_size(self) -> int:
        return self.hidden_size

    @property
    def head_dropout(self) -> float:
        """The shared heads' own dropout: none, XLNet's output has had its dropout already."""
        return 0.0

    @property
    def max_length(self) -> int:
        return 1 << 30  # relative positions: no limit

    def to_dict(self) -> dict[str, Any]:
        return config_to_dict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> XLNetConfig:
        return config_from_dict(cls, data, "xlnet")


@dataclass
class XLNetOutput:
    """What an XLNet forward returns, named as in transformers. With `target_mapping`, `last_hidden_state` and the
    logits are the query stream's at the P predicted positions ([B, P, ...]); else the content stream's."""

    last_hidden_state: Tensor
    logits: Tensor | None = None
    head_logits: dict[str, Tensor] = field(default_factory=dict)
    loss: Tensor | None = None  # mean cross-entropy of `labels` (when given)
    mems: list[Tensor] | None = None  # per layer [M, B, H], transformers' layout
    hidden_states: tuple[Tensor, ...] | None = None  # the content stream: embeddings, then every layer's output
    attentions: tuple[Tensor, ...] | None = None  # the content stream's probabilities per layer [B, heads, L, M + L]


@dataclass
class Targets:
    """Where the query stream's P predictions sit, computed once per forward from a one-hot `target_mapping`:
    `columns` [B, 1, P, K] the relative-distance column of each (target, key), `mask` [B, P, K] (True: may attend)
    and `segments` [B, P, K] the targets' rows of the query masks and segments, `present` [B, 1, P, 1] 0 at the
    empty rows of target_mapping (their output is 0, as transformers' mapping gives)."""

    columns: Tensor
    mask: Tensor | None
    segments: Tensor | None
    present: Tensor


def rel_shift(scores: Tensor, num_keys: int) -> Tensor:
    """[B, heads, Lq, R] scores against R relative distances (from the largest down) -> [B, heads, Lq, num_keys],
    entry (i, j) read from column Lq - i + j: the distance between query i (after the memory) and key j."""
    batch, heads, queries, distances = scores.shape
    shifted = scores.reshape(batch, heads, distances, queries)[:, :, 1:]
    return shifted.reshape(batch, heads, queries, distances - 1)[..., :num_keys]


@dataclass(eq=False)
class XLNetScores:
    """XLNet's relative-position and segment terms as the score provider (`ScoreProvider`) of one group of rows
    attended in one call: the padded batch (memory included), or one bucket of the packed joint stream.

        bias(i, j) = [rel_shift((q_i + v) R)_ij + (q_i + s) e_{[seg_i != seg_j]}] / sqrt(d)

    R is the layer call's projection (`position`, transformers' `r`) of the encoded distances `positions` [N or 1,
    R, H] (dropped out already; from the farthest key down), v, s and e the layer's r_r_bias, r_s_bias and segment
    vectors, looked up by the call. The group's rows are its content positions (the last positions of the keys,
    `rel_shift` reads their distances) followed by the query stream's targets, which read their distance columns
    from `columns` [N, 1, T, K] (the distance column of each target and key); a call with fewer rows than the group
    (the last layer's query stream alone) holds its last rows. `segments` [N, rows, K] (True: the key is of another
    segment than the row's token, None without token types).

    The content term (q + u) k, u = r_w_bias, is attention's own product: XLNet's block hands attention its queries
    with the content bias and the scale applied, q' = (q + u) / sqrt(d), and scale 1 (prefix keys are then scored
    (q + u) k_p / sqrt(d) too, without position or segment term), so the terms here read q' as (q' + (v - u) /
    sqrt(d)) R and (q' + (s - u) / sqrt(d)) e. Without a prefix the segment term (q + s) e_0 common to all of a
    row's keys is left out (a softmax does not see it), and left out entirely where no allowed pair crosses
    segments (`mixed` false)."""

    layers: Sequence[nn.Module]
    positions: Tensor
    columns: Tensor | None = None
    segments: Tensor | None = None
    mixed: bool = True

    def bias(self, call: int, q: Tensor, k: Tensor, query_offset: int) -> Tensor:
        layer = self.layers[call]
        scale = 1 / math.sqrt(layer.head_dim)
        u = layer.content_bias * scale
        r = layer.heads_first(layer.position(self.positions))  # [N or 1, heads, R, d]
        by_distance = (q + (layer.position_bias * scale - u)[:, None]) @ r.transpose(-1, -2)  # [N, heads, Q, R]
        rows = q.shape[-2]
        targets = self.columns.shape[-2] if self.columns is not None else 0
        parts = [rel_shift(by_distance[:, :, :rows - targets], k.shape[-2])] if rows > targets else []
        if self.columns is not None:
            parts.append(by_distance[:, :, rows - targets:].gather(-1, self.columns.expand(-1, q.shape[1], -1, -1)))
        bias = parts[0] if len(parts) == 1 else torch.cat(parts, 2)
        prefix = layer.prefix is not None
        if self.segments is not None and (self.mixed or prefix):
            segments = self.segments[:, -rows:]
            query = q + (layer.segment_bias * scale - u)[:, None]
            e = layer.segment_embeddings
            if not prefix:
                other = query @ (e[1] - e[0])[:, :, None]  # [N, heads, Q, 1]
                bias = torch.addcmul(bias, segments[:, None].to(bias.dtype), other)
            else:
                by_segment = torch.einsum("bnid,snd->bnis", query, e)
                bias = bias + torch.where(segments[:, None], by_segment[..., 1:], by_segment[..., :1])
        return bias


@dataclass(eq=False)
class PaddedStreams:
    """The padded rows' plan of one forward (`AttentionContext.streams`): a layer's input is [B, L + P, H], the
    content stream's L positions, then the query stream's P targets (none without `target_mapping`); its keys
    and values come from the layer call's memory (`AttentionContext.mem`, [B, M, H]) and the content positions.
    The context's `mask` [B or 1, 1, L + P, M + L] says which keys each row may attend (permutations, padding,
    "uni"; None: every key); `keep` [B, 1, L + P, 1] (0 at the empty targets, whose attention output is 0; None
    without targets) and `scores` the batch's `XLNetScores` (also the context's `scores`); a call with the query
    stream alone reads their last P rows."""

    length: int
    slots: int
    keep: Tensor | None
    scores: XLNetScores


@dataclass
class JointBucket:
    """`count` rows of a packed batch, each padded to `width` content positions (its real tokens first, in its own
    coordinates) and followed by `slots` rows of the query stream (the row's targets, then empty slots up to the
    bucket's most targets): `count x (width + slots)` rows of the joint stream (`Packed`). For every row (content
    position or slot) against the `width` keys: `allowed` [count, width + slots, width] (True: may attend; never a
    padding key), `keep` [count, 1, width + slots, 1] (0 at the empty slots, whose attention output is 0; None
    when no slot is empty) and `scores` the bucket's `XLNetScores` (its encoded distances, the slots' distance
    columns [count, 1, slots, width], its segments [count, width + slots, width] and whether an allowed pair crosses
    segments)."""

    count: int
    width: int
    slots: int
    allowed: Tensor
    keep: Tensor | None
    scores: XLNetScores


@dataclass
class Packed:
    """What every layer needs to run a batch's real tokens (`XLNetModel.packed`) as one joint stream of both
    streams (`AttentionContext.streams` on the packed path): the buckets of rows, then, with a query stream, one
    more row (`empty`): the slot that no bucket holds, whose attention output is 0 (a row's slots past its bucket's
    are all this one). `sizes`: each bucket's number of joint rows (and 1 for `empty`); `source` [joint rows] the
    flat [B * L] position each joint row takes its token from (a padding position or slot: any), `query` [joint
    rows] True at the slots, `real` the joint rows of the real tokens and `flat` their flat positions; `slot_rows`
    the joint rows of the slots (bucket order, `empty` last; sorted) and `slot_index` [B, P] where each slot of
    `target_mapping` reads its state among those."""

    buckets: list[JointBucket]
    sizes: list[int]
    slots: int
    empty: bool
    source: Tensor
    query: Tensor
    real: Tensor
    flat: Tensor
    slot_rows: Tensor
    slot_index: Tensor


# What running one more bucket costs beyond its FLOPs (its few dozen small operations per layer, forward and
# backward), in FLOPs: about a millisecond of a CPU core's matmuls. `plan_buckets` weighs it against padding; on the
# benchmark's paragraphs (XLNet-mini, one thread) anything from 1e7 to 3e8 ran equally fast (10-15 buckets of 32
# rows), a single bucket (every row padded to the longest) 60 % slower.
BUCKET_OVERHEAD_FLOPS = 1e8


class XLNetLayer(Block):
    """A post-norm block whose self-attention is XLNet's two-stream relative attention: the shared `attention`
    under each group's boolean mask (the permutations, padding, "uni") with the group's `XLNetScores`. Its input
    holds both streams (`AttentionContext.streams` says where: `PaddedStreams` or the packed `Packed`), which share
    its weights; the query stream's rows attend to the content stream's keys and values, never to their own. Slots:
    the `Block`'s (query key value attn_out attn_norm ffn_in ffn_out ffn_norm, the extension slots) plus `position`,
    `content_bias`, `position_bias`, `segment_bias`, `segment_embeddings`."""

    def __init__(self, config: XLNetConfig) -> None:
        super().__init__(BlockSpec(
            hidden_size=config.hidden_size, num_heads=config.num_heads, head_dim=config.head_dim,
            intermediate_size=config.intermediate_size, activation=config.hidden_act, norm_eps=config.layer_norm_eps,
            pre_norm=False, bias=True, attention_bias=False, dropout=config.hidden_dropout,
            attention_dropout=config.hidden_dropout, activation_dropout=config.hidden_dropout))
        heads, head_dim = config.num_heads, config.head_dim
        self.position = nn.Linear(config.hidden_size, heads * head_dim, bias=False)  # transformers' `r`
        self.content_bias = nn.Parameter(torch.zeros(heads, head_dim))  # r_w_bias
        self.position_bias = nn.Parameter(torch.zeros(heads, head_dim))  # r_r_bias
        self.segment_bias = nn.Parameter(torch.zeros(heads, head_dim))  # r_s_bias
        self.segment_embeddings = nn.Parameter(torch.zeros(2, heads, head_dim))  # seg_embed: same segment, other

    def forward(self, x: Tensor, context: AttentionContext | None = None) -> tuple[Tensor, Tensor | None]:
        """x holds both streams as the context's `streams` plan says: padded [B, L + P, H] (`PaddedStreams`, keys
        and values from the call's `mem` and the L content positions) or the packed joint stream [rows, H]
        (`Packed`). With the context's `queries` (any value: the last layer when only the query stream is read)
        only the query stream's rows are computed and come back ([B, P, H] padded, [len(slot_rows), H] packed).
        The content stream's attention probabilities come back when the context asks for them (padded only)."""
        if context is None or context.streams is None:
            raise InputError("an XLNet layer needs the forward's two-stream plan (AttentionContext.streams)")
        streams = context.streams
        if isinstance(streams, Packed):
            return self.forward_packed(x, context, streams), None
        return self.forward_padded(x, context, streams)

    def forward_padded(self, x: Tensor, context: AttentionContext,
                       streams: PaddedStreams) -> tuple[Tensor, Tensor | None]:
        length, slots = streams.length, streams.slots
        h = x[:, :length]
        alone = context.queries is not None and slots > 0  # the query stream alone
        keys_from = h if context.mem is None else torch.cat([context.mem.to(h.dtype), h], 1)
        q, k, v = self.project(keys_from)
        queries = [] if alone else [q[:, keys_from.shape[1] - length:]]
        if slots:
            queries.append(self.query(x[:, length:]))
        q = queries[0] if len(queries) == 1 else torch.cat(queries, 1)
        a, probs = self.streams_attention(self.heads_first(q), self.heads_first(k), self.heads_first(v),
                                          context.mask, streams.keep, streams.scores, context)
        residual = x[:, length:] if alone else x
        return self.feed_forward_residual(self.attention_residual(residual, a.transpose(1, 2).flatten(2))), probs

    def forward_packed(self, x: Tensor, context: AttentionContext, packed: Packed) -> Tensor:
        """The joint stream x [rows, H] of both streams: the linear layers once over it, attention once per
        bucket, a row's content positions and slots together against its keys. The buckets are split off the
        stream (a slice per bucket would make autograd add a stream-sized zero gradient per bucket)."""
        alone = context.queries is not None
        q, k, v = (t.split(packed.sizes) for t in self.project(x))
        width = self.num_heads * self.head_dim
        rows = len(packed.slot_rows) if alone else len(x)
        a_all = x.new_zeros(rows, width) if packed.empty else x.new_empty(rows, width)  # `empty`'s stays 0
        done = 0
        for index, bucket in enumerate(packed.buckets):
            count, n = bucket.count, bucket.width
            if alone and not bucket.slots:
                continue
            qb, kb, vb = (t[index].view(count, n + bucket.slots, self.num_heads, self.head_dim) for t in (q, k, v))
            a = self.streams_attention(qb[:, n:] if alone else qb, kb[:, :n], vb[:, :n], bucket.allowed[:, None],
                                       bucket.keep, bucket.scores, context, heads_last=True)[0]
            size = count * a.shape[2]
            a_all[done:done + size].view(count, -1, self.num_heads, self.head_dim).copy_(a.transpose(1, 2))
            done += size
        residual = x.index_select(0, packed.slot_rows) if alone else x
        return self.feed_forward_residual(self.attention_residual(residual, a_all))

    def streams_attention(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, keep: Tensor | None,
                          scores: XLNetScores, context: AttentionContext, heads_last: bool = False
                          ) -> tuple[Tensor, Tensor | None]:
        """[N, heads, rows, d] attention output of one group's rows (its last `rows`, see `XLNetScores`) over its
        keys, through the shared `attention` with the group's boolean mask ([N or 1, 1, group rows, keys], True:
        may attend) as its context's `mask` and the group's provider (and the probabilities when the context wants
        them). `heads_last`: q, k, v come as [N, len, heads, d]."""
        if heads_last:
            q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        rows = q.shape[-2]
        scale = 1 / math.sqrt(self.head_dim)
        call = AttentionContext(mask=mask[:, :, -rows:] if mask is not None else None, scores=scores,
                                need_weights=context.need_weights, call=context.call)
        a, probs = attention((q + self.content_bias[:, None]) * scale, k, v, call, scale=1.0,
                             dropout=self.attention_dropout if self.training else 0.0, prefix=self.prefix_states())
        if keep is not None:
            a = a * keep[:, :, -rows:]
        return a, probs


class SequenceSummaryHead(nn.Module):
    """XLNet's sequence classification (kind "summary_last"): the vector at the last position (the <cls> token,
    which left padding keeps last) -> dense -> act -> dropout -> out."""

    def __init__(self, config: Any, spec: HeadSpec) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.act = activation(spec.activation)
        self.out = nn.Linear(config.hidden_size, spec.num_labels)
        self.dropout = getattr(config, "summary_last_dropout", 0.0)

    def forward(self, inputs: HeadInputs) -> Tensor:
        x = self.act(self.dense(inputs.hidden[:, -1]))
        return self.out(fast_dropout(x, self.dropout, self.training))



class XLNetModel(BaseModel):
    """XLNet with heads; the first head is the primary one (`logits`)."""

    config_class = XLNetConfig
    CAPABILITIES = frozenset({PERMUTATION_LM, MEMORY, ATTENTIONS, TOKEN_TYPES, BLOCKS})

    def __init__(self, config: XLNetConfig, heads: Sequence[HeadSpec] = ()) -> None:
        super().__init__(config)
        self.embeddings = nn.Embedding(config.vocab_size, config.hidden_size)
        self.mask_embedding = nn.Parameter(torch.zeros(config.hidden_size))  # the query stream's start
        self.layers = nn.ModuleList(XLNetLayer(config) for _ in range(config.num_layers))
        self.init_heads(heads)

    @property
    def word_embeddings(self) -> nn.Embedding:
        return self.embeddings

    def blocks(self) -> list[nn.Module]:
        return list(self.layers)

    def attention_heads(self) -> tuple[list[list[int]], dict[int, list[int]]]:
        """Per layer, its heads (every one: XLNet's are never pruned), and no pruned heads."""
        return [list(range(self.config.num_heads)) for _ in range(self.config.num_layers)], {}

    @torch.no_grad()
    def init_weights(self, generator: torch.Generator | None = None) -> None:
        """BERT's initialisation for the linear layers, embeddings and norms; N(0, initializer_range) for the
        attention biases, segment vectors and the query stream's start, zero vocabulary biases (as transformers)."""
        init_parameters(self, self.config.initializer_range, generator)
        std = self.config.initializer_range
        self.mask_embedding.normal_(0.0, std, generator=generator)
        for layer in self.layers:
            for p in (layer.content_bias, layer.position_bias, layer.segment_bias, layer.segment_embeddings):
                p.normal_(0.0, std, generator=generator)
        for head in self.heads.values():
            if isinstance(head, TiedLMBiasHead):
                head.bias.zero_()

    def forward_inputs(self, batch: Any) -> dict[str, Any]:
        return {name: getattr(batch, name, None) for name in
                ("input_ids", "attention_mask", "token_type_ids", "perm_mask", "target_mapping", "masked_positions")}

    def layer_states(self, input_ids: Tensor, attention_mask: Tensor,
                     token_type_ids: Tensor | None = None) -> tuple[Tensor, ...]:
        """The content stream: the embedding output, then every layer's, [B, L, H] each."""
        out = self(input_ids, attention_mask, token_type_ids=token_type_ids, use_mems=False,
                   output_hidden_states=True)
        assert out.hidden_states is not None
        return out.hidden_states

    def relative_positions(self, length: int, num_keys: int, batch: int, device: torch.device) -> Tensor:
        """The encoded distances [B or 1, R, H] from the farthest key down: R = num_keys + length ("bi") or
        num_keys + 1 ("uni"); with bi_data the second half of the batch reads them negated."""
        config = self.config
        end = -length if config.attn_type == "bi" else -1
        forward = torch.arange(num_keys, end, -1, device=device)
        directions = [forward, -forward] if config.bi_data else [forward]
        if config.bi_data and batch % 2:
            raise InputError(f"bi_data runs half of the batch forward and half backward: the batch size must be even, "
                             f"got {batch}")
        encoded = []
        for distances in directions:
            if config.clamp_len > 0:
                distances = distances.clamp(-config.clamp_len, config.clamp_len)
            encoded.append(relative_sinusoids(distances, config.hidden_size)[None])
        if config.bi_data:
            return torch.cat([e.expand(batch // 2, -1, -1) for e in encoded])
        # In training each row drops out its own copy, as transformers' does.
        return encoded[0].expand(batch, -1, -1) if self.training and config.hidden_dropout else encoded[0]

    def masks(self, batch: int, length: int, memory: int, attention_mask: Tensor | None, perm_mask: Tensor | None,
              device: torch.device) -> tuple[Tensor | None, Tensor | None]:
        """(content, query) [B or 1, L, M + L], True where a query may attend, or None when all may. A key is
        hidden by padding, by `perm_mask` (1: may not attend) and, with "uni", when it comes later; the memory is
        visible unless `attention_mask` covers it too ([B, M + L]). The content stream always sees itself."""
        num_keys = memory + length
        blocked: Tensor | None = None
        if self.config.attn_type == "uni":
            q = torch.arange(length, device=device)[:, None] + memory
            k = torch.arange(num_keys, device=device)[None, :]
            blocked = k > q
            if self.config.same_length:
                blocked = blocked | (k < q - memory)
            blocked = blocked[None]
        data: Tensor | None = None
        hidden_memory: Tensor | None = None
        if attention_mask is not None:
            if attention_mask.shape[1] == num_keys and memory:  # the memory's columns first
                hidden_memory = (attention_mask[:, :memory] < 1)[:, None, :]
                attention_mask = attention_mask[:, memory:]
            data = (attention_mask < 1)[:, None, :]
        if perm_mask is not None:
            data = perm_mask > 0 if data is None else data | (perm_mask > 0)
        if data is not None:
            if memory:
                before = data.new_zeros(*data.shape[:2], memory) if hidden_memory is None \
                    else hidden_memory.expand(-1, data.shape[1], -1)
                data = torch.cat([before, data], -1)
            blocked = data if blocked is None else blocked | data
        if blocked is None:
            return None, None
        itself = torch.arange(length, device=device)[:, None] + memory == torch.arange(num_keys, device=device)
        return ~(blocked & ~itself), ~blocked

    @staticmethod
    def targets(target_mapping: Tensor, query_mask: Tensor | None, segments: Tensor | None, memory: int,
                distances: int, dtype: torch.dtype) -> Targets:
        """The query stream's rows, at the positions its one-hot `target_mapping` rows name: each reads, for key
        j, the distance column (L - i + j) that `rel_shift` gives position i, and its rows of the masks."""
        batch, _, length = target_mapping.shape
        num_keys = memory + length
        at = target_mapping.argmax(-1)  # [B, P]
        keys = torch.arange(num_keys, device=at.device)
        columns = (length - at[:, None, :, None] + keys).clamp(max=distances - 1)  # beyond: a hidden key ("uni")

        def rows(table: Tensor | None) -> Tensor | None:
            if table is None:
                return None
            return table.expand(batch, -1, -1).gather(1, at[:, :, None].expand(-1, -1, num_keys))

        present = target_mapping.sum(-1).to(dtype)[:, None, :, None]
        return Targets(columns, rows(query_mask), rows(segments), present)

    def layout(self, attention_mask: Tensor | None, memory: int, use_mems: bool, output_attentions: bool
               ) -> Layout | None:
        """The packed layout of the batch's real tokens, or None where the padded path runs: with a memory (kept
        or read: its positions are every row's, padding included, as transformers' memory), attention
        probabilities, "uni" attention or bi_data, without a mask, or where a row's real tokens are not one run
        (or a row has none)."""
        config = self.config
        if attention_mask is None or memory or use_mems or output_attentions or config.attn_type != "bi" \
                or config.bi_data:
            return None
        host = attention_mask.detach().to("cpu", torch.bool)  # the one host copy; free for a CPU mask
        lengths = host.sum(1)
        first = host.to(torch.uint8).argmax(1)
        columns = torch.arange(host.shape[1])
        one_run = (columns >= first[:, None]) & (columns < (first + lengths)[:, None])
        if not bool((lengths > 0).all()) or not torch.equal(one_run, host):
            return None
        return Layout(host).to(attention_mask.device)

    def packed(self, layout: Layout, perm_mask: Tensor | None, token_type_ids: Tensor | None,
               target_mapping: Tensor | None, dtype: torch.dtype) -> Packed:
        """The rows in buckets (`plan_buckets`), each row in its own coordinates (its real tokens first; the content
        stream sees itself, padding is never seen; a target slot on padding is empty; a row's targets first among
        its slots), where each joint row takes its token, and the encoded distances (see `Packed`)."""
        config = self.config
        batch, length, device = layout.batch_size, layout.seq_len, layout.flat_index.device
        dropout = config.hidden_dropout if self.training else 0.0
        slots = target_mapping.shape[1] if target_mapping is not None else 0
        blocked_all = perm_mask > 0 if perm_mask is not None else None
        present_all = targets = None
        if target_mapping is not None:  # each row's slots with a target on a real token, and their count
            real_all = torch.zeros(batch * length, dtype=target_mapping.dtype, device=device)
            real_all = real_all.index_fill_(0, layout.flat_index, 1).view(batch, 1, length)
            present_all = (target_mapping * real_all).sum(-1) > 0  # [B, P]
            targets = present_all.sum(1).cpu()  # the one host copy of the targets
        hidden, width = config.hidden_size, config.num_heads * config.head_dim
        linear = 2 * (4 * hidden * width + 2 * hidden * config.intermediate_size)  # per joint row and layer
        mean_slots = float(targets.float().mean()) if targets is not None else 0.0

        def row_cost(n: int) -> float:  # FLOPs of a row padded to n (forward and backward) per layer
            positions = 2 * n * 2 * hidden * width if dropout else 0
            return 3 * ((n + mean_slots) * (linear + 8 * n * width) + positions)

        groups = [(count, n) for _, count, n in layout.groups]
        firsts = torch.cat([layout.group_positions(start, count, n)[:, 0] for start, count, n in layout.groups])
        counts = torch.tensor([count for count, _ in groups])
        lengths = torch.repeat_interleave(torch.tensor([n for _, n in groups]), counts).to(device)
        rows_cpu = firsts.cpu() // length  # the rows' batch indices, on the host
        planned, sources, real_rows, query_rows, slot_rows, slot_parts, per_row, flags = [], [], [], [], [], [], [], []
        done = joint = compact = 0
        for first_group, end_group in plan_buckets(groups, row_cost, BUCKET_OVERHEAD_FLOPS):
            count = sum(c for c, _ in groups[first_group:end_group])
            n = groups[end_group - 1][1]
            rows = slice(done, done + count)
            done += count
            flat_first, real_length = firsts[rows], lengths[rows]
            batch_rows = flat_first // length
            used = int(targets[rows_cpu[rows]].max()) if targets is not None else 0  # the bucket's slots per row
            position = torch.arange(n, device=device)
            real = position < real_length[:, None]  # [count, n]
            columns = flat_first[:, None] % length + torch.minimum(position, real_length[:, None] - 1)
            source = batch_rows[:, None] * length + columns
            sources.append(torch.cat([source, source[:, :1].expand(-1, used)], 1).flatten())
            real_rows.append(torch.cat([real, real.new_zeros(count, used)], 1).flatten())
            query_rows.append((torch.arange(n + used, device=device) >= n).repeat(count))

            def local(table: Tensor) -> Tensor:  # [B, L, L] -> the bucket's [count, n, n]
                inner = table[batch_rows].gather(1, columns[:, :, None].expand(-1, -1, length))
                return inner.gather(2, columns[:, None, :].expand(-1, n, -1))

            blocked = local(blocked_all) if blocked_all is not None else None
            allowed = real[:, None, :].expand(-1, n, -1)
            if blocked is not None:
                allowed = allowed & ~(blocked & ~torch.eye(n, dtype=torch.bool, device=device))
            types = token_type_ids[batch_rows].gather(1, columns) if token_type_ids is not None else None
            segments = types[:, :, None] != types[:, None, :] if types is not None else None
            keep = column = None
            if used:
                assert target_mapping is not None and present_all is not None
                # The row's slots with targets first, in order; the bucket's first `used` of them run.
                chosen = torch.argsort((~present_all[batch_rows]).to(torch.uint8), dim=1, stable=True)[:, :used]
                mapping = target_mapping[batch_rows].gather(1, chosen[:, :, None].expand(-1, -1, length))
                mapping = mapping.gather(2, columns[:, None, :].expand(-1, used, -1)) * real[:, None, :]
                at = mapping.argmax(-1)  # [count, used]
                present = mapping.sum(-1).to(dtype)
                at_rows = at[:, :, None].expand(-1, -1, n)
                seen = real[:, None, :].expand(-1, used, -1)
                allowed = torch.cat([allowed, seen & ~blocked.gather(1, at_rows) if blocked is not None else seen], 1)
                column = (n - at[:, :, None] + position)[:, None]  # the distance column of (target, key)
                if segments is not None:
                    segments = torch.cat([segments, segments.gather(1, at_rows)], 1)
                keep = torch.cat([present.new_ones(count, n), present], 1)[:, None, :, None]
                flags.append((present == 0).any())
                starts = joint + torch.arange(count, device=device)[:, None] * (n + used) + n
                slot_rows.append((starts + torch.arange(used, device=device)).flatten())
                slot_parts.append((batch_rows, chosen, compact + torch.arange(count * used, device=device)))
                compact += count * used
            if segments is not None:
                flags.append((segments & allowed).any())
            planned.append((count, n, used, allowed, keep, column, segments))
            joint += count * (n + used)
            if dropout:
                per_row.append(self.relative_positions(n, n, count, device).flatten(0, 1))
        # The encoded distances: in training each row's own copy (dropped out row by row, as transformers' does),
        # else one copy [2 longest, H] from which a bucket of width n reads the middle 2n.
        longest = planned[-1][1]
        distances = torch.cat(per_row) if dropout else self.relative_positions(longest, longest, 1, device)[0]
        distances = fast_dropout(distances.to(dtype), dropout, self.training)
        if dropout:
            encoded = [part.view(count, 2 * n, -1) for part, (count, n, *_) in
                       zip(distances.split([2 * count * n for count, n, *_ in planned]), planned)]
        else:
            encoded = [distances[longest - n:longest + n][None] for _, n, *_ in planned]
        read = iter(torch.stack(flags).tolist() if flags else [])  # one host read for the whole batch
        buckets = []
        for (count, n, used, allowed, keep, column, segments), positions in zip(planned, encoded):
            if used and not next(read):
                keep = None
            mixed = segments is not None and next(read)
            buckets.append(JointBucket(count, n, used, allowed, keep,
                                       XLNetScores(self.layers, positions, column, segments, mixed)))
        empty = target_mapping is not None
        slot_index = torch.full((batch, slots), compact, dtype=torch.long, device=device)  # default: `empty`
        for batch_rows, chosen, at in slot_parts:
            slot_index[batch_rows[:, None], chosen] = at.view(len(batch_rows), -1)
        if empty:
            sources.append(sources[0][:1])
            real_rows.append(real_rows[0].new_zeros(1))
            query_rows.append(query_rows[0].new_ones(1))
            slot_rows.append(torch.tensor([joint], device=device))
        source = torch.cat(sources)
        real_index = torch.cat(real_rows).nonzero().squeeze(1)
        return Packed(buckets, [b.count * (b.width + b.slots) for b in buckets] + [1] * empty, slots, empty, source,
                      torch.cat(query_rows), real_index, source[real_index],
                      torch.cat(slot_rows) if slot_rows else source.new_zeros(0), slot_index)

    def cache(self, h: Tensor, previous: Tensor | None) -> Tensor:
        """The next memory [M', B, H] from a layer's input h [B, L, H]: the first reuse_len positions appended to
        the previous memory, the last mem_len kept (all when mem_len is None or 0), detached."""
        reuse, keep = self.config.reuse_len, self.config.mem_len
        current = (h[:, :reuse] if reuse else h).transpose(0, 1)
        memory = current if previous is None else torch.cat([previous, current], 0)
        return (memory[-keep:] if keep else memory).detach()

    def memory_mask(self, previous: Tensor | None, attention_mask: Tensor) -> Tensor:
        """The [B, M'] mask of the next memory (1: a real token) as `cache` builds that memory from an input whose
        mask is `attention_mask` [B, L] after a memory whose mask is `previous` [B, M] (None: no memory)."""
        reuse, keep = self.config.reuse_len, self.config.mem_len
        current = attention_mask[:, :reuse] if reuse else attention_mask
        mask = current if previous is None else torch.cat([previous.to(current.dtype), current], 1)
        return mask[:, -keep:] if keep else mask

    def check_inputs(self, input_ids: Tensor, attention_mask: Tensor | None, token_type_ids: Tensor | None,
                     perm_mask: Tensor | None, target_mapping: Tensor | None, mems: Sequence[Tensor] | None) -> None:
        check_ids(input_ids, self.config.vocab_size)
        batch, length = input_ids.shape
        memory = mems[0].shape[0] if mems else 0
        if attention_mask is not None and memory and tuple(attention_mask.shape) == (batch, memory + length):
            attention_mask = attention_mask[:, memory:]  # [B, M + L]: the memory's visibility first
        for name, value, shape in (("attention_mask", attention_mask, (batch, length)),
                                   ("token_type_ids", token_type_ids, (batch, length)),
                                   ("perm_mask", perm_mask, (batch, length, length))):
            if value is not None and tuple(value.shape) != shape:
                raise InputError(f"{name} must be {list(shape)} for input_ids {list(input_ids.shape)}, got "
                                 f"{list(value.shape)}")
        if target_mapping is not None and (target_mapping.dim() != 3 or target_mapping.shape[0] != batch
                                           or target_mapping.shape[2] != length):
            raise InputError(f"target_mapping must be [batch, num_predict, length] = [{batch}, P, {length}], got "
                             f"{list(target_mapping.shape)}")
        if target_mapping is not None and target_mapping.numel():
            one_hot = ((target_mapping == 0) | (target_mapping == 1)).all() & (target_mapping.sum(-1) <= 1).all() \
                & (target_mapping.sum(1) <= 1).all()
            message = ("target_mapping: each row must be one-hot (prediction p is on one token) or all zeros, and no "
                       "token predicted twice")
            if target_mapping.device.type != "cpu":  # checked on the device: reading the values would wait for it
                torch._assert_async(one_hot, message)
            elif not bool(one_hot):
                raise InputError(message)
        if mems is not None:
            if len(mems) != len(self.layers):
                raise InputError(f"mems holds {len(mems)} layers' memory; the model has {len(self.layers)} layers")
            size = mems[0].shape[0]
            for index, memory in enumerate(mems):
                if memory.dim() != 3 or tuple(memory.shape[1:]) != (batch, self.config.hidden_size) \
                        or memory.shape[0] != size:
                    raise InputError(f"mems[{index}] must be [memory length, batch, hidden] = [{size}, {batch}, "
                                     f"{self.config.hidden_size}] (transformers' layout), got {list(memory.shape)}")

    def packed_streams(self, layout: Layout, input_ids: Tensor, token_type_ids: Tensor | None,
                       perm_mask: Tensor | None, target_mapping: Tensor | None, output_hidden_states: bool
                       ) -> tuple[Tensor | None, Tensor | None, list[Tensor] | None]:
        """The two streams on the real tokens alone (see `layout`), as one joint stream (`Packed`) run by the
        stack's layer loop: h [B, L, H] with zeros at padding (None when the query stream runs: then it is not
        read), g [B, P, H] or None, the content stream's states [B, L, H] when asked."""
        dropout = self.config.hidden_dropout if self.training else 0.0
        packed = self.packed(layout, perm_mask, token_type_ids, target_mapping, self.embeddings.weight.dtype)
        x = self.embeddings(input_ids.flatten()[packed.source])
        if packed.slots:
            x = torch.where(packed.query[:, None], self.mask_embedding.to(x.dtype), x)
        x = fast_dropout(x, dropout, self.training)

        def content_states(x: Tensor) -> Tensor:  # [B, L, H], zeros at padding
            out = x.new_zeros(layout.batch_size * layout.seq_len, x.shape[-1])
            return out.index_copy(0, packed.flat, x[packed.real]).view(layout.batch_size, layout.seq_len, -1)

        states = [content_states(x)] if output_hidden_states else None
        # The last layer's content stream is read only when no query stream runs, or for the hidden states.
        alone = target_mapping is not None and states is None
        x = run_layers(self.layers, range(len(self.layers)), x, AttentionContext(streams=packed), states,
                       to_padded=content_states, last_queries=packed.slot_rows if alone else None)
        if target_mapping is None:
            return states[-1] if states is not None else content_states(x), None, states
        slots = x if alone else x.index_select(0, packed.slot_rows)
        return None, slots[packed.slot_index], states

    def padded_streams(self, input_ids: Tensor, attention_mask: Tensor | None, token_type_ids: Tensor | None,
                       perm_mask: Tensor | None, target_mapping: Tensor | None, mems: Sequence[Tensor] | None,
                       use_mems: bool, output_hidden_states: bool, output_attentions: bool
                       ) -> tuple[Tensor | None, Tensor | None, list[Tensor] | None, list[Tensor], list[Tensor] | None]:
        """The two streams on the padded rows, with a memory, run by the stack's layer loop as one input [B, L + P,
        H] (`PaddedStreams`): h (None when the last layer ran the query stream alone), g, the states, the next
        memory, the content stream's attention probabilities (when asked)."""
        config = self.config
        batch, length = input_ids.shape
        device = input_ids.device
        memory = mems[0].shape[0] if mems else 0
        dropout = config.hidden_dropout if self.training else 0.0
        allowed, query_mask = self.masks(batch, length, memory, attention_mask, perm_mask, device)
        h = fast_dropout(self.embeddings(input_ids), dropout, self.training)
        segments = None
        if token_type_ids is not None:
            keys = token_type_ids if not memory else torch.cat([token_type_ids.new_zeros(batch, memory),
                                                                token_type_ids], 1)
            segments = token_type_ids[:, :, None] != keys[:, None, :]
        positions = fast_dropout(self.relative_positions(length, memory + length, batch, device).to(h.dtype),
                                 dropout, self.training)
        x, slots, keep, columns = h, 0, None, None
        if target_mapping is not None:  # the query stream's rows after the content stream's
            slots = target_mapping.shape[1]
            g = fast_dropout(self.mask_embedding.expand(batch, slots, -1), dropout, self.training)
            targets = self.targets(target_mapping, query_mask, segments, memory, positions.shape[1], h.dtype)
            x = torch.cat([h, g.to(h.dtype)], 1)
            if allowed is not None:
                assert targets.mask is not None
                allowed = torch.cat([allowed.expand(batch, -1, -1), targets.mask], 1)
            if segments is not None:
                assert targets.segments is not None
                segments = torch.cat([segments, targets.segments], 1)
            keep = torch.cat([targets.present.new_ones(batch, 1, length, 1), targets.present], 2)
            columns = targets.columns
        streams = PaddedStreams(length, slots, keep, XLNetScores(self.layers, positions, columns, segments))
        context = AttentionContext(streams=streams, scores=streams.scores, need_weights=output_attentions,
                                   mask=allowed[:, None] if allowed is not None else None,
                                   mems=[m.transpose(0, 1) for m in mems] if mems else ())
        # Every layer's input is kept as the next memory: the loop's states are those inputs (and the last output).
        states = [h] if output_hidden_states or use_mems else None
        probabilities: list[Tensor] | None = [] if output_attentions else None
        alone = slots > 0 and not output_hidden_states
        x = run_layers(self.layers, range(len(self.layers)), x, context, states, probabilities, lambda t: t[:, :length],
                       last_queries=torch.arange(length, length + slots, device=device) if alone else None)
        new_mems = [self.cache(states[index], mems[index] if mems else None) for index in range(len(self.layers))] \
            if use_mems and states is not None else []
        if not output_hidden_states:
            states = None
        if slots:  # the content stream's last output exists only when it ran
            return (None if alone else x[:, :length]), (x if alone else x[:, length:]), states, new_mems, probabilities
        return x, None, states, new_mems, probabilities

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None, *,
                token_type_ids: Tensor | None = None, perm_mask: Tensor | None = None,
                target_mapping: Tensor | None = None, mems: Sequence[Tensor] | None = None,
                use_mems: bool | None = None, labels: Tensor | None = None,
                masked_positions: Tensor | None = None, output_hidden_states: bool = False,
                output_attentions: bool = False) -> XLNetOutput:
        """`attention_mask` [B, L] (0: padding) covers the input; [B, M + L] the memory too (0: a memory position
        hidden, e.g. from another document). `perm_mask` [B, L, L]: 1 where
        query i may not see token j. `target_mapping` [B, P, L]: the P positions the query stream predicts (one-hot
        rows); without it only the content stream runs. `mems`: each layer's memory from an earlier call, [M, B, H].
        `use_mems` (default: the config's use_mems_train or use_mems_eval) returns the next memory. `labels`
        [B, P or L]: the cross-entropy of the primary head's logits (-100 ignored). `output_attentions`: the content
        stream's attention probabilities per layer, [B, heads, L, M + L] (not with `target_mapping`)."""
        self.check_inputs(input_ids, attention_mask, token_type_ids, perm_mask, target_mapping, mems)
        if output_attentions and target_mapping is not None:
            raise InputError("output_attentions gives the content stream's probabilities; with target_mapping the "
                             "query stream runs at the targets only: call without target_mapping")
        config = self.config
        if use_mems is None:
            use_mems = config.use_mems_train if self.training else config.use_mems_eval
        length = input_ids.shape[1]
        memory = mems[0].shape[0] if mems else 0
        dropout = config.hidden_dropout if self.training else 0.0
        layout = self.layout(attention_mask, memory, use_mems, output_attentions)
        if layout is not None:
            h, g, states = self.packed_streams(layout, input_ids, token_type_ids, perm_mask, target_mapping,
                                               output_hidden_states)
            new_mems: list[Tensor] = []
            probabilities: list[Tensor] | None = None
        else:
            h, g, states, new_mems, probabilities = self.padded_streams(
                input_ids, attention_mask, token_type_ids, perm_mask, target_mapping, mems, use_mems,
                output_hidden_states, output_attentions)
        out = fast_dropout(g if g is not None else h, dropout, self.training)  # type: ignore[arg-type]
        result = XLNetOutput(last_hidden_state=out, mems=new_mems if use_mems else None,
                             hidden_states=tuple(states) if states is not None else None,
                             attentions=tuple(probabilities) if probabilities is not None else None)
        if self.head_specs:
            mask = attention_mask[:, -length:] if g is None and attention_mask is not None \
                else out.new_ones(out.shape[:2])
            self.apply_heads(result, HeadInputs(hidden=out, attention_mask=mask, word_embeddings=self.embeddings.weight,
                                                masked_positions=masked_positions,
                                                input_ids=input_ids if g is None else None))
        if labels is not None and result.logits is not None:
            result.loss = F.cross_entropy(result.logits.flatten(0, -2).float(), labels.flatten(), ignore_index=-100)
        return result
