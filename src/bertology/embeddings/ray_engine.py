"""The corpus run on Ray Data: the shards of the plan as a dataset, mapped by an actor pool of encoders.

Each actor loads the model once (in the run's dtype) and embeds whole shards, reading each shard's texts from its
file at the shard's byte offset (`shards.embed_shard`, the code the local engine runs), so the shards are the same
as a local run's. Vectors and index rows come back to the driver, which writes every shard atomically and keeps the
manifest: only the driver needs the output directory; the model directory and the input files must be readable at
the same paths on every node (a shared file system).

Ray is imported here only, when `--engine ray` is asked for (`pip install -e '.[ray]' from bertology's checkout`).
"""

from __future__ import annotations

import io
import re
import json
import logging
import os
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from bertology.embeddings.shards import CorpusSettings, Shard, embed_shard, load_encoder
from bertology.errors import BertologyError, ConfigError

DEFAULT_WORKERS = 2


class ShardEncoder:
    """A Ray Data callable class: one encoder per actor, one shard per row of its batches."""

    def __init__(self, model_dir: str, root: str, settings: dict[str, Any], threads: int, device: str = "cpu") -> None:
        self.root = Path(root)
        self.settings = CorpusSettings(**settings)
        self.pretrained = load_encoder(Path(model_dir), self.settings.dtype, threads, device)

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        names, vectors, indexes = [], [], []
        for i in range(len(batch["name"])):
            shard = Shard(**{key: _plain(batch[key][i]) for key in Shard.__dataclass_fields__})
            array, rows = embed_shard(self.pretrained, self.root, shard, self.settings)
            buffer = io.BytesIO()
            np.save(buffer, array)  # .npy bytes: exact, and one column type whatever the shard's row count
            names.append(shard.name)
            vectors.append(buffer.getvalue())
            indexes.append(json.dumps(rows, ensure_ascii=False))
        return {"name": np.array(names, dtype=object), "vectors": np.array(vectors, dtype=object),
                "index": np.array(indexes, dtype=object)}


def actor_device(device: Any, gpus_per_worker: float | None, dtype: str) -> tuple[float, str]:
    """The GPUs each actor asks Ray for and the device it runs on: ``cuda`` (the GPU Ray gives the actor) when it
    asks for some, else ``cpu``. `gpus_per_worker` None: 1 when this machine has a GPU and `device` (None or
    "auto", "cpu", "cuda", "cuda:N") is not the CPU (nor the dtype int8, which runs on the CPU), else 0. A GPU
    device without GPUs, the CPU with some, half types without a GPU and int8 with one are errors."""
    import torch

    from bertology.device import FLOAT_DTYPES, HALF_DTYPES

    text = "auto" if device is None else str(device).strip()
    if text not in ("auto", "cpu") and not re.fullmatch(r"cuda(:[0-9]+)?", text):
        raise ConfigError(f"--device: {text!r} is not a device; expected auto, cpu, cuda or cuda:N")
    if gpus_per_worker is None:
        gpus = 1.0 if torch.cuda.is_available() and text != "cpu" and dtype in FLOAT_DTYPES else 0.0
    elif isinstance(gpus_per_worker, bool) or not isinstance(gpus_per_worker, (int, float)) \
            or not 0 <= gpus_per_worker < float("inf") or (gpus_per_worker > 1 and gpus_per_worker % 1):
        raise ConfigError(f"--gpus-per-worker must be a number >= 0, a fraction of one GPU or a whole number of "
                          f"them, got {gpus_per_worker!r}")
    else:
        gpus = float(gpus_per_worker)
    if text == "cpu" and gpus > 0:
        raise ConfigError(f"--gpus-per-worker {gpus_per_worker}: the actors run on the CPU (--device cpu)")
    if text != "auto" and text != "cpu" and gpus == 0:
        raise ConfigError(f"--device {text}: the Ray actors get no GPU; give --gpus-per-worker (e.g. 1 or 0.5)")
    if dtype in HALF_DTYPES and gpus == 0:
        raise ConfigError(f"--dtype {dtype}: half precision runs on a GPU only, and the Ray actors get none "
                          f"(give --gpus-per-worker)")
    if dtype == "int8" and gpus > 0:
        raise ConfigError("--dtype int8: the int8 path runs on the CPU only; drop --gpus-per-worker")
    return gpus, ("cuda" if gpus > 0 else "cpu")


def _bertology_cause(error: BaseException) -> BertologyError | None:
    """The BertologyError inside Ray's wrappers of an actor's exception (RayTaskError.cause, __cause__), if any."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, BertologyError):
            return error
        seen.add(id(error))
        error = getattr(error, "cause", None) or error.__cause__
    return None


def _plain(value: Any) -> Any:
    return value.item() if isinstance(value, np.generic) else value


def run_ray(model_dir: Path, root: Path, pending: list[Shard], settings: CorpusSettings,
            finished: Callable[[Shard, np.ndarray, list[dict]], None], *, address: str | None = None,
            workers: int | None = None, threads: int | None = None, device: Any = None,
            gpus_per_worker: float | None = None) -> None:
    """Embed the `pending` shards on Ray (a running Ray instance if there is one, else `ray.init(address)`: a new
    local instance when `address` is None) with `workers` encoder actors of `threads` CPUs and `gpus_per_worker`
    GPUs each (see `actor_device`), calling `finished(shard, vectors, rows)` on the driver as each shard comes back
    (in any order)."""
    workers = DEFAULT_WORKERS if workers is None else workers
    threads = 1 if threads is None else threads
    for name, value in (("workers", workers), ("threads", threads)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"{name} must be a positive integer, got {value!r}")
    gpus, device = actor_device(device, gpus_per_worker, settings.dtype)
    if not pending:
        return
    try:
        import ray
    except ImportError:
        raise ConfigError("--engine ray needs Ray Data: pip install -e '.[ray]' from bertology's checkout") from None
    started = False
    if not ray.is_initialized():
        try:
            ray.init(address=address, include_dashboard=False, log_to_driver=False, logging_level="ERROR",
                     configure_logging=True)
        except (ConnectionError, TimeoutError, RuntimeError, ValueError) as error:
            raise ConfigError(f"--address {address}: cannot start or join a Ray cluster: {error}") from None
        started = True
    try:
        context = ray.data.DataContext.get_current()
        context.enable_progress_bars = False  # the driver's own bar counts texts
        logging.getLogger("ray.data").setLevel(logging.WARNING)  # no per-run execution plan on the console
        by_name = {shard.name: shard for shard in pending}
        dataset = ray.data.from_items([asdict(shard) for shard in pending], override_num_blocks=len(pending))
        encoded = dataset.map_batches(
            ShardEncoder,
            fn_constructor_kwargs={"model_dir": os.fspath(model_dir), "root": os.fspath(root),
                                   "settings": settings.to_json(), "threads": threads, "device": device},
            batch_size=1,
            compute=ray.data.ActorPoolStrategy(size=workers),
            num_cpus=threads,
            num_gpus=gpus,
            batch_format="numpy",
        )
        try:
            for row in encoded.iter_rows():
                vectors = np.load(io.BytesIO(row["vectors"]), allow_pickle=False)
                finished(by_name[row["name"]], vectors, json.loads(row["index"]))
        except Exception as error:
            cause = _bertology_cause(error)
            if cause is None:
                raise
            raise cause from None  # an actor's bad-input error, as the local engine raises it
    finally:
        if started:
            ray.shutdown()
