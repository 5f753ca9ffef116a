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

from bertology.data.causal import CausalBatches, LMBatch as LMBatch, lm_batch as lm_batch  # re-exported
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
