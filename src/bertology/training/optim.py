"""AdamW without weight decay on biases and LayerNorm weights, and the learning-rate schedules."""

from __future__ import annotations

import fnmatch
import math
import re
from collections.abc import Callable

import torch
from torch import nn

from bertology.errors import ConfigError
from bertology.training.config import OptimConfig


_LAYER = re.compile(r"(?:^|\.)encoder\.layers\.(\d+)\.")


def layer_depth(name: str, num_layers: int) -> int:
    """Depth of a parameter for layer-wise learning-rate decay: 0 for the embeddings, i + 1 for layer i, and
    num_layers + 1 for everything above the stack (pooler, heads, objectives' own modules)."""
    if ".embeddings." in f".{name}":
        return 0
    match = _LAYER.search(name)
    return int(match.group(1)) + 1 if match else num_layers + 1


def parameter_groups(module: nn.Module, weight_decay: float, layer_decay: float = 1.0,
                     table: nn.Parameter | None = None, table_scale: float = 1.0) -> list[dict]:
    """AdamW groups: matrices and embeddings decay; biases, LayerNorm weights (1-D tensors) do not, as in BERT.

    With ``layer_decay`` < 1 (layer-wise learning-rate decay, as ELECTRA fine-tunes) a parameter at depth d of D + 1
    (see ``layer_depth``) learns at ``lr * layer_decay ** (D + 1 - d)``: the heads at the full rate, each layer
    below at a fraction of the one above. ``table`` (the model's token embeddings) learns at ``table_scale`` times
    its rate (``optim.embedding_lr_scale``). Frozen parameters are left out."""
    named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
    layers = [int(m.group(1)) for n, _ in named if (m := _LAYER.search(n))]
    top = (max(layers) + 1 if layers else 0) + 1
    groups: dict[tuple[bool, int, bool], list[nn.Parameter]] = {}
    seen: set[int] = set()
    for name, parameter in named:
        if id(parameter) in seen:
            continue
        seen.add(id(parameter))
        is_norm = isinstance(module.get_submodule(name.rpartition(".")[0]), nn.LayerNorm)
        decays = not (parameter.ndim < 2 or is_norm)
        depth = layer_depth(name, top - 1) if layer_decay != 1.0 else top
        scaled = table_scale != 1.0 and parameter is table
        groups.setdefault((decays, depth, scaled), []).append(parameter)
    out = []
    for (decays, depth, scaled), params in sorted(groups.items(), key=lambda item: (not item[0][0], *item[0][1:])):
        group: dict = {"params": params, "weight_decay": weight_decay if decays else 0.0}
        scale = (layer_decay ** (top - depth) if layer_decay != 1.0 else 1.0) * (table_scale if scaled else 1.0)
        if scale != 1.0:
            group["lr_scale"] = scale
        out.append(group)
    return out


def restrict_training(module: nn.Module, patterns: list[str] | None, prefix: str = "model.") -> None:
    """Freeze (``requires_grad_(False)``) every parameter of ``module`` whose names do not all match one of the
    fnmatch ``patterns`` (``optim.train_only``; names with ``prefix`` stripped, so that a TrainingLoss's model is
    named as the model names itself); a parameter frozen already stays frozen; None changes nothing. A pattern that
    matches no parameter, or patterns that leave nothing to train, are errors naming the key."""
    if patterns is None:
        return
    names: dict[int, tuple[nn.Parameter, list[str]]] = {}  # a tied parameter once, with every name it has
    for name, parameter in module.named_parameters(remove_duplicate=False):
        names.setdefault(id(parameter), (parameter, []))[1].append(name.removeprefix(prefix))
    every = [name for _, group in names.values() for name in group]
    for index, pattern in enumerate(patterns):
        if not any(fnmatch.fnmatchcase(name, pattern) for name in every):
            shown = ", ".join(sorted({".".join(n.split(".")[:2]) + ".*" for n in every}))
            raise ConfigError(f"optim.train_only[{index}]: {pattern!r} matches no parameter of the model (its "
                              f"parameters are named {shown})")
    for parameter, group in names.values():
        if not all(any(fnmatch.fnmatchcase(name, pattern) for pattern in patterns) for name in group):
            parameter.requires_grad_(False)
    if not any(parameter.requires_grad for parameter, _ in names.values()):
        raise ConfigError(f"optim.train_only: {patterns} leaves no parameter to train (a parameter shared under "
                          "several names trains only if every name matches)")


def build_optimizer(module: nn.Module, config: OptimConfig, fused: bool,
                    table: nn.Parameter | None = None) -> torch.optim.AdamW:
    """AdamW over ``module``'s parameter groups (``parameter_groups``); ``table``: the model's token embeddings,
    which learn at ``config.embedding_lr_scale`` times the rate."""
    scale = 1.0 if config.embedding_lr_scale is None else config.embedding_lr_scale
    if scale != 1.0 and table is None:
        raise ConfigError("optim.embedding_lr_scale: this model has no token table to scale the rate of")
    groups = parameter_groups(module, config.weight_decay, config.layer_decay, table, scale)
    for group in groups:
        group["lr"] = config.lr * group.pop("lr_scale", 1.0)
    device = next(module.parameters()).device
    # The fused kernel needs floating-point parameters on a device that has it (CPU and CUDA in current torch).
    use_fused = fused and device.type in ("cpu", "cuda")
    return torch.optim.AdamW(groups, lr=config.lr, betas=config.betas, eps=config.eps, fused=use_fused or None)


def lr_lambda(config: OptimConfig) -> Callable[[int], float]:
    """Multiplier of ``lr`` at a step: linear warm-up from 0, then linear or cosine decay to ``min_lr_ratio``."""
    warmup, total, floor = config.warmup, config.total_steps, config.min_lr_ratio

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / (warmup + 1)
        if config.schedule == "constant":
            return 1.0
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        if config.schedule == "cosine":
            return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))
        return floor + (1.0 - floor) * (1.0 - progress)

    return factor


def build_scheduler(optimizer: torch.optim.Optimizer, config: OptimConfig) -> torch.optim.lr_scheduler.LambdaLR:
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(config))
