"""Open-retrieval evaluation: DPR's answer-string match, recall@k on a hand-made mini SQuAD, evaluate_squad end to
end against a brute-force ranking, and the paragraphs check."""

from __future__ import annotations

import numpy as np
import pytest

from bertology.errors import ConfigError, DataError
from bertology.retrieval import (
    Index,
    Passage,
    dpr_tokens,
    evaluate_squad,
    has_answer,
    recall_at_k,
    squad_passages,
    squad_questions,
)

MIXED = ["Denver's Broncos won 24–10!", "Café  naïve\u00a0résumé", "e-mail: a.b@c.org (2016)", "ＡＢＣ１２３",
         "tab\tnew\nline\u200bzero-width", "emoji 🙂 ok", "1,000.5 km²", "Ǆ ǅ", ""]


def test_dpr_tokens_match_dpr_simple_tokenizer():
    regex = pytest.importorskip("regex")
    import unicodedata

    # DPR's SimpleTokenizer (dpr/utils/tokenizers.py) and has_answer's normalisation, as written there.
    pattern = regex.compile(r"([\p{L}\p{N}\p{M}]+)|([^\p{Z}\p{C}])",
                            flags=regex.IGNORECASE + regex.UNICODE + regex.MULTILINE)
    for text in MIXED:
        expected = [m.group().lower() for m in pattern.finditer(unicodedata.normalize("NFD", text))]
        assert dpr_tokens(text) == expected, text


def test_has_answer_is_a_token_run_match():
    assert has_answer(["Denver"], "The Denver Broncos won.")
    assert has_answer(["denver broncos"], "The DENVER  Broncos won.")  # uncased, any whitespace between tokens
    assert has_answer(["Denver"], "Denver's defence")  # the apostrophe is a token of its own
    assert not has_answer(["Denver"], "A Denverite spoke.")
    assert not has_answer(["nver"], "The Denver Broncos")
    assert has_answer(["résumé"], "her re\u0301sume\u0301 was long")  # NFD: composed and decomposed accents agree
    assert has_answer(["24–10"], "won 24–10 over")
    assert not has_answer(["24-10"], "won 24–10 over")  # a hyphen is not an en dash
    assert has_answer(["nothing", "Broncos"], "The Denver Broncos")  # any answer


def _example(qid, question, context, answers):
    from bertology.tasks.examples import Answer, QAExample

    return QAExample(qid, question, context, [Answer(a, context.index(a)) for a in answers], "t")


def test_recall_at_k_on_hand_made_rankings():
    passages = [Passage("0", "Paris is the capital of France."),
                Passage("1", "The Eiffel Tower stands in Paris."),
                Passage("2", "Berlin is the capital of Germany."),
                Passage("3", "The Denverite team plays at home.")]
    questions = [
        _example("a", "capital of France?", passages[0].text, ["Paris"]),  # passages 0 and 1 hold "Paris"
        _example("b", "capital of Germany?", passages[2].text, ["Berlin"]),  # only passage 2
        _example("c", "which team?", passages[3].text, ["Denver"]),  # no token match: only its own paragraph
    ]
    rankings = [[1, 2, 0], [0, 3, 2], [0, 1, 2]]
    scores = recall_at_k(questions, passages, rankings, ks=(1, 2, 3))
    # a: hit at 1 (passage 1 holds "Paris"); b: hit at 3; c: its paragraph (3) is never retrieved
    assert scores.recall == {1: 100 / 3, 2: 100 / 3, 3: 200 / 3}
    # own paragraph only: a at 3, b at 3, c never
    assert scores.paragraph_recall == {1: 0.0, 2: 0.0, 3: 200 / 3}
    assert scores.questions == 3
    assert recall_at_k(questions, passages, [[0], [2], [3]], ks=(1,)).recall == {1: 100.0}
    assert recall_at_k(questions, passages, rankings, ks=(1, 2, 3)).summary() == \
        {"recall@1": 33.33, "recall@2": 33.33, "recall@3": 66.67, "mrr@10": 44.44, "questions": 3}
    # MRR@10: a's first hit at rank 1, b's at rank 3, c none: (1 + 1/3 + 0) / 3
    assert scores.mrr == pytest.approx(100 * (1 + 1 / 3) / 3)
    with pytest.raises(ConfigError, match="ranked row 9 is outside the 4 passages"):
        recall_at_k(questions, passages, [[9], [0], [0]], ks=(1,))
    with pytest.raises(ConfigError, match="2 rankings for 3 questions"):
        recall_at_k(questions, passages, rankings[:2])
    with pytest.raises(ConfigError, match="ks must be positive"):
        recall_at_k(questions, passages, rankings, ks=(0,))


def test_squad_passages_are_every_paragraph(mini_squad):
    passages = squad_passages(mini_squad)
    assert [p.id for p in passages] == ["0-0", "0-1", "1-0", "1-1"]  # the paragraph without questions too
    assert passages[3].text.startswith("dogs chase")


def test_evaluate_squad_equals_brute_force_recall(tiny, mini_squad):
    pytest.importorskip("faiss", reason="faiss-cpu is not installed (pip install 'bertology[index]')")
    index = Index.build(tiny, squad_passages(mini_squad))
    scores = evaluate_squad(index, mini_squad, ks=(1, 2, 4))
    questions = squad_questions(mini_squad)
    query = index.encode([q.question for q in questions])
    passage = index.encode([p.text for p in index.passages])
    rankings = np.argsort(-(query @ passage.T), axis=1, kind="stable")
    assert scores == recall_at_k(questions, index.passages, rankings.tolist(), ks=(1, 2, 4))
    assert scores.recall[4] == 100.0 and scores.questions == 4  # all four passages retrieved


def test_evaluate_squad_with_minilm(minilm, minilm_path, mini_squad):
    pytest.importorskip("faiss", reason="faiss-cpu is not installed (pip install 'bertology[index]')")
    index = Index.build(minilm, squad_passages(mini_squad), model_dir=minilm_path)
    assert index.options.long_texts == "truncate"
    scores = evaluate_squad(index, mini_squad)
    assert scores.summary() == {"recall@1": 100.0, "recall@5": 100.0, "recall@20": 100.0, "recall@100": 100.0,
                                "mrr@10": 100.0, "questions": 4}


def test_an_index_of_other_paragraphs_is_refused(tiny, mini_squad):
    pytest.importorskip("faiss", reason="faiss-cpu is not installed (pip install 'bertology[index]')")
    index = Index.build(tiny, [Passage("x", "paris is the capital of france .")])
    with pytest.raises(DataError, match=r"mini-squad.json: the paragraph of question 'q1' \(and of 3 more"):
        evaluate_squad(index, mini_squad)
