"""bertology: contextual word representations with BERT-family encoders.

The top-level names are imported on first use, so `import bertology` (and the command line's start-up) does not
load torch until something needs it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"
_EXPORTS = {
    "EncoderConfig": "bertology.model",
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
    from bertology.model import EncoderConfig, EncoderModel, Pretrained, load, preset
    from bertology.pipelines import Pipeline, pipeline


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'bertology' has no attribute {name!r}")
