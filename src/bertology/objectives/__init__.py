"""Pretraining objectives: each turns the model's output on a batch into a loss sum and metric sums.

``OBJECTIVES`` maps a config name to its class (a dataclass whose fields are the objective's options);
``build_objectives`` builds them from the ``objectives`` section of a run config.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from bertology.errors import ConfigError
from bertology.objectives.base import Objective, ObjectiveOutput
from bertology.objectives.compose import PretrainingLoss
from bertology.objectives.fill_mask import Prediction, fill_mask
from bertology.objectives.mlm import MaskedLM, mlm_loss
from bertology.objectives.nsp import NextSentence, nsp_loss

OBJECTIVES: dict[str, type] = {"mlm": MaskedLM, "nsp": NextSentence}


def build_objectives(spec: Mapping[str, Mapping[str, Any]]) -> list[Objective]:
    """One objective per entry ``name -> options``, in order; options are the class's fields (``weight``, ...)."""
    objectives: list[Objective] = []
    for name, options in spec.items():
        if name not in OBJECTIVES:
            raise ConfigError(f"objectives.{name}: unknown objective; known: {', '.join(OBJECTIVES)}")
        cls = OBJECTIVES[name]
        known = {f.name for f in dataclasses.fields(cls)} - {"name"}
        unknown = sorted(set(options) - known)
        if unknown:
            raise ConfigError(f"objectives.{name}.{unknown[0]}: unknown key; known: {', '.join(sorted(known))}")
        objectives.append(cls(**dict(options)))
    return objectives


__all__ = [
    "OBJECTIVES",
    "MaskedLM",
    "NextSentence",
    "Objective",
    "ObjectiveOutput",
    "Prediction",
    "PretrainingLoss",
    "build_objectives",
    "fill_mask",
    "mlm_loss",
    "nsp_loss",
]
