"""The README's two commands stay true: CI runs exactly the README's test command."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]  # not `from conftest import`: several test folders have a conftest.py


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    command = ci.strip().splitlines()[-1]
    assert command.startswith("pip install -q torch==2.13.0")  # a CPU torch, pinned before anything can pull CUDA
    assert f". .venv/bin/activate && {command}" in readme
