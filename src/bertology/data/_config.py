"""Type checks for the data configs when they are built in Python (mappings go through bertology.config)."""

from __future__ import annotations

from typing import Any

from bertology.errors import ConfigError

def check_type(where: str, key: str, value: Any, types: type | tuple[type, ...]) -> None:
    """Raise ConfigError unless ``value`` is an instance of ``types`` (bool is never accepted as a number)."""
    if isinstance(value, bool) and bool not in (types if isinstance(types, tuple) else (types,)):
        raise ConfigError(f"{where}.{key}: expected {_names(types)}, got bool {value!r}")
    if not isinstance(value, types):
        raise ConfigError(f"{where}.{key}: expected {_names(types)}, got {type(value).__name__} {value!r}")


def _names(types: type | tuple[type, ...]) -> str:
    types = types if isinstance(types, tuple) else (types,)
    return " or ".join(t.__name__ for t in types)
