"""Objectives composed into one module: the model plus weighted objectives -> one loss per batch."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import Tensor, nn

from bertology.errors import ConfigError
from bertology.model.protocol import Model
from bertology.objectives.base import Batch, Objective, Passes


class TrainingLoss(nn.Module):
    """``model`` plus ``objectives``; ``forward(batch, units)`` returns (weighted loss, detached stats).

    ``units[name]`` is the number of prediction units of objective ``name`` in the whole effective batch (all
    micro-batches and ranks), divided by ``scale`` — the factor by which gradients are later averaged (the world
    size under DDP) — so that the summed gradients equal those of the effective-batch mean. The same module trains
    pretraining objectives (MLM, NSP) and fine-tuning tasks (a classifier's cross-entropy is an objective too).
    """

    def __init__(self, model: Model, objectives: Sequence[Objective]) -> None:
        super().__init__()
        if not objectives:
            raise ConfigError("objectives: at least one objective is needed")
        # An objective made of several losses with units of their own (ELECTRA: the generator's MLM per masked
        # token, replaced-token detection per token) lists them in ``terms()``; each is composed as an objective.
        strays = [type(o).__name__ for o in objectives if not isinstance(o, Objective)]
        if strays:
            raise ConfigError(f"objectives: {strays[0]} does not derive bertology.objectives.Objective, the base "
                              "class that declares the objectives' optional hooks")
        terms = [term for o in objectives for term in o.terms()]
        names = [o.name for o in terms]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise ConfigError(f"objectives: two objectives are named {repeated[0]!r}; their stats would collide")
        self.model = model
        self.objectives = tuple(terms)
        # Objectives with parameters of their own are registered so that they train and checkpoint with the model.
        self.objective_modules = nn.ModuleDict({o.name: o for o in objectives if isinstance(o, nn.Module)})

    def units(self, batch: Batch) -> dict[str, Tensor]:
        return {o.name: o.units(batch) for o in self.objectives}

    def last_layer_at(self, batch: Batch) -> Tensor | None:
        """Where any objective reads the shared pass's last layer (None: somewhere every token is read)."""
        positions = []
        for objective in self.objectives:
            read = objective.reads(batch)
            if read is None:
                return None
            positions.append(read)
        return torch.cat(positions) if positions else None

    def forward(self, batch: Batch, units: Mapping[str, Tensor]) -> tuple[Tensor, dict[str, Tensor]]:
        passes = Passes(self.model, batch, self.last_layer_at(batch))
        total: Tensor | None = None
        stats: dict[str, Tensor] = {}
        for objective in self.objectives:
            result = objective(passes, batch)
            term = result.loss_sum * (objective.weight / units[objective.name].clamp(min=1))
            total = term if total is None else total + term
            stats.update(result.stats)
        assert total is not None
        return total, stats

    def summarize(self, totals: Mapping[str, float]) -> dict[str, float]:
        """Readable metrics of every objective, plus ``loss``: the weighted sum of the objectives' mean losses."""
        metrics: dict[str, float] = {}
        loss = 0.0
        for objective in self.objectives:
            metrics.update(objective.summarize(totals))
            loss += objective.weight * metrics[f"{objective.name}_loss"]
        return {"loss": loss, **metrics}


def stats_to_vector(stats: Mapping[str, Tensor], keys: Sequence[str]) -> Tensor:
    """Stats as one float64 vector in ``keys`` order, for summing over micro-batches and one all-reduce."""
    return torch.stack([stats[k].detach().to(torch.float64) for k in keys])
