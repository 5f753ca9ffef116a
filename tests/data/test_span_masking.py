"""SpanBERT span masking: span lengths (whole words, geometric p = 0.2 on 1..10), the exact masked share, the
80/10/10 decision per span, word alignment, span boundaries, purity in (seed, instance, epoch), and bad input."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from bertology.data.dataset import InstanceBatch, StepClock
from bertology.data.instances import SpecialTokens
from bertology.data.masking import Masker, MaskingConfig, SpanConfig
from bertology.data.span_masking import SpanBatches, sample_row_spans
from bertology.errors import ConfigError, DataError
from bertology.training.config import load_config

SPECIAL = SpecialTokens(cls_id=1, sep_id=2, pad_id=0, mask_id=3)
VOCAB = 1000


def span_batches(seed: int = 0, **masking) -> SpanBatches:
    config = MaskingConfig(spans=SpanConfig(**masking.pop("spans", {})), **masking)
    return SpanBatches(Masker(config, SPECIAL, VOCAB), seed, dupe_factor=1, clock=StepClock(1, 10))


def instance_batch(rows: int, width: int, seed: int = 0, word_start_prob: float = 0.7, epoch: int = 0,
                   lengths: np.ndarray | None = None) -> InstanceBatch:
    """[CLS] text [SEP] rows, right-padded; ~1 / word_start_prob tokens per word."""
    rng = np.random.default_rng(seed)
    if lengths is None:
        lengths = np.full(rows, width)
    ids = np.zeros((rows, width), dtype=np.int64)
    starts = np.zeros((rows, width), dtype=bool)
    for r, n in enumerate(lengths):
        ids[r, :n] = rng.integers(4, VOCAB, n)
        ids[r, 0], ids[r, n - 1] = SPECIAL.cls_id, SPECIAL.sep_id
        starts[r, 1:n - 1] = rng.random(n - 2) < word_start_prob
        starts[r, 1] = True
    attention = (np.arange(width)[None, :] < np.asarray(lengths)[:, None]).astype(np.int64)
    return InstanceBatch(torch.from_numpy(ids), torch.from_numpy(attention), torch.zeros(rows, width, dtype=torch.long),
                         torch.from_numpy(starts), None, torch.arange(rows), epoch)


def test_length_distribution_is_spanberts_truncated_geometric():
    spans = SpanConfig()
    probabilities = spans.length_probabilities()
    expected = np.array([0.2 * 0.8 ** k for k in range(10)])
    np.testing.assert_allclose(probabilities, expected / expected.sum(), rtol=1e-12)
    assert spans.mean_words() == pytest.approx(3.7971, abs=1e-4)  # the paper's "mean span length 3.8"
    assert SpanConfig(geometric_p=1.0).mean_words() == 1.0
    assert SpanConfig(max_words=1).mean_words() == 1.0


def test_drawn_span_lengths_follow_the_distribution():
    """Chi-square of 20,000 drawn lengths against the configured probabilities, and the mean within 4 standard
    errors of 3.797 words."""
    spans = SpanConfig()
    rng = np.random.default_rng(0)
    candidate = np.ones(4000, dtype=bool)
    drawn: list[int] = []
    while len(drawn) < 20000:
        drawn += sample_row_spans(candidate, candidate, 600, spans, rng).drawn_words
    drawn_arr = np.array(drawn)
    p = spans.length_probabilities()
    observed = np.bincount(drawn_arr, minlength=11)[1:]
    chi2 = float(((observed - len(drawn_arr) * p) ** 2 / (len(drawn_arr) * p)).sum())
    assert chi2 < 27.9  # 99.9 % quantile of chi-square with 9 degrees of freedom
    variance = float((np.arange(1, 11) ** 2 * p).sum() - spans.mean_words() ** 2)
    assert abs(drawn_arr.mean() - spans.mean_words()) < 4 * math.sqrt(variance / len(drawn_arr))


def test_masked_share_is_exact_and_specials_padding_untouched():
    maker = span_batches()
    lengths = np.random.default_rng(1).integers(8, 128, 64)
    batch = instance_batch(64, 128, lengths=lengths)
    out = maker(batch)
    rows = out.masked_positions[:, 0]
    counts = torch.bincount(rows, minlength=64).numpy()
    maskable = lengths - 2
    np.testing.assert_array_equal(counts, np.maximum(1, np.round(maskable * 0.15)).astype(int))
    columns = out.masked_positions[:, 1].numpy()
    assert (columns >= 1).all() and (columns < lengths[rows.numpy()] - 1).all()
    assert torch.equal(out.mlm_labels, batch.input_ids[rows, out.masked_positions[:, 1]])
    unselected = torch.ones_like(batch.input_ids, dtype=torch.bool)
    unselected[rows, out.masked_positions[:, 1]] = False
    assert torch.equal(out.input_ids[unselected], batch.input_ids[unselected])


def test_the_rate_is_configuration():
    batch = instance_batch(32, 200)
    for rate in (0.15, 0.4):
        out = span_batches(mlm_probability=rate)(batch)
        assert len(out.mlm_labels) == 32 * round(198 * rate)


def test_spans_start_at_word_starts_and_cover_whole_words():
    """Every merged span starts at a word start and ends at a word end, except at most one per row: the word
    whose token reached the budget (cut there, as in SpanBERT's code)."""
    maker = span_batches()
    batch = instance_batch(128, 100, word_start_prob=0.5, seed=3)
    out = maker(batch)
    starts = batch.word_starts.numpy()
    cut_rows = 0
    for r in range(128):
        columns = out.masked_positions[out.masked_positions[:, 0] == r, 1].numpy()
        runs = np.split(columns, np.flatnonzero(np.diff(columns) != 1) + 1)
        assert all(starts[r, run[0]] for run in runs)
        cut = sum(1 for run in runs if not (run[-1] + 1 == 99 or starts[r, run[-1] + 1]))
        assert cut <= 1
        cut_rows += cut
    assert 0 < cut_rows < 128


def test_boundaries_and_offsets():
    out = span_batches()(instance_batch(64, 120, seed=4))
    rows, columns = out.masked_positions[:, 0], out.masked_positions[:, 1]
    selected = torch.zeros(64, 120, dtype=torch.bool)
    selected[rows, columns] = True
    assert not selected[rows, out.span_left].any() and not selected[rows, out.span_right].any()
    assert torch.equal(columns - out.span_offset - 1, out.span_left)
    assert (out.span_left < columns).all() and (columns < out.span_right).all()
    # Every column between the boundaries is masked: the spans are maximal runs.
    for r, left, right in zip(rows.tolist(), out.span_left.tolist(), out.span_right.tolist()):
        assert selected[r, left + 1:right].all()


def test_80_10_10_is_decided_per_span():
    """All tokens of a span share one fate; over ~5,000 spans the shares are within 4 standard errors of 0.8 / 0.1
    / 0.1 (a random token equal to the original, probability 1/996 per token, counts as kept)."""
    batch = instance_batch(1024, 128, seed=5, word_start_prob=1.0)
    out = span_batches()(batch)
    rows, columns = out.masked_positions[:, 0], out.masked_positions[:, 1]
    new = out.input_ids[rows, columns].numpy()
    labels = out.mlm_labels.numpy()
    # Tokens come row-major and span by span, so a span is a run of equal (row, left boundary).
    key = (rows * 1000 + out.span_left).numpy()
    begins = np.flatnonzero(np.concatenate([[True], key[1:] != key[:-1]]))
    masks = np.add.reduceat((new == SPECIAL.mask_id).astype(int), begins)
    same = np.add.reduceat((new == labels).astype(int), begins)
    sizes = np.diff(np.append(begins, len(key)))
    assert ((masks == 0) | (masks == sizes)).all(), "a span mixes [MASK] with other tokens"
    is_mask = masks == sizes
    is_kept = ~is_mask & (same == sizes)
    is_random = ~is_mask & ~is_kept
    kinds = {"mask": int(is_mask.sum()), "random": int(is_random.sum()), "kept": int(is_kept.sum())}
    assert same[is_random].sum() / sizes[is_random].sum() < 0.01  # each random token is its own draw
    n = sum(kinds.values())
    assert n > 4000
    for kind, p in (("mask", 0.8), ("random", 0.1), ("kept", 0.1)):
        assert abs(kinds[kind] / n - p) < 4 * math.sqrt(p * (1 - p) / n), kinds


def test_mask_token_share_is_configuration():
    out = span_batches(mask_token_prob=0.0, random_token_prob=0.0)(instance_batch(64, 128, seed=6))
    assert torch.equal(out.input_ids, instance_batch(64, 128, seed=6).input_ids)  # every span kept as it is
    assert len(out.mlm_labels) == 64 * 19


def test_a_rows_spans_depend_only_on_seed_instance_and_epoch():
    maker = span_batches(seed=7)
    batch = instance_batch(16, 64, seed=8)
    whole = maker(batch)
    part = instance_batch(16, 64, seed=8)
    for name in ("input_ids", "attention_mask", "token_type_ids", "word_starts", "instance_ids"):
        setattr(part, name, getattr(part, name)[[5, 2]])
    alone = maker(part)
    for new_row, old_row in ((0, 5), (1, 2)):
        assert torch.equal(alone.input_ids[new_row], whole.input_ids[old_row])
    assert torch.equal(maker(batch).input_ids, whole.input_ids)  # the same batch again
    later = maker(instance_batch(16, 64, seed=8, epoch=1))
    assert torch.equal(later.masked_positions, whole.masked_positions)  # static masking, dupe_factor 1
    dynamic = span_batches(seed=7, dynamic=True)
    assert not torch.equal(dynamic(instance_batch(16, 64, seed=8, epoch=1)).masked_positions,
                           dynamic(batch).masked_positions)


def test_spans_do_not_cross_a_separator():
    """In a pair, a span stops at [SEP]: words of the two segments are never one span."""
    rows, width = 256, 40
    batch = instance_batch(rows, width, seed=9, word_start_prob=1.0)
    batch.input_ids[:, 20] = SPECIAL.sep_id
    out = span_batches(spans={"max_words": 10})(batch)
    assert not (out.masked_positions[:, 1] == 20).any()
    crossing = (out.span_left < 20) & (out.span_right > 20)
    assert not crossing.any()


def test_tiny_rows():
    """A row with one maskable token masks it; a row with none masks nothing."""
    batch = instance_batch(2, 4, lengths=np.array([3, 2]))
    out = span_batches()(batch)
    assert out.masked_positions.tolist() == [[0, 1]]
    assert out.span_left.tolist() == [0] and out.span_right.tolist() == [2]


@pytest.mark.parametrize("options, message", [
    ({"geometric_p": 0.0}, r"SpanConfig.geometric_p: must be in \(0, 1\]"),
    ({"geometric_p": 1.5}, r"SpanConfig.geometric_p: must be in \(0, 1\]"),
    ({"max_words": 0}, "SpanConfig.max_words: a span is at least one word; must be >= 1"),
])
def test_span_config_errors(options, message):
    with pytest.raises(ConfigError, match=message):
        SpanConfig(**options)


@pytest.mark.parametrize("settings, message", [
    (["data.masking.spans.geometric_p=0"], r"data.masking.spans.geometric_p: must be in \(0, 1\]"),
    (["data.masking.spans.geometric_p=1.2"], r"data.masking.spans.geometric_p: must be in \(0, 1\]"),
    (["data.masking.spans.max_words=0"], "data.masking.spans.max_words: a span is at least one word"),
    (["data.masking.spans.max_words=200", "data.instances.max_seq_length=128"],
     "data.masking.spans.max_words: a span of 200 words is longer than a sequence"),
    (["data.masking.spans={}", "data.masking.selection=bernoulli"], "data.masking.selection: span masking"),
    (["objectives.span_boundary={}"], "objectives.span_boundary: the span boundary objective needs span masking"),
    (["data.masking.mlm_probability=0"], r"data.masking.mlm_probability: must be in \(0, 1\)"),
    (["data.masking.mlm_probability=1"], r"data.masking.mlm_probability: must be in \(0, 1\)"),
])
def test_bad_span_settings_name_the_key(settings, message):
    with pytest.raises(ConfigError, match=f"^{message}"):
        load_config(None, settings)


def test_a_span_as_long_as_the_sequence_is_accepted():
    config = load_config(None, ["data.masking.spans.max_words=126", "data.instances.max_seq_length=128"])
    assert config.objectives == {"mlm": {}, "nsp": {}, "span_boundary": {}}


def test_bad_batches():
    maker = span_batches()
    batch = instance_batch(2, 8)
    batch.word_starts = batch.word_starts[:, :4]
    with pytest.raises(DataError, match="must be \\[B, L\\] alike"):
        maker(batch)
    with pytest.raises(ConfigError, match="MaskingConfig.spans is not set"):
        SpanBatches(Masker(MaskingConfig(), SPECIAL, VOCAB), 0, 1)
