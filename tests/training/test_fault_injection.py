"""Kill a real ``bertology pretrain`` process at many moments; ``--resume`` must then finish with the final weights
bitwise identical to an uninterrupted run's, a complete final model, the same training metrics rows, and no
leftovers of the killed writes.

Kill moments: SIGKILL from outside after a random (seeded) delay into training, and the fault points of
``bertology.faults`` (``BERTOLOGY_FAULT=<phase>:<target>``): every phase of every atomic write of the checkpoints
(``step-0000004``), the final ``model`` directory and the files in them. The default suite runs a representative
few; ``-m slow`` kills the run at every fault point the uninterrupted run passes (listed with
``BERTOLOGY_FAULT_LOG``) and at the points only a resumed run passes, and prints a table of the results.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import bertology
from bertology.training import read_metrics
from pretrain_helpers import tiny_config

TOTAL_STEPS = 8
SETTINGS = dict(
    model={"hidden_dropout": 0.1},  # dropout: the RNG states must be restored exactly too
    data={"instances": {"max_seq_length": 32}},
    optim={"total_steps": TOTAL_STEPS},
    run={"eval_every": 0, "checkpoint_every": 2, "keep_last": 2, "log_every": 1, "progress": False},
    speed={"threads": 1, "prefetch": 0},
)
VOLATILE = {"tokens_per_s"}  # timing: differs between any two runs
PROCESS_TIMEOUT = 300


def environment(fault: str | None = None, log: Path | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BERTOLOGY_FAULT")}
    if fault is not None:
        env["BERTOLOGY_FAULT"] = fault
    if log is not None:
        env["BERTOLOGY_FAULT_LOG"] = str(log)
    return env


def command(config: Path, out: Path, resume: bool) -> list[str]:
    return [sys.executable, "-m", "bertology.cli.main", "pretrain", "--config", str(config),
            "--set", f"run.output_dir={out}"] + (["--resume"] if resume else [])


def run(config: Path, out: Path, resume: bool, fault: str | None = None,
        log: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(command(config, out, resume), env=environment(fault, log), capture_output=True, text=True,
                          timeout=PROCESS_TIMEOUT)


@dataclass
class Reference:
    config: Path
    weights: dict[str, torch.Tensor]
    train_rows: list[dict]
    points: list[str]  # the fault points an uninterrupted run passes, in order (a name once per hit)
    step_s: float  # wall time of one training step (with its logging and checkpointing), from the metrics rows


@pytest.fixture(scope="module")
def reference(assets, tmp_path_factory) -> Reference:
    root = tmp_path_factory.mktemp("fault-reference")
    config = root / "config.json"
    config.write_text(json.dumps(tiny_config(assets, root / "unused", **SETTINGS)), encoding="utf-8")
    out, log = root / "run", root / "points.log"
    proc = subprocess.Popen(command(config, out, resume=False), env=environment(log=log),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    first = wait_for_steps(proc, out, 1)
    last = wait_for_steps(proc, out, TOTAL_STEPS)
    _, stderr = proc.communicate(timeout=PROCESS_TIMEOUT)
    assert proc.returncode == 0, stderr
    return Reference(config, load_file(out / "model" / "model.safetensors"), train_rows(out),
                     log.read_text(encoding="utf-8").split(), (last - first) / (TOTAL_STEPS - 1))


def logged_steps(out: Path) -> list[int]:
    path = out / "metrics.jsonl"
    return [r["step"] for r in read_metrics(path) if r["kind"] == "train"] if path.is_file() else []


def wait_for_steps(proc: subprocess.Popen, out: Path, steps: int) -> float:
    """Wait until ``steps`` training steps are logged (or the process ends); returns when."""
    while proc.poll() is None and len(logged_steps(out)) < steps:
        time.sleep(0.002)
    return time.monotonic()


def train_rows(out: Path) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in VOLATILE}
            for r in read_metrics(out / "metrics.jsonl") if r["kind"] == "train"]


def problems_after_resume(reference: Reference, out: Path) -> list[str]:
    """What is wrong with a finished (resumed) run in ``out``, compared with the uninterrupted run."""
    found = []
    model = out / "model"
    for name in ("config.json", "model.safetensors"):
        if not (model / name).is_file():
            found.append(f"final model incomplete: no model/{name}")
    if found:
        return found
    try:
        bertology.load(model)
    except Exception as error:  # noqa: BLE001 - reported
        found.append(f"bertology.load(model) failed: {error}")
    weights = load_file(model / "model.safetensors")
    if weights.keys() != reference.weights.keys():
        found.append("final weights: different tensor names")
    else:
        differing = [k for k in weights if not torch.equal(weights[k], reference.weights[k])]
        if differing:
            found.append(f"final weights differ from the uninterrupted run's in {len(differing)} tensors")
    rows = train_rows(out)
    if rows != reference.train_rows:
        steps = [r["step"] for r in rows]
        if steps != [r["step"] for r in reference.train_rows]:
            found.append(f"metrics.jsonl train rows at steps {steps}, expected 1..{TOTAL_STEPS} once each")
        else:
            found.append("metrics.jsonl train rows: values differ from the uninterrupted run's")
    leftovers = sorted(str(p.relative_to(out)) for p in out.rglob(".*"))
    if leftovers:
        found.append(f"leftovers of killed writes: {leftovers}")
    return found


@dataclass
class Outcome:
    moment: str
    killed: bool  # False: the process ended (rc 0) before the kill moment came
    problems: list[str]

    @property
    def passed(self) -> bool:
        return not self.problems


def resume_and_check(reference: Reference, out: Path, moment: str, killed: bool,
                     resume_fault: str | None = None) -> Outcome:
    """Resume the run in ``out`` (killed at ``moment``) and judge the result."""
    proc = run(reference.config, out, resume=True, fault=resume_fault)
    if proc.returncode != 0:
        return Outcome(moment, killed, [f"--resume exited {proc.returncode}: {proc.stderr.strip()[-500:]}"])
    return Outcome(moment, killed, problems_after_resume(reference, out))


def kill_at_point(reference: Reference, out: Path, point: str, resume_fault: str | None = None) -> Outcome:
    proc = run(reference.config, out, resume=False, fault=point)
    if proc.returncode not in (-signal.SIGKILL, 0):
        return Outcome(point, False, [f"the killed run failed (exit {proc.returncode}): {proc.stderr[-500:]}"])
    return resume_and_check(reference, out, point, proc.returncode != 0, resume_fault)


def kill_at_random(reference: Reference, out: Path, seed: int) -> Outcome:
    """SIGKILL at a random moment of training: a random time (up to a step's) after a random step is logged."""
    rng = random.Random(seed)
    after, delay = rng.randint(1, TOTAL_STEPS - 1), rng.uniform(0.0, reference.step_s)
    proc = subprocess.Popen(command(reference.config, out, resume=False), env=environment(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wait_for_steps(proc, out, after)
    time.sleep(delay)
    killed = proc.poll() is None
    if killed:
        proc.send_signal(signal.SIGKILL)
    _, stderr = proc.communicate(timeout=PROCESS_TIMEOUT)
    if not killed and proc.returncode != 0:
        return Outcome(f"random seed {seed}", False, [f"the run failed (exit {proc.returncode}): {stderr[-500:]}"])
    moment = (f"random seed {seed}: {delay * 1000:.0f} ms after step {after} was logged; "
              f"last logged step {max(logged_steps(out), default=0)}")
    return resume_and_check(reference, out, moment, killed)


def assert_outcome(outcome: Outcome, killed: bool = True) -> None:
    assert outcome.killed or not killed, f"the run ended before {outcome.moment}"
    assert outcome.passed, f"killed at {outcome.moment}: " + "; ".join(outcome.problems)


# ------------------------------------------------------------------------------------------ default suite
def test_the_fault_points_are_where_the_tests_aim(reference):
    for point in ("dir-synced:step-0000004/model.safetensors", "dir-before-rename:step-0000004",
                  "dir-renamed:step-0000006", "dir-created:model", "dir-synced:model/model.safetensors",
                  "write-written:model/tokenizer.json", "dir-done:model"):
        assert point in reference.points, point
    assert reference.points.count("dir-done:model") == 1


def test_killed_at_a_random_moment_during_training(reference, tmp_path):
    assert_outcome(kill_at_random(reference, tmp_path / "run", seed=1), killed=False)


def test_killed_between_steps(reference, tmp_path):
    # Step 3 updated the weights; its metrics row, and the next checkpoint (step 4), are not written yet.
    assert "step:3" in reference.points and "step-done:8" in reference.points
    assert_outcome(kill_at_point(reference, tmp_path / "run", "step:3"))


def test_killed_inside_a_checkpoint_write(reference, tmp_path):
    # The checkpoint of step 4 is complete and synced in its temporary directory, not yet renamed into place.
    last = [p for p in reference.points if p.startswith("dir-synced:step-0000004/")][-1]
    assert_outcome(kill_at_point(reference, tmp_path / "run", last))


def test_killed_inside_the_final_model_writes(reference, tmp_path):
    out = tmp_path / "run"
    # Killed while the final model is half written: the last checkpoint is complete, the model is not.
    assert_outcome(kill_at_point(reference, out, "dir-synced:model/model.safetensors"))
    # A resume from the last step rewrites the final model; kill it between moving the previous model directory
    # aside and renaming the new one in: the model directory is missing until the next write or read recovers it.
    proc = run(reference.config, out, resume=True, fault="dir-moved-aside:model")
    assert proc.returncode == -signal.SIGKILL, (
        f"a resume at the last step did not rewrite model/ (exit {proc.returncode}): {proc.stderr[-500:]}")
    assert not (out / "model").exists()
    assert_outcome(resume_and_check(reference, out, "dir-moved-aside:model (while resuming)", True))


# ------------------------------------------------------------------------------------------ exhaustive sweep
def unique_points(points: list[str]) -> list[str]:
    """Each point once, as ``name`` for its first hit and ``name@N`` for the N-th (names repeat only if a target
    is written more than once)."""
    seen: dict[str, int] = {}
    result = []
    for name in points:
        seen[name] = seen.get(name, 0) + 1
        result.append(name if seen[name] == 1 else f"{name}@{seen[name]}")
    return result


def print_table(title: str, outcomes: list[Outcome]) -> None:
    print(f"\n{title}: {sum(o.passed for o in outcomes)}/{len(outcomes)} passed")
    for outcome in outcomes:
        status = "pass" if outcome.passed else "FAIL"
        killed = "" if outcome.killed else " (not reached: the run ended first)"
        print(f"  {status}  {outcome.moment}{killed}" + ("" if outcome.passed else
                                                          "\n        " + "\n        ".join(outcome.problems)))


def by_interest(point: str) -> int:
    """Sweep order: every phase of one middle checkpoint and of the final model, then the whole-directory phases
    of the other checkpoints, then the per-file points of those (the same phases again, for other files)."""
    phase, _, target = point.partition(":")
    if target.split("/")[0].split("@")[0] in ("step-0000004", "model") or phase.startswith("write-") and "/" not in target:
        return 0
    return 1 if phase.startswith("dir-") and phase != "dir-synced" else 2


def report(outcome: Outcome) -> Outcome:
    """Print one result line as soon as it is known (run with -s to follow a long sweep)."""
    status = "pass" if outcome.passed else "FAIL"
    killed = "" if outcome.killed else " (not reached: the run ended first)"
    print(f"  {status}  {outcome.moment}{killed}" + ("" if outcome.passed else " -- " + "; ".join(outcome.problems)),
          flush=True)
    return outcome


@pytest.mark.slow
def test_killed_at_every_fault_point(reference, tmp_path):
    outcomes = []
    points = sorted(unique_points(reference.points), key=by_interest)
    print(f"\n{len(points)} fault points", flush=True)
    for index, point in enumerate(points):
        outcomes.append(report(kill_at_point(reference, tmp_path / f"run-{index}", point)))
    print_table("killed at every fault point of an uninterrupted run", outcomes)
    assert all(o.killed for o in outcomes)
    assert [o for o in outcomes if not o.passed] == []


@pytest.mark.slow
def test_killed_at_every_fault_point_of_a_resume(reference, tmp_path):
    """The points only a resumed run passes (the metrics truncation, rewriting the final model), after a first
    kill inside the checkpoint of step 4 and after one at the end of the final model's write."""
    outcomes = []
    for first in ("dir-done:step-0000004", "dir-done:model"):
        traced = tmp_path / f"traced-{first}"
        assert run(reference.config, traced, resume=False, fault=first).returncode == -signal.SIGKILL
        log = tmp_path / f"resume-points-{first}.log"
        assert run(reference.config, traced, resume=True, log=log).returncode == 0
        points = unique_points(log.read_text(encoding="utf-8").split()) if log.is_file() else []
        new = [p for p in points if p not in set(unique_points(reference.points))]
        for index, second in enumerate(new):
            out = tmp_path / f"run-{first}-{index}"
            assert run(reference.config, out, resume=False, fault=first).returncode == -signal.SIGKILL
            proc = run(reference.config, out, resume=True, fault=second)
            moment = f"{first}, then while resuming {second}"
            if proc.returncode not in (-signal.SIGKILL, 0):
                outcomes.append(report(Outcome(moment, False, [f"exit {proc.returncode}: {proc.stderr[-500:]}"])))
                continue
            outcomes.append(report(resume_and_check(reference, out, moment, proc.returncode != 0)))
    print_table("killed at every fault point only a resume passes", outcomes)
    assert [o for o in outcomes if not o.passed] == []


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(2, 8))
def test_killed_at_random_moments(reference, tmp_path, seed):
    outcome = kill_at_random(reference, tmp_path / "run", seed)
    print_table("random kill", [outcome])
    assert_outcome(outcome, killed=False)
