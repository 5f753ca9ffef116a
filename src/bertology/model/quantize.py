"""int8 inference on CPU: the encoder layers' linear maps with int8 weights and int8 activations.

`quantize(model)` replaces every plain `nn.Linear` of the encoder layers (query, key, value, attention output, the
feed-forward's two maps) by an `Int8Linear`: weights symmetric int8 per output channel, computed once; activations
int8 per row (per token) over the row's own range [min, max], computed at every call; the product is an
int8 x int8 -> int32 matmul (`torch._int_mm`), rescaled to float32 and given the float32 bias. Embeddings, LayerNorm,
attention itself, the pooler and the heads stay float32 (they are a small share of the time, and heads decide
predictions).

Why not PyTorch's `quantize_dynamic` (fbgemm): on this AVX2 CPU it quantizes a whole activation tensor with one
scale in 7 bits (`reduce_range`, which AVX2's 16-bit accumulation needs), and an outlier dimension of one token then
costs every other token its precision; per-row 8-bit activations keep all-MiniLM-L6-v2's STS-B Spearman closer to
float32 and the int32 matmul is at least as fast (benchmarks/int8.py, RESULTS.md "int8 on CPU"). `torch.ao`'s
eager quantization is also deprecated.

`torch._int_mm` on CPU is oneDNN's, which is exact only with AVX512-VNNI (or AMX): without them (an AVX2 CPU, an
AVX-512 one before VNNI, or `ONEDNN_MAX_CPU_ISA` set lower) it sums pairs of byte products in saturating 16 bits, and
two products of 255 x 127 overflow them (results off by up to ~10^4 a pair). `int_mm_saturates` probes that once; on
such a CPU the int8 weight is split as 2 * high + low (high in [-64, 63], low in {0, 1}), whose pair sums stay below
2^15, and the two exact products are summed: the same result, two int8 matmuls instead of one.

A quantized model is for inference: it is not saved (its weights are no longer what a checkpoint holds); quantize the
float32 model after loading it. Modules a wrapper replaced (LoRA) and extensions stay float32.
"""

from __future__ import annotations

import copy
import functools
from typing import TypeVar

import torch
from torch import Tensor, nn

from bertology.errors import ConfigError
from bertology.model.checkpoint import Pretrained
from bertology.model.encoder import Encoder, EncoderLayer, EncoderModel

DTYPES: tuple[str, ...] = ("float32", "int8")
# The linear maps of an encoder layer that are quantized (EncoderLayer's attribute names).
LAYER_LINEARS: tuple[str, ...] = ("query", "key", "value", "attn_out", "ffn_in", "ffn_out")

Quantizable = TypeVar("Quantizable", Pretrained, EncoderModel, Encoder)


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


def quantize(model: Quantizable, *, inplace: bool = False) -> Quantizable:
    """`model` (a `Pretrained`, `EncoderModel` or `Encoder`) with its encoder layers' plain `nn.Linear` maps replaced
    by `Int8Linear`, in eval mode. A copy unless `inplace`; a `Pretrained` keeps its tokenizer."""
    if isinstance(model, Pretrained):
        inner = quantize(model.model, inplace=inplace)
        return model if inplace else Pretrained(model=inner, tokenizer=model.tokenizer, directory=model.directory)
    if not isinstance(model, (EncoderModel, Encoder)):
        raise ConfigError(f"quantize needs a Pretrained, EncoderModel or Encoder, got {type(model).__name__}")
    _check_int_mm()
    if not inplace:
        model = copy.deepcopy(model)
    model.eval()
    with torch.no_grad():
        for module in model.modules():
            if not isinstance(module, EncoderLayer):
                continue
            for name in LAYER_LINEARS:
                linear = getattr(module, name)
                # Only nn.Linear itself: a subclass or a wrapper (LoRA) computes something else from its weight.
                if type(linear) is nn.Linear:
                    setattr(module, name, Int8Linear.from_linear(linear))
    return model


def _check_int_mm() -> None:
    """torch._int_mm runs on CPU from torch 2.3 on; name the version instead of failing at the first forward."""
    try:
        torch._int_mm(torch.ones(1, 8, dtype=torch.int8), torch.ones(8, 8, dtype=torch.int8))
    except (AttributeError, RuntimeError, NotImplementedError) as error:
        raise ConfigError(f"int8 needs torch >= 2.3 (an int8 matmul on CPU, torch._int_mm); this is torch "
                          f"{torch.__version__}: {error}") from None


@functools.cache
def int_mm_saturates() -> bool:
    """True when `torch._int_mm` on CPU is inexact for int8 operands of full range (oneDNN without AVX512-VNNI sums
    pairs of byte products in saturating 16 bits): probed once with extreme rows against an exact int64 product."""
    a = torch.tensor([[127] * 16, [-128] * 16, [127, -128] * 8, [-128, 127] * 8] * 2, dtype=torch.int8)
    b = torch.tensor([[127] * 16, [-127] * 16, [127, -127] * 8, [-127, 127] * 8] * 2, dtype=torch.int8)
    return not torch.equal(torch._int_mm(a, b.t()).long(), a.long() @ b.long().t())


def is_quantized(model: Pretrained | nn.Module) -> bool:
    """True when some module of `model` is an `Int8Linear`."""
    module = model.model if isinstance(model, Pretrained) else model
    return any(isinstance(m, Int8Linear) for m in module.modules())


def check_dtype(dtype: str) -> str:
    """`dtype` normalised ("fp32" -> "float32"), or a ConfigError naming the choices."""
    name = {"fp32": "float32"}.get(dtype, dtype)
    if name not in DTYPES:
        raise ConfigError(f"dtype: unknown {dtype!r}; expected one of {', '.join(DTYPES)}")
    return name


def with_dtype(model: Quantizable, dtype: str) -> Quantizable:
    """`model` itself for "float32", its int8 copy (`quantize`) for "int8": what `--dtype` does in the CLI."""
    return quantize(model) if check_dtype(dtype) == "int8" else model
