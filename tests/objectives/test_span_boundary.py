"""The span boundary objective: the head's formula against a hand computation, which tokens it predicts and where
it reads the last layer, gradients, saving and loading its head, exact resume of a SpanBERT run (span masking with
a masking-rate schedule, SBO head in the trainer state), and configs/spanbert-tiny.yaml end to end."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from bertology.data.span_masking import SpanBatch
from bertology.errors import CheckpointError, ConfigError, DataError
from bertology.model import TransformerConfig, EncoderModel
from bertology.objectives import MaskedLM, SpanBoundary, TrainingLoss, build_objectives
from bertology.objectives.base import Passes
from bertology.objectives.span import HEAD_FILE

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "training"))
from pretrain_helpers import build, make_assets, run_shipped_config_briefly, tiny_config  # noqa: E402

BROWN = ROOT.parent / "shared" / "data" / "brown-nltk"


def _model(sbo: SpanBoundary, embedding_size: int | None = None) -> EncoderModel:
    config = TransformerConfig(vocab_size=50, hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64,
                           max_position_embeddings=32, embedding_size=embedding_size, hidden_dropout=0.0,
                           attention_dropout=0.0)
    mlm = MaskedLM(activation="gelu")
    model = EncoderModel(config, mlm.heads())
    model.init_weights(torch.Generator().manual_seed(0))
    sbo.attach(model, torch.Generator().manual_seed(1))
    return model


def _batch() -> SpanBatch:
    """Two rows; row 0 has spans at columns 2-4 and 7, row 1 one span at 1-2."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 50, (2, 10), generator=g)
    ids[:, 0], ids[:, -1] = 1, 2
    positions = torch.tensor([[0, 2], [0, 3], [0, 4], [0, 7], [1, 1], [1, 2]])
    labels = ids[positions[:, 0], positions[:, 1]].clone()
    masked = ids.clone()
    masked[positions[:, 0], positions[:, 1]] = 3
    return SpanBatch(masked, torch.ones_like(ids), torch.zeros_like(ids), positions, labels, None, torch.arange(2),
                     torch.tensor([1, 1, 1, 6, 0, 0]), torch.tensor([5, 5, 5, 8, 3, 3]),
                     torch.tensor([0, 1, 2, 0, 0, 1]))


@pytest.mark.parametrize("embedding_size", [None, 16])
def test_sbo_is_the_papers_formula(embedding_size):
    sbo = SpanBoundary()
    model = _model(sbo, embedding_size)
    batch = _batch()
    passes = Passes(model, batch, None)
    out = sbo(passes, batch)
    hidden = model(batch.input_ids, batch.attention_mask, batch.token_type_ids).last_hidden_state
    head = sbo.head
    expected = []
    for (row, _), left, right, offset in zip(batch.masked_positions.tolist(), batch.span_left.tolist(),
                                             batch.span_right.tolist(), batch.span_offset.tolist()):
        x = torch.cat([hidden[row, left], hidden[row, right], head.position.weight[offset]])
        h = F.layer_norm(F.gelu(x @ head.dense1.weight.T + head.dense1.bias), (32,), head.norm1.weight,
                         head.norm1.bias, 1e-12)
        width = embedding_size or 32
        y = F.layer_norm(F.gelu(h @ head.dense2.weight.T + head.dense2.bias), (width,), head.norm2.weight,
                         head.norm2.bias, 1e-12)
        expected.append(y @ model.encoder.embeddings.word.weight.T + head.bias)
    logits = torch.stack(expected)
    loss = F.cross_entropy(logits, batch.mlm_labels, reduction="sum")
    torch.testing.assert_close(out.loss_sum, loss, rtol=1e-5, atol=1e-5)
    assert out.stats["sbo_units"].item() == 6
    assert out.stats["sbo_correct"].item() == int((logits.argmax(-1) == batch.mlm_labels).sum())
    summary = sbo.summarize({k: float(v) for k, v in out.stats.items()})
    assert summary["sbo_loss"] == pytest.approx(loss.item() / 6, rel=1e-5)


def test_only_the_first_max_positions_tokens_of_a_span_are_predicted():
    sbo = SpanBoundary(max_positions=2)
    _model(sbo)
    batch = _batch()
    assert sbo.units(batch).item() == 5  # offset 2 of the first span is left to MLM
    reads = sbo.reads(batch)
    assert sorted(map(tuple, reads.tolist())) == sorted([(0, 1), (0, 1), (0, 6), (1, 0), (1, 0),
                                                         (0, 5), (0, 5), (0, 8), (1, 3), (1, 3)])


def test_the_pruned_last_layer_gives_the_same_loss_and_gradients_reach_head_and_encoder():
    sbo = SpanBoundary()
    model = _model(sbo)
    batch = _batch()
    loss = TrainingLoss(model, [MaskedLM(activation="gelu"), sbo])
    units = loss.units(batch)
    pruned, _ = loss(batch, units)
    full_passes = Passes(model, batch, None)
    full = MaskedLM(activation="gelu")(full_passes, batch).loss_sum / 6 + sbo(full_passes, batch).loss_sum / 6
    torch.testing.assert_close(pruned, full, rtol=1e-5, atol=1e-6)
    pruned.backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in sbo.head.parameters())
    assert model.encoder.layers[0].query.weight.grad.abs().sum() > 0
    assert "objective_modules.sbo.head.dense1.weight" in loss.state_dict()


def test_save_and_load_the_head(tmp_path):
    sbo = SpanBoundary()
    _model(sbo)
    sbo.save(tmp_path)
    other = SpanBoundary()
    _model(other)
    other.head.bias.data.fill_(1.0)
    other.load(tmp_path)
    for key, value in sbo.head.state_dict().items():
        assert torch.equal(other.head.state_dict()[key], value), key
    wrong = SpanBoundary(max_positions=4)
    _model(wrong)
    with pytest.raises(CheckpointError, match="max_positions and the model's sizes must match"):
        wrong.load(tmp_path)
    with pytest.raises(CheckpointError, match="no span boundary head saved there"):
        other.load(tmp_path / "nothing")


def test_bad_use():
    with pytest.raises(ConfigError, match="objectives.sbo.max_positions: must be >= 1"):
        build_objectives({"span_boundary": {"max_positions": 0}})
    with pytest.raises(ConfigError, match="objectives.span_boundary.weight: expected float"):
        build_objectives({"span_boundary": {"weight": "high"}})
    with pytest.raises(ConfigError, match="its head is not built"):
        SpanBoundary()(Passes(None, _batch(), None), _batch())  # type: ignore[arg-type]
    sbo = SpanBoundary()
    _model(sbo)
    batch = _batch()
    plain = SpanBatch(batch.input_ids, batch.attention_mask, batch.token_type_ids, batch.masked_positions,
                      batch.mlm_labels)
    with pytest.raises(DataError, match="needs span-masked batches.*data.masking.spans"):
        sbo.units(plain)


class _Crash(Exception):
    pass


def _crash_at(step: int):
    def hook(trainer, report):
        if report.step == step:
            raise _Crash()
    return hook


def test_a_resumed_spanbert_run_is_bitwise_identical(tmp_path):
    """Span masking with a linear rate schedule and the SBO head: a run stopped after its step-4 checkpoint and
    resumed ends with the same model and head as an uninterrupted one."""
    from bertology.recipes.pretrain import pretrain

    (tmp_path / "assets").mkdir()
    assets = make_assets(tmp_path / "assets")
    settings = dict(
        data={"instances": {"kind": "doc-sentences"},
              "masking": {"spans": {"max_words": 10}, "schedule": "linear", "start_probability": 0.4,
                          "mlm_probability": 0.15, "dynamic": True}},
        optim={"total_steps": 6, "grad_accumulation": 2},
        run={"checkpoint_every": 2, "eval_every": 0},
        model={"hidden_dropout": 0.1},
    )
    reference = pretrain(build(tiny_config(assets, tmp_path / "reference", **settings)))
    assert "sbo_loss" in reference.metrics
    stopped = build(tiny_config(assets, tmp_path / "stopped", **settings))
    with pytest.raises(_Crash):
        pretrain(stopped, hooks=[_crash_at(5)])
    pretrain(build(tiny_config(assets, tmp_path / "stopped", **settings)), resume=True)
    for name in ("model.safetensors", HEAD_FILE):
        ours = load_file(tmp_path / "stopped" / "model" / name)
        theirs = load_file(tmp_path / "reference" / "model" / name)
        assert ours.keys() == theirs.keys()
        for key in ours:
            assert torch.equal(ours[key], theirs[key]), (name, key)
    # The final model is transformers' BertForMaskedLM layout, the head beside it.
    assert json.loads((tmp_path / "reference" / "model" / "config.json").read_text())["architectures"] == [
        "BertForMaskedLM"]
    # Continuing from the final model (model.init_from) starts from its saved head.
    from bertology.recipes.pretrain import build_model
    from bertology.tokenization import load_tokenizer

    settings["model"] = {"init_from": str(tmp_path / "reference" / "model")}
    continued = build(tiny_config(assets, tmp_path / "continued", **settings))
    objectives = continued.build_objectives()
    build_model(continued, load_tokenizer(assets["tokenizer"]), objectives)
    saved = load_file(tmp_path / "reference" / "model" / HEAD_FILE)
    head = objectives[-1].head.state_dict()
    assert all(torch.equal(head[key], saved[key]) for key in saved)


def test_shipped_config_runs_on_brown(tmp_path):
    if not BROWN.is_dir():
        pytest.skip(f"the Brown corpus is not at {BROWN} (see ../shared/data/README.md)")
    corpus = [BROWN / f"ca0{i}" for i in range(1, 5)]
    assert run_shipped_config_briefly(ROOT / "configs" / "spanbert-tiny.yaml", tmp_path / "run", corpus, heldout=1) == 0
    model_dir = tmp_path / "run" / "model"
    assert (model_dir / HEAD_FILE).is_file()
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["kind"] == "eval" and rows[-1]["sbo_loss"] > 0 and rows[-1]["mlm_loss"] > 0


def test_the_boundary_head_is_a_registered_kind_with_checked_inputs():
    from bertology.errors import ConfigError, InputError
    from bertology.model.heads import HEAD_KINDS, HeadInputs, HeadSpec, build_head

    assert {"span_boundary", "span", "span_attention"} <= set(HEAD_KINDS)
    config = TransformerConfig(vocab_size=50, hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64)
    with pytest.raises(ConfigError, match="head 'sbo': kind 'span_boundary' needs max_positions >= 1, got 0"):
        build_head(config, HeadSpec("sbo", "span_boundary"))
    head = build_head(config, HeadSpec("sbo", "span_boundary", max_positions=4))
    hidden = torch.randn(1, 5, 32)
    with pytest.raises(InputError, match="HeadInputs.span_boundaries"):
        head(HeadInputs(hidden=hidden, attention_mask=torch.ones(1, 5), word_embeddings=torch.randn(50, 32)))
    at = torch.tensor([[0, 0, 4, 1], [0, 1, 3, 0]])
    logits = head(HeadInputs(hidden=hidden, attention_mask=torch.ones(1, 5), word_embeddings=torch.randn(50, 32),
                             span_boundaries=at))
    assert logits.shape == (2, 50)
