"""The training loop shared by pretraining and fine-tuning: gradient accumulation, clipping, AdamW with warm-up and
decay, optional bf16 autocast, DDP/FSDP, held-out evaluation, JSONL metrics, atomic checkpoints, exact resumption.

What it trains is given, not built here: a model, objectives (``bertology.objectives``: MLM, NSP, a task's loss)
and a ``BatchSource``. Extension points: ``evaluators`` add metrics at each evaluation (a task's F1, say), ``hooks``
see every step. Which steps log, evaluate and checkpoint is a ``Schedule``.

Exactness: every batch is a pure function of (epoch, batch index, rank, world size), the losses are normalised by
the unit count of the whole effective batch, and a checkpoint holds the weights, optimizer, scheduler, every RNG
state and the data position. A run resumed from step k therefore continues with the same updates as a run never
interrupted (bitwise on CPU with the same thread count).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import torch
from torch import Tensor
from tqdm import tqdm

from bertology import faults
from bertology.errors import CheckpointError, ConfigError, TrainingError
from bertology.io import atomic_write, check_links, remove_output
from bertology.model.blocks import compile_blocks
from bertology.model.packing import Layout
from bertology.model.protocol import Model
from bertology.objectives.base import FINAL_MODEL_DIR, Batch, Objective
from bertology.objectives.compose import TrainingLoss, stats_to_vector
from bertology.prefetch import prefetched
from bertology.training import distributed as D
from bertology.training.checkpoint import (
    CHECKPOINTS_DIR,
    TrainingState,
    capture_rng,
    latest_checkpoint,
    prune_checkpoints,
    read_checkpoint,
    restore_rng,
    save_checkpoint,
)
from bertology.training.config import OptimConfig, RunConfig, SpeedConfig
from bertology.training.graphs import CapturedSteps, check_static_objectives, static_batch
from bertology.training.optim import build_optimizer, build_scheduler, restrict_training

if TYPE_CHECKING:
    from bertology.tokenization import Tokenizer

METRICS_FILE = "metrics.jsonl"
PLOT_FILE = "curves.png"
RUN_CONFIG_FILE = "run_config.json"
# What a run writes in its output directory (the tokenizer and shards a pretraining run prepares there are inputs,
# reused by later runs, and not listed).
RUN_OUTPUTS = (METRICS_FILE, CHECKPOINTS_DIR, FINAL_MODEL_DIR, PLOT_FILE, RUN_CONFIG_FILE)
# Steps between two readings of the device's "a step was not finite" flag when nothing is logged or saved.
CHECK_EVERY = 100

# Settings that may differ between a checkpoint and the run that resumes it: they change how the run is watched,
# how fast it goes or how long it lasts, never what a step computes. ``optim.total_steps`` extends (or shortens) a
# run; with a decaying schedule the remaining steps follow the new length.
MAY_CHANGE_ON_RESUME = (
    "speed.",
    "run.output_dir",
    "run.log_every",
    "run.eval_every",
    "run.eval_at_start",
    "run.eval_batches",
    "run.checkpoint_every",
    "run.keep_last",
    "run.keep_checkpoint",  # fine-tuning: whether a finished run keeps its last checkpoint
    "run.plot",
    "run.progress",
    "optim.total_steps",
)


class TrainerConfig(Protocol):
    """The sections of a run config the trainer reads (``PretrainConfig`` has them, and so will a fine-tuning
    config); ``to_dict`` is recorded with the run and compared on resume."""

    optim: OptimConfig
    run: RunConfig
    speed: SpeedConfig

    def to_dict(self) -> dict[str, Any]: ...


class BatchSource(Protocol):
    """Deterministic batches: the same (epoch, start_batch, rank, world_size) always gives the same batches."""

    def num_batches(self, epoch: int, batch_size: int, rank: int = 0, world_size: int = 1,
                    drop_last: bool = True) -> int: ...

    def batches(self, epoch: int, batch_size: int, start_batch: int = 0, rank: int = 0, world_size: int = 1,
                drop_last: bool = True) -> Iterator[Batch]: ...


@dataclass
class StepReport:
    """What hooks see after each optimizer step: the step, the data position after it, the instances it used."""

    step: int
    epoch: int
    batch: int
    instance_ids: list[Tensor] = field(default_factory=list)
    metrics: dict[str, float] | None = None  # set on log steps


Hook = Callable[["Trainer", StepReport], None]
# Extra held-out metrics at each evaluation, e.g. a task's official score; runs on every rank.
Evaluator = Callable[["Trainer"], Mapping[str, float]]


@dataclass(frozen=True)
class Schedule:
    """Which optimizer steps log, evaluate and checkpoint: every ``*_every`` steps (0: never before the end) and
    always at the last step (evaluation only when there is held-out data)."""

    total_steps: int
    log_every: int = 0
    eval_every: int = 0
    checkpoint_every: int = 0
    evaluate: bool = True

    @classmethod
    def from_config(cls, optim: OptimConfig, run: RunConfig, evaluate: bool) -> Schedule:
        return cls(optim.total_steps, run.log_every, run.eval_every, run.checkpoint_every, evaluate)

    def events(self, step: int) -> tuple[str, ...]:
        """The events due after ``step``, in the order they run: "log", "eval", "checkpoint"."""
        final = step == self.total_steps

        def due(every: int) -> bool:
            return final or (every > 0 and step % every == 0)

        return tuple(name for name, on in (("log", self.log_every > 0 and due(self.log_every)),
                                           ("eval", self.evaluate and due(self.eval_every)),
                                           ("checkpoint", due(self.checkpoint_every))) if on)


def check_output_dir(output_dir: str | os.PathLike, resume: bool, overwrite: bool,
                     outputs: tuple[str, ...] = ()) -> list[Path]:
    """Refuse to start a fresh run where an earlier run's outputs are, unless ``resume`` or ``overwrite``; with
    ``overwrite`` (and no ``resume``) those outputs are removed (a link itself, never what it points to). An
    output (the run's, and the caller's `outputs`) that is a link leading out of the directory is refused.
    Returns what was there. Call before any work."""
    output_dir = Path(output_dir)
    if output_dir.exists() and not output_dir.is_dir():
        raise ConfigError(f"run.output_dir: {output_dir} exists and is not a directory")
    check_links(output_dir, (*RUN_OUTPUTS, *outputs), flag="run.output_dir:")
    found = [output_dir / name for name in RUN_OUTPUTS if os.path.lexists(output_dir / name)]
    if not found or resume:
        return found
    if not overwrite:
        shown = ", ".join(p.name + ("/" if p.is_dir() else "") for p in found)
        raise TrainingError(f"run.output_dir: {output_dir} already holds a run ({shown}); pass --resume to continue "
                            "it, --overwrite to replace it, or choose another run.output_dir")
    for path in found:
        remove_output(path)
    return found


class Trainer:
    """Trains ``model`` on ``objectives`` over ``train_data``; ``eval_data`` (held-out) is evaluated on schedule.

    Only rank 0 writes files. ``hooks`` run on every rank after every optimizer step; ``evaluators`` add metrics to
    every evaluation (with ``eval_data`` or without).
    """

    def __init__(self, config: TrainerConfig, model: Model, objectives: Sequence[Objective],
                 train_data: BatchSource, eval_data: BatchSource | None = None, tokenizer: Tokenizer | None = None,
                 env: D.DistEnv | None = None, hooks: Sequence[Hook] = (),
                 evaluators: Sequence[Evaluator] = ()) -> None:
        self.config = config
        self.env = env or D.DistEnv()
        self.tokenizer = tokenizer
        self.train_data = train_data
        self.eval_data = eval_data
        self.hooks = list(hooks)
        self.evaluators = list(evaluators)
        self.output_dir = Path(config.run.output_dir)
        self.metrics_path = self.output_dir / METRICS_FILE
        speed = config.speed
        self.device = self.env.device
        self.loss_module = TrainingLoss(model, objectives).to(self.device)
        self.model = model
        # optim.train_only: freeze the rest before the module is wrapped and the optimizer built
        restrict_training(self.loss_module, config.optim.train_only)
        if speed.compile:
            compile_blocks(model.blocks())
        self.wrapped = D.wrap(self.loss_module, self.env, speed.fsdp, speed.activation_checkpointing)
        self.fsdp = speed.fsdp
        # The token table as the wrapped module holds it (FSDP2 puts sharded parameters in the modules' place).
        table = model.word_embeddings.weight if config.optim.embedding_lr_scale not in (None, 1.0) else None
        self.optimizer = build_optimizer(self.wrapped, config.optim, speed.fused_optimizer, table)
        self.graphs = self._captured_steps(speed)
        # With the fused AdamW a step whose loss or gradient is not finite is skipped on the device (the kernel's
        # found_inf), and the host reads that flag only at the next log, evaluation or checkpoint (see _guard):
        # no host synchronisation inside a step. Other optimizers read it after every step.
        self._skip_on_device = bool(self.optimizer.defaults.get("fused"))
        self._bad: Tensor | None = None  # bool, on the device: some step since the last check was not finite
        self._unchecked = False  # steps ran since the flag was last read
        self._bad_step: Tensor | None = None  # the first such step
        self._bad_stats: Tensor | None = None  # its stats and gradient norm, for the error
        self._bad_norm: Tensor | None = None
        self._pending_tokens: Tensor | None = None  # real tokens of this rank's steps not yet in state.tokens
        self.scheduler = build_scheduler(self.optimizer, config.optim)
        self.schedule = Schedule.from_config(config.optim, config.run,
                                             evaluate=eval_data is not None or bool(self.evaluators))
        self.state = TrainingState(config=config.to_dict())
        self.autocast_enabled = self._bf16(speed.bf16)
        self._stat_keys: list[str] | None = None
        self._resumed = False
        # The training metrics summed since the last "train" row, and their tokens: part of every checkpoint, so
        # the first row after a resume averages the same steps as an uninterrupted run's.
        self._window_stats: Tensor | None = None
        self._window_tokens: Tensor | int = 0
        self._stop_reason: str | None = None
        self.history: list[dict[str, Any]] = []

    def request_stop(self, reason: str) -> None:
        """End training after the current step's events (early stopping: an evaluator or hook calls this on every
        rank). The final model is written as at the last step."""
        self._stop_reason = reason

    @property
    def stop_reason(self) -> str | None:
        return self._stop_reason

    # ------------------------------------------------------------------------------------------------ set-up
    def _bf16(self, wanted: bool | None) -> bool:
        kind = self.device.type
        if wanted is None:  # auto: only where bf16 runs natively
            return kind == "cuda" and torch.cuda.is_bf16_supported()
        if wanted and kind == "cuda" and not torch.cuda.is_bf16_supported():
            raise ConfigError("speed.bf16: this GPU does not support bfloat16")
        return bool(wanted)

    def _captured_steps(self, speed: SpeedConfig) -> CapturedSteps | None:
        """CUDA graphs for the micro-steps where ``speed.cuda_graphs`` asks for them (True: or a ConfigError saying
        why not) or allows them (None: where they run)."""
        if speed.cuda_graphs is False:
            return None
        auto = speed.cuda_graphs is None
        excluded = [f"speed.{name}" for name in ("compile", "fsdp", "activation_checkpointing") if getattr(speed, name)]
        try:
            if self.device.type != "cuda":
                raise ConfigError(f"speed.cuda_graphs: needs a CUDA device; this run's is {self.device}")
            if self.env.distributed:
                raise ConfigError("speed.cuda_graphs: runs in one process; turn it off under torchrun")
            if excluded:
                raise ConfigError(f"speed.cuda_graphs: cannot be combined with {excluded[0]}; turn one off")
            check_static_objectives(self.loss_module.objectives)
        except ConfigError:
            if auto:
                return None
            raise
        self._graphs_auto = auto
        return CapturedSteps(self._micro_step, self.device)

    def _autocast(self) -> contextlib.AbstractContextManager:
        if not self.autocast_enabled:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=torch.bfloat16)

    # ------------------------------------------------------------------------------------------------ data
    def _stream(self, epoch: int, batch: int) -> Iterator[tuple[int, int, Batch]]:
        """Micro-batches from (epoch, batch) on, forever, each with its position."""
        size, env = self.config.optim.batch_size, self.env
        while True:
            if self.train_data.num_batches(epoch, size, env.rank, env.world_size) == 0:
                raise ConfigError(f"optim.batch_size: {size} x {env.world_size} process(es) is more than the "
                                  f"training examples of epoch {epoch}")
            for index, item in enumerate(self.train_data.batches(epoch, size, batch, env.rank, env.world_size),
                                         start=batch):
                yield epoch, index, item
            epoch, batch = epoch + 1, 0

    def _training_batch(self, batch: Batch) -> Batch:
        """A training micro-batch on the device: with CUDA graphs, given static shapes first (on the host)."""
        if self.graphs is None:
            return self._device_batch(batch)
        try:
            static = static_batch(batch, self.config.speed.graph_bucket,
                                  getattr(self.model.config, "max_length", batch.input_ids.shape[1]))
        except ConfigError:
            if not self._graphs_auto:
                raise
            self.graphs = None  # batches of another kind: the eager step, as speed.cuda_graphs auto allows
            return self._device_batch(batch)
        moved = self._device_batch(static)
        moved.layout.max_seqlen = moved.layout.seq_len  # a bound the kernels take as a constant of the graph
        return moved

    def _device_batch(self, batch: Batch) -> Batch:
        if self.device.type == "cpu":
            return batch
        moved = batch.to(self.device, non_blocking=True)
        # The batch's packings, worked out here on the host from the CPU masks (and packed documents): the model's
        # forward then never waits for the device to learn where the real tokens are. `decoder_layout`: an
        # encoder-decoder's decoder side.
        for name, mask_name, documents in (("layout", "attention_mask", getattr(batch, "documents", None)),
                                           ("decoder_layout", "decoder_attention_mask", None)):
            mask = getattr(batch, mask_name, None)
            if isinstance(mask, Tensor) and mask.device.type == "cpu":
                with contextlib.suppress(AttributeError):  # a batch type that takes no new attributes goes without
                    setattr(moved, name, Layout(mask, documents).to(self.device))
        return moved

    # ------------------------------------------------------------------------------------------------ training
    def train(self) -> dict[str, float]:
        """Run to ``optim.total_steps``; returns the last evaluation metrics (or the last training metrics).

        A run that already reached the last step (resumed from its final checkpoint) only writes its final model
        again: a kill during that write must not leave a finished run without one."""
        cfg = self.config
        total, accum = cfg.optim.total_steps, cfg.optim.grad_accumulation
        if self.state.step >= total:
            self._finish()
            return self._last_logged()
        if self.env.is_main:
            if not self._resumed and self.state.step == 0:
                check_output_dir(self.output_dir, resume=False, overwrite=False)
            self.output_dir.mkdir(parents=True, exist_ok=True)
            self._write_config()
        if self.state.step == 0 and cfg.run.eval_at_start and self.schedule.evaluate:
            self._log("eval", self.evaluate())  # the untrained baseline, so curves start where learning starts
        stream: Iterator = self._stream(self.state.epoch, self.state.batch)
        if cfg.speed.prefetch > 0:
            stream = prefetched(stream, cfg.speed.prefetch, name="batch-prefetch")
        self.wrapped.train()
        progress = tqdm(total=total, initial=self.state.step, unit="step", desc="training",
                        disable=not (cfg.run.progress and self.env.is_main), dynamic_ncols=True)
        window_start = time.perf_counter()
        last_metrics: dict[str, float] = {}
        try:
            while self.state.step < total:
                micro = [next(stream) for _ in range(accum)]
                batches = [self._training_batch(b) for _, _, b in micro]
                # Counted on the batches as read (host memory), summed as a tensor: read once per log.
                tokens = torch.stack([b.attention_mask.sum() for _, _, b in micro]).sum()
                step_stats, grad_norm = self._step(batches)
                self._pending_tokens = tokens if self._pending_tokens is None else self._pending_tokens + tokens
                self._window_stats = step_stats if self._window_stats is None else self._window_stats + step_stats
                self._window_tokens = self._window_tokens + tokens  # a device tensor after the first step
                epoch, index, _ = micro[-1]
                self.state.step += 1
                self.state.epoch, self.state.batch = epoch, index + 1
                progress.update(1)
                faults.point("step", str(self.state.step))  # updated, nothing logged or saved yet
                ids = [getattr(b, "instance_ids", None) for _, _, b in micro]
                report = StepReport(self.state.step, self.state.epoch, self.state.batch,
                                    [i for i in ids if i is not None])
                events = self.schedule.events(self.state.step)
                if events or self.state.step % CHECK_EVERY == 0:
                    self._settle()  # a skipped step stops the run before anything is logged or saved
                for event in events:
                    if event == "log":
                        elapsed = time.perf_counter() - window_start
                        metrics = self._reduce(self._window_stats)
                        metrics.update(lr=self.scheduler.get_last_lr()[0], grad_norm=float(grad_norm),
                                       tokens_per_s=int(self._window_tokens) * self.env.world_size / max(elapsed, 1e-9))
                        self._log("train", metrics)
                        progress.set_postfix(loss=f"{metrics['loss']:.4f}", tok_s=f"{metrics['tokens_per_s']:.0f}")
                        report.metrics = last_metrics = metrics
                        self._window_stats, self._window_tokens = None, 0
                    elif event == "eval":
                        last_metrics = self.evaluate()
                        self._log("eval", last_metrics)
                    elif event == "checkpoint":
                        self.save_checkpoint()
                    window_start = time.perf_counter()  # evaluation and checkpoints are not training throughput
                for hook in self.hooks:
                    hook(self, report)
                faults.point("step-done", str(self.state.step))
                if self._stop_reason is not None:
                    self._settle()
                    self._log("stop", {"reason": self._stop_reason})  # type: ignore[dict-item]
                    break
        finally:
            progress.close()
            if hasattr(stream, "close"):
                stream.close()
        self._finish()
        return last_metrics

    def _finish(self) -> None:
        self.save_final_model()  # every rank takes part (FSDP gathers the weights); rank 0 writes
        if self.env.is_main and self.config.run.plot and self.metrics_path.is_file():
            plot_metrics(self.metrics_path, self.output_dir / PLOT_FILE)
        D.barrier(self.env)

    def _step(self, batches: list[Batch]) -> tuple[Tensor, Tensor]:
        """One optimizer step over the micro-batches; returns the summed stats vector and the gradient norm.

        A non-finite loss or gradient stops the run before the update, so the weights and the last checkpoint stay
        as they were."""
        loss_module = self.loss_module
        units_local = [loss_module.units(b) for b in batches]
        names = list(units_local[0])
        units = torch.stack([sum(u[n].to(self.device, non_blocking=True) for u in units_local)
                             for n in names]).to(torch.float64)
        D.all_reduce_sum(units, self.env)
        # DDP and FSDP average gradients over ranks; dividing by units / world size makes the result the gradient
        # of the mean over the effective batch.
        divisor = (units / self.env.world_size).to(self.device, torch.float32)
        total_stats: Tensor | None = None
        last = len(batches) - 1
        for i, batch in enumerate(batches):
            with D.no_sync(self.wrapped, skip=(self.env.distributed or self.fsdp) and i < last):
                run = self.graphs if self.graphs is not None else self._micro_step
                vector = run(batch, divisor)
            total_stats = vector if total_stats is None else total_stats + vector
        assert total_stats is not None
        clip = self.config.optim.clip_norm
        max_norm = clip if clip is not None else math.inf  # inf: measure the norm, change nothing
        # Under FSDP2 the gradients are sharded DTensors; the norm is reduced over ranks and comes back replicated.
        grad_norm = D.replicated(torch.nn.utils.clip_grad_norm_(self.loss_module.parameters(), max_norm))
        self._guard(total_stats, grad_norm)
        self.optimizer.step()
        self.scheduler.step()
        # A captured step accumulates into the gradients it was recorded with: they are zeroed, not freed.
        self.optimizer.zero_grad(set_to_none=self.graphs is None)
        return total_stats, grad_norm.detach()

    def _micro_step(self, batch: Batch, divisor: Tensor) -> Tensor:
        """Forward and backward of one micro-batch (gradients accumulate); returns its stats vector. `divisor`:
        each objective's unit count over the effective batch, in ``loss_module.objectives`` order."""
        per_name = {o.name: divisor[i] for i, o in enumerate(self.loss_module.objectives)}
        with self._autocast():
            loss, stats = self.wrapped(batch, per_name)
        loss.backward()
        if self._stat_keys is None:
            self._stat_keys = sorted(stats)
        return stats_to_vector(stats, self._stat_keys)

    def _guard(self, stats: Tensor, grad_norm: Tensor) -> None:
        """Keep a step whose loss or gradient is not finite (on any rank) from changing the weights.

        With the fused optimizer the verdict stays on the device: the kernel skips the update (``found_inf``), and
        once a step was bad every later one is skipped too, until ``_settle`` reads the flag (at the next log,
        evaluation, checkpoint or every ``CHECK_EVERY`` steps) and stops the run naming the first bad step. Other
        optimizers read it here, before the update."""
        bad = (~torch.isfinite(stats).all() | ~torch.isfinite(grad_norm)).to(torch.float64).reshape(1)
        D.all_reduce_sum(bad, self.env)  # every rank skips and stops together
        now = bad[0] > 0
        step = self.state.step + 1
        if self._bad is None:
            self._bad = torch.zeros((), dtype=torch.bool, device=now.device)
            self._bad_step = torch.zeros((), dtype=torch.int64, device=now.device)
            self._bad_stats = torch.zeros_like(stats)
            self._bad_norm = torch.zeros((), dtype=grad_norm.dtype, device=grad_norm.device)
        first = now & ~self._bad
        self._bad_step = torch.where(first, step, self._bad_step)
        self._bad_stats = torch.where(first, stats, self._bad_stats)
        self._bad_norm = torch.where(first.to(grad_norm.device), grad_norm, self._bad_norm)
        self._bad = self._bad | now
        self._unchecked = True
        if self._skip_on_device:
            self.optimizer.found_inf = self._bad.to(torch.float32)  # type: ignore[attr-defined]
        else:
            self._raise_if_bad()

    def _raise_if_bad(self) -> None:
        """Stop with an error naming the first step whose loss or gradient was not finite, if there was one."""
        if not self._unchecked:
            return
        self._unchecked = False
        assert self._bad is not None
        if not bool(self._bad):
            return
        self.optimizer.zero_grad(set_to_none=True)
        assert self._stat_keys is not None and self._bad_stats is not None and self._bad_step is not None
        first = int(self._bad_step)
        losses = {k: v for k, v in zip(self._stat_keys, self._bad_stats.tolist()) if not math.isfinite(v)}
        what = (f"loss ({', '.join(f'{k} {v}' for k, v in losses.items())})" if losses
                else f"gradient (norm {float(self._bad_norm)})")  # type: ignore[arg-type]
        later = self.state.step
        after = f" (nor were steps {first + 1}-{later}, run before this check)" if later > first else ""
        checkpoint = latest_checkpoint(self.output_dir)
        raise TrainingError(
            f"step {first}: the {what} is not finite; the step was not applied{after} and the run stops. "
            f"Last checkpoint: {checkpoint if checkpoint is not None else 'none'}. Lower optim.lr, set "
            f"optim.clip_norm, or check the data.")

    def _settle(self) -> None:
        """The one host synchronisation of the steps since the last: stop if one was not finite, and add their
        tokens to ``state.tokens``."""
        self._raise_if_bad()
        if self._pending_tokens is not None:
            self.state.tokens += int(self._pending_tokens) * self.env.world_size  # ranks see similar batches
            self._pending_tokens = None

    def _reduce(self, vector: Tensor | None) -> dict[str, float]:
        """Stats summed over ranks, turned into the objectives' readable metrics."""
        assert vector is not None and self._stat_keys is not None
        vector = vector.clone()
        D.all_reduce_sum(vector, self.env)
        totals = dict(zip(self._stat_keys, vector.tolist()))
        return self.loss_module.summarize(totals)

    # ------------------------------------------------------------------------------------------------ evaluation
    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """The objectives' metrics on the held-out data (reduced over ranks), then every evaluator's."""
        metrics = self._evaluate_objectives() if self.eval_data is not None else {}
        for evaluator in self.evaluators:
            metrics.update(evaluator(self))
        if self.eval_data is None and not self.evaluators:
            raise ConfigError("no held-out data: set data.heldout_documents to evaluate")
        return metrics

    def _evaluate_objectives(self) -> dict[str, float]:
        assert self.eval_data is not None
        env, cfg = self.env, self.config
        # Under DDP the bare module runs evaluation, so ranks with different batch counts never wait on each
        # other; FSDP needs the wrapper (parameters are sharded) and so equal batch counts on every rank.
        module = self.wrapped if self.fsdp else self.loss_module
        sharded = self.fsdp and env.distributed
        module.eval()
        total: Tensor | None = None
        keys: list[str] | None = None
        try:
            batches = self.eval_data.batches(0, cfg.optim.batch_size, 0, env.rank, env.world_size,
                                             drop_last=sharded)
            for index, batch in enumerate(batches):
                if cfg.run.eval_batches is not None and index >= cfg.run.eval_batches:
                    break
                batch = self._device_batch(batch)
                units = {n: u.to(self.device, torch.float32) for n, u in self.loss_module.units(batch).items()}
                with self._autocast():
                    _, stats = module(batch, units)
                keys = keys or sorted(stats)
                vector = stats_to_vector(stats, keys)
                total = vector if total is None else total + vector
        finally:
            module.train()
        keys = keys or self._stat_keys
        if keys is None:  # no rank had a batch and no step ran: nothing to report
            return {}
        if total is None:
            total = torch.zeros(len(keys), dtype=torch.float64, device=self.device)
        D.all_reduce_sum(total, env)
        return self.loss_module.summarize(dict(zip(keys, total.tolist())))

    # ------------------------------------------------------------------------------------------------ output
    def _write_config(self) -> None:
        with atomic_write(self.output_dir / RUN_CONFIG_FILE, "w", encoding="utf-8") as handle:
            json.dump(self.config.to_dict(), handle, indent=2)
            handle.write("\n")

    def _log(self, kind: str, metrics: Mapping[str, Any]) -> None:
        if self._pending_tokens is not None:
            self._settle()
        record = {"kind": kind, "step": self.state.step, "epoch": self.state.epoch, "tokens": self.state.tokens,
                  **{k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in metrics.items()}}
        self.history.append(record)
        if not self.env.is_main:
            return
        self.output_dir.mkdir(parents=True, exist_ok=True)
        line = json.dumps(record) + "\n"
        # One write of one whole line, flushed and fsynced: a killed run leaves at most a torn last line.
        with open(self.metrics_path, "a", encoding="utf-8") as handle:
            handle.write(line)
            handle.flush()
            os.fsync(handle.fileno())

    def _last_logged(self) -> dict[str, float]:
        """The last evaluation (else training) metrics of this run, from memory or from its metrics file."""
        records = self.history or (read_metrics(self.metrics_path) if self.metrics_path.is_file() else [])
        for kind in ("eval", "train"):
            rows = [r for r in records if r.get("kind") == kind]
            if rows:
                return {k: v for k, v in rows[-1].items() if k not in ("kind", "step", "epoch", "tokens")}
        return {}

    def _trainer_state(self, objective_state: dict[str, Tensor] | None) -> dict[str, Any]:
        """Optimizer, scheduler, objective parameters and RNG states of every rank (collective under DDP/FSDP)."""
        rngs = D.all_gather_objects(capture_rng(), self.env)
        return {
            "optimizer": D.optimizer_state(self.wrapped, self.optimizer, self.fsdp),
            "scheduler": self.scheduler.state_dict(),
            "objective_modules": objective_state,
            "rng": rngs,
            "world_size": self.env.world_size,
            "log_window": D.all_gather_objects(
                {"stats": None if self._window_stats is None else self._window_stats.detach().cpu(),
                 "tokens": int(self._window_tokens)}, self.env),
        }

    def gathered(self, what: str) -> tuple[Model | None, dict[str, Tensor] | None]:
        """The model and the objectives' modules with whole (unsharded) weights, for writing: on rank 0, and
        None on the others under FSDP. Every rank must call this. Under FSDP the model is rebuilt from its
        description (``bertology.model.checkpoint.native_metadata``: config, heads, extensions such as LoRA and
        adapters) and given the gathered weights, so the normal checkpoint writer saves all of it. Stops the run
        before writing weights that are not finite."""
        self._settle()
        self._check_finite_weights(what)
        if not self.fsdp:
            return self.model, self.loss_module.objective_modules.state_dict()
        state = D.full_state_dict(self.loss_module, True)  # rank 0 receives it
        if not self.env.is_main:
            return None, None
        from bertology.model.checkpoint import native_metadata, skeleton

        model = skeleton(native_metadata(self.model), "model")
        model.load_state_dict({k[len("model."):]: v for k, v in state.items() if k.startswith("model.")},
                              assign=True)
        prefix = "objective_modules."
        return model, {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}

    def _check_finite_weights(self, what: str) -> None:
        """An update can overflow the weights with finite gradients (a learning rate far too large); such weights
        are never written over a good checkpoint or as the final model. Each rank checks what it holds."""
        named = list(self.model.named_parameters())
        finite = torch.stack([torch.isfinite(D.local(p)).all() for _, p in named]).tolist()  # one read
        bad = [name for (name, _), ok in zip(named, finite) if not ok]
        if self.fsdp and self.env.distributed:
            bad = sorted({name for names in D.all_gather_objects(bad, self.env) for name in names})
        if bad:
            checkpoint = latest_checkpoint(self.output_dir)
            raise TrainingError(
                f"step {self.state.step}: the weights are not finite after the update ({', '.join(bad[:3])}"
                f"{', ...' if len(bad) > 3 else ''}); the {what} was not written and the run stops. Last "
                f"checkpoint: {checkpoint if checkpoint is not None else 'none'}. Lower optim.lr or set "
                "optim.clip_norm.")

    def save_checkpoint(self) -> Path | None:
        """Write a checkpoint of the current step (rank 0 writes; every rank takes part in gathering state)."""
        model, objective_state = self.gathered("checkpoint")
        trainer_state = self._trainer_state(objective_state)
        path = None
        if self.env.is_main:
            assert model is not None
            path = save_checkpoint(self.output_dir, model, self.tokenizer, self.state, trainer_state)
            prune_checkpoints(self.output_dir, self.config.run.keep_last)
        D.barrier(self.env)
        return path

    def save_final_model(self) -> Path:
        """The trained model and its tokenizer at ``<output_dir>/model`` (the transformers layout when its heads
        have one, else bertology's native one). Every rank calls this; rank 0 writes."""
        from bertology.model.checkpoint import Pretrained

        path = self.output_dir / FINAL_MODEL_DIR
        model, _ = self.gathered("final model")
        if self.env.is_main:
            assert model is not None
            Pretrained(model, self.tokenizer).save(path)
        return path

    # ------------------------------------------------------------------------------------------------ resuming
    def resume(self, path: str | os.PathLike | None = None) -> bool:
        """Load ``path`` (default: the latest checkpoint in the output directory); False if there is none, in which
        case whatever a killed run logged before its first checkpoint is dropped and the run starts afresh."""
        self._resumed = True
        path = Path(path) if path is not None else latest_checkpoint(self.output_dir)
        if path is None:
            if self.env.is_main:
                self._truncate_metrics(-1)
            D.barrier(self.env)
            return False
        model_state, state, trainer_state = read_checkpoint(path, self.model)
        saved_world = trainer_state.get("world_size", 1)
        if saved_world != self.env.world_size:
            raise CheckpointError(f"{path}: written by {saved_world} process(es), resumed with "
                                  f"{self.env.world_size}; the data order would differ")
        check_same_run(path, state.config, self.config.to_dict())
        objective_state = trainer_state["objective_modules"]
        if self.fsdp:
            full = {f"model.{k}": v for k, v in model_state.items()}
            full.update({f"objective_modules.{k}": v for k, v in objective_state.items()})
            D.load_full_state_dict(self.loss_module, full, self.fsdp)
        else:
            self.model.load_state_dict(model_state)
            self.loss_module.objective_modules.load_state_dict(objective_state)
        D.load_optimizer_state(self.wrapped, self.optimizer, trainer_state["optimizer"], self.fsdp)
        self.scheduler.load_state_dict(trainer_state["scheduler"])
        restore_rng(trainer_state["rng"][self.env.rank])
        windows = trainer_state.get("log_window")  # absent from checkpoints written before it was kept
        if isinstance(windows, list) and len(windows) == self.env.world_size:
            window = windows[self.env.rank]
            stats = window.get("stats") if isinstance(window, dict) else None
            self._window_stats = stats.to(self.device) if isinstance(stats, Tensor) else None
            self._window_tokens = int(window.get("tokens", 0)) if isinstance(window, dict) else 0
        self.state = TrainingState(step=state.step, epoch=state.epoch, batch=state.batch, tokens=state.tokens,
                                   config=self.config.to_dict())
        if self.env.is_main:
            self._truncate_metrics(state.step)
        D.barrier(self.env)
        return True

    def _truncate_metrics(self, step: int) -> None:
        """Drop records a killed run logged after the checkpoint we resume from (they will be logged again)."""
        if not self.metrics_path.is_file():
            return
        kept = [json.dumps(r) + "\n" for r in read_metrics(self.metrics_path) if r.get("step", 0) <= step]
        if not kept:
            self.metrics_path.unlink()
            return
        with atomic_write(self.metrics_path, "w", encoding="utf-8") as handle:
            handle.writelines(kept)


def _flatten(data: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, Mapping) and value:
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def check_same_run(path: str | os.PathLike, saved: Mapping[str, Any], current: Mapping[str, Any]) -> None:
    """Refuse to resume when a setting that changes what is computed differs from the checkpoint's; the
    settings in ``MAY_CHANGE_ON_RESUME`` may differ."""
    before, after = _flatten(saved), _flatten(current)
    differences = [f"{key}: {before.get(key)!r} -> {after.get(key)!r}" for key in sorted(set(before) | set(after))
                   if before.get(key) != after.get(key) and not key.startswith(MAY_CHANGE_ON_RESUME)]
    if differences:
        raise ConfigError(f"{path}: cannot resume, these settings differ from the checkpoint's: "
                          + "; ".join(differences) + " (start a new run in another run.output_dir, or --overwrite)")


def read_metrics(path: str | os.PathLike) -> list[dict[str, Any]]:
    """Records of a metrics JSONL file (a torn last line from a killed run is skipped)."""
    records = []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        try:
            records.append(json.loads(line))
        except (json.JSONDecodeError, RecursionError):
            continue
    return records


def plot_metrics(metrics_path: str | os.PathLike, out_path: str | os.PathLike) -> Path:
    """A PNG of training and held-out loss, accuracy (MLM's when there is one) and learning rate against the step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = read_metrics(metrics_path)
    train = [r for r in records if r["kind"] == "train"]
    evals = [r for r in records if r["kind"] == "eval"]
    accuracy = next((k for k in ("mlm_accuracy", *sorted({k for r in records for k in r if k.endswith("accuracy")}))
                     if any(r.get(k) is not None for r in records)), "mlm_accuracy")
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    for ax, key in ((axes[0], "loss"), (axes[1], accuracy)):
        for rows, label in ((train, "train"), (evals, "held-out")):
            points = [(r["step"], r[key]) for r in rows if r.get(key) is not None]
            if points:
                ax.plot(*zip(*points), marker="o" if label == "held-out" else None, label=label)
        ax.set_title(key.replace("_", " "))
        ax.set_xlabel("step")
        ax.legend()
    lr = [(r["step"], r["lr"]) for r in train if "lr" in r]
    if lr:
        axes[2].plot(*zip(*lr))
    axes[2].set_title("learning rate")
    axes[2].set_xlabel("step")
    fig.tight_layout()
    out_path = Path(out_path)
    with atomic_write(out_path, "wb") as handle:
        fig.savefig(handle, format="png", dpi=100)
    plt.close(fig)
    return out_path
