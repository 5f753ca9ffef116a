"""The BiLSTM-CRF tagger (``task.tagger: bilstm-crf``) fine-tuned end to end on a tiny BERT over CoNLL-2003's first
sentences (../shared/data/conll2003), scored by conlleval; the saved model reloads and predicts the same tags."""

from __future__ import annotations

import json

import pytest

from bertology.errors import ConfigError
from bertology.model import load
from bertology.recipes.finetune import FinetuneConfig, finetune, predict_file, task_heads
from bertology.tasks import read_conll
from bertology.tasks.lookup import get_task
from bertology.tasks.metrics import evaluate_files
from finetune_helpers import save_tiny_model, toy_conll


@pytest.fixture(scope="module")
def conll(data_dir):
    root = data_dir / "conll2003"
    if not (root / "eng.train").is_file() or not (root / "eng.testa").is_file():
        pytest.skip(f"CoNLL-2003 not found at {root} (eng.train, eng.testa)")
    return root


def _words(path, n):
    out = []
    for k, sentence in enumerate(read_conll(path)):
        if k >= n:
            break
        out.extend(sentence.words)
    return out


def test_bilstm_crf_ner_on_a_tiny_bert(conll, tmp_path):
    model_dir = save_tiny_model(tmp_path / "base", _words(conll / "eng.train", 64) + _words(conll / "eng.testa", 24),
                                vocab_size=300)
    out = tmp_path / "run"
    config = FinetuneConfig.from_dict({
        "model": str(model_dir), "task": {"name": "conll2003", "data": str(conll), "tagger": "bilstm-crf",
                                          "epochs": 2, "limit_train": 64, "limit_dev": 24, "max_length": 64},
        "strategy": {"kind": "frozen"}, "optim": {"batch_size": 16, "lr": 1e-2},
        "run": {"output_dir": str(out), "progress": False}, "speed": {"threads": 1, "prefetch": 0}})
    result = finetune(config)
    assert result.steps >= 8 and set(result.dev_metrics) == {"f1", "precision", "recall"}
    # The written predictions are conlleval's input, and conlleval scores them as the run did.
    scored = evaluate_files("conll", out / "dev_predictions.conll")
    assert scored["f1"] == pytest.approx(result.best["scores"]["f1"])
    rows = [line.split() for line in (out / "dev_predictions.conll").read_text().splitlines()]
    tags = [row[-1] for row in rows if row and row[0] != "-DOCSTART-"]
    assert len(tags) == sum(len(s) for k, s in enumerate(read_conll(conll / "eng.testa")) if k < 24)
    # Viterbi keeps to BIO: an I- tag only continues an entity of its type.
    previous = "O"
    for row in rows:
        tag = row[-1] if row else "O"
        assert not tag.startswith("I-") or previous[2:] == tag[2:], (previous, tag)
        previous = tag
    reloaded = load(out / "model")
    assert [h.kind for h in reloaded.model.head_specs] == ["bilstm_crf"]
    assert json.loads((out / "model" / "bertology.json").read_text())["heads"][0]["kind"] == "bilstm_crf"
    dev = tmp_path / "dev.conll"
    dev.write_text("\n\n".join("\n".join(" ".join(c) for c in s.columns) for k, s in
                               enumerate(read_conll(conll / "eng.testa", tag_column=None, scheme_out=None))
                               if k < 24) + "\n")
    predict_file(out / "model", "conll2003", dev, tmp_path / "again.conll", max_length=64)
    again = [line.split()[-1] for line in (tmp_path / "again.conll").read_text().splitlines() if line.strip()]
    assert again == tags


def test_the_tagger_option_is_for_tagging_tasks(tmp_path):
    from bertology.model import preset

    config = preset("tiny", vocab_size=40, num_layers=1, hidden_size=16, num_heads=2, intermediate_size=32)
    assert [h.kind for h in task_heads(get_task("conll2003"), config, tagger="bilstm-crf")] == ["bilstm_crf"]
    with pytest.raises(ConfigError, match="task.tagger: 'bilstm-crf' applies to tagging tasks; sst2 has no token"):
        task_heads(get_task("sst2"), config, tagger="bilstm-crf")
    with pytest.raises(ConfigError, match="task.tagger"):
        FinetuneConfig.from_dict({"model": "m", "task": {"name": "conll2003", "tagger": "crf"}})
    assert [h.kind for h in task_heads(get_task("sst2"), config, pooling="max")] == ["max_pooled"]
    assert [h.kind for h in task_heads(get_task("sst2"), config, pooling="bilstm-max")] == ["bilstm_max"]
    with pytest.raises(ConfigError, match="task.pooling: 'bilstm-max' applies to sentence tasks"):
        task_heads(get_task("conll2003"), config, pooling="bilstm-max")


def test_the_crf_tagger_learns_toy_entities(tmp_path):
    root = toy_conll(tmp_path / "conll")
    model_dir = save_tiny_model(tmp_path / "base", ["Paris", "Berlin", "John", "Smith", "the", "a", "visit", "to",
                                                    "met", "in", "said"], vocab_size=80)
    # Frozen features: the head alone learns (after a plateau of all-O predictions, about 100 steps here).
    config = FinetuneConfig.from_dict({
        "model": str(model_dir), "task": {"name": "conll2003", "data": str(root), "tagger": "bilstm-crf",
                                          "epochs": 20},
        "strategy": {"kind": "frozen"}, "optim": {"batch_size": 16, "lr": 1e-2}, "run": {"output_dir": str(tmp_path / "run"), "progress": False},
        "speed": {"threads": 1, "prefetch": 0}})
    result = finetune(config)
    assert result.best["value"] > 90, result.best


def test_the_cli_sets_the_tagger(tmp_path, capsys):
    from bertology.cli.main import main

    root = toy_conll(tmp_path / "conll", sizes=(("eng.train", 16), ("eng.testa", 4)))
    model_dir = save_tiny_model(tmp_path / "base", ["Paris", "Berlin", "John", "Smith", "the", "a", "visit", "to",
                                                    "met", "in", "said"], vocab_size=60)
    assert main(["finetune", "--task", "conll2003", "--model", str(model_dir), "--out", str(tmp_path / "run"),
                 "--data", str(root), "--tagger", "bilstm-crf", "--max-steps", "1", "--set", "run.progress=false",
                 "--set", "speed.threads=1", "--set", "optim.batch_size=8"]) == 0
    assert json.loads((tmp_path / "run" / "run_config.json").read_text())["task"]["tagger"] == "bilstm-crf"
    assert load(tmp_path / "run" / "model").model.head_specs[0].kind == "bilstm_crf"
