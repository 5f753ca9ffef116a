"""Next-sentence prediction: cross-entropy of the pooled [CLS] head against ``next_sentence_labels``
(0 = B follows A, 1 = B is random, BERT's convention). SOP reuses this with another head name."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar, Protocol

import torch.nn.functional as F
from torch import Tensor

from bertology.errors import DataError
from bertology.model.encoder import HeadSpec
from bertology.objectives.base import (
    IGNORE,
    Objective,
    ObjectiveOutput,
    Passes,
    check_objective,
    classification_output,
    classification_summary,
    first_tokens,
)


class SentencePairBatch(Protocol):
    """What NSP reads of a batch: the ids (for its [CLS] rows) and the sentence-relation labels."""

    input_ids: Tensor
    next_sentence_labels: Tensor | None  # [B]; None when the instances are not sentence pairs


def nsp_loss(logits: Tensor, labels: Tensor, reduction: str = "mean") -> Tensor:
    """Cross-entropy of the two-way sentence-relation ``logits [B, 2]`` against ``labels [B]``."""
    return F.cross_entropy(logits.float(), labels, reduction=reduction)


@dataclass
class NextSentence(Objective):
    """NSP on the pooled head ``nsp``. Stats: ``nsp_units`` (sequences), ``nsp_loss_sum``, ``nsp_correct``."""

    static_shapes: ClassVar[bool] = True  # padded rows (label IGNORE) take no loss and count no unit
    weight: float = 1.0
    name: str = "nsp"
    # What the labels say and the instance kind that gives them (for the error when a batch has none).
    label_kind: ClassVar[str] = "next-sentence"
    instance_kind: ClassVar[str] = "nsp"

    def heads(self) -> Sequence[HeadSpec]:
        return (HeadSpec(self.name, "pooled", num_labels=2),)

    def __post_init__(self) -> None:
        check_objective(self)

    def reads(self, batch: SentencePairBatch) -> Tensor:
        return first_tokens(batch)  # the pooler reads [CLS]

    def _labels(self, batch: SentencePairBatch) -> Tensor:
        labels = batch.next_sentence_labels
        if labels is None:
            raise DataError(f"objective {self.name!r} needs {self.label_kind} labels, but the batches have none "
                            f"(data.instances.kind must be {self.instance_kind!r})")
        return labels

    def units(self, batch: SentencePairBatch) -> Tensor:
        return (self._labels(batch) != IGNORE).sum()

    def __call__(self, passes: Passes, batch: SentencePairBatch) -> ObjectiveOutput:
        logits = passes.shared.head_logits[self.name]
        labels = self._labels(batch)
        return classification_output(self.name, logits, labels, nsp_loss(logits, labels, reduction="sum"))

    def summarize(self, totals: Mapping[str, float]) -> dict[str, float]:
        return classification_summary(self.name, totals)
