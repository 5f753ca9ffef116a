"""One shard of a corpus embedding run (`bertology.embeddings.corpus`): its place in the inputs (`Shard`), the
settings every shard is embedded with (`CorpusSettings`), reading its texts and embedding them (`embed_shard`): the
code both engines run, the local one (`corpus.embed_corpus`) and Ray's actors (`ray_engine`)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bertology.text.corpus import jsonl_text
from bertology.embeddings.files import INPUT_FORMATS
from bertology.embeddings.layers import LayerSpec
from bertology.embeddings.result import LEVELS, Embeddings
from bertology.errors import ConfigError, DataError


@dataclass(frozen=True)
class CorpusSettings:
    """Everything besides the model and the inputs that decides what a corpus run writes: the `embed` options, the
    input format and the shard size. Part of the run's fingerprint: a resume must use the same settings."""

    level: str = "sentence"
    layers: LayerSpec = "last"
    combine: str | None = None
    pooling: str = "mean"
    sentence: str = "mean"
    batch_size: int = 32
    max_length: int | None = None
    stride: int | None = None
    dtype: str = "float32"
    format: str = "lines"
    text_field: str = "text"
    id_field: str = "id"
    shard_size: int = 10000

    def __post_init__(self) -> None:
        from bertology.device import FLOAT_DTYPES
        from bertology.model.quantize import check_dtype

        if self.level not in LEVELS:
            raise ConfigError(f"level: unknown {self.level!r}; expected one of {', '.join(LEVELS)}")
        if self.format not in INPUT_FORMATS:
            raise ConfigError(f"input format: unknown {self.format!r}; expected one of {', '.join(INPUT_FORMATS)}")
        if isinstance(self.shard_size, bool) or not isinstance(self.shard_size, int) or self.shard_size < 1:
            raise ConfigError(f"shard_size must be a positive integer, got {self.shard_size!r}")
        if self.dtype not in FLOAT_DTYPES:  # float16 / bfloat16 are checked against the device by embed_corpus
            object.__setattr__(self, "dtype", check_dtype(self.dtype))
        if not isinstance(self.layers, (str, int)):
            object.__setattr__(self, "layers", tuple(self.layers))

    def embed_options(self) -> dict[str, Any]:
        """Keyword arguments of `bertology.embed`."""
        return {"layers": self.layers if not isinstance(self.layers, tuple) else list(self.layers),
                "combine": self.combine, "pooling": self.pooling, "sentence": self.sentence,
                "levels": (self.level,), "batch_size": self.batch_size, "max_length": self.max_length,
                "stride": self.stride, "long_texts": "windows", "model_settings": False}

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        if isinstance(self.layers, tuple):
            data["layers"] = list(self.layers)
        return data


@dataclass(frozen=True)
class Shard:
    """Texts `first` .. `first + count - 1` (0-based, in the file's order) of input file `file`; the first of them
    starts at byte `offset` on line `line`."""

    name: str
    file: str  # relative to the inputs' root
    first: int
    count: int
    line: int
    offset: int


@dataclass(frozen=True)
class Entry:
    """One text of an input file."""

    line: int
    offset: int  # byte offset of its line
    text: str
    id: Any = None


def read_entries(path: Path, settings: CorpusSettings, offset: int = 0, line: int = 1,
                 limit: int | None = None) -> Iterator[Entry]:
    """The texts of one input file from byte `offset` (the start of line `line`), at most `limit` of them. Errors
    name the file, the line and, for bad UTF-8, the byte offset."""
    with open(path, "rb") as handle:
        handle.seek(offset)
        count = 0
        for number, raw in enumerate(handle, start=line):
            if limit is not None and count >= limit:
                return
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as error:
                raise DataError(f"{path}: line {number}: cannot decode as utf-8 at byte offset "
                                f"{offset + error.start} (byte 0x{raw[error.start]:02x})") from None
            if offset == 0 and text.startswith("\ufeff"):
                text = text[1:]
            here, offset = offset, offset + len(raw)
            text = text.rstrip("\r\n")
            if settings.format == "lines":
                yield Entry(number, here, text)
            elif text.strip():
                value = jsonl_text(text, path, number, settings.text_field)
                record_id = json.loads(text).get(settings.id_field)
                yield Entry(number, here, value, record_id)
            else:
                continue
            count += 1


def shard_texts(root: Path, shard: Shard, settings: CorpusSettings) -> list[Entry]:
    """The entries of one shard, read from its file at the shard's byte offset."""
    entries = list(read_entries(root / shard.file, settings, shard.offset, shard.line, shard.count))
    if len(entries) != shard.count:
        raise DataError(f"{root / shard.file}: shard {shard.name} expected {shard.count} texts from line "
                        f"{shard.line}, found {len(entries)}: the file changed during the run")
    return entries


def index_rows(shard: Shard, entries: list[Entry], result: Embeddings, level: str) -> list[dict[str, Any]]:
    """The index of a shard's rows. Every row: `file` (relative to the inputs' root), `line` (1-based), `text`
    (0-based number of the text in its file), `id` (jsonl `id_field`, else null), `start` / `end` (character span in
    the text; the whole text at sentence level). Word and token rows add `index` (word or token number in its text)
    and `string`."""
    def base(i: int) -> dict[str, Any]:
        entry = entries[i]
        return {"file": shard.file, "line": entry.line, "text": shard.first + i, "id": entry.id}

    if level == "sentence":
        return [{**base(i), "start": 0, "end": len(entries[i].text)} for i in range(len(entries))]
    pieces = result.tokens if level == "token" else result.words
    assert pieces is not None
    return [{**base(int(t)), "index": int(k), "string": s, "start": int(a), "end": int(b)}
            for t, k, s, a, b in zip(pieces.text_index, pieces.index, pieces.strings, pieces.start, pieces.end)]


def embed_shard(pretrained: Any, root: Path, shard: Shard, settings: CorpusSettings) -> tuple[np.ndarray, list[dict]]:
    """Vectors and index rows of one shard: what both engines compute."""
    from bertology.embeddings.core import embed

    entries = shard_texts(root, shard, settings)
    result = embed(pretrained, [e.text for e in entries], **settings.embed_options(),
                   dtype="float32" if settings.dtype == "int8" else settings.dtype)
    if settings.level == "sentence":
        vectors = result.sentences
    else:
        pieces = result.tokens if settings.level == "token" else result.words
        vectors = pieces.vectors
    assert vectors is not None
    return np.ascontiguousarray(vectors, dtype=np.float32), index_rows(shard, entries, result, settings.level)


def load_encoder(model_dir: Path, dtype: str, threads: int | None, device: str | None = None) -> Any:
    """The model of a corpus run, in `dtype` (int8 quantized; half types are autocast by `embed`), with `threads`
    torch threads (None: leave torch's setting), on `device` (None: the CPU)."""
    import torch

    from bertology.device import placement
    from bertology.model import load
    from bertology.model.quantize import with_dtype

    where = placement(device, dtype, int8=True)
    if threads is not None:
        torch.set_num_threads(threads)
    return where.move(with_dtype(load(model_dir), dtype))
