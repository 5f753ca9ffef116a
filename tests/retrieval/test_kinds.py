"""Index kinds beside the dense one: BM25 through bm25s, hybrids fused by reciprocal rank or by interpolated
normalised scores; the kind recorded in index.json and refused when an index is searched as another kind."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from bertology.cli.main import main
from bertology.errors import ConfigError, DataError
from bertology.retrieval import (
    BM25Options,
    Fusion,
    HybridIndex,
    Index,
    IndexKindError,
    SparseIndex,
    evaluate_squad,
    fuse,
    load_index,
    recall_at_k,
    squad_passages,
    squad_questions,
)

pytest.importorskip("bm25s", reason="bm25s is not installed (pip install 'bertology[index]')")
pytestmark = pytest.mark.usefixtures("one_thread")

TEXTS = ["the cat sat on the mat and the cat slept", "paris is the capital of france",
         "bread is baked from flour and water", "dogs chase cats in the park near paris",
         "rain fell over london all day long in the capital"]


def run(*argv) -> int:
    return main([str(a) for a in argv])


@pytest.fixture
def passages():
    return [{"id": f"p{i}", "text": text} for i, text in enumerate(TEXTS)]


@pytest.fixture
def passages_file(tmp_path, passages):
    path = tmp_path / "passages.jsonl"
    path.write_text("".join(json.dumps(p) + "\n" for p in passages), encoding="utf-8")
    return path


def lucene_bm25(documents: list[list[str]], query: list[str], k1: float, b: float) -> np.ndarray:
    """Lucene's BM25 in float64, written out: idf = ln(1 + (N - df + 0.5) / (df + 0.5)), each query term once per
    occurrence in the query, times tf / (tf + k1 * (1 - b + b * dl / avgdl)) (Lucene 8 dropped the constant factor
    k1 + 1 of the classic formula: the ranking is the same)."""
    n = len(documents)
    average = sum(len(d) for d in documents) / n
    scores = np.zeros(n)
    for term in query:
        df = sum(term in d for d in documents)
        if df == 0:
            continue
        idf = math.log(1 + (n - df + 0.5) / (df + 0.5))
        for i, d in enumerate(documents):
            tf = d.count(term)
            scores[i] += idf * tf / (tf + k1 * (1 - b + b * len(d) / average))
    return scores


@pytest.mark.parametrize("k1, b", [(1.5, 0.75), (0.9, 0.4)])
def test_bm25_scores_are_lucenes_bm25(passages, k1, b):
    index = SparseIndex.build(passages, options=BM25Options(k1=k1, b=b))
    documents = index.tokens(TEXTS)
    assert documents[0] == ["cat", "sat", "mat", "cat", "slept"]  # lower-cased words, English stop words removed
    queries = ["the capital of france", "cat in paris", "capital capital", "unknown words only"]
    scores = index.scores(queries)
    for query, row in zip(index.tokens(queries), scores):
        # float32 sums of a few float32 terms of size ~1: relative error a few 1e-7
        np.testing.assert_allclose(row, lucene_bm25(documents, query, k1, b), rtol=1e-5, atol=1e-6)
    assert not scores[3].any()
    hits = index.search(["capital of france", "cat"], k=2)
    assert [h.id for h in hits[0]] == ["p1", "p4"] and hits[1][0].id == "p0"
    assert hits[0][0].score == pytest.approx(float(scores[0][1]), rel=1e-6)


def test_bm25_index_round_trip_and_kind(passages, tmp_path):
    index = SparseIndex.build(passages)
    index.save(tmp_path / "bm25")
    meta = json.loads((tmp_path / "bm25" / "index.json").read_text())
    assert meta["kind"] == "bm25" and meta["bm25"]["k1"] == 1.5 and meta["passages"] == 5
    loaded = load_index(tmp_path / "bm25")
    assert isinstance(loaded, SparseIndex)
    queries = ["paris capital", "flour water bread", "london rain"]
    np.testing.assert_array_equal(loaded.scores(queries), index.scores(queries))
    assert loaded.search(queries, k=3) == index.search(queries, k=3)
    assert SparseIndex.load(tmp_path / "bm25").search("paris", k=1)[0][0].id in ("p1", "p3")


def test_an_index_searched_as_another_kind_is_refused(passages, tiny, tmp_path):
    SparseIndex.build(passages).save(tmp_path / "bm25")
    Index.build(tiny, passages).save(tmp_path / "dense")
    with pytest.raises(IndexKindError, match=r"bm25/index.json: a bm25 index, searched as a dense one"):
        Index.load(tmp_path / "bm25")
    with pytest.raises(IndexKindError, match=r"dense/index.json: a dense index, searched as a bm25 one"):
        SparseIndex.load(tmp_path / "dense")
    with pytest.raises(IndexKindError, match="a dense index, searched as a hybrid one"):
        load_index(tmp_path / "dense", kind="hybrid")
    with pytest.raises(ConfigError, match="index kind 'sparse': expected one of dense, bm25, hybrid"):
        load_index(tmp_path / "dense", kind="sparse")
    # an index written before kinds were recorded is dense
    meta = json.loads((tmp_path / "dense" / "index.json").read_text())
    del meta["kind"]
    (tmp_path / "dense" / "index.json").write_text(json.dumps(meta))
    assert isinstance(load_index(tmp_path / "dense"), Index)
    meta["kind"] = "colbert"
    (tmp_path / "dense" / "index.json").write_text(json.dumps(meta))
    with pytest.raises(DataError, match="kind 'colbert' is none of dense, bm25, hybrid"):
        load_index(tmp_path / "dense")


def test_a_damaged_bm25_index_is_refused(passages, tmp_path):
    SparseIndex.build(passages).save(tmp_path / "bm25")
    vocabulary = tmp_path / "bm25" / "vocabulary.json"
    terms = json.loads(vocabulary.read_text())
    vocabulary.write_text(json.dumps(terms[:-1]))
    with pytest.raises(DataError, match="the files disagree"):
        SparseIndex.load(tmp_path / "bm25")
    vocabulary.write_text("[1, 2]")
    with pytest.raises(DataError, match="vocabulary.json: expected a list of strings"):
        SparseIndex.load(tmp_path / "bm25")
    (tmp_path / "bm25" / "bm25.npz").write_bytes(b"PK\x03\x04 truncated")
    with pytest.raises(DataError, match="bm25.npz"):
        SparseIndex.load(tmp_path / "bm25")


def test_reciprocal_rank_fusion_by_hand():
    dense = (np.array([[0.9, 0.8, 0.1]]), np.array([[2, 0, 1]]))
    sparse = (np.array([[7.0, 3.0, -1.0]]), np.array([[0, 3, -1]]))  # -1: past the end of the ranking
    scores, rows = fuse(dense, sparse, Fusion("rrf", rrf_k=60), k=4)
    expected = {0: 1 / 62 + 1 / 61, 2: 1 / 61, 3: 1 / 62, 1: 1 / 63}
    assert rows.tolist() == [[0, 2, 3, 1]]  # 2 and 3 have 1/61 and 1/62
    np.testing.assert_allclose(scores[0], [expected[r] for r in rows[0]], rtol=1e-12)
    # equal fused scores: the lower row first
    scores, rows = fuse((np.array([[1.0]]), np.array([[5]])), (np.array([[1.0]]), np.array([[4]])), Fusion(), k=2)
    assert rows.tolist() == [[4, 5]] and scores[0, 0] == scores[0, 1]


def test_interpolated_fusion_by_hand():
    dense = (np.array([[0.9, 0.5, 0.1]]), np.array([[2, 0, 1]]))
    sparse = (np.array([[8.0, 4.0, 0.0]]), np.array([[0, 3, 2]]))
    scores, rows = fuse(dense, sparse, Fusion("interpolate", weight=0.25), k=3)
    # dense normalised: 2 -> 1, 0 -> 0.5, 1 -> 0; bm25: 0 -> 1, 3 -> 0.5, 2 -> 0
    fused = {2: 0.25 * 1.0, 0: 0.25 * 0.5 + 0.75 * 1.0, 1: 0.0, 3: 0.75 * 0.5}
    assert rows.tolist() == [[0, 3, 2]]
    np.testing.assert_allclose(scores[0], [fused[0], fused[3], fused[2]], rtol=1e-12)
    # weight 1 is the dense ranking, weight 0 the bm25 one
    assert fuse(dense, sparse, Fusion("interpolate", weight=1.0), k=3)[1].tolist()[0] == [2, 0, 1]
    assert fuse(dense, sparse, Fusion("interpolate", weight=0.0), k=2)[1].tolist()[0] == [0, 3]
    with pytest.raises(ConfigError, match="fusion.weight must be between 0 and 1"):
        Fusion("interpolate", weight=1.5)


def test_hybrid_index_fuses_its_two_indexes(tiny, tiny_dir, passages, tmp_path):
    hybrid = HybridIndex.build(tiny, passages, fusion=Fusion("interpolate", weight=0.5, depth=3), model_dir=tiny_dir)
    queries = ["capital of france", "cats and dogs"]
    candidates = 3
    expected = fuse(hybrid.dense.rank(queries, candidates), hybrid.sparse.rank(queries, candidates),
                    hybrid.fusion, 2)
    scores, rows = hybrid.rank(queries, 2)
    np.testing.assert_array_equal(rows, expected[1])
    np.testing.assert_allclose(scores, expected[0])
    hybrid.save(tmp_path / "hybrid")
    meta = json.loads((tmp_path / "hybrid" / "index.json").read_text())
    assert meta["kind"] == "hybrid" and meta["fusion"]["method"] == "interpolate"
    loaded = load_index(tmp_path / "hybrid", model=tiny)
    assert [[h.id for h in hits] for hits in loaded.search(queries, k=2)] == \
        [[passages[r]["id"] for r in row] for row in rows.tolist()]
    rrf = loaded.with_fusion(method="rrf")
    both = loaded.rankings(queries, 4, [loaded.fusion, rrf.fusion])
    np.testing.assert_array_equal(both[0][1], loaded.rank(queries, 4)[1])
    np.testing.assert_array_equal(both[1][1], rrf.rank(queries, 4)[1])
    with pytest.raises(IndexKindError, match="a hybrid index, searched as a dense one"):
        Index.load(tmp_path / "hybrid")


def test_evaluate_squad_takes_every_kind(tiny, mini_squad):
    passages = squad_passages(mini_squad)
    questions = squad_questions(mini_squad)
    sparse = SparseIndex.build(passages)
    _, rows = sparse.rank([q.question for q in questions], 4)
    assert evaluate_squad(sparse, mini_squad, ks=(1, 2)) == recall_at_k(questions, passages, rows.tolist(), (1, 2))
    hybrid = HybridIndex(Index.build(tiny, passages), sparse, Fusion())
    _, rows = hybrid.rank([q.question for q in questions], 4)
    assert evaluate_squad(hybrid, mini_squad) == recall_at_k(questions, passages, rows.tolist())


# ---------------------------------------------------------------------------------------------------- the CLI
def test_cli_builds_and_searches_every_kind(tiny_dir, passages_file, tmp_path, capsys):
    assert run("index", "build", "--kind", "bm25", "--input", passages_file, "--out", tmp_path / "bm25",
               "--k1", "0.9", "--b", "0.4") == 0
    assert json.loads(capsys.readouterr().out)["kind"] == "bm25"
    assert json.loads((tmp_path / "bm25" / "index.json").read_text())["bm25"]["k1"] == 0.9
    assert run("index", "build", "--kind", "hybrid", "--model", tiny_dir, "--input", passages_file,
               "--out", tmp_path / "hybrid", "--fusion", "interpolate", "--weight", "0.3", "--quiet") == 0
    capsys.readouterr()
    for name in ("bm25", "hybrid"):
        assert run("search", "--index", tmp_path / name, "--k", "2", "capital of france", "flour") == 0
        printed = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
        expected = load_index(tmp_path / name, model=tiny_dir if name == "hybrid" else None).search(
            ["capital of france", "flour"], k=2)
        assert [[h["id"] for h in p["hits"]] for p in printed] == [[h.id for h in hits] for hits in expected]
    assert run("search", "--index", tmp_path / "bm25", "--kind", "bm25", "paris") == 0
    assert len(json.loads(capsys.readouterr().out)["hits"]) == 5  # default: 10, or all of the 5 passages


def test_cli_refuses_a_kind_mismatch_and_a_k_past_the_index(tiny_dir, passages_file, tmp_path, capsys):
    assert run("index", "build", "--kind", "bm25", "--input", passages_file, "--out", tmp_path / "bm25") == 0
    capsys.readouterr()
    assert run("search", "--index", tmp_path / "bm25", "--kind", "dense", "paris") == 2
    assert "bm25/index.json: a bm25 index, searched as a dense one" in capsys.readouterr().err
    assert run("search", "--index", tmp_path / "bm25", "--k", "6", "paris") == 2
    error = capsys.readouterr().err
    assert "--k 6: the index" in error and "holds only 5 passages" in error
    assert run("search", "--index", tmp_path / "bm25", "--model", tiny_dir, "paris") == 2
    assert "a bm25 index" in capsys.readouterr().err
    assert run("evaluate", "--task", "retrieval", "--index", tmp_path / "bm25", "--kind", "hybrid",
               "--squad", passages_file) == 2
    assert "a bm25 index, searched as a hybrid one" in capsys.readouterr().err


def test_cli_refuses_options_of_another_kind_before_writing(tiny_dir, passages_file, tmp_path, capsys):
    assert run("index", "build", "--kind", "bm25", "--model", tiny_dir, "--input", passages_file,
               "--out", tmp_path / "a") == 2
    assert "--model: a bm25 index embeds nothing" in capsys.readouterr().err
    assert run("index", "build", "--kind", "hybrid", "--input", passages_file, "--out", tmp_path / "b") == 2
    assert "--model: a hybrid index embeds the passages with a model" in capsys.readouterr().err
    assert run("index", "build", "--kind", "hybrid", "--model", tiny_dir, "--input", passages_file,
               "--out", tmp_path / "c", "--weight", "2") == 2
    assert "fusion.weight must be between 0 and 1" in capsys.readouterr().err
    duplicate = tmp_path / "duplicate.jsonl"
    duplicate.write_text('{"id": "a", "text": "x"}\n{"id": "a", "text": "y"}\n', encoding="utf-8")
    assert run("index", "build", "--kind", "bm25", "--input", duplicate, "--out", tmp_path / "d") == 2
    assert "duplicate.jsonl: line 2: id 'a' repeats the one on line 1" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["duplicate.jsonl", "passages.jsonl"]


def test_a_query_longer_than_the_models_positions_is_refused(tiny_dir, passages_file, tmp_path, capsys):
    assert run("index", "build", "--kind", "hybrid", "--model", tiny_dir, "--input", passages_file,
               "--out", tmp_path / "hybrid", "--quiet") == 0
    capsys.readouterr()
    long_query = " ".join(["the cat sat on the mat"] * 20)  # over the tiny model's 64 positions
    assert run("search", "--index", tmp_path / "hybrid", "paris", long_query) == 2
    error = capsys.readouterr().err
    assert "query 2 ('the cat sat on the mat the cat sat on th'...): 142 tokens, more than the 64" in error


def test_evaluate_retrieval_on_a_split_by_article(mini_squad, tmp_path, capsys):
    from bertology.tasks.lookup import get_task

    assert run("index", "build", "--kind", "bm25", "--squad", mini_squad, "--out", tmp_path / "bm25") == 0
    capsys.readouterr()
    assert run("evaluate", "--task", "retrieval", "--index", tmp_path / "bm25", "--squad", mini_squad,
               "--split", "dev") == 0
    printed = json.loads(capsys.readouterr().out)
    task = get_task("squad")
    dev = task.read(task.path(str(mini_squad), "dev"))
    assert printed["questions"] == len(dev) and printed["split"] == "dev" and printed["kind"] == "bm25"
    index = SparseIndex.load(tmp_path / "bm25")
    _, rows = index.rank([q.question for q in dev], 4)
    expected = recall_at_k(dev, index.passages, rows.tolist(), (1, 5, 20, 100)).summary()
    assert {k: printed[k] for k in expected} == expected
