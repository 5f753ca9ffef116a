"""The typed examples of the fine-tuning tasks, as the readers (``bertology.tasks.readers``, GLUE's in
``bertology.text.corpus``: pretraining reads its texts too) return them; ``bertology.tasks.examples`` names them too.

- :class:`TextExample`: a sentence or a sentence pair with a class name or a score (GLUE, a user's tsv/jsonl);
- :class:`TaggedSentence`: one sentence of a token-tagging task, its tags in BIO, each token's original columns kept
  (to write predictions in conlleval's format), and the index of its document (CoNLL-2003);
- :class:`QAExample`: one extractive question with its context and its answers as character offsets (SQuAD v1.1);
- :class:`LabelSet`: the ordered label names of a task, name <-> id; an unknown label is a DataError naming where.

Example ids are strings: the data row number (0-based, header excluded) for rows of a tsv/jsonl file, the sentence
number for CoNLL files, the question id for SQuAD. Predictions are written against these ids.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from bertology.errors import DataError

__all__ = ["Answer", "LabelSet", "QAExample", "TaggedSentence", "TextExample"]


@dataclass(frozen=True)
class TextExample:
    """A single sentence (``text_pair`` None) or a pair. ``label``: the label's name as a string (``"0"``,
    ``"entailment"``) for classification, a float for regression, None when the file has no labels."""

    id: str
    text: str
    text_pair: str | None = None
    label: str | float | None = None


@dataclass(frozen=True)
class TaggedSentence:
    """One sentence of a tagging task: ``words``, their ``tags`` (BIO unless the reader was asked otherwise; None
    for unlabelled files), ``columns``: every token's columns as they stand in the file (the word first, the
    original tags unconverted), and ``document``: the index of the document the sentence belongs to (0-based)."""

    id: str
    words: list[str]
    tags: list[str] | None
    columns: list[list[str]]
    document: int = 0

    def __len__(self) -> int:
        return len(self.words)


@dataclass(frozen=True)
class Answer:
    """An answer span: ``text`` equals ``context[start:start + len(text)]`` (the readers check it)."""

    text: str
    start: int

    @property
    def end(self) -> int:
        """The character offset just past the answer."""
        return self.start + len(self.text)


@dataclass(frozen=True)
class QAExample:
    """An extractive question: ``answers`` are spans of ``context`` (several, possibly equal, in dev sets);
    ``title`` names the article the context comes from (splits are made by article)."""

    id: str
    question: str
    context: str
    answers: list[Answer]
    title: str


@dataclass(frozen=True)
class LabelSet:
    """The label names of a task in a fixed order; a label's id is its position.

    ``index(name, where)`` raises a DataError for a name outside the set, naming ``where`` (``file: line 12``)."""

    names: tuple[str, ...]
    _ids: dict[str, int] = field(init=False, repr=False, compare=False, hash=False)

    def __init__(self, names: Iterable[str]) -> None:
        names = tuple(names)
        if not names:
            raise DataError("a label set needs at least one label")
        for name in names:
            if not isinstance(name, str) or not name:
                raise DataError(f"label names must be non-empty strings, got {name!r}")
        ids: dict[str, int] = {}
        for i, name in enumerate(names):
            if name in ids:
                raise DataError(f"label {name!r} is listed twice in the label set {list(names)!r}")
            ids[name] = i
        object.__setattr__(self, "names", names)
        object.__setattr__(self, "_ids", ids)

    @classmethod
    def from_labels(cls, labels: Iterable[str]) -> LabelSet:
        """The distinct labels seen, sorted (numerically when every label is an integer: ``"2"`` before ``"10"``),
        so that the order does not depend on the order of the examples."""
        distinct = set(labels)
        if distinct and all(_is_integer(name) for name in distinct):
            return cls(sorted(distinct, key=lambda name: (int(name), name)))
        return cls(sorted(distinct))

    def __len__(self) -> int:
        return len(self.names)

    def __iter__(self) -> Iterator[str]:
        return iter(self.names)

    def __contains__(self, name: object) -> bool:
        return name in self._ids

    def index(self, name: str, where: str = "") -> int:
        """The id of label ``name``; a name outside the set is a DataError naming ``where``."""
        try:
            return self._ids[name]
        except (KeyError, TypeError):
            prefix = f"{where}: " if where else ""
            raise DataError(f"{prefix}unknown label {name!r} (expected one of "
                            f"{', '.join(map(repr, self.names))})") from None

    def name(self, id: int) -> str:
        """The name of label id ``id``."""
        if not isinstance(id, int) or isinstance(id, bool) or not 0 <= id < len(self.names):
            raise IndexError(f"label id {id!r} outside 0..{len(self.names) - 1}")
        return self.names[id]


def _is_integer(text: str) -> bool:
    try:
        int(text)
    except ValueError:
        return False
    return True
