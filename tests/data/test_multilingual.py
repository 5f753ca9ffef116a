"""XLM-R's multilingual sampling: q_i ~ p_i^alpha by hand, the language draws against their probabilities
(chi-square and per-language binomial bounds, fixed seed), the mixture's unit shares against q, up-sampling
that cycles through a language's blocks, bad settings, and a run of configs/xlmr-tiny.yaml on small corpora."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import numpy as np
import pytest

from bertology.data.multilingual import (
    LanguageCorpus,
    MultilingualConfig,
    chi_square,
    draw_languages,
    sample_mixture,
    sampling_probabilities,
    write_mixture,
)
from bertology.errors import ConfigError, DataError
from bertology.training.config import PretrainConfig, load_config

ROOT = Path(__file__).resolve().parents[2]


def _corpus(path: Path, documents: int, words: list[str], seed: int) -> Path:
    rng = random.Random(seed)
    lines = []
    for _ in range(documents):
        for _ in range(rng.randint(2, 30)):
            lines.append(" ".join(rng.choice(words) for _ in range(rng.randint(3, 9))) + " .")
        lines.append("")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _languages(tmp_path: Path) -> list[LanguageCorpus]:
    big = _corpus(tmp_path / "xx.txt", 120, "alpha beta gamma delta epsilon zeta eta theta".split(), 0)
    mid = _corpus(tmp_path / "yy.txt", 20, "uno dos tres cuatro cinco seis siete ocho".split(), 1)
    small = _corpus(tmp_path / "zz.txt", 3, "eins zwei drei vier funf sechs sieben acht".split(), 2)
    return [LanguageCorpus("xx", [str(big)]), LanguageCorpus("yy", [str(mid)]), LanguageCorpus("zz", [str(small)])]


def test_sampling_probabilities_by_hand():
    q = sampling_probabilities([900, 90, 10], 0.3)
    p = np.array([0.9, 0.09, 0.01])
    np.testing.assert_allclose(q, p ** 0.3 / (p ** 0.3).sum(), rtol=1e-12)
    assert q[0] == pytest.approx(0.5680, abs=1e-4) and q[2] == pytest.approx(0.1473, abs=1e-4)  # from 0.9, 0.01
    np.testing.assert_allclose(sampling_probabilities([900, 90, 10], 1.0), p, rtol=1e-12)  # alpha 1: as given
    assert sampling_probabilities([5, 5], 0.3).tolist() == [0.5, 0.5]


def test_language_draws_follow_their_probabilities():
    r = np.array([0.55, 0.3, 0.1, 0.05])
    n = 50_000
    counts = np.bincount(draw_languages(r, n, seed=7), minlength=4)
    assert chi_square(counts, r) < 16.27  # the 0.999 quantile of chi-square with 3 degrees of freedom
    for count, prob in zip(counts, r):  # each language: a binomial within 4 standard deviations
        assert abs(count - n * prob) < 4 * math.sqrt(n * prob * (1 - prob))
    assert np.array_equal(draw_languages(r, 100, seed=7), draw_languages(r, 100, seed=7))
    assert not np.array_equal(draw_languages(r, 100, seed=7), draw_languages(r, 100, seed=8))


def test_the_mixture_gives_each_language_its_share_q(tmp_path):
    config = MultilingualConfig(_languages(tmp_path), alpha=0.3, block_sentences=4, blocks=20_000)
    mixture = sample_mixture(config, seed=3)
    report = mixture.report["languages"]
    units = np.array([report[t]["units"] for t in ("xx", "yy", "zz")], dtype=float)
    q = sampling_probabilities(units, 0.3)
    for tag, expected in zip(("xx", "yy", "zz"), q):
        assert report[tag]["q"] == pytest.approx(expected)
        assert report[tag]["share_drawn"] == pytest.approx(expected, abs=0.01), (tag, report[tag])
    drawn = np.array([report[t]["blocks_drawn"] for t in ("xx", "yy", "zz")])
    r = np.array([report[t]["draw_probability"] for t in ("xx", "yy", "zz")])
    assert chi_square(drawn, r) < 13.82  # 0.999 quantile, 2 degrees of freedom
    # The small language is up-sampled through whole cycles: its blocks appear equally often, give or take one.
    small = [tuple(b) for b, lang in zip(mixture.blocks, mixture.languages) if lang == "zz"]
    seen = np.array(list({b: small.count(b) for b in set(small)}.values()))
    assert len(seen) == report["zz"]["blocks_available"] and seen.max() - seen.min() <= 1
    assert all(len(b) <= 4 for b in mixture.blocks)
    # The same seed draws the same mixture; the written file holds every block, a blank line after each.
    assert sample_mixture(config, seed=3).languages == mixture.languages
    path = write_mixture(mixture, tmp_path / "mixture")
    assert path.read_text(encoding="utf-8").count("\n\n") == len(mixture.blocks)
    assert json.loads((tmp_path / "mixture" / "languages.json").read_text())["block_languages"][:5] == \
        mixture.languages[:5]


@pytest.mark.parametrize("alpha", [0.0, -0.3, 1.5])
def test_alpha_outside_0_1_is_refused(alpha):
    with pytest.raises(ConfigError, match=r"data\.multilingual\.alpha: must be in \(0, 1\]"):
        PretrainConfig.from_dict({"data": {"multilingual": {"alpha": alpha, "languages": [
            {"language": "en", "corpus": ["a.txt"]}]}}})


def test_bad_language_lists_are_refused():
    with pytest.raises(ConfigError, match=r"data\.multilingual\.languages\[1\]\.language: 'en' is given twice"):
        MultilingualConfig([LanguageCorpus("en", ["a"]), LanguageCorpus("en", ["b"])])
    with pytest.raises(ConfigError, match=r"data\.multilingual\.languages: at least one"):
        MultilingualConfig([])
    with pytest.raises(ConfigError, match=r"data\.corpus: give the corpora under data\.multilingual"):
        PretrainConfig.from_dict({"data": {"corpus": ["x.txt"], "multilingual": {"languages": [
            {"language": "en", "corpus": ["a.txt"]}]}}})


def test_an_empty_language_corpus_names_the_language_and_file(tmp_path):
    languages = _languages(tmp_path)
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n   \n", encoding="utf-8")
    languages.append(LanguageCorpus("qq", [str(empty)]))
    with pytest.raises(DataError, match=r"data\.multilingual\.languages\[3\] \('qq'\): .*empty.txt"):
        sample_mixture(MultilingualConfig(languages))


def test_xlmr_tiny_config_runs_end_to_end(tmp_path):
    """configs/xlmr-tiny.yaml with three small corpora: the mixture, a Unigram tokenizer trained on it, MLM steps."""
    from bertology.recipes.pretrain import pretrain
    from bertology.tokenization import load_tokenizer

    languages = _languages(tmp_path)
    out = tmp_path / "run"
    spec = json.dumps([{"language": c.language, "corpus": c.corpus, "format": "bert"} for c in languages])
    config = load_config(ROOT / "configs/xlmr-tiny.yaml", [
        f"data.multilingual.languages={spec}", "data.multilingual.blocks=400", "data.heldout_documents=5",
        "tokenizer.vocab_size=60", "model.preset=null", "model.hidden_size=32", "model.num_layers=1",
        "model.num_heads=2", "model.intermediate_size=64", "model.max_position_embeddings=80",
        "data.instances.max_seq_length=48", "optim.batch_size=4", "optim.total_steps=3", f"run.output_dir={out}",
        "run.eval_every=0", "run.eval_batches=2", "run.checkpoint_every=0", "run.log_every=1",
        "run.progress=false", "speed.threads=1", "speed.prefetch=0"])
    result = pretrain(config)
    assert result.steps == 3
    report = json.loads((out / "mixture" / "languages.json").read_text())
    assert set(report["languages"]) == {"xx", "yy", "zz"} and report["blocks"] == 400
    tokenizer = load_tokenizer(out / "tokenizer")
    assert tokenizer.kind == "unigram"
    for text in ("alpha gamma theta", "cuatro siete", "drei sieben"):  # every language is covered by one vocabulary
        ids = tokenizer.encode(text).ids
        assert tokenizer.unk_id not in ids and tokenizer.decode(ids) == text
    # A second run with other settings refuses the mixture drawn for the first.
    changed = load_config(ROOT / "configs/xlmr-tiny.yaml", [f"data.multilingual.languages={spec}",
                                                           "data.multilingual.alpha=0.5", f"run.output_dir={out}"])
    from bertology.recipes.pretrain import corpus_source

    with pytest.raises(DataError, match="drawn with other data.multilingual settings"):
        corpus_source(changed)
