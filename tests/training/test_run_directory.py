"""A run directory is never silently reused or changed: fresh runs refuse an earlier run's outputs, resumed runs
refuse changed settings, a killed run's rows and a missing final model are repaired on resume, and a run whose
loss or gradient stops being finite stops with an error naming the step."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from bertology.cli.main import main
from bertology.errors import ConfigError, TrainingError
from bertology.recipes.pretrain import pretrain
from bertology.training import latest_checkpoint, read_metrics
from bertology.training.trainer import MAY_CHANGE_ON_RESUME, Schedule, check_same_run
from pretrain_helpers import build, tiny_config


def _weights(path):
    return load_file(path / "model.safetensors")


def test_a_fresh_run_refuses_a_used_directory_and_overwrite_replaces_it(assets, tmp_path):
    out = tmp_path / "run"
    pretrain(build(tiny_config(assets, out, optim={"total_steps": 2})))
    before = (out / "metrics.jsonl").read_text()
    with pytest.raises(TrainingError, match=r"already holds a run \(metrics.jsonl, checkpoints/, model/"):
        pretrain(build(tiny_config(assets, out, optim={"total_steps": 2})))
    assert (out / "metrics.jsonl").read_text() == before  # nothing touched
    pretrain(build(tiny_config(assets, out, optim={"total_steps": 4}, run={"checkpoint_every": 0})),
             overwrite=True)
    steps = [r["step"] for r in read_metrics(out / "metrics.jsonl") if r["kind"] == "train"]
    assert steps == [1, 2, 3, 4]  # the old rows are gone, not appended to
    assert [p.name for p in (out / "checkpoints").iterdir()] == ["step-0000004"]  # the old checkpoints too


def test_the_cli_refuses_a_used_directory_in_one_line(assets, tmp_path, capsys):
    out = tmp_path / "run"
    config = tmp_path / "run.json"
    config.write_text(json.dumps(tiny_config(assets, out, optim={"total_steps": 1})), encoding="utf-8")
    assert main(["pretrain", "--config", str(config)]) == 0
    capsys.readouterr()
    assert main(["pretrain", "--config", str(config)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--resume" in err and "--overwrite" in err
    assert main(["pretrain", "--config", str(config), "--overwrite"]) == 0


def test_an_output_dir_that_is_a_file_is_refused_before_any_work(assets, tmp_path, monkeypatch):
    path = tmp_path / "a-file"
    path.write_text("x")
    import bertology.recipes.pretrain as recipe

    def no_work(*args, **kwargs):
        raise AssertionError("the tokenizer was built before the output directory was checked")

    monkeypatch.setattr(recipe, "build_tokenizer", no_work)
    with pytest.raises(ConfigError, match="run.output_dir: .*a-file exists and is not a directory"):
        pretrain(build(tiny_config(assets, path)))


@pytest.mark.parametrize("changed", [
    {"optim": {"lr": 5e-4}},
    {"optim": {"batch_size": 2}},
    {"run": {"seed": 1}},
    {"model": {"hidden_dropout": 0.0}},
])
def test_resume_refuses_any_setting_that_changes_the_computation(assets, tmp_path, changed):
    out = tmp_path / "run"
    pretrain(build(tiny_config(assets, out, optim={"total_steps": 2})))
    section, values = next(iter(changed.items()))
    key = f"{section}.{next(iter(values))}"
    raw = tiny_config(assets, out, optim={"total_steps": 4})
    raw[section].update(values)
    with pytest.raises(ConfigError, match=f"cannot resume, these settings differ.*{key}"):
        pretrain(build(raw), resume=True)
    assert json.loads((latest_checkpoint(out) / "trainer_state.json").read_text())["step"] == 2


def test_resume_may_extend_the_run_and_change_watching_and_speed(assets, tmp_path):
    out = tmp_path / "run"
    pretrain(build(tiny_config(assets, out, optim={"total_steps": 2})))
    extended = tiny_config(assets, out, optim={"total_steps": 4}, run={"log_every": 2, "eval_every": 0},
                           speed={"prefetch": 1})
    result = pretrain(build(extended), resume=True)
    assert result.steps == 4
    assert [r["step"] for r in read_metrics(out / "metrics.jsonl") if r["kind"] == "train"] == [1, 2, 4]


def test_only_listed_settings_may_change():
    saved = {"optim": {"lr": 1e-3, "total_steps": 2}, "speed": {"threads": 1}, "run": {"log_every": 1, "seed": 0}}
    check_same_run("ckpt", saved, {"optim": {"lr": 1e-3, "total_steps": 9}, "speed": {"threads": 4},
                                   "run": {"log_every": 5, "seed": 0}})
    with pytest.raises(ConfigError, match=r"optim.lr: 0.001 -> 0.002; run.seed: 0 -> 3"):
        check_same_run("ckpt", saved, {"optim": {"lr": 2e-3, "total_steps": 2}, "speed": {"threads": 1},
                                       "run": {"log_every": 1, "seed": 3}})
    assert all(key.startswith(("speed.", "run.", "optim.total_steps")) for key in MAY_CHANGE_ON_RESUME)


def test_resume_at_the_last_step_rewrites_a_missing_final_model(assets, tmp_path):
    """A kill during the final model's write leaves the last checkpoint and no model/: --resume must write it."""
    out = tmp_path / "run"
    pretrain(build(tiny_config(assets, out, optim={"total_steps": 2})))
    reference = _weights(out / "model")
    import shutil

    shutil.rmtree(out / "model")
    result = pretrain(build(tiny_config(assets, out, optim={"total_steps": 2})), resume=True)
    assert result.steps == 2 and result.metrics  # the last logged metrics, read back
    restored = _weights(out / "model")
    assert restored.keys() == reference.keys()
    assert all(torch.equal(restored[k], reference[k]) for k in reference)


def test_resume_without_a_checkpoint_drops_the_killed_runs_rows(assets, tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    # What a run killed after logging step 1, before its first checkpoint, leaves behind.
    (out / "metrics.jsonl").write_text(json.dumps({"kind": "train", "step": 1, "loss": 123.0}) + "\n{\"kind\": \"tr")
    pretrain(build(tiny_config(assets, out, optim={"total_steps": 2})), resume=True)
    rows = read_metrics(out / "metrics.jsonl")
    assert [r["step"] for r in rows if r["kind"] == "train"] == [1, 2]
    assert all(r.get("loss") != 123.0 for r in rows)


def test_a_non_finite_loss_stops_the_run_naming_the_step(assets, tmp_path):
    out = tmp_path / "run"
    # A finite but absurd learning rate: the first update overflows the weights (or the next loss does).
    raw = tiny_config(assets, out, optim={"total_steps": 6, "lr": 1e38, "warmup_steps": 0, "clip_norm": None},
                      run={"checkpoint_every": 1})
    with pytest.raises(TrainingError, match=r"step 1: the weights are not finite after the update \(encoder\..*\); "
                                            r"the checkpoint was not written and the run stops. Last checkpoint: none"):
        pretrain(build(raw))
    assert not (out / "model").exists() and latest_checkpoint(out) is None  # nothing non-finite was written


def test_the_schedule_names_the_events_of_each_step():
    schedule = Schedule(total_steps=6, log_every=2, eval_every=3, checkpoint_every=4)
    assert [schedule.events(s) for s in range(1, 7)] == [
        (), ("log",), ("eval",), ("log", "checkpoint"), (), ("log", "eval", "checkpoint")]
    assert Schedule(total_steps=2, evaluate=False).events(2) == ("checkpoint",)


def test_a_nan_loss_stops_before_the_update(assets, tmp_path, monkeypatch):
    """A loss that is NaN (bad data, a bad objective) stops the run at that step; the weights stay as they were."""
    from bertology.objectives.mlm import MaskedLM

    original = MaskedLM.__call__
    calls = {"n": 0}

    def poisoned(self, passes, batch):
        out = original(self, passes, batch)
        calls["n"] += 1
        if calls["n"] == 3:
            out.loss_sum = out.loss_sum * float("nan")
        return out

    monkeypatch.setattr(MaskedLM, "__call__", poisoned)
    out = tmp_path / "run"
    raw = tiny_config(assets, out, optim={"total_steps": 6}, run={"checkpoint_every": 1, "eval_every": 0})
    with pytest.raises(TrainingError, match=r"step 3: the (loss|gradient) \(.*nan\) is not finite; the step "
                                            r"was not applied.*step-0000002"):
        pretrain(build(raw))
    assert json.loads((latest_checkpoint(out) / "trainer_state.json").read_text())["step"] == 2
    assert [r["step"] for r in read_metrics(out / "metrics.jsonl") if r["kind"] == "train"] == [1, 2]
