"""Typed configuration from plain mappings (YAML, JSON): dataclasses whose unknown keys and wrong types are errors
that name the path (``optim.lerning_rate: unknown key; did you mean lr?``). Every config in bertology is built here.

One set of rules for both ways a config is made: ``from_mapping`` converts a mapping (from a file or ``--set``)
and builds the dataclass, and the dataclass's ``__post_init__`` calls ``validate``, which checks the built
instance against the same type hints (so ``MaskingConfig(selection="bogus")`` fails as the YAML does). Types:
``Literal`` for closed choices, ``bool`` never passes for a number, a ``float`` is finite unless its field opts in
(``field(metadata=ALLOW_NONFINITE)``). Ranges and cross-field rules stay in each ``__post_init__``.

Field markers: ``derived(default, why)`` is a field set by code, not by config files (``InstanceConfig.seed`` is
``run.seed``); ``inline(Schema)`` collects, at the section's own level, the keys that are fields of ``Schema``,
each checked against ``Schema``'s types; ``open_inline()`` collects the section's other keys for a schema another
field chooses (``model: {architecture: encoder, preset: mini, hidden_size: 256}``: the registered architecture's
config class), checked by ``check_schema_values``.
``to_mapping`` is the inverse of ``from_mapping`` (derived fields left out, inline fields flattened).
``build_registered`` builds ``name -> options`` sections (objectives) against a registry of dataclasses.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import json
import math
import numbers
import re
import types
import typing
from collections.abc import Collection, Mapping, Sequence
from typing import Any, Literal, Union

import yaml

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

# Field metadata: a float field that accepts nan and +-inf (none does today).
ALLOW_NONFINITE = {"nonfinite": True}


def derived(default: Any, why: str) -> Any:
    """A dataclass field that code sets and config files do not (``why`` says where the value comes from)."""
    return dataclasses.field(default=default, metadata={"derived": why})


def inline(schema: type, exclude: Collection[str] = ()) -> Any:
    """A ``dict[str, Any]`` field holding values for ``schema``'s fields (less ``exclude``), written at the
    section's own level in a mapping; each is optional (None: not given) and checked against ``schema``'s types."""
    return dataclasses.field(default_factory=dict,
                             metadata={"inline": schema, "inline_exclude": frozenset(exclude)})


def open_inline() -> Any:
    """A ``dict[str, Any]`` field collecting, at the section's own level, every key that is no other field of the
    section: values for a schema that another field chooses (``model.architecture`` picks the model's config
    class). The section's ``__post_init__`` checks them with ``check_schema_values``."""
    return dataclasses.field(default_factory=dict, metadata={"inline_open": True})


def schema_fields(schema: type) -> dict[str, Any]:
    """Key -> type of the fields of config dataclass ``schema`` that a config file sets: its init fields that take
    part in comparisons (a ``compare=False`` field, such as the ``extra`` keys a model config keeps of a published
    config.json, is bookkeeping, not a setting)."""
    hints = _hints(schema)
    return {f.name: hints[f.name] for f in dataclasses.fields(schema) if f.init and f.compare}


def check_schema_values(schema: type, values: Mapping[str, Any], where: str, hint: Any = None) -> dict[str, Any]:
    """``values`` checked against ``schema_fields(schema)`` (as a config file's: 1e-4 passes for a float), None
    values dropped; an unknown key is a ConfigError naming ``where.<key>``, with ``hint(key)``'s text when given."""
    fields = schema_fields(schema)
    out = {}
    for key, value in values.items():
        path = f"{where}.{key}" if where else str(key)
        if key not in fields:
            extra = hint(str(key)) if hint is not None else ""
            tail = suggest(str(key), fields) if extra else f"{suggest(str(key), fields)}{known_keys(fields)}"
            raise ConfigError(f"{path}: unknown key{extra}{tail}")
        if value is not None:
            out[key] = _convert(fields[key], value, path, from_text=True)
    return out


def suggest(key: str, known: Mapping[str, Any] | set[str] | Sequence[str]) -> str:
    known = set(known)
    pool = known | {s for s, target in SYNONYMS.items() if target in known}
    close = difflib.get_close_matches(key, sorted(pool), n=1, cutoff=0.6)
    if not close:
        return ""
    return f"; did you mean {SYNONYMS.get(close[0], close[0]) if close[0] not in known else close[0]}?"


def known_keys(fields: Collection[str]) -> str:
    return f" (known: {', '.join(sorted(fields))})"


@functools.lru_cache(maxsize=None)
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _inline_fields(f: dataclasses.Field) -> dict[str, Any]:
    """Key -> type of an ``inline`` field's schema (each Optional: None means not given)."""
    schema = f.metadata["inline"]
    hints = _hints(schema)
    return {g.name: hints[g.name] for g in dataclasses.fields(schema)
            if g.init and g.name not in f.metadata["inline_exclude"]}


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


def _is_bool(value: Any) -> bool:
    return isinstance(value, bool) or type(value).__name__ == "bool_"  # numpy.bool_ too


def _convert(tp: Any, value: Any, where: str, *, from_text: bool = False, nonfinite: bool = False) -> Any:
    """``value`` checked against type ``tp`` (and normalised: int -> float, list -> tuple, mapping -> dataclass).

    ``from_text``: the value comes from a config file or ``--set``, where a mapping builds a nested dataclass, a
    string passes for a list of one string and YAML 1.1's ``1e-4`` (a string to it) for a float."""
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
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _convert(arg, value, where, from_text=from_text, nonfinite=nonfinite)
            except ConfigError as error:
                errors.append(error)
        # A value of the right kind that breaks a rule (a non-finite float) says so rather than listing the types.
        specific = [e for e in errors if "expected" not in str(e)]
        raise specific[0] if specific else wrong
    if origin is Literal:
        if value in args and type(value) in {type(a) for a in args}:
            return value
        raise wrong
    if dataclasses.is_dataclass(tp):
        if isinstance(value, tp):
            return value  # validated when it was built
        if from_text:
            return from_mapping(tp, value, where)
        raise ConfigError(f"{where}: expected {tp.__name__} (a mapping in a config file), "
                          f"got {type(value).__name__} {value!r}")
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise wrong
    if tp is int:
        if isinstance(value, numbers.Integral) and not _is_bool(value):
            return int(value)
        raise wrong
    if tp is float:
        if isinstance(value, str) and from_text and _FLOAT_TEXT.match(value.strip()):
            value = float(value)  # YAML 1.1 reads "1e-4" as a string
        if not isinstance(value, numbers.Real) or _is_bool(value):
            raise wrong
        try:
            number = float(value)
        except OverflowError:  # an int too large for a float
            raise ConfigError(f"{where}: must be a finite number, got an integer of {len(str(value))} digits") \
                from None
        if not nonfinite and not math.isfinite(number):
            raise ConfigError(f"{where}: must be a finite number, got {value!r}")
        return number
    if tp is str:
        if isinstance(value, str):
            return value
        raise wrong
    if origin is list:
        if isinstance(value, str) and args[0] is str and from_text:
            return [value]
        if not isinstance(value, (list, tuple)):
            raise wrong
        return [_convert(args[0], v, f"{where}[{i}]", from_text=from_text, nonfinite=nonfinite)
                for i, v in enumerate(value)]
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis:  # tuple[X, ...]: any length
        if isinstance(value, str) and args[0] is str and from_text:
            return (value,)
        if not isinstance(value, (list, tuple)):
            raise wrong
        return tuple(_convert(args[0], v, f"{where}[{i}]", from_text=from_text, nonfinite=nonfinite)
                     for i, v in enumerate(value))
    if origin is tuple:
        if not isinstance(value, (list, tuple)) or len(value) != len(args):
            raise ConfigError(f"{where}: expected a list of {len(args)} values, got {value!r}")
        return tuple(_convert(a, v, f"{where}[{i}]", from_text=from_text, nonfinite=nonfinite)
                     for i, (a, v) in enumerate(zip(args, value)))
    if origin is dict:
        if not isinstance(value, Mapping):
            raise wrong
        return {_convert(args[0], k, where, from_text=from_text):
                _convert(args[1], v, f"{where}.{k}", from_text=from_text, nonfinite=nonfinite)
                for k, v in value.items()}
    raise ConfigError(f"{where}: unsupported field type {tp}")


def _inline_values(f: dataclasses.Field, values: Mapping[str, Any], where: str, from_text: bool) -> dict[str, Any]:
    schema = _inline_fields(f)
    out = {}
    for key, value in values.items():
        path = f"{where}.{key}" if where else str(key)
        if key not in schema:
            raise ConfigError(f"{path}: unknown key{suggest(str(key), schema)}{known_keys(schema)}")
        if value is not None:
            out[key] = _convert(schema[key], value, path, from_text=from_text)
    return out


def validate(instance: Any, where: str = "") -> None:
    """Check a built config dataclass against its type hints (call it first in ``__post_init__``), normalising
    values in place as ``from_mapping`` does (int -> float, list -> tuple); errors name ``where.<field>``."""
    cls = type(instance)
    hints = _hints(cls)
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        path = f"{where}.{f.name}" if where else f.name
        value = getattr(instance, f.name)
        if "inline" in f.metadata or "inline_open" in f.metadata:
            if not isinstance(value, Mapping):
                raise ConfigError(f"{path}: expected a mapping, got {type(value).__name__} {value!r}")
            value = _inline_values(f, value, where, from_text=False) if "inline" in f.metadata else dict(value)
        else:
            value = _convert(hints[f.name], value, path, nonfinite=f.metadata.get("nonfinite", False))
        object.__setattr__(instance, f.name, value)


def from_mapping(cls: type, data: Any, where: str, exclude: Collection[str] = ()) -> Any:
    """Build dataclass ``cls`` from a mapping; unknown keys and wrong types raise ConfigError naming the path.

    ``exclude``: fields that are not settable here (treated as unknown keys)."""
    label = where or "config"
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise ConfigError(f"{label}: expected a mapping, got {type(data).__name__} {data!r}")
    hints = _hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init and f.name not in exclude}
    derived_ = {name: f.metadata["derived"] for name, f in fields.items() if "derived" in f.metadata}
    inlines = [f for f in fields.values() if "inline" in f.metadata]
    rest = next((f for f in fields.values() if "inline_open" in f.metadata), None)
    plain = {name: f for name, f in fields.items()
             if name not in derived_ and "inline" not in f.metadata and "inline_open" not in f.metadata}
    inline_keys = {key: f for f in inlines for key in _inline_fields(f)}
    known = set(plain) | set(inline_keys)
    values: dict[str, Any] = {}
    inline_given: dict[str, dict[str, Any]] = {f.name: {} for f in inlines}
    for key, value in data.items():
        path = f"{where}.{key}" if where else str(key)
        if key in plain:
            values[key] = _convert(hints[key], value, path, from_text=True,
                                   nonfinite=plain[key].metadata.get("nonfinite", False))
        elif key in inline_keys:
            inline_given[inline_keys[key].name][key] = value
        elif key in derived_:
            raise ConfigError(f"{path}: not set in a config file; {derived_[key]}")
        elif rest is not None:
            values.setdefault(rest.name, {})[key] = value
        else:
            kind = "section" if not where else "key"
            raise ConfigError(f"{path}: unknown {kind}{suggest(str(key), known)}{known_keys(known)}")
    for f in inlines:
        values[f.name] = _inline_values(f, inline_given[f.name], where, from_text=True)
    try:
        return cls(**values)
    except ConfigError as error:
        message = str(error)
        # Errors raised inside a section's own checks name the section by class; name it by path instead.
        name = cls.__name__
        if where and message.startswith(name) and message[len(name):len(name) + 1] in (".", ":"):
            message = where + message[len(name):]
        elif where and not message.startswith(where.split(".")[0]):
            message = f"{where}: {message}"
        raise ConfigError(message) from None


def to_mapping(value: Any) -> Any:
    """Plain data (dicts, lists, scalars) that ``from_mapping`` reads back to an equal config: derived fields are
    left out, inline fields written flat with every schema key (None where not given)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out: dict[str, Any] = {}
        for f in dataclasses.fields(value):
            if not f.init or "derived" in f.metadata:
                continue
            if "inline" in f.metadata:
                given = getattr(value, f.name)
                out.update({key: to_mapping(given.get(key)) for key in _inline_fields(f)})
            elif "inline_open" in f.metadata:
                out.update({key: to_mapping(item) for key, item in getattr(value, f.name).items()})
            else:
                out[f.name] = to_mapping(getattr(value, f.name))
        return out
    if isinstance(value, Mapping):
        return {k: to_mapping(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_mapping(v) for v in value]
    return value


def build_registered(registry: Mapping[str, type], spec: Any, where: str, what: str = "name",
                     exclude: Collection[str] = ()) -> dict[str, Any]:
    """``name -> instance`` for a ``name -> options`` section: each name a key of ``registry`` (a dataclass), its
    options (a mapping or null) built with ``from_mapping``; ``what`` names an entry in errors (``objective``);
    ``exclude``: fields that are not options."""
    if not isinstance(spec, Mapping):
        raise ConfigError(f"{where}: expected a mapping of name -> options, got {type(spec).__name__} {spec!r}")
    built = {}
    for name, options in spec.items():
        if name not in registry:
            raise ConfigError(f"{where}.{name}: unknown {what}{suggest(str(name), registry)}{known_keys(registry)}")
        built[name] = from_mapping(registry[name], options, f"{where}.{name}", exclude=exclude)
    return built


# ----------------------------------------------------------------------------------------------- config files
class ConfigLoader(yaml.SafeLoader):
    """YAML's safe loader that refuses a key given twice in one mapping (PyYAML keeps the last silently)."""

    source = "config"

    def construct_document(self, node: yaml.Node) -> Any:
        _check_duplicate_keys(node, "", self.source)
        return super().construct_document(node)


def _check_duplicate_keys(root: yaml.Node, path: str, source: str) -> None:
    seen_nodes: set[int] = set()
    stack = [(root, path)]
    while stack:
        node, where = stack.pop()
        if id(node) in seen_nodes:  # an alias of a node already checked
            continue
        seen_nodes.add(id(node))
        if isinstance(node, yaml.MappingNode):
            lines: dict[Any, int] = {}
            for key_node, value_node in node.value:
                if isinstance(key_node, yaml.ScalarNode) and key_node.tag != "tag:yaml.org,2002:merge":
                    key = key_node.value
                    line = key_node.start_mark.line + 1
                    if key in lines:
                        name = f"{where}.{key}" if where else str(key)
                        raise ConfigError(f"{source}: {name} is given twice (lines {lines[key]} and {line})")
                    lines[key] = line
                    stack.append((value_node, f"{where}.{key}" if where else str(key)))
                else:
                    stack.append((value_node, where))
        elif isinstance(node, yaml.SequenceNode):
            stack.extend((item, f"{where}[{i}]") for i, item in enumerate(node.value))


def load_yaml(text: str, source: str, invalid_as_text: bool = False) -> Any:
    """Parse YAML ``text`` with ConfigLoader; syntax errors and duplicate keys are ConfigErrors naming ``source``.
    ``invalid_as_text``: text that is not valid YAML is returned as it is (a ``--set`` value)."""
    from bertology.inputs import check_unicode

    loader = type("ConfigLoader", (ConfigLoader,), {"source": source})(text)
    try:
        return check_unicode(loader.get_single_data(), source, ConfigError)  # "\ud800" escapes decode unpaired
    except RecursionError:
        raise ConfigError(f"{source}: invalid YAML: nested too deeply") from None
    except yaml.YAMLError as error:
        if invalid_as_text:
            return text
        mark = getattr(error, "problem_mark", None)
        where = f"line {mark.line + 1} column {mark.column + 1}: " if mark is not None else ""
        raise ConfigError(f"{source}: {where}invalid YAML: {getattr(error, 'problem', None) or error}") from None
    finally:
        loader.dispose()


class _Pairs(list):
    """A JSON object's (key, value) pairs, kept in order until duplicates have been checked with their path."""


def load_json(text: str, source: str) -> Any:
    """Parse JSON ``text``; syntax errors and duplicate keys are ConfigErrors naming ``source``."""
    try:
        data = json.loads(text, object_pairs_hook=_Pairs)
    except json.JSONDecodeError as error:
        raise ConfigError(f"{source}: line {error.lineno} column {error.colno}: invalid JSON: {error.msg}") from None
    except RecursionError:
        raise ConfigError(f"{source}: invalid JSON: arrays or objects nested too deeply") from None
    def build(value: Any, where: str) -> Any:
        if isinstance(value, _Pairs):
            out: dict[str, Any] = {}
            for key, item in value:
                name = f"{where}.{key}" if where else key
                if key in out:
                    raise ConfigError(f"{source}: {name} is given twice")
                out[key] = build(item, name)
            return out
        if isinstance(value, list):
            return [build(item, f"{where}[{i}]") for i, item in enumerate(value)]
        return value

    from bertology.inputs import check_unicode

    try:
        built = build(data, "")
    except RecursionError:
        raise ConfigError(f"{source}: invalid JSON: arrays or objects nested too deeply") from None
    return check_unicode(built, source, ConfigError)


def decode_text(raw: bytes, source: str) -> str:
    """UTF-8 text (a leading byte-order mark dropped); other bytes are a ConfigError naming the offset."""
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        line = raw.count(b"\n", 0, error.start) + 1
        raise ConfigError(f"{source}: not UTF-8 text: byte {error.start} (line {line}) is "
                          f"0x{raw[error.start]:02x}; save the file as UTF-8") from None
