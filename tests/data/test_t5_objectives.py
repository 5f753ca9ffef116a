"""T5's table of pretraining objectives (Raffel et al. 2020, Table 3), ``data.span_corruption.objective``: each
variant on the paper's example with its corrupted positions fixed, in the paper's strings; the rates over many
rows within binomial standard deviations; every source and target giving back the text; keyed determinism; and
bad settings named by their key."""

from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pytest
import tokenizers
import torch

from bertology.data.dataset import InstanceBatch
from bertology.data.masking import masking_seeds
from bertology.data.span_corruption import (
    OBJECTIVES,
    Noise,
    SpanCorruption,
    SpanCorruptionConfig,
    apply_noise,
    corrupt,
    draw_noise,
    iid_overflow,
    restore,
    sentinels_needed,
)
from bertology.data.span_masking import row_key_generator
from bertology.errors import ConfigError
from bertology.tokenization._pipeline import default_specials
from bertology.tokenization.framing import Framing
from bertology.tokenization.tokenizer import Tokenizer

pytestmark = pytest.mark.usefixtures("one_thread")

EXAMPLE = "Thank you for inviting me to your party last week ."
SENTINELS = np.arange(299, 199, -1)  # <extra_id_0> has the highest id, as in T5
FRAMING = Framing(cls_id=None, sep_id=1, pad_id=0, mask_id=None, style="t5", sentinels=tuple(SENTINELS.tolist()))
ORDINARY = np.arange(3, 200)  # the ids below the sentinels less <pad> </s> <unk>


@pytest.fixture(scope="module")
def words() -> Tokenizer:
    """A T5-style tokenizer whose tokens are the example's words (and the paper's stray "apple"), 10 sentinels."""
    vocab = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0)] + [(w, -1.0) for w in EXAMPLE.split() + ["apple"]]
    vocab += [(f"<extra_id_{i}>", 0.0) for i in range(9, -1, -1)]
    backend = tokenizers.Tokenizer(tokenizers.models.Unigram(vocab, unk_id=2))
    backend.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    return Tokenizer(backend, style="t5", specials=default_specials("t5", "unigram"))


def render(tokenizer: Tokenizer, ids: np.ndarray, names: tuple[str, ...]) -> str:
    """The paper's way of writing a sequence: sentinels as ``names`` (<X> <Y> <Z>, or <M> for the mask)."""
    sentinels = tokenizer.framing.sentinels
    return " ".join(names[sentinels.index(i)] if i in sentinels else tokenizer.id_to_token(i) for i in ids.tolist())


def positions(length: int, *chosen: int) -> np.ndarray:
    mask = np.zeros(length, dtype=bool)
    mask[list(chosen)] = True
    return mask


SPANS = ("<X>", "<Y>", "<Z>")
MASK = ("<M>",)


def test_each_objective_on_the_papers_example(words):
    """Table 3 of the paper, with the positions it corrupts: "for inviting" and "last" (the i.i.d. rows), "for
    inviting me" and "your party last" (random spans)."""
    text = np.asarray(words.encode(EXAMPLE).ids[:-1])  # less </s>: the framing is the maker's
    sentinels = np.asarray(words.framing.sentinels)
    assert render(words, text, SPANS) == EXAMPLE
    iid = positions(len(text), 2, 3, 8)
    apple = words.token_to_id("apple")

    def made(objective: str, noise: Noise, names: tuple[str, ...] = SPANS) -> tuple[str, str]:
        source, target = apply_noise(text, objective, noise, sentinels)
        return render(words, source, names), render(words, target, names)

    assert made("prefix-lm", Noise(cut=4)) == ("Thank you for inviting", "me to your party last week .")
    bert = Noise(mask=iid, replacement=np.where(positions(len(text), 8), apple, -1))
    assert made("bert", bert, MASK) == ("Thank you <M> <M> me to your party apple week .", EXAMPLE)
    # The paper's shuffled row also has a word, "fun", that its text lacks; the order of the other eleven.
    shuffled = "party me for your to . last you inviting week Thank"
    order = np.asarray([EXAMPLE.split().index(w) for w in shuffled.split()])
    assert made("deshuffle", Noise(order=order)) == (shuffled, EXAMPLE)
    assert made("mass", Noise(mask=iid), MASK) == ("Thank you <M> <M> me to your party <M> week .", EXAMPLE)
    assert made("iid-spans", Noise(mask=iid)) == ("Thank you <X> me to your party <Y> week .",
                                                  "<X> for inviting <Y> last <Z>")
    assert made("drop", Noise(mask=iid)) == ("Thank you me to your party week .", "for inviting last")
    spans = positions(len(text), 2, 3, 4, 6, 7, 8)
    assert made("random-spans", Noise(mask=spans)) == ("Thank you <X> to <Y> week .",
                                                       "<X> for inviting me <Y> your party last <Z>")
    # Noise at the very start: the target still opens with the first sentinel, and gives back the text.
    first = positions(len(text), 0, 1, 9, 10)
    source, target = apply_noise(text, "iid-spans", Noise(mask=first), sentinels)
    assert render(words, source, SPANS) == "<X> for inviting me to your party last <Y>"
    assert render(words, target, SPANS) == "<X> Thank you <Y> week ."
    assert restore(source, target, sentinels).tolist() == text.tolist()


def test_the_maker_frames_the_papers_example(words):
    """Through the batch maker: both sides closed by </s>, the noise drawn from the row's key."""
    ids = words.encode(EXAMPLE).ids
    batch = InstanceBatch(torch.tensor([ids]), torch.ones(1, len(ids), dtype=torch.long),
                          torch.zeros(1, len(ids), dtype=torch.long), torch.ones(1, len(ids), dtype=torch.bool),
                          None, torch.tensor([0]), 0)
    for objective in OBJECTIVES:
        config = SpanCorruptionConfig(objective=objective)
        maker = SpanCorruption(config, words.framing, seed=3, max_text_length=len(ids) - 1,
                               vocab_size=words.vocab_size, special_ids=words.special_ids)
        made = maker(batch)
        source = made.input_ids[0][made.attention_mask[0].bool()].numpy()
        target = made.target_ids[0][made.target_mask[0].bool()].numpy()
        assert source[-1] == words.sep_id and target[-1] == words.sep_id
        key = int(masking_seeds(3, np.array([0]), 0, 1, True).numpy()[0])
        expected = corrupt(np.asarray(ids[:-1]), config, np.asarray(words.framing.sentinels),
                           row_key_generator(key), maker.ordinary)
        assert source[:-1].tolist() == expected[0].tolist() and target[:-1].tolist() == expected[1].tolist()


def rebuilt(text: np.ndarray, objective: str, noise: Noise, source: np.ndarray, target: np.ndarray) -> np.ndarray:
    """The text back from a source and target (and, where they cannot tell, the noise)."""
    if objective in ("random-spans", "iid-spans"):
        return restore(source, target, SENTINELS)
    if objective == "drop":
        out = np.empty(len(source) + len(target), dtype=text.dtype)
        out[noise.mask] = target
        out[~noise.mask] = source
        return out
    if objective == "prefix-lm":
        return np.concatenate([source, target])
    return target


def rows(objective: str, count: int, length: int, seed: int = 0, **options):
    config = SpanCorruptionConfig(objective=objective, **options)
    rng = np.random.default_rng(seed)
    for k in range(count):
        text = rng.integers(3, 200, length)
        noise = draw_noise(length, config, len(SENTINELS), row_key_generator(seed * 100_000 + k), ORDINARY)
        source, target = corrupt(text, config, SENTINELS, row_key_generator(seed * 100_000 + k), ORDINARY)
        again = apply_noise(text, objective, noise, SENTINELS)  # corrupt is apply_noise of draw_noise
        assert source.tolist() == again[0].tolist() and target.tolist() == again[1].tolist()
        assert rebuilt(text, objective, noise, source, target).tolist() == text.tolist()
        yield text, noise, source, target


def within(observed: float, expected: float, sd: float, k: float = 4.0) -> bool:
    return abs(observed - expected) <= k * sd


@pytest.mark.parametrize("objective", ["iid-spans", "bert", "mass", "drop"])
def test_iid_objectives_corrupt_each_token_with_the_density(objective):
    """Each token is noise with probability p = 0.15 independently: over N tokens the share of noise is within 4
    binomial standard deviations sqrt(p (1 - p) / N) of p. A span starts at token 0 with probability p and at any
    later token with probability q = p (1 - p); starts at neighbouring tokens exclude each other and starts further
    apart are independent, so the variance of their count is at most the binomial one, and its mean gives the mean
    span length (about 1 / (1 - p) = 1.18)."""
    p, length, count = 0.15, 40, 500
    noise_tokens = spans = 0
    for text, noise, source, target in rows(objective, count, length):
        mask = noise.mask
        noise_tokens += int(mask.sum())
        spans += int((mask & ~np.concatenate([[False], mask[:-1]])).sum())
        if objective == "iid-spans":
            assert int(np.isin(target, SENTINELS, invert=True).sum()) == int(mask.sum())
            assert int(np.isin(source, SENTINELS).sum()) == sentinels_needed(mask) - int(not mask[-1])
        elif objective == "drop":
            assert len(target) == int(mask.sum()) and len(source) == length - int(mask.sum())
        elif objective == "mass":
            assert (source == SENTINELS[0]).tolist() == mask.tolist() and target.tolist() == text.tolist()
    total = length * count
    assert within(noise_tokens / total, p, math.sqrt(p * (1 - p) / total))
    q = p * (1 - p)
    expected_spans = count * (p + (length - 1) * q)
    assert within(spans, expected_spans, math.sqrt(count * (p * (1 - p) + (length - 1) * q * (1 - q))))
    assert 1.1 < noise_tokens / spans < 1.26  # ~1.18 at this length (0.15 x 40 / (0.15 + 39 x 0.1275))


def test_bert_replaces_a_tenth_of_the_noise_by_random_ordinary_tokens():
    """Of the noise tokens, a share random_token_rate (10 %) becomes a random token, drawn uniformly from the
    ordinary ids (never a special token or sentinel), the rest the mask sentinel <extra_id_0>."""
    masked = random = 0
    drawn = []
    for text, noise, source, target in rows("bert", 800, 40, seed=1):
        swapped = noise.replacement >= 0
        assert not (swapped & ~noise.mask).any()
        assert (source[noise.mask & ~swapped] == SENTINELS[0]).all()
        assert source[~noise.mask].tolist() == text[~noise.mask].tolist()
        assert source[swapped].tolist() == noise.replacement[swapped].tolist()
        masked += int(noise.mask.sum())
        random += int(swapped.sum())
        drawn.extend(noise.replacement[swapped].tolist())
    assert within(random / masked, 0.1, math.sqrt(0.1 * 0.9 / masked))
    assert set(drawn) <= set(ORDINARY.tolist()) and len(set(drawn)) > 0.5 * len(ORDINARY)
    # Uniform over the ordinary ids: the share below the middle within 4 binomial standard deviations.
    low = np.mean(np.asarray(drawn) < ORDINARY[len(ORDINARY) // 2])
    assert within(low, (len(ORDINARY) // 2) / len(ORDINARY), math.sqrt(0.25 / len(drawn)))


def test_random_spans_rates_over_many_rows():
    """T5's random spans through the same interface: the noise share and span count of every row are exact
    (``counts``), so the totals over rows of many lengths are their sums and the mean span length 3 up to rounding."""
    config = SpanCorruptionConfig()
    rng = np.random.default_rng(4)
    noise_total = span_total = length_total = 0
    for k in range(400):
        length = int(rng.integers(20, 200))
        text = rng.integers(3, 200, length)
        source, target = corrupt(text, config, SENTINELS, row_key_generator(k))
        noise, spans = config.counts(length)
        assert int(np.isin(target, SENTINELS, invert=True).sum()) == noise
        assert int(np.isin(source, SENTINELS).sum()) == spans
        noise_total, span_total, length_total = noise_total + noise, span_total + spans, length_total + length
    assert abs(noise_total / length_total - 0.15) < 0.5 * 400 / length_total  # rounding: half a token a row
    assert abs(noise_total / span_total - 3.0) < 0.15


def test_deshuffle_draws_a_uniform_permutation():
    """The source is the text in a uniformly random order: each token lands in each place with probability 1 / n,
    and the number of tokens left in place has mean 1 and variance 1 (so a share 1 - 1/n of the tokens move)."""
    length, count = 8, 4000
    landing = np.zeros(length)
    fixed = 0
    for text, noise, source, target in rows("deshuffle", count, length, seed=2):
        assert sorted(noise.order.tolist()) == list(range(length)) and target.tolist() == text.tolist()
        landing[int(np.flatnonzero(noise.order == 0)[0])] += 1
        fixed += int((noise.order == np.arange(length)).sum())
    for place in landing:
        assert within(place / count, 1 / length, math.sqrt((1 / length) * (1 - 1 / length) / count))
    assert within(fixed / count, 1.0, 1.0 / math.sqrt(count))


def test_prefix_lm_cuts_uniformly():
    """The prefix's length is uniform on 1 .. n - 1: each within 4 binomial standard deviations of 1 / (n - 1);
    a one-token text is all prefix."""
    length, count = 11, 3000
    cuts = np.zeros(length)
    for text, noise, source, target in rows("prefix-lm", count, length, seed=3):
        assert len(source) == noise.cut and 1 <= noise.cut <= length - 1
        cuts[noise.cut] += 1
    assert cuts[0] == 0
    for cut in cuts[1:]:
        assert within(cut / count, 1 / (length - 1), math.sqrt((1 / 10) * (9 / 10) / count))
    config = SpanCorruptionConfig(objective="prefix-lm")
    source, target = corrupt(np.array([7]), config, SENTINELS, row_key_generator(0))
    assert source.tolist() == [7] and target.tolist() == []


def test_the_sentinel_overflow_probability_is_exact():
    """``iid_overflow`` against every mask of 12 tokens, weighted by its probability (float64 throughout)."""
    length, p = 12, 0.3
    for sentinels in (1, 2, 3, 4, 6):
        exact = 0.0
        for bits in itertools.product([False, True], repeat=length):
            mask = np.asarray(bits)
            if sentinels_needed(mask) > sentinels:
                exact += p ** int(mask.sum()) * (1 - p) ** int(length - mask.sum())
        assert iid_overflow(length, p, sentinels) == pytest.approx(exact, rel=1e-12, abs=1e-15)


def test_iid_spans_never_use_more_sentinels_than_there_are():
    """8 tokens at density 0.2 need more than 4 sentinels only as noise, kept, noise, kept, ... (4 spans and a
    closing sentinel), with probability 0.2^4 0.8^4 = 6.6e-4: over 10,000 rows such first draws occur (about 6.6;
    within 4 binomial standard deviations) and are drawn again."""
    few = SENTINELS[:4]
    config = SpanCorruptionConfig(objective="iid-spans", noise_density=0.2)
    chance = iid_overflow(8, 0.2, 4)
    assert chance == pytest.approx(0.2 ** 4 * 0.8 ** 4, rel=1e-12)
    rows_, redrawn = 10_000, 0
    for k in range(rows_):
        text = np.arange(3, 11)
        source, target = corrupt(text, config, few, row_key_generator(k))
        used = set(source.tolist()) | set(target.tolist())
        assert used & set(SENTINELS.tolist()) <= set(few.tolist())
        assert restore(source, target, few).tolist() == text.tolist()
        redrawn += sentinels_needed(draw_noise(8, config, 100, row_key_generator(k)).mask) > 4
    assert redrawn > 0 and within(redrawn, rows_ * chance, math.sqrt(rows_ * chance * (1 - chance)))


def batch_of(texts: list[list[int]], ids: list[int], epoch: int = 0) -> InstanceBatch:
    rows_ = [t + [1] for t in texts]
    width = max(map(len, rows_))
    input_ids = torch.tensor([r + [0] * (width - len(r)) for r in rows_])
    mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows_])
    return InstanceBatch(input_ids, mask, torch.zeros_like(mask), mask.bool(), None, torch.tensor(ids), epoch)


@pytest.mark.parametrize("objective", OBJECTIVES)
def test_every_objective_is_keyed_by_instance_and_epoch(objective):
    rng = np.random.default_rng(5)
    texts = [rng.integers(3, 200, n).tolist() for n in (40, 9, 30)]
    config = SpanCorruptionConfig(objective=objective)
    maker = SpanCorruption(config, FRAMING, seed=7, max_text_length=60, vocab_size=300, special_ids=(0, 1, 2))
    made = maker(batch_of(texts, [3, 8, 11]))
    alone = maker(batch_of(texts[2:], [11]))
    for name in ("input_ids", "target_ids"):
        mask = "attention_mask" if name == "input_ids" else "target_mask"
        assert torch.equal(getattr(alone, name)[0][getattr(alone, mask)[0].bool()],
                           getattr(made, name)[2][getattr(made, mask)[2].bool()])
    again = maker(batch_of(texts, [3, 8, 11]))
    assert torch.equal(again.input_ids, made.input_ids) and torch.equal(again.target_ids, made.target_ids)
    later = maker(batch_of(texts, [3, 8, 11], epoch=1))
    assert not (torch.equal(later.input_ids, made.input_ids) and torch.equal(later.target_ids, made.target_ids))
    static = SpanCorruption(SpanCorruptionConfig(objective=objective, dynamic=False), FRAMING, seed=7, dupe_factor=2,
                            vocab_size=300, special_ids=(0, 1, 2))
    assert torch.equal(static(batch_of(texts, [3, 8, 11], epoch=2)).input_ids,
                       static(batch_of(texts, [3, 8, 11], epoch=0)).input_ids)


def test_an_unknown_objective_names_the_key():
    with pytest.raises(ConfigError, match=r"^data\.span_corruption\.objective: expected one of 'random-spans', "
                                          r"'iid-spans', 'bert', 'mass', 'drop', 'deshuffle', 'prefix-lm' or null, "
                                          r"got str 'bart'"):
        SpanCorruptionConfig.from_dict({"objective": "bart"})
    with pytest.raises(ConfigError, match=r"^data\.span_corruption\.random_token_rate: must be in \[0, 1\]"):
        SpanCorruptionConfig.from_dict({"objective": "bert", "random_token_rate": 1.5})
    with pytest.raises(ConfigError, match=r"^data\.span_corruption\.random_token_rate: only objective bert puts "
                                          r"random tokens in the source; objective is mass"):
        SpanCorruptionConfig.from_dict({"objective": "mass", "random_token_rate": 0.2})
    assert SpanCorruptionConfig.from_dict({"objective": "bert", "random_token_rate": 0.0}).random_rate == 0.0
    assert SpanCorruptionConfig.from_dict({}).variant == "random-spans"


def test_a_t5_run_recorded_before_the_choice_resumes():
    """A run config written before ``objective`` and ``random_token_rate`` existed compares equal to today's
    default (both None: random spans), so its checkpoints resume."""
    from bertology.training.config import PretrainConfig
    from bertology.training.trainer import check_same_run

    raw = {"model": {"architecture": "seq2seq", "family": "t5"}, "tokenizer": {"style": "t5", "kind": "unigram"},
           "data": {"instances": {"kind": "doc-sentences"}, "span_corruption": {}}, "objectives": {"denoise": {}}}
    current = PretrainConfig.from_dict(raw).to_dict()
    older = json.loads(json.dumps(current))
    del older["data"]["span_corruption"]["objective"], older["data"]["span_corruption"]["random_token_rate"]
    check_same_run("checkpoint", older, current)
    raw["data"]["span_corruption"] = {"objective": "drop"}
    with pytest.raises(ConfigError, match=r"data\.span_corruption\.objective: None -> 'drop'"):
        check_same_run("checkpoint", older, PretrainConfig.from_dict(raw).to_dict())


def test_objectives_that_need_sentinels_or_a_vocabulary_say_so():
    roberta = Framing(cls_id=0, sep_id=2, pad_id=1, mask_id=3, style="roberta")
    for objective in ("random-spans", "iid-spans", "bert", "mass"):
        with pytest.raises(ConfigError, match=rf"^data\.span_corruption: .*has no sentinel tokens.*objective "
                                              rf"{objective} needs them"):
            SpanCorruption(SpanCorruptionConfig(objective=objective), roberta, seed=0, vocab_size=50)
    for objective in ("drop", "deshuffle", "prefix-lm"):  # no sentinels needed
        SpanCorruption(SpanCorruptionConfig(objective=objective), roberta, seed=0, max_text_length=40)
    with pytest.raises(ConfigError, match=r"^data\.span_corruption\.objective: bert .*needs the vocabulary size"):
        SpanCorruption(SpanCorruptionConfig(objective="bert"), FRAMING, seed=0)
    with pytest.raises(ConfigError, match=r"every one of the 3 vocabulary ids is special"):
        SpanCorruption(SpanCorruptionConfig(objective="bert"), FRAMING, seed=0, vocab_size=3, special_ids=(0, 1, 2))


def test_iid_spans_refuse_a_length_that_would_run_out_of_sentinels():
    few = Framing(cls_id=None, sep_id=1, pad_id=0, mask_id=None, style="t5", sentinels=(299, 298, 297))
    config = SpanCorruptionConfig(objective="iid-spans")
    SpanCorruption(config, few, seed=0, max_text_length=4)  # 4 tokens never need more than 3 sentinels
    assert iid_overflow(4, 0.15, 3) == 0.0 and iid_overflow(40, 0.15, 3) > 1e-3
    with pytest.raises(ConfigError, match=r"^data\.span_corruption\.noise_density: with objective iid-spans a text "
                                          r"of 40 tokens needs more than the tokenizer's 3 sentinels with "
                                          r"probability 0\.\d+"):
        SpanCorruption(config, few, seed=0, max_text_length=40)
    with pytest.raises(ConfigError, match=r"a text of 5 tokens needs more than the tokenizer's 0 sentinels"):
        corrupt(np.arange(3, 8), config, SENTINELS[:0], row_key_generator(0))  # never drawn forever
