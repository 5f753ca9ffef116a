"""Span typing (conll2003-spans): the span representation against a hand computation (mean and attention pooling),
the classifier saved and rebuilt with the model, end to end on a tiny synthetic file, and the predictions file."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import bertology.recipes.finetune as finetune_recipe
from bertology.cli.main import main
from bertology.errors import ConfigError, DataError, InputError
from bertology.model import EncoderModel, load, save_model
from bertology.model.heads import HeadInputs, HeadSpec, build_head
from bertology.recipes.finetune import FinetuneConfig, finetune
from bertology.tasks.lookup import get_task
from bertology.tasks.spans import (
    SpanTask,
    encode_spans,
    evaluate_spans,
    span_classifier,
    span_positions,
)
from transformer_helpers import tiny_config
from test_tagging import conll, model_dir, subword_tokenizer, write_conll  # noqa: F401  (the same fixtures)


@pytest.mark.parametrize("pooling", ["mean", "attention"])
def test_span_representation_by_hand(pooling):
    torch.manual_seed(0)
    z = torch.randn(2, 6, 4)
    spans = torch.tensor([[0, 1, 3], [1, 2, 2], [1, 0, 5], [0, 4, 5]])
    config = tiny_config(hidden_size=4)
    module = build_head(config, HeadSpec("span", "span_attention" if pooling == "attention" else "span", 3))
    got = module.represent(z, spans)
    for k, (row, i, j) in enumerate(spans.tolist()):
        inside = z[row, i:j + 1]
        if pooling == "mean":
            pooled = inside.mean(0)
        else:
            w = module.attend.weight[0]
            weights = torch.exp(inside @ w) / torch.exp(inside @ w).sum()
            pooled = (weights[:, None] * inside).sum(0)
        torch.testing.assert_close(got[k], torch.cat([z[row, i], z[row, j], pooled]))
    # Tokens outside a span do not change it.
    changed = z.clone()
    changed[0, 0] += 100
    torch.testing.assert_close(module.represent(changed, spans[:2]), got[:2])
    assert module.classify(z, spans).shape == (4, 3)
    mask = torch.ones(2, 6, dtype=torch.long)
    inputs = HeadInputs(hidden=z, attention_mask=mask, word_embeddings=torch.zeros(1, 4), spans=spans)
    torch.testing.assert_close(module(inputs), module.classify(z, spans))  # the registry's call: HeadInputs
    with pytest.raises(InputError, match="HeadInputs.spans"):
        module(HeadInputs(hidden=z, attention_mask=mask, word_embeddings=torch.zeros(1, 4)))


def test_span_positions_are_boundaries_and_interior():
    spans = torch.tensor([[0, 1, 3], [1, 2, 2], [0, 2, 4]])
    assert span_positions(spans, 6).tolist() == [[0, 1], [0, 2], [0, 3], [0, 4], [1, 2]]
    assert span_positions(spans[:0], 6).shape == (0, 2)


def test_encoded_spans_point_at_the_entity_subwords(tmp_path, subword_tokenizer):  # noqa: F811
    path = tmp_path / "s.conll"
    write_conll(path, [[("the", "O"), ("newyorkers", "I-MISC"), ("yorker", "I-MISC"), ("met", "O"),
                        ("york", "I-LOC")], [("the", "O")], [("york", "I-LOC")]], docs_every=0)
    task = get_task("conll2003-spans")
    sentences = task.read(path)
    encoded = encode_spans(subword_tokenizer, sentences, task.types, 32, shuffle=False)
    assert len(encoded) == 2  # the sentence without an entity is no example
    batch = encoded.collate(np.array([0, 1]))
    # [CLS] the new ##york ##er ##s york ##er met york [SEP]: MISC is tokens 2..7, LOC token 9
    assert batch.spans.tolist() == [[0, 2, 7], [0, 9, 9], [1, 1, 1]]
    assert batch.labels.tolist() == [task.types.index("MISC"), task.types.index("LOC"), task.types.index("LOC")]
    assert batch.span_ids.tolist() == [0, 1, 2]
    # Chunks are cut between entities: the MISC entity (6 subwords) stays whole in chunks of 8 tokens.
    short = encode_spans(subword_tokenizer, sentences, task.types, 8, shuffle=False)
    spans = short.collate(np.arange(len(short))).spans.tolist()
    assert [e - s for _, s, e in spans] == [5, 0, 0]


def test_the_classifier_is_saved_and_rebuilt_with_the_model(model_dir, tmp_path):  # noqa: F811
    task = SpanTask(pooling="attention")
    config = load(model_dir).model.config
    model = EncoderModel(config)
    task.extend_model(model)
    module = span_classifier(model)
    assert module is not None and module.pooling == "attention"
    assert any(name.startswith("heads.span.attend") for name, _ in model.named_parameters())
    save_model(model, tmp_path / "m")
    again = load(tmp_path / "m").model
    assert span_classifier(again) is not None and again.extensions == model.extensions
    for (name, a), (_, b) in zip(model.state_dict().items(), again.state_dict().items()):
        assert torch.equal(a, b), name
    with pytest.raises(ConfigError, match="has no span classifier"):
        task.predict(EncoderModel(config), None, [], 8)


def _config(conll, model_dir, out, epochs=3):  # noqa: F811
    return FinetuneConfig.from_dict({
        "model": str(model_dir), "task": {"name": "conll2003-spans", "data": str(conll), "epochs": epochs},
        "optim": {"batch_size": 16, "lr": 3e-3, "warmup_ratio": 0.1},
        "run": {"output_dir": str(out), "log_every": 5, "progress": False},
        "speed": {"threads": 1, "prefetch": 0}})


def test_span_typing_end_to_end(conll, model_dir, tmp_path):  # noqa: F811
    out = tmp_path / "run"
    result = finetune(_config(conll, model_dir, out))
    assert result.best["value"] > 90 and result.dev_metrics["accuracy"] == pytest.approx(result.best["value"])
    assert result.dev_metrics == evaluate_spans(out / "dev_predictions.tsv", conll / "eng.testa")
    # The saved model carries the classifier; predict_file writes what the run wrote.
    reloaded = load(out / "model")
    assert span_classifier(reloaded.model) is not None
    finetune_recipe.predict_file(out / "model", "conll2003-spans", conll / "eng.testa", tmp_path / "p.tsv")
    assert (tmp_path / "p.tsv").read_text() == (out / "dev_predictions.tsv").read_text()


def test_span_typing_through_the_recipe(conll, model_dir, tmp_path):  # noqa: F811
    result = finetune(_config(conll, model_dir, tmp_path / "run", epochs=1))
    assert span_classifier(load(tmp_path / "run" / "model").model) is not None and result.steps


def test_predictions_file_round_trip_and_errors(tmp_path, capsys):
    path = tmp_path / "dev.conll"
    write_conll(path, [[("paris", "I-LOC"), ("city", "I-LOC"), ("said", "O"), ("acme", "I-ORG")],
                       [("the", "O")], [("peter", "I-PER")]], docs_every=0)
    task = get_task("conll2003-spans")
    sentences = task.read(path)
    predictions = [["LOC", "PER"], [], ["PER"]]
    task.write(tmp_path / "p.tsv", predictions, sentences)
    assert (tmp_path / "p.tsv").read_text() == ("sentence_id\tstart\tend\tpredicted\tgold\n"
                                                "0\t0\t2\tLOC\tLOC\n0\t3\t4\tPER\tORG\n2\t0\t1\tPER\tPER\n")
    scores = task.scores(predictions, sentences)
    # LOC F1 1, ORG F1 0, PER F1 2/3: macro 5/9
    assert scores == pytest.approx({"accuracy": 200 / 3, "macro_f1": 500 / 9})
    assert task.evaluate(tmp_path / "p.tsv", path) == pytest.approx(scores)
    # `bertology evaluate` scores it the same, with or without the CoNLL file (the tsv holds the gold types).
    for gold in ([], ["--gold", str(path)]):
        assert main(["evaluate", "--task", "conll2003-spans", "--predictions", str(tmp_path / "p.tsv"), *gold]) == 0
        assert json.loads(capsys.readouterr().out) == pytest.approx(scores)
    bad = tmp_path / "bad.tsv"
    bad.write_text("sentence_id\tstart\tend\tpredicted\tgold\n0\t0\t2\tLOC\tLOC\n")
    with pytest.raises(DataError, match="bad.tsv: 2 gold spans of .* have no prediction"):
        evaluate_spans(bad, path)
    bad.write_text("sentence_id\tstart\tend\tpredicted\tgold\n0\t0\t3\tLOC\tLOC\n")
    with pytest.raises(DataError, match=r"bad.tsv: line 2: sentence 0 span \[0, 3\) LOC is not a gold span"):
        evaluate_spans(bad, path)
    bad.write_text("sentence_id\tstart\tend\tpredicted\tgold\n0\tx\t3\tLOC\tLOC\n")
    with pytest.raises(DataError, match="bad.tsv: line 2: start and end must be integers"):
        evaluate_spans(bad)
