"""Readers of the fine-tuning tasks' files, returning the typed examples of ``bertology.tasks.examples``.

- :func:`read_glue`: SST-2, CoLA, MRPC, RTE, STS-B in the GLUE distribution's tsv formats (:data:`GLUE_TASKS`;
  defined with the row readers in ``bertology.text.corpus``, as pretraining reads GLUE's texts too);
- :func:`read_conll`: CoNLL-2003 (``word POS chunk NER``, IOB1 tags) as BIO-tagged sentences;
  :func:`iob1_to_bio`, :func:`bio_to_iob1` convert tag sequences;
- :func:`read_squad`: SQuAD v1.1 JSON, every answer checked against its context; :func:`split_squad_by_article`;
- :func:`read_task_file`: a user's own task described by a :class:`TaskFileConfig` (tsv, jsonl or CoNLL columns);
- :func:`check_label_sets`: two splits must have the same labels.

Text files are read line by line in binary and decoded per line as UTF-8 (a leading byte-order mark dropped), so a
file never has to fit in memory and a bad byte is reported with its offset. The tsv and CoNLL readers are
generators: the file is opened on the first ``next``, and an error in row 5,000 surfaces after 4,999 examples have
been yielded (``list(...)`` them to check a whole file first). Errors about the input are ``DataError``s naming
the file and the line (SQuAD: the question id or the JSON path); errors about the arguments are ``ConfigError``s
raised at the call.

Example ids: the data row number (0-based, the header not counted) for tsv and jsonl rows, the sentence number
(0-based) for CoNLL, the question id for SQuAD.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from bertology.config import from_mapping, validate
from bertology.text.corpus import GLUE_TASKS, GlueTask, glue_task, read_glue, read_lines
from bertology.text.corpus import column_count_error as _column_count_error
from bertology.text.corpus import existing_file as _existing
from bertology.text.corpus import read_score as _score
from bertology.text.corpus import split_rows as _split_rows
from bertology.errors import ConfigError, DataError
from bertology.inputs import check_unicode, json_kind, json_object
from bertology.text.examples import Answer, LabelSet, QAExample, TaggedSentence, TextExample

__all__ = [
    "GLUE_TASKS", "GlueTask", "TaskFileConfig", "bio_to_iob1", "check_glue_splits", "check_label_sets",
    "glue_task", "iob1_to_bio", "read_conll", "read_glue", "read_squad", "read_task_file", "split_squad_by_article",
]

PathLike = str | os.PathLike


def check_label_sets(train: Iterable[TextExample | TaggedSentence], dev: Iterable[TextExample | TaggedSentence],
                     train_name: str = "train", dev_name: str = "dev") -> LabelSet | None:
    """Check that two splits have the same labels and return them as a :class:`LabelSet` (sorted; see
    ``LabelSet.from_labels``), or None when the examples carry no class labels (regression, unlabelled).

    TextExamples are compared by label name; TaggedSentences by entity type (``B-LOC`` and ``I-LOC`` are ``LOC``),
    since which of ``B-``/``I-`` occurs depends on how entities touch. A label of one split missing from the other
    is a DataError naming both splits (``train_name``, ``dev_name``: e.g. their paths) and the id of the first
    example holding the extra label. The examples are consumed once (generators are fine)."""
    first_train = _first_labels(train)
    first_dev = _first_labels(dev)
    if first_train is None and first_dev is None:
        return None
    first_train, first_dev = first_train or {}, first_dev or {}
    only_dev = [label for label in first_dev if label not in first_train]
    only_train = [label for label in first_train if label not in first_dev]
    if only_dev or only_train:
        parts = []
        if only_dev:
            parts.append(f"{dev_name} has " + ", ".join(f"{label!r} (first in example {first_dev[label]})"
                                                        for label in only_dev[:5]) + f" that {train_name} lacks")
        if only_train:
            parts.append(f"{train_name} has " + ", ".join(f"{label!r} (first in example {first_train[label]})"
                                                          for label in only_train[:5]) + f" that {dev_name} lacks")
        raise DataError(f"{dev_name}: labels differ from {train_name}'s: " + "; ".join(parts))
    return LabelSet.from_labels(first_train)


def _first_labels(examples: Iterable[TextExample | TaggedSentence]) -> dict[str, str] | None:
    """label -> id of the first example holding it; None when no example has a class label."""
    first: dict[str, str] = {}
    labelled = False
    for example in examples:
        if isinstance(example, TaggedSentence):
            if example.tags is None:
                continue
            labelled = True
            for tag in example.tags:
                if tag != "O":
                    first.setdefault(tag[2:], example.id)
        elif isinstance(example.label, str):
            labelled = True
            first.setdefault(example.label, example.id)
    return first if labelled else None


def check_glue_splits(task: str, train_path: PathLike, dev_path: PathLike) -> LabelSet | None:
    """Read both splits of a GLUE task (each row checked as by :func:`read_glue`) and check that their label sets
    are equal (:func:`check_label_sets`); the task's labels, None for STS-B."""
    train, dev = read_glue(task, train_path), read_glue(task, dev_path)  # both files checked before either is read
    check_label_sets(train, dev, str(Path(train_path)), str(Path(dev_path)))
    return glue_task(task).labels


# --------------------------------------------------------------------------------------------------- CoNLL
_TAG = re.compile(r"O|[BI]-\S+")
Scheme = Literal["BIO", "IOB1"]


def _tag_type(tag: str) -> str | None:
    return None if tag == "O" else tag[2:]


def _check_tags(tags: Sequence[str]) -> None:
    for i, tag in enumerate(tags):
        if not isinstance(tag, str) or not _TAG.fullmatch(tag):
            raise DataError(f"invalid tag {tag!r} at position {i} (expected O, B-TYPE or I-TYPE)")


def iob1_to_bio(tags: Sequence[str]) -> list[str]:
    """IOB1 tags (``B-X`` only where an entity follows one of the same type X) to BIO (every entity starts with
    ``B-X``): an ``I-X`` that starts an entity (at the start, after ``O``, or after a tag of another type) becomes
    ``B-X``; everything else is kept. A BIO sequence is returned unchanged, so this also repairs BIO sequences
    that start an entity with ``I-``. The entities (as conlleval reads them) are the same before and after."""
    _check_tags(tags)
    out = []
    previous = None
    for tag in tags:
        kind = _tag_type(tag)
        if tag.startswith("I-") and previous != kind:
            tag = "B-" + kind  # type: ignore[operator]
        out.append(tag)
        previous = kind
    return out


def bio_to_iob1(tags: Sequence[str]) -> list[str]:
    """BIO tags to IOB1: a ``B-X`` stays ``B-X`` only where it follows a tag of the same type X (two entities of
    one type touching), else it becomes ``I-X``; ``I-`` and ``O`` are kept. Inverse of :func:`iob1_to_bio` on
    IOB1 input."""
    _check_tags(tags)
    out = []
    previous = None
    for tag in tags:
        kind = _tag_type(tag)
        if tag.startswith("B-") and previous != kind:
            tag = "I-" + kind  # type: ignore[operator]
        out.append(tag)
        previous = kind
    return out


def read_conll(path: PathLike, tag_column: int | None = -1, scheme_out: Scheme | None = "BIO", *,
               word_column: int = 0, encoding: str = "utf-8") -> Iterator[TaggedSentence]:
    """The sentences of a CoNLL column file such as CoNLL-2003's ``eng.train``: one token a line, columns separated
    by whitespace (``word POS chunk NER``), a blank line after each sentence, and ``-DOCSTART- -X- O O`` lines
    between documents. A document line is not a sentence: it ends the current sentence and starts a new
    document (``TaggedSentence.document`` counts documents from 0; a file without them is one document).

    ``tag_column`` (an index, negative from the end; None: no tags, e.g. an unlabelled file) holds the tags, each
    ``O``, ``B-TYPE`` or ``I-TYPE``. Trap: **CoNLL-2003's tags are IOB1** (``I-`` throughout, ``B-`` only where two
    entities of one type touch), and training or scoring them as BIO miscounts entities; ``scheme_out="BIO"``
    converts with :func:`iob1_to_bio` (a no-op on BIO input, so BIO files read the same), ``"IOB1"`` converts to
    IOB1, None keeps the tags as written. ``columns`` keeps every token's columns unconverted.

    Errors name the file and the line: a token line whose column count differs from the file's first token line,
    a tag that is not O / B-X / I-X, a tag column that does not exist or is the word column, bytes that are not
    ``encoding``, and a file with no sentence."""
    if scheme_out not in ("BIO", "IOB1", None):
        raise ConfigError(f"scheme_out: expected 'BIO', 'IOB1' or None, got {scheme_out!r}")
    if tag_column is not None and (not isinstance(tag_column, int) or isinstance(tag_column, bool)):
        raise ConfigError(f"tag_column: expected an int or None, got {tag_column!r}")
    path = _existing(path)
    return (sentence for sentence, _ in _conll_sentences(path, tag_column, scheme_out, word_column, encoding))


def _conll_sentences(path: Path, tag_column: int | None, scheme_out: Scheme | None, word_column: int,
                     encoding: str) -> Iterator[tuple[TaggedSentence, list[int]]]:
    """Each sentence with the line numbers of its tokens."""
    width: int | None = None
    document, document_used = 0, False
    count = 0
    columns: list[list[str]] = []
    lines: list[int] = []

    def sentence() -> tuple[TaggedSentence, list[int]]:
        words = [token[word_column] for token in columns]
        tags: list[str] | None = None
        if tag_column is not None:
            tags = [token[tag_column] for token in columns]
            if scheme_out == "BIO":
                tags = iob1_to_bio(tags)
            elif scheme_out == "IOB1":
                tags = bio_to_iob1(iob1_to_bio(tags))
        return TaggedSentence(str(count), words, tags, columns, document), lines

    for number, line in read_lines(path, encoding):
        fields = line.split()
        if not fields or fields[0] == "-DOCSTART-":
            if columns:
                yield sentence()
                count += 1
                document_used = True
                columns, lines = [], []
            if fields and document_used:
                document, document_used = document + 1, False
            continue
        if width is None:
            width = len(fields)
            for name, index in (("word_column", word_column), ("tag_column", tag_column)):
                if index is not None and not -width <= index < width:
                    raise DataError(f"{path}: line {number}: {name} {index} does not exist in a line of "
                                    f"{width} columns")
            if tag_column is not None and tag_column % width == word_column % width:
                raise DataError(f"{path}: line {number}: the tag column ({tag_column}) is the word column; "
                                f"a file of {width} column(s) has no tags (tag_column=None reads it untagged)")
        elif len(fields) != width:
            raise DataError(f"{path}: line {number}: expected {width} columns as in the file's first token line, "
                            f"got {len(fields)}")
        if tag_column is not None and not _TAG.fullmatch(fields[tag_column]):
            raise DataError(f"{path}: line {number}: invalid tag {fields[tag_column]!r} (expected O, B-TYPE or "
                            f"I-TYPE)")
        columns.append(fields)
        lines.append(number)
    if columns:
        yield sentence()
        count += 1
    if count == 0:
        raise DataError(f"{path}: no sentences (empty file)" if width is None else f"{path}: no sentences")


# --------------------------------------------------------------------------------------------------- SQuAD
def read_squad(path: PathLike) -> list[QAExample]:
    """The questions of a SQuAD v1.1 JSON file: ``{"data": [{"title", "paragraphs": [{"context", "qas": [{"id",
    "question", "answers": [{"text", "answer_start"}]}]}]}], "version"}``, one :class:`QAExample` per question,
    in file order; examples of one paragraph share its context string.

    The file is one JSON document, so it is parsed whole (the official train set is 30 MB). Every answer is
    checked: ``context[answer_start:answer_start + len(text)] == text`` (offsets are characters, not bytes; a
    mismatch is an error naming the question id and the offsets). Errors: bytes that are not UTF-8 (the offset),
    invalid JSON (line and column), a wrong schema (the JSON path, e.g. ``data[3].paragraphs[2].qas[0].answers``:
    a missing key, a wrong type, an empty answer list), and a question id given twice. Keys outside the schema
    are ignored; SQuAD 2.0's unanswerable questions (``is_impossible`` true) are refused."""
    path = _existing(path)
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        line = raw.count(b"\n", 0, error.start) + 1
        raise DataError(f"{path}: line {line}: cannot decode as utf-8 at byte offset {error.start} "
                        f"(byte 0x{raw[error.start]:02x})") from None
    del raw
    if not text.strip():
        raise DataError(f"{path}: empty file")
    try:
        document = json.loads(text)
    except json.JSONDecodeError as error:
        raise DataError(f"{path}: line {error.lineno} column {error.colno}: invalid JSON: {error.msg}") from None
    except RecursionError:
        raise DataError(f"{path}: invalid JSON: arrays or objects nested too deeply") from None
    del text
    check_unicode(document, str(path))

    def field(record: Mapping[str, Any], key: str, kind: type, where: str) -> Any:
        if key not in record:
            raise DataError(f"{path}: {where}: missing key {key!r}")
        value = record[key]
        if not isinstance(value, kind) or isinstance(value, bool):
            raise DataError(f"{path}: {where}.{key}: expected {_json_type(kind)}, got {json_kind(value)}")
        return value

    def mapping(value: Any, where: str) -> Mapping[str, Any]:
        if not isinstance(value, dict):
            raise DataError(f"{path}: {where}: expected an object, got {json_kind(value)}")
        return value

    examples: list[QAExample] = []
    seen: dict[str, str] = {}
    root = mapping(document, "(top level)")
    for i, article in enumerate(field(root, "data", list, "(top level)")):
        where_article = f"data[{i}]"
        article = mapping(article, where_article)
        title = field(article, "title", str, where_article)
        for j, paragraph in enumerate(field(article, "paragraphs", list, where_article)):
            where_paragraph = f"{where_article}.paragraphs[{j}]"
            paragraph = mapping(paragraph, where_paragraph)
            context = field(paragraph, "context", str, where_paragraph)
            for k, qa in enumerate(field(paragraph, "qas", list, where_paragraph)):
                where_qa = f"{where_paragraph}.qas[{k}]"
                qa = mapping(qa, where_qa)
                qid = field(qa, "id", str, where_qa)
                if qid in seen:
                    raise DataError(f"{path}: question id {qid!r} at {where_qa} repeats the one at {seen[qid]}")
                seen[qid] = where_qa
                question = field(qa, "question", str, where_qa)
                if qa.get("is_impossible") is True:
                    raise DataError(f"{path}: {where_qa}: question {qid!r} is a SQuAD 2.0 unanswerable question; "
                                    f"only SQuAD v1.1 is read")
                raw_answers = field(qa, "answers", list, where_qa)
                if not raw_answers:
                    raise DataError(f"{path}: {where_qa}.answers: question {qid!r} has no answer")
                answers = []
                for a, answer in enumerate(raw_answers):
                    where_answer = f"{where_qa}.answers[{a}]"
                    answer = mapping(answer, where_answer)
                    answer_text = field(answer, "text", str, where_answer)
                    start = field(answer, "answer_start", int, where_answer)
                    end = start + len(answer_text)
                    if not answer_text.strip():
                        raise DataError(f"{path}: question {qid!r} ({where_answer}): empty answer text")
                    if start < 0 or context[start:end] != answer_text:
                        found = context[start:end] if start >= 0 else ""
                        raise DataError(f"{path}: question {qid!r} ({where_answer}): answer {answer_text!r} at "
                                        f"characters [{start}, {end}) does not match the context there "
                                        f"({found!r}; the context has {len(context)} characters)")
                    answers.append(Answer(answer_text, start))
                examples.append(QAExample(qid, question, context, answers, title))
    if not examples:
        raise DataError(f"{path}: no questions")
    return examples


def _json_type(kind: type) -> str:
    return {list: "a list", str: "a string", int: "an integer", dict: "an object"}.get(kind, kind.__name__)


def split_squad_by_article(examples: Iterable[QAExample] | PathLike, *, dev_fraction: float | None = None,
                           dev_articles: int | Collection[str] | None = None,
                           seed: int = 0) -> tuple[list[QAExample], list[QAExample]]:
    """Split SQuAD questions into ``(train, dev)`` by article, so that no context is in both.

    ``examples``: QAExamples, or the path of a SQuAD file (read with :func:`read_squad`). Give one of
    ``dev_fraction`` (the share of the articles, in (0, 1): ``round(fraction * articles)`` of them, at least one and
    at least one left for train), or ``dev_articles``: a number of articles, or the titles of the dev articles.

    The rule (deterministic, independent of Python's ``random`` and of the articles' order in the file): the
    articles are ranked by ``sha256(f"{seed}:{title}")`` and the first ``n`` go to dev. Both lists keep the order
    of the input."""
    if isinstance(examples, (str, os.PathLike)):
        examples = read_squad(examples)
    examples = list(examples)
    titles = list(dict.fromkeys(example.title for example in examples))
    if (dev_fraction is None) == (dev_articles is None):
        raise ConfigError("split_squad_by_article: give one of dev_fraction and dev_articles")
    if len(titles) < 2:
        raise DataError(f"cannot split {len(titles)} article(s) into train and dev by article")
    if dev_fraction is not None:
        if isinstance(dev_fraction, bool) or not isinstance(dev_fraction, (int, float)) \
                or not 0.0 < dev_fraction < 1.0:
            raise ConfigError(f"dev_fraction: must be in (0, 1), got {dev_fraction!r}")
        count = min(max(round(dev_fraction * len(titles)), 1), len(titles) - 1)
        dev_titles = set(_rank_titles(titles, seed)[:count])
    elif isinstance(dev_articles, int) and not isinstance(dev_articles, bool):
        if not 1 <= dev_articles < len(titles):
            raise ConfigError(f"dev_articles: must be in [1, {len(titles) - 1}] for {len(titles)} articles, "
                              f"got {dev_articles}")
        dev_titles = set(_rank_titles(titles, seed)[:dev_articles])
    elif isinstance(dev_articles, Collection) and not isinstance(dev_articles, str):
        dev_titles = set(dev_articles)
        unknown = sorted(dev_titles - set(titles))
        if unknown:
            raise ConfigError(f"dev_articles: no article titled {', '.join(map(repr, unknown[:5]))}")
        if not dev_titles or len(dev_titles) == len(titles):
            raise ConfigError(f"dev_articles: must leave articles for both splits, got {len(dev_titles)} of "
                              f"{len(titles)}")
    else:
        raise ConfigError(f"dev_articles: expected a number of articles or a list of titles, got {dev_articles!r}")
    train = [example for example in examples if example.title not in dev_titles]
    dev = [example for example in examples if example.title in dev_titles]
    return train, dev


def _rank_titles(titles: Iterable[str], seed: int) -> list[str]:
    return sorted(titles, key=lambda title: (hashlib.sha256(f"{seed}:{title}".encode()).hexdigest(), title))


# ---------------------------------------------------------------------------------------------- a user's task
@dataclass
class TaskFileConfig:
    """A user's own task files (a ``task:`` section; unknown keys are errors, as everywhere).

    - ``format``: ``tsv`` (delimited rows), ``jsonl`` (one JSON object a line) or ``conll`` (token columns);
    - ``kind``: ``classification`` (labels are names: strings, or integers written as such), ``regression``
      (a finite number), ``tagging`` (``conll`` only; tags O/B-X/I-X, IOB1 or BIO, read as BIO);
    - ``text``, ``text_pair``, ``label``: the columns. For jsonl and tsv with ``header``: field / column names; for
      tsv without header: 0-based indices (negative from the end); for conll: indices, ``text`` the word column
      (default 0), ``label`` the tag column (default -1). ``text_pair`` is optional; ``label`` None reads
      unlabelled rows (not for conll);
    - ``header``: whether a tsv file starts with a header row (default true);
    - ``metric``: the name of the metric to evaluate with (checked by the metrics, not here);
    - ``labels``: the label names in a fixed order (classification: every label must be one of them; tagging: the
      entity types, e.g. ``[PER, LOC]``); by default the labels are those of the train split;
    - ``train``, ``dev``: the files (relative paths are taken from ``read_task_file``'s ``root``);
    - ``delimiter``: the tsv field separator (one character, default tab); ``quoting``: whether ``"`` quotes
      fields in tsv (default false: ``"`` is an ordinary character, as in GLUE's files).
    """

    format: Literal["tsv", "jsonl", "conll"] | None = None
    kind: Literal["classification", "regression", "tagging"] | None = None
    text: str | int | None = None
    text_pair: str | int | None = None
    label: str | int | None = None
    header: bool = True
    metric: str | None = None
    labels: list[str] | None = None
    train: str | None = None
    dev: str | None = None
    delimiter: str = "\t"
    quoting: bool = False

    def __post_init__(self) -> None:
        where = "TaskFileConfig"
        validate(self, where)
        for key in ("format", "kind"):
            if getattr(self, key) is None:
                raise ConfigError(f"{where}.{key}: required")
        if self.format == "conll":
            if self.kind != "tagging":
                raise ConfigError(f"{where}.kind: a conll file is read for tagging, got kind {self.kind!r}")
            if self.text is None:
                self.text = 0
            if self.label is None:
                self.label = -1
            if self.text_pair is not None:
                raise ConfigError(f"{where}.text_pair: a conll file has no text pair")
            columns: tuple[str, ...] = ("text", "label")
            wanted: type = int
        else:
            if self.kind == "tagging":
                raise ConfigError(f"{where}.kind: tagging reads format 'conll', got format {self.format!r}")
            if self.text is None:
                raise ConfigError(f"{where}.text: required (the column of the text)")
            columns = ("text", "text_pair", "label")
            wanted = int if self.format == "tsv" and not self.header else str
        for key in columns:
            value = getattr(self, key)
            if value is not None and not isinstance(value, wanted):
                what = {"conll": "a column index for a conll file",
                        "jsonl": "a field name for a jsonl file"}.get(self.format or "", "")
                if self.format == "tsv":
                    what = "a column index for a tsv file without header" if wanted is int else \
                        "a column name for a tsv file with a header (header: false to give indices)"
                raise ConfigError(f"{where}.{key}: expected {what}, got {value!r}")
        given = [getattr(self, key) for key in columns if getattr(self, key) is not None]
        if len(set(given)) != len(given):
            raise ConfigError(f"{where}: text, text_pair and label must be different columns, got {given!r}")
        if self.labels is not None:
            if self.kind == "regression":
                raise ConfigError(f"{where}.labels: a regression task has no label names")
            if not self.labels or len(set(self.labels)) != len(self.labels) or not all(self.labels):
                raise ConfigError(f"{where}.labels: must be distinct, non-empty names, got {self.labels!r}")
        if self.metric is not None and not self.metric.strip():
            raise ConfigError(f"{where}.metric: must not be empty")
        if len(self.delimiter) != 1 or self.delimiter in "\r\n\"":
            raise ConfigError(f"{where}.delimiter: must be one character other than a quote or a line break, "
                              f"got {self.delimiter!r}")
        for key in ("train", "dev"):
            value = getattr(self, key)
            if value is not None and not value.strip():
                raise ConfigError(f"{where}.{key}: an empty path")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str = "task") -> TaskFileConfig:
        """Build from a mapping (a YAML/JSON section); errors name ``where.<key>``."""
        return from_mapping(cls, data, where)

    def label_set(self) -> LabelSet | None:
        """The configured ``labels`` as a LabelSet (None when not given)."""
        return None if self.labels is None else LabelSet(self.labels)


def read_task_file(config: TaskFileConfig, split: Literal["train", "dev"],
                   root: PathLike | None = None) -> Iterator[TextExample] | Iterator[TaggedSentence]:
    """The examples of ``split`` (``"train"`` or ``"dev"``) of a user's task: TextExamples for classification and
    regression, TaggedSentences (BIO) for tagging; ids are data row numbers (0-based, header excluded) or sentence
    numbers. Relative paths are taken from ``root`` (default: the working directory).

    - tsv: rows split at ``delimiter``; every row must have the column count of the header (or of the first row);
      without ``quoting`` a ``"`` is an ordinary character (the GLUE convention; turn ``quoting`` on only for files
      written by a csv writer, whose quoted fields may span lines). Text is kept as written (not stripped).
    - jsonl: one JSON object a line, blank lines skipped; texts must be strings; a classification label a string
      or an integer (``1`` reads as ``"1"``), a regression label a number.
    - conll: as :func:`read_conll`, tags IOB1 or BIO, returned as BIO.

    Errors (DataError) name the file and the line: a wrong column count, a column name missing from the header, a
    missing field or a wrong type in jsonl, a label outside ``labels``, a regression label that is not a finite
    number, non-UTF-8 bytes, a file without examples."""
    if split not in ("train", "dev"):
        raise ConfigError(f"split: expected 'train' or 'dev', got {split!r}")
    value = getattr(config, split)
    if value is None:
        raise ConfigError(f"task.{split}: no file given for the {split} split")
    path = Path(value)
    if root is not None and not path.is_absolute():
        path = Path(root) / path
    path = _existing(path)
    labels = config.label_set()
    if config.format == "conll":
        return _task_conll(config, path, labels)
    if config.format == "jsonl":
        return _task_jsonl(config, path, labels)
    return _task_tsv(config, path, labels)


def _task_label(config: TaskFileConfig, labels: LabelSet | None, value: Any, path: Path, number: int,
                name: str) -> str | float:
    where = f"{path}: line {number}"
    if config.kind == "regression":
        if isinstance(value, str):
            return _score(value, path, number)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise DataError(f"{where}: label {name!r} must be a number for regression, got {json_kind(value)}")
        return _score(str(value), path, number)
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise DataError(f"{where}: label {name!r} must be a string or an integer, got {json_kind(value)}")
    label = str(value)
    if labels is not None:
        labels.index(label, where)
    elif not label:
        raise DataError(f"{where}: empty label")
    return label


def _task_tsv(config: TaskFileConfig, path: Path, labels: LabelSet | None) -> Iterator[TextExample]:
    width: int | None = None
    positions: dict[str, int | None] = {}
    index = 0
    header_line = None
    for number, fields in _split_rows(path, config.delimiter, config.quoting):
        if width is None:
            width = len(fields)
            if config.header:
                header_line = number
                for key in ("text", "text_pair", "label"):
                    name = getattr(config, key)
                    if name is None:
                        positions[key] = None
                    elif fields.count(name) != 1:
                        problem = "no column" if name not in fields else "two columns"
                        raise DataError(f"{path}: line {number}: {problem} named {name!r} in the header (task.{key};"
                                        f" columns: {', '.join(map(repr, fields))})")
                    else:
                        positions[key] = fields.index(name)
                continue
            for key in ("text", "text_pair", "label"):
                column = getattr(config, key)
                if column is not None and not -width <= column < width:
                    raise DataError(f"{path}: line {number}: task.{key} is column {column}, but the row has "
                                    f"{width} columns")
                positions[key] = column
        if len(fields) != width:
            raise _column_count_error(path, number, width, fields, config.delimiter)
        text_pair = None if positions["text_pair"] is None else fields[positions["text_pair"]]
        label = None
        if positions["label"] is not None:
            label = _task_label(config, labels, fields[positions["label"]], path, number, str(config.label))
        yield TextExample(str(index), fields[positions["text"]], text_pair, label)  # type: ignore[index]
        index += 1
    if index == 0:
        raise DataError(f"{path}: no data rows after the header" if header_line is not None else f"{path}: empty file")


def _task_jsonl(config: TaskFileConfig, path: Path, labels: LabelSet | None) -> Iterator[TextExample]:
    index = 0
    for number, line in read_lines(path, "utf-8"):
        if not line.strip():
            continue
        record = json_object(line, f"{path}: line {number}")
        check_unicode(record, f"{path}: line {number}")
        values: dict[str, Any] = {}
        for key in ("text", "text_pair", "label"):
            name = getattr(config, key)
            if name is None:
                values[key] = None
                continue
            if name not in record:
                fields = ", ".join(map(repr, record)) or "none"
                raise DataError(f"{path}: line {number}: missing field {name!r} (task.{key}; fields: {fields})")
            values[key] = record[name]
            if key != "label" and not isinstance(values[key], str):
                raise DataError(f"{path}: line {number}: field {name!r} must be a string, got "
                                f"{json_kind(values[key])}")
        label = None
        if config.label is not None:
            label = _task_label(config, labels, values["label"], path, number, str(config.label))
        yield TextExample(str(index), values["text"], values["text_pair"], label)
        index += 1
    if index == 0:
        raise DataError(f"{path}: no examples (empty file)")


def _task_conll(config: TaskFileConfig, path: Path, labels: LabelSet | None) -> Iterator[TaggedSentence]:
    for sentence, lines in _conll_sentences(path, config.label, "BIO", config.text, "utf-8"):  # type: ignore[arg-type]
        if labels is not None:
            for tag, number in zip(sentence.tags or (), lines):
                if tag != "O" and tag[2:] not in labels:
                    labels.index(tag[2:], f"{path}: line {number}: tag {tag!r}: entity type")
        yield sentence
