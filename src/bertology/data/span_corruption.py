"""T5's span corruption (Raffel et al. 2020, section 3.1.4), as a source-target maker (``bertology.data.seq2seq``).

For a text of n tokens (an instance less its framing), as T5's ``random_spans_noise_mask`` does:
``round(n x noise_density)`` noise tokens (at least 1, at most n - 1) in ``round(noise / mean_noise_span_length)``
spans (at least 1); the noise tokens and the kept tokens are each cut into that many non-empty runs, every way of
cutting equally likely, and the runs alternate, a kept run first. The source replaces each noise span by one
sentinel, in order (``<extra_id_0>``, ``<extra_id_1>``, ... as the tokenizer defines them); the target replaces
each kept run by the same sentinel, so it reads ``<extra_id_0> span_0 <extra_id_1> span_1 ...``. Both are then
framed as the instance was (T5: ``... </s>``). The paper's example: "Thank you <X> me to your party <Y> week." ->
"<X> for inviting <Y> last <Z>".

With the defaults (15 %, mean 3) a 512-token text has 77 noise tokens in 26 spans. A row needs as many sentinels
as spans: a tokenizer with fewer is refused up front, naming the option. The randomness of a row comes from its
key (``masking_seeds``: seed, instance, epoch; a fixed one per ``dupe_factor`` epochs unless ``dynamic``), so a
batch is a pure function of its instances and a resumed run sees the same batches.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

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


@dataclass
class SpanCorruptionConfig:
    """The run config's ``data.span_corruption``: T5's noise density and mean span length (in tokens)."""

    noise_density: float = 0.15
    mean_noise_span_length: float = 3.0
    dynamic: bool = True  # new noise every epoch (T5); else every dupe_factor epochs, like static masking

    def __post_init__(self) -> None:
        validate(self, WHERE)
        if not 0.0 < self.noise_density < 1.0:
            raise ConfigError(f"{WHERE}.noise_density: must be in (0, 1), got {self.noise_density}")
        if self.mean_noise_span_length < 1.0:
            raise ConfigError(f"{WHERE}.mean_noise_span_length: a span is at least one token; must be >= 1, got "
                              f"{self.mean_noise_span_length}")

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
    """[length] bool, True at noise tokens (T5's random_spans_noise_mask; a text of one token gets none)."""
    noise, spans = config.counts(length)
    kept = max(length, 2) - noise
    runs = np.stack([random_segmentation(kept, spans, rng), random_segmentation(noise, spans, rng)], 1).reshape(-1)
    return np.repeat(np.arange(len(runs)) % 2 == 1, runs)[:length]


def spans_to_sentinels(tokens: np.ndarray, mask: np.ndarray, sentinels: np.ndarray) -> np.ndarray:
    """``tokens`` with each run of ``mask`` replaced by the next sentinel (the first run by ``sentinels[0]``)."""
    first = mask & ~np.concatenate([[False], mask[:-1]])
    out = np.where(first, sentinels[np.cumsum(first) - 1], tokens) if first.any() else tokens.copy()
    return out[first | ~mask]


def corrupt(text: np.ndarray, config: SpanCorruptionConfig, sentinels: np.ndarray,
            rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(source, target) of one text (see the module docstring)."""
    mask = noise_mask(len(text), config, rng)
    return spans_to_sentinels(text, mask, sentinels), spans_to_sentinels(text, ~mask, sentinels)


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
    ``max_text_length``: the longest text a row can hold; its span count is checked against the sentinels."""

    def __init__(self, config: SpanCorruptionConfig, framing: Framing, seed: int, dupe_factor: int = 1,
                 max_text_length: int | None = None) -> None:
        self.config = config
        self.framing = framing
        self.seed = seed
        self.dupe_factor = dupe_factor
        self.sentinels = np.asarray(framing.sentinels, dtype=np.int64)
        if not len(self.sentinels):
            where = framing.source or "the tokenizer"
            raise ConfigError(f"{WHERE}: {where} has no sentinel tokens (<extra_id_0>, <extra_id_1>, ...; a "
                              f"{framing.style}-style tokenizer); span corruption needs a T5-style one")
        pieces = framing.pieces(False)
        text = next(i for i, piece in enumerate(pieces) if piece.text is not None)
        self.lead = np.asarray([i for piece in pieces[:text] for i in piece.ids], dtype=np.int64)
        self.trail = np.asarray([i for piece in pieces[text + 1:] for i in piece.ids], dtype=np.int64)
        if max_text_length is not None:
            self.check_length(max_text_length)

    def check_length(self, length: int) -> None:
        noise, spans = self.config.counts(length)
        if max(length, 2) - noise < spans:
            raise ConfigError(f"{WHERE}.noise_density: {self.config.noise_density} leaves {max(length, 2) - noise} "
                              f"kept tokens of {length} to separate {spans} noise spans; lower it")
        if spans > len(self.sentinels):
            raise ConfigError(
                f"{WHERE}.mean_noise_span_length: a text of {length} tokens gets {noise} noise tokens in {spans} "
                f"spans (noise_density {self.config.noise_density}, mean_noise_span_length "
                f"{self.config.mean_noise_span_length}), more than the tokenizer's {len(self.sentinels)} sentinels; "
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
            source, target = corrupt(text, self.config, self.sentinels, row_key_generator(int(key)))
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
