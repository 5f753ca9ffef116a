"""Open-domain QA: the retrieval half (`bertology.retrieval.open_qa.retrieve`) over every index kind, with and without
a reranker, and its refusals."""

from __future__ import annotations

import numpy as np
import pytest

from bertology.errors import ConfigError
from bertology.retrieval import HybridIndex, Index, SparseIndex, squad_passages, squad_questions
from bertology.retrieval.open_qa import Retrieved, retrieval_recall, retrieve

pytest.importorskip("faiss", reason="faiss-cpu is not installed (pip install 'bertology[index]')")
pytest.importorskip("bm25s", reason="bm25s is not installed (pip install 'bertology[index]')")
pytestmark = pytest.mark.usefixtures("one_thread")

QUESTIONS = ["the capital of france", "rain over london", "flour and water", "programming language python"]


@pytest.fixture
def indexes(tiny, mini_squad):
    passages = squad_passages(mini_squad)
    return {"dense": Index.build(tiny, passages), "bm25": SparseIndex.build(passages),
            "hybrid": HybridIndex.build(tiny, passages)}


@pytest.mark.parametrize("kind", ["dense", "bm25", "hybrid"])
def test_retrieve_is_the_index_ranking(indexes, kind):
    index = indexes[kind]
    found = retrieve(QUESTIONS, index, 3)
    scores, rows = index.rank(QUESTIONS, 3)
    assert [r.rows for r in found] == rows.tolist()
    for retrieved, score_row, row_ids in zip(found, scores, rows):
        assert isinstance(retrieved, Retrieved)
        np.testing.assert_allclose(retrieved.scores, score_row, rtol=0, atol=0)
        assert [p.id for p in retrieved.passages] == [index.passages[r].id for r in row_ids]
        assert retrieved.scores == sorted(retrieved.scores, reverse=True)
    assert retrieve([], index, 2) == []


def test_retrieve_refuses_k_beyond_the_index_and_bad_questions(indexes):
    index = indexes["bm25"]
    assert len(retrieve(QUESTIONS, index, len(index))[0].rows) == len(index)
    with pytest.raises(ConfigError, match=r"--k 5: the index holds only 4 passages"):
        retrieve(QUESTIONS, index, 5)
    for k in (0, -1, True, 2.0):
        with pytest.raises(ConfigError, match="--k must be a positive integer"):
            retrieve(QUESTIONS, index, k)
    with pytest.raises(ConfigError, match="question 2: expected a string"):
        retrieve(["a", 3], index, 1)


def test_retrieve_refuses_a_query_longer_than_the_encoder(indexes):
    with pytest.raises(ConfigError, match=r"query 2 .*tokens, more than the 64"):
        retrieve(["paris", " ".join(["cat"] * 80)], indexes["dense"], 1)


class ByLength:
    """A stand-in reranker scoring a passage by its length: the re-sorted order is known."""

    def score(self, query, passages, batch_size=32):
        return np.asarray([float(len(p)) for p in passages])


def test_retrieve_with_a_reranker_resorts_the_first_stage(indexes):
    index = indexes["bm25"]
    first = retrieve(QUESTIONS, index, 4)
    found = retrieve(QUESTIONS, index, 2, reranker=ByLength(), rerank_depth=3)
    for before, after in zip(first, found):
        head = before.passages[:3]
        expected = sorted(head, key=lambda p: -len(p.text))[:2]
        assert after.passages == expected
        assert after.scores == [float(len(p.text)) for p in expected]
    # a depth below k still re-scores k passages
    low = retrieve(QUESTIONS, index, 3, reranker=ByLength(), rerank_depth=1)
    assert all(len(r.rows) == 3 for r in low)
    with pytest.raises(ConfigError, match="--rerank-depth must be a positive integer"):
        retrieve(QUESTIONS, index, 2, reranker=ByLength(), rerank_depth=0)


def test_retrieval_recall_is_recall_at_k(indexes, mini_squad):
    questions = squad_questions(mini_squad)
    index = indexes["bm25"]
    found = retrieve([q.question for q in questions], index, 1)
    own = [q.context for q in questions]
    hits = sum(r.passages[0].text == context or any(a.text in r.passages[0].text for a in q.answers)
               for r, context, q in zip(found, own, questions))
    assert retrieval_recall(questions, index, found) == pytest.approx(100.0 * hits / len(questions))
    assert retrieval_recall(questions, index, retrieve([q.question for q in questions], index, 4)) == 100.0
    with pytest.raises(ConfigError, match="3 retrieved sets for 4 questions"):
        retrieval_recall(questions, index, found[:3])
