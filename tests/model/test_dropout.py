"""The byte-mask dropout: F.dropout's semantics (drop rate, scale, gradient, eval identity) with its own mask."""

from __future__ import annotations

import math

import pytest
import torch

from bertology.model.dropout import fast_dropout, keep_mask


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_drop_rate_within_five_standard_errors(p):
    torch.manual_seed(0)
    n = 1 << 20
    dropped = (~keep_mask(torch.Size([n]), p)).double().mean().item()
    expected = round(p * 65536) / 65536
    assert abs(dropped - expected) < 5 * math.sqrt(p * (1 - p) / n)


def test_every_16_bit_lane_is_unbiased():
    # Each 64-bit random word feeds four consecutive elements; a biased bit in any lane shows up as one position
    # modulo 4 dropping at another rate.
    torch.manual_seed(1)
    n, p = 1 << 22, 0.5
    keep = keep_mask(torch.Size([n]), p).view(-1, 4).double().mean(0)
    assert torch.all((keep - 0.5).abs() < 5 * math.sqrt(0.25 / (n // 4)))


def test_kept_values_are_scaled_and_the_gradient_follows_the_mask():
    torch.manual_seed(2)
    x = torch.randn(64, 33, requires_grad=True)
    y = fast_dropout(x, 0.25, True)
    kept = y != 0
    assert 0 < kept.sum() < x.numel()
    torch.testing.assert_close(y[kept], x[kept] / 0.75, rtol=0, atol=1e-6)
    upstream = torch.randn_like(y)
    y.backward(upstream)
    torch.testing.assert_close(x.grad, torch.where(kept, upstream / 0.75, 0.0), rtol=0, atol=1e-6)


def test_same_seed_same_mask_and_dtype_kept():
    x = torch.randn(100, 7, dtype=torch.bfloat16)
    torch.manual_seed(3)
    a = fast_dropout(x, 0.1, True)
    torch.manual_seed(3)
    b = fast_dropout(x, 0.1, True)
    assert a.dtype == torch.bfloat16 and torch.equal(a, b)


def test_identity_when_not_training_or_p_zero_and_zeros_at_p_one():
    x = torch.randn(5, 6)
    assert fast_dropout(x, 0.5, False) is x
    assert fast_dropout(x, 0.0, True) is x
    assert torch.equal(fast_dropout(x, 1.0, True), torch.zeros_like(x))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_the_float_product_equals_where_on_the_byte_mask(dtype):
    # The float32/float64 path multiplies by a mask holding 0 or the scale; it must give where()'s floats exactly
    # (a dropped element may be a negative zero: equal as a value), forward and backward.
    from bertology.model.dropout import masked

    torch.manual_seed(4)
    x = torch.randn(257, 129, dtype=dtype)
    keep = keep_mask(x.shape, 0.1)
    scale = 1.0 / (1.0 - 0.1)
    assert torch.equal(masked(x, keep, scale), torch.where(keep, x, 0).mul_(scale))
    x.requires_grad_(True)
    torch.manual_seed(5)
    y = fast_dropout(x, 0.1, True)
    upstream = torch.randn_like(y)
    y.backward(upstream)
    torch.manual_seed(5)
    keep = keep_mask(x.shape, 0.1)
    assert torch.equal(y.detach(), torch.where(keep, x.detach(), 0).mul_(scale))
    assert torch.equal(x.grad, torch.where(keep, upstream, 0).mul_(scale))
