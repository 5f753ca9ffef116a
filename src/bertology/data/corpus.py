"""Streaming corpus readers: each yields one document at a time as a list of sentences.

Formats:

- ``"bert"``: the google-research/bert pretraining format. One sentence per line, a blank line between documents;
  the end of a file also ends a document.
- ``"text"``: raw running text. One file is one document; blank lines separate paragraphs, the lines of a paragraph
  are joined, and each paragraph is split into sentences by :func:`bertology.data.sentences.split_sentences`
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
import glob
import os
import re
from itertools import chain
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from bertology.data.sentences import split_sentences
from bertology.errors import DataError
from bertology.inputs import check_unicode, json_object

__all__ = ["CORPUS_FORMATS", "CorpusFormat", "CorpusSource", "list_corpus_files", "read_documents", "read_sources"]

CorpusFormat = Literal["bert", "text", "jsonl", "brown", "glue"]
CORPUS_FORMATS: tuple[str, ...] = ("bert", "text", "jsonl", "brown", "glue")

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


def _glue_documents(path: Path, task: str) -> Iterator[list[str]]:
    from bertology.tasks.readers import read_glue  # imported here: the tasks package imports this module

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
    from bertology.errors import ConfigError
    from bertology.tasks.readers import glue_task

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
