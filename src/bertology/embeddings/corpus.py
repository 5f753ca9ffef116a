"""Corpus-scale embedding: every file of a directory or glob, embedded in shards that a killed run resumes.

Layout of an output directory (docs/EMBEDDING-AT-SCALE.md):

    OUT/manifest.json                 the run: format, fingerprint (model, settings, input files), the shard plan
    OUT/shards/00000/vectors.npy      [rows, D] float32
    OUT/shards/00000/index.jsonl      one JSON object per row, in row order (see `index_rows`)
    OUT/shards/00001/...

A shard holds up to `shard_size` consecutive texts of one input file and is written as one atomic directory
(`bertology.io.atomic_directory`): it exists complete or not at all, so a resumed run redoes exactly the shards that
are missing. The plan (which texts go to which shard) depends only on the input files and `shard_size`, so a resumed
run, a run on Ray (`ray_engine`) and an uninterrupted run write the same shards.

Input files are read as `embed` reads one file (`files.read_texts`): `lines` (every line is a text, empty ones too)
or `jsonl` (one object per non-blank line, the text under `text_field`; `id_field`, when present, is copied to the
index). Every file is read and checked once before any embedding, so a malformed line stops the run at once,
naming the file and the line.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import sys
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from tqdm.auto import tqdm

from bertology.embeddings.ray_engine import run_ray
from bertology.embeddings.shards import CorpusSettings, Shard, embed_shard, load_encoder, read_entries
from bertology.errors import BertologyError, ConfigError, DataError
from bertology.inputs import load_npy
from bertology.io import atomic_directory, atomic_write, recover

if TYPE_CHECKING:
    import torch

FORMAT_VERSION = 1
MANIFEST = "manifest.json"
SHARDS = "shards"
ENGINES: tuple[str, ...] = ("local", "ray")
GLOB_CHARACTERS = frozenset("*?[")


@dataclass
class CorpusReport:
    """What a call of `embed_corpus` did."""

    output: Path
    shards: int  # in the plan
    written: int  # by this call
    skipped: int  # already complete (a resumed run)
    texts: int  # in all inputs
    dim: int | None = None
    files: list[str] = field(default_factory=list)


def is_corpus_input(spec: str | os.PathLike) -> bool:
    """True for a directory or a glob pattern: what `bertology embed` embeds in corpus mode."""
    path = Path(spec)
    return path.is_dir() or (not path.is_file() and bool(GLOB_CHARACTERS & set(str(spec))))


def find_inputs(spec: str | os.PathLike) -> tuple[Path, list[Path]]:
    """The root directory and the input files of `spec`: a directory (every non-hidden file below it, recursively)
    or a glob pattern (`**` recurses), in sorted order of their paths relative to the root."""
    text = str(spec)
    path = Path(text)
    if path.is_dir():
        root = path
        files = [p for p in path.rglob("*") if p.is_file() and not any(
            part.startswith(".") for part in p.relative_to(path).parts)]
    elif GLOB_CHARACTERS & set(text):
        files = [Path(p) for p in glob.glob(text, recursive=True) if Path(p).is_file()]
        if not files:
            raise DataError(f"{text}: no files match")
        root = Path(os.path.commonpath([str(p.parent.resolve()) for p in files]))
        files = [p.resolve() for p in files]
    elif path.is_file():
        root, files = path.parent, [path]
    else:
        raise DataError(f"{text}: no such file or directory")
    if not files:
        raise DataError(f"{text}: holds no files")
    files.sort(key=lambda p: p.relative_to(root).as_posix())
    return root, files


def plan_shards(root: Path, files: list[Path], settings: CorpusSettings) -> tuple[list[Shard], list[dict[str, Any]]]:
    """The shards of the inputs and a description of each file (relative name, bytes, SHA-256, texts). Reads and
    checks every line of every file."""
    shards: list[Shard] = []
    described: list[dict[str, Any]] = []
    for path in files:
        name = path.relative_to(root).as_posix()
        digest = hashlib.sha256()
        with open(path, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
        count = 0
        for entry in read_entries(path, settings):
            if count % settings.shard_size == 0:
                shards.append(Shard(f"{len(shards):05d}", name, count, 0, entry.line, entry.offset))
            count += 1
        for i in range(len(shards) - 1, -1, -1):  # fill in the counts of this file's shards
            shard = shards[i]
            if shard.file != name:
                break
            shards[i] = Shard(shard.name, name, shard.first, min(settings.shard_size, count - shard.first),
                              shard.line, shard.offset)
        described.append({"file": name, "bytes": path.stat().st_size, "sha256": digest.hexdigest(), "texts": count})
    if not shards:
        raise DataError(f"{root}: the input files hold no texts")
    return shards, described


def write_shard(output: Path, name: str, vectors: np.ndarray, rows: list[dict[str, Any]]) -> None:
    """One shard as an atomic directory: complete, or absent."""
    with atomic_directory(output / SHARDS / name) as tmp:
        with open(tmp / "vectors.npy", "wb") as handle:
            np.save(handle, vectors)
        with open(tmp / "index.jsonl", "w", encoding="utf-8") as handle:
            for row in rows:
                handle.write(json.dumps(row, ensure_ascii=False) + "\n")


def shard_done(output: Path, name: str) -> bool:
    path = output / SHARDS / name
    recover(path)  # a writer killed between moving an old shard aside and renaming the new one in
    return (path / "index.jsonl").is_file() and (path / "vectors.npy").is_file()


def read_manifest(output: str | os.PathLike, error: type[BertologyError] = DataError) -> dict[str, Any]:
    """The manifest of the corpus run in the directory `output`; a missing, unreadable or foreign one is an
    `error` naming the file."""
    output = Path(output)
    path = output / MANIFEST
    if not path.is_file():
        raise error(f"{output}: no {MANIFEST}: not the output of a corpus embedding run")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as cause:
        raise error(f"{path}: not a manifest written by bertology embed ({cause})") from None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("fingerprint"), dict):
        raise error(f"{path}: not a manifest written by bertology embed (no fingerprint)")
    return manifest


def check_output_dir(output: Path, fingerprint: dict[str, Any], resume: bool) -> dict[str, Any] | None:
    """The manifest of the run to resume, None for a fresh run, or a ConfigError: a directory holding something
    else, a run without --resume, a run with other settings (each differing key named)."""
    if output.exists() and not output.is_dir():
        raise ConfigError(f"{output}: is a file; the output of a corpus run is a directory")
    manifest_path = output / MANIFEST
    if not manifest_path.is_file():
        if output.is_dir() and any(not p.name.startswith(".") for p in output.iterdir()):
            raise ConfigError(f"{output}: not empty and holds no embedding run ({MANIFEST}); choose a new or empty "
                              "directory")
        return None
    manifest = read_manifest(output, ConfigError)
    if not resume:
        done = sum(shard_done(output, s["name"]) for s in manifest.get("shards", []))
        raise ConfigError(f"{output}: holds an embedding run ({done} of {len(manifest.get('shards', []))} shards "
                          "done); pass --resume to continue it, or choose another directory")
    old = manifest["fingerprint"]
    differ = []
    for key in sorted(set(old) | set(fingerprint)):
        if old.get(key) != fingerprint.get(key):
            if key == "inputs":
                differ.append(f"inputs ({_changed_files(old.get(key) or [], fingerprint.get(key) or [])})")
            elif key == "model":
                differ.append("model (other files)")
            else:
                differ.append(f"{key} (was {old.get(key)!r}, now {fingerprint.get(key)!r})")
    if differ:
        raise ConfigError(f"{output}: --resume: the run there was made with other settings: {'; '.join(differ)}; "
                          "use the same model, inputs and options, or another directory")
    return manifest


def _changed_files(old: list[dict[str, Any]], new: list[dict[str, Any]]) -> str:
    """Which input files were added, removed or changed between two fingerprints, e.g. "changed: a.txt"."""
    before, after = {d.get("file"): d for d in old}, {d["file"]: d for d in new}
    parts = [f"{what}: {', '.join(sorted(map(str, names)))}" for what, names in (
        ("added", after.keys() - before.keys()), ("removed", before.keys() - after.keys()),
        ("changed", [f for f in after.keys() & before.keys() if after[f] != before[f]])) if names]
    return "; ".join(parts) or "reordered"


def embed_corpus(
    model: str | os.PathLike,
    inputs: str | os.PathLike,
    output: str | os.PathLike,
    settings: CorpusSettings | None = None,
    *,
    resume: bool = False,
    engine: str = "local",
    address: str | None = None,
    workers: int | None = None,
    threads: int | None = None,
    show_progress: bool = False,
    device: str | torch.device | None = None,
    gpus_per_worker: float | None = None,
) -> CorpusReport:
    """Embed every text of `inputs` (a directory, a glob pattern or one file) with the model directory `model`,
    writing shards to the directory `output` (see the module docstring). `resume` continues a run in `output` made
    with the same model, inputs and settings, skipping its complete shards. `engine="ray"` spreads the shards over
    a pool of `workers` encoder actors on the Ray cluster at `address` (`ray_engine.run_ray`); `threads` is the
    torch threads per encoder (default: torch's own for the local engine, 1 per actor on Ray).

    `device` (None: the CPU; "auto", "cpu", "cuda", "cuda:N") is where the local engine runs the model, with
    `settings.dtype` float16 / bfloat16 only on a GPU and int8 only on the CPU (`bertology.device`). On Ray each
    actor asks for `gpus_per_worker` GPUs (fractions share one; default 1 when this machine has a GPU and `device`
    is not "cpu", else 0) and runs on the GPU Ray gives it, or on the CPU without one."""
    settings = settings or CorpusSettings()
    if engine not in ENGINES:
        raise ConfigError(f"engine: unknown {engine!r}; expected one of {', '.join(ENGINES)}")
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
        raise ConfigError(f"threads must be a positive integer, got {threads!r}")
    from bertology.device import placement

    if engine == "local":
        if gpus_per_worker is not None:
            raise ConfigError("gpus_per_worker: for engine='ray' only")
        where = placement(device, settings.dtype, int8=True)
    output = Path(output)
    if output.suffix.lower() in (".npy", ".npz") and not output.is_dir():
        what = "is a directory" if Path(inputs).is_dir() else "is a glob pattern"
        raise ConfigError(f"{inputs}: {what}, not a text file: its files are embedded into a directory of shards "
                          f"(corpus mode), so the output must be a directory, not {output.name}")
    model_dir = Path(model)
    if not model_dir.is_dir():
        raise ConfigError(f"{model_dir}: no such model directory")
    root, files = find_inputs(inputs)
    shards, described = plan_shards(root, files, settings)
    # The model is loaded (and so checked) before anything is written; the Ray actors load their own copies. It is
    # fingerprinted in float32, before any quantization, so the same weights in either checkpoint format match.
    from bertology.model import fingerprint as model_fingerprint
    from bertology.model.quantize import with_dtype

    base = load_encoder(model_dir, "float32", threads if engine == "local" else None)
    fingerprint = {"model": model_fingerprint(base), "inputs": described, **settings.to_json()}
    manifest = check_output_dir(output, fingerprint, resume)
    pretrained = where.move(with_dtype(base, settings.dtype)) if engine == "local" else base
    from bertology.embeddings.core import embed

    forward_dtype = where.float_dtype if engine == "local" else "float32"
    embed(pretrained, ["a"], **settings.embed_options(), dtype=forward_dtype)  # a bad option fails before any write
    if manifest is None:
        manifest = {"format": FORMAT_VERSION, "model": str(model_dir), "root": str(root), "fingerprint": fingerprint,
                    "shards": [asdict(s) for s in shards], "complete": False}
        with atomic_write(output / MANIFEST, "w", encoding="utf-8") as handle:
            json.dump(manifest, handle, indent=1, ensure_ascii=False)
    pending = [s for s in shards if not shard_done(output, s.name)]
    report = CorpusReport(output, len(shards), 0, len(shards) - len(pending), sum(d["texts"] for d in described),
                          files=[d["file"] for d in described])
    bar = tqdm(total=sum(s.count for s in pending), unit="text", disable=not show_progress, dynamic_ncols=True,
               file=sys.stderr)

    def finished(shard: Shard, vectors: np.ndarray, rows: list[dict]) -> None:
        write_shard(output, shard.name, vectors, rows)
        report.written += 1
        report.dim = int(vectors.shape[1])
        bar.update(shard.count)

    with bar:
        if engine == "ray":
            run_ray(model_dir, root, pending, settings, finished, address=address, workers=workers,
                    threads=threads, device=device, gpus_per_worker=gpus_per_worker)
        else:
            for shard in pending:
                finished(shard, *embed_shard(pretrained, root, shard, settings))
    manifest["complete"] = True
    with atomic_write(output / MANIFEST, "w", encoding="utf-8") as handle:
        json.dump(manifest, handle, indent=1, ensure_ascii=False)
    if report.dim is None:
        report.dim = int(load_npy(output / SHARDS / shards[0].name / "vectors.npy").shape[1])
    return report


def load_corpus(output: str | os.PathLike) -> tuple[np.ndarray, list[dict[str, Any]]]:
    """All vectors of a complete corpus run, concatenated in shard order, and their index rows. For corpora that
    fit in memory; otherwise read the shards one by one (`iter_shards`)."""
    parts, rows = [], []
    for _, vectors, index in iter_shards(output):
        parts.append(vectors)
        rows.extend(index)
    return np.concatenate(parts), rows


def iter_shards(output: str | os.PathLike) -> Iterator[tuple[str, np.ndarray, list[dict[str, Any]]]]:
    """(name, vectors, index rows) of every shard of a complete corpus run, in order; the vectors memory-mapped."""
    output = Path(output)
    manifest = read_manifest(output)
    if not manifest.get("complete"):
        raise DataError(f"{output}: the run is not complete; finish it with --resume")
    for shard in manifest["shards"]:
        directory = output / SHARDS / shard["name"]
        vectors = load_npy(directory / "vectors.npy")
        try:
            with open(directory / "index.jsonl", encoding="utf-8") as handle:
                index = [json.loads(line) for line in handle]
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as error:
            raise DataError(f"{directory / 'index.jsonl'}: cannot read it: {error}") from None
        if vectors.ndim != 2 or len(index) != len(vectors):
            raise DataError(f"{directory}: {len(vectors)} vectors but {len(index)} index rows")
        yield shard["name"], vectors, index
