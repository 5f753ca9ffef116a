"""Positions: learned absolute embeddings (with an offset), fixed sinusoids, rotary positions (RoPE), T5's
relative-position buckets and Transformer-XL's sinusoids of relative distances (XLNet).

Absolute kinds map position ids to vectors added to the token embeddings; the relative kind maps a (query, key)
pair of positions to one additive score bias per head, given to attention (`bias=`); rotary positions rotate each
head's queries and keys by angles proportional to their position (Su et al. 2021), so that their dot product depends
on the distance only: `rotary_tables` once per forward and theta, `apply_rotary` in every block's self-attention."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn


class LearnedPositions(nn.Embedding):
    """A learned vector per position. `offset`: the table's first `offset` rows are never used by position 0 on
    (BART keeps two unused rows; its position p reads row p + 2)."""

    def __init__(self, num_positions: int, width: int, offset: int = 0) -> None:
        super().__init__(num_positions + offset, width)
        self.offset = offset

    def forward(self, position_ids: Tensor) -> Tensor:
        return super().forward(position_ids + self.offset if self.offset else position_ids)


class SinusoidalPositions(nn.Module):
    """Vaswani et al.'s fixed sinusoids: sin on the first half of the width, cos on the second (no parameters)."""

    def __init__(self, num_positions: int, width: int) -> None:
        super().__init__()
        half = width // 2
        frequencies = torch.exp(-math.log(10000.0) * torch.arange(half, dtype=torch.float32) / max(half - 1, 1))
        angles = torch.arange(num_positions, dtype=torch.float32)[:, None] * frequencies[None, :]
        table = torch.zeros(num_positions, width)
        table[:, :half] = torch.sin(angles)
        table[:, half:2 * half] = torch.cos(angles)
        self.register_buffer("table", table, persistent=False)

    def forward(self, position_ids: Tensor) -> Tensor:
        return self.table[position_ids]


def relative_sinusoids(distances: Tensor, width: int) -> Tensor:
    """Transformer-XL's fixed encoding of distances [..., R] -> [..., R, width]: sin(d f_k) on the first half of the
    width, cos(d f_k) on the second, with f_k = 10000 ** (-2k / width)."""
    exponents = torch.arange(0, width, 2, device=distances.device).float() / width
    angles = distances.float()[..., None] * (1 / torch.pow(10000, exponents))
    return torch.cat([angles.sin(), angles.cos()], -1)


def relative_buckets(relative: Tensor, bidirectional: bool, num_buckets: int, max_distance: int) -> Tensor:
    """T5's bucket of each relative position (key minus query): exact buckets for small distances, then
    logarithmically wider ones up to `max_distance`, past which all share the last bucket. Bidirectional buckets
    spend half their number on keys after the query."""
    bucket = torch.zeros_like(relative)
    if bidirectional:
        num_buckets //= 2
        bucket = bucket + (relative > 0).long() * num_buckets
        distance = relative.abs()
    else:
        distance = (-relative).clamp(min=0)
    exact = num_buckets // 2
    scaled = torch.log(distance.float().clamp(min=1) / exact) / math.log(max_distance / exact) * (num_buckets - exact)
    far = (exact + scaled.long()).clamp(max=num_buckets - 1)
    return bucket + torch.where(distance < exact, distance, far)


class RelativePositionBias(nn.Module):
    """One learned score bias per head and relative-position bucket (T5), shared by every layer of a stack."""

    def __init__(self, num_heads: int, num_buckets: int = 32, max_distance: int = 128,
                 bidirectional: bool = True) -> None:
        super().__init__()
        self.embedding = nn.Embedding(num_buckets, num_heads)
        self.num_buckets, self.max_distance, self.bidirectional = num_buckets, max_distance, bidirectional

    def forward(self, num_queries: int, num_keys: int, query_offset: int | None = None) -> Tensor:
        """[heads, Lq, Lk]; queries sit at key positions query_offset.. (default: the last Lq, as with a cache)."""
        offset = num_keys - num_queries if query_offset is None else query_offset
        device = self.embedding.weight.device
        queries = torch.arange(num_queries, device=device)[:, None] + offset
        keys = torch.arange(num_keys, device=device)[None, :]
        buckets = relative_buckets(keys - queries, self.bidirectional, self.num_buckets, self.max_distance)
        return self.embedding(buckets).permute(2, 0, 1)


def rotary_tables(position_ids: Tensor, head_dim: int, theta: float) -> tuple[Tensor, Tensor]:
    """cos and sin of the rotary angles, [..., head_dim] float32 each, for `position_ids` [...]: position p turns
    the pair of dimensions (j, j + head_dim / 2) by p * theta ** (-2j / head_dim) (the half-split convention, as
    GPT-NeoX, Llama and ModernBERT rotate)."""
    if head_dim % 2:
        raise ValueError(f"rotary positions need an even head size, got {head_dim}")
    exponents = torch.arange(0, head_dim, 2, dtype=torch.float32, device=position_ids.device) / head_dim
    inverse = 1.0 / (theta ** exponents)
    angles = position_ids[..., None].float() * inverse
    angles = torch.cat([angles, angles], -1)
    return angles.cos(), angles.sin()


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x [..., head_dim] rotated by the tables (broadcast against x), computed in float32 and returned in x's dtype."""
    y = x.float()
    half = y.shape[-1] // 2
    turned = torch.cat([-y[..., half:], y[..., :half]], -1)
    return (y * cos + turned * sin).to(x.dtype)
