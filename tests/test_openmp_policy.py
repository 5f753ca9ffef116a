"""`import bertology` gives Python users the command line's passive OpenMP waiting: set before torch loads OpenMP,
kept when the user chose a value, and a plain warning when torch was imported first (too late to apply)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SRC = str(Path(__file__).resolve().parents[1] / "src")


def run(code: str, **env: str) -> subprocess.CompletedProcess:
    environment = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    environment.update(env, PYTHONPATH=SRC, PYTHONWARNINGS="default")
    return subprocess.run([sys.executable, "-c", code], env=environment, capture_output=True, text=True, timeout=120,
                          check=True)


def test_import_sets_passive_before_torch_loads():
    done = run("import os, sys, bertology; print(os.environ['OMP_WAIT_POLICY'], 'torch' in sys.modules)")
    assert done.stdout.split() == ["PASSIVE", "False"]  # set, and torch not loaded by the import itself
    assert "OMP_WAIT_POLICY" not in done.stderr


def test_a_value_the_user_set_is_kept_without_a_warning():
    done = run("import os, bertology; print(os.environ['OMP_WAIT_POLICY'])", OMP_WAIT_POLICY="ACTIVE")
    assert done.stdout.strip() == "ACTIVE" and "Warning" not in done.stderr


def test_torch_imported_first_gets_one_plain_warning():
    done = run("import os, torch, bertology, bertology.model; print(os.environ.get('OMP_WAIT_POLICY'))")
    assert done.stdout.strip() == "None"  # not set: it would not take effect here, and would mislead child processes
    assert done.stderr.count("RuntimeWarning") == 1 and "could not be applied" in done.stderr
    assert "torch was imported before bertology" in done.stderr and "OMP_WAIT_POLICY" in done.stderr
