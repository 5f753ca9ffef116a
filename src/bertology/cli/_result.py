"""A command's result on stdout: one JSON object on one line, so that scripts can read it (`bertology ... | jq`);
progress bars and logs go to stderr."""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any


def plain(value: Any) -> Any:
    """`value` as JSON has it: paths as strings, tuples as lists, NumPy and torch scalars as numbers, a number that
    is not finite as null (JSON has no NaN)."""
    if isinstance(value, Mapping):
        return {str(key): plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(item) for item in value]
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, (bool, str, int)) or value is None:
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    item = getattr(value, "item", None)  # a NumPy or torch scalar
    if callable(item):
        return plain(item())
    return str(value)


def print_result(result: Mapping[str, Any]) -> None:
    """Print `result` as one JSON object on one line of stdout."""
    print(json.dumps(plain(result), ensure_ascii=False), file=sys.stdout, flush=True)
