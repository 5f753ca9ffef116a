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
