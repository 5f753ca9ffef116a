"""Open-domain QA: the retrieval half (`bertology.retrieval.open_qa.retrieve`) over every index kind, with and without
a reranker, and its refusals."""

from __future__ import annotations

import json

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


# ------------------------------------------------------------------------------------------------- the reader
def brute_force(pretrained, question, passage, max_answer_length=30):
    """The best span of one short passage (one window) by trying every pair: start + end logit, end >= start, at
    most max_answer_length tokens, ties to the earlier start then the earlier end; and its log P_start + log
    P_end over the passage's tokens, in float64."""
    import torch

    tokenizer, model = pretrained.tokenizer, pretrained.model.eval()
    q = tokenizer.encode(question, add_special_tokens=False).ids
    c = tokenizer.encode(passage, add_special_tokens=False)
    ids = [tokenizer.token_to_id("[CLS]"), *q, tokenizer.token_to_id("[SEP]"), *c.ids, tokenizer.token_to_id("[SEP]")]
    types = [0] * (len(q) + 2) + [1] * (len(c.ids) + 1)
    with torch.no_grad():
        logits = model(torch.tensor([ids]), torch.ones(1, len(ids), dtype=torch.long),
                       torch.tensor([types])).head_logits["qa"][0].double().numpy()
    part = logits[len(q) + 2:len(q) + 2 + len(c.ids)]
    best = None
    for i in range(len(c.ids)):
        for j in range(i, min(len(c.ids), i + max_answer_length)):
            score = part[i, 0] + part[j, 1]
            if best is None or score > best[0]:
                best = (score, i, j)
    score, i, j = best
    log_start = part[:, 0] - np.log(np.exp(part[:, 0]).sum())
    log_end = part[:, 1] - np.log(np.exp(part[:, 1]).sum())
    return passage[c.offsets[i][0]:c.offsets[j][1]], score, log_start[i] + log_end[j]


def test_reader_reads_every_passage_as_the_squad_reader(reader_dir, mini_squad):
    from bertology.model import load
    from bertology.retrieval.open_qa import Reader

    reader = Reader.load(reader_dir)
    passages = [p.text for p in squad_passages(mini_squad)]
    read = reader.read(QUESTIONS[:2], [passages, passages[::-1][:2]], batch_size=3)
    assert [[c.rank for c in row] for row in read] == [[0, 1, 2, 3], [0, 1]]
    pretrained = load(reader_dir)
    for question, texts, row in zip(QUESTIONS, [passages, passages[::-1][:2]], read):
        for text, candidate in zip(texts, row):
            expected, score, log_prob = brute_force(pretrained, question, text)
            assert candidate.text == expected
            assert candidate.span == pytest.approx(score, abs=1e-4)  # float32 logits of O(1)
            assert candidate.span_log_prob == pytest.approx(log_prob, abs=1e-4)
            assert candidate.span_log_prob <= 0.0


def test_long_passages_are_read_in_windows(reader_dir):
    """A passage longer than the reader's window is read in several (the SQuAD task's doc stride), and its answer
    is the best over all of them: the same as reading the passage through the SQuAD task itself."""
    from bertology.model import load
    from bertology.retrieval.open_qa import Reader
    from bertology.tasks.examples import QAExample
    from bertology.tasks.qa import SquadTask

    long = ("the cat sat on the mat . paris is the capital of france . python is a programming language . dogs "
            "chase cats in the park . rain fell over london all day . bread is baked from flour and water . ") * 2
    reader = Reader.load(reader_dir, max_length=24, doc_stride=6)
    [[candidate]] = reader.read(["capital of france"], [[long]])
    task = SquadTask(doc_stride=6)
    pretrained = load(reader_dir)
    windows = task.encode(pretrained.tokenizer, [QAExample("x", "capital of france", long, [], "")], 24, train=False)
    assert windows.num_windows[0] > 3
    assert candidate.text == task.predict(pretrained.model, windows, [QAExample("x", "capital of france", long, [],
                                                                                 "")], 4)[0] != ""


def test_choose_adds_the_passage_selection_score_to_the_span_score():
    from bertology.retrieval.open_qa import Candidate, choose, log_sigmoid

    a, b = Candidate("a", 5.0, -3.0, 0), Candidate("b", 6.0, -1.0, 1)
    none = Candidate("", -np.inf, -np.inf, 2)
    assert choose([a, b, none]).text == "b"  # the larger span score
    assert choose([a, Candidate("c", 5.0, -0.1, 1)]).text == "a"  # a tie: the better-ranked passage
    # reranker: log sigmoid(log-odds) + log P_start + log P_end: a's passage is far more likely relevant
    assert choose([a, b], "reranker", [4.0, -4.0]).text == "a"  # -0.018 - 3.0 > -4.018 - 1.0
    assert choose([a, b], "reranker", [0.0, 0.0]).text == "b"
    assert log_sigmoid(0.0) == pytest.approx(np.log(0.5)) and log_sigmoid(-800.0) == pytest.approx(-800.0)
    assert choose([none]) is None
    with pytest.raises(ConfigError, match="needs the reranker's score"):
        choose([a, b], "reranker")
    with pytest.raises(ConfigError, match="--selection: expected one of reader, reranker"):
        choose([a], "sum")


def test_evaluate_open_qa_answers_from_the_best_span_across_passages(reader_dir, mini_squad, indexes, tmp_path):
    from bertology.model import load
    from bertology.retrieval.open_qa import Reader, evaluate_open_qa
    from bertology.tasks.metrics import squad_v1

    index = indexes["bm25"]
    reader = Reader.load(reader_dir)
    out = tmp_path / "out"
    result = evaluate_open_qa(index, mini_squad, reader, k=2, out=out)
    questions = squad_questions(mini_squad)
    found = retrieve([q.question for q in questions], index, 2)
    pretrained = load(reader_dir)
    expected = {}
    for question, retrieved in zip(questions, found):
        spans = [brute_force(pretrained, question.question, p.text) for p in retrieved.passages]
        expected[question.id] = max(spans, key=lambda s: s[1])[0]
    predictions = json.loads((out / "predictions.json").read_text(encoding="utf-8"))
    assert predictions == expected
    official = squad_v1([(q.id, [a.text for a in q.answers]) for q in questions], expected)
    assert result == {"exact_match": round(official.exact_match, 2), "f1": round(official.f1, 2),
                      "recall@2": round(retrieval_recall(questions, index, found), 2), "questions": 4, "k": 2,
                      "kind": "bm25", "selection": "reader"}
    assert json.loads((out / "metrics.json").read_text()) == result
    assert sorted(p.name for p in out.iterdir()) == ["metrics.json", "predictions.json"]
    dev = evaluate_open_qa(index, mini_squad, reader, k=1, split="dev")
    assert dev["split"] == "dev" and dev["questions"] == len(squad_questions(mini_squad, "dev"))


def test_evaluate_open_qa_with_a_reranker_selection(reader_dir, mini_squad, indexes):
    from bertology.retrieval.open_qa import Reader, evaluate_open_qa

    class Scored(ByLength):
        where = "by-length"

    reader = Reader.load(reader_dir)
    result = evaluate_open_qa(indexes["bm25"], mini_squad, reader, k=2, reranker=Scored(), rerank_depth=3,
                              selection="reranker")
    assert (result["selection"], result["rerank"], result["rerank_depth"]) == ("reranker", "by-length", 3)
    with pytest.raises(ConfigError, match="--selection reranker: needs --rerank DIR"):
        evaluate_open_qa(indexes["bm25"], mini_squad, reader, k=2, selection="reranker")


# ---------------------------------------------------------------------------------------------- the command
def run(*argv) -> int:
    from bertology.cli.main import main

    return main([str(a) for a in argv])


@pytest.fixture
def bm25_index(mini_squad, tmp_path):
    out = tmp_path / "bm25"
    assert run("index", "build", "--kind", "bm25", "--squad", mini_squad, "--out", out, "--quiet") == 0
    return out


def test_the_command_prints_one_json_object_and_writes_only_into_out(reader_dir, mini_squad, bm25_index, tiny_dir,
                                                                     tmp_path, capsys):
    from bertology.retrieval.open_qa import Reader, evaluate_open_qa

    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    out = tmp_path / "preds" / "run"
    assert run("evaluate", "--task", "open-qa", "--index", bm25_index, "--reader", reader_dir, "--squad", mini_squad,
               "--k", "3", "--out", out) == 0
    printed = json.loads(capsys.readouterr().out)
    from bertology.retrieval import SparseIndex as Sparse

    assert printed == evaluate_open_qa(Sparse.load(bm25_index), mini_squad, Reader.load(reader_dir), k=3)
    after = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    assert sorted(set(after) - set(before)) == [out.parent.relative_to(tmp_path), out.relative_to(tmp_path),
                                                 (out / "metrics.json").relative_to(tmp_path),
                                                 (out / "predictions.json").relative_to(tmp_path)]
    # a dense index too, searched with the model it records
    dense = tmp_path / "dense"
    assert run("index", "build", "--model", tiny_dir, "--squad", mini_squad, "--out", dense, "--quiet") == 0
    capsys.readouterr()
    assert run("evaluate", "--task", "open-qa", "--index", dense, "--reader", reader_dir, "--squad", mini_squad,
               "--k", "2", "--split", "dev") == 0
    printed = json.loads(capsys.readouterr().out)
    assert (printed["kind"], printed["k"], printed["split"]) == ("dense", 2, "dev")
    # without --k: 10, or every passage of a smaller index
    assert run("evaluate", "--task", "open-qa", "--index", dense, "--reader", reader_dir, "--squad", mini_squad) == 0
    assert json.loads(capsys.readouterr().out)["k"] == 4


def test_the_command_refuses_bad_input(reader_dir, tiny_dir, mini_squad, bm25_index, tmp_path, capsys):
    def refused(*argv):
        before = sorted(tmp_path.rglob("*"))
        assert run("evaluate", "--task", "open-qa", *argv) == 2
        assert sorted(tmp_path.rglob("*")) == before  # nothing written
        return capsys.readouterr().err

    base = ("--index", bm25_index, "--squad", mini_squad)
    err = refused(*base, "--reader", tiny_dir, "--k", "2")
    assert f"--reader {tiny_dir}: not an extractive reader" in err and "heads: none" in err
    err = refused(*base, "--reader", reader_dir, "--k", "5")
    assert "--k 5: the index holds only 4 passages" in err
    err = refused(*base, "--reader", reader_dir, "--k", "0")
    assert "--k must be a positive integer" in err
    err = refused("--index", bm25_index, "--squad", mini_squad)
    assert "--reader DIR" in err and "required" in err
    bad = tmp_path / "bad.json"
    squad = json.loads(mini_squad.read_text())
    del squad["data"][1]["paragraphs"][0]["qas"][0]["question"]
    bad.write_text(json.dumps(squad))
    err = refused("--index", bm25_index, "--squad", bad, "--reader", reader_dir)
    assert str(bad) in err and "data[1].paragraphs[0].qas[0]: missing key 'question'" in err
    long = tmp_path / "long.json"
    squad = json.loads(mini_squad.read_text())
    squad["data"][0]["paragraphs"][0]["qas"][1]["question"] = " ".join(["cat"] * 70)
    long.write_text(json.dumps(squad))
    err = refused("--index", bm25_index, "--squad", long, "--reader", reader_dir)
    assert "query 2 ('cat cat" in err and "more than the 64 the model reads" in err
    afile = tmp_path / "a-file"
    afile.write_text("mine\n")
    err = refused(*base, "--reader", reader_dir, "--out", afile)
    assert f"--out {afile}: is a file" in err and afile.read_text() == "mine\n"
    err = refused(*base, "--reader", reader_dir, "--out", afile / "below")
    assert "is a file, not a directory" in err
    err = refused(*base, "--reader", reader_dir, "--selection", "reranker")
    assert "--selection reranker: needs --rerank DIR" in err
    err = refused(*base, "--reader", tmp_path / "missing")
    assert "no such model directory" in err
