"""Scalar mix (Peters et al. 2018, "Deep contextualized word representations", eq. 1).

    mix = gamma * sum_j softmax(s)_j h_j

over the encoder's hidden states (the embedding output and every layer's output: `output_hidden_states=True`), with
learned s (one scalar per state, zero at first: an even average) and gamma (one at first). A task head reads the mix
from a frozen encoder.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

from bertology.errors import ConfigError, InputError
from bertology.peft.common import check_positive_int


class ScalarMix(nn.Module):
    def __init__(self, num_states: int) -> None:
        super().__init__()
        check_positive_int(num_states, "scalar mix num_states")
        self.num_states = num_states
        self.scalars = nn.Parameter(torch.zeros(num_states))
        self.gamma = nn.Parameter(torch.ones(()))

    def weights(self) -> Tensor:
        """softmax(s): how much each state contributes."""
        return self.scalars.softmax(0)

    def forward(self, hidden_states: Sequence[Tensor]) -> Tensor:
        if len(hidden_states) != self.num_states:
            raise InputError(f"scalar mix: expected {self.num_states} hidden states (the embedding output and each "
                             f"layer's), got {len(hidden_states)}")
        weights = self.weights()
        mixed = weights[0] * hidden_states[0]
        for weight, state in zip(weights[1:], hidden_states[1:]):
            mixed = mixed + weight * state
        return self.gamma * mixed

    def extra_repr(self) -> str:
        return f"num_states={self.num_states}"


def scalar_mix_for(model: nn.Module) -> ScalarMix:
    """A ScalarMix over an EncoderModel's hidden states: num_layers + 1 (one per layer call, and the embeddings)."""
    config = getattr(model, "config", None)
    if config is None or not hasattr(config, "num_layers"):
        raise ConfigError(f"scalar mix: {type(model).__name__} has no encoder config")
    return ScalarMix(config.num_layers + 1)


def scalar_mix_extension(config: Any, current: nn.Module | None) -> ScalarMix:
    """The extension factory ``scalar_mix``, plugged in at the model's ``mix``: the heads then read the mix of the
    embedding output and every layer's output instead of the last layer."""
    if current is not None:
        raise ConfigError("extension 'scalar_mix': the model already has a mix")
    return ScalarMix(config.num_layers + 1)
