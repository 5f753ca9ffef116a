"""benchmarks/objectives.py's `diagnostics` phase: the discriminators' held-out base rate and the embedding tables'
geometry (docs/OBJECTIVES.md, DeBERTa-v3's comparison), on formulas checked by brute force and on two tiny ELECTRA
runs, one with shared embeddings and one with GDES."""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "training"))
from pretrain_helpers import build, make_assets, tiny_config  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture
def objectives(monkeypatch):
    spec = importlib.util.spec_from_file_location("benchmark_objectives", ROOT / "benchmarks" / "objectives.py")
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_mean_pairwise_cosine_is_the_mean_over_distinct_pairs(objectives):
    table = torch.randn(37, 8, generator=torch.Generator().manual_seed(0)) + 0.5  # a shared direction
    units = torch.nn.functional.normalize(table.double(), dim=1)
    cosines = units @ units.T
    brute = float((cosines.sum() - cosines.diagonal().sum()) / (37 * 36))
    assert objectives.mean_pairwise_cosine(table) == pytest.approx(brute, abs=1e-12)
    assert brute > 0.1  # the shared direction shows
    same = torch.ones(5, 3) * torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0])[:, None]  # one direction, any lengths
    assert objectives.mean_pairwise_cosine(same) == pytest.approx(1.0, abs=1e-12)
    with pytest.raises(ValueError, match="1 row"):
        objectives.mean_pairwise_cosine(table[:1])


@pytest.mark.parametrize("p, recall, precision", [(0.144, 0.0, 0.0), (0.134, 0.021, 0.51), (0.2, 0.7, 0.9)])
def test_replaced_rate_inverts_the_logged_metrics(objectives, p, recall, precision):
    """From a confusion matrix with replaced share p: accuracy, precision and recall as the objective logs them
    give p back."""
    tokens = 1_000_000
    replaced = p * tokens
    true_positive = recall * replaced
    predicted = true_positive / precision if precision else 0.0
    correct = true_positive + (tokens - replaced - (predicted - true_positive))
    assert objectives.replaced_rate(correct / tokens, precision, recall) == pytest.approx(p, rel=1e-9)


def test_binary_entropy(objectives):
    assert objectives.binary_entropy(0.5) == pytest.approx(0.6931471805599453)
    assert objectives.binary_entropy(0.25) == pytest.approx(0.75 * math.log(4 / 3) + 0.25 * math.log(4))
    assert objectives.binary_entropy(0.0) == 0.0


def test_diagnostics_of_shared_and_gdes_runs(objectives, tmp_path, capsys, monkeypatch):
    """A GDES discriminator's table differs from its generator's (the residual E_delta, trained by RTD), a shared
    one's does not; both report the held-out discriminator against its base rate."""
    from bertology.recipes.pretrain import pretrain

    (tmp_path / "assets").mkdir()
    assets = make_assets(tmp_path / "assets")
    for sharing in ("shared", "gdes"):
        pretrain(build(tiny_config(
            assets, tmp_path / "runs" / sharing, model={"family": "electra"},
            data={"instances": {"kind": "full-sentences", "max_seq_length": 48}},
            objectives={"electra": {"generator_size": 0.5, "embedding_sharing": sharing}},
            optim={"total_steps": 4, "lr": 1e-2}, run={"checkpoint_every": 0, "eval_every": 4})))
    monkeypatch.setattr(objectives, "RUNS", tmp_path / "runs")
    monkeypatch.setattr(objectives, "EMBEDDING_ROWS", range(5, 60))
    objectives.diagnostics(argparse.Namespace(only=["shared", "gdes", "absent"]))
    rows = {row["model"]: row for row in map(json.loads, capsys.readouterr().out.splitlines())}
    assert set(rows) == {"shared", "gdes"}  # a row without a model is left out
    assert rows["shared"]["delta_ratio"] == pytest.approx(0.0, abs=1e-7)
    assert rows["shared"]["generator_cosine"] == pytest.approx(rows["shared"]["cosine"], abs=1e-6)
    assert rows["gdes"]["delta_ratio"] > 1e-4
    for row in rows.values():
        assert 0 < row["replaced"] < 1
        assert row["base_rate_loss"] == pytest.approx(objectives.binary_entropy(row["replaced"]))
        assert 0 < row["rtd_loss"] and -1 < row["cosine"] < 1


def test_cpu_seconds_per_step(objectives, tmp_path, monkeypatch):
    """`calibrate --cpu-time`: a run's median CPU seconds per step, measured in this process; too few steps to skip
    the warm-up are refused naming the option."""
    (tmp_path / "assets").mkdir()
    assets = make_assets(tmp_path / "assets")
    monkeypatch.setattr(objectives, "run_config", lambda name, steps, out: tiny_config(
        assets, out, optim={"total_steps": steps}, run={"checkpoint_every": 0, "eval_every": 0}))
    seconds = objectives.cpu_seconds_per_step("mlm", 9, tmp_path / "calibrate" / "mlm", ["run.eval_batches=1"])
    assert 0 < seconds < 5
    assert (tmp_path / "calibrate" / "mlm.yaml").is_file()
    with pytest.raises(SystemExit, match="--cpu-time: mlm ran 6 steps"):
        objectives.cpu_seconds_per_step("mlm", 6, tmp_path / "calibrate" / "mlm", [])
