"""The unified WSD evaluation framework of Raganato et al. (2017): `X.data.xml` (sentences of `<wf>` and
`<instance>` tokens with lemma and universal POS) and key files (`id key [key ...]` per line).

    <sentence id="d000.s000">
    <wf lemma="the" pos="DET">The</wf>
    <instance id="d000.s000.t000" lemma="art" pos="NOUN">art</instance>
    </sentence>
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from xml.parsers import expat

from bertology.errors import DataError
from bertology.io import atomic_write


class RaganatoError(DataError):
    """A framework data or key file is malformed; the message names the file and line."""


@dataclass(frozen=True)
class Instance:
    """A token to disambiguate: its character span in its sentence's text."""

    id: str
    lemma: str
    pos: str
    sentence: int  # index into RaganatoData.sentences
    start: int
    end: int
    line: int


@dataclass(frozen=True)
class RaganatoSentence:
    id: str
    text: str  # tokens joined by single spaces


@dataclass
class RaganatoData:
    path: str
    sentences: list[RaganatoSentence]
    instances: list[Instance]


def read_raganato(path: str | os.PathLike) -> RaganatoData:
    """Sentences and instances of a framework `.data.xml` file."""
    path = Path(path)
    if not path.is_file():
        raise RaganatoError(f"{path}: no such file")
    data = RaganatoData(str(path), [], [])
    parser = expat.ParserCreate("UTF-8")
    state: dict = {"sentence": None, "token": None, "tokens": [], "pending": [], "ids": set()}

    def where() -> str:
        return f"{path}, line {parser.CurrentLineNumber}"

    def start(name: str, attrs: dict[str, str]) -> None:
        if name == "sentence":
            if state["sentence"] is not None:
                raise RaganatoError(f"{where()}: <sentence> inside another sentence")
            state["sentence"] = attrs.get("id", f"#{len(data.sentences)}")
            state["tokens"], state["pending"] = [], []
        elif name in ("wf", "instance"):
            if state["sentence"] is None:
                raise RaganatoError(f"{where()}: <{name}> outside any <sentence>")
            if name == "instance":
                missing = [a for a in ("id", "lemma", "pos") if not attrs.get(a)]
                if missing:
                    raise RaganatoError(f"{where()}: <instance> without {', '.join(missing)}")
                if attrs["id"] in state["ids"]:
                    raise RaganatoError(f"{where()}: instance id {attrs['id']} occurs twice")
                state["ids"].add(attrs["id"])
            state["token"] = (name, attrs, parser.CurrentLineNumber, [])

    def text(chunk: str) -> None:
        if state["token"] is not None:
            state["token"][3].append(chunk)

    def end(name: str) -> None:
        if name in ("wf", "instance") and state["token"] is not None:
            kind, attrs, line, parts = state["token"]
            surface = " ".join("".join(parts).split())
            if not surface:
                raise RaganatoError(f"{path}, line {line}: an empty <{kind}>")
            offset = sum(len(t) + 1 for t in state["tokens"])
            state["tokens"].append(surface)
            if kind == "instance":
                state["pending"].append((attrs, offset, offset + len(surface), line))
            state["token"] = None
        elif name == "sentence":
            index = len(data.sentences)
            data.sentences.append(RaganatoSentence(state["sentence"], " ".join(state["tokens"])))
            for attrs, a, b, line in state["pending"]:
                data.instances.append(Instance(attrs["id"], attrs["lemma"], attrs["pos"], index, a, b, line))
            state["sentence"] = None

    parser.StartElementHandler = start
    parser.EndElementHandler = end
    parser.CharacterDataHandler = text
    with open(path, "rb") as handle:
        try:
            parser.ParseFile(handle)
        except expat.ExpatError as error:
            raise RaganatoError(f"{path}, line {error.lineno}: malformed XML "
                                f"({expat.ErrorString(error.code)})") from None
    return data


def read_keys(path: str | os.PathLike) -> dict[str, list[str]]:
    """A key file: instance id -> its keys in file order. A repeated id adds its keys (as the framework's
    scorer does); a line with an id and no key is an error naming the file and line."""
    path = Path(path)
    if not path.is_file():
        raise RaganatoError(f"{path}: no such file")
    keys: dict[str, list[str]] = {}
    offset = 0
    with open(path, "rb") as handle:
        for number, raw in enumerate(handle, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as error:
                raise RaganatoError(f"{path}, line {number}: cannot decode as utf-8 at byte offset "
                                    f"{offset + error.start} (byte 0x{raw[error.start]:02x})") from None
            offset += len(raw)
            if number == 1:
                line = line.removeprefix("\ufeff")
            fields = line.split()
            if not fields:
                continue
            if len(fields) < 2:
                raise RaganatoError(f"{path}, line {number}: expected 'id key [key ...]', got {line.strip()!r}")
            known = keys.setdefault(fields[0], [])
            known.extend(k for k in fields[1:] if k not in known)
    return keys


def write_keys(path: str | os.PathLike, predictions: Mapping[str, str | Sequence[str]]) -> Path:
    """One line per instance, `id key [key ...]`, in the mapping's order, written atomically."""
    path = Path(path)
    with atomic_write(path, "w", encoding="utf-8") as handle:
        for instance_id, keys in predictions.items():
            keys = [keys] if isinstance(keys, str) else list(keys)
            handle.write(" ".join([instance_id, *keys]) + "\n")
    return path
