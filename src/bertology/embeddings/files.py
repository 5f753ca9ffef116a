"""Texts in, vectors out: reading input files for `embed` and writing its results as .npy / .npz."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Literal

import numpy as np

from bertology.text.corpus import jsonl_text, read_lines
from bertology.embeddings.result import LEVELS, Embeddings, Level
from bertology.errors import ConfigError, DataError
from bertology.inputs import load_npy, read_npz
from bertology.io import atomic_write, file_in_the_way

InputFormat = Literal["lines", "jsonl"]
INPUT_FORMATS: tuple[str, ...] = ("lines", "jsonl")
# meta["format"] of .npz files. 2: texts and strings as UTF-8 bytes plus offsets; 1 (no "format" key): numpy
# unicode arrays, which drop trailing NUL characters.
FORMAT_VERSION = 2


def read_texts(path: str | os.PathLike, format: InputFormat = "lines", text_field: str = "text") -> list[str]:
    """Texts from a UTF-8 file: one per line (`lines`: every line counts, empty ones too, so row i is line i + 1;
    a final newline ends the last line; line ends, LF or CRLF, are not part of the text) or one JSON object
    per non-blank line with the text under `text_field`. Lines are read by the corpus readers' `read_lines`."""
    if format not in INPUT_FORMATS:
        raise ConfigError(f"input format: unknown {format!r}; expected one of {', '.join(INPUT_FORMATS)}")
    path = Path(path)
    if path.is_dir():
        raise DataError(f"{path}: is a directory, not a text file")
    if not path.exists():
        raise DataError(f"{path}: no such file")
    try:
        lines = [line for _, line in read_lines(path, "utf-8")]
    except OSError as error:
        raise DataError(f"{path}: cannot read: {error.strerror or error}") from None
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
    """The output kind ("npy" or "npz") for `path`, or a ConfigError before any work is done: an unknown suffix,
    a level the suffix cannot hold, a directory in the way, or a file where a parent directory must be."""
    if level not in LEVELS:
        raise ConfigError(f"level: unknown {level!r}; expected one of {', '.join(LEVELS)}")
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"{path}: is a directory; the output is a file (OUT.npy or OUT.npz)")
    blocker = file_in_the_way(path)
    if blocker is not None:
        raise ConfigError(f"{path}: cannot create it, {blocker} is a file, not a directory")
    suffix = path.suffix.lower()
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

    .npy: the [N, D] sentence vectors. .npz: `vectors`, the texts, `meta` (JSON: layers, pooling, ...) and, for
    word and token level, one index entry per row: `text_index`, `index` (word or token number in its text),
    `word_index`, the strings, `start`, `end` (character offsets into the text) and, for tokens, `ids`.

    Texts and strings are stored exactly, as their UTF-8 bytes one after another (`texts_utf8`, uint8) and the
    byte offsets where each starts (`texts_offsets`, int64, one more than there are texts; likewise
    `strings_utf8` / `strings_offsets`): numpy's unicode arrays would drop trailing NUL characters. Read them with
    `load_vectors`, or by hand: text i is `bytes(texts_utf8[texts_offsets[i]:texts_offsets[i + 1]]).decode()`.
    Every array is plain numeric, so `np.load` needs no pickle.
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
            **_pack_strings("strings", pieces.strings),
            "start": pieces.start,
            "end": pieces.end,
        }
        if pieces.ids is not None:
            arrays["ids"] = pieces.ids
    with atomic_write(path, "wb") as handle:
        if kind == "npy":
            np.save(handle, arrays["vectors"])
        else:
            info = {"format": FORMAT_VERSION, "level": level, "layers": list(result.layers),
                    "combine": result.combine, "pooling": result.pooling, "sentence": result.sentence,
                    "window_length": result.window_length, "stride": result.stride, **(meta or {})}
            np.savez(handle, **arrays, **_pack_strings("texts", result.texts), meta=np.array(json.dumps(info)))
    return int(arrays["vectors"].shape[0])


def load_vectors(path: str | os.PathLike) -> dict[str, Any]:
    """What `save_vectors` wrote: "vectors" and, from .npz, "texts" and (word and token level) "strings" as lists
    of str, exactly as embedded, "meta" as a dict, and the index arrays. Files written before texts were stored
    as UTF-8 (unicode arrays "texts" / "strings", which lose trailing NULs) are read too."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: {'is a directory' if path.is_dir() else 'no such file'}")
    with open(path, "rb") as handle:
        magic = handle.read(6)
    # Headers and sizes are checked before any array is read (bertology.inputs).
    if magic == b"\x93NUMPY":
        return {"vectors": load_npy(path, mmap=False)}
    arrays = read_npz(path, ("vectors",), what="a .npy or .npz file written by bertology embed")
    result: dict[str, Any] = {}
    for name in ("texts", "strings"):
        if f"{name}_utf8" in arrays:
            result[name] = _unpack_strings(arrays.pop(f"{name}_utf8"), arrays.pop(f"{name}_offsets", None), path, name)
        elif name in arrays:
            result[name] = arrays.pop(name).tolist()
    if "meta" in arrays:
        try:
            result["meta"] = json.loads(str(arrays.pop("meta")))
        except (ValueError, TypeError) as error:
            raise DataError(f"{path}: meta is not JSON ({error})") from None
    result.update(arrays)
    return result


def _pack_strings(name: str, strings: list[str]) -> dict[str, np.ndarray]:
    encoded = [s.encode("utf-8", "surrogatepass") for s in strings]
    offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
    np.cumsum([len(e) for e in encoded], out=offsets[1:])
    return {f"{name}_utf8": np.frombuffer(b"".join(encoded), dtype=np.uint8), f"{name}_offsets": offsets}


def _unpack_strings(data: np.ndarray, offsets: np.ndarray | None, path: Path, name: str) -> list[str]:
    if offsets is None or offsets.ndim != 1 or len(offsets) == 0 or offsets[0] != 0 or offsets[-1] != len(data) or (
        np.diff(offsets) < 0
    ).any():
        raise DataError(f"{path}: {name}_offsets does not describe {name}_utf8 ({len(data)} bytes)")
    raw = data.tobytes()
    bounds = offsets.tolist()
    try:
        return [raw[a:b].decode("utf-8", "surrogatepass") for a, b in zip(bounds[:-1], bounds[1:])]
    except UnicodeDecodeError as error:
        raise DataError(f"{path}: {name}_utf8 is not UTF-8 ({error.reason})") from None
