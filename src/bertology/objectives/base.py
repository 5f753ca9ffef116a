"""The objective protocol: an objective turns the model's forward pass(es) over a batch into a summed loss and
metric sums.

Losses are returned as *sums* over the objective's prediction units (masked tokens for MLM, sequences for NSP)
together with the number of units, and the trainer divides by the unit count of the whole effective batch (all
micro-batches, all ranks). So the gradient is that of the mean over the effective batch, whatever the split into
micro-batches and processes, and a run on 2 processes x batch b matches one process x batch 2b.

Objectives see the model through ``Passes``: ``passes.shared`` is one forward pass of the batch as it is, shared
by every objective that reads it and run at most once; an objective that needs other passes (ELECTRA's generator
then discriminator, a distillation teacher) runs them with ``passes.run(...)`` or with modules of its own.
``reads(batch)`` declares where an objective reads the shared pass's last layer, so the encoder may skip the
last layer everywhere else (pretraining reads only the masked positions and [CLS]).

Objectives that own parameters (a span-boundary head, a replaced-token generator) are also ``nn.Module``s; the
training module registers them so that their parameters are optimised, checkpointed and wrapped by DDP.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import torch
from torch import Tensor

from bertology.model.heads import HeadSpec

if TYPE_CHECKING:
    from bertology.model.protocol import Model


# The folder of a run's output directory that holds its final model: the trainer writes it, and an objective's
# save_with_model writes what it owns beside it (training.trainer re-exports it).
FINAL_MODEL_DIR = "model"
IGNORE = -100  # the label of a target that takes no loss and counts no unit (padding, transformers' convention)


class Batch(Protocol):
    """What the trainer needs of a batch: padded token ids, the real-token mask, and moving to a device.
    Objectives read their own fields (labels, masked positions, ...)."""

    input_ids: Tensor
    attention_mask: Tensor

    def to(self, device: torch.device | str, non_blocking: bool = False) -> Batch: ...


@dataclass
class ObjectiveOutput:
    """``loss_sum``: differentiable sum over the batch's units; ``stats``: detached sums (``units`` among them)."""

    loss_sum: Tensor
    stats: dict[str, Tensor] = field(default_factory=dict)


class Passes:
    """The model's forward passes over one batch, as objectives see them.

    ``shared`` runs the model once, on first use, on the inputs the model itself takes from the batch
    (``model.forward_inputs(batch)``: an encoder reads ids, mask, segments and masked positions; a decoder ids and
    mask), with the last layer computed only at ``last_layer_at`` (the union of what the objectives declared they
    read; None: everywhere)."""

    def __init__(self, model: Model, batch: Batch, last_layer_at: Tensor | None) -> None:
        self.model = model
        self.batch = batch
        self.last_layer_at = last_layer_at

    @functools.cached_property
    def shared(self) -> Any:
        inputs = self.model.forward_inputs(self.batch)
        if self.last_layer_at is not None:
            inputs["last_layer_at"] = self.last_layer_at
        return self.model(**inputs)

    def run(self, *args: Any, **kwargs: Any) -> Any:
        """Another forward pass of the model on other inputs (the model's forward arguments)."""
        return self.model(*args, **kwargs)


class Objective:
    """A training objective, composed with others by name and weight (see ``bertology.objectives.TrainingLoss``).

    Every objective derives this class. It must give ``name`` and ``weight`` (dataclass fields, the options of a
    run config's ``objectives`` section), ``heads``, ``reads``, ``units``, ``summarize`` and ``__call__(passes,
    batch) -> ObjectiveOutput`` (an ``nn.Module`` objective: ``forward``). The rest are optional hooks, declared here
    with what an objective that needs none of them does; the trainer and the recipes call them on every objective."""

    name: str
    weight: float
    # The registered models it trains (``bertology.model.registry`` names; an encoder's subclass counts as one).
    trains: ClassVar[tuple[str, ...]] = ("encoder",)
    # Whether it skips padded targets (label ``IGNORE``) in its loss and unit count, so that batches may be padded
    # to static shapes (CUDA graphs, ``bertology.training.graphs``).
    static_shapes: ClassVar[bool] = False

    def heads(self) -> Sequence[HeadSpec]:
        """Heads the model needs for this objective (created by the model, saved in its checkpoint)."""
        raise NotImplementedError(f"{type(self).__name__}.heads")

    def reads(self, batch: Batch) -> Tensor | None:
        """The ``[N, 2]`` (row, column) positions of the shared pass's last layer this objective reads, its heads'
        inputs included; an empty tensor when it does not read the shared pass, None when it reads every token."""
        raise NotImplementedError(f"{type(self).__name__}.reads")

    def units(self, batch: Batch) -> Tensor:
        """Number of prediction units in ``batch`` (a 0-d int64 tensor), known before the forward pass."""
        raise NotImplementedError(f"{type(self).__name__}.units")

    def summarize(self, totals: Mapping[str, float]) -> dict[str, float]:
        """Readable metrics (means, accuracies) from stats summed over batches and ranks."""
        raise NotImplementedError(f"{type(self).__name__}.summarize")

    # --- optional hooks ---------------------------------------------------------------------------------------

    def terms(self) -> Sequence[Objective]:
        """The losses it is made of, each with units of its own, composed as objectives (ELECTRA: the generator's
        MLM per masked token and replaced-token detection per token); itself alone by default."""
        return (self,)

    def fit_model_config(self, model_config: Any, lm_kind: str | None) -> None:
        """Take what the objective's heads follow of the model it trains, before they are made: the model's
        ``hidden_act`` for a transform whose activation the options leave unset, ``lm_kind`` the kind of
        language-model head the model's family has (None: the family has none registered)."""

    def batch_maker(self, framing: Any, seed: int, max_seq_length: int) -> Any | None:
        """What turns the instances into this objective's batches (permutation LM, causal LM), or None: the run's
        masking or corruption makes them."""
        return None

    def check_tokenizer(self, tokenizer: Any, vocab_size: int, pad_id: int | None = None) -> None:
        """Refuse a run's tokenizer that does not fit (a distillation teacher's must be the run's)."""

    def check_vocabulary(self, vocab_size: int) -> None:
        """Refuse a vocabulary that does not fit, before any step (a sampled softmax's negatives)."""

    def initial_model(self, heads: Sequence[HeadSpec], generator: torch.Generator | None = None) -> Any | None:
        """The model this objective derives from another (a distillation student from its teacher), or None."""
        return None

    def attach(self, model: Any, generator: torch.Generator | None = None) -> Any:
        """Build the modules it trains around ``model`` (ELECTRA's generator shares its embeddings)."""
        return None

    def load_with_model(self, model_dir: str | Path) -> bool:
        """Load what it saved beside the model it continues from (``save_with_model``); whether there was any."""
        return False

    def save_with_model(self, output_dir: str | Path, tokenizer: Any) -> Path | None:
        """Save what it trains beside the model (ELECTRA's generator, SpanBERT's boundary head); where, or None."""
        return None


def check_objective(objective: Any) -> None:
    """The options of a dataclass objective: types as annotated (``bertology.config.validate``), weight >= 0."""
    from bertology.config import validate
    from bertology.errors import ConfigError

    where = f"objectives.{objective.name}"
    validate(objective, where)
    if objective.weight < 0:
        raise ConfigError(f"{where}.weight: must be >= 0, got {objective.weight}")


def first_tokens(batch: Batch) -> Tensor:
    """The (row, 0) position of every row: where [CLS]-reading heads (pooler, NSP, classification) look."""
    rows = torch.arange(batch.input_ids.shape[0], device=batch.input_ids.device)
    return torch.stack([rows, torch.zeros_like(rows)], dim=1)


def ratio(numerator: float, denominator: float) -> float:
    return numerator / denominator if denominator else float("nan")


def safe_exp(x: float) -> float:
    """exp that saturates to inf instead of raising (perplexity of an untrained model)."""
    try:
        return math.exp(x)
    except OverflowError:
        return float("inf")


def count(n: int, device: torch.device) -> Tensor:
    """The int64 scalar `n` on `device`, written by a fill kernel: `torch.tensor(n, device=cuda)` copies from host
    memory and waits for the device (a synchronisation inside the step)."""
    return torch.full((), n, dtype=torch.int64, device=device)


def classification_output(name: str, logits: Tensor, labels: Tensor, loss_sum: Tensor) -> ObjectiveOutput:
    """The stats every classification-style objective reports: ``{name}_units`` (the labels that are not
    ``IGNORE``), ``_loss_sum``, ``_correct``."""
    with torch.no_grad():
        correct = (logits.argmax(-1) == labels).sum()
    return ObjectiveOutput(loss_sum, {
        f"{name}_units": (labels != IGNORE).sum(),
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
