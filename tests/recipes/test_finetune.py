"""Fine-tuning end to end on tiny GLUE-format files: outputs, the best model kept, early stopping, transformers
loading the result with its label names, and the official metric of the dev predictions."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import torch

from bertology.cli.main import main
from bertology.errors import ConfigError
from bertology.model import load
from bertology.recipes.finetune import FinetuneConfig, finetune
from bertology.tasks.metrics import evaluate_files
from bertology.training import read_metrics
from finetune_helpers import BAD, FILL, GOOD, save_tiny_model
from finetune_helpers import cue_sentence as _sentence



@pytest.fixture(scope="module")
def glue(tmp_path_factory):
    root = tmp_path_factory.mktemp("glue")
    rng = np.random.default_rng(0)
    for split, n in (("train", 192), ("dev", 48)):
        (root / "SST-2").mkdir(exist_ok=True)
        rows = [(_sentence(rng, label), label) for label in rng.integers(0, 2, n)]
        (root / "SST-2" / f"{split}.tsv").write_text(
            "sentence\tlabel\n" + "".join(f"{s} \t{label}\n" for s, label in rows), encoding="utf-8")
        (root / "STS-B").mkdir(exist_ok=True)
        header = "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore\n"
        lines = []
        for i in range(n):
            a, b = rng.integers(0, 2, 2)
            score = 4.0 + rng.random() if a == b else rng.random()
            lines.append(f"{i}\tg\tf\t2012\t{i}\ts\ts\t{_sentence(rng, a)}\t{_sentence(rng, b)}\t{score:.3f}\n")
        (root / "STS-B" / f"{split}.tsv").write_text(header + "".join(lines), encoding="utf-8")
    return root


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("base") / "model", GOOD + BAD + FILL, vocab_size=40)


def _config(glue, model_dir, out, task="sst2", epochs=4, **sections):
    raw = {"model": str(model_dir), "task": {"name": task, "data": str(glue), "epochs": epochs},
           "optim": {"batch_size": 16, "lr": 3e-3, "warmup_ratio": 0.1},
           "run": {"output_dir": str(out), "log_every": 4, "progress": False},
           "speed": {"threads": 1, "prefetch": 0}}
    for name, values in sections.items():
        raw.setdefault(name, {}).update(values)
    return FinetuneConfig.from_dict(raw)


def test_sst2_learns_keeps_the_best_model_and_transformers_loads_it(glue, model_dir, tmp_path):
    out = tmp_path / "run"
    result = finetune(_config(glue, model_dir, out, epochs=8))
    assert result.steps == 8 * (192 // 16)
    evals = [r for r in read_metrics(out / "metrics.jsonl") if r["kind"] == "eval"]
    assert [r["step"] for r in evals] == [12 * e for e in range(1, 9)]  # once an epoch
    best = json.loads((out / "best.json").read_text())
    assert best["value"] == max(r["dev_accuracy"] for r in evals) == result.best["value"]
    assert best["final_step"] == result.steps and best["trainable"] == list(result.trainable)
    # One copy of the final model; the working copy best/ and the checkpoints are gone once the run has finished.
    assert sorted(p.name for p in out.iterdir()) == ["best.json", "dev_metrics.json",
                                                     "dev_predictions.tsv", "metrics.jsonl", "model",
                                                     "run_config.json"]
    assert best["value"] > 90  # the cue word decides the label
    # dev_metrics.json is what `bertology evaluate` computes from the written predictions.
    official = evaluate_files("sst2", out / "dev_predictions.tsv", gold=glue / "SST-2" / "dev.tsv")
    assert result.dev_metrics == official and official["accuracy"] == pytest.approx(best["value"])
    transformers = pytest.importorskip("transformers")
    hf = transformers.AutoModelForSequenceClassification.from_pretrained(out / "model").eval()
    assert hf.config.id2label == {0: "negative", 1: "positive"}  # the names, not the file's codes
    ours = load(out / "model")
    ids = torch.tensor([ours.tokenizer.encode("the film was great").ids])
    with torch.no_grad():
        torch.testing.assert_close(hf(ids).logits, ours.model(ids).logits, atol=1e-5, rtol=1e-5)
    # Raw text in, label names out; the official predictions file keeps GLUE's 0/1.
    from bertology import pipeline

    answers = pipeline(model=out / "model")(["the film was great", "the plot was awful"])
    assert [a[0]["label"] for a in answers] == ["positive", "negative"] and answers[0][0]["score"] > 0.5
    assert (out / "dev_predictions.tsv").read_text().splitlines()[1].split("\t")[1] in ("0", "1")


def test_stsb_regression_and_early_stopping(glue, model_dir, tmp_path):
    out = tmp_path / "run"
    # A learning rate below float32's resolution: the weights, and so the dev correlation, never change.
    config = _config(glue, model_dir, out, task="stsb", select={"patience": 1}, optim={"lr": 1e-12})
    result = finetune(config)
    records = read_metrics(out / "metrics.jsonl")
    stops = [r for r in records if r["kind"] == "stop"]
    evals = [r for r in records if r["kind"] == "eval"]
    assert {"dev_pearson", "dev_spearman"} <= set(evals[0])
    assert len(stops) == 1 and "no better dev pearson in 1 evaluations (best" in stops[0]["reason"]
    assert result.steps == 24 and [r["step"] for r in evals] == [12, 24]  # stopped at the second evaluation
    assert (out / "model" / "config.json").is_file()
    saved = json.loads((out / "model" / "config.json").read_text())
    assert saved["architectures"] == ["BertForSequenceClassification"] and saved["problem_type"] == "regression"


def test_the_cli_runs_and_bad_settings_are_named(glue, model_dir, tmp_path, capsys):
    out = tmp_path / "cli"
    assert main(["finetune", "--task", "sst2", "--model", str(model_dir), "--out", str(out), "--data", str(glue),
                 "--max-steps", "3", "--limit-train", "64", "--set", "run.progress=false",
                 "--set", "speed.threads=1", "--keep-checkpoint"]) == 0
    assert "fine-tuned 3 steps (trainable parameters: 21,730 of 21,730 (100.0000%)); best dev accuracy" in \
        capsys.readouterr().err
    # --keep-checkpoint: the last checkpoint stays, with the optimizer state; best/ still goes.
    assert (out / "checkpoints" / "step-0000003" / "trainer_state.safetensors").is_file()
    assert (out / "model" / "model.safetensors").is_file() and not (out / "best").exists()
    assert main(["finetune", "--task", "sst2", "--model", str(model_dir), "--out", str(out), "--data",
                 str(glue)]) == 2
    assert "already holds a run" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="task.name: unknown task 'sst3'; known: cola, conll2003, .*, sst2, .*stsb"):
        _config(glue, model_dir, out, task="sst3")
    with pytest.raises(ConfigError, match="select.metric: sst2 reports accuracy"):
        _config(glue, model_dir, out, select={"metric": "f1"})


def test_predict_writes_what_evaluate_reads(glue, model_dir, tmp_path, capsys):
    out = tmp_path / "run"
    finetune(_config(glue, model_dir, out, epochs=1))
    predictions = tmp_path / "pred.tsv"
    dev = glue / "SST-2" / "dev.tsv"
    assert main(["predict", "--model", str(out / "model"), "--task", "sst2", "--input", str(dev),
                 "--output", str(predictions)]) == 0
    assert predictions.read_text() == (out / "dev_predictions.tsv").read_text()
    rows = len(predictions.read_text().splitlines()) - 1
    assert json.loads(capsys.readouterr().out) == {"output": str(predictions), "task": "sst2", "predictions": rows}
    assert main(["evaluate", "--task", "sst2", "--gold", str(dev), "--predictions", str(predictions)]) == 0
    assert json.loads(capsys.readouterr().out) == json.loads((out / "dev_metrics.json").read_text())
    assert main(["predict", "--model", str(out / "model"), "--task", "stsb", "--input", str(dev),
                 "--output", str(tmp_path / "x.tsv")]) == 2
    assert "its classifier has 2 outputs; stsb needs 1" in capsys.readouterr().err
    assert not (tmp_path / "x.tsv").exists()
    # The run's folder instead of its model: the error names the subfolder that holds the model.
    assert main(["predict", "--model", str(out), "--task", "sst2", "--input", str(dev), "--output",
                 str(tmp_path / "y.tsv")]) == 2
    err = capsys.readouterr().err
    assert "config.json is missing; this folder holds a model in a subfolder: give" in err
    assert str(out / "model") in err and err.count("\n") == 1
    # An existing directory as --output fails before the model is even read (here: a model that does not exist).
    assert main(["predict", "--model", str(tmp_path / "no-model"), "--task", "sst2", "--input", str(dev),
                 "--output", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert f"--output {tmp_path}: is a directory" in err and err.count("\n") == 1


def test_predict_help_says_each_tasks_output_format(capsys):
    with pytest.raises(SystemExit) as done:
        main(["predict", "--help"])
    assert done.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    for task, says in (("sst2", "index<TAB>prediction"), ("conll2003", "conlleval's input"),
                       ("conll2003", "6 columns for CoNLL-2003's 4-column files"), ("conll2003", "'word tag' lines"),
                       ("conll2003-spans", "sentence_id<TAB>start<TAB>end<TAB>predicted<TAB>gold"),
                       ("squad", "the official SQuAD v1.1 predictions JSON")):
        assert task in text and says in text, says


@pytest.mark.parametrize("kind", ["lora", "adapters", "prefix", "frozen"])
def test_parameter_efficient_strategies(glue, model_dir, tmp_path, kind):
    out = tmp_path / kind
    result = finetune(_config(glue, model_dir, out, epochs=2, strategy={"kind": kind, "rank": 4}))
    assert 0 < result.trainable.trainable < result.trainable.total
    reloaded = load(out / "model")  # native format: the extensions are rebuilt
    assert reloaded.model.extensions or kind == "frozen"
    dev = glue / "SST-2" / "dev.tsv"
    from bertology.recipes.finetune import predict_file

    predict_file(out / "model", "sst2", dev, tmp_path / "p.tsv")
    assert (tmp_path / "p.tsv").read_text() == (out / "dev_predictions.tsv").read_text()
    if kind == "lora":
        assert (out / "peft_adapter" / "adapter_config.json").is_file()
        config = json.loads((out / "peft_adapter" / "adapter_config.json").read_text())
        assert config["r"] == 4 and config["peft_type"] == "LORA"


def test_a_lora_run_resumes_from_its_native_checkpoint(glue, model_dir, tmp_path, monkeypatch):
    """LoRA models checkpoint in the native format; --resume reads them back, and a resume at the last step
    (a run killed before its clean-up) writes the final model again; a finished run is not run again."""
    import shutil

    from bertology.errors import DataError
    from bertology.recipes import finetune as recipe

    out = tmp_path / "run"
    config = dict(epochs=2, strategy={"kind": "lora", "rank": 2}, run={"checkpoint_every": 6})

    def killed(*args):
        raise KeyboardInterrupt  # stands for a kill after the final files, before the clean-up

    with monkeypatch.context() as patch:
        patch.setattr(recipe, "drop_working_copies", killed)
        with pytest.raises(KeyboardInterrupt):
            finetune(_config(glue, model_dir, out, **config))
    assert (out / "checkpoints" / "step-0000024" / "bertology.json").is_file() and (out / "best").is_dir()
    first = json.loads((out / "best.json").read_text())
    reference = load(out / "model").model.state_dict()
    shutil.rmtree(out / "model")
    (out / "best.json").unlink()  # killed while writing the final model: the run has not finished
    again = finetune(_config(glue, model_dir, out, **config), resume=True)
    assert again.steps == first["final_step"] == 24 and again.best["value"] == first["value"]
    restored = load(out / "model").model.state_dict()
    assert all(torch.equal(restored[k], reference[k]) for k in reference)
    assert not (out / "best").exists() and not (out / "checkpoints").exists()
    # --resume on the finished run: nothing is trained again, the result is read back.
    metrics = (out / "metrics.jsonl").read_text()
    done = finetune(_config(glue, model_dir, out, **config), resume=True)
    assert (done.steps, done.best, done.dev_metrics, done.trainable) == \
        (again.steps, again.best, again.dev_metrics, again.trainable)
    assert (out / "metrics.jsonl").read_text() == metrics
    shutil.rmtree(out / "model")
    with pytest.raises(DataError, match=r"a finished run \(best.json\) without model; its result is gone"):
        finetune(_config(glue, model_dir, out, **config), resume=True)


def test_resuming_a_finished_run_with_broken_records_names_the_file(glue, model_dir, tmp_path):
    from bertology.errors import DataError

    out = tmp_path / "run"
    (out / "model").mkdir(parents=True)
    (out / "metrics.jsonl").write_text("")
    (out / "dev_metrics.json").write_text('{"accuracy": 50.0}\n')
    for text, where in (("{", "best.json"), ('{"step": 1}', "best.json"), ("[1]", "best.json")):
        (out / "best.json").write_text(text)
        with pytest.raises(DataError, match=f"{where}: not the file a finished run writes"):
            finetune(_config(glue, model_dir, out), resume=True)
    (out / "best.json").write_text('{"step": 3, "metric": "accuracy", "value": 50.0, "scores": {}, '
                                   '"final_step": 3, "trainable": [5, 5]}')
    (out / "run_config.json").write_text("\xff")
    with pytest.raises(DataError, match="run_config.json: not the file a finished run writes"):
        finetune(_config(glue, model_dir, out), resume=True)
    (out / "run_config.json").unlink()
    result = finetune(_config(glue, model_dir, out), resume=True)
    assert (result.steps, result.trainable.total, result.dev_metrics) == (3, 5, {"accuracy": 50.0})


def test_the_dev_set_is_predicted_once_per_evaluation_and_never_again_at_the_end(glue, model_dir, tmp_path,
                                                                                  monkeypatch, capsys):
    from bertology.tasks.lookup import get_task

    task = get_task("sst2")
    calls = []
    predict = task.predict

    def counted(model, encoded, examples, batch_size):
        calls.append(len(examples))
        return predict(model, encoded, examples, batch_size)

    monkeypatch.setattr(task, "predict", counted)
    out = tmp_path / "run"
    result = finetune(_config(glue, model_dir, out, epochs=3, run={"progress": True}))
    evals = [r for r in read_metrics(out / "metrics.jsonl") if r["kind"] == "eval"]
    assert len(evals) == 3 and calls == [48, 48, 48]  # the kept model's predictions are not computed again
    assert {"dev loss", "dev predictions"} <= set(re.findall(r"dev \w+", capsys.readouterr().err))  # progress bars
    official = evaluate_files("sst2", out / "dev_predictions.tsv", gold=glue / "SST-2" / "dev.tsv")
    assert official == result.dev_metrics and official["accuracy"] == pytest.approx(result.best["value"])


def test_fine_tuning_defaults_hold_when_a_section_is_partly_given(model_dir):
    config = FinetuneConfig.from_dict({"model": str(model_dir), "task": {"name": "sst2"},
                                       "optim": {"batch_size": 8}, "run": {"seed": 1}})
    assert (config.optim.lr, config.optim.warmup_ratio, config.optim.batch_size) == (5e-5, 0.1, 8)
    assert (config.run.output_dir, config.run.log_every, config.run.seed) == ("runs/finetune", 20, 1)
