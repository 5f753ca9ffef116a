"""Passages: the documents an index holds, read from and written to JSON lines.

A passages file is UTF-8 JSON lines, one object per non-blank line::

    {"id": "doc-17", "text": "The Normans were the people who ...", "title": "Normans"}

``id`` is a non-empty string or an integer (stored as its decimal string), unique in the file; ``text`` is a
string (it may be empty). Other keys (a title, a source) are allowed and ignored. Blank lines are skipped, a UTF-8
byte-order mark at the start is allowed. Every error names the file and the line (a decoding error also the byte
offset); a repeated id names both lines.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from bertology.text.corpus import read_lines
from bertology.errors import DataError
from bertology.inputs import check_unicode
from bertology.io import atomic_write


@dataclass(frozen=True)
class Passage:
    """One retrievable text and its id."""

    id: str
    text: str


def _passage(record: object, where: str) -> Passage:
    """A Passage from one decoded JSON value; errors say `where` (``file: line 3`` or ``passages[3]``)."""
    if isinstance(record, Passage):
        return record
    if not isinstance(record, Mapping):
        raise DataError(f"{where}: expected a JSON object with 'id' and 'text', got {_kind(record)}")
    check_unicode(dict(record), where)
    for key in ("id", "text"):
        if key not in record:
            keys = ", ".join(map(repr, record)) or "none"
            raise DataError(f"{where}: missing field {key!r} (fields: {keys})")
    pid, text = record["id"], record["text"]
    if isinstance(pid, bool) or not isinstance(pid, (str, int)):
        raise DataError(f"{where}: field 'id' is {_kind(pid)}; expected a string or an integer")
    pid = str(pid)
    if not pid:
        raise DataError(f"{where}: field 'id' is an empty string")
    if not isinstance(text, str):
        raise DataError(f"{where}: field 'text' is {_kind(text)}; expected a string")
    return Passage(pid, text)


def _kind(value: object) -> str:
    if value is None:
        return "null"
    names = {dict: "an object", list: "a list", str: "a string", int: "an integer", float: "a number",
             bool: "a boolean"}
    return names.get(type(value), type(value).__name__)


def read_passages(path: str | os.PathLike) -> list[Passage]:
    """The passages of a JSON-lines file (schema in the module docstring), in file order."""
    path = Path(path)
    if path.is_dir():
        raise DataError(f"{path}: is a directory, not a passages file")
    if not path.exists():
        raise DataError(f"{path}: no such file")
    passages: list[Passage] = []
    lines: dict[str, int] = {}
    try:
        for number, line in read_lines(path, "utf-8"):
            if not line.strip():
                continue
            where = f"{path}: line {number}"
            try:
                record = json.loads(line)
            except json.JSONDecodeError as error:
                raise DataError(f"{where}: invalid JSON: {error.msg} (column {error.colno})") from None
            except RecursionError:
                raise DataError(f"{where}: invalid JSON: arrays or objects nested too deeply") from None
            passage = _passage(record, where)
            if passage.id in lines:
                raise DataError(f"{where}: id {passage.id!r} repeats the one on line {lines[passage.id]}")
            lines[passage.id] = number
            passages.append(passage)
    except OSError as error:
        raise DataError(f"{path}: cannot read: {error.strerror or error}") from None
    if not passages:
        raise DataError(f"{path}: no passages")
    return passages


def as_passages(passages: str | os.PathLike | Iterable[Passage | Mapping[str, object]]) -> list[Passage]:
    """Passages from a JSON-lines file, or from Passage objects / ``{"id", "text"}`` mappings (checked the same way:
    errors name ``passages[i]``; repeated ids are refused)."""
    if isinstance(passages, (str, os.PathLike)):
        return read_passages(passages)
    result: list[Passage] = []
    seen: dict[str, int] = {}
    for i, record in enumerate(passages):
        passage = _passage(record, f"passages[{i}]")
        if passage.id in seen:
            raise DataError(f"passages[{i}]: id {passage.id!r} repeats the one of passages[{seen[passage.id]}]")
        seen[passage.id] = i
        result.append(passage)
    if not result:
        raise DataError("no passages")
    return result


def write_passages(passages: Sequence[Passage], path: str | os.PathLike) -> None:
    """Write passages as JSON lines (``{"id", "text"}``), atomically."""
    with atomic_write(path, "w", encoding="utf-8") as handle:
        for passage in passages:
            handle.write(json.dumps({"id": passage.id, "text": passage.text}, ensure_ascii=False) + "\n")


def squad_passages(path: str | os.PathLike) -> list[Passage]:
    """The distinct paragraphs of a SQuAD v1.1 file as passages, in file order, with ids ``<article>-<paragraph>``
    (0-based positions in the file; a paragraph text seen before is not repeated). Read by
    `bertology.tasks.read_squad`, so the file is checked as fine-tuning checks it."""
    from bertology.tasks.readers import read_squad

    examples = read_squad(path)
    # read_squad keeps no positions, so the ids come from the JSON itself (already validated by read_squad).
    document = json.loads(Path(path).read_text(encoding="utf-8-sig"))
    passages: list[Passage] = []
    seen: set[str] = set()
    for a, article in enumerate(document["data"]):
        for p, paragraph in enumerate(article["paragraphs"]):
            context = paragraph["context"]
            if context not in seen:
                seen.add(context)
                passages.append(Passage(f"{a}-{p}", context))
    if not passages or not examples:
        raise DataError(f"{path}: no paragraphs")
    return passages
