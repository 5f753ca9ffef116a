"""No host synchronisation inside a training step: the trainer's loop and step and the objectives never read a
tensor's value on the host (``item``, ``tolist``, ``int()``, ``float()``, ``bool()``, ``cpu``, ``numpy``); counts and
the "not finite" verdict stay on the device and are read once per logged, evaluated or saved step.

Counted on the CPU by wrapping those methods and looking at the caller: a call from the trainer's per-step code
(``train``, ``_step``, ``_guard``) or from an objective is a sync a GPU would wait for."""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import pytest
import torch

from bertology.recipes.pretrain import pretrain
from pretrain_helpers import build, tiny_config

SRC = Path(__file__).resolve().parents[2] / "src" / "bertology"
STEP_FUNCTIONS = {"train", "_step", "_guard"}
READS = ("item", "tolist", "__int__", "__float__", "__bool__", "__index__", "cpu", "numpy")


def _where(frame) -> str | None:
    while frame.f_code.co_name.startswith("<") and frame.f_back is not None:  # a comprehension: its function
        frame = frame.f_back
    path = Path(frame.f_code.co_filename).resolve()
    if path == SRC / "training" / "trainer.py":
        return f"trainer.{frame.f_code.co_name}"
    if path.parent == SRC / "objectives":
        return f"objectives/{path.name}:{frame.f_code.co_name}"
    return None


@pytest.fixture
def host_reads(monkeypatch):
    """Counter of (caller, method) for every host read of a tensor made from bertology's training code."""
    counts: Counter = Counter()
    for name in READS:
        original = getattr(torch.Tensor, name)

        def wrapped(self, *args, __original=original, __name=name, **kwargs):
            where = _where(sys._getframe(1))
            if where is not None:
                counts[where, __name] += 1
            return __original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, wrapped)
    return counts


@pytest.mark.parametrize("objectives, accumulation", [({"mlm": {}, "nsp": {}}, 1), ({"mlm": {}, "nsp": {}}, 2)])
def test_no_host_reads_inside_training_steps(assets, tmp_path, host_reads, objectives, accumulation):
    # Nothing is logged, evaluated or saved before the last of 5 steps: every read before it would be a sync.
    raw = tiny_config(assets, tmp_path / "run", objectives=objectives,
                      optim={"total_steps": 5, "grad_accumulation": accumulation},
                      run={"log_every": 0, "eval_every": 0, "checkpoint_every": 0})
    pretrain(build(raw))
    in_steps = {key: n for key, n in host_reads.items()
                if key[0].startswith("objectives/") or key[0].split(".")[1] in STEP_FUNCTIONS}
    assert in_steps == {}
    # The counter does see the trainer: the reads of the one check at the end (the "not finite" flag, the tokens).
    assert host_reads["trainer._raise_if_bad", "__bool__"] == 1
    assert host_reads["trainer._settle", "__int__"] == 1


def test_logging_reads_once_per_logged_step(assets, tmp_path, host_reads):
    raw = tiny_config(assets, tmp_path / "run", optim={"total_steps": 4},
                      run={"log_every": 2, "eval_every": 0, "checkpoint_every": 0})
    pretrain(build(raw))
    assert host_reads["trainer._raise_if_bad", "__bool__"] == 2  # steps 2 and 4
    assert host_reads["trainer.train", "__float__"] == 2  # the gradient norm of each logged step
    assert host_reads["trainer.train", "__int__"] == 2  # the window's tokens
