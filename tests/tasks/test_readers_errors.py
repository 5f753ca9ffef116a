"""Bad input to the GLUE, CoNLL and SQuAD readers: one small file per error, each message naming where."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from bertology.errors import ConfigError, DataError
from bertology.tasks.examples import TaggedSentence, TextExample
from bertology.tasks.readers import check_glue_splits, check_label_sets, read_conll, read_glue, read_squad


def write(tmp_path: Path, name: str, content: str | bytes) -> Path:
    path = tmp_path / name
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    return path


# ------------------------------------------------------------------------------------------------------- GLUE
RTE = "index\tsentence1\tsentence2\tlabel\n"


def test_glue_wrong_column_count(tmp_path: Path) -> None:
    path = write(tmp_path, "train.tsv", RTE + "0\ta\tb\tentailment\n1\ta\tb\tc\tentailment\n")
    with pytest.raises(DataError, match=rf"^{re.escape(str(path))}: line 3: expected 4 tab-separated columns, "
                                        r"got 5$"):
        list(read_glue("rte", path))


def test_glue_unknown_label(tmp_path: Path) -> None:
    path = write(tmp_path, "dev.tsv", RTE + "0\ta\tb\tentailment\n1\ta\tb\tneutral\n")
    with pytest.raises(DataError, match=rf"^{re.escape(str(path))}: line 3: unknown label 'neutral' \(expected "
                                        r"one of 'entailment', 'not_entailment'\)$"):
        list(read_glue("rte", path))
    cola = write(tmp_path, "cola.tsv", "gj04\t1\t\tFine.\ngj04\t2\t*\tBad.\n")
    with pytest.raises(DataError, match=r"cola.tsv: line 2: unknown label '2'"):
        list(read_glue("cola", cola))


def test_glue_bad_scores(tmp_path: Path) -> None:
    head = "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore\n"
    row = "0\tg\tf\t2012\t0\tnone\tnone\tA.\tB.\t"
    for score, message in (("5.2", "score 5.2 outside [0, 5]"), ("-0.1", "score -0.1 outside"),
                           ("high", "score 'high' is not a number"), ("nan", "score 'nan' is not finite")):
        path = write(tmp_path, "sts.tsv", head + row + score + "\n")
        with pytest.raises(DataError, match=rf"sts.tsv: line 2: {re.escape(message)}"):
            list(read_glue("stsb", path))


def test_glue_empty_file(tmp_path: Path) -> None:
    empty = write(tmp_path, "empty.tsv", "")
    with pytest.raises(DataError, match=rf"^{re.escape(str(empty))}: empty file$"):
        list(read_glue("cola", empty))
    header_only = write(tmp_path, "header.tsv", "sentence\tlabel\n")
    with pytest.raises(DataError, match=rf"^{re.escape(str(header_only))}: no data rows after the header$"):
        list(read_glue("sst2", header_only))
    blank = write(tmp_path, "blank.tsv", "\n\n")
    with pytest.raises(DataError, match="empty file"):
        list(read_glue("cola", blank))


def test_glue_wrong_header(tmp_path: Path) -> None:
    path = write(tmp_path, "test.tsv", "index\tsentence\n0\tgood .\n")  # SST-2's test split, not train/dev
    with pytest.raises(DataError, match=r"test.tsv: line 1: expected the SST-2 header \['sentence', 'label'\], "
                                        r"got \['index', 'sentence'\]"):
        list(read_glue("sst2", path))


def test_glue_blank_lines(tmp_path: Path) -> None:
    trailing = write(tmp_path, "trailing.tsv", "sentence\tlabel\ngood . \t1\n\n\n")
    assert [e.text for e in read_glue("sst2", trailing)] == ["good . "]
    between = write(tmp_path, "between.tsv", "sentence\tlabel\ngood . \t1\n\nbad . \t0\n")
    with pytest.raises(DataError, match=r"between.tsv: line 3: blank line between rows"):
        list(read_glue("sst2", between))


def test_glue_quotes_are_text_and_crlf_is_stripped(tmp_path: Path) -> None:
    path = write(tmp_path, "rte.tsv", RTE + '0\t"He said\ttwo"\tB.\tentailment\r\n')  # the tab splits
    with pytest.raises(DataError, match="line 2: expected 4 tab-separated columns, got 5"):
        list(read_glue("rte", path))
    path = write(tmp_path, "rte.tsv", RTE + '0\t"He said\t"two\tnot_entailment\r\n')
    assert list(read_glue("rte", path)) == [TextExample("0", '"He said', '"two', "not_entailment")]


def test_glue_not_utf8(tmp_path: Path) -> None:
    path = write(tmp_path, "train.tsv", b"sentence\tlabel\ngood\t1\ncaf\xe9 bad\t0\n")
    with pytest.raises(DataError, match=rf"^{re.escape(str(path))}: line 3: cannot decode as utf-8 at byte offset "
                                        r"25 \(byte 0xe9\)$"):
        list(read_glue("sst2", path))


def test_glue_bom_is_dropped(tmp_path: Path) -> None:
    path = write(tmp_path, "mrpc.tsv", "\ufeffQuality\t#1 ID\t#2 ID\t#1 String\t#2 String\n1\t1\t2\tA.\tB.\n")
    assert list(read_glue("MRPC", path)) == [TextExample("0", "A.", "B.", "1")]


def test_glue_label_sets_of_splits_differ(tmp_path: Path) -> None:
    train = write(tmp_path, "train.tsv", "sentence\tlabel\na\t0\nb\t1\n")
    dev = write(tmp_path, "dev.tsv", "sentence\tlabel\na\t1\nb\t1\n")
    with pytest.raises(DataError, match=rf"^{re.escape(str(dev))}: labels differ from {re.escape(str(train))}'s: "
                                        rf"{re.escape(str(train))} has '0' \(first in example 0\) that "
                                        rf"{re.escape(str(dev))} lacks$"):
        check_glue_splits("sst2", train, dev)
    assert check_glue_splits("sst2", train, train).names == ("0", "1")


def test_check_label_sets() -> None:
    train = [TextExample("0", "a", None, "x"), TextExample("1", "b", None, "y")]
    assert check_label_sets(train, list(reversed(train))).names == ("x", "y")
    with pytest.raises(DataError, match=r"^dev: labels differ from train's: dev has 'z' \(first in example 3\) "
                                        r"that train lacks$"):
        check_label_sets(train, train + [TextExample("3", "c", None, "z")])
    assert check_label_sets([TextExample("0", "a", None, 1.5)], [TextExample("0", "a", None, 2.0)]) is None
    tagged = [TaggedSentence("0", ["a", "b"], ["B-PER", "I-PER"], [["a"], ["b"]]),
              TaggedSentence("1", ["c"], ["B-LOC"], [["c"]])]
    assert check_label_sets(tagged, tagged[:1] + [TaggedSentence("1", ["c"], ["B-LOC"], [["c"]])]).names == \
        ("LOC", "PER")
    with pytest.raises(DataError, match="train has 'LOC' \\(first in example 1\\) that dev lacks"):
        check_label_sets(tagged, tagged[:1])


def test_glue_bad_arguments(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="unknown GLUE task 'qnli'"):
        read_glue("qnli", tmp_path / "x.tsv")
    with pytest.raises(DataError, match="missing.tsv: no such file"):
        read_glue("sst2", tmp_path / "missing.tsv")  # at the call, before iterating


# ------------------------------------------------------------------------------------------------------ CoNLL
def test_conll_column_count(tmp_path: Path) -> None:
    path = write(tmp_path, "eng.train", "-DOCSTART- -X- O O\n\nEU NNP I-NP I-ORG\nrejects VBZ O\n")
    with pytest.raises(DataError, match=rf"^{re.escape(str(path))}: line 4: expected 4 columns as in the file's "
                                        r"first token line, got 3$"):
        list(read_conll(path))


def test_conll_invalid_tag(tmp_path: Path) -> None:
    for tag in ("PER", "E-PER", "B-", "i-PER"):
        path = write(tmp_path, "eng.testa", f"EU NNP I-NP I-ORG\n\nPeter NNP I-NP {tag}\n")
        with pytest.raises(DataError, match=rf"^{re.escape(str(path))}: line 3: invalid tag '{tag}' \(expected O, "
                                            r"B-TYPE or I-TYPE\)$"):
            list(read_conll(path))


def test_conll_empty_file(tmp_path: Path) -> None:
    for content in ("", "\n\n", "-DOCSTART- -X- O O\n\n"):
        path = write(tmp_path, "empty.conll", content)
        with pytest.raises(DataError, match=rf"^{re.escape(str(path))}: no sentences"):
            list(read_conll(path))


def test_conll_tag_column(tmp_path: Path) -> None:
    words = write(tmp_path, "words.conll", "EU\nrejects\n")
    with pytest.raises(DataError, match=r"words.conll: line 1: the tag column \(-1\) is the word column"):
        list(read_conll(words))
    assert [s.words for s in read_conll(words, tag_column=None)] == [["EU", "rejects"]]
    with pytest.raises(DataError, match=r"words.conll: line 1: tag_column 4 does not exist in a line of 1 columns"):
        list(read_conll(words, tag_column=4))
    with pytest.raises(ConfigError, match="scheme_out"):
        read_conll(words, scheme_out="BIOES")  # type: ignore[arg-type]


def test_conll_not_utf8(tmp_path: Path) -> None:
    path = write(tmp_path, "deu.train", b"Bonn NE I-LOC\n\nK\xf6ln NE I-LOC\n")
    with pytest.raises(DataError, match=r"deu.train: line 3: cannot decode as utf-8 at byte offset 16"):
        list(read_conll(path))
    assert [s.words for s in read_conll(path, encoding="latin-1")] == [["Bonn"], ["Köln"]]


# ------------------------------------------------------------------------------------------------------ SQuAD
def squad(*, answers: object = None, context: str = "Denver Broncos won.", qid: str = "q1", **extra: object) -> dict:
    qa = {"id": qid, "question": "Who won?",
          "answers": [{"text": "Denver Broncos", "answer_start": 0}] if answers is None else answers, **extra}
    return {"data": [{"title": "Super_Bowl_50", "paragraphs": [{"context": context, "qas": [qa]}]}],
            "version": "1.1"}


def write_json(tmp_path: Path, data: object) -> Path:
    return write(tmp_path, "squad.json", json.dumps(data, indent=1))


def test_squad_small_file(tmp_path: Path) -> None:
    (example,) = read_squad(write_json(tmp_path, squad()))
    assert (example.id, example.title, example.answers[0].text, example.answers[0].end) == \
        ("q1", "Super_Bowl_50", "Denver Broncos", 14)


def test_squad_answer_not_in_context(tmp_path: Path) -> None:
    path = write_json(tmp_path, squad(answers=[{"text": "Denver Broncos", "answer_start": 0},
                                               {"text": "Broncos", "answer_start": 6}]))
    with pytest.raises(DataError, match=rf"^{re.escape(str(path))}: question 'q1' \(data\[0\].paragraphs\[0\].qas"
                                        r"\[0\].answers\[1\]\): answer 'Broncos' at characters \[6, 13\) does not "
                                        r"match the context there \(' Bronco'; the context has 19 characters\)$"):
        read_squad(path)
    beyond = write_json(tmp_path, squad(answers=[{"text": "won", "answer_start": 40}]))
    with pytest.raises(DataError, match=r"answer 'won' at characters \[40, 43\) does not match"):
        read_squad(beyond)


def test_squad_invalid_json(tmp_path: Path) -> None:
    path = write(tmp_path, "squad.json", '{"data": [\n  {"title": "A",\n   "paragraphs": [}\n]}')
    with pytest.raises(DataError, match=rf"^{re.escape(str(path))}: line 3 column 19: invalid JSON: "):
        read_squad(path)
    empty = write(tmp_path, "empty.json", "")
    with pytest.raises(DataError, match="empty.json: empty file"):
        read_squad(empty)


@pytest.mark.parametrize("mutate, where", [
    (lambda d: d.pop("data"), r"\(top level\): missing key 'data'"),
    (lambda d: d.__setitem__("data", {}), r"\(top level\).data: expected a list, got an object"),
    (lambda d: d["data"][0].pop("title"), r"data\[0\]: missing key 'title'"),
    (lambda d: d["data"][0]["paragraphs"].append(3), r"data\[0\].paragraphs\[1\]: expected an object, got an "
                                                     r"integer 3"),
    (lambda d: d["data"][0]["paragraphs"][0].__setitem__("context", None),
     r"data\[0\].paragraphs\[0\].context: expected a string, got null"),
    (lambda d: d["data"][0]["paragraphs"][0]["qas"][0].__setitem__("answers", []),
     r"data\[0\].paragraphs\[0\].qas\[0\].answers: question 'q1' has no answer"),
    (lambda d: d["data"][0]["paragraphs"][0]["qas"][0].__setitem__("answers", "Denver"),
     r"data\[0\].paragraphs\[0\].qas\[0\].answers: expected a list, got a string \"Denver\""),
    (lambda d: d["data"][0]["paragraphs"][0]["qas"][0]["answers"][0].__setitem__("answer_start", "0"),
     r"data\[0\].paragraphs\[0\].qas\[0\].answers\[0\].answer_start: expected an integer, got a string \"0\""),
    (lambda d: d["data"][0]["paragraphs"][0]["qas"][0]["answers"][0].__setitem__("answer_start", True),
     r"data\[0\].paragraphs\[0\].qas\[0\].answers\[0\].answer_start: expected an integer, got boolean true"),
    (lambda d: d["data"][0]["paragraphs"][0]["qas"][0]["answers"][0].update(text=" ", answer_start=6),
     r"question 'q1' \(data\[0\].paragraphs\[0\].qas\[0\].answers\[0\]\): empty answer text$"),
    (lambda d: d["data"][0]["paragraphs"][0]["qas"][0].__setitem__("is_impossible", True),
     r"data\[0\].paragraphs\[0\].qas\[0\]: question 'q1' is a SQuAD 2.0 unanswerable question"),
])
def test_squad_wrong_schema(tmp_path: Path, mutate, where: str) -> None:
    data = squad()
    mutate(data)
    path = write_json(tmp_path, data)
    with pytest.raises(DataError, match=rf"^{re.escape(str(path))}: {where}"):
        read_squad(path)


def test_squad_duplicate_question_ids(tmp_path: Path) -> None:
    data = squad()
    data["data"].append(squad()["data"][0])
    path = write_json(tmp_path, data)
    with pytest.raises(DataError, match=rf"^{re.escape(str(path))}: question id 'q1' at data\[1\].paragraphs\[0\]"
                                        r".qas\[0\] repeats the one at data\[0\].paragraphs\[0\].qas\[0\]$"):
        read_squad(path)


def test_squad_not_utf8(tmp_path: Path) -> None:
    path = write(tmp_path, "squad.json", b'{"data": [{"title": "Caf\xe9"}]}')
    with pytest.raises(DataError, match=r"squad.json: line 1: cannot decode as utf-8 at byte offset 24 "
                                        r"\(byte 0xe9\)"):
        read_squad(path)


def test_squad_no_questions(tmp_path: Path) -> None:
    path = write_json(tmp_path, {"data": [], "version": "1.1"})
    with pytest.raises(DataError, match="squad.json: no questions"):
        read_squad(path)


def test_squad_and_config_json_lone_surrogates_name_the_field(tmp_path: Path) -> None:
    from bertology.config import load_json

    squad = {"version": "1.1", "data": [{"title": "T", "paragraphs": [{"context": "a b", "qas": [
        {"id": "q1", "question": "a\\ud800?", "answers": [{"text": "a", "answer_start": 0}]}]}]}]}
    path = write(tmp_path, "dev.json", json.dumps(squad).replace("\\\\ud800", "\\ud800"))
    with pytest.raises(DataError, match=r"dev.json: field 'data\[0\].paragraphs\[0\].qas\[0\].question': "
                                        r"character 1 is a lone surrogate \(U\+D800"):
        list(read_squad(path))
    with pytest.raises(ConfigError, match=r"run.json: field 'run.output_dir': character 3 is a lone surrogate"):
        load_json('{"run": {"output_dir": "out\\udc80"}}', "run.json")
    from bertology.config import load_yaml

    with pytest.raises(ConfigError, match=r"run.yaml: field 'run.output_dir': character 3 is a lone surrogate"):
        load_yaml('run:\n  output_dir: "out\\ud800"\n', "run.yaml")
    with pytest.raises(ConfigError, match=r"deep.yaml: invalid YAML: nested too deeply"):
        load_yaml("[" * 5000 + "]" * 5000, "deep.yaml")
