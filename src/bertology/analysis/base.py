"""What every analysis hands to the report: its numbers, its figures and the command that redoes it."""

from __future__ import annotations

import json
import math
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bertology.io import atomic_write


@dataclass
class Section:
    """One analysis's part of `report.html`.

    `numbers` is JSON-able (the same object the analysis writes as its JSON file); `figures` are PNG files the
    report inlines; `command` is the exact `bertology ...` command that redoes the analysis; `notes` are short
    sentences (what was skipped and why, what a number means); `headline` holds the few numbers that say what the
    analysis found (label -> value), shown beside its figure and in the report's opening table."""

    name: str
    title: str
    numbers: dict[str, Any]
    figures: list[Path] = field(default_factory=list)
    command: str = ""
    notes: list[str] = field(default_factory=list)
    headline: dict[str, Any] = field(default_factory=dict)


def _finite(value: Any) -> Any:
    """JSON has no NaN or infinity: write them as null rather than as invalid JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def shell_command(*words: object) -> str:
    """A command line a POSIX shell runs as these words: each quoted where needed (a folder with spaces, quotes or
    ``$(...)`` stays one argument and runs nothing)."""
    return " ".join(shlex.quote(str(word)) for word in words)


def write_numbers(path: str | Path, numbers: dict[str, Any]) -> Path:
    """Write an analysis's numbers as indented JSON, atomically."""
    path = Path(path)
    with atomic_write(path, "w", encoding="utf-8") as f:
        f.write(json.dumps(_finite(numbers), indent=2, ensure_ascii=False) + "\n")
    return path
