"""Unigram training gives the same tokenizer.json in every run and process, and a Unigram tokenizer has one
fingerprint in memory, saved and loaded again.

The tokenizers library's Unigram trainer sums its expected counts in hash-map order (scores differ in the last
digits between processes), gives the characters it adds their scores in hash-set order and lists equal scores in
hash order; its JSON reader rounds some 17-digit scores to a neighbouring double, so a trained model and its saved
copy had different fingerprints (every T5 and XLNet resume stopped at "shards were made with a different
tokenizer")."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import tokenizers

from bertology.data.shards import tokenizer_fingerprint
from bertology.tokenization import load_tokenizer, train_tokenizer
from bertology.tokenization._pipeline import TRAINING_SPECIALS, default_specials
from bertology.tokenization.tokenizer import Tokenizer, as_saved
from bertology.tokenization.training import _pipeline
from bertology.tokenization.unigram import _Lattices, digamma, exp, log, unigram_scores

from tok_data import CORPUS

ROOT = Path(__file__).resolve().parents[2]
STYLES = ("roberta", "t5", "xlnet", "bert")  # XLM-R's, T5's, XLNet's, ALBERT's
SIZES = {"roberta": 300, "t5": 200, "xlnet": 150, "bert": 250}
TRAIN_AND_SAVE = """
import sys
from pathlib import Path
from bertology.tokenization import train_tokenizer
corpus, out = sys.argv[1], Path(sys.argv[2])
for style, size in {sizes}.items():
    train_tokenizer([corpus], "unigram", size, style=style, show_progress=False).save(out / style)
"""


def saved_files(directory: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in sorted(directory.iterdir())}


def test_the_same_tokenizer_files_in_processes_of_different_hash_seeds(tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(CORPUS, encoding="utf-8")
    script = TRAIN_AND_SAVE.format(sizes=SIZES)
    for seed in ("1", "2"):
        env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), PYTHONHASHSEED=seed)
        subprocess.run([sys.executable, "-c", script, str(corpus), str(tmp_path / seed)], env=env, check=True,
                       capture_output=True, timeout=300)
    for style, size in SIZES.items():
        train_tokenizer([corpus], "unigram", size, style=style, show_progress=False).save(tmp_path / "here" / style)
        first = saved_files(tmp_path / "1" / style)
        assert "tokenizer.json" in first
        assert saved_files(tmp_path / "2" / style) == first, style
        assert saved_files(tmp_path / "here" / style) == first, style


def test_the_same_tokenizer_files_whatever_simd_code_numpy_picks(tmp_path):
    """Machines differ in the SIMD code numpy runs (an AVX-512 one takes other exp and log code than an AVX2 one);
    the same tokenizer with every optional code path of this CPU disabled (``NPY_DISABLE_CPU_FEATURES``)."""
    from numpy._core import _multiarray_umath as umath

    optional = [name for name in umath.__cpu_dispatch__ if umath.__cpu_features__.get(name)]
    if not optional:
        pytest.skip("numpy runs its baseline code only on this CPU: nothing to disable")
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(CORPUS, encoding="utf-8")
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), NPY_DISABLE_CPU_FEATURES=" ".join(optional))
    subprocess.run([sys.executable, "-c", TRAIN_AND_SAVE.format(sizes={"t5": 200}), str(corpus),
                    str(tmp_path / "baseline")], env=env, check=True, capture_output=True, timeout=300)
    train_tokenizer([corpus], "unigram", 200, style="t5", show_progress=False).save(tmp_path / "here")
    assert saved_files(tmp_path / "baseline" / "t5") == saved_files(tmp_path / "here")


def test_exp_and_log_are_the_functions_values():
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.uniform(-745, 709, 20000), rng.uniform(-1, 1, 20000), [0.0, 1.0, -0.5]])
    theirs = np.array([math.exp(v) for v in x])
    normal = theirs > np.finfo(np.float64).tiny
    # A 14-term Horner polynomial after an exact range reduction: a few units in the last place (eps 2.2e-16).
    np.testing.assert_allclose(exp(x)[normal], theirs[normal], rtol=6e-16, atol=0)
    assert exp(np.array([-np.inf, -800.0, 0.0])).tolist() == [0.0, 0.0, 1.0]
    y = np.concatenate([np.exp(rng.uniform(-700, 700, 20000)), rng.uniform(0.5, 2.0, 20000), [1.0, 2.0, 7.0]])
    np.testing.assert_allclose(log(y), [math.log(v) for v in y], rtol=1e-15, atol=1e-15)
    assert log(np.array([1.0]))[0] == 0.0


def test_the_same_tokenizer_from_every_call_and_input_form(tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(CORPUS, encoding="utf-8")
    runs = {train_tokenizer(iter(CORPUS.splitlines()), "unigram", 300, show_progress=False).backend.to_str()
            for _ in range(3)}
    runs.add(train_tokenizer([corpus], "unigram", 300, show_progress=False).backend.to_str())
    assert len(runs) == 1


@pytest.mark.parametrize("style", STYLES)
def test_a_trained_tokenizer_its_saved_copy_and_that_loaded_again_have_one_fingerprint(style, tmp_path):
    tokenizer = train_tokenizer(iter(CORPUS.splitlines()), "unigram", SIZES[style], style=style,
                                show_progress=False)
    tokenizer.save(tmp_path / "once")
    loaded = load_tokenizer(tmp_path / "once")
    assert loaded.backend.to_str() == tokenizer.backend.to_str()  # the trained one is already in its saved form
    loaded.save(tmp_path / "twice")
    assert (tmp_path / "twice" / "tokenizer.json").read_bytes() == (tmp_path / "once" / "tokenizer.json").read_bytes()
    assert tokenizer_fingerprint(loaded) == tokenizer_fingerprint(tokenizer)
    assert tokenizer_fingerprint(load_tokenizer(tmp_path / "twice")) == tokenizer_fingerprint(tokenizer)


def test_a_unigram_model_straight_from_the_library_fingerprints_as_its_saved_copy(tmp_path):
    specials = TRAINING_SPECIALS[("unigram", "t5")]
    backend, trainer = _pipeline("unigram", "t5", False, 300, 0, False, specials, None)
    backend.train_from_iterator(CORPUS.splitlines(), trainer)
    reloaded = tokenizers.Tokenizer.from_str(backend.to_str())
    # The case itself: some scores read back one double away from what was written.
    assert reloaded.to_str() != backend.to_str()
    assert as_saved(backend).to_str() == reloaded.to_str()
    assert as_saved(as_saved(backend)).to_str() == reloaded.to_str()
    ours = Tokenizer(backend, style="t5", specials=default_specials("t5", "unigram"))  # sets its post-processor
    ours.save(tmp_path / "saved")
    assert tokenizer_fingerprint(load_tokenizer(tmp_path / "saved")) == tokenizer_fingerprint(ours)


def test_wordpiece_and_bpe_definitions_are_their_own_saved_form():
    for kind in ("wordpiece", "bpe"):
        backend = train_tokenizer(iter(CORPUS.splitlines()), kind, 300, show_progress=False).backend
        assert as_saved(backend) is backend


def segmentations(word: str, pieces: set[str]):
    if not word:
        yield []
        return
    for end in range(1, len(word) + 1):
        if word[:end] in pieces:
            for rest in segmentations(word[end:], pieces):
                yield [word[:end], *rest]


def test_expected_counts_are_those_of_every_segmentation_enumerated():
    pieces = ["▁", "a", "b", "c", "ab", "bc", "▁a", "abc", "ca", "▁ab"]
    words = sorted(Counter({"▁abc": 3, "▁cab": 2, "▁abcab": 1, "▁b": 5, "ca": 4}).items())
    rng = np.random.default_rng(0)
    scores = np.log(rng.dirichlet(np.ones(len(pieces))))
    found = _Lattices(pieces, words).expected_counts(np.append(scores, -20.0))
    expected = np.zeros(len(pieces))
    index = {piece: i for i, piece in enumerate(pieces)}
    for word, count in words:
        splits = list(segmentations(word, set(pieces)))
        weights = np.array([math.exp(sum(scores[index[p]] for p in split)) for split in splits])
        for split, weight in zip(splits, weights / weights.sum()):
            for piece in split:
                expected[index[piece]] += count * weight
    # Every word splits into known pieces: the unknown piece is never used.
    assert found[-1] == 0.0
    # Sums of at most a few dozen positive terms, each a product of a few exps: float64 rounding only.
    np.testing.assert_allclose(found[:-1], expected, rtol=1e-12, atol=0)


def test_a_character_no_piece_covers_is_the_unknown_piece():
    found = _Lattices(["▁", "a"], [("▁aé", 2)]).expected_counts(np.log([0.5, 0.5, 1e-9]))
    assert found.tolist() == pytest.approx([2.0, 2.0, 2.0], rel=1e-12)


def test_digamma_is_the_functions_value():
    special = pytest.importorskip("scipy.special")
    x = np.concatenate([np.linspace(0.5, 20, 400), np.geomspace(20, 1e9, 200)])
    # The series after the recurrence to x >= 7 is truncated at x^-8: its error is below 1e-10 there.
    np.testing.assert_allclose(digamma(x), special.digamma(x), rtol=0, atol=1e-10)


def test_the_scores_depend_only_on_the_pieces_and_the_word_counts():
    words = Counter(w for line in CORPUS.splitlines() for w in ("▁" + x for x in line.split()))
    pieces = sorted({w[i:j] for w in words for i in range(len(w)) for j in range(i + 1, min(len(w), i + 4) + 1)})
    scores = dict(zip(pieces, unigram_scores(pieces, words)))
    shuffled = list(pieces)
    np.random.default_rng(1).shuffle(shuffled)
    backwards = Counter(dict(reversed(list(words.items()))))
    assert dict(zip(shuffled, unigram_scores(shuffled, backwards))) == scores  # bit for bit
    assert all(math.isfinite(score) and score < 0 for score in scores.values())


def test_the_pieces_are_the_trainers_listed_by_score_after_the_specials():
    for style in STYLES:
        state = json.loads(train_tokenizer(iter(CORPUS.splitlines()), "unigram", SIZES[style], style=style,
                                           show_progress=False).backend.to_str())
        specials = TRAINING_SPECIALS[("unigram", style)]
        vocab = state["model"]["vocab"]
        assert [piece for piece, _ in vocab[:len(specials)]] == specials
        rest = vocab[len(specials):]
        assert rest == sorted(rest, key=lambda item: (-item[1], item[0]))
        assert len({piece for piece, _ in rest}) == len(rest)
        assert all(score < 0 for _, score in rest)
