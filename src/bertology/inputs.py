"""Checks of what bertology reads before it is trusted: decoded text that is not Unicode (JSON's ``"\\ud800"``
escapes decode to lone surrogates, which no UTF-8 writer accepts), and binary files whose headers and length fields
are compared with the file's size before anything is allocated (``.npz`` archives, faiss index files).

Every check raises the caller's `BertologyError` subclass with a message naming the file and what is wrong.
"""

from __future__ import annotations

import json
import os
import struct
import tokenize
import zipfile
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from bertology.errors import BertologyError, DataError


# ------------------------------------------------------------------------------------------------------- text
def lone_surrogate(value: Any, path: str = "") -> tuple[str, int, str] | None:
    """The first lone surrogate in a decoded JSON value (strings, and the keys and values of objects and lists, in
    document order): ``(field path, character index, the character)``, or None. The field path reads like ``text``
    or ``meta.authors[2]``; a key that is itself bad is named as ``<key of path>``. Iterative, so that any depth
    the JSON parser accepted is walked."""
    stack: list[tuple[str, Any]] = [(path, value)]
    while stack:
        where, item = stack.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError as error:
                return where, error.start, item[error.start]
        elif isinstance(item, dict):
            children = []
            for key, child in item.items():
                if isinstance(key, str):
                    children.append((f"<key of {where or 'the object'}>", key))
                children.append((f"{where}.{key}" if where else str(key), child))
            stack.extend(reversed(children))
        elif isinstance(item, (list, tuple)):
            stack.extend(reversed([(f"{where}[{i}]", child) for i, child in enumerate(item)]))
    return None


def check_unicode(value: Any, where: str, error: type[BertologyError] = DataError) -> Any:
    """`value` if it holds no lone surrogate, else an `error` naming `where` (file and line), the field and the
    character."""
    found = lone_surrogate(value)
    if found is not None:
        field, index, char = found
        what = f"field {field!r}" if field else "the value"
        raise error(f"{where}: {what}: character {index} is a lone surrogate (U+{ord(char):04X}, from a "
                    f"\\u{ord(char):04x} escape), which is not Unicode text")
    return value


def json_kind(value: Any) -> str:
    """How an error names a JSON value it did not expect: its kind, and the value itself when it is short
    ("a list [1, 2]", "boolean true", "null")."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"boolean {json.dumps(value)}"
    names = {dict: "an object", list: "a list", str: "a string", int: "an integer", float: "a number"}
    shown = json.dumps(value, ensure_ascii=False, default=str)
    return names.get(type(value), type(value).__name__) + ("" if len(shown) > 40 else f" {shown}")


def json_object(line: str, where: str, error: type[BertologyError] = DataError) -> dict[str, Any]:
    """One JSON-lines record: the object on `line`, or an error naming `where` (file and line) and what is wrong:
    invalid JSON (with its column), nesting too deep for the parser, or a value that is not an object."""
    try:
        record = json.loads(line)
    except json.JSONDecodeError as problem:
        raise error(f"{where}: invalid JSON: {problem.msg} (column {problem.colno})") from None
    except RecursionError:
        raise error(f"{where}: invalid JSON: arrays or objects nested too deeply") from None
    if not isinstance(record, dict):
        raise error(f"{where}: expected a JSON object, got {json_kind(record)}")
    return record


def json_value(path: str | os.PathLike, error: type[BertologyError] = DataError) -> Any:
    """The JSON value a whole file holds; a missing or unreadable file, bad UTF-8, bad JSON or nesting too deep is an
    `error` naming the file (and the byte offset, or the line and column)."""
    path = Path(path)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise error(f"{path}: no such file") from None
    except OSError as problem:
        raise error(f"{path}: cannot read it: {problem.strerror or problem}") from None
    except UnicodeDecodeError as problem:
        raise error(f"{path}: not UTF-8 text at byte offset {problem.start}") from None
    except json.JSONDecodeError as problem:
        raise error(f"{path}: not valid JSON at line {problem.lineno}, column {problem.colno}: {problem.msg}") from None
    except RecursionError:
        raise error(f"{path}: invalid JSON: arrays or objects nested too deeply") from None


def json_file(path: str | os.PathLike, error: type[BertologyError] = DataError) -> dict[str, Any]:
    """The JSON object a whole file holds (`json_value`'s errors), or an `error` naming the file when it holds
    anything else (a list, a number)."""
    data = json_value(path, error)
    if not isinstance(data, dict):
        raise error(f"{Path(path)}: expected a JSON object, got {json_kind(data)}")
    return data


def text_lines(path: str | os.PathLike, error: type[BertologyError] = DataError) -> Iterator[tuple[int, str]]:
    """``(line number, line)`` of a UTF-8 text file, line ends (LF or CRLF) and a leading byte-order mark removed;
    bytes that are not UTF-8 are an `error` naming the file, the line and the byte offset."""
    path = Path(path)
    offset = 0
    try:
        handle = open(path, "rb")
    except OSError as cause:
        raise error(f"{path}: cannot read it ({cause.strerror or cause})") from None
    with handle:
        for number, raw in enumerate(handle, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as cause:
                raise error(f"{path}: line {number}: cannot decode as utf-8 at byte offset {offset + cause.start} "
                            f"(byte 0x{raw[cause.start]:02x})") from None
            if number == 1:
                line = line.removeprefix("\ufeff")
            offset += len(raw)
            yield number, line.rstrip("\r\n")


# ------------------------------------------------------------------------------------------------------- .npz
def read_npz(path: str | os.PathLike, names: tuple[str, ...] | None = None,
             error: type[BertologyError] = DataError, what: str = "a .npz file") -> dict[str, np.ndarray]:
    """The arrays of a ``.npz`` file (no pickles), after checking the archive's directory and every member's
    ``.npy`` header (shape and dtype against the member's size) before reading it: a truncated, empty or
    tampered file is an `error` naming the file and the member, never an allocation of what a length field
    claims. `names`: members that must be present."""
    path = Path(path)
    if not path.is_file():
        raise error(f"{path}: {'is a directory' if path.is_dir() else 'no such file'}")
    size = path.stat().st_size
    if size == 0:
        raise error(f"{path}: the file is empty; expected {what}")
    arrays: dict[str, np.ndarray] = {}
    try:
        with zipfile.ZipFile(path) as archive:
            members = archive.infolist()
            for info in members:
                # Deflate cannot expand more than about 1032 to 1: a member claiming more was tampered with.
                if info.file_size > 1100 * max(size, 1024) and info.compress_type != zipfile.ZIP_STORED:
                    raise error(f"{path}: member {info.filename} claims {info.file_size} bytes, far more than the "
                                f"{size}-byte file could hold")
                if info.compress_type == zipfile.ZIP_STORED and info.file_size > size:
                    raise error(f"{path}: member {info.filename} claims {info.file_size} bytes; the file has {size}")
            found = {info.filename[:-4] if info.filename.endswith(".npy") else info.filename: info
                     for info in members}
            missing = [name for name in names or () if name not in found]
            if missing:
                raise error(f"{path}: not {what}: no {', '.join(map(repr, missing))} array (found "
                            f"{', '.join(sorted(found)) or 'none'})")
            for name, info in found.items():
                with archive.open(info) as handle:
                    arrays[name] = _read_npy(handle, info.file_size, f"{path}: member {info.filename}", error)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, OSError, ValueError, NotImplementedError,
            RuntimeError, zlib.error, struct.error) as cause:
        raise error(f"{path}: not {what}: {type(cause).__name__}: {cause}") from None
    return arrays


def load_npy(path: str | os.PathLike, error: type[BertologyError] = DataError, mmap: bool = True) -> np.ndarray:
    """A ``.npy`` array (memory-mapped by default, no pickles) whose header was first checked against the file's
    size: an empty, truncated or tampered file is an `error` naming it."""
    path = Path(path)
    if not path.is_file():
        raise error(f"{path}: {'is a directory' if path.is_dir() else 'no such file'}")
    size = path.stat().st_size
    with open(path, "rb") as handle:
        _npy_header(handle, size, str(path), error)
    try:
        return np.load(path, mmap_mode="r" if mmap else None, allow_pickle=False)
    except (ValueError, OSError, EOFError) as cause:
        raise error(f"{path}: not a readable .npy array: {cause}") from None


def _npy_header(handle: Any, size: int, where: str, error: type[BertologyError]) -> tuple[tuple[int, ...], bool,
                                                                                            np.dtype]:
    """Read and check a ``.npy`` header: the array it describes must fill exactly the `size` bytes of the file."""
    from numpy.lib import format as npy

    try:
        version = npy.read_magic(handle)
        if version == (1, 0):
            shape, fortran, dtype = npy.read_array_header_1_0(handle)
        elif version in ((2, 0), (3, 0)):
            shape, fortran, dtype = npy.read_array_header_2_0(handle)
        else:
            raise ValueError(f"unknown .npy version {version}")
    except (ValueError, SyntaxError, EOFError, struct.error, UnicodeDecodeError, tokenize.TokenError, TypeError,
            KeyError, IndexError, OverflowError) as cause:  # numpy parses the header as a Python literal
        raise error(f"{where}: not a .npy array: {type(cause).__name__}: {cause}") from None
    if dtype.hasobject:
        raise error(f"{where}: holds Python objects (dtype {dtype}); only numeric arrays are read")
    count = 1
    for dim in shape:
        count *= int(dim)
    expected = count * dtype.itemsize
    start = handle.tell()
    if start + expected != size:
        raise error(f"{where}: its header says shape {list(shape)} of {dtype} ({expected} bytes), but "
                    f"{size - start} bytes follow it")
    return shape, fortran, dtype


def _read_npy(handle: Any, size: int, where: str, error: type[BertologyError]) -> np.ndarray:
    """One ``.npy`` array from a file object of `size` bytes, its header checked before the data is read."""
    shape, fortran, dtype = _npy_header(handle, size, where, error)
    expected = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    data = handle.read(expected)
    if len(data) != expected:
        raise error(f"{where}: truncated: {len(data)} of {expected} bytes")
    array = np.frombuffer(data, dtype=dtype)
    if fortran:
        return array.reshape(shape[::-1]).transpose().copy()
    return array.reshape(shape).copy()


# ------------------------------------------------------------------------------------------------------ faiss
_FAISS_HEADER = struct.Struct("<4siqqqBi")  # fourcc, d, ntotal, two dummies, is_trained, metric type
FAISS_KINDS = {"flat": b"IxFI", "hnsw": b"IHNf", "ivf": b"IwFl"}  # what bertology writes, by structure kind
METRIC_INNER_PRODUCT = 0


class _Reader:
    """Reads a faiss file's fields, checking every length against the bytes left before it is used."""

    def __init__(self, data: bytes, where: str, error: type[BertologyError]) -> None:
        self.data, self.pos, self.where, self.error = data, 0, where, error

    def fail(self, message: str) -> BertologyError:
        return self.error(f"{self.where}: {message} (byte offset {self.pos})")

    def take(self, n: int, what: str) -> bytes:
        if n < 0 or self.pos + n > len(self.data):
            raise self.fail(f"{what} needs {n} bytes; {len(self.data) - self.pos} are left: the file is truncated "
                            "or a length field is wrong")
        chunk = self.data[self.pos:self.pos + n]
        self.pos += n
        return chunk

    def unpack(self, fmt: str, what: str) -> tuple:
        return struct.unpack("<" + fmt, self.take(struct.calcsize("<" + fmt), what))

    def vector(self, item: int, what: str, expected: int | None = None) -> int:
        (count,) = self.unpack("q", f"the length of {what}")
        if count < 0 or count * item > len(self.data) - self.pos:
            raise self.fail(f"{what} claims {count} items of {item} bytes; only {len(self.data) - self.pos} bytes "
                            "are left")
        if expected is not None and count != expected:
            raise self.fail(f"{what} holds {count} items; {expected} expected")
        self.take(count * item, what)
        return count

    def header(self, kind: str, dim: int | None, ntotal: int | None) -> tuple[int, int]:
        fourcc, d, n, _, _, _, metric = self.unpack("4siqqqBi", f"the {kind} index header")
        if fourcc != FAISS_KINDS[kind]:
            names = {v: k for k, v in FAISS_KINDS.items()}
            found = names.get(fourcc, f"an unknown kind ({fourcc!r})")
            raise self.fail(f"holds a {found} index; {kind} expected")
        if metric != METRIC_INNER_PRODUCT:
            names = {1: "L2"}
            raise self.fail(f"its metric is {names.get(metric, metric)}, not inner product: scores would not be "
                            "cosine similarities")
        if dim is not None and d != dim:
            raise self.fail(f"vectors of width {d}; {dim} expected")
        if ntotal is not None and n != ntotal:
            raise self.fail(f"{n} vectors; {ntotal} expected")
        if d < 1 or n < 0:
            raise self.fail(f"width {d} and {n} vectors")
        return d, n

    def flat(self, dim: int | None, ntotal: int | None) -> None:
        d, n = self.header("flat", dim, ntotal)
        self.vector(4, "the flat index's vectors", n * d)


def check_faiss(path: str | os.PathLike, kind: str, dim: int, ntotal: int,
                error: type[BertologyError] = DataError) -> None:
    """Check a faiss index file of the structure `kind` (flat, hnsw, ivf, as bertology writes them) against its
    expected width and count: the kind and the metric (inner product) in its headers, and every length field
    against the bytes left in the file, so that faiss is never asked to allocate what a corrupt field claims."""
    path = Path(path)
    if kind not in FAISS_KINDS:
        raise error(f"{path}: unknown index structure {kind!r}")
    data = path.read_bytes()
    reader = _Reader(data, str(path), error)
    if kind == "flat":
        reader.flat(dim, ntotal)
    elif kind == "hnsw":
        reader.header("hnsw", dim, ntotal)
        reader.vector(8, "hnsw.assign_probas")
        reader.vector(4, "hnsw.cum_nneighbor_per_level")
        reader.vector(4, "hnsw.levels", ntotal)
        reader.vector(8, "hnsw.offsets", ntotal + 1)
        reader.vector(4, "hnsw.neighbors")
        reader.unpack("iiiii", "hnsw's entry point, levels and search settings")
        reader.flat(dim, ntotal)
    else:
        reader.header("ivf", dim, ntotal)
        nlist, _ = reader.unpack("qq", "nlist and nprobe")
        if nlist < 1 or nlist > max(ntotal, 1):
            raise reader.fail(f"nlist {nlist} for {ntotal} vectors")
        reader.flat(dim, nlist)
        (direct_map,) = reader.unpack("B", "the direct-map type")
        if direct_map not in (0, 1, 2):
            raise reader.fail(f"unknown direct-map type {direct_map}")
        reader.vector(8, "the direct map")
        if direct_map == 2:
            reader.vector(16, "the direct map's hash table")
        (lists,) = reader.unpack("4s", "the inverted lists' kind")
        if lists != b"ilar":
            raise reader.fail(f"inverted lists of kind {lists!r}; 'ilar' expected")
        count, code_size = reader.unpack("qq", "the inverted lists' size")
        if count != nlist or code_size != dim * 4:
            raise reader.fail(f"{count} lists of {code_size}-byte codes; {nlist} of {dim * 4} expected")
        (list_type,) = reader.unpack("4s", "the inverted lists' layout")
        if list_type == b"full":
            (n_sizes,) = reader.unpack("q", "the list sizes' length")
            if n_sizes != nlist:
                raise reader.fail(f"{n_sizes} list sizes for {nlist} lists")
            sizes = struct.unpack(f"<{nlist}q", reader.take(8 * nlist, "the list sizes"))
        elif list_type == b"sprs":
            (n_pairs,) = reader.unpack("q", "the sparse list sizes' length")
            if n_pairs < 0 or n_pairs % 2 or n_pairs * 8 > len(data) - reader.pos:
                raise reader.fail(f"{n_pairs} sparse list-size entries")
            pairs = struct.unpack(f"<{n_pairs}q", reader.take(8 * n_pairs, "the sparse list sizes"))
            sizes_by_list = dict(zip(pairs[::2], pairs[1::2]))
            sizes = tuple(sizes_by_list.get(i, 0) for i in range(nlist))
        else:
            raise reader.fail(f"inverted lists laid out as {list_type!r}")
        if any(s < 0 for s in sizes) or sum(sizes) != ntotal:
            raise reader.fail(f"list sizes add up to {sum(sizes)}; {ntotal} vectors expected")
        for i, s in enumerate(sizes):
            if s:
                reader.take(s * code_size, f"list {i}'s codes")
                reader.take(s * 8, f"list {i}'s ids")
    if reader.pos != len(data):
        raise reader.fail(f"{len(data) - reader.pos} bytes follow the index")

