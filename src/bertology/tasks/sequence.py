"""Sentence and sentence-pair tasks (SST-2, CoLA, MRPC, RTE, STS-B, a user's own): examples encoded once into a
deterministic, resumable batch source; the classification and regression objectives; prediction in input order.

A pair is encoded as the tokenizer frames it (``[CLS] a [SEP] b [SEP]`` with segment ids 0/1 for BERT,
``<s> a </s></s> b </s>`` for RoBERTa, ``a <sep> b <sep> <cls>`` for XLNet) and truncated longest-first to
``max_length``; a batch is padded on the tokenizer's side (XLNet's left, so that its classifier reads ``<cls>`` at
the last position, as transformers' does). The classifier reads the
[CLS] position through the family's own head (BERT/ALBERT: the pooler and a linear layer; RoBERTa, ELECTRA,
DistilBERT: dense-activation-linear on the first token), so a fine-tuned model saves in the transformers layout
of ``*ForSequenceClassification``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from bertology.errors import ConfigError, DataError
from bertology.model.checkpoint import HEADS
from bertology.model.config import TransformerConfig
from bertology.model.heads import HeadSpec, head_reads
from bertology.model.protocol import Model
from bertology.objectives.base import (
    Objective,
    ObjectiveOutput,
    Passes,
    check_objective,
    classification_output,
    classification_summary,
    first_tokens,
    ratio,
)
from bertology.tokenization import Tokenizer

CLASSIFIER = "classifier"


def classifier_head(config: TransformerConfig, num_labels: int) -> HeadSpec:
    """The sequence-classification head of the model's family, as transformers builds it (``num_labels`` 1 is
    regression)."""
    table = HEADS.get(config.family, {})
    own = getattr(config, "sentence_head", None)  # a model without a [CLS] token (ELMo) names its own
    if CLASSIFIER not in table and own is not None:
        return HeadSpec(CLASSIFIER, own, num_labels=num_labels)
    if CLASSIFIER not in table:
        raise ConfigError(f"the {config.family} family has no sequence classifier (its heads: "
                          f"{', '.join(table) or 'none'}); an encoder-decoder without one runs GLUE as text-to-text")
    kind, act, _ = table[CLASSIFIER]
    return HeadSpec(CLASSIFIER, kind, num_labels=num_labels, activation=act or config.hidden_act)  # type: ignore[arg-type]


def sentence_reads(head: HeadSpec, batch: TaskBatch) -> Tensor | None:
    """Where a sentence classifier reads the last layer: [CLS] (the pooler, a first-token head), or every token
    (a mean-pooled head; GPT-2's last real token and BART's last EOS, which lie anywhere)."""
    return first_tokens(batch) if head_reads(head.kind) in ("first_token", "pooler") else None


@dataclass
class TaskBatch:
    """A padded batch of encoded examples (on the right, or on the left for a left-padding tokenizer); ``labels``
    are class ids (long) or scores (float), None when the examples are unlabelled; ``example_ids`` index the
    examples as given."""

    input_ids: Tensor
    attention_mask: Tensor
    token_type_ids: Tensor
    labels: Tensor | None
    example_ids: Tensor

    def to(self, device: torch.device | str, non_blocking: bool = False) -> TaskBatch:
        def move(t: Tensor | None) -> Tensor | None:
            return None if t is None else t.to(device, non_blocking=non_blocking)

        return TaskBatch(move(self.input_ids), move(self.attention_mask), move(self.token_type_ids),  # type: ignore[arg-type]
                         move(self.labels), move(self.example_ids))  # type: ignore[arg-type]

    def __len__(self) -> int:
        return self.input_ids.shape[0]


def bucketed_plan(order: np.ndarray, lengths: np.ndarray, rng: np.random.Generator, batch_size: int, rank: int,
                  world_size: int, drop_last: bool, bucket_window: int) -> list[np.ndarray]:
    """The training batches of one epoch from its shuffled ``order`` of examples: whole batches only with
    ``drop_last``, dealt round-robin to ranks, then sorted by ``lengths`` within windows of ``bucket_window``
    batches whose order ``rng`` shuffles, so batches pad little and stay random."""
    if drop_last:
        order = order[: len(order) // (batch_size * world_size) * batch_size * world_size]
    order = order[rank::world_size]
    batches: list[np.ndarray] = []
    span = max(1, bucket_window) * batch_size
    for begin in range(0, len(order), span):
        window = order[begin:begin + span]
        window = window[np.argsort(lengths[window], kind="stable")]
        chunks = [window[i:i + batch_size] for i in range(0, len(window), batch_size)]
        if drop_last:
            chunks = [c for c in chunks if len(c) == batch_size]
        batches.extend(chunks[k] for k in rng.permutation(len(chunks)))
    return batches


class EncodedExamples:
    """Examples tokenised once, as a ``BatchSource``.

    Training order (``shuffle=True``): a permutation seeded by ``(seed, epoch)``, dealt round-robin to ranks, then
    sorted by length within windows of ``bucket_window`` batches whose order is shuffled again, so batches pad
    little and stay random; a batch is a pure function of (epoch, index, rank, world size), so runs resume exactly.
    Without ``shuffle`` (evaluation, prediction) examples are batched in order of length: the least padding.
    ``padding_side`` "left" puts the padding before the tokens (XLNet); ``shift`` gives each row's offset then."""

    def __init__(self, ids: Sequence[Sequence[int]], type_ids: Sequence[Sequence[int]], labels: Tensor | None,
                 pad_id: int, *, shuffle: bool = True, seed: int = 0, bucket_window: int = 50,
                 padding_side: str = "right") -> None:
        if padding_side not in ("right", "left"):
            raise ConfigError(f"padding_side: expected 'right' or 'left', got {padding_side!r}")
        if len(ids) != len(type_ids) or (labels is not None and len(labels) != len(ids)):
            raise DataError(f"EncodedExamples: {len(ids)} id rows, {len(type_ids)} type-id rows and "
                            f"{None if labels is None else len(labels)} labels")
        if not ids:
            raise DataError("EncodedExamples: no examples")
        self.lengths = np.array([len(row) for row in ids], dtype=np.int64)
        self.offsets = np.concatenate([[0], np.cumsum(self.lengths)])
        self.flat_ids = np.fromiter((i for row in ids for i in row), dtype=np.int64, count=int(self.offsets[-1]))
        self.flat_types = np.fromiter((t for row in type_ids for t in row), dtype=np.int64,
                                      count=int(self.offsets[-1]))
        self.labels = labels
        self.pad_id = pad_id
        self.shuffle = shuffle
        self.seed = seed
        self.bucket_window = bucket_window
        self.padding_side = padding_side

    @classmethod
    def from_texts(cls, tokenizer: Tokenizer, texts: Sequence[str], pairs: Sequence[str] | None = None,
                   labels: Tensor | None = None, *, max_length: int, **options: Any) -> EncodedExamples:
        """Tokenise texts (or pairs), truncated longest-first to ``max_length`` tokens, specials included."""
        ids: list[list[int]] = []
        types: list[list[int]] = []
        chunk = 2048  # bounded memory for the tokenizer's batch call on large training sets
        for start in range(0, len(texts), chunk):
            part = list(texts[start:start + chunk])
            pair_part = list(pairs[start:start + chunk]) if pairs is not None else None
            batch = tokenizer.encode_batch(part, pair_part, max_length=max_length)
            ids.extend(e.ids for e in batch.encodings)
            types.extend(e.type_ids for e in batch.encodings)
        return cls(ids, types, labels, tokenizer.fill_id, padding_side=tokenizer.padding_side, **options)

    def __len__(self) -> int:
        return len(self.lengths)

    def _order(self, epoch: int, batch_size: int, rank: int, world_size: int, drop_last: bool) -> list[np.ndarray]:
        if batch_size < 1 or world_size < 1 or not 0 <= rank < world_size:
            raise ConfigError(f"batch_size {batch_size}, rank {rank} of {world_size}: invalid")
        count = len(self)
        if not self.shuffle:
            order = np.argsort(self.lengths, kind="stable")[rank::world_size]
            return [order[i:i + batch_size] for i in range(0, len(order), batch_size)]
        rng = np.random.default_rng([self.seed, epoch])
        return bucketed_plan(rng.permutation(count), self.lengths, rng, batch_size, rank, world_size, drop_last,
                             self.bucket_window)

    def num_batches(self, epoch: int, batch_size: int, rank: int = 0, world_size: int = 1,
                    drop_last: bool = True) -> int:
        return len(self._order(epoch, batch_size, rank, world_size, drop_last))

    def batches(self, epoch: int, batch_size: int, start_batch: int = 0, rank: int = 0, world_size: int = 1,
                drop_last: bool = True) -> Iterator[TaskBatch]:
        plan = self._order(epoch, batch_size, rank, world_size, drop_last)
        return (self.collate(rows) for rows in plan[start_batch:])

    def shift(self, rows: np.ndarray, width: int) -> np.ndarray:
        """Per row, the column of its first token in a batch ``width`` wide: the padding before it (0 on the
        right)."""
        return width - self.lengths[rows] if self.padding_side == "left" else np.zeros(len(rows), dtype=np.int64)

    def layout(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(real, flat)`` [rows, width]: True at the rows' tokens, and each token's index into the flat arrays
        (0 at padding)."""
        lengths = self.lengths[rows]
        width = int(lengths.max())
        token = np.arange(width)[None, :] - self.shift(rows, width)[:, None]
        real = (token >= 0) & (token < lengths[:, None])
        return real, np.where(real, self.offsets[rows][:, None] + token, 0)

    def collate(self, rows: np.ndarray) -> TaskBatch:
        real, flat = self.layout(rows)
        input_ids = np.where(real, self.flat_ids[flat], self.pad_id)
        type_ids = np.where(real, self.flat_types[flat], 0)
        index = torch.from_numpy(rows.astype(np.int64))
        return TaskBatch(torch.from_numpy(input_ids), torch.from_numpy(real.astype(np.int64)),
                         torch.from_numpy(type_ids), None if self.labels is None else self.labels[index], index)


@dataclass
class SequenceClassification(Objective):
    """Cross-entropy of the classifier head against class ids. Stats: ``{name}_units`` (examples),
    ``_loss_sum``, ``_correct``."""

    head: HeadSpec
    weight: float = 1.0
    name: str = CLASSIFIER

    def __post_init__(self) -> None:
        check_objective(self)

    def heads(self) -> Sequence[HeadSpec]:
        return (self.head,)

    def reads(self, batch: TaskBatch) -> Tensor | None:
        return sentence_reads(self.head, batch)

    def units(self, batch: TaskBatch) -> Tensor:
        return torch.tensor(len(batch), dtype=torch.int64)

    def __call__(self, passes: Passes, batch: TaskBatch) -> ObjectiveOutput:
        if batch.labels is None:
            raise DataError(f"objective {self.name!r} needs labels; the batch has none")
        logits = passes.shared.head_logits[self.name]
        loss = F.cross_entropy(logits.float(), batch.labels, reduction="sum")
        return classification_output(self.name, logits, batch.labels, loss)

    def summarize(self, totals: Mapping[str, float]) -> dict[str, float]:
        return classification_summary(self.name, totals)


@dataclass
class SequenceRegression(Objective):
    """Mean squared error of a one-output head against scores (STS-B), as transformers' regression problem type."""

    head: HeadSpec
    weight: float = 1.0
    name: str = CLASSIFIER

    def __post_init__(self) -> None:
        check_objective(self)
        if self.head.num_labels != 1:
            raise ConfigError(f"objectives.{self.name}: regression needs a head with one output, got "
                              f"{self.head.num_labels}")

    def heads(self) -> Sequence[HeadSpec]:
        return (self.head,)

    def reads(self, batch: TaskBatch) -> Tensor | None:
        return sentence_reads(self.head, batch)

    def units(self, batch: TaskBatch) -> Tensor:
        return torch.tensor(len(batch), dtype=torch.int64)

    def __call__(self, passes: Passes, batch: TaskBatch) -> ObjectiveOutput:
        if batch.labels is None:
            raise DataError(f"objective {self.name!r} needs scores; the batch has none")
        predicted = passes.shared.head_logits[self.name].float().squeeze(-1)
        loss = F.mse_loss(predicted, batch.labels.float(), reduction="sum")
        return ObjectiveOutput(loss, {f"{self.name}_units": self.units(batch).to(loss.device),
                                      f"{self.name}_loss_sum": loss.detach()})

    def summarize(self, totals: Mapping[str, float]) -> dict[str, float]:
        return {f"{self.name}_loss": ratio(totals.get(f"{self.name}_loss_sum", 0.0),
                                          totals.get(f"{self.name}_units", 0.0))}


@torch.no_grad()
def predict_logits(model: Model, examples: EncodedExamples, batch_size: int = 64,
                   head: str = CLASSIFIER) -> np.ndarray:
    """The head's logits ``[N, num_labels]`` for every example, in the order the examples were given (batched by
    length on the padding-free path; the last layer runs only at [CLS] where the head reads nothing else)."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    spec = next(spec for spec in model.head_specs if spec.name == head)
    out: np.ndarray | None = None
    try:
        for batch in examples.batches(0, batch_size, drop_last=False):
            batch = batch.to(device)
            inputs = model.forward_inputs(batch)
            read = sentence_reads(spec, batch)
            if read is not None:
                inputs["last_layer_at"] = read
            logits = model(**inputs).head_logits[head].float().cpu().numpy()
            if out is None:
                out = np.zeros((len(examples), logits.shape[-1]), dtype=np.float32)
            out[batch.example_ids.cpu().numpy()] = logits
    finally:
        model.train(was_training)
    assert out is not None
    return out
