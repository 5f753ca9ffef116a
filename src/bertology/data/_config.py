"""Building the data dataclass configs from plain mappings (YAML, JSON): unknown keys are errors."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, TypeVar

from bertology.errors import ConfigError

T = TypeVar("T")


def config_from_dict(cls: type[T], data: Mapping[str, Any], where: str) -> T:
    """Build dataclass ``cls`` from ``data``; an unknown key raises ConfigError naming ``where`` and the key."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"{where}: expected a mapping, got {type(data).__name__}")
    known = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(data) - known)
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(map(repr, unknown))}; "
                          f"known keys: {', '.join(sorted(known))}")
    return cls(**data)


def check_type(where: str, key: str, value: Any, types: type | tuple[type, ...]) -> None:
    """Raise ConfigError unless ``value`` is an instance of ``types`` (bool is never accepted as a number)."""
    if isinstance(value, bool) and bool not in (types if isinstance(types, tuple) else (types,)):
        raise ConfigError(f"{where}.{key}: expected {_names(types)}, got bool {value!r}")
    if not isinstance(value, types):
        raise ConfigError(f"{where}.{key}: expected {_names(types)}, got {type(value).__name__} {value!r}")


def _names(types: type | tuple[type, ...]) -> str:
    types = types if isinstance(types, tuple) else (types,)
    return " or ".join(t.__name__ for t in types)
