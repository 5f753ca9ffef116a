"""AdamW without weight decay on biases and LayerNorm weights, and the learning-rate schedules."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn

from bertology.training.config import OptimConfig


def parameter_groups(module: nn.Module, weight_decay: float) -> list[dict]:
    """Two AdamW groups: matrices and embeddings decay; biases, LayerNorm weights (1-D tensors) do not, as in BERT."""
    decay, no_decay = [], []
    seen: set[int] = set()
    for name, parameter in module.named_parameters():
        if not parameter.requires_grad or id(parameter) in seen:
            continue
        seen.add(id(parameter))
        is_norm = isinstance(module.get_submodule(name.rpartition(".")[0]), nn.LayerNorm)
        (no_decay if parameter.ndim < 2 or is_norm else decay).append(parameter)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def build_optimizer(module: nn.Module, config: OptimConfig, fused: bool) -> torch.optim.AdamW:
    groups = parameter_groups(module, config.weight_decay)
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
