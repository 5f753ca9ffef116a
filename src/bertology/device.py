"""Where a model runs: one convention for every command and API that runs one.

- device: ``auto`` (``cuda:<local rank>`` when CUDA is available, else ``cpu``), ``cpu``, ``cuda`` (the local
  rank's GPU, 0 outside torchrun) or ``cuda:N``. Anything else, and a CUDA device on a machine without one (or
  past its GPU count), is a `ConfigError` naming the option (``--device`` in the CLI, ``speed.device`` in a run
  config, ``device`` in the Python API).
- dtype: ``float32``; ``float16`` or ``bfloat16`` (GPU only: the forward runs under ``torch.autocast`` in that
  type, the weights stay float32 and the outputs come back as float32 on the CPU); ``int8`` where a command already
  has it (``bertology.model.quantize``, CPU only: ``auto`` then means the CPU).

The Python APIs take ``device=None`` (leave the model where it is) and ``dtype="float32"``; `place` moves the model
there (in place, as ``nn.Module.to`` does) and returns the `Placement`, whose `autocast()` wraps the forwards.
Autocast is per thread, so an API that runs its forwards on another thread (the service's worker) enters it there.
The CLI adds both options to a command with `add_device_arguments` and reads them with `placement_from_args`.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from bertology.errors import ConfigError

FLOAT_DTYPES: tuple[str, ...] = ("float32", "float16", "bfloat16")
HALF_DTYPES: dict[str, torch.dtype] = {"float16": torch.float16, "bfloat16": torch.bfloat16}
DEVICE_FORMS = "auto, cpu, cuda or cuda:N"


def resolve_device(value: str | torch.device | None = "auto", *, option: str = "device",
                   local_rank: int = 0) -> torch.device:
    """The torch device `value` names (see the module docstring); ``None`` counts as ``auto``."""
    if value is None or (isinstance(value, str) and value.strip() == "auto"):
        return torch.device(f"cuda:{local_rank}" if torch.cuda.is_available() else "cpu")
    if isinstance(value, str):
        if not value.strip():
            raise ConfigError(f"{option}: must not be empty ({DEVICE_FORMS})")
        try:
            device = torch.device(value.strip())
        except (RuntimeError, ValueError):
            raise ConfigError(f"{option}: {value!r} is not a device; expected {DEVICE_FORMS}") from None
    elif isinstance(value, torch.device):
        device = value
    else:
        raise ConfigError(f"{option}: expected a device name ({DEVICE_FORMS}), got {type(value).__name__}")
    if device.type not in ("cpu", "cuda"):
        raise ConfigError(f"{option}: {str(value)!r} is not a device bertology runs on; expected {DEVICE_FORMS}")
    if device.type == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise ConfigError(f"{option}: {str(value)!r} asked for, but CUDA is not available on this machine "
                          f"(use cpu or auto)")
    if device.index is None:
        return torch.device(f"cuda:{local_rank}")
    count = torch.cuda.device_count()
    if device.index >= count:
        raise ConfigError(f"{option}: {str(value)!r} asked for, but this machine has {count} GPU"
                          f"{'' if count == 1 else 's'} (cuda:0 to cuda:{count - 1})")
    return device


def resolve_dtype(value: str, device: torch.device, *, option: str = "dtype", int8: bool = False) -> str:
    """`value` checked against the choices (with ``int8`` where the caller has that path) and the device."""
    choices = FLOAT_DTYPES + (("int8",) if int8 else ())
    if value not in choices:
        raise ConfigError(f"{option}: unknown {value!r}; expected one of {', '.join(choices)}")
    if value in HALF_DTYPES and device.type != "cuda":
        raise ConfigError(f"{option} {value}: half precision runs on a GPU only, and this runs on {device} "
                          f"(use float32, or a CUDA device)")
    if value == "int8" and device.type != "cpu":
        raise ConfigError(f"{option} int8: the int8 path runs on the CPU only, and this runs on {device} "
                          f"(use cpu, or float16/bfloat16 on a GPU)")
    return value


@dataclass(frozen=True)
class Placement:
    """A resolved device and dtype (see the module docstring)."""

    device: torch.device = torch.device("cpu")
    dtype: str = "float32"

    @property
    def autocast_dtype(self) -> torch.dtype | None:
        """The half type the forwards run in, None for float32 (and int8, whose modules choose their own)."""
        return HALF_DTYPES.get(self.dtype)

    def autocast(self) -> contextlib.AbstractContextManager:
        """``torch.autocast`` in the half type on this device; a context that does nothing for float32 and int8
        (so an enclosing autocast, if any, stays in force)."""
        half = self.autocast_dtype
        return torch.autocast(self.device.type, dtype=half) if half is not None else contextlib.nullcontext()

    @property
    def float_dtype(self) -> str:
        """The dtype the float APIs (`embed`, ...) take: this one, or float32 for int8 (the model is quantized
        before it is handed to them, so they run it as it is)."""
        return "float32" if self.dtype == "int8" else self.dtype

    def move(self, model: Any) -> Any:
        """`model` (a `Pretrained`, an ``nn.Module``, or a `Backbone` that is a module) moved to the device, in
        place; returned for chaining."""
        module = module_of(model)
        if module is not None and any(t.device != self.device for t in itertools.chain(module.parameters(),
                                                                                         module.buffers())):
            module.to(self.device)  # only when something is elsewhere: `to` rewrites every parameter's data
        return model

    def inputs(self, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """`tensors` on the device (without a copy when they are there already)."""
        return tuple(t.to(self.device) for t in tensors)


def module_of(model: Any) -> nn.Module | None:
    """The module that holds `model`'s weights: a `Pretrained`'s model, a module itself, else None."""
    inner = getattr(model, "model", None)
    if isinstance(inner, nn.Module) and not isinstance(model, nn.Module):
        return inner  # a Pretrained (or anything else that carries its model)
    return model if isinstance(model, nn.Module) else None


def model_device(model: Any) -> torch.device:
    """Where `model`'s first parameter or buffer lives (the CPU for a model without either)."""
    module = module_of(model)
    if module is not None:
        for tensor in module.parameters():
            return tensor.device
        for tensor in module.buffers():
            return tensor.device
    return torch.device("cpu")


def placement(device: str | torch.device | None = "auto", dtype: str = "float32", *, device_option: str = "device",
              dtype_option: str = "dtype", int8: bool = False, current: torch.device | None = None) -> Placement:
    """Resolve `device` and `dtype` together. ``device=None`` means `current` (where the model already is; the
    CPU when not given). With ``dtype="int8"``, ``auto`` means the CPU (the int8 path's only device)."""
    if device is None:
        resolved = current if current is not None else torch.device("cpu")
    elif dtype == "int8" and int8 and isinstance(device, str) and device.strip() == "auto":
        resolved = torch.device("cpu")
    else:
        resolved = resolve_device(device, option=device_option)
    return Placement(resolved, resolve_dtype(dtype, resolved, option=dtype_option, int8=int8))


def place(model: Any, device: str | torch.device | None = None, dtype: str = "float32", *,
          device_option: str = "device", dtype_option: str = "dtype", int8: bool = False) -> Placement:
    """Resolve `device` (None: where `model` is) and `dtype`, move `model` there (in place) and return the
    `Placement` whose `autocast()` the forwards run under. A `model` without weights of its own (a `Backbone` that
    is not a module) stays as it is and must run where `device` says; then `device` must be None or its device."""
    result = placement(device, dtype, device_option=device_option, dtype_option=dtype_option, int8=int8,
                       current=model_device(model))
    if module_of(model) is None and device is not None and result.device != torch.device("cpu"):
        raise ConfigError(f"{device_option}: {type(model).__name__} is not a torch module, so it cannot be moved "
                          f"to {result.device}; place it there yourself and pass device=None")
    result.move(model)
    return result


@contextlib.contextmanager
def running(model: Any, device: str | torch.device | None = None, dtype: str = "float32", **options: Any
            ) -> Iterator[Placement]:
    """`place(model, device, dtype)`, then the block under the placement's autocast."""
    where = place(model, device, dtype, **options)
    with where.autocast():
        yield where


def to_cpu(tensor: torch.Tensor) -> torch.Tensor:
    """`tensor` on the CPU, half floats as float32 (what the APIs return whatever the device and dtype)."""
    if tensor.is_floating_point() and tensor.dtype in (torch.float16, torch.bfloat16):
        tensor = tensor.float()
    return tensor.cpu()


# ------------------------------------------------------------------------------------------------------ the CLI


def add_device_arguments(parser: argparse.ArgumentParser, *, int8: bool = False, int8_help: str = "") -> None:
    """The --device and --dtype options of a command that runs a model (``int8``: the command has the int8
    path of `bertology.model.quantize` too)."""
    parser.add_argument("--device", default="auto", metavar="DEVICE",
                        help="where the model runs: auto (a GPU when there is one, else the CPU), cpu, cuda or "
                        "cuda:N (default: auto)")
    choices = FLOAT_DTYPES + (("int8",) if int8 else ())
    parser.add_argument("--dtype", choices=choices, default="float32",
                        help="float32; float16 or bfloat16 (on a GPU: the forward under autocast in that type, "
                        "results close to float32's)"
                        + (f"; int8: {int8_help or 'int8 weights'}, on the CPU only (where auto then runs)"
                           if int8 else "")
                        + " (default: float32)")


def placement_from_args(args: argparse.Namespace, *, int8: bool = False) -> Placement:
    """The `Placement` of the options `add_device_arguments` added, errors naming --device and --dtype."""
    return placement(args.device, args.dtype, device_option="--device", dtype_option="--dtype", int8=int8)


def device_options(args: argparse.Namespace) -> dict[str, Any]:
    """``device=`` and ``dtype=`` for an API call, from the options `add_device_arguments` added (resolved, so a
    bad one fails as the call's arguments are evaluated, before the call does any work)."""
    where = placement_from_args(args)
    return {"device": where.device, "dtype": where.dtype}
