"""Denoising (sequence-to-sequence) pretraining: L = mean over target tokens of -log P(y_t | y_<t, source).

The encoder reads the corrupted source, the decoder predicts every target token (T5's spans behind their
sentinels, BART's original text) from the ones before it, teacher-forced. Batches are ``Seq2SeqBatch``es
(``bertology.data.seq2seq``): the model computes vocabulary logits only at the target tokens (``masked_positions``),
and the loss is their summed cross-entropy with the number of target tokens as the units."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor

from bertology.data.seq2seq import Seq2SeqBatch
from bertology.model.heads import HeadSpec
from bertology.objectives.base import Objective, ObjectiveOutput, Passes, check_objective
from bertology.objectives.mlm import token_prediction, token_prediction_summary

# The head the decoder predicts with: transformers' lm_head (T5ForConditionalGeneration, BartForConditionalGeneration).
HEAD = "lm"


@dataclass
class Denoising(Objective):
    """Cross-entropy on the decoder's targets, on the tied ``lm`` head. Stats: ``denoise_units`` (target tokens),
    ``denoise_loss_sum``, ``denoise_correct``; metrics ``denoise_loss``, ``denoise_accuracy``, ``perplexity``."""

    weight: float = 1.0
    name: str = "denoise"
    trains: ClassVar[tuple[str, ...]] = ("seq2seq",)
    # The lm head's kind: the model family's (the pretrain recipe sets it; BART's carries final_logits_bias).
    lm_kind: ClassVar[str] = "tied_lm"

    def __post_init__(self) -> None:
        check_objective(self)

    def fit_model_config(self, model_config: Any, lm_kind: str | None) -> None:
        if lm_kind is not None:  # the family's kind of head (BART's carries final_logits_bias)
            self.lm_kind = lm_kind  # type: ignore[misc]

    def heads(self) -> Sequence[HeadSpec]:
        return (HeadSpec(HEAD, self.lm_kind),)

    def reads(self, batch: Seq2SeqBatch) -> None:
        return None  # the encoder's every token (cross-attention reads them all)

    def units(self, batch: Seq2SeqBatch) -> Tensor:
        return torch.tensor(batch.lm_labels.shape[0], dtype=torch.int64)

    def __call__(self, passes: Passes, batch: Seq2SeqBatch) -> ObjectiveOutput:
        return token_prediction(self.name, passes.shared.head_logits[HEAD], batch.lm_labels)

    def summarize(self, totals: Mapping[str, float]) -> dict[str, float]:
        return token_prediction_summary(self.name, totals)
