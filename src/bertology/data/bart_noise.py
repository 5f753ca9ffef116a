"""BART's five noise functions (Lewis et al. 2019), vectorised over a padded batch with keyed randomness.

A row is one framed document (``<s> text </s>`` for BART, the single-text template of any `Framing` with a mask
token; instance kind ``doc-sentences``); the source is the noised text in the same framing, the target the row as
given. Whatever lies between the framing is text, a special id too (a corpus's literal ``</s>`` is tokenized as
one), except that a mask token is never masked or deleted again. The functions chosen in
the ``noise`` section run in this order, each on the previous one's output:

1. ``sentence_permutation``: ``round(rate x S)`` of the row's ``S`` sentences, chosen at random, are shuffled
   among their own places (rate 1: all sentences in a random order); needs sentence starts.
2. ``text_infilling``: ``M = round(rate x n)`` of the ``n`` text tokens are masked in spans whose lengths are
   drawn from Poisson(``poisson_lambda``) until they add up to ``M`` (the last one cut to fit, so exactly ``M``
   tokens go); each span, 0-length ones included, becomes ONE mask token (a 0-length span inserts one). The spans
   sit in distinct gaps between the ``n - M`` kept tokens (chosen uniformly), so two spans never touch and every
   mask of the source stands for one drawn span; only when spans outnumber those ``n - M + 1`` gaps (a rate near
   ``lambda / (lambda + 1)`` or a very short text) do the last ones join the last placed span.
3. ``token_masking``: ``round(rate x c)`` of the ``c`` text tokens that are not already mask tokens become the
   mask token.
4. ``token_deletion``: ``round(rate x c)`` of those tokens are removed.
5. ``document_rotation``: with probability ``rate`` the text is rotated to start at a uniformly chosen token
   (which may be its first); the framing stays in place.

With ``whole_words`` (infilling, masking, deletion) the rate and the span lengths count words (a word start and its
continuation tokens, from the tokenizer's word starts), and chosen words go whole, as in fairseq's BART.

Each function draws from its own stream of a row's 64-bit key (``masking_seeds``: seed, instance, epoch), hashed
with the position, so a row's noise depends only on its key and its tokens, never on the batch it is in or its
padding. ``NoiseConfig.dynamic`` (default, as in fairseq) noises every epoch afresh; otherwise the noise of an
instance repeats every ``dupe_factor`` epochs, like static masking.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

import numpy as np
import torch

from bertology.config import from_mapping, validate
from bertology.data.dataset import InstanceBatch
from bertology.data.masking import _GOLDEN, _mix64, masking_seeds
from bertology.errors import ConfigError, DataError
from bertology.tokenization.framing import Framing

FUNCTIONS: tuple[str, ...] = ("sentence_permutation", "text_infilling", "token_masking", "token_deletion",
                              "document_rotation")
# A tag per function: its stream of a row's key is the key mixed with the tag.
_TAGS = {name: np.uint64(0x62617274_00000000 + i) for i, name in enumerate(FUNCTIONS)}
_STREAMS = 2  # uniforms per position and function
_MAX_LAMBDA = 64.0


def _check_rate(where: str, rate: float, closed: bool) -> None:
    if not (0.0 < rate <= 1.0 if closed else 0.0 < rate < 1.0):
        raise ConfigError(f"{where}.rate: must be in (0, 1{']' if closed else ')'}, got {rate}")


@dataclass
class TokenMaskingConfig:
    """Replace ``rate`` of the text tokens by the mask token (``whole_words``: of the words, every token of each)."""

    rate: float = 0.15
    whole_words: bool = False

    def __post_init__(self) -> None:
        validate(self, "TokenMaskingConfig")
        _check_rate("TokenMaskingConfig", self.rate, closed=False)


@dataclass
class TokenDeletionConfig:
    """Delete ``rate`` of the text tokens (``whole_words``: of the words)."""

    rate: float = 0.15
    whole_words: bool = False

    def __post_init__(self) -> None:
        validate(self, "TokenDeletionConfig")
        _check_rate("TokenDeletionConfig", self.rate, closed=False)


@dataclass
class TextInfillingConfig:
    """Mask ``rate`` of the text tokens in spans of Poisson(``poisson_lambda``) lengths, one mask token a span
    (``whole_words``: rate and lengths count words, as fairseq's BART does)."""

    rate: float = 0.3
    poisson_lambda: float = 3.0
    whole_words: bool = False

    def __post_init__(self) -> None:
        where = "TextInfillingConfig"
        validate(self, where)
        _check_rate(where, self.rate, closed=False)
        if not 0.0 < self.poisson_lambda <= _MAX_LAMBDA:
            raise ConfigError(f"{where}.poisson_lambda: the mean span length must be in (0, {_MAX_LAMBDA:g}], "
                              f"got {self.poisson_lambda}")

    def length_cdf(self) -> np.ndarray:
        """P(span length <= k) for k = 0, 1, ... until 1 - P < 2**-53 (the last entry set to exactly 1)."""
        lam = self.poisson_lambda
        pmf = [np.exp(-lam)]
        while True:
            total = float(np.sum(pmf))
            if 1.0 - total < 2.0**-53 or len(pmf) > 1000:
                break
            pmf.append(pmf[-1] * lam / len(pmf))
        cdf = np.cumsum(np.asarray(pmf, dtype=np.float64))
        cdf[-1] = 1.0
        return cdf


@dataclass
class SentencePermutationConfig:
    """Shuffle ``rate`` of the sentences among their places (1.0: every sentence)."""

    rate: float = 1.0

    def __post_init__(self) -> None:
        validate(self, "SentencePermutationConfig")
        _check_rate("SentencePermutationConfig", self.rate, closed=True)


@dataclass
class DocumentRotationConfig:
    """Rotate a document with probability ``rate`` to start at a uniformly chosen token."""

    rate: float = 1.0

    def __post_init__(self) -> None:
        validate(self, "DocumentRotationConfig")
        _check_rate("DocumentRotationConfig", self.rate, closed=True)


@dataclass
class NoiseConfig:
    """The run config's ``noise`` section: each noise function that is given (a mapping of its options, ``{}`` for
    the defaults) is applied, in the order of the module docstring. ``dynamic``: new noise every epoch."""

    sentence_permutation: SentencePermutationConfig | None = None
    text_infilling: TextInfillingConfig | None = None
    token_masking: TokenMaskingConfig | None = None
    token_deletion: TokenDeletionConfig | None = None
    document_rotation: DocumentRotationConfig | None = None
    dynamic: bool = True

    def __post_init__(self) -> None:
        validate(self, "NoiseConfig")
        if not self.functions:
            raise ConfigError(f"NoiseConfig: no noise function chosen; give one or more of {', '.join(FUNCTIONS)}")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> NoiseConfig:
        return from_mapping(cls, data, "noise")

    @property
    def functions(self) -> tuple[str, ...]:
        """The chosen functions in the order they run."""
        return tuple(name for name in FUNCTIONS if getattr(self, name) is not None)

    @property
    def whole_words(self) -> tuple[str, ...]:
        """The chosen functions that count whole words."""
        return tuple(name for name in self.functions if getattr(getattr(self, name), "whole_words", False))


@dataclass
class NoisedBatch:
    """Noised sources and their targets (the rows as given), each right-padded with the framing's fill id."""

    input_ids: torch.Tensor  # [B, Ls]
    attention_mask: torch.Tensor  # [B, Ls]
    target_ids: torch.Tensor  # [B, Lt]
    target_mask: torch.Tensor  # [B, Lt]
    instance_ids: torch.Tensor | None = None  # [B] ids in the epoch's instance list

    def to(self, device: torch.device | str, non_blocking: bool = False) -> NoisedBatch:
        return type(self)(**{f.name: None if getattr(self, f.name) is None
                             else getattr(self, f.name).to(device, non_blocking=non_blocking) for f in fields(self)})

    def __len__(self) -> int:
        return self.input_ids.shape[0]


def _uniforms(keys: np.ndarray, count: int, stream: int) -> np.ndarray:
    """Uniforms in [0, 1) ``[B, count]`` (float64): a hash of (row key, index, stream), 53 random bits each."""
    counters = np.arange(count, dtype=np.uint64) * np.uint64(_STREAMS) + np.uint64(stream + 1)
    bits = _mix64(keys[:, None] + counters[None, :] * _GOLDEN) >> np.uint64(11)
    return bits.astype(np.float64) * 2.0**-53


def function_keys(keys: torch.Tensor, name: str) -> np.ndarray:
    """The keys ``[B]`` (uint64) of noise function ``name``'s stream, from the rows' keys ``[B]`` (int64)."""
    return _mix64(keys.detach().cpu().numpy().astype(np.int64).view(np.uint64) ^ _TAGS[name])


def _ranks(priority: np.ndarray) -> np.ndarray:
    """Each entry's rank in its row (0: smallest)."""
    order = np.argsort(priority, axis=1, kind="stable")
    ranks = np.empty_like(order)
    np.put_along_axis(ranks, order, np.broadcast_to(np.arange(priority.shape[1]), order.shape), axis=1)
    return ranks


def _select(candidate: np.ndarray, rate: float, uniforms: np.ndarray) -> np.ndarray:
    """Exactly ``round(rate x count)`` of each row's candidates, uniformly at random."""
    budget = np.round(candidate.sum(axis=1) * rate).astype(np.int64)
    return candidate & (_ranks(np.where(candidate, uniforms, 2.0)) < budget[:, None])


def _compact(tokens: np.ndarray, keep: np.ndarray, fill: int) -> tuple[np.ndarray, np.ndarray]:
    """The kept tokens of each row moved to its front, and the new lengths."""
    lengths = keep.sum(axis=1)
    out = np.full((len(tokens), max(1, int(lengths.max(initial=0)))), fill, dtype=tokens.dtype)
    rows, columns = np.nonzero(keep)
    out[rows, (np.cumsum(keep, axis=1) - 1)[rows, columns]] = tokens[rows, columns]
    return out, lengths


class BartNoise:
    """The noise functions of a ``NoiseConfig`` over framed rows (see the module docstring). ``max_length``: the
    longest source the model takes (its positions); infilling lengthens a text only where its spans outnumber
    the tokens they mask (many 0-length spans in a short text), and such a source is cut at the end of its text."""

    def __init__(self, config: NoiseConfig, framing: Framing, max_length: int | None = None) -> None:
        self.config = config
        self.framing = framing
        self.mask_id = framing.require("mask", "BART's noise")
        pieces = framing.pieces(False)
        text = next(i for i, piece in enumerate(pieces) if piece.text is not None)
        self.prefix = [i for piece in pieces[:text] for i in piece.ids]
        self.suffix = [i for piece in pieces[text + 1:] for i in piece.ids]
        overhead = len(self.prefix) + len(self.suffix)
        if max_length is not None and max_length <= overhead:
            raise ConfigError(f"BartNoise: max_length {max_length} leaves no room for text beside the {overhead} "
                              f"special tokens of the {framing.style} framing")
        self.max_text = None if max_length is None else max_length - overhead
        self._length_cdf = None if config.text_infilling is None else config.text_infilling.length_cdf()

    # ------------------------------------------------------------------ framed rows <-> texts
    def _texts(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
               **flags: torch.Tensor | None) -> tuple[np.ndarray, np.ndarray, list[np.ndarray | None]]:
        """The text of every row (framing removed), left-aligned, its lengths, and ``flags`` (word or sentence
        starts) over the texts, each True at the first token of a text."""
        if input_ids.dim() != 2 or attention_mask.shape != input_ids.shape:
            raise DataError(f"BartNoise: input_ids and attention_mask must be [B, L] alike, got "
                            f"{tuple(input_ids.shape)} and {tuple(attention_mask.shape)}")
        for name, value in flags.items():
            if value is not None and value.shape != input_ids.shape:
                raise DataError(f"BartNoise: {name} shape {tuple(value.shape)} != input_ids shape "
                                f"{tuple(input_ids.shape)}")
        ids = input_ids.detach().cpu().numpy().astype(np.int64)
        mask = attention_mask.detach().cpu().numpy().astype(bool)
        totals = mask.sum(axis=1)
        if not np.array_equal(mask, np.arange(ids.shape[1])[None, :] < totals[:, None]):
            raise DataError("BartNoise: rows must be right-padded (attention_mask 1s, then 0s)")
        before, after = len(self.prefix), len(self.suffix)
        lengths = totals - before - after
        rows = np.arange(len(ids))
        short = np.flatnonzero(lengths < 0)
        if len(short):
            raise DataError(f"BartNoise: row {int(short[0])} has {int(totals[short[0]])} tokens, fewer than the "
                            f"{before + after} special tokens of the {self.framing.style} framing")
        for k, token in enumerate(self.prefix):
            bad = np.flatnonzero(ids[:, k] != token)
            if len(bad):
                raise DataError(f"BartNoise: row {int(bad[0])} does not start with the {self.framing.style} "
                                f"framing's special tokens {self.prefix}")
        for k, token in enumerate(self.suffix):
            bad = np.flatnonzero(ids[rows, totals - after + k] != token)
            if len(bad):
                raise DataError(f"BartNoise: row {int(bad[0])} does not end with the {self.framing.style} "
                                f"framing's special tokens {self.suffix}")
        width = max(1, int(lengths.max(initial=0)))
        columns = np.arange(width)
        inside = columns[None, :] < lengths[:, None]
        source = np.clip(before + columns, 0, ids.shape[1] - 1)
        texts = np.where(inside, ids[:, source], self.framing.fill_id)
        out: list[np.ndarray | None] = []
        for value in flags.values():
            starts = None
            if value is not None:
                starts = inside & value.detach().cpu().numpy().astype(bool)[:, source]
                starts[:, 0] |= lengths > 0
            out.append(starts)
        return texts, lengths, out

    def _frame(self, texts: np.ndarray, lengths: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        prefix = np.asarray(self.prefix, dtype=np.int64)
        suffix = np.asarray(self.suffix, dtype=np.int64)
        totals = lengths + len(prefix) + len(suffix)
        width = int(totals.max(initial=0))
        out = np.full((len(texts), width), self.framing.fill_id, dtype=np.int64)
        out[:, :len(prefix)] = prefix
        columns = np.arange(texts.shape[1])
        rows, cols = np.nonzero(columns[None, :] < lengths[:, None])
        out[rows, len(prefix) + cols] = texts[rows, cols]
        ends = lengths + len(prefix)
        for k, token in enumerate(suffix):
            out[np.arange(len(texts)), ends + k] = token
        attention = (np.arange(width)[None, :] < totals[:, None]).astype(np.int64)
        return torch.from_numpy(out), torch.from_numpy(attention)

    # ------------------------------------------------------------------ the functions
    def __call__(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, keys: torch.Tensor,
                 sentence_starts: torch.Tensor | None = None, word_starts: torch.Tensor | None = None) -> NoisedBatch:
        """Noise framed, right-padded rows ``[B, L]``; ``keys [B]`` (int64, ``masking_seeds``) key each row's
        randomness; ``sentence_starts [B, L]`` (True at a sentence's first token) is needed for permutation,
        ``word_starts [B, L]`` (True at a word's first token) for the ``whole_words`` options."""
        if keys.shape != input_ids.shape[:1]:
            raise DataError(f"BartNoise: keys must be [B] = [{input_ids.shape[0]}], got {tuple(keys.shape)}")
        cfg = self.config
        if cfg.sentence_permutation is not None and sentence_starts is None:
            raise DataError("BartNoise: noise.sentence_permutation needs the sentence starts of the rows (data."
                            "instances.kind doc-sentences gives them)")
        if word_starts is None and cfg.whole_words:
            raise DataError(f"BartNoise: noise.{cfg.whole_words[0]}.whole_words needs the word starts of the rows")
        texts, lengths, (starts, given_words) = self._texts(input_ids, attention_mask, sentence_starts=sentence_starts,
                                                            word_starts=word_starts)
        words = np.arange(texts.shape[1])[None, :] < lengths[:, None] if given_words is None else given_words
        fill = self.framing.fill_id
        for name in cfg.functions:
            options = getattr(cfg, name)
            key = function_keys(keys, name)
            if name == "sentence_permutation":
                assert starts is not None
                texts, words = self._permute(texts, words, lengths, starts, options.rate, key)
            elif name == "text_infilling":
                texts, lengths, words = self._infill(texts, lengths, words, options.rate, key, options.whole_words)
            elif name == "document_rotation":
                texts, words = self._rotate(texts, words, lengths, options.rate, key)
            else:
                inside = np.arange(texts.shape[1])[None, :] < lengths[:, None]
                candidate = inside & (texts != self.mask_id)
                uniforms = _uniforms(key, texts.shape[1], 0)
                if options.whole_words:  # a word is chosen by its first token, then taken whole
                    first = np.maximum.accumulate(np.where(words, np.arange(texts.shape[1]), 0), axis=1)
                    chosen = candidate & np.take_along_axis(_select(candidate & words, options.rate, uniforms), first,
                                                            axis=1)
                else:
                    chosen = _select(candidate, options.rate, uniforms)
                if name == "token_masking":
                    texts = np.where(chosen, self.mask_id, texts)
                else:
                    texts, _ = _compact(texts, inside & ~chosen, fill)
                    words, lengths = _compact(words, inside & ~chosen, False)
                    words[:, 0] |= lengths > 0
        if self.max_text is not None:
            lengths = np.minimum(lengths, self.max_text)
        source, source_mask = self._frame(texts, lengths)
        return NoisedBatch(source, source_mask, input_ids.clone(), attention_mask.clone())

    def _permute(self, texts: np.ndarray, words: np.ndarray, lengths: np.ndarray, starts: np.ndarray, rate: float,
                 key: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        batch, width = texts.shape
        inside = np.arange(width)[None, :] < lengths[:, None]
        sentence = np.cumsum(starts, axis=1) - 1  # the sentence of every text token
        count = starts.sum(axis=1)
        slots = max(1, int(count.max(initial=0)))
        index = np.arange(slots)
        real = index[None, :] < count[:, None]
        chosen = real & (_ranks(np.where(real, _uniforms(key, slots, 0), 2.0))
                         < np.round(count * rate).astype(np.int64)[:, None])
        # The chosen places in order receive the chosen sentences in a random order; the others stay.
        places = np.argsort(np.where(chosen, index, slots + index), axis=1, kind="stable")
        movers = np.argsort(np.where(chosen, _uniforms(key, slots, 1), 2.0 + index), axis=1, kind="stable")
        order = np.broadcast_to(index, (batch, slots)).copy()  # order[r, t]: the sentence placed t-th
        first = index[None, :] < chosen.sum(axis=1)[:, None]
        np.put_along_axis(order, places, np.where(first, movers, places), axis=1)
        rows, columns = np.nonzero(inside)
        size = np.zeros((batch, slots), dtype=np.int64)
        np.add.at(size, (rows, sentence[rows, columns]), 1)
        old_start = np.cumsum(size, axis=1) - size
        placed = np.take_along_axis(size, order, axis=1)
        new_start = np.empty_like(size)
        np.put_along_axis(new_start, order, np.cumsum(placed, axis=1) - placed, axis=1)
        s = sentence[rows, columns]
        destination = new_start[rows, s] + columns - old_start[rows, s]
        out, out_words = texts.copy(), words.copy()
        out[rows, destination] = texts[rows, columns]
        out_words[rows, destination] = words[rows, columns]
        out_words[:, 0] |= lengths > 0
        return out, out_words

    def span_lengths(self, key: np.ndarray, budget: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Text infilling's spans for rows of keys ``[B]`` (uint64, already mixed for the function) and budgets
        ``[B]``: the Poisson draws ``[B, D]``, the span lengths ``[B, D]`` (the draws until they reach the budget,
        the last one cut to it, then 0s) and the number of spans ``[B]``."""
        if self._length_cdf is None:
            raise ConfigError("BartNoise: noise.text_infilling is not configured")
        draws = max(8, int(budget.max(initial=0)))
        while True:  # more draws only if some row has not reached its budget
            drawn = np.searchsorted(self._length_cdf, _uniforms(key, draws, 0), side="right")
            total = np.cumsum(drawn, axis=1)
            if np.all(total[:, -1] >= budget):
                break
            draws *= 2
        spans = np.where(budget > 0, (total < budget[:, None]).sum(axis=1) + 1, 0)
        span_length = np.diff(np.minimum(total, budget[:, None]), axis=1, prepend=0)
        return drawn, span_length, spans

    def _infill(self, texts: np.ndarray, lengths: np.ndarray, words: np.ndarray, rate: float, key: np.ndarray,
                whole_words: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Text infilling over units (tokens, or whole words): the texts, their lengths and word starts after it."""
        batch, width = texts.shape
        rows = np.arange(batch)
        columns = np.arange(width)
        inside = columns[None, :] < lengths[:, None]
        units = words & inside if whole_words else inside  # True at the first token of each unit
        count = units.sum(axis=1)
        unit_index = np.cumsum(units, axis=1) - 1  # the unit of every token
        slots = max(1, int(count.max(initial=0)))
        real_unit = np.arange(slots)[None, :] < count[:, None]
        unit_start = np.where(real_unit, np.argsort(~units, axis=1, kind="stable")[:, :slots], lengths[:, None])
        unit_end = np.where(np.arange(slots)[None, :] + 1 < count[:, None],
                            np.concatenate([unit_start[:, 1:], lengths[:, None]], axis=1), lengths[:, None])
        unit_length = np.where(real_unit, unit_end - unit_start, 0)

        budget = np.round(count * rate).astype(np.int64)  # units to mask
        _, span_length, spans = self.span_lengths(key, budget)
        draws = span_length.shape[1]
        kept = count - budget
        gaps = kept + 1  # before each kept unit, and after the last
        placed = np.minimum(spans, gaps)
        # Spans beyond the gaps join the last placed one.
        target = np.minimum(np.arange(draws)[None, :], np.maximum(placed, 1)[:, None] - 1)
        merged = np.zeros((batch, draws), dtype=np.int64)
        np.add.at(merged, (np.repeat(rows, draws), target.reshape(-1)), span_length.reshape(-1))
        gap_count = max(1, int(gaps.max()))
        gap_index = np.arange(gap_count)
        real = gap_index[None, :] < gaps[:, None]
        chosen = real & (_ranks(np.where(real, _uniforms(key, gap_count, 1), 2.0)) < placed[:, None])
        span_of_gap = np.clip(np.cumsum(chosen, axis=1) - 1, 0, draws - 1)
        gap_length = np.where(chosen, np.take_along_axis(merged, span_of_gap, axis=1), 0)
        # Kept unit g is unit g + (units masked in gaps 0..g); in the source it follows the kept units before it and
        # the masks of gaps 0..g.
        is_kept = gap_index[None, :] < kept[:, None]
        original = np.where(is_kept, gap_index[None, :] + np.cumsum(gap_length, axis=1), 0)
        kept_length = np.where(is_kept, np.take_along_axis(unit_length, np.minimum(original, slots - 1), axis=1), 0)
        before = np.cumsum(kept_length, axis=1) - kept_length
        masks_before = np.cumsum(chosen, axis=1)
        new_lengths = kept_length.sum(axis=1) + placed
        out = np.full((batch, max(1, int(new_lengths.max(initial=0)))), self.framing.fill_id, dtype=texts.dtype)
        new_words = np.zeros(out.shape, dtype=bool)
        r, g = np.nonzero(chosen)
        out[r, before[r, g] + masks_before[r, g] - 1] = self.mask_id
        new_words[r, before[r, g] + masks_before[r, g] - 1] = True
        position = np.full((batch, slots), -1, dtype=np.int64)  # where each kept unit starts in the source
        r, g = np.nonzero(is_kept)
        position[r, original[r, g]] = before[r, g] + masks_before[r, g]
        r, i = np.nonzero(inside)
        u = unit_index[r, i]
        keep = position[r, u] >= 0
        r, i, u = r[keep], i[keep], u[keep]
        column = position[r, u] + i - unit_start[r, u]
        out[r, column] = texts[r, i]
        new_words[r, column] = words[r, i]
        new_words[:, 0] |= new_lengths > 0
        return out, new_lengths, new_words

    def _rotate(self, texts: np.ndarray, words: np.ndarray, lengths: np.ndarray, rate: float,
                key: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        u = _uniforms(key, 1, 0)[:, 0]
        offset = np.where(u < rate, np.minimum((_uniforms(key, 1, 1)[:, 0] * lengths).astype(np.int64),
                                               np.maximum(lengths - 1, 0)), 0)
        columns = np.arange(texts.shape[1])
        source = (columns[None, :] + offset[:, None]) % np.maximum(lengths, 1)[:, None]
        inside = columns[None, :] < lengths[:, None]
        words = np.where(inside, np.take_along_axis(words, source, axis=1), words)
        words[:, 0] |= lengths > 0
        return np.where(inside, np.take_along_axis(texts, source, axis=1), texts), words


class DenoisingBatches:
    """The BART batch maker: ``noise`` on the instances of a batch (one framed document each: instance kind
    ``doc-sentences``, which also gives the sentence starts), keyed by (seed, instance, epoch) as MLM masking is
    (``NoiseConfig.dynamic``: a new key every epoch, else every ``dupe_factor`` epochs)."""

    def __init__(self, noise: BartNoise, seed: int, dupe_factor: int) -> None:
        self.noise = noise
        self.seed = seed
        self.dupe_factor = dupe_factor

    def __call__(self, instances: InstanceBatch) -> NoisedBatch:
        keys = masking_seeds(self.seed, instances.instance_ids.numpy(), instances.epoch, self.dupe_factor,
                             self.noise.config.dynamic)
        noised = self.noise(instances.input_ids, instances.attention_mask, keys, instances.sentence_starts,
                            instances.word_starts)
        noised.instance_ids = instances.instance_ids
        return noised
