"""A user's own task from a task file (bertology.tasks.user): jsonl classification and tsv regression end to end
through `bertology finetune --task FILE` and `bertology predict --task FILE`, tagging on a CoNLL file, errors
naming the file and the line or key, and the shipped example task file."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from bertology.cli.main import main
from bertology.errors import ConfigError, DataError
from bertology.recipes.finetune import FinetuneConfig, finetune
from bertology.tasks.lookup import get_task
from bertology.tasks.user import UserTask
from finetune_helpers import BAD, FILL, GOOD, cue_sentence, save_tiny_model

EXAMPLE = Path(__file__).resolve().parents[2] / "configs" / "task-example.yaml"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("base") / "model", GOOD + BAD + FILL, vocab_size=40)


@pytest.fixture(scope="module")
def jsonl_task(tmp_path_factory):
    """A jsonl sentiment task, labels taken from the train file (neg, pos); files relative to the task file."""
    root = tmp_path_factory.mktemp("jsonl")
    rng = np.random.default_rng(0)
    (root / "data").mkdir()
    for split, n in (("train", 192), ("dev", 32)):
        rows = [{"id": i, "review": cue_sentence(rng, bool(y)), "sentiment": "pos" if y else "neg"}
                for i, y in enumerate(rng.integers(0, 2, n))]
        (root / "data" / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    (root / "sentiment.yaml").write_text(
        "format: jsonl\nkind: classification\ntext: review\nlabel: sentiment\nmetric: f1\n"
        "train: data/train.jsonl\ndev: data/dev.jsonl\n", encoding="utf-8")
    return root / "sentiment.yaml"


@pytest.fixture(scope="module")
def tsv_task(tmp_path_factory):
    """A tsv pair-regression task with a header: the score grows with the number of positive texts."""
    root = tmp_path_factory.mktemp("tsv")
    rng = np.random.default_rng(1)
    for split, n in (("train", 192), ("dev", 32)):
        lines = ["first\tsecond\tscore\n"]
        for _ in range(n):
            a, b = rng.integers(0, 2, 2)
            score = 2.0 * (a + b) + rng.random()  # each positive text adds 2
            lines.append(f"{cue_sentence(rng, a)}\t{cue_sentence(rng, b)}\t{score:.3f}\n")
        (root / f"{split}.tsv").write_text("".join(lines), encoding="utf-8")
    (root / "similar.yml").write_text(
        f"task:\n  format: tsv\n  kind: regression\n  text: first\n  text_pair: second\n  label: score\n"
        f"  train: {root / 'train.tsv'}\n  dev: dev.tsv\n", encoding="utf-8")
    return root / "similar.yml"


def _config(task, model_dir, out, epochs=6, **task_options):
    return FinetuneConfig.from_dict({
        "model": str(model_dir), "task": {"name": str(task), "epochs": epochs, **task_options},
        "optim": {"batch_size": 16, "lr": 3e-3, "warmup_ratio": 0.1},
        "run": {"output_dir": str(out), "log_every": 4, "progress": False},
        "speed": {"threads": 1, "prefetch": 0}})


def test_jsonl_classification_through_the_cli_and_predict(jsonl_task, model_dir, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["finetune", "--task", str(jsonl_task), "--model", str(model_dir), "--out", str(out),
                 "--set", "task.epochs=8", "--set", "optim.batch_size=16", "--set", "optim.lr=3e-3",
                 "--set", "run.progress=false", "--set", "speed.threads=1", "--set", "speed.prefetch=0"]) == 0
    assert "best dev f1" in capsys.readouterr().err
    task = get_task(str(jsonl_task))
    assert isinstance(task, UserTask) and task.metrics == ("f1", "accuracy", "mcc")
    assert task.label_names() == ("neg", "pos")
    dev_metrics = json.loads((out / "dev_metrics.json").read_text())
    assert set(dev_metrics) == {"f1", "accuracy", "mcc"} and dev_metrics["accuracy"] > 90  # the cue word decides
    lines = (out / "dev_predictions.tsv").read_text().splitlines()
    assert lines[0] == "index\tprediction" and len(lines) == 33
    assert [line.split("\t")[0] for line in lines[1:]] == [str(i) for i in range(32)]
    assert {line.split("\t")[1] for line in lines[1:]} <= {"neg", "pos"}
    saved = json.loads((out / "model" / "config.json").read_text())
    assert saved["id2label"] == {"0": "neg", "1": "pos"}
    # `bertology predict --task FILE` writes the same file for the dev split, and evaluate scores it the same.
    predictions = tmp_path / "predictions.tsv"
    dev = jsonl_task.parent / "data" / "dev.jsonl"
    assert main(["predict", "--task", str(jsonl_task), "--model", str(out / "model"), "--input", str(dev),
                 "--output", str(predictions)]) == 0
    assert predictions.read_text().splitlines() == lines
    assert task.evaluate(predictions, dev) == dev_metrics
    capsys.readouterr()
    assert main(["evaluate", "--task", str(jsonl_task), "--gold", str(dev), "--predictions", str(predictions)]) == 0
    assert json.loads(capsys.readouterr().out) == dev_metrics
    assert main(["evaluate", "--task", str(jsonl_task), "--predictions", str(predictions)]) == 2
    assert "--gold FILE is required" in capsys.readouterr().err


def test_tsv_pair_regression(tsv_task, model_dir, tmp_path):
    out = tmp_path / "run"
    result = finetune(_config(tsv_task, model_dir, out, epochs=12))
    task = get_task(str(tsv_task))
    assert task.metrics == ("pearson", "spearman") and task.label_names() is None
    assert result.best["metric"] == "pearson" and set(result.dev_metrics) == {"pearson", "spearman"}
    assert result.dev_metrics["pearson"] > 50  # the texts' cue words decide the score
    rows = [line.split("\t") for line in (out / "dev_predictions.tsv").read_text().splitlines()[1:]]
    assert len(rows) == 32 and all(np.isfinite(float(value)) for _, value in rows)
    saved = json.loads((out / "model" / "config.json").read_text())
    assert saved["problem_type"] == "regression"


def test_conll_tagging(model_dir, tmp_path, capsys):
    rng = np.random.default_rng(2)
    for split, n in (("train", 64), ("dev", 16)):
        sentences = []
        for _ in range(n):
            words = list(rng.choice(FILL, 4))
            k = int(rng.integers(4))
            words[k] = str(rng.choice(GOOD))
            sentences.append("\n".join(f"{w} {'B-POS' if i == k else 'O'}" for i, w in enumerate(words)))
        (tmp_path / f"{split}.conll").write_text("\n\n".join(sentences) + "\n", encoding="utf-8")
    (tmp_path / "cue.json").write_text(json.dumps({"format": "conll", "kind": "tagging", "train": "train.conll",
                                                   "dev": "dev.conll"}), encoding="utf-8")
    out = tmp_path / "run"
    result = finetune(_config(tmp_path / "cue.json", model_dir, out, epochs=6))
    assert get_task(str(tmp_path / "cue.json")).label_names() == ("O", "B-POS", "I-POS")
    assert result.best["metric"] == "f1" and result.dev_metrics["f1"] > 50
    first = (out / "dev_predictions.conll").read_text().split("\n\n")[0].splitlines()
    assert len(first) == 4 and all(len(line.split()) == 4 for line in first)  # word, tag, gold, predicted
    # `bertology evaluate` scores a tagging task file's predictions alone (conlleval: gold is in the file).
    assert main(["evaluate", "--task", str(tmp_path / "cue.json"), "--predictions",
                 str(out / "dev_predictions.conll")]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["f1"] == pytest.approx(result.dev_metrics["f1"])


def test_unknown_dev_label_is_named_by_file_and_line(jsonl_task, model_dir, tmp_path):
    (tmp_path / "train.jsonl").write_text('{"t": "good film", "y": "pos"}\n{"t": "bad film", "y": "neg"}\n')
    (tmp_path / "dev.jsonl").write_text('{"t": "good", "y": "pos"}\n\n{"t": "meh", "y": "mixed"}\n')
    (tmp_path / "task.yaml").write_text("format: jsonl\nkind: classification\ntext: t\nlabel: y\n"
                                        "train: train.jsonl\ndev: dev.jsonl\n")
    with pytest.raises(DataError, match=r"dev\.jsonl: line 3: unknown label 'mixed' \(expected one of 'neg', 'pos'\)"):
        finetune(_config(tmp_path / "task.yaml", model_dir, tmp_path / "run"))


def test_task_file_errors_name_the_file_and_the_key(model_dir, tmp_path):
    with pytest.raises(ConfigError, match=r"task.name: .*missing\.yaml: no such task file"):
        _config(tmp_path / "missing.yaml", model_dir, tmp_path / "run")
    bad = tmp_path / "bad.yaml"
    bad.write_text("format: tsv\nkind: regression\ntext: a\nlabel: b\nmetric: accuracy\ntrain: t.tsv\n")
    with pytest.raises(ConfigError, match=r"bad\.yaml: task\.metric: a regression task is scored by pearson, "
                                          r"spearman; got 'accuracy'"):
        get_task(str(bad))
    bad.write_text("format: tsv\nkind: classification\ntext: a\nlabel: b\ncolour: red\n")
    with pytest.raises(ConfigError, match=r"bad\.yaml: task\.colour"):
        get_task(str(bad))
    bad.write_text("format: tsv\ntext: a\n")
    with pytest.raises(ConfigError, match=r"bad\.yaml: task\.kind: required"):
        get_task(str(bad))
    bad.write_text("format: tsv\nkind: classification\ntext: a\nlabel: b\ntrain: t.tsv\n")
    with pytest.raises(ConfigError, match=r"bad\.yaml: task\.dev: no file given"):
        get_task(str(bad)).path(None, "dev")
    with pytest.raises(ConfigError, match="or the path of a task file"):
        get_task("my-task")


def test_the_shipped_example_task_file_loads():
    task = get_task(str(EXAMPLE))
    assert task.config.format == "tsv" and task.config.text_pair == "sentence2" and task.metrics[0] == "accuracy"
    assert task.label_names() == ("entailment", "not_entailment")
    dev = task.path(None, "dev")
    assert dev.parts[-2:] == ("RTE", "dev.tsv")
    if not dev.is_file():
        pytest.skip(f"the shared GLUE files are not at {dev}")
    examples = task.read(dev, limit=3)
    assert len(examples) == 3 and examples[0].text_pair and examples[0].label in task.label_names()
