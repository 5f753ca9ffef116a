"""The cross-encoder reranker: `finetune --task rerank`, `search --rerank`, `evaluate --task retrieval --rerank`,
and a model without the reranker's head refused."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from bertology.cli.main import main
from bertology.errors import ConfigError, DataError
from bertology.retrieval import SparseIndex, recall_at_k, squad_passages, squad_questions
from bertology.retrieval.rerank import Reranker, rerank_hits, reranked
from bertology.tasks.lookup import get_task

pytest.importorskip("faiss", reason="faiss-cpu is not installed (pip install 'bertology[index]')")
pytestmark = pytest.mark.usefixtures("one_thread")

ROWS = [("capital of france", "paris is the capital of france .", ["the cat sat on the mat ."]),
        ("flour and water", "bread is baked from flour and water .", ["rain fell over london all day ."]),
        ("programming language", "python is a programming language .", ["dogs chase cats in the park ."]),
        ("rain over london", "rain fell over london all day .", ["bread is baked from flour and water ."])]


def run(*argv) -> int:
    return main([str(a) for a in argv])


@pytest.fixture(scope="module", params=["rerank", "rerank-cls"])
def any_reranker_dir(request, tiny_dir, tmp_path_factory):
    """A reranker of each task: the default segment_cosine head (native format, no id2label) and monoBERT's
    [CLS] classifier (transformers' layout with its id2label)."""
    return train_reranker(request.param, tiny_dir, tmp_path_factory)


@pytest.fixture(scope="module")
def reranker_dir(tiny_dir, tmp_path_factory):
    return train_reranker("rerank", tiny_dir, tmp_path_factory)


def train_reranker(task, tiny_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp(task)
    data = root / "pairs"
    data.mkdir()
    for name, rows in (("train.jsonl", ROWS), ("dev.jsonl", ROWS[:2])):
        (data / name).write_text("".join(json.dumps({"query": q, "positive": p, "negatives": n}) + "\n"
                                         for q, p, n in rows), encoding="utf-8")
    torch.set_num_threads(1)
    assert run("finetune", "--task", task, "--model", tiny_dir, "--data", data, "--out", root / "run",
               "--set", "optim.batch_size=2", "--set", "run.seed=0", "--max-steps", "4") == 0
    return root / "run" / "model"


def test_rerank_task_pairs_and_scores(reranker_dir):
    task = get_task("rerank")
    pairs = task.read(reranker_dir.parent.parent / "pairs" / "dev.jsonl")
    assert [(p.text, p.label) for p in pairs] == [
        ("capital of france", "relevant"), ("capital of france", "irrelevant"),
        ("flour and water", "relevant"), ("flour and water", "irrelevant")]
    metrics = json.loads((reranker_dir.parent / "dev_metrics.json").read_text())
    assert set(metrics) == {"accuracy", "pairs"} and metrics["pairs"] == 4
    assert metrics["accuracy"] in (0.0, 25.0, 50.0, 75.0, 100.0)


def test_reranker_scores_are_the_log_odds_of_relevance(any_reranker_dir):
    reranker = Reranker.load(any_reranker_dir)
    model, tokenizer = reranker.pretrained.model.eval(), reranker.pretrained.tokenizer
    passages = ["paris is the capital of france .", "the cat sat on the mat .", "bread is baked ."]
    scores = reranker.score("capital of france", passages)
    for passage, score in zip(passages, scores):
        batch = tokenizer.encode_batch(["capital of france"], [passage])
        with torch.no_grad():
            logits = model(batch.input_ids, batch.attention_mask, batch.token_type_ids).head_logits["classifier"]
        labels = model.config.extra.get("id2label") or {"0": "irrelevant", "1": "relevant"}  # segment_cosine's
        relevant = [int(i) for i, name in labels.items() if name == "relevant"][0]
        expected = float(logits[0, relevant] - logits[0, 1 - relevant])
        assert score == pytest.approx(expected, abs=1e-5)  # batched and packed against one padded row


def test_search_and_evaluate_with_a_reranker(tiny_dir, reranker_dir, mini_squad, tmp_path, capsys):
    assert run("index", "build", "--kind", "bm25", "--squad", mini_squad, "--out", tmp_path / "bm25") == 0
    capsys.readouterr()
    assert run("search", "--index", tmp_path / "bm25", "--k", "2", "--rerank", reranker_dir, "--rerank-depth", "3",
               "capital of france") == 0
    printed = json.loads(capsys.readouterr().out)
    index = SparseIndex.load(tmp_path / "bm25")
    reranker = Reranker.load(reranker_dir)
    first = index.search(["capital of france"], k=3)
    expected = rerank_hits(reranker, ["capital of france"], first, 2)[0]
    assert [h["id"] for h in printed["hits"]] == [h.id for h in expected]
    scores = reranker.score("capital of france", [h.text for h in first[0]])
    assert [h["score"] for h in printed["hits"]] == [round(s, 6) for s in sorted(scores.tolist(), reverse=True)[:2]]
    # evaluate: the first 2 of each question re-sorted, the rest in the first stage's order
    assert run("evaluate", "--task", "retrieval", "--index", tmp_path / "bm25", "--squad", mini_squad,
               "--rerank", reranker_dir, "--rerank-depth", "2") == 0
    result = json.loads(capsys.readouterr().out)
    questions = squad_questions(mini_squad)
    texts = [q.question for q in questions]
    _, rows = reranked(reranker, index, texts, 4, 2)
    _, plain = index.rank(texts, 4)
    np.testing.assert_array_equal(rows[:, 2:], plain[:, 2:])
    assert all(set(a) == set(b) for a, b in zip(rows[:, :2].tolist(), plain[:, :2].tolist()))
    expected = recall_at_k(questions, squad_passages(mini_squad), rows.tolist(), (1, 5, 20, 100)).summary()
    assert {k: result[k] for k in expected} == expected and result["rerank_depth"] == 2


def test_a_model_without_the_rerankers_head_is_refused(tiny_dir, reranker_dir, tmp_path, capsys):
    with pytest.raises(ConfigError, match=r"--rerank .*model: not a reranker: it needs a two-label sequence "
                                          r"classifier 'classifier' labelled irrelevant/relevant \(heads: none"):
        Reranker.load(tiny_dir)
    passages = tmp_path / "passages.jsonl"
    passages.write_text('{"id": "a", "text": "paris"}\n{"id": "b", "text": "london"}\n', encoding="utf-8")
    assert run("index", "build", "--kind", "bm25", "--input", passages, "--out", tmp_path / "bm25") == 0
    capsys.readouterr()
    assert run("search", "--index", tmp_path / "bm25", "--rerank", tiny_dir, "paris") == 2
    assert "not a reranker" in capsys.readouterr().err
    assert run("search", "--index", tmp_path / "bm25", "--k", "2", "--rerank", reranker_dir, "--rerank-depth", "1",
               "paris") == 2
    assert "--rerank-depth 1: at least --k (2)" in capsys.readouterr().err
    assert run("search", "--index", tmp_path / "bm25", "--rerank", tmp_path / "nothing", "paris") == 2
    assert "--rerank " in capsys.readouterr().err


def test_rerank_needs_negatives(tmp_path):
    (tmp_path / "train.jsonl").write_text('{"query": "q", "positive": "p"}\n', encoding="utf-8")
    (tmp_path / "dev.jsonl").write_text('{"query": "q", "positive": "p"}\n', encoding="utf-8")
    task = get_task("rerank")
    with pytest.raises(DataError, match="train.jsonl: no negative passages"):
        task.read(task.path(str(tmp_path), "train"))


def test_rerank_batches_hold_both_labels_as_framed_pairs(tiny, tmp_path):
    """Each training batch of the task's own encoding mixes relevant and irrelevant pairs, each read as
    [CLS] query [SEP] passage [SEP] with the passage's token type 1, and the label is the pair's own."""
    (tmp_path / "train.jsonl").write_text("".join(json.dumps({"query": q, "positive": p, "negatives": n}) + "\n"
                                                  for q, p, n in ROWS), encoding="utf-8")
    task = get_task("rerank")
    pairs = task.read(tmp_path / "train.jsonl")
    encoded = task.encode(tiny.tokenizer, pairs, 64, train=True, seed=0)
    batches = list(encoded.batches(0, 4, drop_last=False))
    assert all(set(batch.labels.tolist()) == {0, 1} for batch in batches)
    cls, sep = tiny.tokenizer.token_to_id("[CLS]"), tiny.tokenizer.token_to_id("[SEP]")
    for batch in batches:
        for row in range(len(batch)):
            pair = pairs[int(batch.example_ids[row])]
            assert int(batch.labels[row]) == (pair.label == "relevant")
            real = batch.attention_mask[row].bool()
            ids, types = batch.input_ids[row][real].tolist(), batch.token_type_ids[row][real].tolist()
            assert ids[0] == cls and ids[-1] == sep and ids.count(sep) == 2
            first = ids.index(sep)
            assert types == [0] * (first + 1) + [1] * (len(ids) - first - 1)


def test_the_rerank_task_overfits_eight_pairs(tiny_dir, tmp_path):
    """On 8 pairs (4 relevant, 4 irrelevant; two passages are one query's positive and another's negative, so
    the passage alone does not tell the label) 60 steps of the task's own loop (the tiny random model, lr 5e-3)
    drive the loss from ln 2 to well below it and the pairs' accuracy to 100: the labels, the pair framing, the
    classifier's gradient into the encoder and the dev metric's reading of the logits together can learn."""
    data = tmp_path / "pairs"
    data.mkdir()
    for name in ("train.jsonl", "dev.jsonl"):
        (data / name).write_text("".join(json.dumps({"query": q, "positive": p, "negatives": n}) + "\n"
                                         for q, p, n in ROWS), encoding="utf-8")
    torch.set_num_threads(1)
    assert run("finetune", "--task", "rerank", "--model", tiny_dir, "--data", data, "--out", tmp_path / "run",
               "--set", "optim.batch_size=8", "--set", "optim.lr=5e-3", "--set", "task.epochs=60",
               "--set", "run.log_every=1", "--set", "run.seed=0", "--max-steps", "60") == 0
    train = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
             if json.loads(line)["kind"] == "train"]
    assert train[0]["loss"] > 0.6 and train[-1]["loss"] < 0.3
    assert json.loads((tmp_path / "run" / "dev_metrics.json").read_text())["accuracy"] == 100.0


def test_the_segment_cosine_head_is_the_scaled_cosine_of_the_segments_means(tiny):
    """The reranker's default head: the log-odds of `relevant` is scale x cos(mean of segment 0, mean of segment
    1) + bias over the last layer's real tokens, given as the logits (-s/2, s/2); rerank-cls keeps monoBERT's
    [CLS] classifier."""
    from bertology.model import EncoderModel
    from bertology.model.heads import HeadSpec

    assert get_task("rerank").heads(tiny.model.config) == [HeadSpec("classifier", "segment_cosine", 2)]
    assert get_task("rerank-cls").heads(tiny.model.config)[0].kind == "pooled"
    torch.manual_seed(0)
    model = EncoderModel(tiny.model.config, get_task("rerank").heads(tiny.model.config))
    model.load_state_dict(tiny.model.state_dict(), strict=False)
    with torch.no_grad():
        model.heads["classifier"].scale.fill_(7.0)
        model.heads["classifier"].bias.fill_(-2.5)
    model.eval()
    batch = tiny.tokenizer.encode_batch(["capital of france", "rain"], ["paris is the capital of france .",
                                                                      "the cat sat on the mat . dogs chase cats ."])
    with torch.no_grad():
        out = model(batch.input_ids, batch.attention_mask, batch.token_type_ids)
    logits = out.head_logits["classifier"]
    for row in range(2):
        real = batch.attention_mask[row].bool()
        types = batch.token_type_ids[row][real]
        h = out.last_hidden_state[row][real].double()
        query, passage = h[types == 0].mean(0), h[types == 1].mean(0)
        s = 7.0 * float(torch.nn.functional.cosine_similarity(query, passage, dim=0)) - 2.5
        assert logits[row].tolist() == pytest.approx([-s / 2, s / 2], abs=1e-5)
    with pytest.raises(Exception, match="segment_cosine reads a pair's two segments by their token types"):
        single = tiny.tokenizer.encode_batch(["capital of france"])
        model(single.input_ids, single.attention_mask, single.token_type_ids)
