"""Typed configuration from plain mappings (YAML, JSON): dataclasses whose unknown keys and wrong types are errors
that name the path (``optim.lerning_rate: unknown key; did you mean lr?``). Every config in bertology is built here."""

from __future__ import annotations

import dataclasses
import difflib
import re
import types
import typing
from collections.abc import Mapping, Sequence
from typing import Any, Literal, Union

from bertology.errors import ConfigError

# Common names people type for a key, mapped to ours; used only to suggest the right key in an error.
SYNONYMS = {
    "learning_rate": "lr",
    "max_steps": "total_steps",
    "num_steps": "total_steps",
    "steps": "total_steps",
    "gradient_accumulation_steps": "grad_accumulation",
    "accumulation_steps": "grad_accumulation",
    "max_grad_norm": "clip_norm",
    "adam_epsilon": "eps",
    "num_hidden_layers": "num_layers",
    "num_attention_heads": "num_heads",
    "hidden_dropout_prob": "hidden_dropout",
    "attention_probs_dropout_prob": "attention_dropout",
    "save_every": "checkpoint_every",
    "save_total_limit": "keep_last",
    "output": "output_dir",
    "num_threads": "threads",
    "mixed_precision": "bf16",
}
_FLOAT_TEXT = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$")


def suggest(key: str, known: Mapping[str, Any] | set[str] | Sequence[str]) -> str:
    known = set(known)
    pool = known | {s for s, target in SYNONYMS.items() if target in known}
    close = difflib.get_close_matches(key, sorted(pool), n=1, cutoff=0.6)
    if not close:
        return ""
    return f"; did you mean {SYNONYMS.get(close[0], close[0]) if close[0] not in known else close[0]}?"


def known_keys(fields: set[str]) -> str:
    return f" (known: {', '.join(sorted(fields))})"


def _type_name(tp: Any) -> str:
    if typing.get_origin(tp) is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if typing.get_origin(tp) in (Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(tp))
    if tp is type(None):
        return "null"
    if dataclasses.is_dataclass(tp):
        return "a mapping"
    origin = typing.get_origin(tp)
    if origin is not None:
        return {list: "a list", tuple: "a list", dict: "a mapping"}.get(origin, str(tp))
    return getattr(tp, "__name__", str(tp))


def _convert(tp: Any, value: Any, where: str) -> Any:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    wrong = ConfigError(f"{where}: expected {_type_name(tp)}, got {type(value).__name__} {value!r}")
    if tp is Any:
        return value
    if origin in (Union, types.UnionType):
        if value is None:
            if type(None) in args:
                return None
            raise wrong
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _convert(arg, value, where)
            except ConfigError:
                continue
        raise wrong
    if origin is Literal:
        if value in args and type(value) in {type(a) for a in args}:
            return value
        raise wrong
    if dataclasses.is_dataclass(tp):
        return from_mapping(tp, value, where)
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise wrong
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise wrong
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str) and _FLOAT_TEXT.match(value.strip()):  # YAML 1.1 reads "1e-4" as a string
            return float(value)
        raise wrong
    if tp is str:
        if isinstance(value, str):
            return value
        raise wrong
    if origin is list:
        if isinstance(value, str) and args[0] is str:
            return [value]
        if not isinstance(value, (list, tuple)):
            raise wrong
        return [_convert(args[0], v, f"{where}[{i}]") for i, v in enumerate(value)]
    if origin is tuple:
        if not isinstance(value, (list, tuple)) or len(value) != len(args):
            raise ConfigError(f"{where}: expected a list of {len(args)} values, got {value!r}")
        return tuple(_convert(a, v, f"{where}[{i}]") for i, (a, v) in enumerate(zip(args, value)))
    if origin is dict:
        if not isinstance(value, Mapping):
            raise wrong
        return {_convert(args[0], k, where): _convert(args[1], v if v is not None else {}, f"{where}.{k}")
                for k, v in value.items()}
    raise ConfigError(f"{where}: unsupported field type {tp}")


def from_mapping(cls: type, data: Any, where: str) -> Any:
    """Build dataclass ``cls`` from a mapping; unknown keys and wrong types raise ConfigError naming the path."""
    label = where or "config"
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise ConfigError(f"{label}: expected a mapping, got {type(data).__name__} {data!r}")
    hints = typing.get_type_hints(cls)
    fields = {f.name for f in dataclasses.fields(cls) if f.init}
    values = {}
    for key, value in data.items():
        path = f"{where}.{key}" if where else str(key)
        if key not in fields:
            kind = "section" if not where else "key"
            raise ConfigError(f"{path}: unknown {kind}{suggest(str(key), fields)}{known_keys(fields)}")
        values[key] = _convert(hints[key], value, path)
    try:
        return cls(**values)
    except ConfigError as error:
        message = str(error)
        # Errors raised inside a section's own checks name the section by class; name it by path instead.
        prefix = f"{cls.__name__}."
        if where and message.startswith(prefix):
            message = f"{where}.{message[len(prefix):]}"
        elif where and not message.startswith(where.split(".")[0]):
            message = f"{where}: {message}"
        raise ConfigError(message) from None
