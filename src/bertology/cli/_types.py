"""Argument types shared by the commands: a value out of range is argparse's one-line error naming the option
(`argument --seed: ...`), before any work."""

from __future__ import annotations

import argparse

# torch.manual_seed and numpy's generators take 64 bits, and a run adds small offsets (ranks, epochs) to its seed.
SEED_LIMIT = 2**63


def seed(value: str) -> int:
    """A seed in [0, 2**63)."""
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer seed, got {value!r}") from None
    if not 0 <= number < SEED_LIMIT:
        raise argparse.ArgumentTypeError(f"a seed must lie in [0, 2**63), got {value}")
    return number


def positive(value: str) -> int:
    """An integer of at least 1."""
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value!r}") from None
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return number
