"""The pretraining dataset: instances of an epoch, shuffled, split across ranks, collated, then made into
training batches by a ``BatchMaker`` (MLM masking for BERT and RoBERTa; span masking or other corruptions plug in
the same way).

Epoch ``e`` uses the instance list of duplicate ``e % dupe_factor`` (a deterministic function of the seed), visits
it in an order seeded by ``(seed, e)`` and hands each batch maker per-instance keys (``InstanceBatch.keys``, from
``(seed, instance, epoch)``); so a batch is a pure function of ``(epoch, batch index, rank, world_size)`` and a run
resumes exactly from ``(epoch, batch)``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, fields
from typing import Any, Protocol

import numpy as np
import torch

from bertology.data.instances import (
    DocumentSource,
    Instance,
    InstanceConfig,
    InstanceStats,
    create_instances,
    derive_seed,
)
from bertology.data.masking import Masker, masking_seeds
from bertology.errors import ConfigError
from bertology.tokenization.framing import Framing

# Random streams derived from the user seed (instances.py uses 1).
_ORDER_STREAM = 2
_BUCKET_STREAM = 3


@dataclass
class InstanceBatch:
    """Collated instances before any corruption: what a ``BatchMaker`` turns into a training batch."""

    input_ids: torch.Tensor  # [B, L], right-padded with the pad id
    attention_mask: torch.Tensor  # [B, L], 1 at real tokens
    token_type_ids: torch.Tensor  # [B, L]
    word_starts: torch.Tensor  # [B, L] bool: the token starts a word (whole-word and span masking)
    next_sentence_labels: torch.Tensor | None  # [B] for NSP (1 = random next) and SOP (1 = swapped), else None
    instance_ids: torch.Tensor  # [B] ids in the epoch's instance list
    epoch: int
    # This rank's micro-batch count from the start of training (epoch 0, batch 0) to this batch: set when the
    # batch maker asks for it (``needs_position``), for schedules over training steps; else 0.
    position: int = 0
    # [B, L] the document of every token, for ``packed-documents`` instances (-1 at padding); else None.
    documents: torch.Tensor | None = None
    # [B, L] bool: the token starts a sentence (packed kinds; sentence permutation reads it); else None.
    sentence_starts: torch.Tensor | None = None


class BatchMaker(Protocol):
    """Turns collated instances into a training batch (e.g. masks them); must be a pure function of its input
    (randomness keyed by ``instance_ids`` and ``epoch``, and ``position`` when it has ``needs_position = True``),
    so that resumed runs see the same batches."""

    def __call__(self, instances: InstanceBatch) -> Any: ...


@dataclass
class PretrainingBatch:
    """One collated, MLM-masked batch (right padding with ``pad_id``; ``attention_mask`` 1 at real tokens)."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    token_type_ids: torch.Tensor
    masked_positions: torch.Tensor
    mlm_labels: torch.Tensor
    next_sentence_labels: torch.Tensor | None = None  # 0 = B follows A, 1 = B is random (BERT's convention)
    instance_ids: torch.Tensor | None = None  # [B] ids in the epoch's instance list (for logging and checks)

    def to(self, device: torch.device | str, non_blocking: bool = False) -> PretrainingBatch:
        moved = {f.name: getattr(self, f.name) for f in fields(self)}
        return type(self)(**{k: None if v is None else v.to(device, non_blocking=non_blocking)
                             for k, v in moved.items()})

    def __len__(self) -> int:
        return self.input_ids.shape[0]


class PackedInstances:
    """Instances of one duplicate as flat arrays plus offsets, so that batches are gathered without Python loops."""

    def __init__(self, instances: Sequence[Instance]) -> None:
        lengths = np.array([len(x) for x in instances], dtype=np.int64)
        self.offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        self.lengths = lengths
        self.input_ids = np.concatenate([x.input_ids for x in instances]).astype(np.int64)
        self.token_type_ids = np.concatenate([x.token_type_ids for x in instances]).astype(np.int8)
        self.word_starts = np.concatenate([x.word_starts for x in instances]).astype(bool)
        # -1 where the instance has no next-sentence label.
        self.random_next = np.array([-1 if x.is_random_next is None else int(x.is_random_next) for x in instances],
                                    dtype=np.int64)
        with_documents = [x.document_ids is not None for x in instances]
        self.document_ids = (np.concatenate([x.document_ids for x in instances]).astype(np.int64)
                             if instances and all(with_documents) else None)
        with_sentences = [x.sentence_starts is not None for x in instances]
        self.sentence_starts = (np.concatenate([x.sentence_starts for x in instances]).astype(bool)
                                if instances and all(with_sentences) else None)

    def __len__(self) -> int:
        return len(self.lengths)

    def collate(self, indices: np.ndarray, pad_id: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Padded ``(input_ids, attention_mask, token_type_ids, word_starts)`` ``[B, max length]``."""
        lengths = self.lengths[indices]
        width = int(lengths.max())
        columns = np.arange(width)
        real = columns[None, :] < lengths[:, None]
        flat = np.where(real, self.offsets[indices][:, None] + columns[None, :], 0)
        input_ids = np.where(real, self.input_ids[flat], pad_id)
        token_type_ids = np.where(real, self.token_type_ids[flat], 0).astype(np.int64)
        word_starts = real & self.word_starts[flat]
        return input_ids, real.astype(np.int64), token_type_ids, word_starts

    def _gather(self, values: np.ndarray, indices: np.ndarray, fill: Any) -> np.ndarray:
        """Per-token ``values`` of ``collate``'s batch ``[B, max length]``, ``fill`` at padding."""
        lengths = self.lengths[indices]
        columns = np.arange(int(lengths.max()))
        real = columns[None, :] < lengths[:, None]
        return np.where(real, values[np.where(real, self.offsets[indices][:, None] + columns[None, :], 0)], fill)

    def collate_documents(self, indices: np.ndarray) -> np.ndarray | None:
        """The document ids of ``collate``'s batch ``[B, max length]`` (-1 at padding), None without them."""
        return None if self.document_ids is None else self._gather(self.document_ids, indices, -1)

    def collate_sentences(self, indices: np.ndarray) -> np.ndarray | None:
        """The sentence starts of ``collate``'s batch ``[B, max length]`` (False at padding), None without them."""
        return None if self.sentence_starts is None else self._gather(self.sentence_starts, indices, False)


@dataclass(frozen=True)
class StepClock:
    """Where a micro-batch falls in training: this rank's micro-batch ``position`` (counted from the start) is in
    optimizer step ``position // grad_accumulation``, and ``progress`` runs from 0 at the first step to 1 at the
    last (``total_steps``). Masking-rate schedules read it."""

    grad_accumulation: int = 1
    total_steps: int = 1

    def __post_init__(self) -> None:
        if self.grad_accumulation < 1 or self.total_steps < 1:
            raise ConfigError(f"StepClock: grad_accumulation and total_steps must be >= 1, got "
                              f"{self.grad_accumulation} and {self.total_steps}")

    def step(self, position: int) -> int:
        return position // self.grad_accumulation

    def progress(self, position: int) -> float:
        return min(1.0, self.step(position) / max(1, self.total_steps - 1))


class MaskedBatches:
    """The BERT / RoBERTa batch maker: MLM masking with a ``Masker``, keyed by (seed, instance, epoch); with a
    masking-rate schedule the rate is the one of the batch's optimizer step (``clock``)."""

    def __init__(self, masker: Masker, seed: int, dupe_factor: int, clock: StepClock | None = None) -> None:
        if masker.config.schedule != "constant" and clock is None:
            raise ConfigError("MaskedBatches: a masking-rate schedule needs a StepClock (the run's "
                              "grad_accumulation and total_steps)")
        self.masker = masker
        self.seed = seed
        self.dupe_factor = dupe_factor
        self.clock = clock
        self.needs_position = masker.config.schedule != "constant"

    def rate(self, instances: InstanceBatch) -> float:
        """The masking rate of this batch (the config's, or its step's on a schedule)."""
        if not self.needs_position:
            return self.masker.config.mlm_probability
        assert self.clock is not None
        return self.masker.config.probability_at(self.clock.progress(instances.position))

    def __call__(self, instances: InstanceBatch) -> PretrainingBatch:
        seeds = masking_seeds(self.seed, instances.instance_ids.numpy(), instances.epoch, self.dupe_factor,
                              self.masker.config.dynamic)
        masked = self.masker(instances.input_ids, instances.attention_mask, instances.word_starts, seeds=seeds,
                             mlm_probability=self.rate(instances))
        return PretrainingBatch(masked.input_ids, instances.attention_mask, instances.token_type_ids,
                                masked.masked_positions, masked.mlm_labels, instances.next_sentence_labels,
                                instances.instance_ids)


class PretrainingDataset:
    """Batches of pretraining instances; see the module docstring for the determinism contract.

    ``make_batch`` turns collated instances into training batches; a ``Masker`` is the usual one (MLM masking,
    wrapped in ``MaskedBatches``). ``bucket_window`` > 1 groups instances of similar length (within windows of that
    many batches) to cut padding; it changes which instances share a batch, not the set of instances of an epoch.
    """

    def __init__(self, source: DocumentSource, special: Framing, config: InstanceConfig,
                 make_batch: Masker | BatchMaker, bucket_window: int = 0, clock: StepClock | None = None) -> None:
        if isinstance(make_batch, Masker):
            if make_batch.special != special:
                raise ConfigError(f"PretrainingDataset: the masker's special tokens {make_batch.special} differ "
                                  f"from {special}")
            make_batch = MaskedBatches(make_batch, config.seed, config.dupe_factor, clock)
        if bucket_window < 0:
            raise ConfigError(f"PretrainingDataset: bucket_window must be >= 0, got {bucket_window}")
        self.source = source
        self.special = special
        self.config = config
        self.make_batch = make_batch
        self.bucket_window = bucket_window
        self._duplicate = -1
        self._packed: PackedInstances | None = None
        self._stats: InstanceStats | None = None
        self._counts: dict[int, int] = {}  # instances per duplicate
        self._load(0)  # fail early on a corpus that gives no instance

    def _load(self, epoch: int) -> PackedInstances:
        duplicate = epoch % self.config.dupe_factor
        if duplicate != self._duplicate or self._packed is None:
            instances, stats = create_instances(self.source, self.config, self.special, duplicate)
            self._packed, self._stats, self._duplicate = PackedInstances(instances), stats, duplicate
            self._counts[duplicate] = len(instances)
        return self._packed

    def _count(self, epoch: int) -> int:
        """Instances of ``epoch``'s duplicate, made once (without replacing the loaded duplicate) if not known."""
        duplicate = epoch % self.config.dupe_factor
        if duplicate not in self._counts:
            self._counts[duplicate] = len(create_instances(self.source, self.config, self.special, duplicate)[0])
        return self._counts[duplicate]

    def position(self, epoch: int, batch: int, batch_size: int, rank: int = 0, world_size: int = 1,
                 drop_last: bool = True) -> int:
        """This rank's micro-batches from the start of training to batch ``batch`` of ``epoch``."""
        before = 0
        for e in range(min(epoch, self.config.dupe_factor)):
            # Epochs e, e + dupe_factor, ... use the same duplicate, so the same number of batches.
            repeats = len(range(e, epoch, self.config.dupe_factor))
            count = self._count(e)
            kept = count // (batch_size * world_size) * batch_size * world_size if drop_last else count
            size = len(range(rank, kept, world_size))
            before += repeats * -(-size // batch_size)
        return before + batch

    def num_instances(self, epoch: int) -> int:
        return len(self._load(epoch))

    def stats(self, epoch: int) -> InstanceStats:
        """What instance creation for this epoch's duplicate counted (skipped sentences, forced random next, ...)."""
        self._load(epoch)
        assert self._stats is not None
        return self._stats

    def _check(self, epoch: int, batch_size: int, rank: int, world_size: int) -> None:
        if epoch < 0:
            raise ConfigError(f"PretrainingDataset: epoch must be >= 0, got {epoch}")
        if batch_size < 1:
            raise ConfigError(f"PretrainingDataset: batch_size must be >= 1, got {batch_size}")
        if world_size < 1 or not 0 <= rank < world_size:
            raise ConfigError(f"PretrainingDataset: need 0 <= rank < world_size, got rank {rank}, "
                              f"world_size {world_size}")

    def rank_indices(self, epoch: int, rank: int = 0, world_size: int = 1, batch_size: int = 1,
                     drop_last: bool = True) -> np.ndarray:
        """Instance ids this rank visits in ``epoch``, in order.

        The epoch's shuffled order is dealt round-robin over the ranks, so ranks are disjoint. With ``drop_last``
        the order is first cut to a multiple of ``batch_size * world_size`` (every rank gets the same number of
        full batches); without it every instance is visited once across ranks, and ranks may differ by a batch.
        """
        self._check(epoch, batch_size, rank, world_size)
        count = self.num_instances(epoch)
        order = np.random.default_rng(derive_seed(self.config.seed, _ORDER_STREAM, epoch)).permutation(count)
        if drop_last:
            order = order[: count // (batch_size * world_size) * batch_size * world_size]
        return order[rank::world_size]

    def _batch_indices(self, epoch: int, batch_size: int, rank: int, world_size: int, drop_last: bool,
                       bucket_window: int) -> list[np.ndarray]:
        indices = self.rank_indices(epoch, rank, world_size, batch_size, drop_last)
        if bucket_window < 0:
            raise ConfigError(f"PretrainingDataset: bucket_window must be >= 0, got {bucket_window}")
        if bucket_window <= 1:
            return [indices[i:i + batch_size] for i in range(0, len(indices), batch_size)]
        # Sort by length inside windows of bucket_window batches, then shuffle the batches of each window, so
        # batches pad less but their order stays random.
        lengths = self._load(epoch).lengths
        rng = np.random.default_rng(derive_seed(self.config.seed, _BUCKET_STREAM, epoch, rank, world_size))
        batches: list[np.ndarray] = []
        span = bucket_window * batch_size
        for begin in range(0, len(indices), span):
            window = indices[begin:begin + span]
            window = window[np.argsort(lengths[window], kind="stable")]
            chunks = [window[i:i + batch_size] for i in range(0, len(window), batch_size)]
            batches.extend(chunks[k] for k in rng.permutation(len(chunks)))
        return batches

    def num_batches(self, epoch: int, batch_size: int, rank: int = 0, world_size: int = 1,
                    drop_last: bool = True) -> int:
        size = len(self.rank_indices(epoch, rank, world_size, batch_size, drop_last))
        return -(-size // batch_size)

    def batches(self, epoch: int, batch_size: int, start_batch: int = 0, rank: int = 0, world_size: int = 1,
                drop_last: bool = True, bucket_window: int | None = None) -> Iterator[Any]:
        """Batches of ``epoch`` for ``rank``, from batch ``start_batch`` on (to resume exactly); ``bucket_window``
        None takes the dataset's."""
        if start_batch < 0:
            raise ConfigError(f"PretrainingDataset: start_batch must be >= 0, got {start_batch}")
        window = self.bucket_window if bucket_window is None else bucket_window
        # Checked and planned here, not lazily, so that bad arguments fail at the call.
        plan = self._batch_indices(epoch, batch_size, rank, world_size, drop_last, window)
        first = 0
        if getattr(self.make_batch, "needs_position", False):
            first = self.position(epoch, start_batch, batch_size, rank, world_size, drop_last)
        return self._iterate(epoch, plan[start_batch:], first)

    def _iterate(self, epoch: int, plan: list[np.ndarray], first: int = 0) -> Iterator[Any]:
        packed = self._load(epoch)
        for offset, indices in enumerate(plan):
            input_ids, attention_mask, token_type_ids, word_starts = packed.collate(indices, self.special.fill_id)
            labels = torch.from_numpy(packed.random_next[indices].copy()) if self.config.sentence_labels else None
            documents = packed.collate_documents(indices)
            sentences = packed.collate_sentences(indices)
            yield self.make_batch(InstanceBatch(
                torch.from_numpy(input_ids), torch.from_numpy(attention_mask), torch.from_numpy(token_type_ids),
                torch.from_numpy(word_starts), labels, torch.from_numpy(indices.astype(np.int64)), epoch,
                first + offset, None if documents is None else torch.from_numpy(documents),
                None if sentences is None else torch.from_numpy(sentences)))
