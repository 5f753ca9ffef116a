"""Causal language modelling: L = mean over real positions t with a real successor of -log P(x_{t+1} | x_{<=t}).

A causal batch names the positions that predict (`masked_positions`, as for MLM) and the tokens they predict
(`lm_labels`), so the model computes vocabulary logits only there: the last token of each sequence and padding cost
no output layer."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import torch
from torch import Tensor

from bertology.model.heads import HeadSpec
from bertology.objectives.base import Objective, ObjectiveOutput, Passes, check_objective
from bertology.objectives.mlm import token_prediction, token_prediction_summary

if TYPE_CHECKING:
    from bertology.tokenization.framing import Framing


class CausalBatch(Protocol):
    input_ids: Tensor
    attention_mask: Tensor
    masked_positions: Tensor  # [N, 2] (row, column) of the positions that predict the next token
    lm_labels: Tensor  # [N] the next token at each


@dataclass
class LMBatch:
    """A padded batch of token sequences for causal LM (see `lm_batch`); `documents` [B, L] when rows hold several
    packed documents (the model then attends within each), `instance_ids` [B] when they come from a dataset."""

    input_ids: Tensor
    attention_mask: Tensor
    masked_positions: Tensor
    lm_labels: Tensor
    documents: Tensor | None = None
    instance_ids: Tensor | None = None

    def to(self, device: torch.device | str, non_blocking: bool = False) -> LMBatch:
        return LMBatch(*(None if t is None else t.to(device, non_blocking=non_blocking) for t in (
            self.input_ids, self.attention_mask, self.masked_positions, self.lm_labels, self.documents,
            self.instance_ids)))


def lm_batch(input_ids: Tensor, attention_mask: Tensor | None = None, documents: Tensor | None = None,
             instance_ids: Tensor | None = None) -> LMBatch:
    """The causal-LM targets of a padded batch, vectorised: every real position whose next position is real predicts
    that token (padding on either side). With `documents` [B, L] (an id per token), only a position whose next
    token is of the same document predicts it: the last token of a document does not predict the first of the
    next."""
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids)
    real = attention_mask.bool()
    predicts = real[:, :-1] & real[:, 1:]
    if documents is not None:
        predicts &= documents[:, :-1] == documents[:, 1:]
    rows, cols = predicts.nonzero(as_tuple=True)
    return LMBatch(input_ids, attention_mask, torch.stack([rows, cols], 1), input_ids[rows, cols + 1], documents,
                   instance_ids)


@dataclass
class CausalLM(Objective):
    """Next-token prediction on the tied ``lm`` head. Stats: ``lm_units`` (predicted tokens), ``lm_loss_sum``,
    ``lm_correct``."""

    weight: float = 1.0
    name: str = "lm"
    trains: ClassVar[tuple[str, ...]] = ("decoder",)  # the models it trains (bertology.model.registry)

    def __post_init__(self) -> None:
        check_objective(self)

    def batch_maker(self, special: Framing, seed: int, max_seq_length: int) -> Any:
        """The pretraining batches it reads: next-token targets, confined to documents (``data.causal``)."""
        from bertology.data.causal import CausalBatches

        return CausalBatches()

    def heads(self) -> Sequence[HeadSpec]:
        return (HeadSpec(self.name, "tied_lm"),)

    def reads(self, batch: CausalBatch) -> Tensor:
        return batch.masked_positions

    def units(self, batch: CausalBatch) -> Tensor:
        return torch.tensor(batch.lm_labels.shape[0], dtype=torch.int64)

    def __call__(self, passes: Passes, batch: CausalBatch) -> ObjectiveOutput:
        return token_prediction(self.name, passes.shared.head_logits[self.name], batch.lm_labels)

    def summarize(self, totals: Mapping[str, float]) -> dict[str, float]:
        return token_prediction_summary(self.name, totals)
