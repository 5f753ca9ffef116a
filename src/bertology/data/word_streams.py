"""Word streams for a bidirectional LM with truncated backpropagation (ELMo's pretraining; the instance kind
``word-stream``).

Each epoch the documents are shuffled (a function of the seed and the epoch), every sentence becomes
``<S> words </S>``, and the whole is one stream of words, cut into ``batch_size x world_size`` equal parts, one per
batch row (rank r takes every world_size-th part from r). Batch b holds window b of every part, W words
(``max_seq_length``) that predict the word after each (the forward LM), and window b counted from the end of the
part, whose words predict the word before each (the backward LM, which reads the part from its end). Window b + 1
continues window b in each direction, so the LSTMs' state carries from one batch to the next (`reset` marks each
epoch's first window, where they start from zeros); a batch is a pure function of (epoch, b), so a resumed run reads
the same batches.

Inputs are characters (every word, in the vocabulary or not), targets word ids (`<UNK>` for a word outside it)."""

from __future__ import annotations

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


@dataclass
class BiLMBatch:
    """Forward and backward windows: characters [B, W, C], word masks [B, W] and targets [B, W] (-100: none)."""

    input_ids: Tensor
    attention_mask: Tensor
    backward_input_ids: Tensor
    backward_attention_mask: Tensor
    forward_targets: Tensor
    backward_targets: Tensor
    reset: Tensor  # 0-d bool: the first window of the streams

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
        types: dict[str, int] = {}
        self.documents: list[np.ndarray] = []
        for document in documents:
            ids = [types.setdefault(word, len(types)) for sentence in document
                   for word in (BOS, *vocabulary.split(sentence), EOS)]
            if ids:
                self.documents.append(np.asarray(ids, dtype=np.int64))
        if not self.documents:
            raise DataError("no documents with text to make word streams from")
        words = list(types)
        mapper = CharacterMapper(max_characters)
        self.chars = torch.tensor([mapper.word(w) for w in words], dtype=torch.int16)  # ids < 262 fit
        self.targets = torch.tensor(vocabulary.encode(words), dtype=torch.long)
        self._epoch: tuple[int, np.ndarray] | None = None

    @property
    def num_words(self) -> int:
        return sum(len(d) for d in self.documents)

    def stream(self, epoch: int) -> np.ndarray:
        if self._epoch is None or self._epoch[0] != epoch:
            order = np.arange(len(self.documents))
            if self.shuffle:
                order = np.random.default_rng(derive_seed(self.seed, _STREAM, epoch)).permutation(order)
            self._epoch = (epoch, np.concatenate([self.documents[i] for i in order]))
        return self._epoch[1]

    def part_length(self, batch_size: int, world_size: int) -> int:
        return self.num_words // (batch_size * world_size)

    def num_batches(self, epoch: int, batch_size: int, rank: int = 0, world_size: int = 1,
                    drop_last: bool = True) -> int:
        return max(self.part_length(batch_size, world_size) - 1, 0) // self.window

    def batches(self, epoch: int, batch_size: int, start_batch: int = 0, rank: int = 0, world_size: int = 1,
                drop_last: bool = True) -> Iterator[BiLMBatch]:
        part = self.part_length(batch_size, world_size)
        count = self.num_batches(epoch, batch_size, rank, world_size)
        if count == 0:
            return
        parts = self.stream(epoch)[:part * batch_size * world_size].reshape(batch_size * world_size, part)
        rows = torch.from_numpy(np.ascontiguousarray(parts[rank::world_size]))
        w = self.window
        mask = torch.ones(batch_size, w, dtype=torch.long)
        for b in range(start_batch, count):
            forward = rows[:, b * w:(b + 1) * w]
            backward = rows[:, part - (b + 1) * w:part - b * w]  # in reading order, left to right
            yield BiLMBatch(
                input_ids=self.chars[forward].long(), attention_mask=mask,
                backward_input_ids=self.chars[backward].long(), backward_attention_mask=mask,
                forward_targets=self.targets[rows[:, b * w + 1:(b + 1) * w + 1]],
                backward_targets=self.targets[rows[:, part - (b + 1) * w - 1:part - b * w - 1]],
                reset=torch.tensor(b == 0))
