"""Texts in, vectors out: reading input files for `embed` and writing its results as .npy / .npz."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Literal

import numpy as np

from bertology.data.corpus import jsonl_text
from bertology.embeddings.result import LEVELS, Embeddings, Level
from bertology.errors import ConfigError, DataError
from bertology.io import atomic_write

InputFormat = Literal["lines", "jsonl"]
INPUT_FORMATS: tuple[str, ...] = ("lines", "jsonl")


def read_texts(path: str | os.PathLike, format: InputFormat = "lines", text_field: str = "text") -> list[str]:
    """Texts from a UTF-8 file: one per line (`lines`: every line counts, empty ones too, so row i is line i + 1;
    a final newline ends the last line) or one JSON object per non-blank line with the text under `text_field`."""
    if format not in INPUT_FORMATS:
        raise ConfigError(f"input format: unknown {format!r}; expected one of {', '.join(INPUT_FORMATS)}")
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: no such file")
    raw = path.read_bytes()
    try:
        content = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        line = raw[: error.start].count(b"\n") + 1
        raise DataError(f"{path}: not valid UTF-8 at byte offset {error.start} (line {line})") from None
    content = content.removeprefix("\ufeff")
    lines = content.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    lines = [line.removesuffix("\r") for line in lines]
    if format == "lines":
        texts = lines
    else:
        texts = []
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            texts.append(jsonl_text(line, path, number, text_field))
    if not texts:
        raise DataError(f"{path}: no texts")
    return texts


def check_output(path: str | os.PathLike, level: Level) -> str:
    """The output kind ("npy" or "npz") for `path`, or a ConfigError before any work is done."""
    if level not in LEVELS:
        raise ConfigError(f"level: unknown {level!r}; expected one of {', '.join(LEVELS)}")
    suffix = Path(path).suffix.lower()
    if suffix == ".npy":
        if level != "sentence":
            raise ConfigError(f"{path}: a .npy file holds a single array, which fits sentence vectors only; "
                              f"write {level} vectors to .npz (vectors plus their index)")
        return "npy"
    if suffix == ".npz":
        return "npz"
    raise ConfigError(f"{path}: output must end in .npy (sentence vectors) or .npz, not {suffix or 'no suffix'!r}")


def save_vectors(result: Embeddings, path: str | os.PathLike, level: Level, meta: dict[str, Any] | None = None) -> int:
    """Write one level of `result` atomically and return the number of rows.

    .npy: the [N, D] sentence vectors. .npz: `vectors`, `texts`, `meta` (JSON: layers, pooling, ...) and, for
    word and token level, one index entry per row: `text_index`, `index` (word or token number in its text),
    `word_index`, `strings`, `start`, `end` (character offsets into the text) and, for tokens, `ids`.
    """
    kind = check_output(path, level)
    if level == "sentence":
        if result.sentences is None:
            raise ConfigError("save_vectors: the sentence level was not computed")
        arrays: dict[str, np.ndarray] = {"vectors": result.sentences}
    else:
        pieces = result.tokens if level == "token" else result.words
        if pieces is None:
            raise ConfigError(f"save_vectors: the {level} level was not computed")
        arrays = {
            "vectors": pieces.vectors,
            "text_index": pieces.text_index,
            "index": pieces.index,
            "word_index": pieces.word_index,
            "strings": np.array(pieces.strings, dtype=str),
            "start": pieces.start,
            "end": pieces.end,
        }
        if pieces.ids is not None:
            arrays["ids"] = pieces.ids
    with atomic_write(path, "wb") as handle:
        if kind == "npy":
            np.save(handle, arrays["vectors"])
        else:
            info = {"level": level, "layers": list(result.layers), "combine": result.combine,
                    "pooling": result.pooling, "sentence": result.sentence,
                    "window_length": result.window_length, "stride": result.stride, **(meta or {})}
            np.savez(handle, **arrays, texts=np.array(result.texts, dtype=str), meta=np.array(json.dumps(info)))
    return int(arrays["vectors"].shape[0])
