"""Geometry: anisotropy, rogue dimensions, self/intra-sentence similarity and standardisation on hand-made vectors,
and the command end to end on a tiny random model."""

from __future__ import annotations

import json

import numpy as np
import pytest

from bertology.analysis.geometry import (GeometryError, Standardiser, anisotropy, cross_context_contributions,
                                         intra_sentence_similarity, layer_vectors, measure, rogue_dimensions,
                                         self_similarity, unit)
from finetune_helpers import save_tiny_model


@pytest.fixture(autouse=True)
def one_thread():
    """Small tensors: torch's thread pool only adds synchronisation (10x slower on a loaded machine)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)

WORDS = "the cat sat on a mat and the dog ran to the park with a ball".split()


def brute_force(vectors, groups):
    u = unit(vectors)
    cos = u @ u.T
    different = groups[:, None] != groups[None, :]
    return cos[different].mean()


def test_anisotropy_is_the_mean_cosine_over_cross_sentence_pairs():
    rng = np.random.default_rng(0)
    vectors = rng.normal(size=(40, 6)) + np.array([3.0, 0, 0, 0, 0, 0])  # a common direction
    groups = np.repeat(np.arange(10), 4)
    result = anisotropy(vectors, groups, bootstrap=300)
    assert result["mean"] == pytest.approx(brute_force(vectors, groups), abs=1e-12)
    assert result["low"] < result["mean"] < result["high"]
    assert result["mean"] > 0.5  # the shared direction dominates


def test_isotropic_vectors_have_anisotropy_near_zero_and_interval_covers_it():
    rng = np.random.default_rng(1)
    vectors = rng.normal(size=(2000, 16))
    groups = np.repeat(np.arange(400), 5)
    result = anisotropy(vectors, groups, bootstrap=500)
    assert abs(result["mean"]) < 0.01
    assert result["low"] < 0 < result["high"]


def test_same_sentence_pairs_are_left_out():
    # two sentences, each made of identical vectors, orthogonal to each other: cross pairs have cosine 0
    vectors = np.array([[1.0, 0], [1.0, 0], [0, 1.0], [0, 1.0]])
    groups = np.array([0, 0, 1, 1])
    assert anisotropy(vectors, groups, bootstrap=0)["mean"] == pytest.approx(0.0)


def test_rogue_dimension_share():
    rng = np.random.default_rng(2)
    vectors = rng.normal(size=(600, 10))
    vectors[:, 7] += 8.0  # one dimension with a large common value
    groups = np.repeat(np.arange(200), 3)
    rogue = rogue_dimensions(vectors, groups, top=3)
    contributions = cross_context_contributions(unit(vectors), groups)
    assert contributions.sum() == pytest.approx(brute_force(vectors, groups), abs=1e-12)
    assert rogue["top"][0]["dimension"] == 7
    assert rogue["top"][0]["share"] > 0.97
    assert rogue["uniform_share"] == pytest.approx(0.1)
    standardised = Standardiser.fit(vectors)(vectors)
    assert abs(anisotropy(standardised, groups, bootstrap=0)["mean"]) < 0.01
    after = rogue_dimensions(standardised, groups)
    assert abs(after["contributions"][7]) < 0.005  # the rogue dimension no longer dominates


def test_self_and_intra_sentence_similarity():
    # word "a" is the same vector in three sentences; "b" differs each time
    vectors = np.array([[1.0, 0, 0], [0, 1.0, 0], [1.0, 0, 0], [0, 0, 1.0], [1.0, 0, 0], [0, 1.0, 1.0]])
    groups = np.array([0, 0, 1, 1, 2, 2])
    types = ["a", "b", "a", "b", "a", "b"]
    result = self_similarity(vectors, groups, types, min_occurrences=3)
    assert result["types"] == 2
    b = np.mean([0.0, 1 / np.sqrt(2), 1 / np.sqrt(2)])
    assert result["mean"] == pytest.approx((1.0 + b) / 2)
    # orthogonal pairs: each word has cosine 1/sqrt(2) with the sentence mean
    assert intra_sentence_similarity(vectors[:4], groups[:4]) == pytest.approx(1 / np.sqrt(2))


def test_standardiser_round_trip(tmp_path):
    rng = np.random.default_rng(3)
    x = rng.normal(3.0, 2.0, size=(500, 4))
    x[:, 2] = 5.0  # no spread: maps to 0
    s = Standardiser.fit(x)
    z = s(x)
    assert np.allclose(z[:, [0, 1, 3]].mean(0), 0, atol=1e-5) and np.allclose(z[:, [0, 1, 3]].std(0), 1, atol=1e-4)
    assert np.all(z[:, 2] == 0)
    s.save(tmp_path / "s.json")
    assert np.allclose(Standardiser.load(tmp_path / "s.json")(x), z)
    with pytest.raises(GeometryError, match="4 dimensions"):
        s(np.zeros((2, 3)))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    import bertology

    directory = save_tiny_model(tmp_path_factory.mktemp("tiny") / "model", WORDS)
    return bertology.load(directory)


def test_layer_vectors_words_and_spans(tiny):
    texts = ["the cat sat", "a dog ran to the park"]
    words = layer_vectors(tiny, texts)
    assert words.layers == (0, 1, 2) and words.strings == "the cat sat a dog ran to the park".split()
    assert words.text_index.tolist() == [0, 0, 0, 1, 1, 1, 1, 1, 1]
    spans = layer_vectors(tiny, texts, spans=[[(4, 7)], [(0, 1), (2, 5)]], layers=[-1])
    assert spans.strings == ["cat", "a", "dog"] and spans.layers == (2,)
    assert np.allclose(spans.vectors[0][0], words.vectors[2][1], atol=1e-6)


def test_measure_small_corpus_warns_and_single_sentence_fails(tiny):
    data = layer_vectors(tiny, ["the cat sat on a mat", "the dog ran to the park", "the cat ran"])
    numbers = measure(data)
    assert any("only 3 sentences" in w for w in numbers["warnings"])
    assert len(numbers["layers"]) == 3
    with pytest.raises(GeometryError, match="at least 2"):
        measure(layer_vectors(tiny, ["the cat sat"]))


def test_command_writes_json_and_figures(tiny, tmp_path):
    from bertology.cli.main import main

    model = tmp_path / "model"
    tiny.save(model)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(["the cat sat on a mat", "the dog ran to the park", "a cat ran with a ball"] * 4),
                      encoding="utf-8")
    assert main(["anisotropy", "--model", str(model), "--corpus", str(corpus), "--out", str(tmp_path / "out"),
                 "--bootstrap", "50", "--quiet"]) == 0
    numbers = json.loads((tmp_path / "out" / "anisotropy.json").read_text())
    assert numbers["sentences"] == 12 and len(numbers["layers"]) == 3
    assert all((tmp_path / "out" / name).stat().st_size > 1000 for name in ("anisotropy.png", "rogue_dimensions.png"))
