"""Dense retriever training (`finetune --task retrieval`): the contrastive loss against sentence-transformers'
MultipleNegativesRankingLoss, hard negatives from BM25, the JSONL pairs and their errors, and a run end to end whose
model builds an index."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from bertology.cli.main import main
from bertology.errors import DataError
from bertology.objectives.base import Passes
from bertology.retrieval import has_answer, squad_questions
from bertology.tasks.lookup import get_task
from bertology.retrieval.retriever_task import (
    ContrastiveRetrieval,
    RetrievalBatches,
    RetrievalExample,
    mean_vectors,
    read_pairs,
    squad_pairs,
)

pytestmark = pytest.mark.usefixtures("one_thread")

QUERIES = ["who wrote hamlet?", "what is the capital of france?", "when does bread rise?"]
POSITIVES = ["Hamlet is a tragedy written by William Shakespeare.", "Paris is the capital and largest city of France.",
             "Bread rises when yeast ferments the sugars in the dough."]
NEGATIVES = ["Macbeth is another of his plays.", "Lyon is a city in France.", "Cakes are baked in an oven."]


def run(*argv) -> int:
    return main([str(a) for a in argv])


def test_loss_equals_multiple_negatives_ranking_loss(minilm, minilm_path):
    sentence_transformers = pytest.importorskip("sentence_transformers")
    from sentence_transformers.losses import MultipleNegativesRankingLoss

    torch.manual_seed(0)
    examples = [RetrievalExample(str(i), q, p, (n,)) for i, (q, p, n) in enumerate(zip(QUERIES, POSITIVES, NEGATIVES))]
    batches = RetrievalBatches(minilm.tokenizer, examples, 256, shuffle=False)
    batch = next(batches.batches(0, 3, drop_last=False))
    model = minilm.model.eval()
    objective = ContrastiveRetrieval("cosine", temperature=0.05)
    with torch.no_grad():
        ours = objective(Passes(model, batch, None), batch)
    reference = sentence_transformers.SentenceTransformer(str(minilm_path), device="cpu").eval()
    loss = MultipleNegativesRankingLoss(reference)  # scale 20 = 1 / 0.05, cosine similarity
    features = [reference.tokenize(texts) for texts in (QUERIES, POSITIVES, NEGATIVES)]
    with torch.no_grad():
        expected = loss(features, None)
    # a mean of 3 cross-entropies of logits ~20 cos: float32 rounding of the cosines (1e-7) times the scale
    assert float(ours.loss_sum) / 3 == pytest.approx(float(expected), abs=2e-5)
    assert int(ours.stats["retrieval_units"]) == 3


def test_a_repeated_positive_is_no_negative(tiny):
    # queries 0 and 1 share their paragraph: for each, the other's copy of it leaves the softmax
    examples = [RetrievalExample("a", "capital of france", "paris is the capital of france ."),
                RetrievalExample("b", "paris", "paris is the capital of france ."),
                RetrievalExample("c", "flour", "bread is baked from flour and water .", ("the cat sat on the mat .",))]
    batches = RetrievalBatches(tiny.tokenizer, examples, 64, shuffle=False)
    batch = next(batches.batches(0, 3, drop_last=False))
    assert batch.passage_keys.tolist() == [0, 0, 1, 2] and batch.query_keys.tolist() == [0, 0, 1]
    model = tiny.model.eval()
    with torch.no_grad():
        output = ContrastiveRetrieval("dot")(Passes(model, batch, None), batch)
        vectors = mean_vectors(model(batch.input_ids, batch.attention_mask).last_hidden_state,
                               batch.attention_mask).double()
    logits = vectors[:3] @ vectors[3:].T
    logits[0, 1] = logits[1, 0] = float("-inf")
    expected = F.cross_entropy(logits, torch.arange(3), reduction="sum")
    assert float(output.loss_sum) == pytest.approx(float(expected), rel=1e-5)


def test_hard_negatives_are_bm25_passages_without_the_answer(mini_squad):
    pytest.importorskip("bm25s")
    questions = squad_questions(mini_squad)
    pairs = squad_pairs(questions, 2, str(mini_squad))
    assert [p.id for p in pairs] == [q.id for q in questions]
    for pair, question in zip(pairs, questions):
        assert pair.positive == question.context and pair.query == question.question
        assert len(pair.negatives) == 2
        for negative in pair.negatives:
            assert negative != question.context and not has_answer([a.text for a in question.answers], negative)
    # "the capital of france": bm25 ranks the paragraphs; the best one holding no "paris" comes first
    assert pairs[0].negatives[0] in {q.context for q in questions}


def test_jsonl_pairs_and_their_errors(tmp_path):
    path = tmp_path / "train.jsonl"
    path.write_text(json.dumps({"query": "q", "positive": "the answer is paris", "negatives": ["x"],
                                "answers": ["Paris"]}) + "\n\n" + json.dumps({"id": 7, "query": "r",
                                                                             "positive": "p"}) + "\n")
    examples = read_pairs(path)
    assert examples == [RetrievalExample("line-1", "q", "the answer is paris", ("x",), ("Paris",)),
                        RetrievalExample("7", "r", "p")]
    cases = [
        ({"query": "q", "positive": "lyon", "answers": ["Paris"]},
         r"line 2: the positive passage holds none of the answers \['Paris'\]"),
        ({"query": "q", "negatives": []}, "line 2: field 'positive' must be a non-empty string"),
        ({"query": "q", "positive": "p", "negatives": "n"}, "line 2: field 'negatives' must be a list"),
        ({"id": "line-1", "query": "q", "positive": "p"}, "line 2: id 'line-1' repeats the one on line 1"),
    ]
    for record, message in cases:
        path.write_text(json.dumps({"query": "a", "positive": "b"}) + "\n" + json.dumps(record) + "\n")
        with pytest.raises(DataError, match=f"train.jsonl: {message}"):
            read_pairs(path)
    path.write_text("{not json\n")
    with pytest.raises(DataError, match="train.jsonl: line 1: invalid JSON"):
        read_pairs(path)


def test_a_query_longer_than_the_models_positions_is_refused(tiny):
    examples = [RetrievalExample("long-one", " ".join(["the cat sat"] * 40), "paris")]
    with pytest.raises(DataError, match="query 'long-one': 162 tokens, more than the 64"):
        RetrievalBatches(tiny.tokenizer, examples, 64, shuffle=False)


def test_batches_are_seeded_and_resumable(tiny):
    examples = [RetrievalExample(str(i), f"query {i}", f"passage {i}") for i in range(10)]
    source = RetrievalBatches(tiny.tokenizer, examples, 64, shuffle=True, seed=3)
    first = [b.example_ids.tolist() for b in source.batches(1, 4)]
    assert len(first) == source.num_batches(1, 4) == 2  # drop_last: 10 // 4
    assert [b.example_ids.tolist() for b in source.batches(1, 4, start_batch=1)] == first[1:]
    assert first != [b.example_ids.tolist() for b in source.batches(2, 4)]
    assert len(set(sum(first, []))) == 8


def test_finetune_retrieval_end_to_end(tiny_dir, mini_squad, tmp_path, capsys):
    pytest.importorskip("bm25s")
    pytest.importorskip("faiss")
    out = tmp_path / "run"
    assert run("finetune", "--task", "retrieval", "--model", tiny_dir, "--data", mini_squad, "--out", out,
               "--set", "optim.batch_size=2", "--set", "run.seed=1", "--max-steps", "3") == 0
    result = json.loads(capsys.readouterr().out)
    assert result["steps"] == 3 and set(result["dev_metrics"]) == {"mrr@10", "recall@1", "recall@5", "recall@20",
                                                                   "queries"}
    task = get_task("retrieval")
    dev = task.read(task.path(str(mini_squad), "dev"))
    rankings = [json.loads(line) for line in (out / "dev_rankings.jsonl").read_text().splitlines()]
    assert [r["id"] for r in rankings] == [e.id for e in dev]
    assert task.evaluate(out / "dev_rankings.jsonl", task.path(str(mini_squad), "dev")) == result["dev_metrics"]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert any("retrieval_loss" in row for row in rows)
    # the trained model serves an index
    assert run("index", "build", "--model", out / "model", "--squad", mini_squad, "--out", tmp_path / "index",
               "--quiet") == 0
    capsys.readouterr()
    assert run("search", "--index", tmp_path / "index", "--k", "2", "capital of france") == 0
    assert len(json.loads(capsys.readouterr().out)["hits"]) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["index", "mini-squad.json", "run"]
    # and the service: its sentence vectors, normalised, are the index's
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from bertology.retrieval import Index
    from bertology.serve import create_app

    with TestClient(create_app(out / "model", max_wait_ms=2)) as client:
        response = client.post("/v1/embed", json={"texts": ["capital of france"], "normalize": True})
    assert response.status_code == 200, response.text
    expected = Index.load(tmp_path / "index", model=out / "model").encode(["capital of france"])
    np.testing.assert_allclose(np.asarray(response.json()["vectors"]), expected, atol=1e-5, rtol=0)


def test_the_dot_product_variant_is_registered():
    task = get_task("retrieval-dot")
    objective = task.objectives([])[0]
    queries, passages = torch.randn(2, 4, dtype=torch.float64), torch.randn(3, 4, dtype=torch.float64)
    from bertology.retrieval.retriever_task import contrastive_logits

    np.testing.assert_allclose(contrastive_logits(queries, passages, objective.similarity, objective.temperature),
                               queries @ passages.T)
    cosine = contrastive_logits(queries, passages, "cosine", 0.05)
    np.testing.assert_allclose(cosine, F.normalize(queries, dim=-1) @ F.normalize(passages, dim=-1).T * 20)
