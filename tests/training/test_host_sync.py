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


def _function(frame):
    while frame.f_code.co_name.startswith("<") and frame.f_back is not None:  # a comprehension: its function
        frame = frame.f_back
    return frame


def _where(frame) -> str | None:
    frame = _function(frame)
    path = Path(frame.f_code.co_filename).resolve()
    if path == SRC / "training" / "trainer.py":
        return f"trainer.{frame.f_code.co_name}"
    if path.parent == SRC / "objectives":
        return f"objectives/{path.name}:{frame.f_code.co_name}"
    return None


def _in_step(frame) -> bool:
    """Called by the per-step code of the trainer, or below its step (objectives, the loss module)."""
    where = _where(frame)
    if where is not None and where.startswith("trainer.") and where.split(".")[1] in STEP_FUNCTIONS:
        return True
    while frame is not None:  # the nearest trainer function (not a comprehension) below which the call happens
        name = frame.f_code.co_name
        if not name.startswith("<") and Path(frame.f_code.co_filename).resolve() == SRC / "training" / "trainer.py":
            return name in ("_step", "_guard")
        frame = frame.f_back
    return False


@pytest.fixture
def host_reads(monkeypatch):
    """Counter of (caller, method, inside a step) for every host read of a tensor made from the trainer's or the
    objectives' code."""
    counts: Counter = Counter()
    for name in READS:
        original = getattr(torch.Tensor, name)

        def wrapped(self, *args, __original=original, __name=name, **kwargs):
            caller = sys._getframe(1)
            where = _where(caller)
            if where is not None:
                counts[where, __name, _in_step(caller)] += 1
            return __original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, wrapped)
    return counts


SPANS = {"masking": {"spans": {"geometric_p": 0.2, "max_words": 4}}, "instances": {"kind": "full-sentences"}}


ELECTRA = {"model": {"family": "electra"}, "data": {"instances": {"kind": "full-sentences"}},
           "objectives": {"electra": {"generator_size": 0.5}}}


@pytest.mark.parametrize("sections, accumulation", [
    ({}, 1),  # MLM + NSP
    ({}, 2),  # ... over two micro-batches
    ({"data": {"instances": {"kind": "sop"}}}, 1),  # MLM + SOP
    ({"data": SPANS}, 1),  # SpanBERT: MLM + the span boundary objective
    (ELECTRA, 1),  # the generator's keyed sampling included
])
def test_no_host_reads_inside_training_steps(assets, tmp_path, host_reads, sections, accumulation):
    # Nothing is logged, evaluated or saved before the last of 5 steps: every read before it would be a sync.
    raw = tiny_config(assets, tmp_path / "run", optim={"total_steps": 5, "grad_accumulation": accumulation},
                      run={"log_every": 0, "eval_every": 0, "checkpoint_every": 0}, **sections)
    pretrain(build(raw))
    assert {key: n for key, n in host_reads.items() if key[2]} == {}
    # The counter does see the trainer: the reads of the one check at the end (the "not finite" flag, the tokens).
    assert host_reads["trainer._raise_if_bad", "__bool__", False] == 1
    assert host_reads["trainer._settle", "__int__", False] == 1


def test_logging_reads_once_per_logged_step(assets, tmp_path, host_reads):
    raw = tiny_config(assets, tmp_path / "run", optim={"total_steps": 4},
                      run={"log_every": 2, "eval_every": 0, "checkpoint_every": 0})
    pretrain(build(raw))
    assert host_reads["trainer._raise_if_bad", "__bool__", False] == 2  # steps 2 and 4
    # The gradient norm and the window's tokens of each logged step: read by the loop, once per log.
    assert host_reads["trainer.train", "__float__", True] == 2
    assert host_reads["trainer.train", "__int__", True] == 2


@pytest.mark.parametrize("fused", [True, False])
def test_a_nan_between_checks_skips_every_update_until_the_check(assets, tmp_path, monkeypatch, fused):
    """A loss that turns NaN at step 2 of 5, with nothing logged or saved before the end: with the fused AdamW the
    update of step 2 and of every later step is skipped on the device and the check at the end stops the run naming
    step 2; without it the run stops at step 2 itself. Either way the weights stay those after step 1."""
    from bertology.errors import TrainingError
    from bertology.objectives.mlm import MaskedLM

    original = MaskedLM.__call__
    calls = {"n": 0}

    def poisoned(self, passes, batch):
        out = original(self, passes, batch)
        calls["n"] += 1
        if calls["n"] == 2:
            out.loss_sum = out.loss_sum * float("nan")
        return out

    monkeypatch.setattr(MaskedLM, "__call__", poisoned)
    seen: list[tuple[int, dict[str, torch.Tensor]]] = []

    def record(trainer, report):
        seen.append((report.step, {n: p.detach().clone() for n, p in trainer.model.named_parameters()}))

    raw = tiny_config(assets, tmp_path / "run", optim={"total_steps": 5},
                      run={"log_every": 0, "eval_every": 0, "checkpoint_every": 0},
                      speed={"fused_optimizer": fused})
    expected = (r"step 2: the (loss|gradient) \(.*nan\) is not finite; the step was not applied "
                + (r"\(nor were steps 3-5, run before this check\) " if fused else "") + "and the run stops")
    with pytest.raises(TrainingError, match=expected):
        pretrain(build(raw), hooks=[record])
    # Hooks run after a step's events: the check at step 5 stops the run before them.
    assert [step for step, _ in seen] == ([1, 2, 3, 4] if fused else [1])
    after_first = seen[0][1]
    for step, weights in seen[1:]:
        for name, value in weights.items():
            assert torch.equal(value, after_first[name]), (step, name)
    assert not (tmp_path / "run" / "model").exists()
