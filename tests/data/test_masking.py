"""MLM masking statistics (>= 100k tokens, 5-sigma bounds computed here), whole-word rules, seeding and errors."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from bertology.data import Masker, MaskingConfig, SpecialTokens, masking_seeds
from bertology.data.masking import _PRIORITY, _keyed_uniforms
from bertology.errors import ConfigError, DataError

SPECIAL = SpecialTokens(cls_id=1, sep_id=2, pad_id=0, mask_id=3)
EXTRA_SPECIAL = 4  # e.g. [UNK]: never selected, never a replacement
VOCAB = 64
SIGMAS = 5.0


def binomial_ok(count: float, n: int, p: float) -> bool:
    return abs(count - n * p) <= SIGMAS * math.sqrt(n * p * (1 - p))


def chi_square_bound(dof: int) -> float:
    """Upper 5-sigma quantile of chi-square(dof), Wilson-Hilferty approximation."""
    return dof * (1 - 2 / (9 * dof) + SIGMAS * math.sqrt(2 / (9 * dof))) ** 3


def chi_square(observed: np.ndarray, expected: np.ndarray) -> float:
    return float(((observed - expected) ** 2 / expected).sum())


def make_batch(rows: int = 1024, width: int = 256, seed: int = 0, word_start_prob: float = 1.0):
    """Right-padded [CLS] A [SEP] B [SEP] rows of random ordinary ids with a few extra-special tokens."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(width // 2, width + 1, size=rows)
    ids = rng.integers(5, VOCAB, size=(rows, width))
    ids[rng.random((rows, width)) < 0.01] = EXTRA_SPECIAL
    columns = np.arange(width)
    real = columns[None, :] < lengths[:, None]
    ids[:, 0] = SPECIAL.cls_id
    ids[np.arange(rows), lengths // 2] = SPECIAL.sep_id
    ids[np.arange(rows), lengths - 1] = SPECIAL.sep_id
    ids[~real] = SPECIAL.pad_id
    starts = (rng.random((rows, width)) < word_start_prob) & real
    return torch.from_numpy(ids), torch.from_numpy(real.astype(np.int64)), torch.from_numpy(starts)


def maskable(ids: torch.Tensor, attention: torch.Tensor) -> torch.Tensor:
    return attention.bool() & ~torch.isin(ids, torch.tensor([0, 1, 2, 3, EXTRA_SPECIAL]))


def masker(**kwargs) -> Masker:
    counts = kwargs.pop("unigram_counts", None)
    return Masker(MaskingConfig(**kwargs), SPECIAL, VOCAB, {EXTRA_SPECIAL}, counts)


def selected_mask(out, shape) -> torch.Tensor:
    mask = torch.zeros(shape, dtype=torch.bool)
    mask[out.masked_positions[:, 0], out.masked_positions[:, 1]] = True
    return mask


def test_count_selection_is_berts_exact_count():
    ids, attention, _ = make_batch()
    out = masker()(ids, attention, generator=torch.Generator().manual_seed(0))
    n = maskable(ids, attention).sum(1)
    assert n.sum() > 100_000
    counts = torch.bincount(out.masked_positions[:, 0], minlength=len(ids))
    expected = torch.tensor([min(int(x), max(1, round(int(x) * 0.15))) for x in n])
    assert torch.equal(counts, expected)
    # Every maskable position is equally likely: relative positions within a row fall evenly into 10 bins.
    sel = selected_mask(out, ids.shape)
    rank = torch.cumsum(maskable(ids, attention).long(), 1) - 1
    relative = (rank[sel].double() / n[out.masked_positions[:, 0]].double() * 10).long().numpy()
    observed = np.bincount(relative, minlength=10)
    assert chi_square(observed, np.full(10, len(relative) / 10)) < chi_square_bound(9)


def test_bernoulli_selection_rate():
    ids, attention, _ = make_batch(seed=1)
    out = masker(selection="bernoulli")(ids, attention, generator=torch.Generator().manual_seed(1))
    n = int(maskable(ids, attention).sum())
    assert n > 100_000 and binomial_ok(len(out.mlm_labels), n, 0.15)


@pytest.mark.parametrize("selection", ["count", "bernoulli"])
def test_specials_and_padding_are_never_selected_and_nothing_else_changes(selection):
    ids, attention, _ = make_batch(rows=512, seed=2)
    out = masker(selection=selection, mlm_probability=0.5)(ids, attention, generator=torch.Generator().manual_seed(2))
    sel = selected_mask(out, ids.shape)
    assert not (sel & ~maskable(ids, attention)).any()
    assert torch.equal(out.input_ids[~sel], ids[~sel])
    assert torch.equal(out.mlm_labels, ids[sel])
    rows, cols = out.masked_positions.unbind(1)
    assert torch.equal(rows * 10_000 + cols, torch.sort(rows * 10_000 + cols).values)  # row-major order
    assert out.masked_positions.dtype == out.mlm_labels.dtype == torch.long


def test_80_10_10_split():
    ids, attention, _ = make_batch(rows=2048, seed=3)
    out = masker()(ids, attention, generator=torch.Generator().manual_seed(3))
    sel = selected_mask(out, ids.shape)
    new = out.input_ids[sel]
    n = len(new)
    assert n > 30_000
    masked = int((new == SPECIAL.mask_id).sum())
    changed = int(((new != SPECIAL.mask_id) & (new != out.mlm_labels)).sum())
    ordinary = VOCAB - 5
    assert binomial_ok(masked, n, 0.8)
    # A random replacement equals the original token 1 time in `ordinary`.
    assert binomial_ok(changed, n, 0.1 * (1 - 1 / ordinary))
    assert binomial_ok(n - masked - changed, n, 0.1 + 0.1 / ordinary)


def test_uniform_replacement_covers_the_ordinary_vocabulary():
    ids, attention, _ = make_batch(seed=4)
    out = masker(mask_token_prob=0.0, random_token_prob=1.0)(ids, attention,
                                                              generator=torch.Generator().manual_seed(4))
    replaced = out.input_ids[selected_mask(out, ids.shape)].numpy()
    counts = np.bincount(replaced, minlength=VOCAB)
    assert counts[:5].sum() == 0
    ordinary = counts[5:]
    assert len(replaced) > 25_000 and (ordinary > 0).all()
    assert chi_square(ordinary, np.full(len(ordinary), len(replaced) / len(ordinary))) < chi_square_bound(
        len(ordinary) - 1)


def test_unigram_replacement_follows_the_counts():
    counts = np.zeros(VOCAB)
    counts[5:] = 1000.0 / np.arange(1, VOCAB - 4)  # Zipf-like
    counts[40:45] = 0.0  # never seen: never drawn
    counts[[0, 1, 2, 3, EXTRA_SPECIAL]] = 1e6  # specials are frequent in a corpus but excluded
    ids, attention, _ = make_batch(seed=5)
    out = masker(mask_token_prob=0.0, random_token_prob=1.0, replacement="unigram", unigram_counts=counts)(
        ids, attention, seeds=masking_seeds(5, range(len(ids)), 0, 1, False))
    replaced = out.input_ids[selected_mask(out, ids.shape)].numpy()
    observed = np.bincount(replaced, minlength=VOCAB)
    assert observed[:5].sum() == 0 and observed[40:45].sum() == 0
    probs = counts.copy()
    probs[:5] = 0
    probs /= probs.sum()
    support = probs > 0
    assert chi_square(observed[support], probs[support] * len(replaced)) < chi_square_bound(int(support.sum()) - 1)


def word_ids(candidates: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """Word index per maskable token (-1 elsewhere); a word also starts after any non-maskable token."""
    previous = np.zeros_like(candidates)
    previous[:, 1:] = candidates[:, :-1]
    new_word = candidates & (starts | ~previous)
    ids = np.cumsum(new_word.ravel()) - 1
    return np.where(candidates.ravel(), ids, -1).reshape(candidates.shape)


def test_whole_word_decisions_are_per_word():
    ids, attention, starts = make_batch(seed=6, word_start_prob=0.55)
    out = masker(whole_word=True, selection="bernoulli")(ids, attention, starts,
                                                         generator=torch.Generator().manual_seed(6))
    candidates = maskable(ids, attention).numpy()
    words = word_ids(candidates, starts.numpy())
    sel = selected_mask(out, ids.shape).numpy()
    n_words = words.max() + 1
    per_word = np.bincount(words[candidates], weights=sel[candidates], minlength=n_words)
    length = np.bincount(words[candidates], minlength=n_words)
    assert ((per_word == 0) | (per_word == length)).all()  # all or none
    chosen = per_word > 0
    assert n_words > 50_000 and binomial_ok(int(chosen.sum()), int(n_words), 0.15)
    # The token rate is also mlm_probability in expectation (variance from the word lengths).
    tokens = int(candidates.sum())
    sigma = math.sqrt(0.15 * 0.85 * float((length.astype(float) ** 2).sum()))
    assert abs(sel.sum() - 0.15 * tokens) < SIGMAS * sigma
    assert (length > 1).mean() > 0.2  # the test has real multi-token words


def test_whole_word_count_matches_berts_greedy_loop():
    ids, attention, starts = make_batch(rows=256, seed=7, word_start_prob=0.5)
    seeds = masking_seeds(7, range(len(ids)), 0, 1, False)
    out = masker(whole_word=True, max_predictions=30)(ids, attention, starts, seeds=seeds)
    candidates = maskable(ids, attention).numpy()
    sel = selected_mask(out, ids.shape).numpy()
    priority = _keyed_uniforms(seeds, ids.shape[1], _PRIORITY).numpy()
    for row in range(len(ids)):
        words = word_ids(candidates[row:row + 1], starts[row:row + 1].numpy())[0]
        n_words = words.max() + 1
        members = [np.flatnonzero(words == w) for w in range(n_words)]
        budget = min(30, max(1, round(int(candidates[row].sum()) * 0.15)))
        # BERT's loop: visit words in random order, skip a word that would overshoot the budget.
        expected = np.zeros(ids.shape[1], dtype=bool)
        taken = 0
        for w in np.argsort(priority[row, :n_words], kind="stable"):
            if taken >= budget:
                break
            if taken + len(members[w]) > budget:
                continue
            expected[members[w]] = True
            taken += len(members[w])
        assert np.array_equal(sel[row], expected), row


def test_leading_continuation_tokens_form_a_word():
    ids = torch.tensor([[1, 20, 21, 22, 23, 2]])
    attention = torch.ones_like(ids)
    starts = torch.tensor([[False, False, False, True, False, False]])  # 20 21 | 22 23
    m = masker(whole_word=True, mlm_probability=0.5)
    seen = set()
    for seed in range(40):
        out = m(ids, attention, starts, generator=torch.Generator().manual_seed(seed))
        seen.add(tuple(out.masked_positions[:, 1].tolist()))
    assert seen == {(1, 2), (3, 4)}


@pytest.mark.parametrize("selection", ["count", "bernoulli"])
def test_max_predictions_caps_each_row(selection):
    ids, attention, _ = make_batch(rows=256, seed=8)
    out = masker(selection=selection, max_predictions=20)(ids, attention, generator=torch.Generator().manual_seed(8))
    counts = torch.bincount(out.masked_positions[:, 0], minlength=len(ids))
    assert counts.max() == 20 and (counts <= 20).all()


def test_static_masks_repeat_per_duplicate_and_dynamic_masks_change():
    ids, attention, _ = make_batch(rows=64, seed=9)
    m = masker()
    instance_ids = np.arange(100, 164)

    def positions(epoch: int, dynamic: bool) -> torch.Tensor:
        return m(ids, attention, seeds=masking_seeds(3, instance_ids, epoch, 2, dynamic)).masked_positions

    assert torch.equal(positions(0, False), positions(2, False))
    assert torch.equal(positions(1, False), positions(5, False))
    assert not torch.equal(positions(0, False), positions(1, False))
    assert not torch.equal(positions(0, True), positions(2, True))
    assert torch.equal(positions(4, True), positions(4, True))
    assert torch.equal(masking_seeds(3, [5], 0, 2, False), masking_seeds(3, [5], 2, 2, False))
    assert not torch.equal(masking_seeds(3, [5], 0, 2, False), masking_seeds(4, [5], 0, 2, False))


def test_a_rows_mask_does_not_depend_on_its_batch():
    ids, attention, starts = make_batch(rows=16, seed=10, word_start_prob=0.6)
    m = masker(whole_word=True)
    seeds = masking_seeds(0, range(16), 0, 1, False)
    together = m(ids, attention, starts, seeds=seeds)
    for row in (0, 7, 15):
        width = int(attention[row].sum())
        alone = m(ids[row:row + 1, :width], attention[row:row + 1, :width], starts[row:row + 1, :width],
                  seeds=seeds[row:row + 1])
        assert torch.equal(alone.input_ids[0], together.input_ids[row, :width])
        mine = together.masked_positions[:, 0] == row
        assert torch.equal(alone.masked_positions[:, 1], together.masked_positions[mine, 1])


def test_keyed_uniforms_are_uniform():
    u = _keyed_uniforms(masking_seeds(0, range(1000), 0, 1, False), 200, 2).numpy().ravel()
    observed = np.bincount((u * 50).astype(int), minlength=50)
    assert u.min() >= 0.0 and u.max() < 1.0
    assert chi_square(observed, np.full(50, len(u) / 50)) < chi_square_bound(49)


def test_generator_masks_are_reproducible():
    ids, attention, _ = make_batch(rows=32, seed=11)
    m = masker()
    a = m(ids, attention, generator=torch.Generator().manual_seed(5))
    b = m(ids, attention, generator=torch.Generator().manual_seed(5))
    c = m(ids, attention, generator=torch.Generator().manual_seed(6))
    assert torch.equal(a.input_ids, b.input_ids) and torch.equal(a.masked_positions, b.masked_positions)
    assert not torch.equal(a.masked_positions, c.masked_positions)


def test_rows_without_maskable_tokens():
    ids = torch.tensor([[1, 2, 0, 0], [1, 9, 2, 0]])
    attention = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 0]])
    out = masker()(ids, attention, generator=torch.Generator().manual_seed(0))
    assert out.masked_positions.tolist() == [[1, 1]] and out.mlm_labels.tolist() == [9]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"mlm_probability": 1.5}, "mlm_probability: must be in"),
        ({"mask_token_prob": 0.9, "random_token_prob": 0.2}, "mask_token_prob \\+ random_token_prob"),
        ({"replacement": "zipf"}, "MaskingConfig.replacement"),
        ({"selection": "exact"}, "MaskingConfig.selection"),
        ({"max_predictions": 0}, "max_predictions: must be >= 1"),
        ({"whole_word": 1}, "whole_word: expected bool"),
        ({"dynamic": "yes"}, "MaskingConfig.dynamic: expected bool, got str"),
        ({"selection": "bogus"}, "MaskingConfig.selection: expected one of 'count', 'bernoulli', got str 'bogus'"),
        ({"replacement": 1}, "MaskingConfig.replacement: expected one of 'uniform', 'unigram', got int 1"),
        ({"mlm_probability": float("nan")}, "MaskingConfig.mlm_probability: must be a finite number"),
        ({"mlm_probability": True}, "MaskingConfig.mlm_probability: expected float, got bool"),
        ({"max_predictions": 2.0}, "MaskingConfig.max_predictions: expected int or null, got float"),
    ],
)
def test_masking_config_errors(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        MaskingConfig(**kwargs)


def test_masking_config_from_dict():
    assert MaskingConfig.from_dict({"whole_word": True}).whole_word
    with pytest.raises(ConfigError, match="masking.selection: expected one of 'count', 'bernoulli'"):
        MaskingConfig.from_dict({"selection": "bogus"})
    with pytest.raises(ConfigError, match=r"^masking: mask_token_prob \+ random_token_prob must be <= 1"):
        MaskingConfig.from_dict({"mask_token_prob": 0.9, "random_token_prob": 0.2})
    with pytest.raises(ConfigError, match="masking.mlm_prob: unknown key; did you mean mlm_probability"):
        MaskingConfig.from_dict({"mlm_prob": 0.15})


def test_masker_construction_errors():
    with pytest.raises(ConfigError, match="needs unigram_counts"):
        Masker(MaskingConfig(replacement="unigram"), SPECIAL, VOCAB)
    with pytest.raises(ConfigError, match="unigram_counts has shape \\(3,\\), expected \\(64,\\)"):
        Masker(MaskingConfig(replacement="unigram"), SPECIAL, VOCAB, unigram_counts=np.ones(3))
    with pytest.raises(ConfigError, match="non-negative"):
        Masker(MaskingConfig(replacement="unigram"), SPECIAL, VOCAB, unigram_counts=-np.ones(VOCAB))
    with pytest.raises(ConfigError, match="no mass outside the special ids"):
        Masker(MaskingConfig(replacement="unigram"), SPECIAL, VOCAB,
               unigram_counts=np.r_[np.ones(4), np.zeros(VOCAB - 4)])
    with pytest.raises(ConfigError, match="given but MaskingConfig.replacement is 'uniform'"):
        Masker(MaskingConfig(), SPECIAL, VOCAB, unigram_counts=np.ones(VOCAB))
    with pytest.raises(ConfigError, match="special id\\(s\\) \\[70\\] outside the vocabulary of size 64"):
        Masker(MaskingConfig(), SPECIAL, VOCAB, {70})


def test_masker_call_errors():
    m = masker(whole_word=True)
    ids, attention, starts = make_batch(rows=2, width=8)
    g = torch.Generator().manual_seed(0)
    with pytest.raises(DataError, match="needs word_starts"):
        m(ids, attention, generator=g)
    with pytest.raises(DataError, match="exactly one of generator= and seeds="):
        m(ids, attention, starts)
    with pytest.raises(DataError, match="attention_mask shape \\(2, 7\\)"):
        m(ids, attention[:, :7], starts, generator=g)
    with pytest.raises(DataError, match="seeds must be \\[B\\] = \\[2\\]"):
        m(ids, attention, starts, seeds=torch.zeros(3, dtype=torch.long))
    with pytest.raises(DataError, match="input_ids must be \\[B, L\\]"):
        m(ids[0], attention[0], starts[0], generator=g)


def test_masking_config_normalises_numbers():
    config = MaskingConfig(mlm_probability=np.float32(0.5), max_predictions=np.int64(5))
    assert config.mlm_probability == 0.5 and type(config.mlm_probability) is float
    assert config.max_predictions == 5 and type(config.max_predictions) is int
