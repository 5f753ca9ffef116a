"""bertology: contextual word representations with BERT-family encoders.

The top-level names are imported on first use, so `import bertology` (and the command line's start-up) does not
load torch until something needs it.
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# Passive OpenMP waiting, as the command line has it: with spinning workers (OpenMP's default) every parallel region
# waits on a descheduled partner whenever another process shares the cores (measured on 2 cores with one busy
# process: the encoder 7-14x slower spinning, 2x passive; benchmarks/RESULTS.md, "Under load"). OpenMP reads the
# variable once, when torch loads it, so it is set here only if torch is not imported yet; a value already set (any,
# ACTIVE included) is the user's choice and is kept.
OPENMP_NOTE = (
    "bertology: torch was imported before bertology, so OMP_WAIT_POLICY=PASSIVE could not be applied (OpenMP read the "
    "environment when torch loaded): on a machine shared with other busy processes the model may run several times "
    "slower. Import bertology first, or set OMP_WAIT_POLICY (PASSIVE, or ACTIVE to keep spinning) in the environment "
    "to silence this.")


def _passive_openmp() -> None:
    if "OMP_WAIT_POLICY" in os.environ:
        return
    if "torch" not in sys.modules:
        os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
        return
    import warnings

    warnings.warn(OPENMP_NOTE, RuntimeWarning, stacklevel=3)


_passive_openmp()
_EXPORTS = {
    "TransformerConfig": "bertology.model",
    "EncoderModel": "bertology.model",
    "Pretrained": "bertology.model",
    "load": "bertology.model",
    "preset": "bertology.model",
    "embed": "bertology.embeddings",
    "generate": "bertology.generation",
    "pipeline": "bertology.pipelines",
    "Pipeline": "bertology.pipelines",
}
__all__ = sorted(_EXPORTS)

if TYPE_CHECKING:
    from bertology.embeddings import embed
    from bertology.generation import generate
    from bertology.model import TransformerConfig, EncoderModel, Pretrained, load, preset
    from bertology.pipelines import Pipeline, pipeline


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'bertology' has no attribute {name!r}")
