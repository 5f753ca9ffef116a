"""ScalarMix = gamma * sum_j softmax(s)_j h_j over a frozen encoder's hidden states: checked against a hand
computation; gradients reach s and gamma only."""

from __future__ import annotations

import math

import pytest
import torch

from bertology.errors import ConfigError, InputError
from bertology.peft import ScalarMix, scalar_mix_for, trainable_parameters
from peft_helpers import LAYERS, batch, tiny_model


def hidden_states(model):
    ids, mask, _ = batch()
    return model(ids, mask, output_hidden_states=True).hidden_states


def test_matches_a_hand_computation():
    model = tiny_model()
    states = hidden_states(model)
    mix = scalar_mix_for(model)
    assert mix.num_states == LAYERS + 1 == len(states)
    with torch.no_grad():
        mix.scalars.copy_(torch.tensor([0.5, -1.0, 2.0, 0.0]))
        mix.gamma.fill_(1.5)
        got = mix(states)
    exps = [math.exp(s) for s in (0.5, -1.0, 2.0, 0.0)]
    expected = sum(1.5 * e / sum(exps) * h for e, h in zip(exps, states))
    torch.testing.assert_close(got, expected, atol=1e-6, rtol=0)
    fresh = ScalarMix(LAYERS + 1)  # s = 0, gamma = 1: the plain average of the states
    torch.testing.assert_close(fresh(states), sum(states) / (LAYERS + 1), atol=1e-6, rtol=0)


def test_gradients_reach_s_and_gamma_only():
    model = tiny_model()
    model.requires_grad_(False)  # a frozen encoder
    mix = ScalarMix(LAYERS + 1)
    assert trainable_parameters(mix) == (LAYERS + 2, LAYERS + 2)
    head = torch.randn(32)
    optimizer = torch.optim.SGD(mix.parameters(), lr=0.1)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    for _ in range(3):
        optimizer.zero_grad()
        loss = (mix(hidden_states(model)) @ head).pow(2).mean()
        loss.backward()
        assert mix.scalars.grad is not None and mix.scalars.grad.abs().sum() > 0 and mix.gamma.grad != 0
        assert all(p.grad is None for p in model.parameters())
        optimizer.step()
    assert not torch.equal(mix.scalars.detach(), torch.zeros(LAYERS + 1))
    assert all(torch.equal(p, before[name]) for name, p in model.named_parameters())


def test_state_dict_round_trip():
    mix = ScalarMix(3)
    with torch.no_grad():
        mix.scalars.normal_()
    other = ScalarMix(3)
    other.load_state_dict(mix.state_dict())
    states = [torch.randn(2, 5, 4) for _ in range(3)]
    assert torch.equal(other(states), mix(states))


def test_bad_input():
    with pytest.raises(ConfigError, match="scalar mix num_states must be a positive integer, got 0"):
        ScalarMix(0)
    with pytest.raises(InputError, match="expected 3 hidden states"):
        ScalarMix(3)([torch.zeros(1, 2, 4)] * 2)
