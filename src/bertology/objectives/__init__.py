"""Training objectives: each turns the model's forward pass(es) over a batch into a loss sum and metric sums.

``OBJECTIVES`` maps a config name to its class (a dataclass whose fields are the objective's options);
``build_objectives`` builds them from the ``objectives`` section of a run config.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from bertology.builtins import Registry
from bertology.config import build_registered
from bertology.objectives.bilm import BidirectionalLM
from bertology.objectives.base import Batch, Objective, ObjectiveOutput, Passes
from bertology.objectives.clm import CausalLM
from bertology.objectives.compose import TrainingLoss
from bertology.objectives.denoise import Denoising
from bertology.objectives.distill import Distillation
from bertology.objectives.electra import Electra
from bertology.objectives.fill_mask import Prediction, fill_mask
from bertology.objectives.mlm import MaskedLM, mlm_loss
from bertology.objectives.nsp import NextSentence, nsp_loss
from bertology.objectives.plm import PermutationLM
from bertology.objectives.prefixlm import PrefixLM
from bertology.objectives.sop import SentenceOrder
from bertology.objectives.span import SpanBoundary

# name -> objective class; the built-in ones are registered from bertology.builtins on first use.
OBJECTIVES: Registry[type] = Registry("objectives")


# Objective fields that are not options: ``name`` is the head's name (the transformers layout depends on it) and
# ``activation`` of the MLM transform follows the model's hidden_act (as in transformers).
FIXED_FIELDS = ("name", "activation")


def build_objectives(spec: Mapping[str, Mapping[str, Any] | None]) -> list[Objective]:
    """One objective per entry ``name -> options``, in order; options are the class's fields (``weight``, ...),
    checked like every config section (unknown keys and wrong types name ``objectives.<name>.<key>``)."""
    return list(build_registered(OBJECTIVES, spec, "objectives", what="objective", exclude=FIXED_FIELDS).values())


__all__ = [
    "OBJECTIVES",
    "BidirectionalLM",
    "Batch",
    "CausalLM",
    "Denoising",
    "Distillation",
    "Electra",
    "MaskedLM",
    "NextSentence",
    "PermutationLM",
    "PrefixLM",
    "SentenceOrder",
    "SpanBoundary",
    "Objective",
    "ObjectiveOutput",
    "Prediction",
    "Passes",
    "TrainingLoss",
    "FIXED_FIELDS",
    "build_objectives",
    "fill_mask",
    "mlm_loss",
    "nsp_loss",
]
