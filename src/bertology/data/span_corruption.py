"""T5's span corruption (Raffel et al. 2020, section 3.1.4), as a source-target maker (``bertology.data.seq2seq``).

For a text of n tokens (an instance less its framing), as T5's ``random_spans_noise_mask`` does:
``round(n x noise_density)`` noise tokens (at least 1, at most n - 1) in ``round(noise / mean_noise_span_length)``
spans (at least 1); the noise tokens and the kept tokens are each cut into that many non-empty runs, every way of
cutting equally likely, and the runs alternate, a kept run first (so the text ends with a noise span; with
``random_roll`` the mask is then rolled by a uniform offset, as T5's ``random_roll=True``). The source replaces
each noise span by one sentinel, in order (``<extra_id_0>``, ``<extra_id_1>``, ... as the tokenizer defines them); the target replaces
each kept run by the same sentinel, so it reads ``<extra_id_0> span_0 <extra_id_1> span_1 ...``. Both are then
framed as the instance was (T5: ``... </s>``). The paper's example: "Thank you <X> me to your party <Y> week." ->
"<X> for inviting <Y> last <Z>".

With the defaults (15 %, mean 3) a 512-token text has 77 noise tokens in 26 spans. A row needs as many sentinels
as spans: a tokenizer with fewer is refused up front, naming the option. The randomness of a row comes from its
key (``masking_seeds``: seed, instance, epoch; a fixed one per ``dupe_factor`` epochs unless ``dynamic``), so a
batch is a pure function of its instances and a resumed run sees the same batches.

``objective`` chooses among the variants of T5's Table 3 (section 3.3), each a pure function of (text, rng) ->
(source, target), in T5's format, framed the same way. On the paper's example "Thank you for inviting me to your
party last week .":

- ``random-spans`` (the default, above): "Thank you <X> to <Y> week ." -> "<X> for inviting me <Y> your party
  last <Z>".
- ``iid-spans``: each token is noise independently with probability ``noise_density``; each run of noise tokens
  becomes one sentinel: "Thank you <X> me to your party <Y> week ." -> "<X> for inviting <Y> last <Z>". The target
  lists each span behind its sentinel, closed by the next sentinel when the text ends with kept tokens (a row
  with no noise: just "<X>"). A draw needing more sentinels than the tokenizer has is drawn again from the same
  stream; a length at which that happens more than once in a thousand rows is refused up front.
- ``bert``: tokens chosen i.i.d. as above; each becomes the mask sentinel ``<extra_id_0>`` (T5 has no mask token)
  or, with probability ``random_token_rate`` (10 %), a random token (uniform over the vocabulary less its
  special tokens and sentinels); the target is the whole text: "Thank you <M> <M> me to your party apple week ."
  -> the original.
- ``mass``: the chosen tokens all become the mask sentinel; the target is the whole text.
- ``drop``: the chosen tokens are dropped; the target is they, in order, without sentinels: "Thank you me to
  your party week ." -> "for inviting last".
- ``deshuffle``: the source is the text's tokens in a uniformly random order; the target is the text.
- ``prefix-lm``: the text is cut at a point drawn uniformly from 1 .. n - 1: the source is the prefix, the
  target the rest ("Thank you for inviting" -> "me to your party last week .").

``draw_noise`` makes a row's random choices (a ``Noise``) from its stream, ``apply_noise`` the source and target
from them; ``corrupt`` is the two in turn.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Literal, get_args

import numpy as np
import torch

from bertology.config import from_mapping, validate
from bertology.data.dataset import InstanceBatch
from bertology.data.masking import masking_seeds
from bertology.data.seq2seq import SourceTargetBatch
from bertology.data.span_masking import row_key_generator
from bertology.errors import ConfigError, DataError
from bertology.tokenization.framing import Framing

WHERE = "data.span_corruption"
Objective = Literal["random-spans", "iid-spans", "bert", "mass", "drop", "deshuffle", "prefix-lm"]
OBJECTIVES: tuple[str, ...] = get_args(Objective)
# The objectives whose sources hold sentinels: one a span, or the one mask sentinel.
_SPAN_SENTINELS = ("random-spans", "iid-spans")
_MASK_SENTINEL = ("bert", "mass")
# iid-spans: the most a row may be redrawn for want of sentinels, as a probability at the longest text.
_MAX_REDRAW = 1e-3


@dataclass
class SpanCorruptionConfig:
    """The run config's ``data.span_corruption``: T5's noise density and mean span length (in tokens)."""

    noise_density: float = 0.15  # the share of noise tokens (all but deshuffle and prefix-lm)
    mean_noise_span_length: float = 3.0  # random-spans only
    dynamic: bool = True  # new noise every epoch (T5); else every dupe_factor epochs, like static masking
    # T5's Table 3 (the module docstring); None: random-spans (as runs before the choice existed recorded it).
    objective: Objective | None = None
    # bert only: the share of noise tokens that become a random token rather than the mask sentinel (None: 10 %).
    random_token_rate: float | None = None
    # random-spans only: the mask rolled by an offset drawn uniformly from 0 .. n - 1, so that a text no longer always
    # ends with a noise span (T5's random_spans_noise_mask(random_roll=True)). Without it a row that ends a sentence
    # always has its last span end with the sentence's full stop, and no target ever closes with a sentinel after its
    # last span, which is what fill-mask asks for where text follows the sentinel. None: off (as runs before the
    # option recorded it).
    random_roll: bool | None = None

    def __post_init__(self) -> None:
        validate(self, WHERE)
        if not 0.0 < self.noise_density < 1.0:
            raise ConfigError(f"{WHERE}.noise_density: must be in (0, 1), got {self.noise_density}")
        if self.mean_noise_span_length < 1.0:
            raise ConfigError(f"{WHERE}.mean_noise_span_length: a span is at least one token; must be >= 1, got "
                              f"{self.mean_noise_span_length}")
        if self.random_token_rate is not None:
            if self.variant != "bert":
                raise ConfigError(f"{WHERE}.random_token_rate: only objective bert puts random tokens in the source; "
                                  f"objective is {self.variant}")
            if not 0.0 <= self.random_token_rate <= 1.0:
                raise ConfigError(f"{WHERE}.random_token_rate: must be in [0, 1], got {self.random_token_rate}")
        if self.random_roll and self.variant != "random-spans":
            raise ConfigError(f"{WHERE}.random_roll: rolls random-spans' mask; objective is {self.variant}")

    @property
    def variant(self) -> str:
        """The objective in force (``objective``, or random-spans when it is not given)."""
        return self.objective or "random-spans"

    @property
    def random_rate(self) -> float:
        """bert's share of random tokens among the noise tokens."""
        return 0.1 if self.random_token_rate is None else self.random_token_rate

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SpanCorruptionConfig:
        return from_mapping(cls, data, WHERE)

    def counts(self, length: int) -> tuple[int, int]:
        """(noise tokens, noise spans) of a text of ``length`` tokens, as T5 counts them."""
        n = max(int(length), 2)
        noise = min(max(int(np.rint(n * self.noise_density)), 1), n - 1)
        return noise, max(int(np.rint(noise / self.mean_noise_span_length)), 1)


def random_segmentation(items: int, segments: int, rng: np.random.Generator) -> np.ndarray:
    """The lengths of ``segments`` non-empty runs that ``items`` things are cut into, every cut equally likely."""
    cuts = np.zeros(items - 1, dtype=bool)
    cuts[:segments - 1] = True
    rng.shuffle(cuts)
    return np.diff(np.concatenate([[0], np.flatnonzero(cuts) + 1, [items]]))


def noise_mask(length: int, config: SpanCorruptionConfig, rng: np.random.Generator) -> np.ndarray:
    """[length] bool, True at noise tokens (T5's random_spans_noise_mask; a text of one token gets none); with
    ``random_roll`` rolled by a uniform offset, drawn after the cuts (a span that wraps round becomes two)."""
    noise, spans = config.counts(length)
    kept = max(length, 2) - noise
    runs = np.stack([random_segmentation(kept, spans, rng), random_segmentation(noise, spans, rng)], 1).reshape(-1)
    mask = np.repeat(np.arange(len(runs)) % 2 == 1, runs)[:length]
    if config.random_roll and length > 1:
        mask = np.roll(mask, int(rng.integers(0, length)))
    return mask


def spans_to_sentinels(tokens: np.ndarray, mask: np.ndarray, sentinels: np.ndarray) -> np.ndarray:
    """``tokens`` with each run of ``mask`` replaced by the next sentinel (the first run by ``sentinels[0]``)."""
    first = mask & ~np.concatenate([[False], mask[:-1]])
    out = np.where(first, sentinels[np.cumsum(first) - 1], tokens) if first.any() else tokens.copy()
    return out[first | ~mask]


def span_targets(tokens: np.ndarray, mask: np.ndarray, sentinels: np.ndarray) -> np.ndarray:
    """The target of ``spans_to_sentinels(tokens, mask, ...)``: each run of ``mask`` behind the sentinel that
    replaced it, then the next sentinel if the text ends with kept tokens (T5's format; with a kept run first it is
    ``spans_to_sentinels(tokens, ~mask, ...)``)."""
    first = mask & ~np.concatenate([[False], mask[:-1]])
    spans = int(first.sum())
    out = np.insert(tokens[mask], (np.cumsum(mask) - 1)[first], sentinels[:spans])
    if len(mask) and not mask[-1]:
        out = np.append(out, sentinels[spans])
    return out.astype(tokens.dtype)


def sentinels_needed(mask: np.ndarray) -> int:
    """The sentinels a span mask's source and target use: one a span, one more if the text ends with kept tokens."""
    starts = int((mask & ~np.concatenate([[False], mask[:-1]])).sum())
    return starts + int(len(mask) > 0 and not mask[-1])


@lru_cache(maxsize=4096)
def iid_overflow(length: int, density: float, sentinels: int) -> float:
    """The probability that an i.i.d. noise mask of ``length`` tokens (each noise with probability ``density``)
    needs more than ``sentinels`` sentinels (``sentinels_needed``), by dynamic programming over the tokens."""
    # p[s, last]: probability of s spans so far (s = sentinels + 1: more), the last token noise (1) or kept (0).
    p = np.zeros((sentinels + 2, 2))
    p[0, 0] = 1.0 - density
    p[min(1, sentinels + 1), 1] = density
    for _ in range(length - 1):
        nxt = np.zeros_like(p)
        nxt[:, 0] = (p[:, 0] + p[:, 1]) * (1.0 - density)
        nxt[:, 1] = p[:, 1] * density
        nxt[1:, 1] += p[:-1, 0] * density
        nxt[-1, 1] += p[-1, 0] * density
        p = nxt
    # More than ``sentinels`` spans, or exactly that many and a kept token last.
    return float(p[sentinels + 1].sum() + p[sentinels, 0])


def check_iid_sentinels(length: int, density: float, sentinels: int) -> None:
    """Refuse a text length at which more than ``_MAX_REDRAW`` of the i.i.d. masks need more sentinels than there
    are (iid-spans redraws those)."""
    chance = iid_overflow(int(length), float(density), int(sentinels))
    if chance > _MAX_REDRAW:
        raise ConfigError(f"{WHERE}.noise_density: with objective iid-spans a text of {length} tokens needs more than "
                          f"the tokenizer's {sentinels} sentinels with probability {chance:.3g} (noise_density "
                          f"{density}); lower noise_density or data.instances.max_seq_length, or use a tokenizer "
                          f"with more sentinels")


def iid_mask(length: int, density: float, rng: np.random.Generator) -> np.ndarray:
    """[length] bool: each token noise independently with probability ``density`` (T5's ``iid_noise_mask``)."""
    return rng.random(length) < density


@dataclass
class Noise:
    """What the randomness decides for one text: ``mask`` [n] (the noise tokens: every objective but deshuffle and
    prefix-lm), ``replacement`` [n] (bert: the random token a noise token becomes, -1 where it becomes the mask
    sentinel), ``order`` [n] (deshuffle: the source's tokens as positions of the text), ``cut`` (prefix-lm: the
    prefix's length)."""

    mask: np.ndarray | None = None
    replacement: np.ndarray | None = None
    order: np.ndarray | None = None
    cut: int | None = None


def draw_noise(length: int, config: SpanCorruptionConfig, sentinels: int, rng: np.random.Generator,
               ordinary: np.ndarray | None = None) -> Noise:
    """The noise of a text of ``length`` tokens under ``config.objective`` from ``rng``; ``sentinels``: how many
    the tokenizer has (iid-spans); ``ordinary``: the ids a random token is drawn from (bert)."""
    objective = config.variant
    if objective == "random-spans":
        return Noise(mask=noise_mask(length, config, rng))
    if objective == "iid-spans":
        check_iid_sentinels(length, config.noise_density, sentinels)  # so that a redraw is rare
        mask = iid_mask(length, config.noise_density, rng)
        while sentinels_needed(mask) > sentinels:
            mask = iid_mask(length, config.noise_density, rng)
        return Noise(mask=mask)
    if objective in ("mass", "drop"):
        return Noise(mask=iid_mask(length, config.noise_density, rng))
    if objective == "bert":
        if ordinary is None or not len(ordinary):
            raise ConfigError(f"{WHERE}.objective: bert draws random tokens, but no ordinary vocabulary ids were "
                              f"given")
        mask = iid_mask(length, config.noise_density, rng)
        swap = mask & (rng.random(length) < config.random_rate)
        return Noise(mask=mask, replacement=np.where(swap, ordinary[rng.integers(0, len(ordinary), length)], -1))
    if objective == "deshuffle":
        return Noise(order=rng.permutation(length))
    if objective == "prefix-lm":
        return Noise(cut=int(rng.integers(1, max(length - 1, 1) + 1)))
    raise ConfigError(f"{WHERE}.objective: unknown objective {objective!r}; expected one of {', '.join(OBJECTIVES)}")


def apply_noise(text: np.ndarray, objective: str, noise: Noise, sentinels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(source, target) of ``text`` with ``noise`` under ``objective`` (the module docstring's formats)."""
    if objective in _SPAN_SENTINELS:
        assert noise.mask is not None
        return spans_to_sentinels(text, noise.mask, sentinels), span_targets(text, noise.mask, sentinels)
    if objective in _MASK_SENTINEL:
        assert noise.mask is not None
        source = np.where(noise.mask, sentinels[0], text)
        if noise.replacement is not None:
            source = np.where(noise.mask & (noise.replacement >= 0), noise.replacement, source)
        return source.astype(text.dtype), text.copy()
    if objective == "drop":
        assert noise.mask is not None
        return text[~noise.mask], text[noise.mask]
    if objective == "deshuffle":
        assert noise.order is not None
        return text[noise.order], text.copy()
    if objective == "prefix-lm":
        assert noise.cut is not None
        return text[:noise.cut], text[noise.cut:]
    raise ConfigError(f"{WHERE}.objective: unknown objective {objective!r}; expected one of {', '.join(OBJECTIVES)}")


def corrupt(text: np.ndarray, config: SpanCorruptionConfig, sentinels: np.ndarray, rng: np.random.Generator,
            ordinary: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(source, target) of one text under ``config.objective`` (see the module docstring); ``ordinary``: the ids a
    random token is drawn from (``bert``)."""
    noise = draw_noise(len(text), config, len(sentinels), rng, ordinary)
    return apply_noise(text, config.variant, noise, sentinels)


def restore(source: np.ndarray, target: np.ndarray, sentinels: np.ndarray) -> np.ndarray:
    """The text a (source, target) pair was made from: each sentinel of the source replaced by what follows the
    same sentinel in the target, up to the next sentinel."""
    fills: dict[int, list[int]] = {}
    current: list[int] | None = None
    known = set(int(s) for s in sentinels)
    for token in target.tolist():
        if token in known:
            current = fills.setdefault(token, [])
        elif current is not None:
            current.append(token)
    out: list[int] = []
    for token in source.tolist():
        out.extend(fills.get(token, []) if token in known else [token])
    return np.asarray(out, dtype=np.int64)


class SpanCorruption:
    """The T5 source-target maker: each instance's text corrupted, source and target framed as the instance was.
    ``max_text_length``: the longest text a row can hold; its span count is checked against the sentinels.
    ``vocab_size`` and ``special_ids`` (the tokenizer's): the ordinary ids ``bert`` draws its random tokens from."""

    def __init__(self, config: SpanCorruptionConfig, framing: Framing, seed: int, dupe_factor: int = 1,
                 max_text_length: int | None = None, vocab_size: int | None = None,
                 special_ids: Iterable[int] = ()) -> None:
        self.config = config
        self.framing = framing
        self.seed = seed
        self.dupe_factor = dupe_factor
        self.sentinels = np.asarray(framing.sentinels, dtype=np.int64)
        objective = config.variant
        if not len(self.sentinels) and objective in _SPAN_SENTINELS + _MASK_SENTINEL:
            where = framing.source or "the tokenizer"
            use = "one a span" if objective in _SPAN_SENTINELS else "<extra_id_0> as the mask"
            raise ConfigError(f"{WHERE}: {where} has no sentinel tokens (<extra_id_0>, <extra_id_1>, ...; a "
                              f"{framing.style}-style tokenizer); objective {objective} needs them ({use}): use a "
                              f"T5-style one")
        self.ordinary: np.ndarray | None = None
        if objective == "bert":
            if vocab_size is None:
                raise ConfigError(f"{WHERE}.objective: bert replaces some noise tokens by random ones and needs "
                                  f"the vocabulary size")
            special = np.asarray(sorted(set(int(i) for i in special_ids) | framing.ids), dtype=np.int64)
            self.ordinary = np.setdiff1d(np.arange(int(vocab_size), dtype=np.int64), special)
            if not len(self.ordinary):
                raise ConfigError(f"{WHERE}.objective: bert draws random tokens, but every one of the "
                                  f"{vocab_size} vocabulary ids is special")
        pieces = framing.pieces(False)
        text = next(i for i, piece in enumerate(pieces) if piece.text is not None)
        self.lead = np.asarray([i for piece in pieces[:text] for i in piece.ids], dtype=np.int64)
        self.trail = np.asarray([i for piece in pieces[text + 1:] for i in piece.ids], dtype=np.int64)
        if max_text_length is not None:
            self.check_length(max_text_length)

    def check_length(self, length: int) -> None:
        if self.config.variant == "iid-spans":
            check_iid_sentinels(length, self.config.noise_density, len(self.sentinels))
            return
        if self.config.variant != "random-spans":
            return
        noise, spans = self.config.counts(length)
        # A rolled mask can cut a span in two at the text's end, or end with kept tokens: one sentinel more.
        needed = spans + int(bool(self.config.random_roll))
        if max(length, 2) - noise < spans:
            raise ConfigError(f"{WHERE}.noise_density: {self.config.noise_density} leaves {max(length, 2) - noise} "
                              f"kept tokens of {length} to separate {spans} noise spans; lower it")
        if needed > len(self.sentinels):
            rolled = ", and one sentinel more with random_roll" if self.config.random_roll else ""
            raise ConfigError(
                f"{WHERE}.mean_noise_span_length: a text of {length} tokens gets {noise} noise tokens in {spans} "
                f"spans (noise_density {self.config.noise_density}, mean_noise_span_length "
                f"{self.config.mean_noise_span_length}){rolled}, more than the tokenizer's {len(self.sentinels)} "
                f"sentinels; "
                f"raise mean_noise_span_length, lower noise_density or data.instances.max_seq_length, or use a "
                f"tokenizer with more sentinels")

    def __call__(self, instances: InstanceBatch) -> SourceTargetBatch:
        keys = masking_seeds(self.seed, instances.instance_ids.numpy(), instances.epoch, self.dupe_factor,
                             self.config.dynamic).numpy()
        ids = instances.input_ids.numpy()
        lengths = instances.attention_mask.sum(1).numpy()
        sources, targets = [], []
        for row, key in enumerate(keys):
            text = ids[row, len(self.lead):lengths[row] - len(self.trail)]
            if len(text) == 0:
                raise DataError(f"{WHERE}: instance {int(instances.instance_ids[row])} has no text to corrupt")
            self.check_length(len(text))
            source, target = corrupt(text, self.config, self.sentinels, row_key_generator(int(key)), self.ordinary)
            sources.append(np.concatenate([self.lead, source, self.trail]))
            targets.append(np.concatenate([self.lead, target, self.trail]))
        source_ids, source_mask = _pad(sources, self.framing.fill_id)
        target_ids, target_mask = _pad(targets, self.framing.fill_id)
        return SourceTargetBatch(source_ids, source_mask, target_ids, target_mask, instances.instance_ids)


def _pad(rows: list[np.ndarray], fill: int) -> tuple[torch.Tensor, torch.Tensor]:
    lengths = np.array([len(r) for r in rows])
    ids = np.full((len(rows), int(lengths.max())), fill, dtype=np.int64)
    mask = np.arange(ids.shape[1])[None, :] < lengths[:, None]
    ids[mask] = np.concatenate(rows)
    return torch.from_numpy(ids), torch.from_numpy(mask.astype(np.int64))
