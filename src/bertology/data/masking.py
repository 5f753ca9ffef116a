"""Masked-language-model masking of a padded batch, vectorised in torch.

Selection (``MaskingConfig.selection``):

* ``count`` (default, BERT's way): each sequence gets exactly
  ``min(max_predictions, max(1, round(n * mlm_probability)))`` predictions, ``n`` = its maskable tokens. BERT counts
  ``n`` over all tokens including the specials; here only maskable tokens count, so the rate is
  ``mlm_probability`` up to rounding.
* ``bernoulli``: every maskable token (word, with ``whole_word``) is selected independently with probability
  ``mlm_probability``, then capped at ``max_predictions`` in random order: exactly ``mlm_probability`` in
  expectation without a cap.

With ``whole_word`` the unit is a word (a word-start token plus its continuation tokens); as in BERT, words are
visited in random order and taken while they fit the token budget, so the count is in tokens and a word never
gets masked in part. Selected tokens become the mask token (``mask_token_prob``), a random token
(``random_token_prob``, uniform over the non-special vocabulary or from the corpus unigram distribution) or stay.
Specials and padding are never selected.

The rate may follow a schedule over training (``schedule``: from ``start_probability`` at the first optimizer step
to ``mlm_probability`` at the last, linearly or on a half cosine; Wettig et al. 2023 decay 40 % to 20 %): the batch
maker passes each batch's rate to the masker (``MaskingConfig.probability_at``), so a batch stays a pure function
of (seed, instance, epoch, step). ``spans`` selects SpanBERT's span masking instead of token or word masking
(``bertology.data.span_masking``).

Randomness comes either from a ``torch.Generator`` or from one 64-bit key per row (``seeds``), hashed with the
column: a row's mask then depends only on its key, not on the batch it is in. ``masking_seeds`` derives the keys
from ``(seed, instance id, epoch % dupe_factor)`` for static masking or ``(seed, instance id, epoch)`` for dynamic.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, get_args

import numpy as np
import torch

from bertology.config import from_mapping, validate
from bertology.tokenization.framing import Framing
from bertology.errors import ConfigError, DataError

Selection = Literal["count", "bernoulli"]
Replacement = Literal["uniform", "unigram"]
RateSchedule = Literal["constant", "linear", "cosine"]
SELECTIONS: tuple[str, ...] = get_args(Selection)
REPLACEMENTS: tuple[str, ...] = get_args(Replacement)
RATE_SCHEDULES: tuple[str, ...] = get_args(RateSchedule)

# Independent random streams per position.
_PRIORITY, _BERNOULLI, _ACTION, _REPLACEMENT = range(4)
_STREAMS = 4
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MASK_TAG = np.uint64(0x6D61736B696E6721)


@dataclass
class SpanConfig:
    """SpanBERT's span lengths (``MaskingConfig.spans``): a number of whole words drawn from a geometric
    distribution with success probability ``geometric_p`` on 1, 2, ..., ``max_words``, renormalised there (as the
    SpanBERT code does; p = 0.2 and 10 words give the paper's mean of 3.8 words)."""

    geometric_p: float = 0.2
    max_words: int = 10

    def __post_init__(self) -> None:
        where = "SpanConfig"
        validate(self, where)
        if not 0.0 < self.geometric_p <= 1.0:
            raise ConfigError(f"{where}.geometric_p: must be in (0, 1], got {self.geometric_p}")
        if self.max_words < 1:
            raise ConfigError(f"{where}.max_words: a span is at least one word; must be >= 1, got {self.max_words}")

    def length_probabilities(self) -> np.ndarray:
        """P(span = k words) for k = 1 .. max_words."""
        k = np.arange(self.max_words, dtype=np.float64)
        weights = self.geometric_p * (1.0 - self.geometric_p) ** k
        return weights / weights.sum()

    def mean_words(self) -> float:
        """The expected span length in words."""
        return float((np.arange(1, self.max_words + 1) * self.length_probabilities()).sum())


@dataclass
class MaskingConfig:
    """MLM masking rates and options (see the module docstring)."""

    mlm_probability: float = 0.15
    mask_token_prob: float = 0.8
    random_token_prob: float = 0.1
    whole_word: bool = False
    replacement: Replacement = "uniform"
    max_predictions: int | None = None
    selection: Selection = "count"
    dynamic: bool = False
    # The rate over training: constant (mlm_probability), or from start_probability to mlm_probability.
    schedule: RateSchedule = "constant"
    start_probability: float | None = None
    spans: SpanConfig | None = None  # SpanBERT span masking (always in whole words)

    def __post_init__(self) -> None:
        where = "MaskingConfig"
        validate(self, where)
        if not 0.0 < self.mlm_probability < 1.0:
            raise ConfigError(f"{where}.mlm_probability: must be in (0, 1), got {self.mlm_probability}")
        if self.start_probability is not None and not 0.0 < self.start_probability < 1.0:
            raise ConfigError(f"{where}.start_probability: must be in (0, 1), got {self.start_probability}")
        if self.schedule != "constant" and self.start_probability is None:
            raise ConfigError(f"{where}.start_probability: schedule {self.schedule!r} needs the rate to start from")
        if self.schedule == "constant" and self.start_probability is not None:
            raise ConfigError(f"{where}.start_probability: only used with a schedule (linear or cosine); "
                              f"schedule is 'constant'")
        if self.spans is not None and self.selection != "count":
            raise ConfigError(f"{where}.selection: span masking selects a count of tokens; "
                              f"selection {self.selection!r} does not apply")
        for key in ("mask_token_prob", "random_token_prob"):
            value = getattr(self, key)
            if not 0.0 <= value <= 1.0:
                raise ConfigError(f"{where}.{key}: must be in [0, 1], got {value}")
        if self.mask_token_prob + self.random_token_prob > 1.0 + 1e-12:
            raise ConfigError(f"{where}: mask_token_prob + random_token_prob must be <= 1, got "
                              f"{self.mask_token_prob} + {self.random_token_prob}")
        if self.max_predictions is not None and self.max_predictions < 1:
            raise ConfigError(f"{where}.max_predictions: must be >= 1 or None, got {self.max_predictions}")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> MaskingConfig:
        return from_mapping(cls, data, "masking")

    def probability_at(self, progress: float) -> float:
        """The masking rate at ``progress`` in [0, 1] (0: the first optimizer step, 1: the last)."""
        if self.schedule == "constant" or self.start_probability is None:
            return self.mlm_probability
        t = min(max(float(progress), 0.0), 1.0)
        start, end = self.start_probability, self.mlm_probability
        if self.schedule == "linear":
            return start + (end - start) * t
        return end + (start - end) * 0.5 * (1.0 + math.cos(math.pi * t))

    def final(self) -> MaskingConfig:
        """This config at its last step's rate, without a schedule (held-out masking: one fixed rate)."""
        return dataclasses.replace(self, schedule="constant", start_probability=None)


@dataclass
class MaskedInputs:
    """Masked ids ``[B, L]``, the selected ``(row, column)`` pairs ``[N, 2]`` (row-major) and their original ids."""

    input_ids: torch.Tensor
    masked_positions: torch.Tensor
    mlm_labels: torch.Tensor


def _mix64(x: np.ndarray) -> np.ndarray:
    """SplitMix64 finaliser on a uint64 array (wrapping arithmetic)."""
    x = x ^ (x >> np.uint64(30))
    x = x * np.uint64(0xBF58476D1CE4E5B9)
    x = x ^ (x >> np.uint64(27))
    x = x * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def masking_seeds(seed: int, instance_ids: Iterable[int] | np.ndarray, epoch: int, dupe_factor: int,
                  dynamic: bool) -> torch.Tensor:
    """Per-instance masking keys ``[B]`` (int64): from ``(seed, id, epoch % dupe_factor)``, or ``epoch`` if dynamic."""
    if dupe_factor < 1:
        raise ConfigError(f"masking_seeds: dupe_factor must be >= 1, got {dupe_factor}")
    ids = np.asarray(instance_ids, dtype=np.int64).reshape(-1)
    if ids.size and ids.min() < 0:
        raise DataError(f"masking_seeds: negative instance id {int(ids.min())}")
    round_ = epoch if dynamic else epoch % dupe_factor
    base = _mix64(np.array([int(seed) % 2**64], dtype=np.uint64) ^ _MASK_TAG)
    base = _mix64(base + np.array([int(round_) % 2**64], dtype=np.uint64) * _GOLDEN)
    keys = _mix64(base + (ids.astype(np.uint64) + np.uint64(1)) * _GOLDEN)
    return torch.from_numpy(keys.view(np.int64).copy())


def _keyed_uniforms(keys: torch.Tensor, length: int, stream: int) -> torch.Tensor:
    """Uniforms in [0, 1) ``[B, length]`` (float64): a hash of (row key, column, stream), 53 random bits each."""
    k = keys.detach().cpu().numpy().astype(np.int64).view(np.uint64)
    counters = np.arange(length, dtype=np.uint64) * np.uint64(_STREAMS) + np.uint64(stream + 1)
    bits = _mix64(k[:, None] + counters[None, :] * _GOLDEN) >> np.uint64(11)
    return torch.from_numpy(bits.astype(np.float64) * 2.0**-53)


class Masker:
    """Select MLM positions of a padded batch and corrupt them (see the module docstring)."""

    def __init__(self, config: MaskingConfig, special: Framing, vocab_size: int,
                 special_ids: Iterable[int] = (), unigram_counts: np.ndarray | None = None) -> None:
        special.require("mask", "masked-LM")  # a framing without a mask token (GPT-2, T5) cannot mask
        self.config = config
        self.special = special
        self.vocab_size = int(vocab_size)
        self.special_ids = frozenset(int(i) for i in special_ids) | special.ids
        bad = sorted(i for i in self.special_ids if not 0 <= i < self.vocab_size)
        if bad:
            raise ConfigError(f"Masker: special id(s) {bad} outside the vocabulary of size {self.vocab_size}")
        self._specials = torch.tensor(sorted(self.special_ids), dtype=torch.long)
        ordinary = np.setdiff1d(np.arange(self.vocab_size), np.array(sorted(self.special_ids)))
        if len(ordinary) == 0:
            raise ConfigError(f"Masker: every one of the {self.vocab_size} vocabulary ids is special")
        self._ordinary = torch.from_numpy(ordinary.astype(np.int64))
        self._unigram_cdf: torch.Tensor | None = None
        if config.replacement == "unigram":
            self._unigram_cdf = self._cdf(unigram_counts)
        elif unigram_counts is not None:
            raise ConfigError("Masker: unigram_counts given but MaskingConfig.replacement is 'uniform'")

    def _cdf(self, counts: np.ndarray | None) -> torch.Tensor:
        if counts is None:
            raise ConfigError("Masker: MaskingConfig.replacement 'unigram' needs unigram_counts")
        counts = np.asarray(counts, dtype=np.float64)
        if counts.shape != (self.vocab_size,):
            raise ConfigError(f"Masker: unigram_counts has shape {counts.shape}, expected ({self.vocab_size},)")
        if not np.all(np.isfinite(counts)) or counts.min() < 0:
            raise ConfigError("Masker: unigram_counts must be finite and non-negative")
        counts = counts.copy()
        counts[sorted(self.special_ids)] = 0.0
        cdf = np.cumsum(counts)
        if cdf[-1] <= 0:
            raise ConfigError("Masker: unigram_counts has no mass outside the special ids")
        # Dividing by the last entry makes it exactly 1, so a uniform in [0, 1) never runs past the end.
        return torch.from_numpy(cdf / cdf[-1])

    def replacement_ids(self, uniforms: torch.Tensor) -> torch.Tensor:
        """Random replacement tokens for uniforms in [0, 1) (any shape): uniform over the non-special vocabulary,
        or from the unigram distribution (``MaskingConfig.replacement``)."""
        if self._unigram_cdf is None:
            ordinary = self._ordinary.to(uniforms.device)
            pick = (uniforms * len(ordinary)).long().clamp(max=len(ordinary) - 1)
            return ordinary[pick]
        cdf = self._unigram_cdf.to(uniforms.device)
        return torch.searchsorted(cdf, uniforms, right=True).clamp(max=self.vocab_size - 1)

    def __call__(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, word_starts: torch.Tensor | None = None,
                 *, generator: torch.Generator | None = None, seeds: torch.Tensor | None = None,
                 mlm_probability: float | None = None) -> MaskedInputs:
        """Mask ``input_ids [B, L]``; randomness from ``generator`` or from per-row keys ``seeds [B]``.
        ``mlm_probability``: this batch's rate (a scheduled one), else the config's."""
        cfg = self.config
        rate = cfg.mlm_probability if mlm_probability is None else float(mlm_probability)
        if not 0.0 < rate < 1.0:
            raise DataError(f"Masker: mlm_probability must be in (0, 1), got {rate}")
        if input_ids.dim() != 2:
            raise DataError(f"Masker: input_ids must be [B, L], got shape {tuple(input_ids.shape)}")
        if attention_mask.shape != input_ids.shape:
            raise DataError(f"Masker: attention_mask shape {tuple(attention_mask.shape)} != input_ids shape "
                            f"{tuple(input_ids.shape)}")
        if cfg.whole_word:
            if word_starts is None:
                raise DataError("Masker: whole-word masking needs word_starts")
            if word_starts.shape != input_ids.shape:
                raise DataError(f"Masker: word_starts shape {tuple(word_starts.shape)} != input_ids shape "
                                f"{tuple(input_ids.shape)}")
        if (generator is None) == (seeds is None):
            raise DataError("Masker: pass exactly one of generator= and seeds=")
        if seeds is not None and seeds.shape != input_ids.shape[:1]:
            raise DataError(f"Masker: seeds must be [B] = [{input_ids.shape[0]}], got {tuple(seeds.shape)}")
        batch, length = input_ids.shape
        device = input_ids.device

        def uniforms(stream: int) -> torch.Tensor:
            if seeds is not None:
                return _keyed_uniforms(seeds, length, stream).to(device)
            return torch.rand((batch, length), generator=generator, dtype=torch.float64, device=device)

        u_priority, u_bernoulli, u_action, u_replacement = (uniforms(s) for s in range(_STREAMS))

        candidate = attention_mask.bool() & ~torch.isin(input_ids, self._specials.to(device))
        # Word structure: a word starts at a word-start token or after a non-maskable one (a special, or the cut
        # of a truncated sequence), so continuation tokens always belong to a word.
        if cfg.whole_word:
            assert word_starts is not None
            after_gap = torch.ones_like(candidate)
            after_gap[:, 1:] = ~candidate[:, :-1]
            new_word = candidate & (word_starts.bool().to(device) | after_gap)
        else:
            new_word = candidate
        word_index = (torch.cumsum(new_word.long(), dim=1) - 1).clamp(min=0)
        words = new_word.sum(dim=1)
        slots = torch.arange(length, device=device)
        word_valid = slots[None, :] < words[:, None]
        word_length = torch.zeros((batch, length), dtype=torch.long, device=device)
        word_length.scatter_add_(1, word_index, candidate.long())

        if cfg.selection == "count":
            maskable = candidate.sum(dim=1)
            budget = torch.round(maskable.double() * rate).long().clamp(min=1)
            budget = torch.where(maskable > 0, budget, torch.zeros_like(budget))
            chosen = word_valid
        else:
            budget = torch.full((batch,), length, dtype=torch.long, device=device)
            chosen = word_valid & (u_bernoulli < rate)
        if cfg.max_predictions is not None:
            budget = budget.clamp(max=cfg.max_predictions)

        # Visit words in random order and take each that still fits the budget (BERT's loop), in rounds: a round
        # takes the longest run of fitting words, in visiting order, whose lengths add up within the budget.
        # A word that did not fit stays too long in later rounds, since the budget only shrinks.
        order = torch.argsort(torch.where(chosen, u_priority, torch.full_like(u_priority, 2.0)), dim=1)
        sorted_length = torch.gather(word_length, 1, order)
        sorted_chosen = torch.gather(chosen, 1, order)
        taken = torch.zeros_like(sorted_chosen)
        remaining = budget.clone()
        while True:
            eligible = sorted_chosen & ~taken & (sorted_length <= remaining[:, None])
            running = torch.cumsum(sorted_length * eligible, dim=1)
            new = eligible & (running <= remaining[:, None])
            if not bool(new.any()):
                break
            taken |= new
            remaining -= (sorted_length * new).sum(dim=1)
        word_taken = torch.zeros_like(taken).scatter_(1, order, taken)
        selected = candidate & torch.gather(word_taken, 1, word_index)

        to_mask = selected & (u_action < cfg.mask_token_prob)
        to_random = selected & ~to_mask & (u_action < cfg.mask_token_prob + cfg.random_token_prob)
        replacement = self.replacement_ids(u_replacement)

        masked = input_ids.clone()
        masked[to_mask] = self.special.mask_id
        masked[to_random] = replacement[to_random].to(masked.dtype)
        positions = selected.nonzero()
        labels = input_ids[selected].long()
        return MaskedInputs(masked, positions, labels)
