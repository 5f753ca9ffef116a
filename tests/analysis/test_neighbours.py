"""Contextual neighbours and the sense map on a tiny random model."""

from __future__ import annotations

import json

import numpy as np
import pytest

from bertology.analysis.neighbours import NeighbourIndex, NeighboursError, neighbours
from bertology.analysis.sense_map import Occurrence, SenseMapError, project, read_labelled, sense_map
from finetune_helpers import save_tiny_model


@pytest.fixture(autouse=True)
def one_thread():
    """Small tensors: torch's thread pool only adds synchronisation (10x slower on a loaded machine)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)

pytest.importorskip("faiss")

WORDS = "the bank river money cat sat on a mat dog ran park".split()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    import bertology

    return bertology.load(save_tiny_model(tmp_path_factory.mktemp("tiny") / "m", WORDS))


def test_an_occurrence_in_the_corpus_is_its_own_nearest_neighbour(tiny):
    corpus = ["the bank of the river", "money in the bank", "the cat sat on a mat", "a dog ran in the park"]
    index = NeighbourIndex.build(tiny, corpus)
    assert len(index) == sum(len(t.split()) for t in corpus)
    result = index.query("money in the bank", "bank", k=3, exclude_same_sentence=False)
    top = result["contextual"][0]
    assert top["word"] == "bank" and top["sentence"] == "money in the bank"
    assert top["cosine"] == pytest.approx(1.0, abs=1e-5)
    scores = [n["cosine"] for n in result["contextual"]]
    assert scores == sorted(scores, reverse=True)
    # the static vector of "bank" is the mean of its two occurrences; "bank" itself is not listed
    assert result["type_occurrences"] == 2 and all(n["type"] != "bank" for n in result["static"])
    assert len(result["static"]) == 3
    excluded = index.query("money in the bank", "bank", k=3)
    assert all(n["sentence"] != "money in the bank" for n in excluded["contextual"])
    with pytest.raises(NeighboursError, match="occurs 0 time"):
        index.query("the cat sat", "bank")


def test_neighbours_writes_json(tiny, tmp_path):
    numbers, _ = neighbours(tiny, ["the bank of the river", "money in the bank"], [("a river bank", "bank")],
                            tmp_path, k=2)
    saved = json.loads((tmp_path / "neighbours.json").read_text())
    assert saved["indexed_occurrences"] == 9 and len(saved["queries"][0]["contextual"]) == 2


def test_pca_projection_recovers_the_main_direction():
    rng = np.random.default_rng(0)
    x = np.outer(rng.normal(size=50), [3.0, 0, 0, 0]) + 0.01 * rng.normal(size=(50, 4))
    points, method = project(x, "pca")
    assert method == "pca" and points.shape == (50, 2)
    assert abs(np.corrcoef(points[:, 0], x[:, 0])[0, 1]) > 0.999


def test_sense_map_and_labelled_file(tiny, tmp_path):
    path = tmp_path / "senses.tsv"
    path.write_text("# sentence, word, sense\nthe bank of the river\tbank\triver\nmoney in the bank\tbank\tmoney\n"
                    "a bank with money\tbank\tmoney\nthe river bank\tbank\triver\n", encoding="utf-8")
    occurrences = read_labelled(path)
    assert occurrences[0].span == (4, 8) and occurrences[1].sense == "money"
    numbers, figures = sense_map(tiny, occurrences, tmp_path / "out", word="bank", method="pca")
    assert numbers["occurrences"] == 4 and numbers["senses"] == {"money": 2, "river": 2}
    assert figures[0].stat().st_size > 1000
    bad = tmp_path / "bad.tsv"
    bad.write_text("the cat sat\tdog\tx\n", encoding="utf-8")
    with pytest.raises(SenseMapError, match="bad.tsv:1: 'dog' is not a whole word"):
        read_labelled(bad)
    bad.write_text("ok\n\nthe cat\tcat\n", encoding="utf-8")
    with pytest.raises(SenseMapError, match="bad.tsv:1: expected"):
        read_labelled(bad)
    with pytest.raises(SenseMapError, match="at least 3"):
        sense_map(tiny, [Occurrence("the cat", (4, 7), "a")], tmp_path / "x")
