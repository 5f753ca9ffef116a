"""SpanBERT's span masking (Joshi et al. 2020), as a batch maker.

Per sequence, following the SpanBERT code (``PairWithSpanMaskingScheme.mask`` and ``span_masking``): until the
budget of ``round(n x rate)`` tokens is masked (``n`` = maskable tokens, the same count as ``Masker``'s), draw a
span length of k whole words (``SpanConfig``: geometric, p = 0.2, on 1 .. 10 words, renormalised; mean 3.8), an
anchor token uniformly among the tokens not yet masked, and mask from the start of the anchor's word over k words
(not past the end of the segment); the token that reaches the budget ends the masking, even inside a word, so
the count is exact. Masked spans that touch are merged (SpanBERT's ``merge_intervals``). Each merged span is then
corrupted as a whole: with probability ``mask_token_prob`` all its tokens become the mask token, with
``random_token_prob`` all become random tokens (each its own draw from the replacement distribution), otherwise
all stay. The span boundary objective reads, for every masked token, the positions just outside its span
(``SpanBatch.span_left`` / ``span_right``, never masked: a special token at worst) and its offset in the span.

A row's spans depend only on its key (``masking_seeds``: seed, instance, epoch), and on the rate of the batch's
step when the rate follows a schedule, so a resumed run sees the same batches.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from bertology.data.dataset import InstanceBatch, PretrainingBatch, StepClock
from bertology.data.masking import Masker, SpanConfig, masking_seeds
from bertology.errors import ConfigError, DataError


@dataclass
class SpanBatch(PretrainingBatch):
    """A span-masked batch: ``PretrainingBatch`` plus, aligned with ``masked_positions`` (row-major), the columns
    of the span's left and right boundary tokens and the token's offset in its span (0 = first)."""

    span_left: torch.Tensor | None = None  # [N]
    span_right: torch.Tensor | None = None  # [N]
    span_offset: torch.Tensor | None = None  # [N]


@dataclass
class RowSpans:
    """One row's masking: the selected token columns (sorted), the drawn span lengths in words (the SpanBERT
    draws, before the budget cuts the last one), and the merged spans as (first, last) columns."""

    selected: np.ndarray
    drawn_words: list[int]
    spans: list[tuple[int, int]]


def row_key_generator(key: int) -> np.random.Generator:
    """A row's random stream, from its 64-bit masking key (``masking_seeds``)."""
    return np.random.Generator(np.random.PCG64(int(key) % 2**64))


def sample_row_spans(candidate: np.ndarray, new_word: np.ndarray, budget: int, spans: SpanConfig,
                     rng: np.random.Generator) -> RowSpans:
    """SpanBERT's selection for one row. ``candidate [L]``: maskable tokens; ``new_word [L]``: candidates that
    start a word. Words never cross a non-candidate token (a special between two segments)."""
    length = len(candidate)
    positions = np.flatnonzero(candidate)
    selected = np.zeros(length, dtype=bool)
    drawn: list[int] = []
    if budget <= 0 or len(positions) == 0:
        return RowSpans(positions[:0], drawn, [])
    budget = min(budget, len(positions))
    word_of = np.cumsum(new_word) - 1  # word index of every candidate
    starts = np.flatnonzero(new_word)
    # A word ends (exclusive) at the next word's start or at the first non-candidate after its start.
    gaps = np.append(np.flatnonzero(~candidate), length)
    ends = np.minimum(np.append(starts[1:], length), gaps[np.searchsorted(gaps, starts)])
    # Segment of each word: words separated by a gap cannot be in one span.
    segment = np.cumsum(np.concatenate([[True], starts[1:] != ends[:-1]])) - 1
    last_word_of_segment = np.searchsorted(segment, segment, side="right") - 1
    cdf = np.cumsum(spans.length_probabilities())
    cdf[-1] = 1.0
    count = 0
    while count < budget:
        words = int(np.searchsorted(cdf, rng.random(), side="right")) + 1
        drawn.append(words)
        free = positions[~selected[positions]]
        anchor = int(free[rng.integers(len(free))])
        first = int(word_of[anchor])
        last = min(first + words - 1, int(last_word_of_segment[first]))
        tokens = np.arange(starts[first], ends[last])
        new = tokens[~selected[tokens]][: budget - count]
        selected[new] = True
        count += len(new)
    columns = np.flatnonzero(selected)
    # Maximal runs of selected columns: touching spans are one span (SpanBERT merges them).
    breaks = np.flatnonzero(columns[1:] - columns[:-1] != 1)
    firsts = np.concatenate([columns[:1], columns[breaks + 1]])
    lasts = np.concatenate([columns[breaks], columns[-1:]])
    return RowSpans(columns, drawn, list(zip(firsts.tolist(), lasts.tolist())))


class SpanBatches:
    """The SpanBERT batch maker: span masking keyed by (seed, instance, epoch), rate from the batch's step on a
    schedule. ``masker`` supplies the masking config (``spans`` must be set), the special ids and the replacement
    distribution."""

    def __init__(self, masker: Masker, seed: int, dupe_factor: int, clock: StepClock | None = None) -> None:
        config = masker.config
        if config.spans is None:
            raise ConfigError("SpanBatches: MaskingConfig.spans is not set")
        if config.schedule != "constant" and clock is None:
            raise ConfigError("SpanBatches: a masking-rate schedule needs a StepClock (the run's grad_accumulation "
                              "and total_steps)")
        self.masker = masker
        self._specials = torch.tensor(sorted(masker.special_ids), dtype=torch.long)
        self.spans = config.spans
        self.seed = seed
        self.dupe_factor = dupe_factor
        self.clock = clock
        self.needs_position = config.schedule != "constant"

    def rate(self, instances: InstanceBatch) -> float:
        if not self.needs_position:
            return self.masker.config.mlm_probability
        assert self.clock is not None
        return self.masker.config.probability_at(self.clock.progress(instances.position))

    def select(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, word_starts: torch.Tensor,
               generators: list[np.random.Generator], rate: float) -> list[RowSpans]:
        """Every row's span selection (see ``sample_row_spans``), row ``r`` drawing from ``generators[r]``."""
        if input_ids.dim() != 2 or attention_mask.shape != input_ids.shape or word_starts.shape != input_ids.shape:
            raise DataError(f"SpanBatches: input_ids, attention_mask and word_starts must be [B, L] alike, got "
                            f"{tuple(input_ids.shape)}, {tuple(attention_mask.shape)}, {tuple(word_starts.shape)}")
        cfg = self.masker.config
        candidate = (attention_mask.bool() & ~torch.isin(input_ids, self._specials)).numpy()
        after_gap = np.ones_like(candidate)
        after_gap[:, 1:] = ~candidate[:, :-1]
        new_word = candidate & (word_starts.bool().numpy() | after_gap)
        maskable = candidate.sum(axis=1)
        budgets = np.where(maskable > 0, np.maximum(1, np.round(maskable * rate)), 0).astype(np.int64)
        if cfg.max_predictions is not None:
            budgets = np.minimum(budgets, cfg.max_predictions)
        return [sample_row_spans(candidate[r], new_word[r], int(budgets[r]), self.spans, generators[r])
                for r in range(input_ids.shape[0])]

    def __call__(self, instances: InstanceBatch) -> SpanBatch:
        cfg = self.masker.config
        keys = masking_seeds(self.seed, instances.instance_ids.numpy(), instances.epoch, self.dupe_factor,
                             cfg.dynamic).numpy().view(np.uint64)
        generators = [row_key_generator(int(key)) for key in keys]
        ids = instances.input_ids
        rows = self.select(ids, instances.attention_mask, instances.word_starts, generators, self.rate(instances))
        # Per span: its row, first and last column; the corruption draws continue each row's own stream.
        span_rows, firsts, lasts, actions, token_uniforms = [], [], [], [], []
        for r, row in enumerate(rows):
            if not row.spans:
                continue
            bounds = np.array(row.spans, dtype=np.int64)
            span_rows.append(np.full(len(bounds), r))
            firsts.append(bounds[:, 0])
            lasts.append(bounds[:, 1])
            actions.append(generators[r].random(len(bounds)))
            token_uniforms.append(generators[r].random(len(row.selected)))
        if not span_rows:
            empty = torch.zeros(0, dtype=torch.long)
            return SpanBatch(ids.clone(), instances.attention_mask, instances.token_type_ids,
                             torch.zeros(0, 2, dtype=torch.long), empty, instances.next_sentence_labels,
                             instances.instance_ids, empty, empty, empty)
        span_row, first, last = (np.concatenate(a) for a in (span_rows, firsts, lasts))
        action = np.concatenate(actions)
        sizes = last - first + 1
        # One entry per masked token, row-major: rows and spans are in order, tokens in order within a span.
        token_span = np.repeat(np.arange(len(sizes)), sizes)
        offset = np.arange(int(sizes.sum())) - np.repeat(np.cumsum(sizes) - sizes, sizes)
        row_index = torch.from_numpy(span_row[token_span])
        column_index = torch.from_numpy(first[token_span] + offset)
        token_action = torch.from_numpy(action[token_span])
        to_mask = token_action < cfg.mask_token_prob
        to_random = ~to_mask & (token_action < cfg.mask_token_prob + cfg.random_token_prob)
        masked = ids.clone()
        masked[row_index[to_mask], column_index[to_mask]] = self.masker.special.mask_id
        if bool(to_random.any()):
            replacement = self.masker.replacement_ids(torch.from_numpy(np.concatenate(token_uniforms)))
            masked[row_index[to_random], column_index[to_random]] = replacement[to_random].to(masked.dtype)
        positions = torch.stack([row_index, column_index], dim=1).long()
        labels = ids[row_index, column_index].long()
        return SpanBatch(masked, instances.attention_mask, instances.token_type_ids, positions, labels,
                         instances.next_sentence_labels, instances.instance_ids,
                         torch.from_numpy(first[token_span] - 1), torch.from_numpy(last[token_span] + 1),
                         torch.from_numpy(offset))
