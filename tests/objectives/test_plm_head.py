"""The permutation LM's loss without the [N, V] logits (`linear_token_prediction`): the same loss, stats and
gradients as the head's logits through `token_prediction`, across row chunks, with ignored labels, with and without
a bias, without gradients; under autocast the objective takes the logits path."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from bertology.objectives.mlm import token_prediction
from bertology.objectives.mlm import LOGIT_ROWS, linear_token_prediction

pytestmark = pytest.mark.usefixtures("one_thread")

VOCAB, HIDDEN = 50, 8


def inputs(bias: bool):
    torch.manual_seed(0)
    rows = 2 * LOGIT_ROWS + 5  # two full chunks and a short one
    hidden = torch.randn(rows, HIDDEN, requires_grad=True)
    weight = torch.randn(VOCAB, HIDDEN, requires_grad=True)
    b = torch.randn(VOCAB, requires_grad=True) if bias else None
    labels = torch.randint(0, VOCAB, (rows,))
    labels[::7] = -100
    with torch.no_grad():  # some rows predict their label, so that `correct` counts something
        weight[labels[1::3].clamp(min=0)] += 3 * hidden[1::3]
    return hidden, weight, b, labels


@pytest.mark.parametrize("bias", [True, False])
def test_equals_the_logits_then_the_loss(bias):
    hidden, weight, b, labels = inputs(bias)
    leaves = [t for t in (hidden, weight, b) if t is not None]
    expected = token_prediction("lm", F.linear(hidden, weight, b), labels)
    (2.5 * expected.loss_sum).backward()
    expected_grads = [t.grad.clone() for t in leaves]
    for t in leaves:
        t.grad = None
    got = linear_token_prediction("lm", hidden, weight, b, labels)
    (2.5 * got.loss_sum).backward()
    torch.testing.assert_close(got.loss_sum, expected.loss_sum)
    assert got.stats.keys() == expected.stats.keys()
    for key, value in expected.stats.items():
        torch.testing.assert_close(got.stats[key].float(), value.float())
    assert 0 < int(got.stats["lm_correct"]) < len(labels)
    for t, grad in zip(leaves, expected_grads, strict=True):
        torch.testing.assert_close(t.grad, grad, atol=1e-5, rtol=1e-5)


def test_without_gradients_the_loss_alone():
    hidden, weight, b, labels = inputs(True)
    with torch.no_grad():
        got = linear_token_prediction("lm", hidden, weight, b, labels)
        expected = token_prediction("lm", F.linear(hidden, weight, b), labels)
    torch.testing.assert_close(got.loss_sum, expected.loss_sum)
    assert not got.loss_sum.requires_grad


def test_under_autocast_the_objective_reads_the_logits():
    """fp32: the head runs at no slot and the loss makes the logits; bf16 autocast: the head computes them at the
    used slots; the two losses are close."""
    from bertology.model.xlnet import XLNetConfig, XLNetModel
    from bertology.objectives.base import Passes
    from bertology.objectives.plm import PermutationConfig, PermutationLM, permutation_batch

    torch.manual_seed(0)
    objective = PermutationLM()
    model = XLNetModel(XLNetConfig(vocab_size=VOCAB, hidden_size=16, num_layers=2, num_heads=2,
                                   intermediate_size=24, hidden_dropout=0.0, pad_token_id=0), objective.heads())
    model.init_weights(torch.Generator().manual_seed(0))
    ids = torch.randint(3, VOCAB, (3, 12))
    mask = torch.ones_like(ids)
    mask[1, :4] = 0
    batch = permutation_batch(ids, mask, torch.zeros_like(ids), torch.ones_like(ids, dtype=torch.bool), (1, 2),
                              PermutationConfig(k=3), torch.Generator().manual_seed(0))
    rows = []
    model.heads["lm"].register_forward_hook(lambda module, args, out: rows.append(out.shape[0]))
    fp32 = objective(Passes(model, batch, None), batch)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        bf16 = objective(Passes(model, batch, None), batch)
    assert rows == [0, len(batch.masked_positions)]
    torch.testing.assert_close(bf16.loss_sum.float(), fp32.loss_sum, rtol=5e-2, atol=0)


def test_no_rows_give_zero_gradients():
    """A batch without targets: zero loss, zero gradients of the right shapes (no piece ran)."""
    torch.manual_seed(0)
    weight = torch.randn(11, 4, requires_grad=True)
    bias = torch.randn(11, requires_grad=True)
    hidden = torch.randn(0, 4, requires_grad=True)
    out = linear_token_prediction("plm", hidden, weight, bias, torch.zeros(0, dtype=torch.long))
    out.loss_sum.backward()
    assert float(out.loss_sum.detach()) == 0.0
    assert torch.equal(weight.grad, torch.zeros_like(weight)) and torch.equal(bias.grad, torch.zeros_like(bias))
    assert hidden.grad.shape == (0, 4)
