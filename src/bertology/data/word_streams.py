"""Word streams for a bidirectional LM with truncated backpropagation (ELMo's pretraining; the instance kind
``word-stream``).

A document is its sentences as ``<S> words </S>``, one stream of n words: the forward LM predicts words 1..n-1
from the words before them, the backward LM words 0..n-2 from the words after them, each in windows of W words
(``max_seq_length``): ceil((n - 1) / W) windows, the forward LM's from the document's start, the backward LM's
from its end. Each epoch the documents are shuffled (a function of the seed and the epoch) and dealt to the
``batch_size x world_size`` batch rows, each to the row with the fewest windows so far (rank r takes every
world_size-th row from r). Batch b holds each row's next window in both directions: window k + 1 of a document
continues window k, so the LSTMs' state carries from one batch to the next within a document, and `reset` marks
the rows where a document starts (the state starts from zeros there). A document's last window is shorter (padding
after its words, masked); a row with no document left is all padding. A batch is a pure function of (epoch, b), so
a resumed run reads the same batches.

Inputs are characters (every word, in the vocabulary or not), targets word ids (`<UNK>` for a word outside it,
-100 at padding)."""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from bertology.data.instances import derive_seed
from bertology.errors import DataError
from bertology.model.elmo import CharacterMapper
from bertology.tokenization.words import BOS, EOS, WordVocabulary

_STREAM = 7  # keeps the document order apart from other streams derived from the same seed
_PAD = 0  # the spelling number of padding: no characters, no target


@dataclass
class BiLMBatch:
    """Forward and backward windows: characters [B, W, C], word masks [B, W], targets [B, W] (-100: none) and the
    rows where a document starts [B]."""

    input_ids: Tensor
    attention_mask: Tensor
    backward_input_ids: Tensor
    backward_attention_mask: Tensor
    forward_targets: Tensor
    backward_targets: Tensor
    reset: Tensor

    def to(self, device: torch.device | str, non_blocking: bool = False) -> BiLMBatch:
        return BiLMBatch(*(t.to(device, non_blocking=non_blocking) for t in (
            self.input_ids, self.attention_mask, self.backward_input_ids, self.backward_attention_mask,
            self.forward_targets, self.backward_targets, self.reset)))


class WordStreams:
    """A `BatchSource` of `BiLMBatch`es over `documents` (lists of sentences of text)."""

    def __init__(self, documents: Iterable[Sequence[str]], vocabulary: WordVocabulary, window: int, seed: int = 0,
                 max_characters: int = 50, shuffle: bool = True) -> None:
        if window < 1:
            raise DataError(f"data.instances.max_seq_length: a window of {window} words")
        self.window, self.seed, self.shuffle = window, seed, shuffle
        types: dict[str | None, int] = {None: _PAD}
        self.documents: list[np.ndarray] = []
        for document in documents:
            ids = [types.setdefault(word, len(types)) for sentence in document
                   for word in (BOS, *vocabulary.split(sentence), EOS)]
            if len(ids) > 1:  # a word alone predicts nothing
                self.documents.append(np.asarray(ids, dtype=np.int64))
        if not self.documents:
            raise DataError("no documents with text to make word streams from")
        mapper = CharacterMapper(max_characters)
        words = list(types)[1:]
        self.chars = torch.tensor([[0] * max_characters] + [mapper.word(w) for w in words], dtype=torch.int16)
        self.targets = torch.tensor([-100, *vocabulary.encode(words)], dtype=torch.long)
        self.windows = [-(-(len(d) - 1) // window) for d in self.documents]
        self._plan: tuple[tuple[int, int], np.ndarray, np.ndarray] | None = None

    @property
    def num_words(self) -> int:
        return sum(len(d) for d in self.documents)

    def plan(self, epoch: int, rows: int) -> tuple[np.ndarray, np.ndarray]:
        """For every row and batch, the document it reads ([rows, batches], -1: none) and which of its windows."""
        if self._plan is None or self._plan[0] != (epoch, rows):
            order = np.arange(len(self.documents))
            if self.shuffle:
                order = np.random.default_rng(derive_seed(self.seed, _STREAM, epoch)).permutation(order)
            loads = [(0, row) for row in range(rows)]
            dealt: list[list[int]] = [[] for _ in range(rows)]
            for d in order.tolist():
                load, row = heapq.heappop(loads)
                dealt[row].append(d)
                heapq.heappush(loads, (load + self.windows[d], row))
            length = max(load for load, _ in loads)
            document = np.full((rows, length), -1, dtype=np.int64)
            window = np.zeros((rows, length), dtype=np.int64)
            for row, docs in enumerate(dealt):
                position = 0
                for d in docs:
                    count = self.windows[d]
                    document[row, position:position + count] = d
                    window[row, position:position + count] = np.arange(count)
                    position += count
            self._plan = ((epoch, rows), document, window)
        return self._plan[1], self._plan[2]

    def num_batches(self, epoch: int, batch_size: int, rank: int = 0, world_size: int = 1,
                    drop_last: bool = True) -> int:
        return self.plan(epoch, batch_size * world_size)[0].shape[1]  # rows beyond the documents are padding

    def batches(self, epoch: int, batch_size: int, start_batch: int = 0, rank: int = 0, world_size: int = 1,
                drop_last: bool = True) -> Iterator[BiLMBatch]:
        count = self.num_batches(epoch, batch_size, rank, world_size)
        if count == 0:
            return
        documents, windows = (a[rank::world_size] for a in self.plan(epoch, batch_size * world_size))
        w = self.window
        for b in range(start_batch, count):
            spelled = np.zeros((4, batch_size, w + 1), dtype=np.int64)  # fwd in, fwd target, bwd in, bwd target
            reset = torch.zeros(batch_size, dtype=torch.bool)
            for row in range(batch_size):
                d = int(documents[row, b])
                if d < 0:
                    continue
                words, k = self.documents[d], int(windows[row, b])
                n = len(words)
                start, stop = k * w, min(k * w + w, n - 1)  # forward: inputs start..stop-1, targets one later
                spelled[0, row, :stop - start] = words[start:stop]
                spelled[1, row, :stop - start] = words[start + 1:stop + 1]
                end = n - k * w  # backward: inputs low..end-1, targets one earlier
                low = max(end - w, 1)
                spelled[2, row, :end - low] = words[low:end]
                spelled[3, row, :end - low] = words[low - 1:end - 1]
                reset[row] = k == 0
            spelled = torch.from_numpy(spelled[:, :, :w])
            yield BiLMBatch(
                input_ids=self.chars[spelled[0]].long(), attention_mask=spelled[0].ne(_PAD).long(),
                backward_input_ids=self.chars[spelled[2]].long(), backward_attention_mask=spelled[2].ne(_PAD).long(),
                forward_targets=self.targets[spelled[1]], backward_targets=self.targets[spelled[3]], reset=reset)
