"""Dropout with a cheaper mask on CPU.

`F.dropout` on CPU draws one Bernoulli sample per element (`bernoulli_`) into a float mask and multiplies by it;
in a BERT-mini training step that mask generation was about a tenth of the step (benchmarks/RESULTS.md,
"Training"). Here the mask comes from bulk 64-bit random words cut into 16-bit lanes, compared against a threshold,
and is kept as one byte per element for the backward pass. The drop probability is therefore rounded to a
multiple of 1/65536 (0.1 becomes 0.100006); the scale is 1 / (1 - p) of the requested p, as in `F.dropout`.
Other devices use `F.dropout` (CUDA's fused dropout draws its mask in the same kernel).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

LEVELS = 1 << 16


def keep_mask(shape: torch.Size, p: float) -> Tensor:
    """A bool tensor of `shape`, each element True with probability 1 - round(p * 65536) / 65536, from torch's
    default generator."""
    count = shape.numel()
    words = torch.empty((count + 3) // 4, dtype=torch.int64)
    # random_(from, to) over the whole int64 range: every one of the 64 bits is uniform (random_() alone leaves
    # the sign bit 0, which would bias every fourth 16-bit lane).
    words.random_(-(1 << 63), (1 << 63) - 1)
    lanes = words.view(torch.int16)[:count].view(shape)
    return lanes >= round(p * LEVELS) - LEVELS // 2


def masked(x: Tensor, keep: Tensor, scale: float) -> Tensor:
    """x where `keep`, else 0, times `scale`. In float32 and float64, as x times the mask in x's dtype (0 or the
    scale, made from the mask's bytes): on CPU `torch.where` on a bool mask runs at about a fifth of the speed of a
    float product and a bool-to-float conversion at a tenth of a byte-to-float one (one thread, 1.5M elements:
    where 2.6 ms, the product with its mask 0.6 ms). The kept values are the same floats (x times the scale in x's
    dtype, as ``mul_`` gives); a dropped one is 0 times x, a zero of x's sign. Half precisions keep `torch.where`:
    there a mask holding the scale would round the scale itself."""
    if x.dtype in (torch.float32, torch.float64):
        return x * keep.view(torch.uint8).to(x.dtype).mul_(scale)
    return torch.where(keep, x, 0).mul_(scale)


class _MaskedDropout(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, p: float) -> Tensor:
        keep = keep_mask(x.shape, p)
        scale = 1.0 / (1.0 - p)
        ctx.save_for_backward(keep)  # the byte mask, not a float one: a quarter of the memory
        ctx.scale = scale
        return masked(x, keep, scale)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None]:
        (keep,) = ctx.saved_tensors
        return masked(grad, keep, ctx.scale), None


def fast_dropout(x: Tensor, p: float, training: bool) -> Tensor:
    """`F.dropout(x, p, training)`, with the byte-mask kernel above for CPU tensors."""
    if not training or p == 0.0:
        return x
    if x.device.type != "cpu" or p >= 1.0 or not x.is_floating_point():
        return F.dropout(x, p, training)
    return _MaskedDropout.apply(x, p)
