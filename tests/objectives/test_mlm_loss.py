"""MLM's summed cross-entropy (a custom backward) against torch's."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from bertology.objectives.mlm import mlm_loss


def test_summed_mlm_loss_matches_cross_entropy_and_its_gradient():
    torch.manual_seed(4)
    logits = torch.randn(40, 500, requires_grad=True)
    labels = torch.randint(0, 500, (40,))
    loss = mlm_loss(logits, labels, reduction="sum")
    (3.0 * loss).backward()
    ours = logits.grad.clone()
    logits.grad = None
    reference = F.cross_entropy(logits, labels, reduction="sum")
    (3.0 * reference).backward()
    torch.testing.assert_close(loss, reference, rtol=1e-6, atol=0)
    torch.testing.assert_close(ours, logits.grad, rtol=0, atol=1e-6)


def test_summed_mlm_loss_refuses_a_second_backward_instead_of_a_wrong_gradient():
    logits = torch.randn(4, 10, requires_grad=True)
    loss = mlm_loss(logits, torch.tensor([1, 2, 3, 4]), reduction="sum")
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="inplace"):
        loss.backward()


def test_on_cpu_the_log_probabilities_go_over_the_logits_with_the_same_loss_and_gradients():
    torch.manual_seed(5)
    h, w = torch.randn(30, 16, requires_grad=True), torch.randn(200, 16, requires_grad=True)
    labels = torch.randint(0, 200, (30,))
    labels[3] = -100
    logits = h @ w.t()
    before = logits.detach().clone()
    loss = mlm_loss(logits, labels, reduction="sum")
    # the logits tensor itself now holds the log-probabilities, with the same predictions
    torch.testing.assert_close(logits.detach(), torch.log_softmax(before, -1), rtol=0, atol=1e-6)
    assert torch.equal(logits.argmax(-1), before.argmax(-1))
    weights = torch.linspace(-1, 1, 200)
    ours = torch.autograd.grad(2.0 * loss + (logits * weights).sum(), (h, w))  # read on after the loss too
    expected_logits = h @ w.t()
    reference = (2.0 * F.cross_entropy(expected_logits, labels, reduction="sum", ignore_index=-100)
                 + (torch.log_softmax(expected_logits, -1) * weights).sum())
    torch.testing.assert_close(loss, F.cross_entropy(before, labels, reduction="sum", ignore_index=-100),
                               rtol=1e-6, atol=0)
    for got, want in zip(ours, torch.autograd.grad(reference, (h, w))):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_logits_that_are_a_view_stay_as_they_were_and_saved_logits_make_the_backward_refuse():
    h, w = torch.randn(6, 4, requires_grad=True), torch.randn(9, 4, requires_grad=True)
    labels = torch.tensor([1, 2, 3, 4, 5, 6])
    rows = (h @ w.t()).view(2, 3, 9)
    flat = rows.flatten(0, 1)  # a view: its base would see a change
    before = flat.detach().clone()
    mlm_loss(flat, labels, reduction="sum").backward()
    assert torch.equal(flat.detach(), before)
    logits = torch.tanh(h @ w.t())  # tanh keeps its output for the backward
    loss = mlm_loss(logits, labels, reduction="sum")
    with pytest.raises(RuntimeError, match="inplace"):
        loss.backward()
