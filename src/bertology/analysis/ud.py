"""A CoNLL-U reader for Universal Dependencies treebanks (UD English-EWT and the like).

A sentence's `words` are its syntactic words (integer ids 1..n): the units that carry UPOS, a head and a relation.
Multiword tokens (`17-18  won't`) are kept as surface tokens: `text` is built from the surface tokens (a multiword
token's form stands for its words, `SpaceAfter=No` glues tokens), and `spans[i]` is word i's character span in
it. A multiword token's words split its surface form by character where their forms spell it ("wo" + "n't" =
"won't", case-insensitively); otherwise ("del" = "de" + "el") each of its words gets the whole surface span.
Empty nodes (`8.1`, enhanced-graph copies) are no words: they are counted and skipped.

Any malformed line raises `UDFormatError` naming the file and the line number.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from bertology.errors import DataError
from bertology.inputs import text_lines

UPOS_TAGS: tuple[str, ...] = ("ADJ", "ADP", "ADV", "AUX", "CCONJ", "DET", "INTJ", "NOUN", "NUM", "PART", "PRON",
                              "PROPN", "PUNCT", "SCONJ", "SYM", "VERB", "X")
_WORD_ID = re.compile(r"^[1-9][0-9]*$")
_RANGE_ID = re.compile(r"^([1-9][0-9]*)-([1-9][0-9]*)$")
_EMPTY_ID = re.compile(r"^(0|[1-9][0-9]*)\.[1-9][0-9]*$")


class UDFormatError(DataError):
    """A CoNLL-U file is malformed: the message names the file and the line."""


@dataclass(frozen=True)
class UDSentence:
    """One sentence: per syntactic word (0-based lists; word i has CoNLL-U id i + 1) its form, lemma, UPOS,
    head (0 = root, else the 1-based id of the head word), basic relation (`deprel`, subtypes such as
    `nmod:poss` kept) and character span in `text`."""

    sent_id: str
    words: list[str]
    lemmas: list[str]
    upos: list[str]
    heads: list[int]
    deprels: list[str]
    text: str  # rebuilt from the surface tokens and SpaceAfter=No
    spans: list[tuple[int, int]]  # word i's characters in `text`
    comment_text: str | None = None  # the `# text =` comment, when present
    source: str = ""  # "file:line" of the sentence's first line
    num_multiword: int = 0  # multiword tokens in the sentence
    num_empty: int = 0  # empty nodes skipped
    num_shared_spans: int = 0  # words of multiword tokens whose forms do not spell the surface form

    def __len__(self) -> int:
        return len(self.words)

    @property
    def relations(self) -> list[str]:
        """Universal relations without subtypes (`nmod:poss` -> `nmod`)."""
        return [d.split(":", 1)[0] for d in self.deprels]


@dataclass
class UDStats:
    """What a read met: sentences, words, multiword tokens and skipped empty nodes."""

    sentences: int = 0
    words: int = 0
    multiword_tokens: int = 0
    empty_nodes: int = 0
    shared_spans: int = 0
    files: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, object]:
        return {"sentences": self.sentences, "words": self.words, "multiword_tokens": self.multiword_tokens,
                "empty_nodes_skipped": self.empty_nodes, "multiword_words_sharing_a_span": self.shared_spans,
                "files": list(self.files)}


def read_conllu(path: str | os.PathLike, limit: int | None = None) -> list[UDSentence]:
    """Every sentence of a CoNLL-U file (the first `limit` when given)."""
    return list(iter_conllu(path, limit))


def iter_conllu(path: str | os.PathLike, limit: int | None = None) -> Iterator[UDSentence]:
    """Sentences of a CoNLL-U file one at a time; see the module docstring for words, spans and errors."""
    path = Path(path)
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
        raise DataError(f"limit must be a non-negative integer, got {limit!r}")
    if not path.is_file():
        raise UDFormatError(f"{path}: no such CoNLL-U file")
    count = 0
    block: list[tuple[int, str]] = []
    for number, line in text_lines(path, UDFormatError):  # bad bytes: named with the line and byte offset
        if line.strip():
            block.append((number, line))
            continue
        if block:
            if limit is not None and count >= limit:
                return
            yield _sentence(path, block)
            count += 1
            block = []
    if block and (limit is None or count < limit):
        yield _sentence(path, block)


def read_split(directory: str | os.PathLike, split: str, limit: int | None = None) -> list[UDSentence]:
    """The `split` ("train", "dev" or "test") file of a UD treebank folder: the one `*-ud-<split>.conllu`."""
    directory = Path(directory)
    found = sorted(directory.glob(f"*-ud-{split}.conllu"))
    if len(found) != 1:
        raise DataError(f"{directory}: expected one *-ud-{split}.conllu file, found "
                        f"{len(found) if found else 'none'}{': ' + ', '.join(p.name for p in found) if found else ''}")
    return read_conllu(found[0], limit)


def stats(sentences: list[UDSentence]) -> UDStats:
    """Counts over sentences (for an analysis's JSON)."""
    result = UDStats()
    for sentence in sentences:
        result.sentences += 1
        result.words += len(sentence)
        result.multiword_tokens += sentence.num_multiword
        result.empty_nodes += sentence.num_empty
        result.shared_spans += sentence.num_shared_spans
        file = sentence.source.rsplit(":", 1)[0]
        if file and file not in result.files:
            result.files.append(file)
    return result


# --------------------------------------------------------------------------------------------------- internals


def _sentence(path: Path, block: list[tuple[int, str]]) -> UDSentence:
    where = lambda number: f"{path}:{number}"  # noqa: E731
    sent_id = ""
    comment_text = None
    rows: list[tuple[int, list[str]]] = []  # word lines
    ranges: dict[int, tuple[int, int, str, str, int]] = {}  # first id -> (first, last, surface form, misc, line)
    empty = 0
    for number, line in block:
        if line.startswith("#"):
            body = line[1:].strip()
            if body.startswith("sent_id") and "=" in body:
                sent_id = body.split("=", 1)[1].strip()
            elif body.startswith("text ") or body.startswith("text="):
                if "=" in body:
                    comment_text = body.split("=", 1)[1].strip()
            continue
        cols = line.split("\t")
        if len(cols) != 10:
            raise UDFormatError(f"{where(number)}: expected 10 tab-separated columns, found {len(cols)}")
        token_id = cols[0]
        if _EMPTY_ID.match(token_id):
            empty += 1
            continue
        match = _RANGE_ID.match(token_id)
        if match:
            first, last = int(match.group(1)), int(match.group(2))
            if last <= first:
                raise UDFormatError(f"{where(number)}: multiword token range {token_id} is empty")
            if not cols[1]:
                raise UDFormatError(f"{where(number)}: multiword token {token_id} has no form")
            if any(first <= other_last and other_first <= last for other_first, other_last, *_ in ranges.values()):
                raise UDFormatError(f"{where(number)}: multiword token {token_id} overlaps another")
            ranges[first] = (first, last, cols[1], cols[9], number)
            continue
        if not _WORD_ID.match(token_id):
            raise UDFormatError(f"{where(number)}: bad ID {token_id!r} (expected an integer, a range such as "
                                "1-2, or an empty node such as 1.1)")
        rows.append((number, cols))
    if not rows:
        first_line = block[0][0]
        raise UDFormatError(f"{where(first_line)}: a sentence with no word lines")

    words, lemmas, upos, heads, deprels = [], [], [], [], []
    for position, (number, cols) in enumerate(rows, start=1):
        if int(cols[0]) != position:
            raise UDFormatError(f"{where(number)}: word ID {cols[0]} out of sequence (expected {position})")
        if not cols[1]:
            raise UDFormatError(f"{where(number)}: word {cols[0]} has an empty FORM")
        if cols[3] not in UPOS_TAGS:
            raise UDFormatError(f"{where(number)}: unknown UPOS {cols[3]!r} (expected one of {', '.join(UPOS_TAGS)})")
        if not re.fullmatch(r"0|[1-9][0-9]*", cols[6]):
            raise UDFormatError(f"{where(number)}: HEAD {cols[6]!r} is not a word ID")
        if not cols[7] or cols[7] == "_":
            raise UDFormatError(f"{where(number)}: word {cols[0]} has no DEPREL")
        words.append(cols[1])
        lemmas.append(cols[2])
        upos.append(cols[3])
        heads.append(int(cols[6]))
        deprels.append(cols[7])
    n = len(words)
    for (number, cols), head in zip(rows, heads):
        if head > n:
            raise UDFormatError(f"{where(number)}: HEAD {head} points past the sentence's {n} words")
        if head == int(cols[0]):
            raise UDFormatError(f"{where(number)}: word {cols[0]} is its own head")
    for first, (_, last, _, _, number) in ranges.items():
        if last > n:
            raise UDFormatError(f"{where(number)}: multiword token {first}-{last} covers words past the sentence's "
                                f"{n} words")

    # Surface tokens in order: a multiword token stands for its words; SpaceAfter=No sits on the token line.
    pieces: list[str] = []
    spans: list[tuple[int, int]] = [(0, 0)] * n
    shared = 0
    offset = 0
    i = 1
    while i <= n:
        if i in ranges:
            first, last, surface, misc, _ = ranges[i]
            start = offset
            forms = words[first - 1: last]
            if "".join(forms).lower() == surface.lower():
                at = start
                for k, form in enumerate(forms):
                    spans[first - 1 + k] = (at, at + len(form))
                    at += len(form)
            else:
                for k in range(len(forms)):
                    spans[first - 1 + k] = (start, start + len(surface))
                shared += len(forms)
            pieces.append(surface)
            offset += len(surface)
            i = last + 1
        else:
            number, cols = rows[i - 1]
            misc = cols[9]
            spans[i - 1] = (offset, offset + len(cols[1]))
            pieces.append(cols[1])
            offset += len(cols[1])
            i += 1
        if "SpaceAfter=No" not in misc.split("|") and i <= n:
            pieces.append(" ")
            offset += 1
    return UDSentence(
        sent_id=sent_id,
        words=words,
        lemmas=lemmas,
        upos=upos,
        heads=heads,
        deprels=deprels,
        text="".join(pieces),
        spans=spans,
        comment_text=comment_text,
        source=where(block[0][0]),
        num_multiword=len(ranges),
        num_empty=empty,
        num_shared_spans=shared,
    )
