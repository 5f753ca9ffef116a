"""The fuzz suite's hypothesis profile (bounded and reproducible: derandomized, no example database, no deadline on a
busy machine) and, at the end of the run, the number of inputs each reader and loader was given (shown with -s)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fuzz_helpers import TRIED  # noqa: E402

# Reproducible and bounded: the same inputs every run, no files written beside the tests, no deadline on a busy
# machine. Each test sets its own max_examples so that the whole suite stays within about 30 seconds.
settings.register_profile("bertology-fuzz", derandomize=True, database=None, deadline=None, print_blob=False,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                                 HealthCheck.data_too_large])
settings.load_profile("bertology-fuzz")


@pytest.fixture(scope="session", autouse=True)
def report_counts():
    yield
    if TRIED:
        print("\nfuzz inputs tried: " + ", ".join(f"{name} {n}" for name, n in sorted(TRIED.items())))
