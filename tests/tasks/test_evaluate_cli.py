"""`bertology evaluate` end to end: SQuAD, conlleval and GLUE files in their published formats, every bad input
an error of one line naming the file and the line (or the question id), exit status 2."""

from __future__ import annotations

import json
import math

import pytest

from bertology.cli import evaluate as evaluate_cli
from bertology.cli.main import main
from bertology.tasks import metrics
from bertology.tasks.readers import read_glue


def run(capsys, *argv) -> tuple[int, dict | None, str]:
    status = main(["evaluate", *(str(a) for a in argv)])
    captured = capsys.readouterr()
    return status, (json.loads(captured.out) if status == 0 else None), captured.err


def fails(capsys, *argv) -> str:
    status, _, err = run(capsys, *argv)
    assert status == 2
    lines = err.strip().split("\n")
    assert len(lines) == 1 and lines[0].startswith("bertology evaluate: error: "), err
    return lines[0]


def test_task_names_match_the_api():
    assert evaluate_cli.TASKS == metrics.TASKS


# ---- SQuAD ----------------------------------------------------------------------------------------------------

SQUAD = {"version": "1.1", "data": [{"title": "T", "paragraphs": [{"context": "The Denver Broncos won.", "qas": [
    {"id": "q1", "question": "Who won?", "answers": [{"answer_start": 0, "text": "The Denver Broncos"},
                                                     {"answer_start": 11, "text": "Broncos"}]},
    {"id": "q2", "question": "What?", "answers": [{"answer_start": 19, "text": "won"}]},
]}]}]}


@pytest.fixture
def squad_gold(tmp_path):
    path = tmp_path / "dev.json"
    path.write_text(json.dumps(SQUAD), encoding="utf-8")
    return path


def write_json(path, value):
    path.write_text(json.dumps(value), encoding="utf-8")
    return path


def test_squad(capsys, squad_gold, tmp_path):
    predictions = write_json(tmp_path / "pred.json", {"q1": "Denver Broncos", "q2": "they won it"})
    status, result, _ = run(capsys, "--task", "squad", "--gold", squad_gold, "--predictions", predictions)
    assert status == 0
    assert result == {"exact_match": 50.0, "f1": pytest.approx(100 * (1 + 2 * (1 / 3) / (1 + 1 / 3)) / 2)}


def test_squad_missing_ids(capsys, squad_gold, tmp_path):
    predictions = write_json(tmp_path / "pred.json", {"q1": "Denver Broncos"})
    error = fails(capsys, "--task", "squad", "--gold", squad_gold, "--predictions", predictions)
    assert f"{predictions}: 1 of 2 questions have no prediction: q2" in error
    status, result, _ = run(capsys, "--task", "squad", "--gold", squad_gold, "--predictions", predictions,
                            "--allow-missing")
    assert status == 0 and result == {"exact_match": 50.0, "f1": 50.0, "missing": 1}


def test_squad_bad_files(capsys, squad_gold, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"q1": "Denver",\n "q2": }\n', encoding="utf-8")
    assert f"{bad}:2:8: invalid JSON" in fails(capsys, "--task", "squad", "--gold", squad_gold, "--predictions", bad)
    empty = tmp_path / "empty.json"
    empty.write_text("", encoding="utf-8")
    assert f"{empty}: empty file" in fails(capsys, "--task", "squad", "--gold", squad_gold, "--predictions", empty)
    number = write_json(tmp_path / "number.json", {"q1": "x", "q2": 3})
    assert f"{number}: question q2: the prediction is a int" in \
        fails(capsys, "--task", "squad", "--gold", squad_gold, "--predictions", number)
    listed = write_json(tmp_path / "list.json", ["x"])
    assert "must be a JSON object" in fails(capsys, "--task", "squad", "--gold", squad_gold, "--predictions", listed)
    no_answers = json.loads(json.dumps(SQUAD))
    del no_answers["data"][0]["paragraphs"][0]["qas"][1]["answers"]
    gold = write_json(tmp_path / "gold.json", no_answers)
    assert f"{gold}: data[0].paragraphs[0].qas[1]: missing key 'answers'" in \
        fails(capsys, "--task", "squad", "--gold", gold, "--predictions", number)
    assert "squad needs the gold file (--gold)" in fails(capsys, "--task", "squad", "--predictions", number)


def test_real_squad_gold_answers(capsys, data_dir, tmp_path):
    path = data_dir / "squad" / "squad-v1.1-dev-part-a.json"
    if not path.is_file():
        pytest.skip(f"{path} not found")
    document = json.loads(path.read_text(encoding="utf-8"))
    answers = {qa["id"]: qa["answers"][0]["text"] for article in document["data"]
               for paragraph in article["paragraphs"] for qa in paragraph["qas"]}
    predictions = write_json(tmp_path / "pred.json", answers)
    status, result, _ = run(capsys, "--task", "squad", "--gold", path, "--predictions", predictions)
    assert status == 0 and result == {"exact_match": 100.0, "f1": 100.0}


# ---- CoNLL ----------------------------------------------------------------------------------------------------


def test_conll(capsys, tmp_path):
    path = tmp_path / "out.txt"
    path.write_text("-DOCSTART- -X- O O\n\n"
                    "EU NNP I-ORG B-ORG\nrejects VBZ O O\nGerman JJ I-MISC B-PER\ncall NN O O\n\n"
                    "Peter NNP I-PER B-PER\nBlackburn NNP I-PER I-PER\n", encoding="utf-8")
    for task in ("conll2003", "conll", "CoNLL"):
        status, result, _ = run(capsys, "--task", task, "--predictions", path)
        assert status == 0
        assert result["tokens"] == 7 and (result["gold"], result["found"], result["correct"]) == (3, 3, 2)
        assert result["precision"] == pytest.approx(200 / 3) and result["recall"] == pytest.approx(200 / 3)
        assert result["f1"] == pytest.approx(200 / 3) and result["accuracy"] == pytest.approx(100 * 4 / 7)
        assert result["per_type"] == {
            "MISC": {"precision": 0.0, "recall": 0.0, "f1": 0.0, "gold": 1, "found": 0, "correct": 0},
            "ORG": {"precision": 100.0, "recall": 100.0, "f1": 100.0, "gold": 1, "found": 1, "correct": 1},
            "PER": {"precision": 50.0, "recall": 100.0, "f1": pytest.approx(200 / 3), "gold": 1, "found": 2,
                    "correct": 1},
        }


def test_conll_bad_files(capsys, tmp_path):
    path = tmp_path / "out.txt"
    path.write_text("EU NNP I-ORG I-ORG\n\nrejects O\n", encoding="utf-8")
    assert f"{path}:3: 2 columns, but line 1 has 4" in fails(capsys, "--task", "conll", "--predictions", path)
    path.write_text("EU\n", encoding="utf-8")
    assert f"{path}:1: 1 column" in fails(capsys, "--task", "conll", "--predictions", path)
    path.write_text("\n\n", encoding="utf-8")
    assert f"{path}: empty file" in fails(capsys, "--task", "conll", "--predictions", path)
    assert f"{tmp_path / 'absent'}: cannot read" in \
        fails(capsys, "--task", "conll", "--predictions", tmp_path / "absent")
    path.write_text("EU O O\n", encoding="utf-8")
    assert "--gold is not used by conll" in fails(capsys, "--task", "conll", "--predictions", path, "--gold", path)


def test_real_conll2003_gold_as_predictions(capsys, data_dir, tmp_path):
    source = data_dir / "conll2003" / "eng.testa"
    if not source.is_file():
        pytest.skip(f"{source} not found")
    lines = source.read_text(encoding="utf-8").split("\n")
    path = tmp_path / "testa.out"
    path.write_text("\n".join(f"{line} {line.split()[-1]}" if line.strip() else line for line in lines),
                    encoding="utf-8")
    status, result, _ = run(capsys, "--task", "conll2003", "--predictions", path)
    assert status == 0
    assert (result["f1"], result["accuracy"], result["tokens"], result["gold"]) == (100.0, 100.0, 51578, 5942)


# ---- GLUE -----------------------------------------------------------------------------------------------------

# Small gold files in each task's published layout (see ../shared/data/README.md).
GLUE_GOLD = {
    "sst2": "sentence\tlabel\nit 's a charming journey . \t1\nbleak and desperate \t0\n\"quoted \t1\nmeh \t1\n",
    "cola": "gj04\t1\t\tThe sailors rode.\ngj04\t0\t*\tThe rope stretch.\ngj04\t1\t\tHe left.\n"
            "ab\t0\t*\tX",  # no header, no final newline
    "mrpc": "\ufeffQuality\t#1 ID\t#2 ID\t#1 String\t#2 String\n1\t1\t2\t\"He said.\tHe said\n"
            "0\t3\t4\ta\tb\n1\t5\t6\tc\td\n0\t7\t8\te\tf\n",
    "rte": "index\tsentence1\tsentence2\tlabel\n0\ta\tb\tnot_entailment\n1\tc\td\tentailment\n2\te\tf\tentailment\n",
    "stsb": "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore\n"
            "0\tg\tf\t2012\t0\tnone\tnone\tA \"man.\tA man\t5.000\n"
            "1\tg\tf\t2012\t1\tnone\tnone\tx\ty\t0.500\n"
            "2\tg\tf\t2012\t2\tnone\tnone\tx\ty\t3.000\n"
            "3\tg\tf\t2012\t3\tnone\tnone\tx\ty\t3.000\n",
}


def glue_files(tmp_path, task, predictions):
    gold = tmp_path / f"{task}.tsv"
    gold.write_text(GLUE_GOLD[task], encoding="utf-8")
    pred = tmp_path / f"{task}.pred.tsv"
    pred.write_text("index\tprediction\n" + "".join(f"{i}\t{p}\n" for i, p in predictions), encoding="utf-8")
    return gold, pred


@pytest.mark.parametrize("task, predictions, expected", [
    ("sst2", [(0, 1), (1, 0), (2, 0), (3, 0)], {"accuracy": 50.0}),
    ("cola", [(3, 0), (2, 1), (1, 1), (0, 1)], {"mcc": 100 * 1 / math.sqrt(3)}),  # order of rows is free
    ("mrpc", [(0, 1), (1, 1), (2, 1), (3, 0)], {"accuracy": 75.0, "f1": 80.0}),
    ("rte", [(0, "not_entailment"), (1, "not_entailment"), (2, "entailment")], {"accuracy": 100 * 2 / 3}),
    ("stsb", [(0, 4.5), (1, "1e-1"), (2, 2), (3, 2.5)], None),  # computed in the test
])
def test_glue(capsys, tmp_path, task, predictions, expected):
    gold, pred = glue_files(tmp_path, task, predictions)
    status, result, _ = run(capsys, "--task", task, "--gold", gold, "--predictions", pred)
    assert status == 0
    if task == "stsb":
        gold_scores, scores = [5.0, 0.5, 3.0, 3.0], [4.5, 0.1, 2.0, 2.5]
        expected = {"pearson": 100 * metrics.pearson(gold_scores, scores),
                    "spearman": 100 * metrics.spearman(gold_scores, scores)}
        assert expected["spearman"] == pytest.approx(100 * 0.9486832980505138)  # ranks 4 1 2.5 2.5 vs 4 1 2 3
    assert result == pytest.approx(expected)


def test_stsb_constant_predictions_have_no_correlation(capsys, tmp_path):
    gold, pred = glue_files(tmp_path, "stsb", [(i, 2.0) for i in range(4)])
    status, result, _ = run(capsys, "--task", "stsb", "--gold", gold, "--predictions", pred)
    assert status == 0 and result == {"pearson": None, "spearman": None}


@pytest.mark.parametrize("task, rows, message", [
    ("sst2", "0\t1\n1\t0\n3\t1\n", "no prediction for 1 of 4 rows of {gold}: index 2"),
    ("sst2", "0\t1\n1\t0\n2\t1\n3\t1\n4\t1\n", "{pred}:6: index 4 is out of range: {gold} has 4 rows"),
    ("sst2", "0\t1\n1\t0\n1\t1\n", "{pred}:4: index 1 is repeated"),
    ("sst2", "0\t1\n-1\t0\n", "{pred}:3: index '-1' is not a non-negative integer"),
    ("sst2", "0\t2\n", "{pred}:2: label '2' is not one of 0, 1"),
    ("sst2", "0\t1\t0\n", "{pred}:2: 3 columns, expected 2"),
    ("rte", "0\tentailed\n", "{pred}:2: label 'entailed' is not one of entailment, not_entailment"),
    ("mrpc", "0\t1.0\n", "{pred}:2: label '1.0' is not one of 0, 1"),
    ("stsb", "0\t4.5\n1\thigh\n", "{pred}:3: 'high' is not a number"),
    ("stsb", "0\tnan\n", "{pred}:2: 'nan' is not a number"),
])
def test_glue_bad_predictions(capsys, tmp_path, task, rows, message):
    gold = tmp_path / "dev.tsv"
    gold.write_text(GLUE_GOLD[task], encoding="utf-8")
    pred = tmp_path / "pred.tsv"
    pred.write_text("index\tprediction\n" + rows, encoding="utf-8")
    assert message.format(gold=gold, pred=pred) in fails(capsys, "--task", task, "--gold", gold, "--predictions",
                                                         pred)


def test_glue_bad_files(capsys, tmp_path):
    gold, pred = glue_files(tmp_path, "sst2", [(0, 1)])
    pred.write_text("idx\tlabel\n0\t1\n", encoding="utf-8")
    assert f"{pred}:1: the header must be 'index<TAB>prediction'" in \
        fails(capsys, "--task", "sst2", "--gold", gold, "--predictions", pred)
    pred.write_text("", encoding="utf-8")
    assert f"{pred}: empty file" in fails(capsys, "--task", "sst2", "--gold", gold, "--predictions", pred)
    pred.write_text("index\tprediction\n0\t1\n", encoding="utf-8")
    gold.write_text("sentence\tlabel\na\t1\nb\n", encoding="utf-8")
    assert f"{gold}: line 3: expected 2 tab-separated columns, got 1" in fails(capsys, "--task", "sst2", "--gold", gold, "--predictions", pred)
    gold.write_text("sentence\tlabel\na\tpositive\n", encoding="utf-8")
    assert f"{gold}: line 2: unknown label 'positive' (expected one of '0', '1')" in \
        fails(capsys, "--task", "sst2", "--gold", gold, "--predictions", pred)
    gold.write_text("sentence\tlabel\na\t1\n\nb\t0\n", encoding="utf-8")
    assert f"{gold}: line 3: blank line between rows" in fails(capsys, "--task", "sst2", "--gold", gold, "--predictions", pred)
    assert "--allow-missing applies to squad only" in \
        fails(capsys, "--task", "sst2", "--gold", gold, "--predictions", pred, "--allow-missing")


@pytest.mark.parametrize("task, folder, rows, metric_names", [
    ("sst2", "SST-2", 872, ("accuracy",)),
    ("cola", "CoLA", 1043, ("mcc",)),
    ("mrpc", "MRPC", 408, ("accuracy", "f1")),
    ("rte", "RTE", 277, ("accuracy",)),
    ("stsb", "STS-B", 1500, ("pearson", "spearman")),
])
def test_real_glue_dev_gold_as_predictions(capsys, data_dir, tmp_path, task, folder, rows, metric_names):
    gold = data_dir / "glue" / folder / "dev.tsv"
    if not gold.is_file():
        pytest.skip(f"{gold} not found")
    labels = [example.label for example in read_glue(task, gold)]
    assert len(labels) == rows
    pred = tmp_path / "pred.tsv"
    pred.write_text("index\tprediction\n" + "".join(f"{i}\t{label}\n" for i, label in enumerate(labels)),
                    encoding="utf-8")
    status, result, _ = run(capsys, "--task", task, "--gold", gold, "--predictions", pred)
    assert status == 0 and result == pytest.approx({name: 100.0 for name in metric_names})
