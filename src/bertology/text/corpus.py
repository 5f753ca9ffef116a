"""Streaming corpus readers: each yields one document at a time as a list of sentences.

Formats:

- ``"bert"``: the google-research/bert pretraining format. One sentence per line, a blank line between documents;
  the end of a file also ends a document.
- ``"text"``: raw running text. One file is one document; blank lines separate paragraphs, the lines of a paragraph
  are joined, and each paragraph is split into sentences by :func:`bertology.text.sentences.split_sentences`
  (a sentence never spans a paragraph break). A single file therefore has to fit in memory as one document.
- ``"jsonl"``: one JSON object per line; the string under ``text_field`` is one document, split into paragraphs at
  blank lines and into sentences as for ``"text"``. Blank lines are skipped.
- ``"brown"``: the Brown corpus as NLTK distributes it: ``word/tag`` tokens, one sentence per line, paragraphs
  separated by blank lines, one file per document. Tags are dropped and the words detokenised (no space before
  closing punctuation, `````` and ``''`` become ``"``, the period Brown adds after a sentence-final abbreviation
  is dropped). A directory given for this format contributes only its
  corpus files (``ca01`` ... ``cr09``), not ``README``, ``CONTENTS`` or ``cats.txt``.
- ``"glue"``: a GLUE task's unlabelled text (task-adaptive pretraining): the ``train.tsv`` of the task named by
  ``task`` (sst2, cola, mrpc, rte, stsb), read by :func:`bertology.tasks.readers.read_glue` with its checks; each
  example is one document, its text (and its second text, for a pair) one sentence each; the labels are not read.
  A directory given for this format contributes only its ``train.tsv`` files.

Files are read line by line in binary and decoded per line, so the corpus never has to fit in memory and a decoding
error can name the byte offset of the first bad byte. The encoding must be ASCII-compatible (UTF-8, Latin-1, ...).
Documents without any sentence are skipped; a corpus with no document at all is an error.
"""

from __future__ import annotations

import codecs
import csv
import glob
import math
import os
import re
from itertools import chain
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from bertology.text.sentences import split_sentences
from bertology.text.examples import LabelSet, TextExample
from bertology.errors import ConfigError, DataError
from bertology.inputs import check_unicode, json_object

__all__ = ["CORPUS_FORMATS", "GLUE_TASKS", "CorpusFormat", "CorpusSource", "GlueTask", "glue_task", "list_corpus_files",
           "read_documents", "read_glue", "read_sources"]

CorpusFormat = Literal["bert", "text", "jsonl", "brown", "glue"]
CORPUS_FORMATS: tuple[str, ...] = ("bert", "text", "jsonl", "brown", "glue")

PathLike = str | os.PathLike
PathsLike = str | os.PathLike | Iterable[str | os.PathLike]

# Files a directory contributes for a format; formats not listed take every regular, non-hidden file.
_DIRECTORY_FILES = {"brown": re.compile(r"c[a-r]\d\d"), "glue": re.compile(r"train\.tsv")}
_PARAGRAPH_BREAK = re.compile(r"\n[ \t\r\f\v]*\n")


def _expand(entry: str | os.PathLike, name_filter: re.Pattern | None) -> list[Path]:
    """The regular files one path entry stands for: a file, a directory (recursive, sorted) or a glob pattern."""
    text = os.fspath(entry)
    path = Path(text)
    if path.is_file():
        return [path]
    if path.is_dir():
        found = []
        for child in path.rglob("*"):
            relative = child.relative_to(path).parts
            if any(part.startswith(".") for part in relative) or not child.is_file():
                continue
            if name_filter is None or name_filter.fullmatch(child.name):
                found.append(child)
        return sorted(found)
    if glob.has_magic(text):
        files: list[Path] = []
        for match in sorted(glob.glob(text, recursive=True)):
            files.extend(_expand(match, name_filter) if Path(match).is_dir() else [Path(match)])
        return [file for file in files if file.is_file()]
    raise DataError(f"{text}: no such file or directory")


def list_corpus_files(paths: PathsLike, format: CorpusFormat | None = None) -> list[Path]:
    """Resolve ``paths`` (a file, a directory, a glob, or a list of those) to the corpus files, in reading order."""
    entries = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    if not entries:
        raise DataError("no corpus paths given")
    name_filter = _DIRECTORY_FILES.get(format) if format else None
    files: list[Path] = []
    seen: set[Path] = set()
    for entry in entries:
        matched = _expand(entry, name_filter)
        if not matched:
            raise DataError(f"{os.fspath(entry)}: matched no files")
        for file in matched:
            key = file.resolve()
            if key not in seen:
                seen.add(key)
                files.append(file)
    return files


def _check_encoding(encoding: str) -> None:
    try:
        codecs.lookup(encoding)
    except LookupError:
        raise DataError(f"unknown text encoding {encoding!r}") from None
    if "\n".encode(encoding) != b"\n":
        raise DataError(f"encoding {encoding!r} is not ASCII-compatible; corpus files must be (e.g. utf-8)")


def jsonl_text(line: str, path: Path, number: int, text_field: str) -> str:
    """The string under ``text_field`` of one JSONL line; errors name the file, the line and what is wrong."""
    record = json_object(line, f"{path}: line {number}")
    if text_field not in record:
        keys = ", ".join(map(repr, record)) or "none"
        raise DataError(f"{path}: line {number}: missing field {text_field!r} (fields: {keys})")
    text = record[text_field]
    if not isinstance(text, str):
        raise DataError(f"{path}: line {number}: field {text_field!r} is {type(text).__name__}, not a string")
    check_unicode(record, f"{path}: line {number}")  # every field: an id is written to indexes too
    return text


def read_lines(path: Path, encoding: str) -> Iterator[tuple[int, str]]:
    """Yield ``(line_number, text)`` without the line ending; a decoding error names the byte offset."""
    offset = 0
    with open(path, "rb") as handle:
        for number, raw in enumerate(handle, start=1):
            try:
                line = raw.decode(encoding)
            except UnicodeDecodeError as error:
                raise DataError(
                    f"{path}: line {number}: cannot decode as {encoding} at byte offset {offset + error.start} "
                    f"(byte 0x{raw[error.start]:02x})"
                ) from None
            if number == 1 and line.startswith("\ufeff"):
                line = line[1:]
            offset += len(raw)
            yield number, line.rstrip("\r\n")


def _split_text(text: str) -> list[str]:
    """Sentences of a text whose paragraphs are separated by blank lines."""
    sentences: list[str] = []
    for paragraph in _PARAGRAPH_BREAK.split(text.replace("\r\n", "\n")):
        sentences.extend(split_sentences(paragraph))
    return sentences


def _bert_documents(path: Path, encoding: str) -> Iterator[list[str]]:
    document: list[str] = []
    for _, line in read_lines(path, encoding):
        line = line.strip()
        if line:
            document.append(line)
        elif document:
            yield document
            document = []
    if document:
        yield document


def _text_documents(path: Path, encoding: str) -> Iterator[list[str]]:
    document: list[str] = []
    paragraph: list[str] = []
    for _, line in read_lines(path, encoding):
        if line.strip():
            paragraph.append(line)
        elif paragraph:
            document.extend(split_sentences(" ".join(paragraph)))
            paragraph = []
    document.extend(split_sentences(" ".join(paragraph)))
    if document:
        yield document


def _jsonl_documents(path: Path, encoding: str, text_field: str) -> Iterator[list[str]]:
    for number, line in read_lines(path, encoding):
        if not line.strip():
            continue
        text = jsonl_text(line, path, number, text_field)
        document = _split_text(text)
        if document:
            yield document


# Brown detokenisation, on the words joined by single spaces: no space before closing marks, none after opening
# ones; Brown's `` and '' quotes become ".
_SPACE_BEFORE_CLOSER = re.compile(r" ([,.;:!?)\]}]|'')(?= |$)")
_SPACE_AFTER_OPENER = re.compile(r"(?<![^ ])(``|[(\[{]) (?=.)")
_DOUBLED_PERIOD = re.compile(r"(?<=\.) \.(?= |$)")  # "Jr. ." at a sentence end


def _detokenize(words: list[str]) -> str:
    text = " ".join(words)
    text = _DOUBLED_PERIOD.sub("", text)
    text = _SPACE_BEFORE_CLOSER.sub(r"\1", text)
    text = _SPACE_AFTER_OPENER.sub(r"\1", text)
    return text.replace("``", '"').replace("''", '"')


def _brown_documents(path: Path, encoding: str) -> Iterator[list[str]]:
    document: list[str] = []
    for number, line in read_lines(path, encoding):
        tokens = line.split()
        if not tokens:
            continue
        split = [token.rpartition("/") for token in tokens]
        for (word, slash, tag), token in zip(split, tokens):
            if not (word and slash and tag):
                raise DataError(f"{path}: line {number}: token {token!r} is not in word/tag form")
        document.append(_detokenize([word for word, _, _ in split]))
    if document:
        yield document


# --------------------------------------------------- GLUE's files, and the rows of delimited files (tasks.readers's too)
def existing_file(path: PathLike) -> Path:
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: no such file" if not path.exists() else f"{path}: not a regular file")
    return path


def split_rows(path: Path, delimiter: str, quoting: bool) -> Iterator[tuple[int, list[str]]]:
    """``(line number, fields)`` of each row of a delimited file. Blank lines at the end of the file are ignored, a
    blank line before a row is an error. With ``quoting`` a field may be quoted with ``"`` (a quoted field may span
    lines; the line number is the row's first); without it ``"`` is an ordinary character."""
    blank_at: int | None = None
    if not quoting:
        for number, line in read_lines(path, "utf-8"):
            if not line.strip() and delimiter not in line:
                blank_at = blank_at or number
                continue
            if blank_at is not None:
                raise DataError(f"{path}: line {blank_at}: blank line between rows")
            yield number, line.split(delimiter)
        return
    last = 0

    def physical() -> Iterator[str]:
        nonlocal last
        for number, line in read_lines(path, "utf-8"):
            last = number
            yield line + "\n"

    reader = csv.reader(physical(), delimiter=delimiter, quotechar='"', doublequote=True, strict=True)
    while True:
        start = last + 1
        try:
            fields = next(reader)
        except StopIteration:
            return
        except csv.Error as error:
            raise DataError(f"{path}: line {start}: bad quoting: {error}") from None
        if not fields or (len(fields) == 1 and not fields[0].strip()):
            blank_at = blank_at or start
            continue
        if blank_at is not None:
            raise DataError(f"{path}: line {blank_at}: blank line between rows")
        yield start, fields


def column_count_error(path: Path, number: int, expected: int, got: list[str], delimiter: str = "\t") -> DataError:
    name = {"\t": "tab", ",": "comma", ";": "semicolon", " ": "space"}.get(delimiter, repr(delimiter))
    return DataError(f"{path}: line {number}: expected {expected} {name}-separated columns, got {len(got)}")


def read_score(text: str, path: Path, number: int, low: float | None = None, high: float | None = None) -> float:
    try:
        value = float(text)
    except ValueError:
        raise DataError(f"{path}: line {number}: score {text!r} is not a number") from None
    if not math.isfinite(value):
        raise DataError(f"{path}: line {number}: score {text!r} is not finite")
    if (low is not None and value < low) or (high is not None and value > high):
        raise DataError(f"{path}: line {number}: score {value:g} outside [{low:g}, {high:g}]")
    return value


@dataclass(frozen=True)
class GlueTask:
    """The file layout of one GLUE task: ``columns`` per row, the ``header`` row (None: the file has none), the
    column of the text, of the pair (None: single sentences) and of the label; ``labels`` for classification,
    ``score_range`` for regression; ``directory`` is the task's folder in the GLUE distribution; ``metrics``: the
    names ``bertology.tasks.metrics`` reports for it; ``names``: what each label means, in the labels' order (the
    names a fine-tuned model's config.json gives them, ``id2label``), when the files' labels are codes."""

    name: str
    directory: str
    kind: Literal["classification", "regression"]
    columns: int
    header: tuple[str, ...] | None
    text: int
    text_pair: int | None
    label: int
    labels: LabelSet | None = None
    score_range: tuple[float, float] | None = None
    metrics: tuple[str, ...] = ("accuracy",)
    names: tuple[str, ...] | None = None

    def path(self, root: PathLike, split: str) -> Path:
        """``root/<directory>/<split>.tsv`` (``root``: the GLUE folder)."""
        return Path(root) / self.directory / f"{split}.tsv"


_BINARY = LabelSet(("0", "1"))
GLUE_TASKS: dict[str, GlueTask] = {
    "sst2": GlueTask("sst2", "SST-2", "classification", 2, ("sentence", "label"), 0, None, 1, _BINARY,
                     names=("negative", "positive")),
    "cola": GlueTask("cola", "CoLA", "classification", 4, None, 3, None, 1, _BINARY, metrics=("mcc",),
                     names=("unacceptable", "acceptable")),
    "mrpc": GlueTask("mrpc", "MRPC", "classification", 5, ("Quality", "#1 ID", "#2 ID", "#1 String", "#2 String"),
                     3, 4, 0, _BINARY, metrics=("accuracy", "f1"), names=("not_equivalent", "equivalent")),
    "rte": GlueTask("rte", "RTE", "classification", 4, ("index", "sentence1", "sentence2", "label"), 1, 2, 3,
                    LabelSet(("entailment", "not_entailment"))),
    "stsb": GlueTask("stsb", "STS-B", "regression", 10,
                     ("index", "genre", "filename", "year", "old_index", "source1", "source2", "sentence1",
                      "sentence2", "score"), 7, 8, 9, score_range=(0.0, 5.0), metrics=("pearson", "spearman")),
}


def glue_task(task: str) -> GlueTask:
    """The :class:`GlueTask` named ``task`` (``"sst2"``; ``"SST-2"`` and ``"sts-b"`` are accepted too)."""
    key = str(task).lower().replace("-", "").replace("_", "")
    if key not in GLUE_TASKS:
        raise ConfigError(f"task: unknown GLUE task {task!r} (known: {', '.join(GLUE_TASKS)})")
    return GLUE_TASKS[key]


def read_glue(task: str, path: PathLike) -> Iterator[TextExample]:
    """The examples of a GLUE ``train.tsv`` / ``dev.tsv`` of ``task`` (sst2, cola, mrpc, rte, stsb), one per row.

    Formats, as the GLUE distribution ships them (tab-separated, UTF-8, **no quoting**: ``"`` is an ordinary
    character, as it must be for MRPC, RTE and STS-B, whose texts hold unbalanced quotes):

    - SST-2: header ``sentence<TAB>label``; label 0/1. The sentences are lower-cased, PTB-tokenised, and end with a
      space, kept as it is.
    - CoLA: **no header**; 4 columns ``source, label, original mark, sentence``; label 0/1. ``dev.tsv`` has no final
      newline.
    - MRPC: starts with a UTF-8 byte-order mark (dropped); header ``Quality, #1 ID, #2 ID, #1 String, #2 String``;
      label (``Quality``) 0/1 first.
    - RTE: header ``index, sentence1, sentence2, label``; label ``entailment`` / ``not_entailment``.
    - STS-B: header of 10 columns, ``sentence1, sentence2, score`` last; the score is a float in [0, 5].

    ``TextExample.id`` is the data row number (0-based, header excluded) as a string; ``label`` the label's name
    (a string) or, for STS-B, the score (a float). Every row must have the task's column count, the header must be
    the task's, and a label outside the task's set (or a score outside [0, 5]) is an error naming the line; so is
    a file with no data row and a blank line between rows (blank lines at the end are ignored). The test splits
    (no labels, other columns) are not read here. Trap: with quoting on (``csv``'s default, pandas'), MRPC and
    STS-B rows silently merge; here a tab inside a text would show as a wrong column count instead."""
    spec = glue_task(task)
    return _read_glue(spec, existing_file(path))


def _read_glue(spec: GlueTask, path: Path) -> Iterator[TextExample]:
    rows = split_rows(path, "\t", quoting=False)
    index = 0
    header_line = None
    for number, fields in rows:
        if spec.header is not None and header_line is None:
            header_line = number
            if tuple(fields) != spec.header:
                raise DataError(f"{path}: line {number}: expected the {spec.directory} header "
                                f"{list(spec.header)!r}, got {fields!r}")
            continue
        if len(fields) != spec.columns:
            raise column_count_error(path, number, spec.columns, fields)
        raw_label = fields[spec.label]
        label: str | float
        if spec.labels is not None:
            spec.labels.index(raw_label, f"{path}: line {number}")
            label = raw_label
        else:
            low, high = spec.score_range or (None, None)
            label = read_score(raw_label, path, number, low, high)
        yield TextExample(str(index), fields[spec.text],
                          None if spec.text_pair is None else fields[spec.text_pair], label)
        index += 1
    if index == 0:
        raise DataError(f"{path}: no data rows after the header" if header_line is not None else f"{path}: empty file")


def _glue_documents(path: Path, task: str) -> Iterator[list[str]]:
    for example in read_glue(task, path):
        yield [example.text] if example.text_pair is None else [example.text, example.text_pair]


def _check_task(format: str, task: str | None) -> None:
    """The glue format names its task (a known one); the other formats name none."""
    if format != "glue":
        if task is not None:
            raise DataError(f"a corpus task ({task!r}) is read by the glue format only, not by {format!r}")
        return
    if task is None:
        raise DataError("the glue corpus format reads a GLUE task's train.tsv: name the task (sst2, cola, mrpc, "
                        "rte, stsb)")
    try:
        glue_task(task)
    except ConfigError as error:  # the reader's own message, as a data error naming the corpus task
        raise DataError(f"corpus {error}") from None


def read_documents(
    paths: PathsLike,
    format: CorpusFormat = "bert",
    text_field: str = "text",
    encoding: str = "utf-8",
    task: str | None = None,
) -> Iterator[list[str]]:
    """Stream the documents of a corpus, each as a list of sentences (see the module docstring for formats).

    ``paths`` is a file, a directory (read recursively in sorted order), a glob pattern, or a list of those.
    ``task`` names the GLUE task of the ``"glue"`` format. Missing paths and unknown formats fail at once; file
    content errors surface while iterating.
    """
    if format not in CORPUS_FORMATS:
        raise DataError(f"unknown corpus format {format!r}; expected one of {', '.join(CORPUS_FORMATS)}")
    _check_encoding(encoding)
    _check_task(format, task)
    files = list_corpus_files(paths, format)
    return _generate(files, format, text_field, encoding, task)


def _generate(files: list[Path], format: str, text_field: str, encoding: str,
              task: str | None = None) -> Iterator[list[str]]:
    count = 0
    for path in files:
        if format == "glue":
            assert task is not None
            documents = _glue_documents(path, task)
        elif format == "bert":
            documents = _bert_documents(path, encoding)
        elif format == "text":
            documents = _text_documents(path, encoding)
        elif format == "jsonl":
            documents = _jsonl_documents(path, encoding, text_field)
        else:
            documents = _brown_documents(path, encoding)
        for document in documents:
            count += 1
            yield document
    if count == 0:
        names = ", ".join(str(path) for path in files[:3]) + (", ..." if len(files) > 3 else "")
        raise DataError(f"empty corpus: no sentences in {len(files)} file(s) ({names})")


@dataclass(frozen=True)
class CorpusSource:
    """Part of a corpus in one format, e.g. Gutenberg as ``"text"`` beside Brown as ``"brown"``."""

    paths: PathsLike
    format: CorpusFormat = "bert"
    text_field: str = "text"
    encoding: str = "utf-8"
    task: str | None = None  # the GLUE task of the "glue" format

    def files(self) -> list[Path]:
        return list_corpus_files(self.paths, self.format)

    def documents(self) -> Iterator[list[str]]:
        return read_documents(self.paths, self.format, text_field=self.text_field, encoding=self.encoding,
                              task=self.task)


def read_sources(sources: Iterable[CorpusSource]) -> Iterator[list[str]]:
    """Documents of several sources, one after another; each source must yield at least one document."""
    readers = [source.documents() for source in sources]  # validate every source before reading any
    if not readers:
        raise DataError("no corpus sources given")
    return chain.from_iterable(readers)
