"""DeBERTa's disentangled attention (He et al. 2021) as a score provider of the attention context, and the
convolution some DeBERTa-v2 checkpoints run beside their first layer.

Each layer's scores are content-to-content plus the relative terms `pos_att_type` names, all scaled by
1 / sqrt(d (1 + number of terms)):

    c2p[i, j] = q_i . P_k[delta(i, j)]          (content-to-position: the query against the key's relative position)
    p2c[i, j] = k_j . P_q[delta(i, j)]          (position-to-content: the key against the query's relative position)

P_k and P_q are the layer's projections of one table of relative-position embeddings (2 x span rows, layer-normed
once per forward when `relative_norm`): its own key and query projections (`share_att_key`, DeBERTa-v3) or
projections of their own (`pos_key`, `pos_query` in the block). delta(i, j) = clamp(bucket(i - j) + span, 0,
2 span - 1), `bucket` the identity inside +-position_buckets / 2 and logarithmic beyond, up to
max_relative_positions (`relative_buckets`). delta is odd-symmetric in i - j, so one index serves both terms.

The provider is asked once per group of queries and keys (a packed group of equal lengths, a bucket of padded rows,
the padded batch): it multiplies the group's queries by the rows of P_k that its distances reach (never more than
2 L - 1 of them) and gathers at delta, [N, heads, L_q, L_k] per term, as large as the scores themselves. Only the
table rows that the forward's longest sequence reaches are projected, once per layer call."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from bertology.model.config import TransformerConfig
from bertology.model.dropout import fast_dropout
from bertology.model.heads import activation
from bertology.model.packing import Layout


def relative_buckets(distance: Tensor, buckets: int, max_distance: int) -> Tensor:
    """DeBERTa's log buckets of relative distances (long): the distance itself within (-buckets / 2, buckets / 2)
    (and at +-buckets / 2), beyond it buckets / 2 + ceil(log(|d| / mid) / log((max_distance - 1) / mid) (mid - 1))
    with the distance's sign, mid = buckets / 2; computed in float32 as the published models were."""
    mid = buckets // 2
    size = distance.abs()
    clipped = torch.where(size < mid, torch.full_like(size, mid - 1), size)
    rate = torch.log(torch.tensor((max_distance - 1) / mid, dtype=torch.float32))
    far = torch.ceil(torch.log(clipped / mid) / rate * (mid - 1)) + mid
    return torch.where(clipped <= mid, distance.float(), far * torch.sign(distance)).long()


def relative_index(config: TransformerConfig, distance: Tensor) -> Tensor:
    """Rows of the relative-position table for distances i - j (long): delta = clamp(bucket + span, 0, 2 span - 1)."""
    span = config.relative_span
    bucketed = (relative_buckets(distance, config.position_buckets, config.relative_distance)
                if config.position_buckets > 0 else distance)
    return (bucketed + span).clamp(0, 2 * span - 1)


class RelativeTable(nn.Module):
    """The stack's relative-position embeddings (`table`, 2 x span rows, with `relative_attention`) and their
    optional LayerNorm (`norm`; transformers' configs may name it without the table, which it then holds unused)."""

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        self.config = config
        self.table = nn.Embedding(2 * config.relative_span, config.hidden_size) if config.relative_attention else None
        self.norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps) if config.relative_norm else None

    def scores(self, layers: Sequence[nn.Module], plan: Sequence[int], length: int) -> DisentangledScores:
        """This forward's provider for sequences of at most `length` tokens (the rows their distances reach)."""
        assert self.table is not None
        return DisentangledScores(self, layers, plan, length)


class DisentangledScores:
    """The disentangled terms of one forward (see the module docstring): a `ScoreProvider`."""

    def __init__(self, relative: RelativeTable, layers: Sequence[nn.Module], plan: Sequence[int],
                 length: int) -> None:
        config = relative.config
        self.config, self.layers, self.plan = config, layers, plan
        self.terms = config.pos_att_type
        self.training = relative.training
        self.dropout = config.hidden_dropout
        # The table rows the longest sequence's distances -(length - 1) .. length - 1 reach: a contiguous run,
        # delta being monotonic in the distance.
        reach = max(length, 1) - 1
        ends = relative_index(config, torch.tensor([-reach, reach]))
        self.first, last = int(ends[0]), int(ends[1])
        assert relative.table is not None
        weight = relative.table.weight[self.first:last + 1]
        self.table = relative.norm(weight) if relative.norm is not None else weight
        self.projected: dict[int, dict[str, Tensor]] = {}
        self.indices: dict[tuple[int, int, int, torch.device], tuple[Tensor, Tensor]] = {}

    def projections(self, call: int, like: Tensor) -> dict[str, Tensor]:
        """Layer call `call`'s P_k (c2p) and P_q (p2c), [heads, rows, d] each, once a call (one dropout mask of the
        table a call, as transformers drops it in every layer)."""
        if call not in self.projected:
            layer = self.layers[self.plan[call]]
            table = fast_dropout(self.table, self.dropout, self.training)
            heads, dim = layer.num_heads, layer.head_dim
            shared = self.config.share_att_key
            out = {}
            for term, own, name in (("c2p", "key", "pos_key"), ("p2c", "query", "pos_query")):
                if term in self.terms:
                    module = getattr(layer, own if shared else name)
                    out[term] = module(table.to(like.dtype)).view(-1, heads, dim).transpose(0, 1)
            self.projected[call] = out
        return self.projected[call]

    def index(self, num_queries: int, num_keys: int, query_offset: int, device: torch.device
              ) -> tuple[Tensor, Tensor]:
        """For query i (at query_offset + i) and key j, in [L_q x L_k] order: the flat positions i x rows + delta(i, j)
        in the queries' products with P_k and j x rows + delta(i, j) in the keys' with P_q (delta relative to the
        projected run of rows)."""
        request = (num_queries, num_keys, query_offset, device)
        if request not in self.indices:
            queries = torch.arange(num_queries)[:, None]
            keys = torch.arange(num_keys)[None, :]
            rows = relative_index(self.config, queries + query_offset - keys) - self.first
            if rows.numel() and not (0 <= int(rows.min()) and int(rows.max()) < len(self.table)):
                raise ValueError(f"{num_queries} queries at offset {query_offset} over {num_keys} keys reach "
                                 "distances beyond the forward's longest sequence")
            width = len(self.table)
            self.indices[request] = ((queries * width + rows).flatten().to(device),
                                     (keys * width + rows).flatten().to(device))
        return self.indices[request]

    def bias(self, call: int, q: Tensor, k: Tensor, query_offset: int) -> Tensor:
        num_queries, num_keys = q.shape[-2], k.shape[-2]
        projected = self.projections(call, q)
        by_query, by_key = self.index(num_queries, num_keys, query_offset, q.device)
        scale = (q.shape[-1] * (1 + len(self.terms))) ** -0.5
        batch, heads = q.shape[0], q.shape[1]
        score: Tensor | None = None
        # Each term in heads-first order, [heads, N, L_q x L_k]: the queries (keys) of every row against the rows of
        # P as one product a head (the linear layers' [N, L, heads, d] output read in place), then one gather at
        # the flat positions (`index`).
        if "c2p" in projected:  # q_i . P_k[delta(i, j)]
            by_row = per_head(q) @ projected["c2p"].transpose(-1, -2)  # [heads, N x L_q, rows]
            score = by_row.view(heads, batch, -1).gather(-1, by_query.expand(heads, batch, -1))
        if "p2c" in projected:  # k_j . P_q[delta(i, j)]
            by_row = per_head(k) @ projected["p2c"].transpose(-1, -2)  # [heads, N x L_k, rows]
            term = by_row.view(heads, batch, -1).gather(-1, by_key.expand(heads, batch, -1))
            score = term if score is None else score + term
        if score is None:
            return q.new_zeros(())
        return (score * scale).view(heads, batch, num_queries, num_keys).transpose(0, 1)


def per_head(t: Tensor) -> Tensor:
    """[N, heads, L, d] (a transposed view of [N, L, heads, d], as attention's callers make it) as [heads, N x L, d],
    without a copy when the layout allows it."""
    heads, dim = t.shape[1], t.shape[-1]
    return t.transpose(0, 1).reshape(heads, -1, dim)


class ConvLayer(nn.Module):
    """DeBERTa-v2's convolution beside the first layer: y = LayerNorm(h + act(conv(x_0))), x_0 the first layer's
    input (zeros beyond each sequence's ends), h its output; packed [T, H] with a layout or padded [B, L, H]."""

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        width, size = config.hidden_size, config.conv_kernel_size
        self.conv = nn.Conv1d(width, width, size, padding=(size - 1) // 2, groups=config.conv_groups)
        self.norm = nn.LayerNorm(width, eps=config.layer_norm_eps)
        self.act = activation(config.conv_act)
        self.dropout = config.hidden_dropout

    def forward(self, x: Tensor, h: Tensor, layout: Layout | None, key_mask: Tensor | None) -> Tensor:
        if layout is not None:
            padded = layout.unpack(x)  # zeros at padding
        else:
            padded = x if key_mask is None else x * key_mask[..., None].to(x.dtype)
        out = F.conv1d(padded.transpose(1, 2), self.conv.weight, self.conv.bias, padding=self.conv.padding,
                       groups=self.conv.groups).transpose(1, 2)
        out = layout.pack(out) if layout is not None else out
        return self.norm(h + self.act(fast_dropout(out, self.dropout, self.training)))
