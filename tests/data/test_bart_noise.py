"""BART's noise functions: the rates (exact counts), text infilling's Poisson(3) span lengths and 0-length spans,
one mask a span, sentence permutation (the sentences kept whole), rotation (the cyclic order kept), target ==
original, purity in the row's key (batch, padding), the config section and bad input.

Rows hold distinct token ids (TEXT + original position), so the source tells where each token came from."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from bertology.data.bart_noise import BartNoise, NoiseConfig, TextInfillingConfig, function_keys
from bertology.data.masking import masking_seeds
from bertology.errors import ConfigError, DataError, TokenizerError
from bertology.tokenization.framing import Framing

BART = Framing(cls_id=0, sep_id=2, pad_id=1, mask_id=4, style="bart")
MASK = BART.mask_id
TEXT = 10  # the first text id


def rows(lengths, sentence_length: int = 5, seed: int = 0, width: int | None = None):
    """Framed rows ``<s> TEXT.. </s>`` right-padded to ``width``; sentences of 1 .. 2 x sentence_length tokens."""
    rng = np.random.default_rng(seed)
    lengths = np.asarray(lengths)
    width = width or int(lengths.max()) + 2
    ids = np.full((len(lengths), width), BART.pad_id, dtype=np.int64)
    starts = np.zeros_like(ids, dtype=bool)
    for r, n in enumerate(lengths):
        ids[r, 0], ids[r, 1:n + 1], ids[r, n + 1] = BART.cls_id, TEXT + np.arange(n), BART.sep_id
        column = 1
        while column <= n:
            starts[r, column] = True
            column += int(rng.integers(1, 2 * sentence_length + 1))
    attention = (np.arange(width)[None, :] < lengths[:, None] + 2).astype(np.int64)
    return torch.from_numpy(ids), torch.from_numpy(attention), torch.from_numpy(starts)


def keys(count: int, seed: int = 0, epoch: int = 0) -> torch.Tensor:
    return masking_seeds(seed, np.arange(count), epoch, dupe_factor=1, dynamic=True)


def noise(spec: dict, lengths, seed: int = 0, **kwargs):
    ids, attention, starts = rows(lengths, **kwargs)
    out = BartNoise(NoiseConfig.from_dict(spec), BART)(ids, attention, keys(len(lengths), seed), starts)
    torch.testing.assert_close(out.target_ids, ids, rtol=0, atol=0)  # the target is the original
    torch.testing.assert_close(out.target_mask, attention, rtol=0, atol=0)
    texts = []
    for r, total in enumerate(out.attention_mask.sum(dim=1).tolist()):
        row = out.input_ids[r, :total].tolist()
        assert row[0] == BART.cls_id and row[-1] == BART.sep_id and BART.pad_id not in row
        assert bool((out.input_ids[r, total:] == BART.pad_id).all())
        texts.append(np.array(row[1:-1], dtype=np.int64))
    return texts, starts


def spans_of(text: np.ndarray, n: int) -> list[int]:
    """The original tokens each mask of an infilled text stands for, left to right."""
    kept = text[text != MASK] - TEXT
    assert np.all(np.diff(kept) > 0)  # kept tokens stay in order
    previous, lengths = -1, []
    for token in text:
        if token == MASK:
            following = kept[kept > previous]
            lengths.append(int((following[0] if len(following) else n) - previous - 1))
        else:
            previous = int(token) - TEXT
    return lengths


# --------------------------------------------------------------------------------------------- text infilling
def test_infilling_masks_exactly_the_rate_one_mask_per_drawn_span():
    """Every row loses exactly round(0.3 n) tokens; the masks, left to right, are the drawn spans in order (the
    last one cut to the budget, 0-length ones inserting a mask), so no two masks touch."""
    lengths = np.random.default_rng(1).integers(10, 200, 300)
    texts, _ = noise({"text_infilling": {}}, lengths)
    box = BartNoise(NoiseConfig.from_dict({"text_infilling": {}}), BART)
    budget = np.round(lengths * 0.3).astype(np.int64)
    _, span_length, spans = box.span_lengths(function_keys(keys(len(lengths)), "text_infilling"), budget)
    zero_spans = 0
    for r, (text, n) in enumerate(zip(texts, lengths)):
        assert (text != MASK).sum() == n - budget[r]
        observed = spans_of(text, n)
        assert observed == span_length[r, :spans[r]].tolist()
        assert not np.any((text[1:] == MASK) & (text[:-1] == MASK))
        zero_spans += observed.count(0)
    assert zero_spans > 100  # 0-length spans do occur (about 5 % of ~3,300 spans)


def poisson_3_fits(values: np.ndarray) -> None:
    """Chi-square against Poisson(3) on 0 .. 9 and 10+ below the 0.999 quantile for 10 degrees of freedom (29.6;
    over seeds 0-19 the drawn lengths gave 3.1-16.4, the read ones over seeds 0-11 3.9-23.9); mean and 0-length
    share within 4 standard errors (over those seeds within 1.9)."""
    pmf = np.array([math.exp(-3) * 3**k / math.factorial(k) for k in range(10)])
    expected = np.append(pmf, 1 - pmf.sum()) * len(values)
    observed = np.bincount(np.minimum(values, 10), minlength=11)
    assert ((observed - expected) ** 2 / expected).sum() < 29.6
    assert abs(values.mean() - 3.0) < 4 * math.sqrt(3.0 / len(values))
    zero = math.exp(-3)
    assert abs((values == 0).mean() - zero) < 4 * math.sqrt(zero * (1 - zero) / len(values))


def test_infilling_span_lengths_are_poisson_3():
    """The drawn lengths of 2,000 rows (~31,000 spans), and the spans read off 1,000 sources of 150 tokens: the
    first 8 masks of each row (8,000 spans; they reach the budget of 45 with probability 1e-4, so they are not cut
    and not conditioned on the stopping draw, unlike each row's last span)."""
    box = BartNoise(NoiseConfig.from_dict({"text_infilling": {"poisson_lambda": 3.0}}), BART)
    drawn, _, spans = box.span_lengths(function_keys(keys(2000, seed=7), "text_infilling"), np.full(2000, 45))
    poisson_3_fits(np.concatenate([drawn[r, :spans[r]] for r in range(len(spans))]))
    texts, _ = noise({"text_infilling": {}}, np.full(1000, 150), seed=3)
    poisson_3_fits(np.concatenate([spans_of(text, 150)[:8] for text in texts]))


def test_infilling_lambda_sets_the_mean_span():
    box = BartNoise(NoiseConfig(text_infilling=TextInfillingConfig(poisson_lambda=1.5)), BART)
    drawn, _, spans = box.span_lengths(function_keys(keys(1000), "text_infilling"), np.full(1000, 30))
    values = np.concatenate([drawn[r, :spans[r]] for r in range(1000)])
    assert abs(values.mean() - 1.5) < 4 * math.sqrt(1.5 / len(values))


def test_infilling_with_more_spans_than_gaps_joins_the_last_ones():
    """Rate 0.9 leaves fewer gaps than spans: the source has one mask per gap at most and still loses exactly
    round(0.9 n) tokens."""
    lengths = np.full(200, 10)
    texts, _ = noise({"text_infilling": {"rate": 0.9}}, lengths)
    for text in texts:
        assert (text != MASK).sum() == 1
        assert (text == MASK).sum() <= 2
        assert sum(spans_of(text, 10)) == 9


def test_a_source_longer_than_max_length_is_cut_at_the_end_of_its_text():
    """4 tokens, 1 to mask: 0-length spans before the one that masks make some sources longer than the row."""
    ids, attention, starts = rows(np.full(500, 4))
    config = NoiseConfig.from_dict({"text_infilling": {}})
    free = BartNoise(config, BART)(ids, attention, keys(500), starts)
    capped = BartNoise(config, BART, max_length=6)(ids, attention, keys(500), starts)
    longer = free.attention_mask.sum(dim=1) > 6
    assert 5 < int(longer.sum()) < 100
    assert int(capped.attention_mask.sum(dim=1).max()) == 6
    assert torch.equal(capped.input_ids[~longer], free.input_ids[~longer, :6])
    cut = capped.input_ids[longer]
    assert torch.equal(cut[:, :5], free.input_ids[longer, :5]) and bool((cut[:, 5] == BART.sep_id).all())
    with pytest.raises(ConfigError, match="max_length 2 leaves no room"):
        BartNoise(config, BART, max_length=2)


def word_rows(count: int, n: int, seed: int = 0):
    """Rows of n tokens in words of 1 to 3 tokens, with their word starts and every token's word."""
    ids, attention, starts = rows(np.full(count, n))
    rng = np.random.default_rng(seed)
    words = np.zeros(ids.shape, dtype=bool)
    words[:, 1:n + 1] = rng.random((count, n)) < 0.6
    words[:, 1] = True
    word_of = np.cumsum(words[:, 1:n + 1], axis=1) - 1
    return ids, attention, starts, torch.from_numpy(words), word_of


def whole_word_noise(spec: dict, count: int, n: int, seed: int = 0):
    ids, attention, starts, words, word_of = word_rows(count, n, seed)
    out = BartNoise(NoiseConfig.from_dict(spec), BART)(ids, attention, keys(count, seed), starts, words)
    texts = [out.input_ids[r, 1:int(out.attention_mask[r].sum()) - 1].numpy() for r in range(count)]
    return texts, word_of


def test_whole_word_infilling_masks_whole_words_in_poisson_spans():
    """Rate and span lengths count words: round(0.3 w) of a row's w words go, in the drawn spans (in words), each
    span one mask; the first 8 spans of each row (in words; ~150 words a row, a budget of ~45) fit Poisson(3)."""
    texts, word_of = whole_word_noise({"text_infilling": {"whole_words": True}}, 1000, 250, seed=4)
    box = BartNoise(NoiseConfig.from_dict({"text_infilling": {}}), BART)
    totals = word_of[:, -1] + 1
    budget = np.round(totals * 0.3).astype(np.int64)
    _, span_length, spans = box.span_lengths(function_keys(keys(1000, 4), "text_infilling"), budget)
    read = []
    for r, text in enumerate(texts):
        kept = text[text != MASK] - TEXT
        kept_words = np.unique(word_of[r, kept])
        assert np.array_equal(np.flatnonzero(np.isin(word_of[r], kept_words)), kept)  # whole words kept
        assert len(kept_words) == totals[r] - budget[r]
        previous, observed = -1, []  # the words each mask stands for
        for token in text:
            if token == MASK:
                following = kept[kept > previous]
                after = word_of[r, following[0]] if len(following) else totals[r]
                observed.append(int(after - (word_of[r, previous] if previous >= 0 else -1) - 1))
            else:
                previous = int(token) - TEXT
        assert observed == span_length[r, :spans[r]].tolist()
        read.extend(observed[:8])
    poisson_3_fits(np.array(read))


def test_whole_word_masking_and_deletion_take_whole_words():
    for spec in ({"token_masking": {"rate": 0.3, "whole_words": True}},
                 {"token_deletion": {"rate": 0.3, "whole_words": True}}):
        texts, word_of = whole_word_noise(spec, 300, 40)
        for r, text in enumerate(texts):
            present = text[text != MASK] - TEXT
            kept_words = np.unique(word_of[r, present])
            assert np.array_equal(np.flatnonzero(np.isin(word_of[r], kept_words)), present)
            assert len(kept_words) == word_of[r, -1] + 1 - round(0.3 * (word_of[r, -1] + 1))
            if "token_masking" in spec:
                assert len(text) == 40 and np.array_equal(text[text != MASK], TEXT + present)
            else:
                assert MASK not in text and len(text) == len(present)


def test_whole_words_without_word_starts_is_refused():
    ids, attention, starts = rows(np.array([5]))
    box = BartNoise(NoiseConfig.from_dict({"token_deletion": {"whole_words": True}}), BART)
    with pytest.raises(DataError, match="noise.token_deletion.whole_words needs the word starts"):
        box(ids, attention, keys(1), starts)


# --------------------------------------------------------------------------------------------- masking, deletion
def test_token_masking_masks_exactly_the_rate_uniformly():
    lengths = np.full(2000, 40)
    texts, _ = noise({"token_masking": {"rate": 0.3}}, lengths)
    masked = np.stack([text == MASK for text in texts])
    assert np.all(masked.sum(axis=1) == 12)
    original = TEXT + np.arange(40)
    assert all(np.array_equal(text[text != MASK], original[text != MASK]) for text in texts)
    # Each position masked 30 % of the time: within 4 standard errors of 2,000 rows (the worst of the 40 columns
    # over seeds 0-9: 1.7-3.2).
    assert np.all(np.abs(masked.mean(axis=0) - 0.3) < 4 * math.sqrt(0.3 * 0.7 / 2000))


def test_token_deletion_deletes_exactly_the_rate_uniformly():
    lengths = np.random.default_rng(2).integers(5, 60, 1000)
    texts, _ = noise({"token_deletion": {"rate": 0.2}}, lengths)
    deleted = np.zeros(60)
    for text, n in zip(texts, lengths):
        assert len(text) == n - round(0.2 * n)
        assert np.all(np.diff(text) > 0) and MASK not in text  # the rest, in order
        gone = np.setdiff1d(np.arange(n), text - TEXT)
        deleted[gone] += 1
    rows_with = (lengths[:, None] > np.arange(60)[None, :]).sum(axis=0)
    share = deleted[:5] / rows_with[:5]  # the worst of 5 over seeds 0-9: 0.9-3.0 standard errors
    assert np.all(np.abs(share - 0.2) < 4 * math.sqrt(0.2 * 0.8 / 1000))


def test_deletion_and_masking_leave_infilled_masks_alone():
    lengths = np.full(300, 50)
    texts, _ = noise({"text_infilling": {}, "token_masking": {"rate": 0.1}, "token_deletion": {"rate": 0.1}},
                     lengths)
    box = BartNoise(NoiseConfig.from_dict({"text_infilling": {}}), BART)
    _, _, spans = box.span_lengths(function_keys(keys(300), "text_infilling"), np.full(300, 15))
    for text, count in zip(texts, spans):
        left = 35 + min(count, 36)  # kept tokens and infilling's masks
        masked = round(0.1 * 35)  # of the 35 kept tokens
        assert len(text) == left - round(0.1 * (35 - masked))  # of the tokens still unmasked
        assert (text == MASK).sum() == min(count, 36) + masked


# --------------------------------------------------------------------------------------------- sentences, rotation
def sentences(starts_row: np.ndarray, n: int) -> list[tuple[int, ...]]:
    bounds = list(np.flatnonzero(starts_row[1:n + 1])) + [n]
    return [tuple(TEXT + np.arange(a, b)) for a, b in zip(bounds[:-1], bounds[1:])]


def test_sentence_permutation_keeps_the_sentences_and_shuffles_them():
    lengths = np.random.default_rng(3).integers(1, 40, 1000)
    texts, starts = noise({"sentence_permutation": {}}, lengths, sentence_length=4)
    identity, three = 0, {}
    for r, (text, n) in enumerate(zip(texts, lengths)):
        parts = sentences(starts[r].numpy(), n)
        order, begin = [], 0
        lookup = {part[0]: part for part in parts}
        while begin < n:  # the source is the sentences, whole, in some order
            part = lookup[int(text[begin])]
            assert tuple(text[begin:begin + len(part)]) == part
            order.append(parts.index(part))
            begin += len(part)
        assert sorted(order) == list(range(len(parts)))
        identity += order == sorted(order)
        if len(parts) == 3:
            three[tuple(order)] = three.get(tuple(order), 0) + 1
    assert len(three) == 6 and min(three.values()) > 0.5 * sum(three.values()) / 6  # all 3! orders, about evenly
    assert identity < 0.3 * len(lengths)


def test_sentence_permutation_rate_moves_only_that_share():
    lengths = np.full(500, 40)
    texts, starts = noise({"sentence_permutation": {"rate": 0.5}}, lengths, sentence_length=2)
    for r, text in enumerate(texts):
        parts = sentences(starts[r].numpy(), 40)
        moved = 0
        begin = 0
        for place, part in enumerate(parts):  # read the sentence now at each place
            now = next(p for p in parts if p[0] == int(text[begin]))
            moved += now != part
            begin += len(now)
        assert moved <= round(0.5 * len(parts))


def test_document_rotation_keeps_the_cyclic_order_with_uniform_starts():
    lengths = np.full(3000, 10)
    texts, _ = noise({"document_rotation": {"rate": 1.0}}, lengths)
    starts = np.array([int(text[0]) - TEXT for text in texts])
    for text, start in zip(texts, starts):
        assert np.array_equal(text, TEXT + (np.arange(10) + start) % 10)
    counts = np.bincount(starts, minlength=10)
    # Chi-square, 9 degrees of freedom, below the 0.999 quantile (over seeds 0-9: 3.7-22.9).
    assert ((counts - 300) ** 2 / 300).sum() < 27.9
    texts, _ = noise({"document_rotation": {"rate": 0.4}}, lengths)
    rotated = np.mean([text[0] != TEXT for text in texts])
    assert abs(rotated - 0.4 * 0.9) < 4 * math.sqrt(0.36 * 0.64 / 3000)


# --------------------------------------------------------------------------------------------- keys and purity
ALL = {"sentence_permutation": {}, "text_infilling": {}, "token_masking": {}, "token_deletion": {},
       "document_rotation": {"rate": 0.5}}
WORDS = {"sentence_permutation": {}, "text_infilling": {"whole_words": True}, "token_masking": {"whole_words": True},
         "token_deletion": {"whole_words": True}, "document_rotation": {"rate": 0.5}}


@pytest.mark.parametrize("spec", [ALL, WORDS], ids=["tokens", "whole-words"])
def test_noise_is_a_function_of_the_key_not_of_the_batch(spec):
    box = BartNoise(NoiseConfig.from_dict(spec), BART)
    lengths = np.array([30, 7, 55, 1, 0, 18])
    ids, attention, starts = rows(lengths, width=70)
    words = torch.from_numpy(np.random.default_rng(5).random(ids.shape) < 0.6) & attention.bool()
    batch = box(ids, attention, keys(6), starts, words)
    again = box(ids, attention, keys(6), starts, words)
    torch.testing.assert_close(batch.input_ids, again.input_ids, rtol=0, atol=0)
    for r in range(6):  # alone, with less padding, each row gets the same noise
        width = int(lengths[r]) + 2
        alone = box(ids[r:r + 1, :width], attention[r:r + 1, :width], keys(6)[r:r + 1], starts[r:r + 1, :width],
                    words[r:r + 1, :width])
        total = int(alone.attention_mask.sum())
        assert total == int(batch.attention_mask[r].sum())
        assert alone.input_ids[0, :total].tolist() == batch.input_ids[r, :total].tolist()
    other = box(ids, attention, keys(6, epoch=1), starts, words)  # dynamic: another epoch, other noise
    assert not torch.equal(other.input_ids[:3], batch.input_ids[:3])


def test_special_ids_inside_the_text_are_text():
    """A corpus's literal "</s>" or "<s>" is tokenized as the special id: it is noised as text (a literal "<mask>"
    is left alone)."""
    ids, attention, starts = rows(np.full(200, 12))
    ids[:, 3], ids[:, 7], ids[:, 9] = BART.sep_id, BART.cls_id, MASK
    out = BartNoise(NoiseConfig.from_dict({"token_deletion": {"rate": 0.5}}), BART)(ids, attention, keys(200), starts)
    assert torch.equal(out.target_ids, ids)
    assert bool((out.attention_mask.sum(dim=1) == 2 + 12 - 6).all())  # half of the 11 tokens besides the mask
    texts = [out.input_ids[r, 1:7] for r in range(200)]
    assert all(int((text == MASK).sum()) == 1 for text in texts)
    assert sum(int((text == BART.sep_id).sum()) for text in texts) > 60  # the literal </s> survives half the time


def test_empty_text_stays_empty():
    texts, _ = noise(ALL, np.array([0, 0]))
    assert all(len(text) == 0 for text in texts)


# --------------------------------------------------------------------------------------------- config and errors
def test_config_section():
    config = NoiseConfig.from_dict({"text_infilling": {"rate": 0.3, "poisson_lambda": 3.0},
                                    "sentence_permutation": {"rate": 1.0}})
    assert config.functions == ("sentence_permutation", "text_infilling")
    assert config.text_infilling.rate == 0.3 and config.dynamic
    assert NoiseConfig.from_dict({"token_deletion": {}}).token_deletion.rate == 0.15


@pytest.mark.parametrize("spec, message", [
    ({}, "noise: no noise function chosen"),
    ({"text_infiling": {}}, "noise.text_infiling: unknown key; did you mean text_infilling?"),
    ({"text_infilling": {"rat": 0.3}}, "noise.text_infilling.rat: unknown key; did you mean rate?"),
    ({"text_infilling": {"rate": 0.0}}, "noise.text_infilling.rate: must be in (0, 1)"),
    ({"text_infilling": {"rate": 1.0}}, "noise.text_infilling.rate: must be in (0, 1)"),
    ({"text_infilling": {"poisson_lambda": 0}}, "noise.text_infilling.poisson_lambda: the mean span length"),
    ({"text_infilling": {"poisson_lambda": 100}}, "noise.text_infilling.poisson_lambda: the mean span length"),
    ({"token_masking": {"rate": -0.1}}, "noise.token_masking.rate: must be in (0, 1)"),
    ({"token_deletion": {"rate": 1.5}}, "noise.token_deletion.rate: must be in (0, 1)"),
    ({"sentence_permutation": {"rate": 0}}, "noise.sentence_permutation.rate: must be in (0, 1]"),
    ({"document_rotation": {"rate": 2}}, "noise.document_rotation.rate: must be in (0, 1]"),
    ({"text_infilling": {}, "dynamic": "yes"}, "noise.dynamic: expected bool"),
])
def test_config_errors_name_the_key(spec, message):
    with pytest.raises(ConfigError) as error:
        NoiseConfig.from_dict(spec)
    assert message in str(error.value)


def test_bad_rows_are_refused():
    box = BartNoise(NoiseConfig.from_dict({"sentence_permutation": {}}), BART)
    ids, attention, starts = rows(np.array([5, 3]))
    with pytest.raises(DataError, match="sentence_permutation needs the sentence starts"):
        box(ids, attention, keys(2))
    with pytest.raises(DataError, match="keys must be"):
        box(ids, attention, keys(3), starts)
    bad = ids.clone()
    bad[1, 0] = 50
    with pytest.raises(DataError, match="row 1 does not start with"):
        box(bad, attention, keys(2), starts)
    bad = ids.clone()
    bad[0, 6] = 50
    with pytest.raises(DataError, match="row 0 does not end with"):
        box(bad, attention, keys(2), starts)
    with pytest.raises(DataError, match="right-padded"):
        box(ids, attention.flip(1), keys(2), starts)
    t5 = Framing(cls_id=None, sep_id=1, pad_id=0, mask_id=None, style="t5")
    with pytest.raises(TokenizerError, match="no mask token"):
        BartNoise(NoiseConfig.from_dict({"text_infilling": {}}), t5)


# --------------------------------------------------------------------------------------------- the batch maker
def dataset(spec: dict, kind: str = "doc-sentences", seed: int = 0):
    from bertology.data.bart_noise import DenoisingBatches
    from bertology.data.dataset import PretrainingDataset
    from bertology.data.instances import InMemoryDocuments, InstanceConfig

    rng = np.random.default_rng(0)
    next_id = iter(range(TEXT, 10**6))
    documents = [[[next(next_id) for _ in range(rng.integers(1, 9))] for _ in range(rng.integers(1, 8))]
                 for _ in range(60)]
    config = InstanceConfig(kind=kind, max_seq_length=24, seed=seed)
    box = BartNoise(NoiseConfig.from_dict(spec), BART)
    return PretrainingDataset(InMemoryDocuments(documents), BART, config,
                              DenoisingBatches(box, config.seed, config.dupe_factor)), documents


def test_doc_sentences_batches_permute_whole_sentences_and_resume_exactly():
    data, documents = dataset({"sentence_permutation": {}, "text_infilling": {}})
    sentence_of = {}  # first id -> the sentence
    for document in documents:
        for sentence in document:
            sentence_of[sentence[0]] = sentence
    plain, _ = dataset({"sentence_permutation": {}})
    for batch in plain.batches(0, batch_size=8):
        assert batch.input_ids.shape == batch.target_ids.shape  # permutation keeps the lengths
        for r in range(len(batch)):
            text = batch.input_ids[r, 1:int(batch.attention_mask[r].sum()) - 1].tolist()
            target = batch.target_ids[r, 1:int(batch.target_mask[r].sum()) - 1].tolist()
            assert sorted(text) == sorted(target)
            begin = 0
            while begin < len(text):  # whole sentences of the corpus (or the piece of one that fills a row)
                sentence = sentence_of[text[begin]]
                piece = text[begin:begin + len(sentence)]
                assert piece == sentence[:len(piece)]
                begin += len(piece)
    batches = list(data.batches(1, batch_size=4))
    resumed = list(data.batches(1, batch_size=4, start_batch=3))
    assert len(resumed) == len(batches) - 3
    for a, b in zip(batches[3:], resumed):
        torch.testing.assert_close(a.input_ids, b.input_ids, rtol=0, atol=0)
        torch.testing.assert_close(a.target_ids, b.target_ids, rtol=0, atol=0)
        assert torch.equal(a.instance_ids, b.instance_ids)
    other = list(dataset({"sentence_permutation": {}, "text_infilling": {}})[0].batches(1, batch_size=4))
    assert all(torch.equal(a.input_ids, b.input_ids) for a, b in zip(batches, other))


def test_pair_instances_have_no_sentence_starts_for_permutation():
    data, _ = dataset({"sentence_permutation": {}}, kind="segment-pair")
    with pytest.raises(DataError, match="needs the sentence starts of the rows"):
        next(iter(data.batches(0, batch_size=4)))


def test_brown_documents_through_the_corpus_pipeline(tmp_path, data_dir):
    """Real text: Brown files, a byte-level BPE tokenizer (<s> ... </s>, <mask>), shards, doc-sentences rows; the
    sources are whole corpus sentences in another order (permutation alone), and 30 % infilled (with it)."""
    from bertology.data import TokenizedCorpus, prepare_corpus
    from bertology.data.bart_noise import DenoisingBatches
    from bertology.data.dataset import PretrainingDataset
    from bertology.data.instances import InstanceConfig
    from bertology.tokenization import train_tokenizer

    files = sorted((data_dir / "brown-nltk").glob("ca0[1-3]"))
    if not files:
        pytest.skip(f"no Brown files under {data_dir / 'brown-nltk'}")
    tokenizer = train_tokenizer([str(f) for f in files], "bpe", 1500, style="roberta", show_progress=False)
    corpus = prepare_corpus(files, tokenizer, tmp_path / "shards", format="brown", show_progress=False)
    assert isinstance(corpus, TokenizedCorpus)
    framing = tokenizer.framing
    sentences = {tuple(s.tolist()) for i in range(len(corpus)) for s in corpus.document(i)}
    config = InstanceConfig(kind="doc-sentences", max_seq_length=128, seed=0)

    def batches(spec):
        box = BartNoise(NoiseConfig.from_dict(spec), framing, max_length=128)
        data = PretrainingDataset(corpus, framing, config, DenoisingBatches(box, 0, 1))
        return list(data.batches(0, 16))

    moved = 0
    for batch in batches({"sentence_permutation": {}}):
        for r in range(len(batch)):
            text = batch.input_ids[r, 1:int(batch.attention_mask[r].sum()) - 1].tolist()
            target = batch.target_ids[r, 1:int(batch.target_mask[r].sum()) - 1].tolist()
            moved += text != target
            begin = 0
            while begin < len(text):  # the longest corpus sentence that starts here (rows hold whole ones)
                length = max((k for k in range(1, len(text) - begin + 1) if tuple(text[begin:begin + k]) in sentences),
                             default=0)
                assert length > 0, f"row {r}: no corpus sentence starts at {begin}"
                begin += length
    assert moved > 20  # of 90 rows
    kept = total = 0
    for batch in batches({"sentence_permutation": {}, "text_infilling": {}}):
        source = batch.input_ids[batch.attention_mask.bool()]
        kept += int(((source != framing.mask_id) & ~torch.isin(source, torch.tensor(sorted(framing.ids)))).sum())
        total += int(batch.target_mask.sum()) - 2 * len(batch)
        assert "<mask>" in tokenizer.decode(batch.input_ids[0].tolist(), skip_special_tokens=False)
    assert abs(1 - kept / total - 0.3) < 0.005  # 9,864 tokens
    # Whole words, from the BPE tokenizer's word starts that the instances carry: 30 % of the words, so about 30 %
    # of the tokens (not exactly: words differ in length).
    kept = total = 0
    for batch in batches({"text_infilling": {"whole_words": True}}):
        source = batch.input_ids[batch.attention_mask.bool()]
        kept += int(((source != framing.mask_id) & ~torch.isin(source, torch.tensor(sorted(framing.ids)))).sum())
        total += int(batch.target_mask.sum()) - 2 * len(batch)
    assert abs(1 - kept / total - 0.3) < 0.02
