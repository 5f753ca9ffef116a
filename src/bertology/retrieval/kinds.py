"""Index kinds: ``dense`` (faiss over sentence vectors, `bertology.retrieval.index`), ``bm25`` (bm25s,
`bertology.retrieval.sparse`) and ``hybrid`` (both, fused, `bertology.retrieval.hybrid`).

Every index directory's ``index.json`` records its kind (an index written before kinds existed is dense). Each kind's
class is registered by name (`register_index_kind(name, cls)`; the built-ins from `bertology.builtins`); `load_index(directory)` reads the recorded kind and
loads the directory with that class, and `load_index(directory, kind=...)` (the CLI's ``--kind``) refuses an index
of another kind (`IndexKindError`, naming the file and both kinds) instead of searching it as something it is not.
A kind's class has `load(directory, model=None, device=, dtype=)`, `search(queries, k)`, `rank(queries, depth)`
(scores and rows, best first), `passages`, and, when it embeds queries, `model_path` and `attach(model)`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from bertology.builtins import Registry
from bertology.errors import ConfigError, DataError
from bertology.inputs import json_value
from bertology.io import recover

META_FILE = "index.json"
FORMAT = "bertology-index"  # what index.json's "format" says, and its version
VERSION = 1


class IndexKindError(ConfigError):
    """An index of one kind (dense, bm25, hybrid) is opened or searched as another."""


def register_index_kind(name: str, cls: type) -> type:
    """Make `cls` the class that loads and searches index directories whose ``index.json`` says ``"kind": name``."""
    if not isinstance(name, str) or not name:
        raise ConfigError(f"an index kind needs a non-empty name, got {name!r}")
    INDEX_KINDS[name] = cls
    return cls


# kind -> index class; the built-in kinds are registered from bertology.builtins on first use.
INDEX_KINDS: Registry[type] = Registry("index_kinds", register_index_kind)


def index_kinds() -> tuple[str, ...]:
    """The registered index kinds."""
    return tuple(INDEX_KINDS)


def index_class(kind: str) -> type:
    kinds = index_kinds()
    if kind not in INDEX_KINDS:
        raise ConfigError(f"index kind {kind!r}: expected one of {', '.join(kinds)}")
    return INDEX_KINDS[kind]


def read_meta(directory: str | os.PathLike, kind: str | None = None) -> dict[str, Any]:
    """The checked ``index.json`` of an index directory (format, version, a known kind; `kind`: the one it must
    be, else an `IndexKindError`)."""
    directory = Path(directory)
    recover(directory)
    meta_file = directory / META_FILE
    if not directory.is_dir():
        raise DataError(f"{directory}: no such index directory")
    if not meta_file.is_file():
        raise DataError(f"{directory}: not an index ({META_FILE} is missing)")
    meta = json_value(meta_file)
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        found = meta.get("format") if isinstance(meta, dict) else None
        raise DataError(f"{meta_file}: not a bertology index (format {found!r}, expected {FORMAT!r})")
    if meta.get("version") != VERSION:
        raise DataError(f"{meta_file}: index format version {meta.get('version')!r}; this bertology reads "
                        f"version {VERSION}")
    recorded = meta.get("kind", "dense")
    if recorded not in index_kinds():
        raise DataError(f"{meta_file}: kind {recorded!r} is none of {', '.join(index_kinds())}")
    if kind is not None and recorded != kind:
        raise IndexKindError(f"{meta_file}: a {recorded} index, searched as a {kind} one; use it as {recorded} "
                             f"(--kind {recorded}) or build a {kind} index (bertology index build --kind {kind})")
    return meta


def load_index(directory: str | os.PathLike, kind: str | None = None, model: Any = None, **options: Any) -> Any:
    """The index in `directory`, of the kind its ``index.json`` records (`kind`: the kind it must be). `model` and
    `options` (``device``, ``dtype``) go to the kind's `load` (a dense or hybrid index embeds queries)."""
    if kind is not None:
        index_class(kind)
    recorded = read_meta(directory, kind).get("kind", "dense")
    return index_class(recorded).load(directory, model=model, **options)


def open_index(directory: str | os.PathLike, kind: str | None = None, model: Any = None, *, device: Any = None,
               dtype: str = "float32") -> Any:
    """An index ready for text queries (what `bertology search` and `evaluate --task retrieval` open): loaded as
    `load_index` does, and, for a kind that embeds queries, with `model` attached (default: the directory the
    index records, which must still exist), on `device` in `dtype`."""
    index = load_index(directory, kind)
    if not hasattr(index, "attach"):
        if model is not None:
            raise ConfigError(f"--model: a {index.kind} index ({directory}) embeds nothing and takes no model")
        return index
    path = model or index.model_path
    if path is None:
        raise ConfigError(f"{directory}: the index was built from a loaded model and records no directory; "
                          f"pass --model")
    if model is None and not Path(path).is_dir():
        raise ConfigError(f"{directory}: the model directory recorded in the index, {path}, does not exist any "
                          f"more; pass --model DIR (it must be the same model)")
    index.attach(path, device=device, dtype=dtype)
    return index
