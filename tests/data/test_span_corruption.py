"""T5's span corruption: exact noise and span counts, the span-length distribution of a uniform random cut, the
paper's input/target format with sentinels in order, the round trip, keyed determinism, the seq2seq batch, and
bad settings named by their option."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest
import torch

from bertology.data.dataset import InstanceBatch
from bertology.data.seq2seq import Seq2SeqBatches, seq2seq_batch
from bertology.data.span_corruption import (
    SpanCorruption,
    SpanCorruptionConfig,
    corrupt,
    noise_mask,
    restore,
    spans_to_sentinels,
)
from bertology.data.span_masking import row_key_generator
from bertology.errors import ConfigError
from bertology.tokenization.framing import Framing

SENTINELS = np.arange(299, 199, -1)  # <extra_id_0> has the highest id, as in T5
FRAMING = Framing(cls_id=None, sep_id=1, pad_id=0, mask_id=None, style="t5", sentinels=tuple(SENTINELS.tolist()))
CONFIG = SpanCorruptionConfig()


def runs(mask: np.ndarray) -> list[tuple[bool, int]]:
    """(is noise, length) of each run of the mask."""
    edges = np.flatnonzero(np.diff(mask.astype(int))) + 1
    return [(bool(part[0]), len(part)) for part in np.split(mask, edges)]


def test_counts_are_t5s():
    assert CONFIG.counts(512) == (77, 26)  # the paper's setting: 512 tokens, 15 %, mean 3
    assert CONFIG.counts(128) == (19, 6)
    assert CONFIG.counts(1) == (1, 1) and CONFIG.counts(3) == (1, 1)


def test_every_mask_has_the_exact_noise_and_span_counts():
    rng = np.random.default_rng(0)
    noise_total = length_total = 0
    for trial in range(2000):
        length = int(rng.integers(2, 300))
        mask = noise_mask(length, CONFIG, row_key_generator(trial))
        noise, spans = CONFIG.counts(length)
        parts = runs(mask)
        assert int(mask.sum()) == noise
        assert sum(1 for is_noise, _ in parts if is_noise) == spans
        assert not mask[0] and mask[-1]  # a kept run first, a noise span last
        noise_total += noise
        length_total += length
    assert abs(noise_total / length_total - 0.15) < 0.002


def test_span_lengths_follow_a_uniform_random_cut():
    """15 noise tokens in 5 spans (a 100-token text): every cut into 5 non-empty runs is equally likely, so a span
    has length j with probability C(14 - j, 3) / C(14, 4) (mean 3), and the mean of all spans is exactly 3."""
    observed = Counter()
    trials = 4000
    for trial in range(trials):
        parts = runs(noise_mask(100, CONFIG, row_key_generator(10_000 + trial)))
        lengths = [length for is_noise, length in parts if is_noise]
        assert len(lengths) == 5 and sum(lengths) == 15
        observed.update(lengths)
    total = 5 * trials
    expected = {j: math.comb(14 - j, 3) / math.comb(14, 4) for j in range(1, 12)}
    assert sum(expected.values()) == pytest.approx(1.0)
    chi2 = sum((observed[j] - total * p) ** 2 / (total * p) for j, p in expected.items() if total * p >= 5)
    assert chi2 < 30  # 9 cells: far above any plausible value under the model (p < 5e-4)
    for j, p in expected.items():  # each frequency within 4 standard deviations
        assert abs(observed[j] / total - p) <= 4 * math.sqrt(p * (1 - p) / total) + 1e-12
    assert sum(j * n for j, n in observed.items()) / total == 3.0


def test_the_paper_format_with_sentinels_in_order():
    text = np.arange(1000, 1060)
    source, target = corrupt(text, CONFIG, SENTINELS, row_key_generator(7))
    mask = noise_mask(len(text), CONFIG, row_key_generator(7))
    spans = CONFIG.counts(60)[1]
    # Source: the kept tokens, each noise span replaced by the next sentinel (<extra_id_0>, <extra_id_1>, ...).
    in_source = source[np.isin(source, SENTINELS)]
    assert in_source.tolist() == SENTINELS[:spans].tolist()
    assert source[~np.isin(source, SENTINELS)].tolist() == text[~mask].tolist()
    # Target: <extra_id_0> span_0 <extra_id_1> span_1 ...: the same sentinels, then each span's tokens.
    assert target[0] == SENTINELS[0]
    assert target[np.isin(target, SENTINELS)].tolist() == SENTINELS[:spans].tolist()
    assert target[~np.isin(target, SENTINELS)].tolist() == text[mask].tolist()
    assert len(source) + len(target) == len(text) + 2 * spans
    # The paper's example: "Thank you <X> me to your party <Y> week ." -> "<X> for inviting <Y> last <Z>" (its
    # last kept run gets a sentinel of its own in the target).
    words = np.arange(10)  # Thank you for inviting me to your party last week
    example = np.array([0, 0, 1, 1, 0, 0, 0, 0, 1, 0], dtype=bool)
    assert spans_to_sentinels(words, example, SENTINELS).tolist() == [0, 1, 299, 4, 5, 6, 7, 298, 9]
    assert spans_to_sentinels(words, ~example, SENTINELS).tolist() == [299, 2, 3, 298, 8, 297]


def test_merging_source_and_target_gives_back_the_text():
    rng = np.random.default_rng(1)
    for trial in range(300):
        text = rng.integers(10, 200, int(rng.integers(1, 150)))
        source, target = corrupt(text, CONFIG, SENTINELS, row_key_generator(trial))
        assert restore(source, target, SENTINELS).tolist() == text.tolist()


def instance_batch(texts: list[list[int]], ids: list[int], epoch: int = 0) -> InstanceBatch:
    """Framed (text </s>) instances, right-padded."""
    rows = [t + [1] for t in texts]
    width = max(map(len, rows))
    input_ids = torch.tensor([r + [0] * (width - len(r)) for r in rows])
    mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])
    return InstanceBatch(input_ids, mask, torch.zeros_like(mask), mask.bool(), None, torch.tensor(ids), epoch)


def test_the_batch_maker_frames_both_sides_and_is_keyed_by_instance_and_epoch():
    rng = np.random.default_rng(2)
    texts = [rng.integers(10, 200, n).tolist() for n in (40, 7, 25)]
    maker = SpanCorruption(CONFIG, FRAMING, seed=5, max_text_length=100)
    made = maker(instance_batch(texts, [3, 8, 11]))
    for row, text in enumerate(texts):
        source = made.input_ids[row][made.attention_mask[row].bool()].numpy()
        target = made.target_ids[row][made.target_mask[row].bool()].numpy()
        assert source[-1] == 1 and target[-1] == 1  # both closed by </s>
        assert restore(source[:-1], target[:-1], SENTINELS).tolist() == text
    # A row's noise depends on its instance id and epoch, not on the batch it is in.
    alone = maker(instance_batch(texts[2:], [11]))
    assert torch.equal(alone.input_ids[0, :alone.attention_mask[0].sum()],
                       made.input_ids[2, :made.attention_mask[2].sum()])
    later = maker(instance_batch(texts, [3, 8, 11], epoch=1))
    assert not torch.equal(later.input_ids[0], made.input_ids[0])  # dynamic: new noise every epoch
    static = SpanCorruption(SpanCorruptionConfig(dynamic=False), FRAMING, seed=5, dupe_factor=2)
    assert torch.equal(static(instance_batch(texts, [3, 8, 11], epoch=2)).input_ids,
                       static(instance_batch(texts, [3, 8, 11], epoch=0)).input_ids)


def test_the_seq2seq_batch_reads_the_targets():
    rng = np.random.default_rng(3)
    texts = [rng.integers(10, 200, n).tolist() for n in (30, 12)]
    batch = Seq2SeqBatches(SpanCorruption(CONFIG, FRAMING, seed=0), decoder_start_id=0)(instance_batch(texts, [0, 1]))
    real = batch.decoder_attention_mask.bool()
    assert torch.equal(batch.labels[~real], torch.full_like(batch.labels[~real], -100))
    rows, cols = batch.masked_positions.unbind(1)
    assert torch.equal(batch.lm_labels, batch.labels[rows, cols]) and len(rows) == int(real.sum())
    # The decoder reads the targets shifted right behind the start token (T5's: padding).
    assert batch.decoder_input_ids[:, 0].tolist() == [0, 0]
    assert torch.equal(batch.decoder_input_ids[:, 1:][real[:, 1:]], batch.labels[:, :-1][real[:, 1:]])
    moved = batch.to("cpu")
    assert torch.equal(moved.lm_labels, batch.lm_labels) and moved.instance_ids.tolist() == [0, 1]
    with pytest.raises(Exception, match="2 sources but 1 targets"):
        seq2seq_batch(batch.input_ids, batch.attention_mask, batch.labels[:1], batch.decoder_attention_mask[:1], 0)


def test_more_spans_than_sentinels_names_the_option():
    few = Framing(cls_id=None, sep_id=1, pad_id=0, mask_id=None, style="t5", sentinels=(299, 298, 297))
    SpanCorruption(CONFIG, few, seed=0, max_text_length=60)  # 9 noise tokens, 3 spans: fits
    with pytest.raises(ConfigError, match=r"^data\.span_corruption\.mean_noise_span_length: a text of 128 tokens "
                                          r"gets 19 noise tokens in 6 spans .* than the tokenizer's 3 sentinels"):
        SpanCorruption(CONFIG, few, seed=0, max_text_length=128)
    with pytest.raises(ConfigError, match="data.span_corruption: .*has no sentinel tokens"):
        SpanCorruption(CONFIG, Framing(cls_id=0, sep_id=2, pad_id=1, mask_id=3, style="roberta"), seed=0)


@pytest.mark.parametrize("options,message", [
    ({"noise_density": 0.0}, r"data\.span_corruption\.noise_density: must be in \(0, 1\)"),
    ({"mean_noise_span_length": 0.5}, r"data\.span_corruption\.mean_noise_span_length: a span is at least one"),
    ({"noise_densty": 0.2}, r"data\.span_corruption\.noise_densty: unknown key; did you mean noise_density"),
])
def test_bad_settings_name_the_key(options, message):
    with pytest.raises(ConfigError, match=message):
        SpanCorruptionConfig.from_dict(options)


def test_a_density_that_leaves_too_few_kept_tokens_is_refused():
    with pytest.raises(ConfigError, match=r"data\.span_corruption\.noise_density: 0\.9 leaves 2 kept tokens"):
        SpanCorruption(SpanCorruptionConfig(noise_density=0.9, mean_noise_span_length=2), FRAMING, seed=0,
                       max_text_length=20)


def test_a_rolled_mask_keeps_the_counts_and_ends_anywhere():
    """random_roll (T5's random_roll=True): the same noise count; the spans one more where a span wraps round the
    end; a row ends with noise as often as any token is noise (15 %, not always), so targets often close with a
    sentinel after their last span, as fill-mask's do; source and target still give back the text; and the mask is
    the unrolled one (the same cuts from the same stream) rotated."""
    rolled = SpanCorruptionConfig(random_roll=True)
    ends_noisy = starts_noisy = trials = 0
    for trial in range(3000):
        length = int(np.random.default_rng(trial).integers(8, 120))
        mask = noise_mask(length, rolled, row_key_generator(trial))
        noise, spans = CONFIG.counts(length)
        assert int(mask.sum()) == noise
        assert sum(1 for is_noise, _ in runs(mask) if is_noise) in (spans, spans + 1)
        unrolled = noise_mask(length, CONFIG, row_key_generator(trial))  # the same cuts, then the roll
        assert any(np.array_equal(np.roll(unrolled, k), mask) for k in range(length))
        ends_noisy += bool(mask[-1])
        starts_noisy += bool(mask[0])
        trials += 1
        text = np.arange(1000, 1000 + length)
        source, target = corrupt(text, rolled, SENTINELS, row_key_generator(trial))
        assert restore(source, target, SENTINELS).tolist() == text.tolist()
        assert int(np.isin(target, SENTINELS).sum()) <= spans + 1
    for count in (ends_noisy, starts_noisy):  # binomial(3000, about 0.15): within 5 standard deviations
        assert abs(count / trials - 0.15) < 5 * math.sqrt(0.15 * 0.85 / trials) + 0.01
    few = Framing(cls_id=None, sep_id=1, pad_id=0, mask_id=None, style="t5", sentinels=(299, 298, 297))
    SpanCorruption(CONFIG, few, seed=0, max_text_length=60)  # 3 spans: fits unrolled
    with pytest.raises(ConfigError, match=r"in 3 spans .*, and one sentinel more with random_roll, more than the "
                                          r"tokenizer's 3 sentinels"):
        SpanCorruption(rolled, few, seed=0, max_text_length=60)
    with pytest.raises(ConfigError, match=r"data\.span_corruption\.random_roll: rolls random-spans' mask; objective "
                                          r"is mass"):
        SpanCorruptionConfig(objective="mass", random_roll=True)
