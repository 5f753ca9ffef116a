"""The trainer end to end on a tiny model: metrics, checkpoints loadable by transformers, keep-last-k, atomic
writes under failure, and exact resumption after SIGKILL."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from bertology.errors import CheckpointError
from bertology.recipes.pretrain import pretrain
from bertology.training import checkpoint as ckpt
from bertology.training import latest_checkpoint, list_checkpoints, read_metrics
from bertology.training.config import PretrainConfig
from bertology.training.optim import lr_lambda, parameter_groups
from pretrain_helpers import build, tiny_config

HERE = Path(__file__).resolve().parent


def test_run_writes_metrics_checkpoints_and_model(assets, tmp_path):
    out = tmp_path / "run"
    result = pretrain(build(tiny_config(assets, out, run={"plot": True})))
    assert result.steps == 6
    records = read_metrics(out / "metrics.jsonl")
    train = [r for r in records if r["kind"] == "train"]
    evals = [r for r in records if r["kind"] == "eval"]
    assert [r["step"] for r in train] == [1, 2, 3, 4, 5, 6]
    assert [r["step"] for r in evals] == [3, 6]
    for r in evals:
        assert {"mlm_loss", "perplexity", "mlm_accuracy", "nsp_accuracy"} <= set(r)
        assert r["perplexity"] == pytest.approx(torch.tensor(r["mlm_loss"]).exp().item(), rel=1e-6)
        assert 0.0 <= r["mlm_accuracy"] <= 1.0
    assert train[-1]["tokens_per_s"] > 0 and train[0]["lr"] > 0
    # Keep-last 2 of the checkpoints at steps 2, 4, 6.
    assert [step for step, _ in list_checkpoints(out)] == [4, 6]
    assert (out / "curves.png").stat().st_size > 1000
    state = json.loads((latest_checkpoint(out) / "trainer_state.json").read_text())
    assert state["step"] == 6 and state["config"]["optim"]["total_steps"] == 6
    assert result.metrics == {k: v for k, v in evals[-1].items() if k not in ("kind", "step", "epoch", "tokens")}


def test_eval_at_start_records_the_untrained_baseline(assets, tmp_path):
    out = tmp_path / "run"
    pretrain(build(tiny_config(assets, out, run={"eval_at_start": True})))
    evals = [r for r in read_metrics(out / "metrics.jsonl") if r["kind"] == "eval"]
    assert [r["step"] for r in evals] == [0, 3, 6]
    assert evals[0]["tokens"] == 0 and evals[0]["mlm_loss"] > evals[-1]["mlm_loss"]


def test_checkpoint_loads_in_transformers(assets, tmp_path):
    transformers = pytest.importorskip("transformers")
    out = tmp_path / "run"
    pretrain(build(tiny_config(assets, out, optim={"total_steps": 2})))
    path = latest_checkpoint(out)
    ours = load_file(path / "model.safetensors")
    for cls in (transformers.BertForPreTraining, transformers.BertForMaskedLM):
        model = cls.from_pretrained(path).eval()
        theirs = model.state_dict()
        assert torch.equal(theirs["bert.embeddings.word_embeddings.weight"],
                           ours["bert.embeddings.word_embeddings.weight"])
    tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    assert tokenizer.mask_token == "[MASK]"
    # The final model directory is the same kind of checkpoint.
    model = transformers.BertForPreTraining.from_pretrained(out / "model")
    assert model.config.vocab_size == tokenizer.vocab_size


def test_weight_decay_groups_and_schedule():
    from bertology.model import EncoderModel, HeadSpec, preset

    model = EncoderModel(preset("tiny", vocab_size=50, num_layers=1), [HeadSpec("mlm", "masked_lm")])
    decay, no_decay = parameter_groups(model, 0.01)
    names = {id(p): n for n, p in model.named_parameters()}
    assert all(names[id(p)].endswith("weight") and p.ndim == 2 for p in decay["params"])
    assert any("norm" in names[id(p)] for p in no_decay["params"])
    assert all(p.ndim == 1 for p in no_decay["params"]) and no_decay["weight_decay"] == 0.0
    config = PretrainConfig.from_dict({"optim": {"total_steps": 10, "warmup_steps": 4}})
    f = lr_lambda(config.optim)
    assert [round(f(s), 4) for s in range(4)] == [0.2, 0.4, 0.6, 0.8]
    assert f(4) == 1.0 and f(7) == pytest.approx(0.5) and f(10) == 0.0
    cosine = lr_lambda(PretrainConfig.from_dict({"optim": {"total_steps": 10, "warmup_steps": 0,
                                                           "schedule": "cosine"}}).optim)
    assert cosine(0) == 1.0 and cosine(5) == pytest.approx(0.5) and cosine(10) == pytest.approx(0.0)


def test_gradient_accumulation_matches_one_large_batch(assets, tmp_path):
    """Effective batch 8 as one micro-batch of 8 or as 2 x 4: the same updates (dropout off)."""
    no_dropout = {"hidden_dropout": 0.0, "attention_dropout": 0.0}
    a = tiny_config(assets, tmp_path / "a", model=no_dropout, optim={"batch_size": 8, "total_steps": 3},
                    run={"eval_every": 0, "checkpoint_every": 0})
    b = tiny_config(assets, tmp_path / "b", model=no_dropout,
                    optim={"batch_size": 4, "grad_accumulation": 2, "total_steps": 3},
                    run={"eval_every": 0, "checkpoint_every": 0})
    pretrain(build(a))
    pretrain(build(b))
    wa = load_file(tmp_path / "a" / "model" / "model.safetensors")
    wb = load_file(tmp_path / "b" / "model" / "model.safetensors")
    for key in wa:
        torch.testing.assert_close(wa[key], wb[key], rtol=1e-4, atol=1e-5)


def test_failed_checkpoint_write_leaves_previous_intact(assets, tmp_path, monkeypatch):
    out = tmp_path / "run"
    config = tiny_config(assets, out, optim={"total_steps": 4}, run={"eval_every": 0})
    calls = {"n": 0}
    real = ckpt.write_trainer_state

    def failing(directory, state, trainer_state):
        calls["n"] += 1
        if state.step == 4:  # the model and tokenizer files are already in the temporary directory
            real(directory, state, trainer_state)
            raise OSError("disk full (simulated)")
        real(directory, state, trainer_state)

    monkeypatch.setattr(ckpt, "write_trainer_state", failing)
    with pytest.raises(OSError, match="simulated"):
        pretrain(build(config))
    assert [step for step, _ in list_checkpoints(out)] == [2]
    leftovers = [p.name for p in (out / "checkpoints").iterdir()]
    assert leftovers == ["step-0000002"], leftovers
    monkeypatch.setattr(ckpt, "write_trainer_state", real)
    result = pretrain(build(config), resume=True)
    assert result.steps == 4 and [s for s, _ in list_checkpoints(out)] == [2, 4]


KILLED_RUN = textwrap.dedent("""
    import json, os, signal, sys
    sys.path.insert(0, {helpers!r})
    from bertology.recipes.pretrain import pretrain
    from bertology.training import checkpoint as ckpt
    from pretrain_helpers import build
    config = build(json.loads(open({config!r}).read()))
    mode = sys.argv[1]
    if mode == "mid-write":  # die inside the checkpoint write of step 4, after the model files are written
        real = ckpt.write_trainer_state
        def dying(directory, state, trainer_state):
            if state.step == 4:
                os.kill(os.getpid(), signal.SIGKILL)
            real(directory, state, trainer_state)
        ckpt.write_trainer_state = dying
    def hook(trainer, report):
        if mode == "after-step" and report.step == 5:
            os.kill(os.getpid(), signal.SIGKILL)
    pretrain(config, hooks=[hook])
""")


@pytest.mark.parametrize("mode,expected", [("after-step", [2, 4]), ("mid-write", [2])])
def test_sigkill_then_resume_is_bitwise_identical(assets, tmp_path, mode, expected):
    settings = dict(optim={"total_steps": 7}, run={"eval_every": 0, "checkpoint_every": 2, "keep_last": 3},
                    model={"hidden_dropout": 0.1})
    reference = tiny_config(assets, tmp_path / "reference", **settings)
    pretrain(build(reference))

    killed = tiny_config(assets, tmp_path / "killed", **settings)
    config_path = tmp_path / "killed.json"
    config_path.write_text(json.dumps(killed))
    script = KILLED_RUN.format(helpers=str(HERE), config=str(config_path))
    proc = subprocess.run([sys.executable, "-c", script, mode], capture_output=True, text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    out = tmp_path / "killed"
    assert [s for s, _ in list_checkpoints(out)] == expected
    assert not (out / "model").exists()
    # Resume through the command line, as a user would.
    cli = subprocess.run([sys.executable, "-m", "bertology.cli.main", "pretrain", "--config", str(config_path),
                          "--resume"], capture_output=True, text=True, timeout=120)
    assert cli.returncode == 0, cli.stderr
    ours = load_file(out / "model" / "model.safetensors")
    theirs = load_file(tmp_path / "reference" / "model" / "model.safetensors")
    assert ours.keys() == theirs.keys()
    for key in ours:
        assert torch.equal(ours[key], theirs[key]), key
    # The metrics file holds each step once, as the uninterrupted run's does.
    steps = [r["step"] for r in read_metrics(out / "metrics.jsonl") if r["kind"] == "train"]
    assert steps == list(range(1, 8))
    assert not list((out / "checkpoints").glob(".step-*"))  # the half-written directory was cleaned up


def test_resume_refuses_a_different_run(assets, tmp_path):
    out = tmp_path / "run"
    pretrain(build(tiny_config(assets, out, optim={"total_steps": 2})))
    changed = tiny_config(assets, out, optim={"total_steps": 4}, data={"masking": {"mlm_probability": 0.3}})
    with pytest.raises(Exception, match="data.masking"):
        pretrain(build(changed), resume=True)


def test_read_checkpoint_rejects_a_model_directory(assets, tmp_path):
    out = tmp_path / "run"
    pretrain(build(tiny_config(assets, out, optim={"total_steps": 2})))
    from bertology.model import load_model

    model = load_model(out / "model")
    with pytest.raises(CheckpointError, match="not a training checkpoint"):
        ckpt.read_checkpoint(out / "model", model)


def test_layer_wise_learning_rate_decay_groups():
    from bertology.model import EncoderModel, preset
    from bertology.model.encoder import HeadSpec
    from bertology.training.config import OptimConfig
    from bertology.training.optim import build_optimizer

    model = EncoderModel(preset("tiny", vocab_size=30, num_layers=3, hidden_size=16, num_heads=2,
                                intermediate_size=32), [HeadSpec("classifier", "pooled")])
    plain = build_optimizer(model, OptimConfig(lr=1e-3), fused=False)
    assert [g["lr"] for g in plain.param_groups] == [1e-3, 1e-3]
    decayed = build_optimizer(model, OptimConfig(lr=1e-3, layer_decay=0.5), fused=False)
    lr_of = {id(p): g["lr"] for g in decayed.param_groups for p in g["params"]}
    params = dict(model.named_parameters())
    assert lr_of[id(params["heads.classifier.out.weight"])] == pytest.approx(1e-3)
    assert lr_of[id(params["encoder.pooler.weight"])] == pytest.approx(1e-3)
    assert lr_of[id(params["encoder.layers.2.ffn_in.weight"])] == pytest.approx(5e-4)
    assert lr_of[id(params["encoder.layers.0.query.weight"])] == pytest.approx(1.25e-4)
    assert lr_of[id(params["encoder.embeddings.word.weight"])] == pytest.approx(6.25e-5)
    assert len(lr_of) == len(params)  # every parameter once
    decay_of = {id(p): g["weight_decay"] for g in decayed.param_groups for p in g["params"]}
    assert decay_of[id(params["encoder.layers.1.attn_norm.weight"])] == 0.0
    assert decay_of[id(params["encoder.layers.1.query.weight"])] == 0.01
    with pytest.raises(Exception, match="optim.layer_decay: must be in \\(0, 1\\]"):
        OptimConfig(layer_decay=0.0)


def test_the_token_table_learns_at_its_own_rate():
    """optim.embedding_lr_scale: the model's token table (tied to a T5's head) in a group of its own at lr x scale,
    with layer decay on top; every other parameter at its rate; 1 leaves the groups as they were."""
    from bertology.model import EncoderModel, preset
    from bertology.model.encoder import HeadSpec
    from bertology.training.config import OptimConfig
    from bertology.training.optim import build_optimizer

    model = EncoderModel(preset("tiny", vocab_size=30, num_layers=3, hidden_size=16, num_heads=2,
                                intermediate_size=32), [HeadSpec("classifier", "pooled")])
    table = model.word_embeddings.weight
    scaled = build_optimizer(model, OptimConfig(lr=1e-3, embedding_lr_scale=8.0), fused=False, table=table)
    lr_of = {id(p): g["lr"] for g in scaled.param_groups for p in g["params"]}
    params = dict(model.named_parameters())
    assert lr_of[id(table)] == pytest.approx(8e-3)
    assert [g["params"] for g in scaled.param_groups if g["lr"] != 1e-3] == [[table]]
    assert lr_of[id(params["encoder.embeddings.position.weight"])] == pytest.approx(1e-3)
    assert len(lr_of) == len(params)
    both = build_optimizer(model, OptimConfig(lr=1e-3, layer_decay=0.5, embedding_lr_scale=8.0), fused=False,
                           table=table)
    lr_of = {id(p): g["lr"] for g in both.param_groups for p in g["params"]}
    assert lr_of[id(table)] == pytest.approx(8 * 6.25e-5) and lr_of[id(params["encoder.embeddings.position.weight"])] \
        == pytest.approx(6.25e-5)
    plain = build_optimizer(model, OptimConfig(lr=1e-3), fused=False, table=table)
    assert [len(g["params"]) for g in plain.param_groups] == [
        len(g["params"]) for g in build_optimizer(model, OptimConfig(lr=1e-3), fused=False).param_groups]
    with pytest.raises(Exception, match="optim.embedding_lr_scale: must be > 0"):
        OptimConfig(embedding_lr_scale=0.0)
    with pytest.raises(Exception, match="optim.embedding_lr_scale: this model has no token table"):
        build_optimizer(model, OptimConfig(embedding_lr_scale=2.0), fused=False)


def test_train_only_freezes_every_other_parameter_bit_for_bit(assets, tmp_path):
    """optim.train_only: ["heads.mlm.*"] from a pretrained model trains its MLM head alone; the encoder (the head's
    tied decoder with it) and the NSP head stay bit-identical at every step, the head's tensors move."""
    from bertology.model.checkpoint import load_model

    pretrain(build(tiny_config(assets, tmp_path / "first", optim={"total_steps": 1})))
    start = {n: p.detach().clone() for n, p in load_model(tmp_path / "first" / "model").named_parameters()}
    moved: dict[str, bool] = {}

    def check(trainer, report):
        for name, parameter in trainer.model.named_parameters():
            if name.startswith("heads.mlm."):
                moved[name] = moved.get(name, False) or not torch.equal(parameter, start[name])
            else:
                assert torch.equal(parameter, start[name]), (report.step, name)
                assert not parameter.requires_grad

    raw = tiny_config(assets, tmp_path / "head", model={"init_from": str(tmp_path / "first" / "model")},
                      optim={"train_only": ["heads.mlm.*"], "total_steps": 4})
    assert pretrain(build(raw), hooks=[check]).steps == 4
    final = dict(load_model(tmp_path / "head" / "model").named_parameters())
    assert moved and all(moved.values()), moved
    assert all(torch.equal(p, start[n]) for n, p in final.items() if not n.startswith("heads.mlm."))
    assert all(not torch.equal(p, start[n]) for n, p in final.items() if n.startswith("heads.mlm."))


def test_train_only_errors_name_the_key(assets, tmp_path):
    from bertology.errors import ConfigError
    from bertology.training.config import OptimConfig

    raw = tiny_config(assets, tmp_path / "run", optim={"train_only": ["heads.mlm.*", "head.mlm.*"]})
    with pytest.raises(ConfigError, match=r"optim.train_only\[1\]: 'head.mlm.\*' matches no parameter of the model "
                                          r"\(its parameters are named encoder.embeddings.\*, encoder.layers.\*, .*heads.mlm.\*"):
        pretrain(build(raw))
    with pytest.raises(ConfigError, match="optim.train_only: give at least one parameter-name pattern"):
        OptimConfig(train_only=[])
    with pytest.raises(ConfigError, match="optim.trian_only: unknown key"):
        build(tiny_config(assets, tmp_path / "run", optim={"trian_only": ["heads.*"]}))
