"""Segment streams for XLNet pretraining with memory (the instance kind ``segment-stream``), as Transformer-XL and
XLNet read their corpora: every row of a batch continues, in the next batch, the text it read in this one, so the
model's memory of a segment (``mems``) is the context of the next.

Each document (its sentences' tokens laid end to end) is cut into consecutive segments of S = ``max_seq_length``
minus the framing's specials tokens (the last one shorter), each framed alone (XLNet: ``segment <sep> <cls>``,
padded on the right). Each epoch the documents are shuffled (a function of the seed and the epoch), their segments
listed in that order, and the list cut into ``batch_size x world_size`` equal runs, one per row (rank r takes every
world_size-th row from r; the last ``len % rows`` segments wait for another epoch). Batch b holds segment b of
every row's run: a row continues its document, or starts the next one, where ``reset`` is true (and at the first
batch, where there is no memory yet). A batch is a pure function of (epoch, b), so a resumed run reads the same
batches; the batch maker (the permutation-LM's) turns each into a training batch, keyed by the segments' ids."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from bertology.data.dataset import BatchMaker, InstanceBatch
from bertology.data.instances import DocumentSource, derive_seed
from bertology.errors import DataError
from bertology.tokenization.framing import Framing

_STREAM = 8  # keeps the document order apart from other streams derived from the same seed


class SegmentStreams:
    """A `BatchSource` of a batch maker's batches over consecutive segments of `source`'s documents; each batch
    gets `reset` [B] (True: the row starts a document)."""

    def __init__(self, source: DocumentSource, special: Framing, max_seq_length: int, make_batch: BatchMaker,
                 seed: int = 0, shuffle: bool = True) -> None:
        self.source, self.special, self.make_batch = source, special, make_batch
        self.seed, self.shuffle = seed, shuffle
        self.room = max_seq_length - special.overhead(False)
        if self.room < 1:
            raise DataError(f"data.instances.max_seq_length: {max_seq_length} tokens leave no room for text beside "
                            f"{special.overhead(False)} special tokens")
        counted = getattr(source, "document_lengths", None)  # shards know their documents' lengths
        lengths = np.asarray(counted() if counted is not None else
                             [sum(len(s) for s in source.document(d)) for d in range(len(source))], dtype=np.int64)
        self.segments = -(-lengths // self.room)  # per document
        if not self.segments.sum():
            raise DataError("no documents with text to make segment streams from")
        self._plan: tuple[tuple[int, int], np.ndarray, np.ndarray] | None = None

    def plan(self, epoch: int, rows: int) -> tuple[np.ndarray, np.ndarray]:
        """For every row and batch, the document it reads and which of its segments ([rows, batches] each)."""
        if self._plan is None or self._plan[0] != (epoch, rows):
            order = np.arange(len(self.segments))
            if self.shuffle:
                order = np.random.default_rng(derive_seed(self.seed, _STREAM, epoch)).permutation(order)
            counts = self.segments[order]
            document = np.repeat(order, counts)
            segment = np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts)
            length = len(document) // rows
            self._plan = ((epoch, rows), document[:rows * length].reshape(rows, length),
                          segment[:rows * length].reshape(rows, length))
        return self._plan[1], self._plan[2]

    def num_batches(self, epoch: int, batch_size: int, rank: int = 0, world_size: int = 1,
                    drop_last: bool = True) -> int:
        return self.plan(epoch, batch_size * world_size)[0].shape[1]

    def batches(self, epoch: int, batch_size: int, start_batch: int = 0, rank: int = 0, world_size: int = 1,
                drop_last: bool = True) -> Iterator[Any]:
        documents, segments = (a[rank::world_size] for a in self.plan(epoch, batch_size * world_size))
        length = documents.shape[1]
        for b in range(start_batch, length):
            rows = [self.segment(int(documents[r, b]), int(segments[r, b])) for r in range(batch_size)]
            width = max(len(ids) for ids, _, _ in rows)
            batch = np.zeros((3, batch_size, width), dtype=np.int64)  # ids, segment ids, word starts
            batch[0] = self.special.fill_id
            mask = np.zeros((batch_size, width), dtype=np.int64)
            for r, (ids, types, starts) in enumerate(rows):
                batch[:, r, :len(ids)] = (ids, types, starts)
                mask[r, :len(ids)] = 1
            # A segment's id: its place in the epoch's list (row r's run starts at r * length).
            ids = torch.from_numpy((np.arange(rank, rank + world_size * batch_size, world_size) * length + b))
            made = self.make_batch(InstanceBatch(
                torch.from_numpy(batch[0]), torch.from_numpy(mask), torch.from_numpy(batch[1]),
                torch.from_numpy(batch[2].astype(bool)), None, ids, epoch))
            reset = torch.from_numpy((segments[:, b] == 0) | (b == 0))
            yield dataclasses.replace(made, reset=reset)

    def segment(self, document: int, index: int) -> tuple[list[int], list[int], list[bool]]:
        """Segment `index` of `document`, framed: its ids, segment ids and word starts (False at specials)."""
        tokens = np.concatenate(self.source.document(document))
        starts = np.concatenate(self.source.word_starts(document))
        part = slice(index * self.room, (index + 1) * self.room)
        framed = self.special.frame(tokens[part].tolist())
        text = framed.spans[0]
        flags = [False] * len(framed.ids)
        flags[text[0]:text[1]] = starts[part].tolist()
        return framed.ids, framed.type_ids, flags
