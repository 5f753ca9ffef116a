"""The objective protocol: an objective turns one forward pass and its batch into a summed loss and metric sums.

Losses are returned as *sums* over the objective's prediction units (masked tokens for MLM, sequences for NSP)
together with the number of units, and the trainer divides by the unit count of the whole effective batch (all
micro-batches, all ranks). So the gradient is that of the mean over the effective batch, whatever the split into
micro-batches and processes, and a run on 2 processes x batch b matches one process x batch 2b.

Objectives that own parameters (a span-boundary head, a replaced-token generator) are also ``nn.Module``s; the
training module registers them so that their parameters are optimised, checkpointed and wrapped by DDP.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import torch
from torch import Tensor

from bertology.model.encoder import EncoderOutput, HeadSpec


@dataclass
class ObjectiveOutput:
    """``loss_sum``: differentiable sum over the batch's units; ``stats``: detached sums (``units`` among them)."""

    loss_sum: Tensor
    stats: dict[str, Tensor] = field(default_factory=dict)


@runtime_checkable
class Objective(Protocol):
    """A pretraining objective, composed with others by name and weight (see ``bertology.objectives.build``)."""

    name: str
    weight: float

    def heads(self) -> Sequence[HeadSpec]:
        """Heads the model needs for this objective (created by the model, saved in its checkpoint)."""
        ...

    def forward_kwargs(self, batch: Any) -> dict[str, Any]:
        """Extra keyword arguments this objective needs in the model's forward (e.g. ``masked_positions``)."""
        ...

    def units(self, batch: Any) -> Tensor:
        """Number of prediction units in ``batch`` (a 0-d int64 tensor), known before the forward pass."""
        ...

    def __call__(self, output: EncoderOutput, batch: Any) -> ObjectiveOutput:
        """Loss sum and metric sums for ``batch`` from the model's ``output``."""
        ...

    def summarize(self, totals: Mapping[str, float]) -> dict[str, float]:
        """Readable metrics (means, accuracies) from stats summed over batches and ranks."""
        ...


def ratio(numerator: float, denominator: float) -> float:
    return numerator / denominator if denominator else float("nan")


def safe_exp(x: float) -> float:
    """exp that saturates to inf instead of raising (perplexity of an untrained model)."""
    try:
        return math.exp(x)
    except OverflowError:
        return float("inf")


def count(n: int | Tensor) -> Tensor:
    return n.detach().to(torch.int64) if isinstance(n, Tensor) else torch.tensor(n, dtype=torch.int64)


def classification_output(name: str, logits: Tensor, labels: Tensor, loss_sum: Tensor) -> ObjectiveOutput:
    """The stats every classification-style objective reports: ``{name}_units``, ``_loss_sum``, ``_correct``."""
    with torch.no_grad():
        correct = (logits.argmax(-1) == labels).sum()
    return ObjectiveOutput(loss_sum, {
        f"{name}_units": torch.tensor(labels.shape[0], dtype=torch.int64, device=logits.device),
        f"{name}_loss_sum": loss_sum.detach().float(),
        f"{name}_correct": correct,
    })


def classification_summary(name: str, totals: Mapping[str, float]) -> dict[str, float]:
    """Mean loss and accuracy from the summed stats of ``classification_output``."""
    units = totals.get(f"{name}_units", 0.0)
    return {
        f"{name}_loss": ratio(totals.get(f"{name}_loss_sum", 0.0), units),
        f"{name}_accuracy": ratio(totals.get(f"{name}_correct", 0.0), units),
    }
