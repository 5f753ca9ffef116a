"""The int8 linear map of int8 inference (`bertology.model.quantize`, which explains the scheme) and the test for a
model holding one: below the checkpoint writer, which refuses to save a quantized model."""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch import Tensor, nn

from bertology.errors import ConfigError


class Int8Linear(nn.Module):
    """y = x W^T + b with W stored as int8 per output channel and x quantized to int8 per row at each call.

    `weight` is [out, in] int8, `weight_scale` [out] float32 (W ~ weight * weight_scale[:, None]), `bias` [out]
    float32 or None. Each row of x is quantized over its own range [min, max] (asymmetric, 256 levels)."""

    def __init__(self, weight: Tensor, weight_scale: Tensor, bias: Tensor | None) -> None:
        super().__init__()
        if weight.dtype != torch.int8 or weight.dim() != 2:
            raise ConfigError(f"Int8Linear: weight must be a 2-d int8 tensor, got {weight.dtype} {tuple(weight.shape)}")
        self.in_features, self.out_features = weight.shape[1], weight.shape[0]
        self.register_buffer("weight", weight.contiguous())
        self.register_buffer("weight_scale", weight_scale.float().contiguous())
        self.register_buffer("bias", None if bias is None else bias.detach().float().clone())
        self.register_buffer("weight_sums", weight.sum(dim=1, dtype=torch.int64).float(), persistent=False)

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> Int8Linear:
        w = linear.weight.detach().float()
        scale = w.abs().amax(dim=1).clamp(min=torch.finfo(torch.float32).tiny) / 127.0
        weight = torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8)
        return cls(weight, scale, linear.bias)

    def dequantized_weight(self) -> Tensor:
        """The float32 weight this layer stands for, [out, in]."""
        return self.weight.float() * self.weight_scale[:, None]

    def forward(self, x: Tensor) -> Tensor:
        rows = x.reshape(-1, self.in_features).float()
        # Each row maps [min, max] onto the 256 int8 levels: x ~ scale * (q + 128) + low. Asymmetric, because the
        # feed-forward's second map reads GELU outputs, which are almost all >= 0 (a symmetric range wastes a bit).
        low = rows.amin(dim=1, keepdim=True)
        scale = (rows.amax(dim=1, keepdim=True) - low).div_(255.0).clamp_(min=torch.finfo(torch.float32).tiny)
        q = (rows - low).div_(scale).round_().sub_(128.0).to(torch.int8)  # in [-128, 127] by construction
        # weight.t() is a column-major view: _int_mm takes it without a copy (and runs faster than a row-major copy).
        if q.device.type == "cpu" and int_mm_saturates():
            high = torch.div(self.weight, 2, rounding_mode="floor")  # [-64, 63]; weight - 2 high in {0, 1}
            out = torch._int_mm(q, high.t()).mul_(2).add_(torch._int_mm(q, (self.weight - 2 * high).t())).float()
        else:
            out = torch._int_mm(q, self.weight.t()).float()
        # x W^T = scale * (q W^T) + (128 * scale + low) * (row sums of W), W = int8 weight * weight_scale.
        out = out.mul_(scale).addr_(low.add_(scale, alpha=128.0).squeeze(1), self.weight_sums).mul_(self.weight_scale)
        if self.bias is not None:
            out = out.add_(self.bias)
        return out.reshape(*x.shape[:-1], self.out_features).to(x.dtype)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


@functools.cache
def int_mm_saturates() -> bool:
    """True when `torch._int_mm` on CPU is inexact for int8 operands of full range (oneDNN without AVX512-VNNI sums
    pairs of byte products in saturating 16 bits): probed once with extreme rows against an exact int64 product."""
    a = torch.tensor([[127] * 16, [-128] * 16, [127, -128] * 8, [-128, 127] * 8] * 2, dtype=torch.int8)
    b = torch.tensor([[127] * 16, [-127] * 16, [127, -127] * 8, [-127, 127] * 8] * 2, dtype=torch.int8)
    return not torch.equal(torch._int_mm(a, b.t()).long(), a.long() @ b.long().t())


def is_quantized(model: Any) -> bool:
    """True when some module of `model` (a module, or a loaded checkpoint: its model) is an `Int8Linear`."""
    module = model if isinstance(model, nn.Module) else model.model
    return any(isinstance(m, Int8Linear) for m in module.modules())
