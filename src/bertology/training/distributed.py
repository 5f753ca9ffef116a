"""Processes and devices: torchrun's environment, the process group (gloo on CPU, NCCL on CUDA), DDP or FSDP
wrapping, and the few collectives the trainer needs. Without torchrun everything degrades to one process."""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from bertology.device import resolve_device
from bertology.errors import ConfigError
from bertology.training.config import SpeedConfig


@dataclass(frozen=True)
class DistEnv:
    """This process's place: ``rank`` of ``world_size``, ``local_rank`` on its machine, and its device."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1
    device: torch.device = torch.device("cpu")

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def _env_int(name: str, default: int) -> int:
    text = os.environ.get(name)
    if text is None:
        return default
    try:
        return int(text)
    except ValueError:
        raise ConfigError(f"environment variable {name}={text!r} is not an integer") from None


def init_distributed(speed: SpeedConfig) -> DistEnv:
    """Read torchrun's RANK / WORLD_SIZE / LOCAL_RANK, pick the device, and join the process group."""
    rank, world = _env_int("RANK", 0), _env_int("WORLD_SIZE", 1)
    local_rank, local_world = _env_int("LOCAL_RANK", 0), _env_int("LOCAL_WORLD_SIZE", world)
    device = resolve_device(speed.device, option="speed.device", local_rank=local_rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if world > 1 and not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend=backend, rank=rank, world_size=world,
                                device_id=device if device.type == "cuda" else None)
    return DistEnv(rank, world, local_rank, local_world, device)


def shutdown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def wrap(module: nn.Module, env: DistEnv, fsdp: bool) -> nn.Module:
    """DDP (or FSDP with ``fsdp``) over ``module`` when there are several processes; the module itself otherwise."""
    if not env.distributed:
        return module
    device_ids = [env.device.index] if env.device.type == "cuda" else None
    if fsdp:
        from torch.distributed.fsdp import FullyShardedDataParallel

        return FullyShardedDataParallel(module, use_orig_params=True,
                                        device_id=env.device if env.device.type == "cuda" else None)
    return nn.parallel.DistributedDataParallel(module, device_ids=device_ids, broadcast_buffers=False)


def no_sync(wrapped: nn.Module, skip: bool) -> contextlib.AbstractContextManager:
    """Skip the gradient all-reduce for an accumulation micro-step that is not the last one."""
    if skip and hasattr(wrapped, "no_sync"):
        return wrapped.no_sync()
    return contextlib.nullcontext()


def all_reduce_sum(tensor: torch.Tensor, env: DistEnv) -> torch.Tensor:
    """Sum ``tensor`` over ranks in place (a no-op on one process)."""
    if env.distributed:
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor


def all_gather_objects(obj: Any, env: DistEnv) -> list[Any]:
    if not env.distributed:
        return [obj]
    out: list[Any] = [None] * env.world_size
    dist.all_gather_object(out, obj)
    return out


def barrier(env: DistEnv) -> None:
    if env.distributed:
        dist.barrier()


def full_state_dict(wrapped: nn.Module, inner: nn.Module, fsdp: bool) -> dict[str, torch.Tensor]:
    """The complete, unsharded state of ``inner`` (on CPU under FSDP, where every rank must call this)."""
    if not fsdp or wrapped is inner:
        return inner.state_dict()
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(wrapped, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def optimizer_state(wrapped: nn.Module, optimizer: torch.optim.Optimizer, fsdp: bool) -> dict[str, Any]:
    if not fsdp:
        return optimizer.state_dict()
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    return get_optimizer_state_dict(wrapped, optimizer,
                                    options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def load_optimizer_state(wrapped: nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any],
                         fsdp: bool) -> None:
    if not fsdp:
        optimizer.load_state_dict(state)
        return
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    set_optimizer_state_dict(wrapped, optimizer, state, options=StateDictOptions(full_state_dict=True))


def load_full_state_dict(wrapped: nn.Module, inner: nn.Module, state: dict[str, torch.Tensor], fsdp: bool) -> None:
    if not fsdp or wrapped is inner:
        inner.load_state_dict(state)
        return
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    set_model_state_dict(wrapped, state, options=StateDictOptions(full_state_dict=True))


def default_threads(env: DistEnv) -> int:
    """The machine's cores shared among the processes running on it."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cores // max(1, env.local_world_size))
