"""Which hidden states make a contextual vector, and how they are combined.

Hidden state 0 is the embedding output and hidden state i (1..L) the output of the i-th layer call, as
`EncoderOutput.hidden_states` records them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Union

import torch
from torch import Tensor

from bertology.errors import ConfigError

Combine = Literal["sum", "mean", "concat"]
COMBINES: tuple[str, ...] = ("sum", "mean", "concat")
LayerPreset = Literal["last", "sum-last-four", "mean", "concat", "mix"]
LAYER_PRESETS: tuple[str, ...] = ("last", "sum-last-four", "mean", "concat", "mix")
# A preset name, one hidden-state index, or several (negative indices count from the last layer: -1 is the last).
LayerSpec = Union[LayerPreset, int, Sequence[int]]


@dataclass(frozen=True)
class LayerSelection:
    """Hidden-state indices (0 = embedding output, non-negative, in the order given) and their combination; with
    `weights` (the preset "mix"), the weighted sum of every hidden state."""

    indices: tuple[int, ...]
    combine: str  # a Combine, or "mix"
    weights: tuple[float, ...] | None = None

    def width(self, hidden_size: int) -> int:
        return hidden_size * len(self.indices) if self.combine == "concat" else hidden_size

    def apply(self, hidden_states: Sequence[Tensor]) -> Tensor:
        """[B, L, H] per hidden state -> [B, L, width], computed in float32."""
        chosen = [hidden_states[i].float() for i in self.indices]
        if self.weights is not None:
            return sum((w * h for w, h in zip(self.weights[1:], chosen[1:])), self.weights[0] * chosen[0])
        if len(chosen) == 1:
            return chosen[0]
        if self.combine == "concat":
            return torch.cat(chosen, dim=-1)
        total = torch.stack(chosen).sum(0)
        return total / len(chosen) if self.combine == "mean" else total


def select_layers(layers: LayerSpec, combine: Combine | None, num_layers: int,
                  mix: Sequence[float] | None = None) -> LayerSelection:
    """Resolve a layer spec for a model of `num_layers` layers (so hidden states 0..num_layers).

    Presets fix their own combination: "last" (the last layer), "sum-last-four" (sum of the last four layers, the
    usual choice in the word-sense literature), "mean" (mean of all hidden states, the embedding output included),
    "concat" (the last four layers side by side, oldest first) and "mix" (ELMo's scalar mix, gamma * sum_j
    softmax(s)_j h_j over all hidden states: `mix` gives the weights gamma * softmax(s)_j of the model's learned
    mix, the extension `scalar_mix`; without one, equal weights, as "mean"). `combine` applies only to explicit
    indices, where it defaults to "mean".
    """
    if isinstance(layers, str):
        if layers not in LAYER_PRESETS:
            raise ConfigError(f"layers: unknown preset {layers!r}; expected one of {', '.join(LAYER_PRESETS)} "
                              "or a list of hidden-state indices")
        if combine is not None:
            raise ConfigError(f"combine={combine!r} applies to an explicit list of layers; preset {layers!r} "
                              "fixes its own combination")
        if layers in ("sum-last-four", "concat") and num_layers < 4:
            raise ConfigError(f"layers={layers!r} needs at least 4 layers; this model has {num_layers}")
        last_four = tuple(range(num_layers - 3, num_layers + 1))
        if layers == "mix":
            weights = tuple(float(w) for w in mix) if mix is not None else (1.0 / (num_layers + 1),) * (num_layers + 1)
            if len(weights) != num_layers + 1:
                raise ConfigError(f"layers='mix': the model's scalar mix has {len(weights)} weights for "
                                  f"{num_layers + 1} hidden states")
            return LayerSelection(tuple(range(num_layers + 1)), "mix", weights)
        if layers == "last":
            return LayerSelection((num_layers,), "sum")
        if layers == "sum-last-four":
            return LayerSelection(last_four, "sum")
        if layers == "mean":
            return LayerSelection(tuple(range(num_layers + 1)), "mean")
        return LayerSelection(last_four, "concat")

    raw = [layers] if isinstance(layers, int) else list(layers) if isinstance(layers, Sequence) else None
    if raw is None or not raw or any(isinstance(i, bool) or not isinstance(i, int) for i in raw):
        raise ConfigError(f"layers must be a preset name, an int or a non-empty list of ints, got {layers!r}")
    combine = "mean" if combine is None else combine
    if combine not in COMBINES:
        raise ConfigError(f"combine: unknown combination {combine!r}; expected one of {', '.join(COMBINES)}")
    indices = []
    for i in raw:
        if not -(num_layers + 1) <= i <= num_layers:
            raise ConfigError(f"layers: index {i} is out of range for a model with {num_layers} layers "
                              f"(hidden states 0..{num_layers}, or -{num_layers + 1}..-1 from the end)")
        indices.append(i % (num_layers + 1))
    if len(set(indices)) != len(indices):
        raise ConfigError(f"layers: {raw} names the same hidden state twice")
    return LayerSelection(tuple(indices), combine)


def parse_layers(text: str) -> LayerSpec:
    """A layer spec from the command line: a preset name or comma-separated indices such as "-4,-3,-2,-1"."""
    text = text.strip()
    if text in LAYER_PRESETS:
        return text  # type: ignore[return-value]
    try:
        return [int(part) for part in text.split(",")]
    except ValueError:
        raise ConfigError(f"layers: {text!r} is neither a preset ({', '.join(LAYER_PRESETS)}) nor "
                          "comma-separated integers") from None
