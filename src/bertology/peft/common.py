"""What every parameter-efficient method shares: counting and choosing the trainable parameters, layer selection,
option checks."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import NamedTuple

from torch import nn

from bertology.errors import ConfigError
from bertology.model.protocol import Model


class Trainable(NamedTuple):
    """How many of a model's parameters train (each shared parameter counted once)."""

    trainable: int
    total: int

    @property
    def share(self) -> float:
        return self.trainable / self.total if self.total else 0.0

    def __str__(self) -> str:
        return f"trainable parameters: {self.trainable:,} of {self.total:,} ({100 * self.share:.4f}%)"


def trainable_parameters(model: nn.Module) -> Trainable:
    """(trainable, total) parameter counts of `model`."""
    trainable = total = 0
    for parameter in model.parameters():  # parameters() yields a shared (tied) parameter once
        total += parameter.numel()
        if parameter.requires_grad:
            trainable += parameter.numel()
    return Trainable(trainable, total)


def tunable_parameters(model: Model) -> Iterator[tuple[str, nn.Parameter]]:
    """The parameters the model's extensions train: each extension module that has `tunable_parameters()` (LoRA's A and
    B, not the weight it wraps) says which; any other extension trains all of its parameters."""
    for where in model.extensions:
        module = model.get_submodule(where)
        own = getattr(module, "tunable_parameters", None)
        named = own() if own is not None else module.named_parameters()
        for name, parameter in named:
            yield f"{where}.{name}", parameter


def freeze_base(model: Model, train_heads: bool = True, also_train: Iterable[str] = ()) -> None:
    """Every parameter stops training except the extensions' own (all extensions, whichever method added them), the
    heads' when `train_heads`, and those whose name starts with one of `also_train` (e.g. "encoder.pooler.")."""
    prefixes = tuple(also_train)
    if train_heads:
        prefixes += ("heads.",)
    for name, parameter in model.named_parameters():
        parameter.requires_grad_(name.startswith(prefixes) if prefixes else False)
    for _, parameter in tunable_parameters(model):
        parameter.requires_grad_(True)


def block_paths(model: Model) -> list[str]:
    """The module path of each of the model's blocks (`model.blocks()`), in order: where extensions go."""
    names = {id(module): name for name, module in model.named_modules()}
    return [names[id(block)] for block in model.blocks()]


def layer_indices(model: Model, layers: Sequence[int] | None, where: str) -> list[int]:
    """The (unique) blocks to extend: all of them for None, else the given indices (negative ones count from the
    end)."""
    count = len(model.blocks())
    if layers is None:
        return list(range(count))
    out = []
    for index in layers:
        if isinstance(index, bool) or not isinstance(index, int) or not -count <= index < count:
            raise ConfigError(f"{where}: layer {index!r} is not one of the model's {count} layers")
        out.append(index % count)
    if len(set(out)) != len(out):
        raise ConfigError(f"{where}: layers {list(layers)} name a layer twice")
    return out


def check_positive_int(value: object, key: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(f"{key} must be a positive integer, got {value!r}")
    return value


def check_positive(value: object, key: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 or value == float("inf"):
        raise ConfigError(f"{key} must be a positive number, got {value!r}")
    return float(value)


def check_probability(value: object, key: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
        raise ConfigError(f"{key} must be a number in [0, 1), got {value!r}")
    return float(value)


def check_choice(value: object, choices: Sequence[str], key: str) -> str:
    if value not in choices:
        raise ConfigError(f"{key}: unknown value {value!r}; expected one of {', '.join(choices)}")
    return value  # type: ignore[return-value]
