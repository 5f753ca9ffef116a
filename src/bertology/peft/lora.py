"""LoRA (Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large Language Models").

A frozen projection h = x W^T + b learns a low-rank update: h = x W^T + b + (alpha / r) * dropout(x) A^T B^T, with
A [r, in] drawn from a Gaussian and B [out, r] zero, so that the update starts at zero and a fresh LoRA model computes
exactly what the base model does. Merging folds (alpha / r) * B A into W for inference at no extra cost.

`LoRALinear` keeps the wrapped layer's `weight` and `bias` at the same module path (the wrapped layer's parameter
names survive) and adds `lora_A` and `lora_B`: Hugging Face peft's files name them `<module>.lora_A.weight` and
`<module>.lora_B.weight` (bertology.peft.peft_format).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from bertology.errors import ConfigError
from bertology.model.config import TransformerConfig
from bertology.model.dropout import fast_dropout
from bertology.model.extensions import register_extension
from bertology.model.protocol import Model
from bertology.peft.common import (Trainable, block_paths, check_positive, check_positive_int, check_probability,
                                   freeze_base, layer_indices, trainable_parameters)

# The projections of a block LoRA may wrap (those a block has: cross-attention and the gate only in some families).
PROJECTIONS: tuple[str, ...] = ("query", "key", "value", "attn_out", "cross_query", "cross_key", "cross_value",
                                 "cross_out", "ffn_in", "ffn_gate", "ffn_out")
FACTORY = "lora"


class LoRALinear(nn.Linear):
    """An nn.Linear (the wrapped one's own `weight` and `bias` parameters) plus a low-rank update
    (alpha / rank) * B A applied to dropout(x). `merge()` folds the update into `weight`; while merged, the state dict
    still holds the unmerged weight (what a checkpoint must store), and loading a state dict unmerges first."""

    def __init__(self, base: nn.Linear, rank: int, alpha: float, dropout: float = 0.0) -> None:
        nn.Module.__init__(self)  # not nn.Linear.__init__: the wrapped layer's parameters are reused, not allocated
        self.in_features, self.out_features = base.in_features, base.out_features
        self.weight = base.weight
        self.bias = base.bias
        self.rank = check_positive_int(rank, "lora rank")
        self.alpha = check_positive(alpha, "lora alpha")
        self.dropout = check_probability(dropout, "lora dropout")
        self.scaling = self.alpha / self.rank
        factory = {"device": base.weight.device, "dtype": base.weight.dtype}
        # A ~ N(0, 1/in): x A^T keeps the scale of x; B = 0: the update starts at exactly zero (Hu et al., section 4.1).
        self.lora_A = nn.Parameter(torch.empty(self.rank, self.in_features, **factory).normal_(
            0.0, 1.0 / math.sqrt(self.in_features)))
        self.lora_B = nn.Parameter(torch.zeros(self.out_features, self.rank, **factory))
        self.merged = False

    def tunable_parameters(self) -> Iterator[tuple[str, nn.Parameter]]:
        yield "lora_A", self.lora_A
        yield "lora_B", self.lora_B

    def delta(self) -> Tensor:
        """The update to the weight, (alpha / rank) * B A, [out, in]."""
        return (self.lora_B @ self.lora_A) * self.scaling

    def forward(self, x: Tensor) -> Tensor:
        out = F.linear(x, self.weight, self.bias)
        if self.merged:
            return out
        update = F.linear(F.linear(fast_dropout(x, self.dropout, self.training), self.lora_A), self.lora_B)
        return out + update * self.scaling  # B = 0: adds exact zeros, the base output is unchanged bit for bit

    @torch.no_grad()
    def merge(self) -> None:
        """W <- W + (alpha / rank) B A: the forward is then one matmul (the LoRA parameters stop receiving gradients)."""
        if not self.merged:
            self.weight.add_(self.delta())
            self.merged = True

    @torch.no_grad()
    def unmerge(self) -> None:
        """W <- W - (alpha / rank) B A: back to training form."""
        if self.merged:
            self.weight.sub_(self.delta())
            self.merged = False

    def _save_to_state_dict(self, destination, prefix, keep_vars):  # type: ignore[no-untyped-def]
        super()._save_to_state_dict(destination, prefix, keep_vars)
        if self.merged:
            with torch.no_grad():
                destination[prefix + "weight"] = self.weight - self.delta()

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):  # type: ignore[no-untyped-def]
        self.unmerge()  # the state dict holds unmerged weights
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def extra_repr(self) -> str:
        return (f"{super().extra_repr()}, rank={self.rank}, alpha={self.alpha:g}, dropout={self.dropout:g}"
                f"{', merged' if self.merged else ''}")


def lora_factory(config: TransformerConfig, current: nn.Module | None, rank: int, alpha: float,
                 dropout: float = 0.0) -> LoRALinear:
    """The registered extension "lora": wrap the nn.Linear at the extension's path."""
    if isinstance(current, LoRALinear):
        raise ConfigError("lora: this projection already has LoRA")
    if not isinstance(current, nn.Linear):
        raise ConfigError(f"lora: wraps an nn.Linear, found {type(current).__name__}")
    return LoRALinear(current, rank, alpha, dropout)


register_extension(FACTORY, lora_factory)


def apply_lora(model: Model, rank: int = 8, alpha: float = 8.0, dropout: float = 0.0,
               targets: Sequence[str] = ("query", "value"), layers: Sequence[int] | None = None, *,
               train_heads: bool = True, also_train: Sequence[str] = (), verbose: bool = False) -> Trainable:
    """Wrap the `targets` projections of the chosen (unique) layers (all for None) in LoRALinear through
    `model.add_extension`, so the native format rebuilds them; then freeze everything but the LoRA parameters (of
    every extension), the heads (`train_heads`) and parameters whose names start with one of `also_train`. Returns the
    trainable share (printed too when `verbose`)."""
    check_positive_int(rank, "lora rank")
    check_positive(alpha, "lora alpha")
    check_probability(dropout, "lora dropout")
    if isinstance(targets, str):
        targets = (targets,)
    unknown = [t for t in targets if t not in PROJECTIONS]
    if unknown or not targets:
        raise ConfigError(f"lora targets: unknown projection(s) {', '.join(map(repr, unknown)) or '(none given)'}; "
                          f"expected some of {', '.join(PROJECTIONS)}")
    if len(set(targets)) != len(targets):
        raise ConfigError(f"lora targets: {list(targets)} names a projection twice")
    paths = block_paths(model)
    chosen = layer_indices(model, layers, "lora layers")
    # An encoder-decoder's encoder blocks have no cross-attention: a target goes to the chosen blocks that have it.
    has = {(i, t): isinstance(getattr(model.get_submodule(paths[i]), t, None), nn.Linear)
           for i in chosen for t in targets}
    for target in targets:
        if not any(has[i, target] for i in chosen):
            raise ConfigError(f"lora targets: this model's (chosen) blocks have no projection {target!r}")
    for index in chosen:
        for target in targets:
            if has[index, target]:
                model.add_extension(f"{paths[index]}.{target}", FACTORY, rank=rank, alpha=alpha, dropout=dropout)
    freeze_base(model, train_heads, also_train)
    share = trainable_parameters(model)
    if verbose:
        print(share)
    return share


def lora_layers(model: nn.Module) -> Iterator[tuple[str, LoRALinear]]:
    for name, module in model.named_modules():
        if isinstance(module, LoRALinear):
            yield name, module


def merge_lora(model: nn.Module) -> None:
    """Merge every LoRA layer (see LoRALinear.merge): same outputs, the base model's cost."""
    for _, module in lora_layers(model):
        module.merge()


def unmerge_lora(model: nn.Module) -> None:
    for _, module in lora_layers(model):
        module.unmerge()


@torch.no_grad()
def fold_lora(model: Model) -> Model:
    """Replace every LoRA layer by a plain nn.Linear holding W + (alpha / rank) B A and forget the extensions: the
    model is a base model again (savable in transformers' layout when nothing else extends it). In place; returns it."""
    for name, module in list(lora_layers(model)):
        plain = nn.Linear(module.in_features, module.out_features, bias=module.bias is not None, device="meta")
        plain.weight = nn.Parameter(module.weight + module.delta() if not module.merged else module.weight.clone(),
                                    requires_grad=module.weight.requires_grad)
        plain.bias = module.bias
        parent, _, attribute = name.rpartition(".")
        setattr(model.get_submodule(parent), attribute, plain)
        model.extensions.pop(name, None)
    return model
