"""Masked language modelling: L = mean over the selected tokens i of -log P(x_i | corrupted input).

The model computes vocabulary logits only at the selected positions (``masked_positions [N, 2]``), so the cost of
the output layer is N x V, not B x L x V.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

import torch
import torch.nn.functional as F
from torch import Tensor

from bertology.model.encoder import HeadSpec
from bertology.objectives.base import (
    IGNORE,
    Objective,
    ObjectiveOutput,
    Passes,
    check_objective,
    classification_output,
    classification_summary,
    safe_exp,
)


class MaskedBatch(Protocol):
    """What MLM reads of a batch: the selected positions and their original ids."""

    masked_positions: Tensor  # [N, 2] (row, column)
    mlm_labels: Tensor  # [N]


def mlm_loss(logits: Tensor, labels: Tensor, reduction: str = "mean") -> Tensor:
    """Cross-entropy of ``logits [N, V]`` (only at selected positions) against the original ids ``labels [N]``;
    a label ``IGNORE`` (a padded target) takes no loss.

    Computed in float32 at least whatever the autocast dtype, since a bf16 log-softmax over a large vocabulary loses
    precision (float64 logits stay float64). An empty selection gives 0 (sum) rather than NaN.
    """
    if logits.shape[0] == 0:
        return logits.sum() * 0.0
    if reduction == "sum" and logits.dtype == torch.float32 and logits.requires_grad:
        # On CPU a fresh [N, V] buffer costs its page faults (about as long as the log-softmax at BERT's vocabulary):
        # the log-probabilities go over the logits there, unless they are a view or a leaf, whose base or holder
        # would see them change.
        in_place = logits.device.type == "cpu" and logits.grad_fn is not None and logits._base is None
        return _SummedCrossEntropy.apply(logits, labels, in_place)[0]
    logits = logits if logits.dtype == torch.float64 else logits.float()
    return F.cross_entropy(logits, labels, reduction=reduction)


class _SummedCrossEntropy(torch.autograd.Function):
    """``F.cross_entropy(logits, labels, reduction="sum")`` with a leaner backward over the vocabulary: the saved
    log-probabilities become the softmax in place and the labels' entries lose 1, one pass over [N, V], where
    autograd's route (a zero-filled one-hot gradient, then log-softmax's backward) makes three. About half the
    loss's time in an MLM step (benchmarks/RESULTS.md, "Training").

    `in_place`: the log-probabilities are written over the logits (the product that made them does not keep them
    for its backward). The logits tensor then holds log-probabilities: the same softmax, argmax and cross-entropy
    (each row shifted by its log-sum-exp), so what else reads it sees the same predictions, and autograd refuses a
    backward through an operation that saved the logits before. Returns (loss, log-probabilities)."""

    @staticmethod
    def forward(ctx, logits: Tensor, labels: Tensor, in_place: bool) -> tuple[Tensor, Tensor]:
        ctx.set_materialize_grads(False)  # no [N, V] zeros for the unused second output
        log_probs = torch.log_softmax(logits, -1, out=logits) if in_place else torch.log_softmax(logits, -1)
        if in_place:
            ctx.mark_dirty(logits)
        kept = labels != IGNORE
        safe = labels.clamp(min=0)  # an ignored row reads class 0, then counts 0
        ctx.save_for_backward(log_probs, safe, kept)
        return -(log_probs.gather(1, safe[:, None]).squeeze(1) * kept).sum(), log_probs

    @staticmethod
    def backward(ctx, grad: Tensor | None, grad_log_probs: Tensor | None) -> tuple[Tensor | None, None, None]:
        log_probs, safe, kept = ctx.saved_tensors  # a second backward through this graph raises (in-place below)
        extra = None
        if grad_log_probs is not None:  # the log-probabilities were read on: log-softmax's own backward for them
            extra = grad_log_probs - log_probs.exp() * grad_log_probs.sum(-1, keepdim=True)
        if grad is None:
            return extra, None, None
        probs = log_probs.exp_()
        probs[torch.arange(len(safe), device=safe.device), safe] -= 1.0
        out = probs.mul_((grad * kept)[:, None])
        return (out if extra is None else out.add_(extra)), None, None


@dataclass
class MaskedLM(Objective):
    """MLM on the ``mlm`` head. Stats: ``mlm_units`` (selected tokens), ``mlm_loss_sum``, ``mlm_correct``."""

    static_shapes: ClassVar[bool] = True  # padded targets (label IGNORE) take no loss and count no unit
    # The models it trains (bertology.model.registry): the encoders (the BERT family, ModernBERT)
    trains: ClassVar[tuple[str, ...]] = ("encoder",)
    weight: float = 1.0
    activation: str | None = None  # of the head's transform; None: the model's hidden_act (set by the recipe)
    name: str = "mlm"

    def fit_model_config(self, model_config: Any, lm_kind: str | None) -> None:
        if self.activation is None:  # the transform's activation follows the model's (as in transformers)
            self.activation = model_config.hidden_act

    def heads(self) -> Sequence[HeadSpec]:
        return (HeadSpec(self.name, "masked_lm", activation=self.activation or "gelu"),)

    def __post_init__(self) -> None:
        check_objective(self)

    def reads(self, batch: MaskedBatch) -> Tensor:
        return batch.masked_positions  # the head's logits are computed only there

    def units(self, batch: MaskedBatch) -> Tensor:
        return (batch.mlm_labels != IGNORE).sum()

    def __call__(self, passes: Passes, batch: MaskedBatch) -> ObjectiveOutput:
        return token_prediction(self.name, passes.shared.head_logits[self.name], batch.mlm_labels)

    def summarize(self, totals: Mapping[str, float]) -> dict[str, float]:
        return token_prediction_summary(self.name, totals)


def token_prediction(name: str, logits: Tensor, labels: Tensor) -> ObjectiveOutput:
    """Loss sum and stats of predicting tokens: `logits [N, V]` at the N predicted positions, `labels [N]`."""
    return classification_output(name, logits, labels, mlm_loss(logits, labels, reduction="sum"))


def token_prediction_summary(name: str, totals: Mapping[str, float]) -> dict[str, float]:
    """Mean loss, accuracy and perplexity of `token_prediction`'s summed stats."""
    metrics = classification_summary(name, totals)
    metrics["perplexity"] = safe_exp(metrics[f"{name}_loss"])
    return metrics


# Rows of vocabulary logits `linear_token_prediction` computes at once. [128, V] stays in the last-level cache for
# the usual vocabularies, and each piece streams the [V, H] weight and its gradient through memory once: 128 rows
# were 3-12 % faster than 64 (2 CPU threads, V 8,000-32,000, H 64-256) and on par with 256.
LOGIT_ROWS = 128


class _LinearCrossEntropy(torch.autograd.Function):
    """The summed cross-entropy of `F.linear(hidden, weight, bias)` against `labels` (IGNORE: no loss) and the
    number of rows whose label has the largest logit, without the [N, V] logits: rows go LOGIT_ROWS at a time, their
    logits staying in the cache, and each one's gradients are made as it goes (the loss is a sum: backward only
    scales them). The same products as logits then loss; a few passes over [N, V] in memory fewer."""

    @staticmethod
    def forward(ctx: Any, hidden: Tensor, weight: Tensor, bias: Tensor | None, labels: Tensor,
                gradients: bool) -> tuple[Tensor, Tensor]:
        loss = hidden.new_zeros(())
        correct = torch.zeros((), dtype=torch.long, device=hidden.device)
        grad_hidden = torch.empty_like(hidden) if gradients else None
        grad_weight = None  # the first piece's product, then each next one added in place
        grad_bias = torch.zeros_like(bias) if gradients and bias is not None else None
        # one buffer for every piece's logits: a fresh [rows, V] tensor per piece is fresh memory, paged in anew
        logits = hidden.new_empty(min(LOGIT_ROWS, len(hidden)), weight.shape[0])
        for start in range(0, len(hidden), LOGIT_ROWS):
            rows, y = hidden[start:start + LOGIT_ROWS], labels[start:start + LOGIT_ROWS]
            kept, safe = y != IGNORE, y.clamp(min=0)  # an ignored row reads class 0, then counts 0
            z = logits[:len(rows)]
            if bias is not None:
                torch.addmm(bias, rows, weight.t(), out=z)
            else:
                torch.mm(rows, weight.t(), out=z)
            z -= z.amax(1, keepdim=True)
            picked = z.gather(1, safe[:, None]).squeeze(1)
            correct += ((picked == 0) & kept).sum()
            total = z.exp_().sum(1)
            loss += ((total.log() - picked) * kept).sum()
            if gradients:  # softmax - one-hot, at the kept rows
                z.mul_((kept / total)[:, None])
                z[torch.arange(len(y), device=z.device), safe] -= kept.to(z.dtype)
                torch.mm(z, weight, out=grad_hidden[start:start + LOGIT_ROWS])
                if grad_weight is None:
                    grad_weight = torch.mm(z.t(), rows)
                else:
                    grad_weight.addmm_(z.t(), rows)
                if grad_bias is not None:
                    grad_bias += z.sum(0)
        if gradients and grad_weight is None:  # no rows
            grad_weight = torch.zeros_like(weight)
        ctx.save_for_backward(grad_hidden, grad_weight, grad_bias)
        ctx.mark_non_differentiable(correct)
        return loss, correct

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, grad: Tensor, _: Tensor) -> tuple[Tensor | None, ...]:
        grad_hidden, grad_weight, grad_bias = ctx.saved_tensors
        if grad_hidden is None:
            raise RuntimeError("linear_token_prediction ran without gradients (no_grad or no input needing them)")
        return (grad_hidden * grad, grad_weight * grad, grad_bias * grad if grad_bias is not None else None, None,
                None)


def linear_prediction_applies(weight: Tensor) -> bool:
    """Whether `linear_token_prediction` serves a vocabulary matrix `weight`: on CPU in fp32 without autocast (on a
    GPU its pieces would be many small kernels; under autocast the logits' own path keeps the low precision)."""
    return weight.device.type == "cpu" and weight.dtype == torch.float32 and not torch.is_autocast_enabled("cpu")


def linear_token_prediction(name: str, hidden: Tensor, weight: Tensor, bias: Tensor | None,
                            labels: Tensor) -> ObjectiveOutput:
    """`token_prediction` of the logits `F.linear(hidden [N, H], weight [V, H], bias [V])` without making them
    (`_LinearCrossEntropy`; fp32). A row counts as correct when its label's logit is the largest (argmax's, but for
    exact ties)."""
    gradients = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (hidden, weight, bias))
    loss, correct = _LinearCrossEntropy.apply(hidden, weight, bias, labels, gradients)
    return ObjectiveOutput(loss, {f"{name}_units": (labels != IGNORE).sum(), f"{name}_loss_sum": loss.detach(),
                                  f"{name}_correct": correct})
