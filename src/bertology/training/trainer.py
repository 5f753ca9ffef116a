"""The pretraining loop: gradient accumulation, clipping, AdamW with warm-up and decay, optional bf16 autocast,
DDP/FSDP, held-out evaluation, JSONL metrics, atomic checkpoints and exact resumption.

Exactness: every batch is a pure function of (epoch, batch index, rank, world size) (see bertology.data.dataset),
the losses are normalised by the unit count of the whole effective batch, and a checkpoint holds the weights,
optimizer, scheduler, every RNG state and the data position. A run resumed from step k therefore continues with
the same updates as a run never interrupted (bitwise on CPU with the same thread count).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import queue
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from tqdm import tqdm

from bertology.data.dataset import PretrainingBatch, PretrainingDataset
from bertology.errors import CheckpointError, ConfigError
from bertology.io import atomic_write
from bertology.model.encoder import EncoderModel
from bertology.objectives.base import Objective
from bertology.objectives.compose import PretrainingLoss, stats_to_vector
from bertology.training import distributed as D
from bertology.training.checkpoint import (
    TrainingState,
    capture_rng,
    latest_checkpoint,
    prune_checkpoints,
    read_checkpoint,
    restore_rng,
    save_checkpoint,
)
from bertology.training.config import PretrainConfig
from bertology.training.optim import build_optimizer, build_scheduler

METRICS_FILE = "metrics.jsonl"
PLOT_FILE = "curves.png"
FINAL_MODEL_DIR = "model"


@dataclass
class StepReport:
    """What hooks see after each optimizer step: the step, the data position after it, the instances it used."""

    step: int
    epoch: int
    batch: int
    instance_ids: list[Tensor] = field(default_factory=list)
    metrics: dict[str, float] | None = None  # set on log steps


Hook = Callable[["Trainer", StepReport], None]


class Prefetcher:
    """Runs an iterator in a background thread, ``depth`` items ahead; errors surface in the consumer."""

    _END = object()

    def __init__(self, iterator: Iterator[Any], depth: int) -> None:
        self._queue: queue.Queue = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(iterator,), daemon=True)
        self._thread.start()

    def _run(self, iterator: Iterator[Any]) -> None:
        try:
            for item in iterator:
                while not self._stop.is_set():
                    try:
                        self._queue.put(item, timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if self._stop.is_set():
                    return
            self._queue.put(self._END)
        except BaseException as error:  # handed to the consumer, which re-raises it
            self._queue.put(error)

    def __iter__(self) -> Prefetcher:
        return self

    def __next__(self) -> Any:
        item = self._queue.get()
        if item is self._END:
            raise StopIteration
        if isinstance(item, BaseException):
            raise item
        return item

    def close(self) -> None:
        """Stop and wait for the thread: one left running inside torch at interpreter exit aborts the process."""
        self._stop.set()
        self._thread.join()


class Trainer:
    """Trains ``model`` on ``objectives`` over ``train_data``; ``eval_data`` (held-out) is evaluated on schedule.

    Only rank 0 writes files. ``hooks`` run on every rank after every optimizer step.
    """

    def __init__(self, config: PretrainConfig, model: EncoderModel, objectives: Sequence[Objective],
                 train_data: PretrainingDataset, eval_data: PretrainingDataset | None = None,
                 tokenizer: Any = None, env: D.DistEnv | None = None, hooks: Sequence[Hook] = ()) -> None:
        self.config = config
        self.env = env or D.DistEnv()
        self.tokenizer = tokenizer
        self.train_data = train_data
        self.eval_data = eval_data
        self.hooks = list(hooks)
        self.output_dir = Path(config.run.output_dir)
        self.metrics_path = self.output_dir / METRICS_FILE
        speed = config.speed
        self.device = self.env.device
        self.loss_module = PretrainingLoss(model, objectives).to(self.device)
        self.model = model
        if speed.compile:
            for layer in model.encoder.layers:
                layer.compile(dynamic=True)
        self.wrapped = D.wrap(self.loss_module, self.env, speed.fsdp)
        self.fsdp = speed.fsdp and self.env.distributed
        self.optimizer = build_optimizer(self.wrapped, config.optim, speed.fused_optimizer)
        self.scheduler = build_scheduler(self.optimizer, config.optim)
        self.state = TrainingState(config=config.to_dict())
        self.autocast_enabled = self._bf16(speed.bf16)
        self._stat_keys: list[str] | None = None
        self.history: list[dict[str, Any]] = []

    # ------------------------------------------------------------------------------------------------ set-up
    def _bf16(self, wanted: bool | None) -> bool:
        kind = self.device.type
        if wanted is None:  # auto: only where bf16 runs natively
            return kind == "cuda" and torch.cuda.is_bf16_supported()
        if wanted and kind == "cuda" and not torch.cuda.is_bf16_supported():
            raise ConfigError("speed.bf16: this GPU does not support bfloat16")
        return bool(wanted)

    def _autocast(self) -> contextlib.AbstractContextManager:
        if not self.autocast_enabled:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=torch.bfloat16)

    # ------------------------------------------------------------------------------------------------ data
    def _stream(self, epoch: int, batch: int) -> Iterator[tuple[int, int, PretrainingBatch]]:
        """Micro-batches from (epoch, batch) on, forever, each with its position."""
        size, env = self.config.optim.batch_size, self.env
        window = self.config.data.bucket_window
        while True:
            count = self.train_data.num_batches(epoch, size, env.rank, env.world_size)
            if count == 0:
                raise ConfigError(
                    f"optim.batch_size: {size} x {env.world_size} process(es) is more than the "
                    f"{self.train_data.num_instances(epoch)} training instances of epoch {epoch}")
            for index, item in enumerate(self.train_data.batches(epoch, size, batch, env.rank, env.world_size,
                                                                 bucket_window=window), start=batch):
                yield epoch, index, item
            epoch, batch = epoch + 1, 0

    def _device_batch(self, batch: PretrainingBatch) -> PretrainingBatch:
        if self.device.type == "cpu":
            return batch
        return batch.to(self.device, non_blocking=True)

    # ------------------------------------------------------------------------------------------------ training
    def train(self) -> dict[str, float]:
        """Run to ``optim.total_steps``; returns the last evaluation metrics (or the last training metrics)."""
        cfg = self.config
        total, accum = cfg.optim.total_steps, cfg.optim.grad_accumulation
        if self.state.step >= total:
            return self.history[-1] if self.history else {}
        if self.env.is_main:
            self.output_dir.mkdir(parents=True, exist_ok=True)
            self._write_config()
        if self.state.step == 0 and cfg.run.eval_at_start and self.eval_data is not None:
            self._log("eval", self.evaluate())  # the untrained baseline, so curves start where learning starts
        stream: Iterator = self._stream(self.state.epoch, self.state.batch)
        prefetcher = None
        if cfg.speed.prefetch > 0:
            stream = prefetcher = Prefetcher(stream, cfg.speed.prefetch)
        self.wrapped.train()
        progress = tqdm(total=total, initial=self.state.step, unit="step", desc="pretraining",
                        disable=not (cfg.run.progress and self.env.is_main), dynamic_ncols=True)
        window_stats: Tensor | None = None
        window_tokens = 0
        window_start = time.perf_counter()
        last_metrics: dict[str, float] = {}
        try:
            while self.state.step < total:
                micro = [next(stream) for _ in range(accum)]
                batches = [self._device_batch(b) for _, _, b in micro]
                tokens = sum(int(b.attention_mask.sum()) for _, _, b in micro)
                step_stats, grad_norm = self._step(batches)
                window_stats = step_stats if window_stats is None else window_stats + step_stats
                window_tokens += tokens
                epoch, index, _ = micro[-1]
                self.state.step += 1
                self.state.epoch, self.state.batch = epoch, index + 1
                self.state.tokens += tokens * self.env.world_size  # ranks see batches of similar size
                progress.update(1)
                report = StepReport(self.state.step, self.state.epoch, self.state.batch,
                                    [b.instance_ids for _, _, b in micro if b.instance_ids is not None])
                step = self.state.step
                final = step == total
                if cfg.run.log_every and (step % cfg.run.log_every == 0 or final):
                    elapsed = time.perf_counter() - window_start
                    metrics = self._reduce(window_stats)
                    metrics.update(lr=self.scheduler.get_last_lr()[0], grad_norm=float(grad_norm),
                                   tokens_per_s=window_tokens * self.env.world_size / max(elapsed, 1e-9))
                    self._log("train", metrics)
                    progress.set_postfix(loss=f"{metrics['loss']:.4f}", tok_s=f"{metrics['tokens_per_s']:.0f}")
                    report.metrics = last_metrics = metrics
                    window_stats, window_tokens, window_start = None, 0, time.perf_counter()
                if self.eval_data is not None and ((cfg.run.eval_every and step % cfg.run.eval_every == 0)
                                                   or final):
                    last_metrics = self.evaluate()
                    self._log("eval", last_metrics)
                    window_start = time.perf_counter()  # evaluation time is not training throughput
                if (cfg.run.checkpoint_every and step % cfg.run.checkpoint_every == 0) or final:
                    self.save_checkpoint()
                    window_start = time.perf_counter()
                for hook in self.hooks:
                    hook(self, report)
        finally:
            progress.close()
            if prefetcher is not None:
                prefetcher.close()
        if self.env.is_main:
            self.save_final_model()
            if cfg.run.plot:
                plot_metrics(self.metrics_path, self.output_dir / PLOT_FILE)
        D.barrier(self.env)
        return last_metrics

    def _step(self, batches: list[PretrainingBatch]) -> tuple[Tensor, Tensor]:
        """One optimizer step over the micro-batches; returns the summed stats vector and the gradient norm."""
        loss_module = self.loss_module
        units_local = [loss_module.units(b) for b in batches]
        names = list(units_local[0])
        units = torch.stack([sum(u[n] for u in units_local) for n in names]).to(torch.float64)
        D.all_reduce_sum(units, self.env)
        # DDP and FSDP average gradients over ranks; dividing by units / world size makes the result the gradient
        # of the mean over the effective batch.
        divisor = (units / self.env.world_size).to(self.device, torch.float32)
        per_name = {n: divisor[i] for i, n in enumerate(names)}
        total_stats: Tensor | None = None
        last = len(batches) - 1
        for i, batch in enumerate(batches):
            with D.no_sync(self.wrapped, skip=self.env.distributed and i < last):
                with self._autocast():
                    loss, stats = self.wrapped(batch, per_name)
                loss.backward()
            if self._stat_keys is None:
                self._stat_keys = sorted(stats)
            vector = stats_to_vector(stats, self._stat_keys)
            total_stats = vector if total_stats is None else total_stats + vector
        clip = self.config.optim.clip_norm
        if clip is not None:
            if self.fsdp:
                grad_norm = self.wrapped.clip_grad_norm_(clip)  # type: ignore[operator]
            else:
                grad_norm = torch.nn.utils.clip_grad_norm_(self.loss_module.parameters(), clip)
        else:
            grad_norm = torch.zeros(())
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        assert total_stats is not None
        return total_stats, grad_norm.detach()

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
        """MLM loss, perplexity, MLM accuracy (and NSP accuracy) on the held-out data, reduced over ranks."""
        if self.eval_data is None:
            raise ConfigError("no held-out data: set data.heldout_documents to evaluate")
        env, cfg = self.env, self.config
        # Under DDP the bare module runs evaluation, so ranks with different batch counts never wait on each
        # other; FSDP needs the wrapper (parameters are sharded) and so equal batch counts on every rank.
        module = self.wrapped if self.fsdp else self.loss_module
        module.eval()
        total: Tensor | None = None
        keys: list[str] | None = None
        try:
            batches = self.eval_data.batches(0, cfg.optim.batch_size, 0, env.rank, env.world_size,
                                             drop_last=self.fsdp)
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
        with atomic_write(self.output_dir / "pretrain_config.json", "w", encoding="utf-8") as handle:
            json.dump(self.config.to_dict(), handle, indent=2)
            handle.write("\n")

    def _log(self, kind: str, metrics: dict[str, float]) -> None:
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

    def _trainer_state(self) -> dict[str, Any]:
        """Optimizer, scheduler, objective parameters and RNG states of every rank (collective under DDP/FSDP)."""
        rngs = D.all_gather_objects(capture_rng(), self.env)
        return {
            "optimizer": D.optimizer_state(self.wrapped, self.optimizer, self.fsdp),
            "scheduler": self.scheduler.state_dict(),
            "objective_modules": self.loss_module.objective_modules.state_dict(),
            "rng": rngs,
            "world_size": self.env.world_size,
        }

    def _model_for_saving(self) -> EncoderModel:
        if not self.fsdp:
            return self.model
        state = D.full_state_dict(self.wrapped, self.loss_module, True)
        copy = EncoderModel(self.model.config, self.model.head_specs)
        copy.load_state_dict({k[len("model."):]: v for k, v in state.items() if k.startswith("model.")})
        return copy

    def save_checkpoint(self) -> Path | None:
        """Write a checkpoint of the current step (rank 0 writes; every rank takes part in gathering state)."""
        trainer_state = self._trainer_state()
        model = self._model_for_saving()
        path = None
        if self.env.is_main:
            path = save_checkpoint(self.output_dir, model, self.tokenizer, self.state, trainer_state)
            prune_checkpoints(self.output_dir, self.config.run.keep_last)
        D.barrier(self.env)
        return path

    def save_final_model(self) -> Path:
        """The trained model and its tokenizer in the transformers layout at ``<output_dir>/model``."""
        from bertology.model.checkpoint import Pretrained

        path = self.output_dir / FINAL_MODEL_DIR
        Pretrained(self._model_for_saving(), self.tokenizer).save(path)
        return path

    # ------------------------------------------------------------------------------------------------ resuming
    def resume(self, path: str | os.PathLike | None = None) -> bool:
        """Load ``path`` (default: the latest checkpoint in the output directory); False if there is none."""
        path = Path(path) if path is not None else latest_checkpoint(self.output_dir)
        if path is None:
            return False
        model_state, state, trainer_state = read_checkpoint(path, self.model)
        saved_world = trainer_state.get("world_size", 1)
        if saved_world != self.env.world_size:
            raise CheckpointError(f"{path}: written by {saved_world} process(es), resumed with "
                                  f"{self.env.world_size}; the data order would differ")
        _check_same_run(path, state.config, self.config.to_dict())
        self.model.load_state_dict(model_state)
        self.loss_module.objective_modules.load_state_dict(trainer_state["objective_modules"])
        D.load_optimizer_state(self.wrapped, self.optimizer, trainer_state["optimizer"], self.fsdp)
        self.scheduler.load_state_dict(trainer_state["scheduler"])
        restore_rng(trainer_state["rng"][self.env.rank])
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
        kept = []
        for line in self.metrics_path.read_text(encoding="utf-8").splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:  # a torn last line
                continue
            if record.get("step", 0) <= step:
                kept.append(line + "\n")
        with atomic_write(self.metrics_path, "w", encoding="utf-8") as handle:
            handle.writelines(kept)


# Sections that decide what a run computes; a resumed run must agree with its checkpoint on them.
_RUN_DEFINING = ("model", "tokenizer", "data", "objectives")


def _check_same_run(path: Path, saved: dict[str, Any], current: dict[str, Any]) -> None:
    differences = []
    for section in _RUN_DEFINING:
        before, after = saved.get(section, {}), current.get(section, {})
        for key in sorted(set(before) | set(after)) if isinstance(before, dict) else []:
            if before.get(key) != after.get(key):
                differences.append(f"{section}.{key}: {before.get(key)!r} -> {after.get(key)!r}")
    if differences:
        raise ConfigError(f"{path}: cannot resume, the config differs from the checkpoint's: "
                          + "; ".join(differences))


def read_metrics(path: str | os.PathLike) -> list[dict[str, Any]]:
    """Records of a metrics JSONL file (a torn last line from a killed run is skipped)."""
    records = []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records


def plot_metrics(metrics_path: str | os.PathLike, out_path: str | os.PathLike) -> Path:
    """A PNG of training and held-out loss, MLM accuracy and learning rate against the step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = read_metrics(metrics_path)
    train = [r for r in records if r["kind"] == "train"]
    evals = [r for r in records if r["kind"] == "eval"]
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    for ax, key, title in ((axes[0], "loss", "loss"), (axes[1], "mlm_accuracy", "MLM accuracy")):
        for rows, label in ((train, "train"), (evals, "held-out")):
            points = [(r["step"], r[key]) for r in rows if r.get(key) is not None]
            if points:
                ax.plot(*zip(*points), marker="o" if label == "held-out" else None, label=label)
        ax.set_title(title)
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
