"""A user's own task files: TaskFileConfig (built and checked as every config) and read_task_file."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from bertology.config import load_yaml
from bertology.errors import ConfigError, DataError
from bertology.tasks.examples import TaggedSentence, TextExample
from bertology.tasks.readers import TaskFileConfig, read_task_file


def write(tmp_path: Path, name: str, content: str | bytes) -> Path:
    path = tmp_path / name
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    return path


def config(**values) -> TaskFileConfig:
    return TaskFileConfig.from_dict(values)


# ---------------------------------------------------------------------------------------------------- config
def test_config_from_yaml_and_python_agree() -> None:
    text = """
format: tsv
kind: classification
text: review
label: stars
labels: [bad, good]
metric: accuracy
train: data/train.tsv
dev: data/dev.tsv
"""
    built = TaskFileConfig.from_dict(load_yaml(text, "task.yaml"))
    assert built == TaskFileConfig(format="tsv", kind="classification", text="review", label="stars",
                                   labels=["bad", "good"], metric="accuracy", train="data/train.tsv",
                                   dev="data/dev.tsv")
    assert built.header and built.delimiter == "\t" and not built.quoting
    assert built.label_set().names == ("bad", "good")
    conll = config(format="conll", kind="tagging")
    assert (conll.text, conll.label) == (0, -1)


@pytest.mark.parametrize("values, message", [
    ({"format": "tsv", "kind": "classification", "text": "a", "lable": "b"},
     r"^task.lable: unknown key; did you mean label\? \(known: "),
    ({"kind": "classification", "text": "a"}, r"^task.format: required$"),
    ({"format": "csv", "kind": "classification", "text": "a"}, r"^task.format: expected one of 'tsv', 'jsonl', "),
    ({"format": "tsv", "kind": "classification"}, r"^task.text: required"),
    ({"format": "tsv", "kind": "classification", "text": 0}, r"^task.text: expected a column name for a tsv file "
                                                             r"with a header \(header: false to give indices\)"),
    ({"format": "tsv", "header": False, "kind": "classification", "text": "a"},
     r"^task.text: expected a column index for a tsv file without header, got 'a'"),
    ({"format": "jsonl", "kind": "regression", "text": "a", "label": 2},
     r"^task.label: expected a field name for a jsonl file, got 2"),
    ({"format": "tsv", "kind": "tagging", "text": "a"}, r"^task.kind: tagging reads format 'conll'"),
    ({"format": "conll", "kind": "classification"}, r"^task.kind: a conll file is read for tagging"),
    ({"format": "conll", "kind": "tagging", "text_pair": 1}, r"^task.text_pair: a conll file has no text pair"),
    ({"format": "tsv", "kind": "regression", "text": "a", "label": "s", "labels": ["x"]},
     r"^task.labels: a regression task has no label names"),
    ({"format": "tsv", "kind": "classification", "text": "a", "labels": ["x", "x"]},
     r"^task.labels: must be distinct, non-empty names"),
    ({"format": "tsv", "kind": "classification", "text": "a", "label": "a"},
     r"^task: text, text_pair and label must be different columns"),
    ({"format": "tsv", "kind": "classification", "text": "a", "delimiter": "::"},
     r"^task.delimiter: must be one character"),
    ({"format": "tsv", "kind": "classification", "text": "a", "header": "yes"},
     r"^task.header: expected bool, got str 'yes'"),
    ({"format": "tsv", "kind": "classification", "text": "a", "train": " "}, r"^task.train: an empty path"),
])
def test_config_errors(values: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        TaskFileConfig.from_dict(values)


def test_config_errors_from_python_name_the_class() -> None:
    with pytest.raises(ConfigError, match=r"^TaskFileConfig.kind: expected one of 'classification'"):
        TaskFileConfig(format="tsv", kind="ranking", text="a")  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------------------------- tsv
def test_tsv_with_header(tmp_path: Path) -> None:
    write(tmp_path, "train.tsv", 'id\tpremise\thypothesis\tgold\n7\tA "quote\tB.\tyes\n8\tC.\tD.\tno\n')
    task = config(format="tsv", kind="classification", text="premise", text_pair="hypothesis", label="gold",
                  train="train.tsv")
    assert list(read_task_file(task, "train", root=tmp_path)) == [
        TextExample("0", 'A "quote', "B.", "yes"), TextExample("1", "C.", "D.", "no")]


def test_tsv_without_header_and_regression(tmp_path: Path) -> None:
    write(tmp_path, "dev.csv", "x,first,2.5\ny,second,-1e1\n")
    task = config(format="tsv", header=False, delimiter=",", kind="regression", text=1, label=-1, dev="dev.csv")
    assert list(read_task_file(task, "dev", root=tmp_path)) == [
        TextExample("0", "first", None, 2.5), TextExample("1", "second", None, -10.0)]
    write(tmp_path, "bad.csv", "x,first,2.5\ny,second,lots\n")
    bad = config(format="tsv", header=False, delimiter=",", kind="regression", text=1, label=2, dev="bad.csv")
    with pytest.raises(DataError, match=r"bad.csv: line 2: score 'lots' is not a number$"):
        list(read_task_file(bad, "dev", root=tmp_path))


def test_tsv_unlabelled(tmp_path: Path) -> None:
    write(tmp_path, "test.tsv", "sentence\nfine .\n")
    task = config(format="tsv", kind="classification", text="sentence", dev="test.tsv")
    assert list(read_task_file(task, "dev", root=tmp_path)) == [TextExample("0", "fine .", None, None)]


def test_tsv_wrong_column_count(tmp_path: Path) -> None:
    path = write(tmp_path, "train.csv", "a;b;c\n1;2;3\n1;2\n")
    task = config(format="tsv", kind="classification", text="a", label="c", delimiter=";", train=str(path))
    with pytest.raises(DataError, match=rf"^{re.escape(str(path))}: line 3: expected 3 semicolon-separated "
                                        r"columns, got 2$"):
        list(read_task_file(task, "train"))


def test_tsv_column_not_in_header(tmp_path: Path) -> None:
    path = write(tmp_path, "train.tsv", "sentence\tlabel\tlabel\nx\t1\t1\n")
    task = config(format="tsv", kind="classification", text="text", label="label", train=str(path))
    with pytest.raises(DataError, match=r"train.tsv: line 1: no column named 'text' in the header \(task.text; "
                                        r"columns: 'sentence', 'label', 'label'\)"):
        list(read_task_file(task, "train"))
    task = config(format="tsv", kind="classification", text="sentence", label="label", train=str(path))
    with pytest.raises(DataError, match=r"line 1: two columns named 'label'"):
        list(read_task_file(task, "train"))


def test_tsv_column_index_outside_row(tmp_path: Path) -> None:
    path = write(tmp_path, "train.tsv", "x\t1\n")
    task = config(format="tsv", header=False, kind="classification", text=0, label=2, train=str(path))
    with pytest.raises(DataError, match=r"train.tsv: line 1: task.label is column 2, but the row has 2 columns"):
        list(read_task_file(task, "train"))


def test_tsv_label_outside_labels(tmp_path: Path) -> None:
    path = write(tmp_path, "train.tsv", "text\tlabel\nx\tpos\ny\tneutral\n")
    task = config(format="tsv", kind="classification", text="text", label="label", labels=["neg", "pos"],
                  train=str(path))
    with pytest.raises(DataError, match=rf"^{re.escape(str(path))}: line 3: unknown label 'neutral' \(expected one "
                                        r"of 'neg', 'pos'\)$"):
        list(read_task_file(task, "train"))


def test_tsv_quoting(tmp_path: Path) -> None:
    path = write(tmp_path, "train.csv", 'text,label\n"two\nlines, and ""quotes""",1\nplain,0\n"broken,1\n')
    task = config(format="tsv", kind="classification", text="text", label="label", delimiter=",", quoting=True,
                  train=str(path))
    examples = read_task_file(task, "train")
    assert next(examples) == TextExample("0", 'two\nlines, and "quotes"', None, "1")
    assert next(examples) == TextExample("1", "plain", None, "0")
    with pytest.raises(DataError, match=r"train.csv: line 5: bad quoting"):
        next(examples)


def test_tsv_empty_and_not_utf8(tmp_path: Path) -> None:
    task = config(format="tsv", kind="classification", text="text", train=str(write(tmp_path, "e.tsv", "text\n")))
    with pytest.raises(DataError, match=r"e.tsv: no data rows after the header$"):
        list(read_task_file(task, "train"))
    bad = write(tmp_path, "b.tsv", b"text\n\xff\n")
    task = config(format="tsv", kind="classification", text="text", train=str(bad))
    with pytest.raises(DataError, match=r"b.tsv: line 2: cannot decode as utf-8 at byte offset 5 \(byte 0xff\)"):
        list(read_task_file(task, "train"))


def test_split_without_a_file(tmp_path: Path) -> None:
    task = config(format="tsv", kind="classification", text="text", train="train.tsv")
    with pytest.raises(ConfigError, match=r"^task.dev: no file given for the dev split$"):
        read_task_file(task, "dev")
    with pytest.raises(DataError, match=r"train.tsv: no such file"):
        read_task_file(task, "train", root=tmp_path)
    with pytest.raises(ConfigError, match="split: expected 'train' or 'dev'"):
        read_task_file(task, "test")  # type: ignore[arg-type]


# ----------------------------------------------------------------------------------------------------- jsonl
def test_jsonl(tmp_path: Path) -> None:
    rows = [{"q": "a?", "p": "b.", "y": 1}, {"q": "c?", "p": "d.", "y": "0", "extra": [1]}]
    path = write(tmp_path, "train.jsonl", "\n".join(json.dumps(r) for r in rows) + "\n\n")
    task = config(format="jsonl", kind="classification", text="q", text_pair="p", label="y", train=str(path))
    assert list(read_task_file(task, "train")) == [TextExample("0", "a?", "b.", "1"),
                                                   TextExample("1", "c?", "d.", "0")]
    score = config(format="jsonl", kind="regression", text="q", label="y", train=str(path))
    assert [e.label for e in read_task_file(score, "train")] == [1.0, 0.0]


@pytest.mark.parametrize("line, kind, message", [
    ('{"q": "a?", "y": 1', "classification", r"line 2: invalid JSON: .* \(column 19\)"),
    ('["a?", 1]', "classification", r"line 2: expected a JSON object, got a list"),
    ('{"y": 1}', "classification", r"line 2: missing field 'q' \(task.text; fields: 'y'\)"),
    ('{"q": 3, "y": 1}', "classification", r"line 2: field 'q' must be a string, got an integer 3"),
    ('{"q": "a?"}', "classification", r"line 2: missing field 'y' \(task.label; fields: 'q'\)"),
    ('{"q": "a?", "y": 1.5}', "classification", r"line 2: label 'y' must be a string or an integer, got a number"),
    ('{"q": "a?", "y": true}', "regression", r"line 2: label 'y' must be a number for regression, got boolean"),
    ('{"q": "a?", "y": [1]}', "regression", r"line 2: label 'y' must be a number for regression, got a list"),
    ('{"q": "a\\ud83d?", "y": 1}', "classification", r"line 2: field 'q': character 1 is a lone surrogate \(U\+D83D"),
    ('{"q": "a?", "y": 1, "note": {"by": ["x", "\\udfff"]}}', "classification",
     r"line 2: field 'note.by\[1\]': character 0 is a lone surrogate"),
])
def test_jsonl_errors(tmp_path: Path, line: str, kind: str, message: str) -> None:
    path = write(tmp_path, "train.jsonl", '{"q": "fine", "y": 0}\n' + line + "\n")
    task = config(format="jsonl", kind=kind, text="q", label="y", train=str(path))
    with pytest.raises(DataError, match=rf"^{re.escape(str(path))}: {message}"):
        list(read_task_file(task, "train"))


def test_jsonl_empty(tmp_path: Path) -> None:
    task = config(format="jsonl", kind="classification", text="q", train=str(write(tmp_path, "e.jsonl", "\n\n")))
    with pytest.raises(DataError, match=r"e.jsonl: no examples \(empty file\)"):
        list(read_task_file(task, "train"))


# ----------------------------------------------------------------------------------------------------- conll
def test_conll_task(tmp_path: Path) -> None:
    path = write(tmp_path, "train.txt", "Alice I-PER\nsaw O\nBob I-PER\n\nParis B-LOC\n")
    task = config(format="conll", kind="tagging", labels=["PER", "LOC"], train=str(path))
    assert list(read_task_file(task, "train")) == [
        TaggedSentence("0", ["Alice", "saw", "Bob"], ["B-PER", "O", "B-PER"],
                       [["Alice", "I-PER"], ["saw", "O"], ["Bob", "I-PER"]]),
        TaggedSentence("1", ["Paris"], ["B-LOC"], [["Paris", "B-LOC"]])]
    narrow = config(format="conll", kind="tagging", labels=["PER"], train=str(path))
    with pytest.raises(DataError, match=rf"^{re.escape(str(path))}: line 5: tag 'B-LOC': entity type: unknown "
                                        r"label 'LOC' \(expected one of 'PER'\)$"):
        list(read_task_file(narrow, "train"))
