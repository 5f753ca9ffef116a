"""Prefix tuning (Li & Liang 2021, "Prefix-Tuning: Optimizing Continuous Prompts for Generation").

Every layer gets P learned key and value vectors per head, attended by every query beside its own sequence's keys;
the encoder stays frozen. Li & Liang found optimising the prefix directly unstable and reparameterised it through an
MLP, P = MLP(P'), keeping only P after training; `reparameterize=True` does this per layer:
(keys, values) = split(W_2 tanh(W_1 E + b_1) + b_2) with E a [P, hidden] embedding.

Unlike LoRA and adapters, a prefix is not the identity at initialisation: the prefix positions take part of every
query's attention.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from bertology.errors import ConfigError
from bertology.model.config import TransformerConfig
from bertology.model.extensions import register_extension
from bertology.model.protocol import Model
from bertology.peft.common import (Trainable, block_paths, check_positive_int, freeze_base, layer_indices,
                                   trainable_parameters)

FACTORY = "prefix"


class Prefix(nn.Module):
    """A layer's prefix: `forward()` returns (keys, values), each [length, heads, head_dim]."""

    def __init__(self, config: TransformerConfig, length: int, reparameterize: bool = False, mlp_hidden: int = 512) -> None:
        super().__init__()
        self.length = check_positive_int(length, "prefix length")
        self.heads, self.head_dim = config.num_heads, config.head_dim
        hidden = config.hidden_size
        self.reparameterize = bool(reparameterize)
        if self.reparameterize:
            check_positive_int(mlp_hidden, "prefix mlp_hidden")
            self.embedding = nn.Parameter(torch.randn(length, hidden))
            self.mlp = nn.Sequential(nn.Linear(hidden, mlp_hidden), nn.Tanh(), nn.Linear(mlp_hidden, 2 * hidden))
        else:
            std = config.initializer_range
            self.keys = nn.Parameter(torch.randn(length, self.heads, self.head_dim) * std)
            self.values = nn.Parameter(torch.randn(length, self.heads, self.head_dim) * std)

    def forward(self) -> tuple[Tensor, Tensor]:
        if not self.reparameterize:
            return self.keys, self.values
        keys, values = self.mlp(self.embedding).view(self.length, 2, self.heads, self.head_dim).unbind(1)
        return keys, values

    def extra_repr(self) -> str:
        return f"length={self.length}, heads={self.heads}, head_dim={self.head_dim}, reparameterize={self.reparameterize}"


def prefix_factory(config: TransformerConfig, current: nn.Module | None, length: int, reparameterize: bool = False,
                   mlp_hidden: int = 512) -> Prefix:
    """The registered extension "prefix", for a layer's `prefix` slot."""
    if current is not None:
        raise ConfigError(f"prefix: the slot already holds a {type(current).__name__}")
    return Prefix(config, length, reparameterize, mlp_hidden)


register_extension(FACTORY, prefix_factory)


def apply_prefix(model: Model, length: int = 20, layers: Sequence[int] | None = None, *,
                 reparameterize: bool = False, mlp_hidden: int = 512, train_heads: bool = True,
                 also_train: Sequence[str] = (), verbose: bool = False) -> Trainable:
    """A prefix of `length` keys and values in each chosen (unique) layer (all for None), through
    `model.add_extension`; then freeze everything but the extensions, the heads (`train_heads`) and names starting
    with one of `also_train`. Returns the trainable share (printed too when `verbose`)."""
    check_positive_int(length, "prefix length")
    if reparameterize:
        check_positive_int(mlp_hidden, "prefix mlp_hidden")
    options = {"length": length, "reparameterize": bool(reparameterize)}
    if reparameterize:
        options["mlp_hidden"] = mlp_hidden
    paths = block_paths(model)
    for index in layer_indices(model, layers, "prefix layers"):
        model.add_extension(f"{paths[index]}.prefix", FACTORY, **options)
    freeze_base(model, train_heads, also_train)
    share = trainable_parameters(model)
    if verbose:
        print(share)
    return share
