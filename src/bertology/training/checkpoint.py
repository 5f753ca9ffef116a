"""Training checkpoints: ``<output_dir>/checkpoints/step-NNNNNNN/`` holding

* the model in the transformers layout (``config.json``, ``model.safetensors``) and the tokenizer files, so
  ``BertForPreTraining.from_pretrained`` (or ``BertForMaskedLM``) loads a checkpoint directly;
* ``trainer_state.safetensors``: every tensor of the trainer state (optimizer moments and steps, objective
  parameters, RNG states of every rank), under path-like keys such as ``optimizer/state/0/exp_avg``;
* ``trainer_state.json``: step, data position (epoch, next batch), tokens seen and the run config at the top level,
  and under ``"trainer"`` the rest of the trainer state, with ``{"__tensor__": key}`` where a tensor was.

Nothing is pickled, so reading a checkpoint someone hands you cannot run code. Checkpoints of older versions, whose
trainer state was a pickled ``trainer_state.pt``, are refused.

A checkpoint is written into a temporary directory, fsynced and renamed into place (``bertology.io``), so a write
killed half way leaves only a hidden ``.step-*.tmp`` directory, which is ignored and cleaned up later.
"""

from __future__ import annotations

import json
import math
import random
import re
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from bertology.errors import CheckpointError
from bertology.io import atomic_directory, clean_stale, remove_output
from bertology.model.checkpoint import NATIVE_FILE, read_state_dict, write_model_files
from bertology.model.protocol import Model

if TYPE_CHECKING:
    from bertology.tokenization import Tokenizer

CHECKPOINTS_DIR = "checkpoints"
STATE_JSON = "trainer_state.json"
STATE_TENSORS = "trainer_state.safetensors"
STATE_PT = "trainer_state.pt"  # the pickle of older versions: never loaded, only recognised to refuse it
MODEL_FILE = "model.safetensors"
FORMAT = 2  # "format" in trainer_state.json; older versions wrote no such key (and trainer_state.pt)
_NAME = re.compile(r"^step-(\d+)$")
_LEFTOVER = re.compile(r"^\.(step-\d+)\.")  # a temporary or moved-aside directory of bertology.io


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


# ---------------------------------------------------------------------------------------------------- RNG states
def capture_rng() -> dict[str, Any]:
    """The RNG states of Python, NumPy and torch (and CUDA if in use), as tensors and plain values only, so that
    the trainer-state serializer stores them without pickling. ``restore_rng`` gives back the same streams."""
    version, internal, gauss_next = random.getstate()
    algorithm, key, pos, has_gauss, cached_gaussian = np.random.get_state(legacy=True)
    state: dict[str, Any] = {
        "python": {"version": version, "state": torch.tensor(internal, dtype=torch.int64),
                   "gauss_next": gauss_next},
        # The key is uint32, which safetensors cannot hold with every torch version: int64 holds it exactly.
        "numpy": {"algorithm": algorithm, "key": torch.from_numpy(key.astype(np.int64)), "pos": int(pos),
                  "has_gauss": int(has_gauss), "cached_gaussian": float(cached_gaussian)},
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict[str, Any]) -> None:
    python = state["python"]
    random.setstate((python["version"], tuple(python["state"].tolist()), python["gauss_next"]))
    numpy = state["numpy"]
    np.random.set_state((numpy["algorithm"], numpy["key"].numpy().astype(np.uint32), numpy["pos"],
                         numpy["has_gauss"], numpy["cached_gaussian"]))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


# ---------------------------------------------------------------------------- trainer state: JSON + safetensors
# JSON holds None, bools, ints, finite floats, strings, lists and dicts with string keys as themselves. Everything
# else becomes a one-key object tagged with one of these keys (a dict that would look like one is stored tagged).
_TENSOR, _TUPLE, _FLOAT, _DICT = "__tensor__", "__tuple__", "__float__", "__dict__"
_TAGS = (_TENSOR, _TUPLE, _FLOAT, _DICT)
_SPECIAL_FLOATS = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


def encode_state(value: Any) -> tuple[Any, dict[str, torch.Tensor]]:
    """Split a nested structure into a JSON-able one and the tensors it held (keyed by where they were).

    Tensors are saved detached, on the CPU, contiguous and with storage of their own (safetensors refuses tensors
    sharing memory). Tuples, dicts with non-string keys (an optimizer's int parameter ids) and nan/inf survive."""
    tensors: dict[str, torch.Tensor] = {}
    storages: set[int] = set()

    def tensor_key(path: tuple[str, ...]) -> str:
        key = "/".join(path) or "tensor"
        unique, n = key, 1
        while unique in tensors:  # {0: t, "0": t} or {"a/b": t, "a": {"b": t}} would otherwise collide
            unique, n = f"{key}#{n}", n + 1
        return unique

    def encode(value: Any, path: tuple[str, ...]) -> Any:
        if value is None or isinstance(value, (bool, int, str)):
            return value
        if isinstance(value, float):
            if math.isfinite(value):
                return value
            return {_FLOAT: "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")}
        if isinstance(value, torch.Tensor):
            tensor = value.detach().cpu().contiguous()
            storage = tensor.untyped_storage()
            if storage.data_ptr() in storages or storage.nbytes() != tensor.nbytes:
                tensor = tensor.clone()
            storages.add(tensor.untyped_storage().data_ptr())
            key = tensor_key(path)
            tensors[key] = tensor
            return {_TENSOR: key}
        if isinstance(value, list):
            return [encode(item, (*path, str(i))) for i, item in enumerate(value)]
        if isinstance(value, tuple):
            return {_TUPLE: [encode(item, (*path, str(i))) for i, item in enumerate(value)]}
        if isinstance(value, dict):
            if all(isinstance(k, str) for k in value) and not (len(value) == 1 and next(iter(value)) in _TAGS):
                return {k: encode(v, (*path, k)) for k, v in value.items()}
            return {_DICT: [[encode(k, (*path, "key")), encode(v, (*path, str(k)))] for k, v in value.items()]}
        where = "/".join(path) or "the top level"
        raise TypeError(f"trainer state at {where}: cannot store a {type(value).__name__} without pickling "
                        "(use tensors, None, bool, int, float, str, lists, tuples and dicts)")

    return encode(value, ()), tensors


def decode_state(value: Any, tensors: dict[str, torch.Tensor]) -> Any:
    """The inverse of ``encode_state``. Raises ValueError on a structure ``encode_state`` does not write."""
    if isinstance(value, list):
        return [decode_state(item, tensors) for item in value]
    if not isinstance(value, dict):
        return value
    if len(value) == 1 and next(iter(value)) in _TAGS:
        (tag, inner), = value.items()
        if tag == _TENSOR:
            if not isinstance(inner, str) or inner not in tensors:
                raise ValueError(f"names tensor {inner!r}, which {STATE_TENSORS} does not hold")
            return tensors[inner]
        if tag == _FLOAT:
            if inner not in _SPECIAL_FLOATS:
                raise ValueError(f"invalid {_FLOAT} value {inner!r} (expected nan, inf or -inf)")
            return _SPECIAL_FLOATS[inner]
        if not isinstance(inner, list):
            raise ValueError(f"{tag} must hold a list, not {type(inner).__name__}")
        if tag == _TUPLE:
            return tuple(decode_state(item, tensors) for item in inner)
        if not all(isinstance(pair, list) and len(pair) == 2 for pair in inner):
            raise ValueError(f"{_DICT} must hold [key, value] pairs")
        try:
            return {decode_state(k, tensors): decode_state(v, tensors) for k, v in inner}
        except TypeError as error:  # an unhashable key
            raise ValueError(f"invalid {_DICT} key: {error}") from None
    return {k: decode_state(v, tensors) for k, v in value.items()}


# ------------------------------------------------------------------------------------------------------- writing
def save_checkpoint(output_dir: str | Path, model: Model, tokenizer: Tokenizer | None, state: TrainingState,
                    trainer_state: dict[str, Any]) -> Path:
    """Write checkpoint ``step-<state.step>`` atomically and return its path."""
    path = checkpoints_dir(output_dir) / f"step-{state.step:07d}"
    with atomic_directory(path) as tmp:
        write_model_files(model, tmp)
        if tokenizer is not None:
            tokenizer.save(tmp)
        write_trainer_state(tmp, state, trainer_state)
    # atomic_directory gives every file the umask's permissions: safetensors writes through a temporary file that
    # is created 0600 and renamed, which would leave model.safetensors and trainer_state.safetensors owner-only.
    return path


def write_trainer_state(directory: Path, state: TrainingState, trainer_state: dict[str, Any]) -> None:
    encoded, tensors = encode_state(trainer_state)
    save_file(tensors, directory / STATE_TENSORS, metadata={"format": "pt"})
    document = {**asdict(state), "format": FORMAT, "trainer": encoded}
    # Written last: a directory with this file is complete (the rename already guarantees it; this is a second
    # line of defence for copies made by other tools).
    text = json.dumps(document, indent=2, allow_nan=False) + "\n"
    (directory / STATE_JSON).write_text(text, encoding="utf-8")


def prune_checkpoints(output_dir: str | Path, keep_last: int) -> list[Path]:
    """Delete all but the newest ``keep_last`` checkpoints, and leftovers of killed writes (``bertology.io``
    decides which are: a previous checkpoint moved aside is put back first, a live writer's are kept)."""
    root = checkpoints_dir(output_dir)
    removed = []
    if root.is_dir():
        targets = {match.group(1) for p in root.glob(".step-*") if (match := _LEFTOVER.match(p.name))}
        for target in sorted(targets):
            removed.extend(clean_stale(root / target))
    for _, path in list_checkpoints(output_dir)[:-keep_last]:
        remove_output(path, ignore_errors=True)  # a link itself, never what it points to
        removed.append(path)
    return removed


# ------------------------------------------------------------------------------------------------------- reading
def read_checkpoint(path: str | Path, model: Model) -> tuple[dict[str, torch.Tensor], TrainingState,
                                                                     dict[str, Any]]:
    """The model weights (in ``model``'s names), the TrainingState and the trainer state of a checkpoint.

    Reads JSON and safetensors only; nothing is unpickled."""
    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"{path}: no such checkpoint directory")
    if (path / STATE_PT).exists() and not (path / STATE_TENSORS).exists():
        raise CheckpointError(f"{path / STATE_PT}: written by an older bertology version in a pickle format that "
                              "bertology no longer loads (loading a pickle can run arbitrary code); "
                              "resume from a checkpoint written by this version")
    native = (path / NATIVE_FILE).is_file()  # heads or extensions transformers has no layout for
    for name in (STATE_JSON, STATE_TENSORS, NATIVE_FILE if native else "config.json", MODEL_FILE):
        if not (path / name).is_file():
            raise CheckpointError(f"{path}: not a training checkpoint (no {name})")
    state, encoded = _read_state_json(path / STATE_JSON)
    try:
        model_state = read_state_dict(path, model)
    except (SafetensorError, OSError) as error:
        raise CheckpointError(f"{path / MODEL_FILE}: cannot be read as safetensors: {_one_line(error)}") from None
    try:
        tensors = load_file(path / STATE_TENSORS)
    except (SafetensorError, OSError) as error:
        raise CheckpointError(f"{path / STATE_TENSORS}: cannot be read as safetensors: {_one_line(error)}") from None
    try:
        trainer_state = decode_state(encoded, tensors)
    except ValueError as error:
        raise CheckpointError(f"{path / STATE_JSON}: invalid trainer state: {error}") from None
    if not isinstance(trainer_state, dict):
        raise CheckpointError(f"{path / STATE_JSON}: invalid trainer state: \"trainer\" is not an object")
    return model_state, state, trainer_state


def _read_state_json(file: Path) -> tuple[TrainingState, Any]:
    try:
        document = json.loads(file.read_text(encoding="utf-8"))
    except ValueError as error:  # JSONDecodeError and UnicodeDecodeError
        raise CheckpointError(f"{file}: invalid JSON: {_one_line(error)}") from None
    if not isinstance(document, dict):
        raise CheckpointError(f"{file}: invalid training state: expected a JSON object")
    version = document.get("format")
    if version != FORMAT:
        if isinstance(version, int) and version > FORMAT:
            raise CheckpointError(f"{file}: written by a newer bertology version (format {version}; this version "
                                  f"reads format {FORMAT})")
        raise CheckpointError(f"{file}: not a trainer state this version writes (\"format\" is {version!r}, "
                              f"expected {FORMAT})")
    if "trainer" not in document:
        raise CheckpointError(f"{file}: invalid training state: no \"trainer\" entry")
    names = {f.name for f in fields(TrainingState)}
    unknown = sorted(set(document) - names - {"format", "trainer"})
    if unknown:
        raise CheckpointError(f"{file}: invalid training state: unknown keys {', '.join(unknown)}")
    values = {k: v for k, v in document.items() if k in names}
    for name in ("step", "epoch", "batch", "tokens"):
        if name in values and (not isinstance(values[name], int) or isinstance(values[name], bool)
                               or values[name] < 0):
            raise CheckpointError(f"{file}: invalid training state: {name} must be a non-negative integer")
    if not isinstance(values.get("config", {}), dict):
        raise CheckpointError(f"{file}: invalid training state: config must be an object")
    return TrainingState(**values), document["trainer"]


def _one_line(error: BaseException) -> str:
    return " ".join(str(error).split())
