"""Extensions: modules plugged into a built model at a module path (adapters, prefixes, LoRA wrappers, span
classifiers, the scalar mix), by registered factory name, recorded so that the native format rebuilds them."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from torch import nn

from bertology.builtins import Registry
from bertology.errors import ConfigError


def register_extension(name: str, factory: Callable[..., nn.Module]) -> None:
    """Make `factory` available to `add_extension` under `name`. A checkpoint in the native format names its
    extensions' factories: register them before loading it (the built-in ones need nothing)."""
    EXTENSIONS[name] = factory


# Factories of modules plugged into a model, by name. A factory is called as factory(config, current_module_or_None,
# **options) and returns the module to put in its place. The built-in ones are registered from bertology.builtins on
# first use, so a checkpoint naming one loads whatever was imported first.
EXTENSIONS: Registry[Callable[..., nn.Module]] = Registry("extensions", register_extension)


def add_extension(model: nn.Module, where: str, factory: str, **options: Any) -> nn.Module:
    """Plug `EXTENSIONS[factory](model.config, current, **options)` in at the module path `where` of `model` (for
    example "encoder.layers.3.attn_adapter", or "encoder.layers.0.query" to wrap that projection; `current` is what
    is there now) and record it in `model.extensions`, so that the native checkpoint format can rebuild it. Options
    must be JSON values. Returns the new module."""
    if factory not in EXTENSIONS:
        raise ConfigError(f"unknown extension {factory!r}; registered: {', '.join(sorted(EXTENSIONS)) or 'none'} "
                          "(bertology.model.register_extension)")
    try:
        json.dumps(options)
    except (TypeError, ValueError) as error:
        raise ConfigError(f"extension {where!r}: options must be JSON values ({error})") from None
    parent_path, _, attribute = where.rpartition(".")
    try:
        parent = model.get_submodule(parent_path)
    except AttributeError:
        raise ConfigError(f"extension {where!r}: the model has no module {parent_path!r}") from None
    if not hasattr(parent, attribute):
        raise ConfigError(f"extension {where!r}: {type(parent).__name__} has no attribute {attribute!r}")
    module = EXTENSIONS[factory](model.config, getattr(parent, attribute), **options)
    setattr(parent, attribute, module)
    model.extensions[where] = (factory, dict(options))
    return module
