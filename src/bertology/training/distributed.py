"""Processes and devices: torchrun's environment, the process group (gloo on CPU, NCCL on CUDA), DDP or FSDP2
wrapping (``fully_shard`` per transformer block, then the root), activation checkpointing per block, and the few
collectives the trainer needs. Without torchrun everything degrades to one process (FSDP2 then runs on a private
one-process group)."""

from __future__ import annotations

import contextlib
import os
import types
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn

from bertology.device import resolve_device
from bertology.errors import ConfigError
from bertology.training.config import SpeedConfig

if TYPE_CHECKING:
    from bertology.model.encoder import HeadSpec


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


def transformer_blocks(module: nn.Module) -> list[nn.Module]:
    """The transformer blocks under ``module`` (every `bertology.model.blocks.Block`, of any model: the model's and
    those of models an objective owns, ELECTRA's generator): the units FSDP shards one by one and activation
    checkpointing recomputes, except a block run more than once per forward (ALBERT's shared layers), which stays
    with the root unit. This is the one place that knows where blocks live."""
    from bertology.model.base import BaseModel
    from bertology.model.blocks import Block

    reused = {id(layer) for child in module.modules() if isinstance(child, BaseModel)
              for layer in child.reused_blocks()}
    return [child for child in module.modules() if isinstance(child, Block) and id(child) not in reused]


def _checkpointed_forward(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
    from torch.utils.checkpoint import checkpoint

    forward = type(self).forward
    if not torch.is_grad_enabled():  # evaluation: nothing to save, nothing to recompute
        return forward(self, *args, **kwargs)
    return checkpoint(forward, self, *args, use_reentrant=False, **kwargs)


def checkpoint_activations(block: nn.Module) -> None:
    """Keep only ``block``'s inputs in the forward and recompute its activations in the backward (non-reentrant
    ``torch.utils.checkpoint``, which replays the random state: dropout draws the same masks, and the gradients are
    those of the plain forward). The module and its parameter names stay as they are; a copy of the module
    (``copy.deepcopy``) checkpoints itself."""
    block.forward = types.MethodType(_checkpointed_forward, block)  # type: ignore[method-assign]


def _process_group_for(env: DistEnv) -> None:
    """FSDP needs a process group, also for one process: a private one-process group when torchrun started none."""
    if dist.is_initialized():
        return
    backend = "nccl" if env.device.type == "cuda" else "gloo"
    dist.init_process_group(backend=backend, store=dist.HashStore(), rank=0, world_size=1,
                            device_id=env.device if env.device.type == "cuda" else None)


def wrap(module: nn.Module, env: DistEnv, fsdp: bool, activation_checkpointing: bool = False) -> nn.Module:
    """``module`` ready to train: its blocks checkpointed with ``activation_checkpointing``; then with ``fsdp``
    FSDP2 (``fully_shard``) on every transformer block and on the root (any number of processes, one included),
    else DDP over several processes, else the module itself. FSDP2 shards in place: the result is ``module``."""
    if activation_checkpointing:
        for block in transformer_blocks(module):
            checkpoint_activations(block)
    if fsdp:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        _process_group_for(env)
        mesh = init_device_mesh(env.device.type, (env.world_size,))
        for block in transformer_blocks(module):
            fully_shard(block, mesh=mesh)
        fully_shard(module, mesh=mesh)
        return module
    if not env.distributed:
        return module
    device_ids = [env.device.index] if env.device.type == "cuda" else None
    return nn.parallel.DistributedDataParallel(module, device_ids=device_ids, broadcast_buffers=False)


def is_sharded(module: nn.Module) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(module, FSDPModule)


@contextlib.contextmanager
def no_sync(wrapped: nn.Module, skip: bool) -> Iterator[None]:
    """Skip the gradient reduction for an accumulation micro-step that is not the last one (DDP's ``no_sync``,
    FSDP2's ``set_requires_gradient_sync``)."""
    if not skip:
        yield
    elif is_sharded(wrapped):
        wrapped.set_requires_gradient_sync(False)  # type: ignore[operator]
        try:
            yield
        finally:
            wrapped.set_requires_gradient_sync(True)  # type: ignore[operator]
    elif hasattr(wrapped, "no_sync"):
        with wrapped.no_sync():  # type: ignore[operator]
            yield
    else:
        yield


def local(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's part of a sharded tensor (a DTensor under FSDP2); the tensor itself otherwise."""
    from torch.distributed.tensor import DTensor

    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def replicated(tensor: torch.Tensor) -> torch.Tensor:
    """A plain tensor from a replicated DTensor (FSDP2's gradient norm); the tensor itself otherwise."""
    from torch.distributed.tensor import DTensor

    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


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


def full_state_dict(module: nn.Module, fsdp: bool) -> dict[str, torch.Tensor]:
    """The complete, unsharded state of ``module``. Under FSDP every rank must call this; rank 0 receives it (on
    CPU) and the others an empty dict."""
    if not fsdp:
        return module.state_dict()
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(module, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def optimizer_state(wrapped: nn.Module, optimizer: torch.optim.Optimizer, fsdp: bool) -> dict[str, Any]:
    """The optimizer's whole state in ``optimizer.state_dict()``'s form (parameters numbered in the optimizer's
    order), so that a checkpoint is the same with FSDP or without and resumes either way. Under FSDP every rank must
    call this; rank 0 receives the state (on CPU), the others an empty one."""
    if not fsdp:
        return optimizer.state_dict()
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    named = get_optimizer_state_dict(wrapped, optimizer,
                                     options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if not named:
        return {}
    order = {name: i for i, name in enumerate(n for group in named["param_groups"] for n in group["params"])}
    return {"state": {order[name]: value for name, value in named["state"].items()},
            "param_groups": [{**group, "params": [order[n] for n in group["params"]]}
                             for group in named["param_groups"]]}


def load_optimizer_state(wrapped: nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any],
                         fsdp: bool) -> None:
    """Load ``optimizer_state``'s form (every rank gives the whole state; FSDP keeps each rank's shard)."""
    if not fsdp:
        optimizer.load_state_dict(state)
        return
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    names = {id(p): name for name, p in wrapped.named_parameters()}
    order = [names[id(p)] for group in optimizer.param_groups for p in group["params"]]
    named = {"state": {order[int(i)]: value for i, value in state["state"].items()},
             "param_groups": [{**group, "params": [order[int(i)] for i in group["params"]]}
                              for group in state["param_groups"]]}
    set_optimizer_state_dict(wrapped, optimizer, named, options=StateDictOptions(full_state_dict=True))


def load_full_state_dict(module: nn.Module, state: dict[str, torch.Tensor], fsdp: bool) -> None:
    """Load a complete state into ``module`` (every rank gives the whole state; FSDP keeps each rank's shard)."""
    if not fsdp:
        module.load_state_dict(state)
        return
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    set_model_state_dict(module, state, options=StateDictOptions(full_state_dict=True))


def initialised_model(config: Any, heads: Sequence[HeadSpec], seed: int, meta_init: bool = False,
                      cls: type | None = None) -> Any:
    """``cls(config, heads)`` initialised by ``init_weights`` from a generator seeded with ``seed``. Without
    ``cls``: an ``EncoderModel``, or the registered encoder class whose config class ``config`` is (a
    ``LongformerModel`` for a ``LongformerConfig``); a decoder's class comes with its TransformerConfig.

    With ``meta_init`` the modules are built on the meta device (no memory, none of torch's default
    initialisation) and materialised on the CPU (``to_empty``) before ``init_weights``, which sets every parameter:
    the same weights, bit for bit, without initialising twice. Neither way draws from torch's default generator,
    so what a run draws later (dropout) does not depend on the choice."""
    from bertology.model.protocol import ENCODER, capabilities
    from bertology.model.registry import MODELS, model_class

    cls = cls or next((entry.cls for entry in MODELS.values() if entry.config_class is type(config)
                       and ENCODER in capabilities(entry.cls)), model_class("encoder"))
    if meta_init:
        with torch.device("meta"):
            model = cls(config, heads)
        model.to_empty(device="cpu")
    else:
        with torch.random.fork_rng(devices=[]):
            model = cls(config, heads)
    model.init_weights(torch.Generator().manual_seed(seed))
    return model


def default_threads(env: DistEnv) -> int:
    """The machine's cores shared among the processes running on it."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cores // max(1, env.local_world_size))
