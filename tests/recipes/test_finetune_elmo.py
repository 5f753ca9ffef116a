"""Fine-tuning on a tiny random ELMo (released format, written by write_elmo) with the frozen-feature strategy: the
scalar mix of its three layers under a mean-pooled classifier (SST-2-like data) and under the BiLSTM-CRF tagger
(CoNLL-style NER); the saved model reloads and predicts; strategies ELMo has no use for are refused by name."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import bertology
from bertology.errors import ConfigError
from bertology.model.elmo import ElmoModel, tiny_config
from bertology.recipes.finetune import FinetuneConfig, finetune, predict_file
from bertology.tokenization.words import SPECIALS
from finetune_helpers import BAD, FILL, GOOD, cue_sentence, toy_conll

pytest.importorskip("h5py")


@pytest.fixture(scope="module")
def elmo_dir(tmp_path_factory):
    from bertology.model.elmo_format import write_elmo

    words = [*SPECIALS, *GOOD, *BAD, *FILL]
    model = ElmoModel(tiny_config(vocab_size=len(words), projection_dim=16, cell_size=32))
    model.init_weights(torch.Generator().manual_seed(0))
    with torch.no_grad():  # weights of a trained model's scale, so that words differ in their features
        for name, parameter in model.named_parameters():
            if parameter.dim() > 1:
                parameter.normal_(0.0, 0.3, generator=torch.Generator().manual_seed(parameter.numel()))
    return write_elmo(model, tmp_path_factory.mktemp("elmo") / "elmo", words)


@pytest.fixture(scope="module")
def glue(tmp_path_factory):
    root = tmp_path_factory.mktemp("glue")
    rng = np.random.default_rng(0)
    (root / "SST-2").mkdir()
    for split, n in (("train", 128), ("dev", 48)):
        rows = [(cue_sentence(rng, label), label) for label in rng.integers(0, 2, n)]
        (root / "SST-2" / f"{split}.tsv").write_text(
            "sentence\tlabel\n" + "".join(f"{s} \t{label}\n" for s, label in rows), encoding="utf-8")
    return root


def _config(model, name, data, out, **sections):
    raw = {"model": str(model), "task": {"name": name, "data": str(data), "epochs": 4},
           "strategy": {"kind": "scalar-mix"}, "optim": {"batch_size": 16, "lr": 1e-2},
           "run": {"output_dir": str(out), "progress": False}, "speed": {"threads": 1, "prefetch": 0}}
    for name, values in sections.items():
        raw.setdefault(name, {}).update(values)
    return FinetuneConfig.from_dict(raw)


def test_sst2_on_elmos_mixed_layers_learns_and_the_model_predicts_again(elmo_dir, glue, tmp_path):
    out = tmp_path / "run"
    result = finetune(_config(elmo_dir, "sst2", glue, out, task={"epochs": 10}, optim={"lr": 0.1}))
    dev = [line.split("\t")[-1] for line in (glue / "SST-2" / "dev.tsv").read_text().splitlines()[1:]]
    majority = 100 * max(dev.count("0\n"), dev.count("1\n")) / len(dev)
    # Random features of a few words pooled: learnable (a least-squares fit on them reaches about 88 %), slowly.
    assert result.best["value"] > majority + 10, (result.best, majority)
    trained = bertology.load(out / "model").model
    assert isinstance(trained, ElmoModel) and [h.kind for h in trained.head_specs] == ["mean_pooled"]
    assert trained.config.vocab_size == 0 and trained.softmax is None  # the task has no use for the word softmax
    heads = sum(p.numel() for p in trained.heads.parameters())
    assert result.trainable.trainable == heads + 3 + 1  # the head, the mix's three weights and gamma
    assert not torch.equal(trained.mix.scalars.detach(), torch.zeros(3))
    original = bertology.load(elmo_dir).model
    for name, value in original.state_dict().items():  # ELMo's own weights stayed as they were
        if not name.startswith(("softmax.", "heads.")):
            torch.testing.assert_close(trained.state_dict()[name], value, rtol=0, atol=0)
    predict_file(out / "model", "sst2", glue / "SST-2" / "dev.tsv", tmp_path / "pred.tsv")
    assert (tmp_path / "pred.tsv").read_text() == (out / "dev_predictions.tsv").read_text()
    # Max pooling of the mixed words, and a BiLSTM over them then the max, the other sentence heads.
    for pooling, kind in (("max", "max_pooled"), ("bilstm-max", "bilstm_max")):
        other = finetune(_config(elmo_dir, "sst2", glue, tmp_path / pooling, task={"pooling": pooling, "epochs": 1}))
        assert [h.kind for h in bertology.load(other.model_dir).model.head_specs] == [kind]


def test_ner_with_the_bilstm_crf_on_elmo(elmo_dir, tmp_path, monkeypatch):
    conll = toy_conll(tmp_path / "conll", sizes=(("eng.train", 64), ("eng.testa", 16)))
    out = tmp_path / "run"
    result = finetune(_config(elmo_dir, "conll2003", conll, out, task={"tagger": "bilstm-crf", "epochs": 2}))
    assert {"f1", "precision", "recall"} <= set(result.dev_metrics) and result.steps == 8
    assert sorted(p.name for p in out.iterdir()) == ["best.json", "dev_metrics.json", "dev_predictions.conll",
                                                     "metrics.jsonl", "model", "run_config.json"]
    lines = [line.split() for line in (out / "dev_predictions.conll").read_text().splitlines() if line.strip()]
    gold = [line.split() for line in (conll / "eng.testa").read_text().splitlines() if line.strip()]
    assert [row[:4] for row in lines] == gold and all(len(row) == 6 for row in lines)
    assert json.loads((out / "model" / "bertology.json").read_text())["heads"][0]["kind"] == "bilstm_crf"
    # predict on words only: the same tags; a write that fails midway leaves no file behind.
    words = tmp_path / "words.txt"
    words.write_text("\n".join(row[0] if row else "" for row in
                               ([line.split() for line in (conll / "eng.testa").read_text().splitlines()])) + "\n")
    assert predict_file(out / "model", "conll2003", words, tmp_path / "tags.txt") == 16
    tagged = [line.split() for line in (tmp_path / "tags.txt").read_text().splitlines() if line.strip()]
    assert [row[-1] for row in tagged] == [row[-1] for row in lines]
    from bertology.tasks import tagging

    def broken(*args):
        yield "a line"
        raise RuntimeError("disk full")

    monkeypatch.setattr(tagging, "predicted_lines", broken)
    with pytest.raises(RuntimeError, match="disk full"):
        predict_file(out / "model", "conll2003", words, tmp_path / "broken.txt")
    assert not (tmp_path / "broken.txt").exists()


@pytest.mark.parametrize("kind", ["lora", "adapters", "prefix"])
def test_strategies_for_transformer_blocks_are_refused_on_elmo(elmo_dir, glue, tmp_path, kind):
    with pytest.raises(ConfigError, match=f"strategy.kind: {kind} adapts transformer blocks, which the model "
                                          "\\(ElmoModel, registered as 'elmo'\\) does not have \\(capability "
                                          "'blocks'\\): use scalar-mix"):
        finetune(_config(elmo_dir, "sst2", glue, tmp_path / "run", strategy={"kind": kind}))


def test_a_frozen_bilm_runs_without_gradients_or_dropout_under_a_training_mix():
    model = ElmoModel(tiny_config(projection_dim=8, cell_size=16, dropout=0.5))
    model.init_weights(torch.Generator().manual_seed(0))
    model.add_extension("mix", "scalar_mix")
    for parameter in model.bilm_parameters():
        parameter.requires_grad_(False)
    model.train()
    from bertology.model.elmo import batch_to_ids

    chars, mask = batch_to_ids([["a", "frozen", "model"], ["two"]])
    first, second = (model(chars, mask, output_hidden_states=True) for _ in range(2))
    for a, b in zip(first.hidden_states, second.hidden_states):
        torch.testing.assert_close(a, b, rtol=0, atol=0)  # no dropout inside the frozen biLM
        assert not a.requires_grad
    first.last_hidden_state.sum().backward()  # the mix above it trains
    assert model.mix.scalars.grad is not None and model.mix.gamma.grad is not None


def test_an_elmo_tagging_run_resumes_from_its_checkpoint(elmo_dir, tmp_path, monkeypatch):
    """Killed after its final files, before the clean-up: --resume reads the last checkpoint (ELMo, its mix and the
    BiLSTM-CRF, in the native format, with words.txt) back and writes the same model again."""
    import shutil

    from bertology.recipes import finetune as recipe

    conll = toy_conll(tmp_path / "conll", sizes=(("eng.train", 32), ("eng.testa", 8)))
    out = tmp_path / "run"

    def config():
        return _config(elmo_dir, "conll2003", conll, out, task={"tagger": "bilstm-crf", "epochs": 2},
                       run={"checkpoint_every": 2})

    def killed(*args):
        raise KeyboardInterrupt

    with monkeypatch.context() as patch:
        patch.setattr(recipe, "drop_working_copies", killed)
        with pytest.raises(KeyboardInterrupt):
            finetune(config())
    assert (out / "checkpoints" / "step-0000004" / "words.txt").is_file()
    reference = bertology.load(out / "model").model.state_dict()
    shutil.rmtree(out / "model")
    (out / "best.json").unlink()
    again = finetune(config(), resume=True)
    assert again.steps == 4 and not (out / "checkpoints").exists()
    restored = bertology.load(out / "model").model.state_dict()
    assert restored.keys() == reference.keys() and all(torch.equal(restored[k], reference[k]) for k in reference)
