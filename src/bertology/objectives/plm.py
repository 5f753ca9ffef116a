"""Permutation language modelling (XLNet): a random factorisation order per sequence, and the log-likelihood of its
last tokens given the ones before them in that order,

    L = -sum_{t > c} log P(x_{z_t} | x_{z_<t})

Partial prediction as in the paper's implementation: whole-word spans of 1..max_span words (span length n drawn
with probability proportional to 1/n), each with (K - 1) n words of context around it, become the targets, capped
at and topped up to 1/K of the sequence's real tokens; every other token is context, first in the order and seen
by all, and the targets follow in a random order. Functional tokens (<sep>, <cls>) are ordered with the targets
but never predicted. The query stream predicts each target seeing the context and the targets before it, never its
own content.

`permutation_batch` builds `perm_mask` [B, L, L] (1: query i may not see token j), `target_mapping` [B, P, L] and the
labels [B, P] with tensor operations only, on the batch's device; `PermutationBatches` is its `BatchMaker` over
pretraining instances, keyed by (seed, instances, epoch); `PermutationLM` the objective on the tied `lm` head.

Memory (Transformer-XL's recurrence): on segment streams (`bertology.data.segment_streams`, batches with `reset`)
each row continues the text of the same row of the previous batch, and the objective runs the model with the
memory the previous batch left (`mems`, detached: no gradient crosses a segment's edge, and the model's `mem_len`
and `reuse_len` say what is kept), hidden where a row starts a new document (an attention mask over the memory).
The training memory and its mask are buffers of this module, so they are saved in every checkpoint and a resumed
run continues bit for bit; evaluation keeps a memory of its own."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from bertology.config import validate
from bertology.errors import ConfigError
from bertology.model.heads import HeadSpec
from bertology.objectives.base import IGNORE, Objective, ObjectiveOutput, Passes, check_objective
from bertology.objectives.mlm import (
    linear_prediction_applies,
    linear_token_prediction,
    token_prediction,
    token_prediction_summary,
)


@dataclass(frozen=True)
class PermutationConfig:
    """`k`: predict the last 1/K of each factorisation order (the paper's K = 6 or 7); `max_span`: the longest span
    of words predicted together; `num_predict`: target slots per row (`target_mapping`'s width; None:
    ceil(length / K))."""

    k: float = 6.0
    max_span: int = 5
    num_predict: int | None = None

    def __post_init__(self) -> None:
        validate(self, "permutation")
        if not self.k >= 1:
            raise ConfigError(f"permutation.k: K must be at least 1 (predict 1/K of the tokens), got {self.k}")
        if self.max_span < 1:
            raise ConfigError(f"permutation.max_span: must be at least 1, got {self.max_span}")
        if self.num_predict is not None and self.num_predict < 1:
            raise ConfigError(f"permutation.num_predict: must be at least 1, got {self.num_predict}")

    def check_length(self, length: int, where: str = "sequence length") -> None:
        """K in [1, length]: a row of `length` tokens has at least one target."""
        if self.k > length:
            raise ConfigError(f"permutation.k: K = {self.k} is outside [1, {length}] ({where}): no token of a "
                              f"{length}-token sequence would be predicted")

    def slots(self, length: int) -> int:
        return self.num_predict if self.num_predict is not None else math.ceil(length / self.k)


@dataclass
class PermutationBatch:
    """A padded batch for permutation LM: the model's inputs and the labels [B, P] of the P target slots (-100 at
    unused slots). `num_targets` (0-d int64) stays where the batch was made (the host, in the data pipeline), so
    that counting the units needs no wait for the device."""

    input_ids: Tensor
    attention_mask: Tensor
    token_type_ids: Tensor
    perm_mask: Tensor
    target_mapping: Tensor
    labels: Tensor
    num_targets: Tensor
    reset: Tensor | None = None  # [B] on segment streams: True where a row starts a document (its memory hidden)
    masked_positions: Tensor | None = None  # [N, 2] the (row, slot) of each label: the LM head runs there alone

    def to(self, device: torch.device | str, non_blocking: bool = False) -> PermutationBatch:
        moved = (t.to(device, non_blocking=non_blocking) for t in (
            self.input_ids, self.attention_mask, self.token_type_ids, self.perm_mask, self.target_mapping,
            self.labels))
        reset, slots = (None if t is None else t.to(device, non_blocking=non_blocking)
                        for t in (self.reset, self.masked_positions))
        return PermutationBatch(*moved, num_targets=self.num_targets, reset=reset, masked_positions=slots)

    def __len__(self) -> int:
        return self.input_ids.shape[0]


def span_targets(candidate: Tensor, word_starts: Tensor, config: PermutationConfig,
                 generator: torch.Generator | None = None) -> Tensor:
    """[B, L] bool: the tokens to predict, round(real / K) per row (at least 1 where a row has a candidate), drawn
    as whole-word spans with their context (see the module docstring), then topped up with random candidates."""
    device = candidate.device
    batch, length = candidate.shape
    previous = F.pad(candidate[:, :-1], (1, 0))
    starts = candidate & (word_starts.bool() | ~previous)  # a candidate after a non-candidate starts a word
    word = starts.long().cumsum(1) - 1  # each candidate's word index in its row
    num_words = starts.sum(1)
    budget = torch.minimum((candidate.sum(1) / config.k).round().long().clamp(min=1),
                           candidate.sum(1)).clamp(max=config.slots(length))
    # At most one span per K words: span s covers words [begin_s, begin_s + n_s) after l_s words of context and
    # before r_s = (floor(n_s K) - n_s) - l_s more.
    spans = length // max(1, int(config.k)) + 1  # a bound known without reading the device
    weights = 1 / torch.arange(1, config.max_span + 1, dtype=torch.float, device=device)
    n = torch.multinomial(weights, batch * spans, replacement=True, generator=generator).view(batch, spans) + 1
    context = (n * config.k).floor().long() - n
    left = (torch.rand(batch, spans, generator=generator, device=device) * context).floor().long()
    begin = (n + context).cumsum(1) - (n + context) + left
    end = begin + n
    span = (torch.searchsorted(begin, word.clamp(min=0), right=True) - 1).clamp(min=0)
    chosen = candidate & (word >= begin.gather(1, span)) & (word < end.gather(1, span)) & (
        end.gather(1, span) <= num_words[:, None])
    chosen &= chosen.long().cumsum(1) <= budget[:, None]  # the spans in order until the budget is spent
    # Top up with random candidates until each row has its budget.
    missing = budget - chosen.sum(1)
    keys = torch.where(candidate & ~chosen, torch.rand(batch, length, generator=generator, device=device), 2.0)
    rank = keys.argsort(1).argsort(1)
    return chosen | (candidate & ~chosen & (rank < missing[:, None]))


def permutation_batch(input_ids: Tensor, attention_mask: Tensor, token_type_ids: Tensor, word_starts: Tensor,
                      special_ids: Sequence[int], config: PermutationConfig,
                      generator: torch.Generator | None = None) -> PermutationBatch:
    """A factorisation order per row and its targets (`span_targets`) as perm_mask, target_mapping and labels.
    `special_ids` are the functional tokens (never predicted, ordered with the targets)."""
    config.check_length(input_ids.shape[1])
    device = input_ids.device
    batch, length = input_ids.shape
    real = attention_mask.bool()
    special = torch.isin(input_ids, torch.tensor(list(special_ids), dtype=input_ids.dtype, device=device))
    functional = real & special
    targets = span_targets(real & ~special, word_starts, config, generator)
    # rank[b, j]: j's place in a random order of the row; context tokens come first, all of them (-1).
    rank = torch.rand(batch, length, generator=generator, device=device).argsort(1).argsort(1)
    ordered = targets | functional
    order = torch.where(ordered, rank, -1)
    own = torch.where(targets, order, order + 1)  # a target may not see itself; the others may
    perm_mask = ((own[:, :, None] <= order[:, None, :]) & ordered[:, None, :]).float()
    slots = config.slots(length)
    positions = torch.arange(length, device=device)
    first = torch.where(targets, positions, length + positions).argsort(1)[:, :slots]  # targets in position order
    if first.shape[1] < slots:
        first = F.pad(first, (0, slots - first.shape[1]), value=0)
    used = torch.arange(slots, device=device)[None, :] < targets.sum(1, keepdim=True)
    target_mapping = F.one_hot(first, length).float() * used[..., None]
    labels = torch.where(used, input_ids.gather(1, first), -100)
    return PermutationBatch(input_ids, attention_mask, token_type_ids, perm_mask, target_mapping, labels,
                            used.sum(), masked_positions=used.nonzero())


class PermutationBatches:
    """The XLNet batch maker over pretraining instances: `permutation_batch` with a generator keyed by (seed,
    epoch, the batch's instance ids), so a resumed run sees the same orders and targets."""

    def __init__(self, config: PermutationConfig, special_ids: Sequence[int], seed: int, length: int) -> None:
        config.check_length(length, "data.instances.max_seq_length")
        self.config, self.special_ids, self.seed = config, tuple(special_ids), seed

    def __call__(self, instances) -> PermutationBatch:  # type: ignore[no-untyped-def]
        key = np.random.SeedSequence([self.seed, instances.epoch, *instances.instance_ids.tolist()])
        generator = torch.Generator(device=instances.input_ids.device)
        generator.manual_seed(int(key.generate_state(1, np.uint64)[0]) >> 1)
        return permutation_batch(instances.input_ids, instances.attention_mask, instances.token_type_ids,
                                 instances.word_starts, self.special_ids, self.config, generator)


@dataclass(eq=False)
class PermutationLM(nn.Module, Objective):
    """XLNet's objective on the tied `lm` head with its bias (XLNetLMHeadModel's `lm_loss`); `k`, `max_span` and
    `num_predict` configure its batches (`PermutationConfig`, `batch_maker`). On segment streams it carries the
    memory from batch to batch (see the module docstring). Stats: `lm_units` (predicted tokens), `lm_loss_sum`,
    `lm_correct`."""

    weight: float = 1.0
    k: float = 6.0
    max_span: int = 5
    num_predict: int | None = None
    name: str = "lm"
    trains: ClassVar[tuple[str, ...]] = ("xlnet",)

    def __post_init__(self) -> None:
        nn.Module.__init__(self)
        check_objective(self)
        # The memory the next training batch reads: [layers, M, B, H] and its mask [B, M] (sized on first use and
        # on loading a checkpoint; empty off segment streams).
        self.register_buffer("memory", torch.zeros(0))
        self.register_buffer("memory_mask", torch.zeros(0, dtype=torch.long))
        self.eval_memory: tuple[Tensor, Tensor] | None = None
        try:
            self.permutation = PermutationConfig(self.k, self.max_span, self.num_predict)
        except ConfigError as error:
            raise ConfigError(str(error).replace("permutation.", "objectives.plm.", 1)) from None

    def batch_maker(self, framing: Any, seed: int, length: int) -> PermutationBatches:
        """The batches this objective reads, from pretraining instances of `length` tokens framed by `framing`
        (its <cls> and <sep> are the functional tokens)."""
        special = tuple(i for i in (framing.cls_id, framing.sep_id) if i is not None)
        try:
            return PermutationBatches(self.permutation, special, seed, length)
        except ConfigError as error:
            raise ConfigError(str(error).replace("permutation.", "objectives.plm.", 1)) from None

    def heads(self) -> Sequence[HeadSpec]:
        return (HeadSpec(self.name, "tied_lm_bias"),)

    def reads(self, batch: PermutationBatch) -> Tensor | None:
        return torch.zeros(0, 2, dtype=torch.long)  # a pass of its own (its head at no slot, or with the memory)

    def units(self, batch: PermutationBatch) -> Tensor:
        return batch.num_targets.to(torch.int64).cpu()

    def _memory(self, batch: PermutationBatch) -> tuple[list[Tensor] | None, Tensor]:
        """The memory this batch reads (None: none yet) and the attention mask over it and the input."""
        assert batch.reset is not None
        state = ((self.memory, self.memory_mask) if self.memory.numel() else None) if self.training \
            else self.eval_memory
        if state is None or state[0].shape[2] != batch.reset.shape[0]:
            return None, batch.attention_mask  # the first batch (or a new batch size: a new stream)
        memory, mask = state
        mask = mask * (~batch.reset).to(mask.dtype)[:, None]  # hidden where a row starts a document
        return list(memory.unbind(0)), torch.cat([mask, batch.attention_mask.to(mask.dtype)], 1)

    def forward(self, passes: Passes, batch: PermutationBatch) -> ObjectiveOutput:
        """The model's pass (with the memory on segment streams); on CPU in fp32 without autocast its head runs at
        no slot and the loss makes the logits in cache-sized pieces (`linear_token_prediction`; on a GPU the pieces
        would be many small kernels), else at the used slots."""
        model = passes.model
        at = batch.masked_positions
        weight = model.word_embeddings.weight
        fused = linear_prediction_applies(weight)
        inputs = model.forward_inputs(batch)
        if fused:
            inputs["masked_positions"] = torch.zeros(0, 2, dtype=torch.long, device=batch.input_ids.device)
        if getattr(batch, "reset", None) is None:
            out = passes.run(**inputs)
        else:
            mems, attention_mask = self._memory(batch)
            out = passes.run(**{**inputs, "attention_mask": attention_mask}, mems=mems, use_mems=True)
            previous = attention_mask[:, :-batch.attention_mask.shape[1]] if mems is not None else None
            state = (torch.stack(out.mems).detach(), model.memory_mask(previous, batch.attention_mask).detach())
            if self.training:
                self.memory, self.memory_mask = state
            else:
                self.eval_memory = state
        used = batch.labels != IGNORE if at is None else None
        labels = batch.labels[at[:, 0], at[:, 1]] if at is not None else batch.labels[used]
        if fused:
            hidden = out.last_hidden_state
            hidden = hidden[at[:, 0], at[:, 1]] if at is not None else hidden[used]
            return linear_token_prediction(self.name, hidden, weight, getattr(model.heads[self.name], "bias", None),
                                           labels)
        logits = out.head_logits[self.name]  # at the used slots alone when `at` is given
        return token_prediction(self.name, logits if at is not None else logits[used], labels)

    def _load_from_state_dict(self, state_dict: Mapping[str, Any], prefix: str, *args: Any) -> None:
        for name in ("memory", "memory_mask"):  # the saved memory's shape is the one to continue from
            saved = state_dict.get(prefix + name)
            if isinstance(saved, Tensor):
                setattr(self, name, torch.zeros(saved.shape, dtype=saved.dtype, device=getattr(self, name).device))
        super()._load_from_state_dict(state_dict, prefix, *args)

    def summarize(self, totals: Mapping[str, float]) -> dict[str, float]:
        return token_prediction_summary(self.name, totals)
