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
from typing import TypeVar

import torch
from torch import nn

from bertology.errors import ConfigError
from bertology.model.checkpoint import Pretrained
from bertology.model.encoder import Encoder, EncoderLayer, EncoderModel
from bertology.model.int8 import Int8Linear, int_mm_saturates, is_quantized

__all__ = ["DTYPES", "Int8Linear", "check_dtype", "int_mm_saturates", "is_quantized", "quantize", "with_dtype"]

DTYPES: tuple[str, ...] = ("float32", "int8")
# The linear maps of an encoder layer that are quantized (EncoderLayer's attribute names).
LAYER_LINEARS: tuple[str, ...] = ("query", "key", "value", "attn_out", "ffn_in", "ffn_out")

Quantizable = TypeVar("Quantizable", Pretrained, EncoderModel, Encoder)


def quantize(model: Quantizable, *, inplace: bool = False) -> Quantizable:
    """`model` (a `Pretrained`, `EncoderModel` or `Encoder`) with its encoder layers' plain `nn.Linear` maps replaced
    by `Int8Linear`, in eval mode. A copy unless `inplace`; a `Pretrained` keeps its tokenizer."""
    if isinstance(model, Pretrained):
        inner = quantize(model.model, inplace=inplace)
        return model if inplace else Pretrained(model=inner, tokenizer=model.tokenizer, directory=model.directory)
    if not isinstance(model, (EncoderModel, Encoder)):
        raise ConfigError(f"quantize needs a Pretrained, EncoderModel or Encoder, got {type(model).__name__}")
    if not model.config.stack_embeddings:
        raise ConfigError(f"quantize needs a BERT-family encoder (its stack's own embeddings); this is a "
                          f"{model.config.family} model")
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


def check_dtype(dtype: str) -> str:
    """`dtype` normalised ("fp32" -> "float32"), or a ConfigError naming the choices."""
    name = {"fp32": "float32"}.get(dtype, dtype)
    if name not in DTYPES:
        raise ConfigError(f"dtype: unknown {dtype!r}; expected one of {', '.join(DTYPES)}")
    return name


def with_dtype(model: Quantizable, dtype: str) -> Quantizable:
    """`model` itself for "float32", its int8 copy (`quantize`) for "int8": what `--dtype` does in the CLI."""
    return quantize(model) if check_dtype(dtype) == "int8" else model
