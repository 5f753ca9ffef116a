"""The model classes bertology's native format can rebuild, by name: bertology.json records the name of the model's
class, and loading builds the class registered under it. A registered class is built as `cls(config, heads)` and
has a config class (its `config_class` attribute, or one given at registration) with `to_dict()` and
`from_dict(data)`.

An architecture a run config names (``model: {architecture: NAME, ...}``) also registers how it builds its config
from the run's settings and tokenizer (`register_run_config`): ``build(settings, preset, run, base)`` -> a config of
its config class, from the ``preset`` size and the ``settings`` (checked against the config class's fields), with
the vocabulary and special ids of ``run`` (a `RunContext`); ``base``, when given, is the config of the checkpoint
the run continues (``model.init_from``), which the settings then change."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from bertology.builtins import Registry
from bertology.errors import CheckpointError, ConfigError


@dataclass(frozen=True)
class RegisteredModel:
    name: str
    cls: type
    config_class: type

    @property
    def run_config(self) -> Callable[[Mapping[str, Any], str | None, RunContext, Any], Any] | None:
        """Builds the config of a model pretrained by a run config (see the module docstring); None: not
        registered."""
        return RUN_CONFIGS.get(self.name)


@dataclass(frozen=True)
class RunContext:
    """What a pretraining run tells an architecture about its tokenizer and instances: the vocabulary size, the
    padding token's id (``pad_id``) and the id padded positions hold (``fill_id``: GPT-2 pads with its end token), the
    ids of the tokens opening and closing a text (``cls_id``, ``sep_id``; None where the framing has none), the
    tokenizer's framing style, the instances' length, how many special tokens frame one text, and whether rows carry
    a memory from batch to batch (segment streams)."""

    vocab_size: int
    pad_id: int | None = None
    fill_id: int | None = None
    cls_id: int | None = None
    sep_id: int | None = None
    style: str | None = None
    max_seq_length: int = 512
    text_overhead: int = 0
    segment_stream: bool = False


def register_model(name: str, cls: type, config_class: type | None = None,
                   aliases: Mapping[str, Mapping[str, Any]] | None = None) -> None:
    """Register `cls` under `name`. Registering the same class again is harmless; another class under a registered
    name, or a class registered under two names, is a ConfigError. `aliases`: names a class went by before, each
    with the run-config settings it stood for (``{"encoder-stack": {"family": "modernbert"}}``): a bertology.json
    or a run config naming one builds this class (`registered`, `alias`); saving writes `name`."""
    if not isinstance(name, str) or not name:
        raise ConfigError(f"register_model: the name must be a non-empty string, got {name!r}")
    if not isinstance(cls, type):
        raise ConfigError(f"register_model({name!r}): expected a class, got {type(cls).__name__}")
    config_class = config_class or getattr(cls, "config_class", None)
    if config_class is None or not (callable(getattr(config_class, "from_dict", None))
                                    and callable(getattr(config_class, "to_dict", None))):
        raise ConfigError(f"register_model({name!r}): {cls.__name__} needs a config class with to_dict() and "
                          "from_dict() (its config_class attribute, or config_class=...)")
    current = MODELS.get(name)
    if current is not None and current.cls is not cls:
        raise ConfigError(f"register_model: {name!r} is registered already for {current.cls.__name__}")
    for entry in MODELS.values():
        if entry.cls is cls and entry.name != name:
            raise ConfigError(f"register_model: {cls.__name__} is registered already as {entry.name!r}")
    for old, settings in (aliases or {}).items():
        if not isinstance(old, str) or not old or old in MODELS or old == name:
            raise ConfigError(f"register_model({name!r}): alias {old!r} must be a new name")
        current_alias = ALIASES.get(old)
        if current_alias is not None and current_alias[0] != name:
            raise ConfigError(f"register_model: {old!r} is an alias of {current_alias[0]!r} already")
        ALIASES[old] = (name, dict(settings))
    MODELS[name] = RegisteredModel(name, cls, config_class)


def register_run_config(name: str, build: Callable[..., Any]) -> None:
    """Register how the model registered under `name` builds its config from a run config (the module docstring)."""
    registered(name)
    if not callable(build):
        raise ConfigError(f"register_run_config({name!r}): expected a function, got {type(build).__name__}")
    RUN_CONFIGS[name] = build


# name -> RegisteredModel; the built-in classes are registered from bertology.builtins on first use.
MODELS: Registry[RegisteredModel] = Registry("models", register_model)
# architecture name -> its run-config builder (bertology.model.run_configs), registered likewise.
RUN_CONFIGS: Registry[Callable[..., Any]] = Registry("run_configs", register_run_config)


# An old name -> (the registered name it stands for, the run-config settings it implied); see register_model.
ALIASES: dict[str, tuple[str, dict[str, Any]]] = {}


def alias(name: Any) -> tuple[str, dict[str, Any]] | None:
    """(the registered name, the settings it implies) when `name` is an old name of a registered model, else None."""
    if not isinstance(name, str) or name in MODELS:  # the lookup registers the built-ins, and their aliases
        return None
    return ALIASES.get(name)


def registered(name: Any) -> RegisteredModel:
    """The model registered under `name` (or under the name an old alias of it stands for)."""
    old = alias(name)
    if old is not None:
        name = old[0]
    if not isinstance(name, str) or name not in MODELS:
        raise CheckpointError(f"unknown model {name!r}; registered: {', '.join(MODELS) or 'none'}")
    return MODELS[name]


def model_class(name: str) -> type:
    """The class registered under `name`; an unknown name is a CheckpointError listing the registered ones."""
    return registered(name).cls


def model_name(model: Any) -> str:
    """The name `model`'s class is registered under (its exact class: a subclass would be rebuilt as its parent)."""
    for entry in MODELS.values():
        if type(model) is entry.cls:
            return entry.name
    raise CheckpointError(f"{type(model).__name__} is not a registered model class (registered: "
                          f"{', '.join(f'{e.name} ({e.cls.__name__})' for e in MODELS.values()) or 'none'}); "
                          "register it with bertology.model.registry.register_model to save it natively")
