"""Packing: the real tokens of a padded [B, L] batch as one [T, ...] stream, and back.

Every linear layer runs on the packed tokens, so padding costs nothing. Attention needs to know where each sequence
starts and ends in the stream: `Layout.groups` (equal-length sequences side by side, for the per-group loop that is
fastest on CPU) and `Layout.cu_seqlens` / `Layout.max_seqlen` (the cumulative lengths a variable-length kernel
takes on a GPU). `Layout.buckets` merges neighbouring groups into padded rows, for attention with a score bias.

A layout is computed on the host from the mask: one device-to-host copy when the mask lives on a GPU, and none at
all when the caller builds the layout from the CPU mask before moving the batch (`Layout(mask_cpu).to(device)`),
so nothing inside the forward waits for the GPU."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from bertology.errors import InputError


class Layout:
    """Where the real tokens of a padded batch are, and how to pack them into [T] and scatter them back.

    Packed order sorts the sequences by length (stable), so the n sequences of one length are one contiguous slice
    of the packed tokens: attention reads each group as a view, with no gather and no scatter. A sequence's tokens
    keep their order; the mask may have its padding on either side (XLNet pads on the left). With `documents`
    [B, L], every run of equal ids among a row's real tokens is a sequence (the `documents` of the module
    docstring)."""

    def __init__(self, attention_mask: Tensor, documents: Tensor | None = None) -> None:
        self.batch_size, self.seq_len = attention_mask.shape
        self.per_row = documents is None  # one sequence a row: the padded rows are the sequences
        host = attention_mask.detach().to("cpu", torch.bool)  # the one host copy; free for a CPU mask
        if documents is None:
            lengths = host.sum(1)
            order = torch.argsort(lengths, stable=True)
            rows, cols = host[order].nonzero(as_tuple=True)
            flat_index = order[rows] * self.seq_len + cols  # packed token -> position in the flat [B * L]
        else:
            flat_index, lengths, order = self._documents(host, documents)
        self.num_tokens = int(flat_index.numel())
        # No padding and the tokens in row order: pack and unpack are views.
        self.full = self.num_tokens == self.batch_size * self.seq_len and (
            documents is None or bool((flat_index == torch.arange(self.num_tokens)).all()))
        sorted_lengths = lengths[order]
        # (start, count, length) of each group of equal-length sequences in the packed tokens.
        sizes, counts = torch.unique_consecutive(sorted_lengths, return_counts=True)
        self.groups: list[tuple[int, int, int]] = []
        start = 0
        for length, count in zip(sizes.tolist(), counts.tolist()):
            if length > 0:
                self.groups.append((start, count, length))
            start += count * length
        nonempty = sorted_lengths[sorted_lengths > 0]
        self.max_seqlen = int(nonempty.max()) if len(nonempty) else 0
        cu_seqlens = torch.zeros(len(nonempty) + 1, dtype=torch.int32)
        torch.cumsum(nonempty, 0, out=cu_seqlens[1:])
        device = attention_mask.device
        self.flat_index = flat_index.to(device, non_blocking=True)
        self.cu_seqlens = cu_seqlens.to(device, non_blocking=True)  # sequence boundaries in the packed stream

    def _documents(self, host: Tensor, documents: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """(flat index, lengths, order) with each run of one document id among a row's real tokens a sequence."""
        if documents.shape != host.shape:
            raise InputError(f"documents has shape {tuple(documents.shape)}; the attention mask's is "
                             f"{tuple(host.shape)}")
        real = host.reshape(-1).nonzero().squeeze(1)  # real tokens, row-major
        ids = documents.detach().to("cpu").reshape(-1)[real]
        rows = real // self.seq_len
        starts = torch.ones_like(real, dtype=torch.bool)
        starts[1:] = (rows[1:] != rows[:-1]) | (ids[1:] != ids[:-1])
        segment = starts.cumsum(0) - 1  # sequence of each real token
        lengths = torch.bincount(segment, minlength=0)
        order = torch.argsort(lengths, stable=True)
        rank = torch.empty_like(order)
        rank[order] = torch.arange(len(order))
        return real[torch.argsort(rank[segment], stable=True)], lengths, order

    def to(self, device: torch.device | str) -> Layout:
        """This layout with its index tensors on `device` (host facts are unchanged)."""
        moved = object.__new__(Layout)
        moved.__dict__.update(self.__dict__)
        moved.__dict__.pop("_buckets", None)  # their index tensors live on the old device
        moved.flat_index = self.flat_index.to(device, non_blocking=True)
        moved.cu_seqlens = self.cu_seqlens.to(device, non_blocking=True)
        return moved

    def pack(self, padded: Tensor) -> Tensor:
        flat = padded.reshape(self.batch_size * self.seq_len, *padded.shape[2:])
        return flat if self.full else flat[self.flat_index]

    def unpack(self, packed: Tensor) -> Tensor:
        if self.full:
            return packed.view(self.batch_size, self.seq_len, *packed.shape[1:])
        out = packed.new_zeros(self.batch_size * self.seq_len, *packed.shape[1:])
        out[self.flat_index] = packed
        return out.view(self.batch_size, self.seq_len, *packed.shape[1:])

    def buckets(self, overhead: float) -> list[Bucket]:
        """The groups merged into buckets of padded rows, for one dense attention call each (cached per `overhead`).
        Runs of neighbouring groups chosen by `plan_buckets` to minimise the score entries (rows x width^2) plus
        `overhead` per bucket, the cost of one more call in those units. `overhead` 0 gives the groups, an infinite
        one a single bucket."""
        cache = self.__dict__.setdefault("_buckets", {})
        if overhead not in cache:
            runs = plan_buckets([(count, length) for _, count, length in self.groups], lambda n: n * n, overhead)
            cache[overhead] = [Bucket.of(self.groups[i:j], self.flat_index.device) for i, j in runs]
        return cache[overhead]

    def group_positions(self, start: int, count: int, length: int) -> Tensor:
        """The flat [B * L] positions of a group's tokens, [count, length]."""
        return self.flat_index[start:start + count * length].view(count, length)


@dataclass(frozen=True)
class Bucket:
    """Consecutive groups of a packed stream (tokens `start` .. `stop`) as `count` rows padded to `width`: `index`
    [stop - start] places each token in the flat [count x width] rows, `real` [count, width] marks the tokens; both
    None when the bucket is one group (its tokens are the rows already)."""

    start: int
    stop: int
    count: int
    width: int
    index: Tensor | None
    real: Tensor | None

    @staticmethod
    def of(groups: list[tuple[int, int, int]], device: torch.device) -> Bucket:
        start, width = groups[0][0], groups[-1][2]
        count = sum(c for _, c, _ in groups)
        stop = groups[-1][0] + groups[-1][1] * width
        if len(groups) == 1:
            return Bucket(start, stop, count, width, None, None)
        lengths = torch.cat([torch.full((c,), n) for _, c, n in groups])
        real = torch.arange(width)[None, :] < lengths[:, None]
        index = real.reshape(-1).nonzero().squeeze(1)  # row-major: each row's tokens in order, rows in stream order
        return Bucket(start, stop, count, width, index.to(device, non_blocking=True),
                      real.to(device, non_blocking=True))


def plan_buckets(groups: Sequence[tuple[int, int]], row_cost: Callable[[int], float],
                 overhead: float) -> list[tuple[int, int]]:
    """Consecutive runs [i, j) of `groups` ((count, length) by increasing length) to pad to their longest, each run
    one bucket, minimising the buckets' cost: `overhead` each (what one more call costs), plus `row_cost(width)` per
    row padded to `width`. Overhead 0 gives a bucket a group, an infinite one a single bucket."""
    rows = [0]
    for count, _ in groups:
        rows.append(rows[-1] + count)
    best, start = [0.0] + [math.inf] * len(groups), [0] * (len(groups) + 1)
    for j in range(1, len(groups) + 1):
        per_row = row_cost(groups[j - 1][1])
        for i in range(j):
            cost = best[i] + overhead + (rows[j] - rows[i]) * per_row
            if cost < best[j]:
                best[j], start[j] = cost, i
    runs, j = [], len(groups)
    while j:
        runs.append((start[j], j))
        j = start[j]
    return runs[::-1]
