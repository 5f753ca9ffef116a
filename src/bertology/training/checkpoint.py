"""Training checkpoints: ``<output_dir>/checkpoints/step-NNNNNNN/`` holding

* the model in the transformers layout (``config.json``, ``model.safetensors``) and the tokenizer files, so
  ``BertForPreTraining.from_pretrained`` (or ``BertForMaskedLM``) loads a checkpoint directly;
* ``trainer_state.pt``: optimizer, scheduler, RNG states of every rank, parameters owned by objectives;
* ``trainer_state.json``: step, data position (epoch, next batch), tokens seen, and the run config.

A checkpoint is written into a temporary directory, fsynced and renamed into place (``bertology.io``), so a write
killed half way leaves only a hidden ``.step-*.tmp`` directory, which is ignored and cleaned up later.
"""

from __future__ import annotations

import json
import random
import re
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bertology.errors import CheckpointError
from bertology.io import atomic_directory
from bertology.model.checkpoint import ENCODER_NAMES, read_weights, to_state_dict, write_model_files
from bertology.model.encoder import EncoderModel

CHECKPOINTS_DIR = "checkpoints"
STATE_JSON = "trainer_state.json"
STATE_PT = "trainer_state.pt"
_NAME = re.compile(r"^step-(\d+)$")


@dataclass
class TrainingState:
    """Where a run is: optimizer steps done, the next micro-batch to read (``epoch``, ``batch``), tokens seen."""

    step: int = 0
    epoch: int = 0
    batch: int = 0
    tokens: int = 0
    config: dict[str, Any] = field(default_factory=dict)


def checkpoints_dir(output_dir: str | Path) -> Path:
    return Path(output_dir) / CHECKPOINTS_DIR


def list_checkpoints(output_dir: str | Path) -> list[tuple[int, Path]]:
    """Complete checkpoints as (step, path), oldest first. Half-written temporary directories are not listed."""
    root = checkpoints_dir(output_dir)
    if not root.is_dir():
        return []
    found = []
    for path in root.iterdir():
        match = _NAME.match(path.name)
        if match and path.is_dir() and (path / STATE_JSON).is_file():
            found.append((int(match.group(1)), path))
    return sorted(found)


def latest_checkpoint(output_dir: str | Path) -> Path | None:
    checkpoints = list_checkpoints(output_dir)
    return checkpoints[-1][1] if checkpoints else None


def capture_rng() -> dict[str, Any]:
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(output_dir: str | Path, model: EncoderModel, tokenizer: Any, state: TrainingState,
                    trainer_state: dict[str, Any]) -> Path:
    """Write checkpoint ``step-<state.step>`` atomically and return its path."""
    path = checkpoints_dir(output_dir) / f"step-{state.step:07d}"
    with atomic_directory(path) as tmp:
        write_model_files(model, tmp)
        if tokenizer is not None:
            tokenizer.save(tmp)
        write_trainer_state(tmp, state, trainer_state)
    return path


def write_trainer_state(directory: Path, state: TrainingState, trainer_state: dict[str, Any]) -> None:
    torch.save(trainer_state, directory / STATE_PT)
    # Written last: a directory with this file is complete (the rename already guarantees it; this is a second
    # line of defence for copies made by other tools).
    (directory / STATE_JSON).write_text(json.dumps(asdict(state), indent=2) + "\n", encoding="utf-8")


def prune_checkpoints(output_dir: str | Path, keep_last: int) -> list[Path]:
    """Delete all but the newest ``keep_last`` checkpoints, and leftovers of interrupted writes."""
    removed = []
    for _, path in list_checkpoints(output_dir)[:-keep_last]:
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    root = checkpoints_dir(output_dir)
    if root.is_dir():
        for leftover in root.glob(".step-*"):
            shutil.rmtree(leftover, ignore_errors=True)
            removed.append(leftover)
    return removed


def read_checkpoint(path: str | Path, model: EncoderModel) -> tuple[dict[str, torch.Tensor], TrainingState,
                                                                     dict[str, Any]]:
    """The model weights (in ``model``'s names), the TrainingState and the trainer state of a checkpoint."""
    path = Path(path)
    for name in (STATE_JSON, STATE_PT, "config.json"):
        if not (path / name).is_file():
            raise CheckpointError(f"{path}: not a training checkpoint (no {name})")
    try:
        state = TrainingState(**json.loads((path / STATE_JSON).read_text(encoding="utf-8")))
    except (json.JSONDecodeError, TypeError) as error:
        raise CheckpointError(f"{path / STATE_JSON}: invalid training state: {error}") from None
    weights = read_weights(path)
    prefix = ENCODER_NAMES[model.config.family]["prefix"] + "."
    prefixed = any(k.startswith(prefix) for k in weights)
    model_state = to_state_dict(model, weights, prefixed, str(path))
    trainer_state = torch.load(path / STATE_PT, map_location="cpu", weights_only=False)
    return model_state, state, trainer_state
