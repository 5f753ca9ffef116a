"""The official metrics: conlleval's chunk rules, SQuAD v1.1 normalisation and scores, GLUE metrics, on hand-made
cases with known answers, against independent formulas on random data, and on the shared real data."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from bertology.errors import DataError
from bertology.tasks.metrics import (
    accuracy,
    average_ranks,
    chunk_spans,
    conlleval,
    conlleval_file,
    f1_binary,
    matthews_corrcoef,
    normalize_answer,
    pearson,
    read_conlleval,
    spearman,
    squad_exact_match,
    squad_f1,
    squad_v1,
)


def score(gold: list[str], predicted: list[str]):
    return conlleval([list(zip(gold, predicted))])


def iob1_to_bio(tags: list[str]) -> list[str]:
    """I-X opening a chunk (after O or another type) becomes B-X."""
    out, previous = [], "O"
    for tag in tags:
        if tag.startswith("I-") and (previous == "O" or previous[2:] != tag[2:]):
            tag = "B-" + tag[2:]
        out.append(tag)
        previous = tag
    return out


# ---- conlleval ------------------------------------------------------------------------------------------------


def test_iob1_and_bio_of_one_segmentation_score_alike():
    iob1 = ["I-PER", "I-PER", "O", "I-LOC", "B-LOC", "I-ORG", "I-ORG", "I-PER"]
    bio = ["B-PER", "I-PER", "O", "B-LOC", "B-LOC", "B-ORG", "I-ORG", "B-PER"]
    assert iob1_to_bio(iob1) == bio
    expected = [("PER", 0, 2), ("LOC", 3, 4), ("LOC", 4, 5), ("ORG", 5, 7), ("PER", 7, 8)]
    assert chunk_spans(iob1) == chunk_spans(bio) == expected
    result = score(iob1, bio)
    assert (result.overall.gold, result.overall.found, result.overall.correct) == (5, 5, 5)
    assert result.f1 == 100.0
    assert result.accuracy == 50.0  # the tags differ at the four chunk starts IOB1 spells I-


def test_chunk_boundaries_and_types():
    assert chunk_spans(["O", "I-X", "I-X", "O"]) == [("X", 1, 3)]  # IOB1: I-X after O opens a chunk
    assert chunk_spans(["I-X", "B-X"]) == [("X", 0, 1), ("X", 1, 2)]  # B-X after I-X of the same type: two
    assert chunk_spans(["I-X", "I-Y"]) == [("X", 0, 1), ("Y", 1, 2)]  # a change of type ends a chunk
    assert chunk_spans(["B-X", "I-Y"]) == [("X", 0, 1), ("Y", 1, 2)]
    assert chunk_spans(["B-X", "I-X", "I-X"]) == [("X", 0, 3)]
    assert chunk_spans(["I-X", "E-X", "I-X"]) == [("X", 0, 2), ("X", 2, 3)]  # IOE: I after E opens a chunk
    assert chunk_spans(["[-NP", "]-NP"]) == [("NP", 0, 1), ("NP", 1, 2)]  # bracket chunks have length 1
    assert chunk_spans(["B-MISC-X", "I-MISC-X"]) == [("MISC-X", 0, 2)]  # a type may hold hyphens
    assert chunk_spans(["O", "O"]) == []


def test_two_touching_chunks_against_one_merged_chunk():
    result = score(["I-X", "B-X"], ["I-X", "I-X"])
    assert (result.overall.gold, result.overall.found, result.overall.correct) == (2, 1, 0)
    assert (result.precision, result.recall, result.f1) == (0.0, 0.0, 0.0)
    assert result.accuracy == 50.0


def test_a_chunk_is_correct_only_with_both_boundaries_and_the_type():
    assert score(["B-X", "I-X", "O"], ["B-X", "O", "O"]).overall.correct == 0  # ends early
    assert score(["B-X", "I-X", "O"], ["B-X", "I-X", "I-X"]).overall.correct == 0  # ends late
    assert score(["O", "B-X", "I-X"], ["B-X", "I-X", "I-X"]).overall.correct == 0  # starts early
    assert score(["B-X", "I-X", "O"], ["B-X", "I-X", "O"]).overall.correct == 1
    wrong_type = score(["B-PER", "I-PER", "O"], ["B-ORG", "I-ORG", "O"])
    assert (wrong_type.overall.gold, wrong_type.overall.found, wrong_type.overall.correct) == (1, 1, 0)
    assert wrong_type.per_type["ORG"].to_dict() == {"precision": 0.0, "recall": 0.0, "f1": 0.0, "gold": 0,
                                                    "found": 1, "correct": 0}
    assert wrong_type.per_type["PER"].to_dict() == {"precision": 0.0, "recall": 0.0, "f1": 0.0, "gold": 1,
                                                    "found": 0, "correct": 0}
    assert wrong_type.accuracy == pytest.approx(100 / 3)


def test_per_type_numbers():
    gold = ["B-PER", "I-PER", "O", "B-LOC", "O", "B-ORG", "I-ORG", "O", "O"]
    pred = ["B-PER", "I-PER", "O", "B-LOC", "I-LOC", "B-ORG", "I-ORG", "O", "B-MISC"]
    result = score(gold, pred)
    assert (result.tokens, result.correct_tags) == (9, 7)
    assert result.accuracy == pytest.approx(700 / 9)
    assert (result.overall.gold, result.overall.found, result.overall.correct) == (3, 4, 2)
    assert result.precision == 50.0 and result.recall == pytest.approx(200 / 3)
    assert result.f1 == pytest.approx(2 * 50 * (200 / 3) / (50 + 200 / 3))  # 57.14
    assert list(result.per_type) == ["LOC", "MISC", "ORG", "PER"]  # sorted, gold and predicted types
    assert result.per_type["LOC"].to_dict() == {"precision": 0.0, "recall": 0.0, "f1": 0.0, "gold": 1, "found": 1,
                                                "correct": 0}
    assert (result.per_type["MISC"].gold, result.per_type["MISC"].found, result.per_type["MISC"].f1) == (0, 1, 0.0)
    for kind in ("ORG", "PER"):
        counts = result.per_type[kind]
        assert (counts.precision, counts.recall, counts.f1, counts.found) == (100.0, 100.0, 100.0, 1)
    as_json = result.to_dict()
    assert set(as_json) == {"precision", "recall", "f1", "accuracy", "tokens", "gold", "found", "correct", "per_type"}
    assert json.loads(json.dumps(as_json)) == as_json


def test_empty_predictions_and_empty_gold_score_zero():
    nothing_found = score(["B-X", "I-X", "O", "B-Y"], ["O", "O", "O", "O"])
    assert (nothing_found.overall.found, nothing_found.precision, nothing_found.recall, nothing_found.f1) == \
        (0, 0.0, 0.0, 0.0)
    assert nothing_found.accuracy == 25.0
    no_chunks = score(["O", "O"], ["O", "O"])  # conlleval prints 0 for all three, not 100
    assert (no_chunks.precision, no_chunks.recall, no_chunks.f1, no_chunks.accuracy) == (0.0, 0.0, 0.0, 100.0)
    assert no_chunks.per_type == {}
    empty = conlleval([])
    assert (empty.tokens, empty.accuracy, empty.f1) == (0, 0.0, 0.0)


def test_chunks_end_at_sentence_boundaries():
    two_sentences = conlleval([[("I-X", "I-X")], [("I-X", "I-X")]])
    one_sentence = conlleval([[("I-X", "I-X"), ("I-X", "I-X")]])
    assert (two_sentences.overall.gold, two_sentences.overall.correct) == (2, 2)
    assert (one_sentence.overall.gold, one_sentence.overall.correct) == (1, 1)
    # A chunk open at the end of the input is closed there.
    assert conlleval([[("O", "O"), ("B-X", "B-X")]]).overall.correct == 1


@pytest.mark.parametrize("seed", range(3))
def test_counts_equal_the_intersection_of_chunk_sets(seed):
    """On random B/I/O tags (IOB1 and BIO mixed, two types) conlleval's running match is set intersection."""
    rng = np.random.default_rng(seed)
    tags = ["O", "B-A", "I-A", "B-B", "I-B"]
    sentences = [[(str(rng.choice(tags)), str(rng.choice(tags))) for _ in range(rng.integers(0, 9))]
                 for _ in range(300)]
    result = conlleval(sentences)
    gold = found = correct = 0
    for sentence in sentences:
        gold_spans = set(chunk_spans([g for g, _ in sentence]))
        predicted_spans = set(chunk_spans([p for _, p in sentence]))
        gold, found, correct = gold + len(gold_spans), found + len(predicted_spans), \
            correct + len(gold_spans & predicted_spans)
    assert (result.overall.gold, result.overall.found, result.overall.correct) == (gold, found, correct)
    assert sum(c.correct for c in result.per_type.values()) == correct


def test_reader_boundaries_and_docstart(tmp_path):
    path = tmp_path / "out.txt"
    path.write_text("-DOCSTART- -X- O O O\n\n"
                    "EU NNP I-NP I-ORG I-ORG\nrejects VBZ I-VP O O\n\n\n"
                    "Peter NNP I-NP I-PER I-PER\n-X- x x I-PER I-PER\nBlackburn NNP I-NP I-PER I-PER\n",
                    encoding="utf-8")
    sentences = read_conlleval(path)
    assert sentences == [[("O", "O")], [("I-ORG", "I-ORG"), ("O", "O")], [("I-PER", "I-PER")],
                         [("I-PER", "I-PER")]]
    result = conlleval_file(path)
    # -DOCSTART- is a token (conlleval counts it); the -X- line is a boundary: two PER chunks, not one.
    assert (result.tokens, result.overall.gold, result.overall.correct) == (5, 3, 3)
    assert list(result.per_type) == ["ORG", "PER"] and result.per_type["PER"].gold == 2


@pytest.mark.parametrize("text, message", [
    ("a B-X B-X\nb\n", "out.txt:2: 1 column; conlleval input needs at least 2"),
    ("a B-X B-X\n\nb x B-X\nc B-X\n", "out.txt:4: 2 columns, but line 1 has 3"),
    ("a B-X B-X\n\nb x B-X O\n", "out.txt:3: 4 columns, but line 1 has 3"),
    ("", "out.txt: empty file"),
    ("\n \n\n", "out.txt: empty file"),
])
def test_reader_errors_name_file_and_line(tmp_path, text, message):
    path = tmp_path / "out.txt"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(DataError) as error:
        read_conlleval(path)
    assert str(error.value).startswith(str(tmp_path / message)) and "\n" not in str(error.value)


def test_reader_splits_at_spaces_and_tabs_only(tmp_path):
    path = tmp_path / "out.txt"
    path.write_text("New\u00a0York NNP\tB-LOC  B-LOC \r\n\t\nit PRP O O\n", encoding="utf-8")
    assert read_conlleval(path) == [[("B-LOC", "B-LOC")], [("O", "O")]]


def test_reader_rejects_non_utf8(tmp_path):
    path = tmp_path / "out.txt"
    path.write_bytes(b"a O O\nb\xff O O\n")
    with pytest.raises(DataError, match=r"out\.txt:2: not UTF-8"):
        read_conlleval(path)


def _testa_with_predictions(data_dir, tmp_path, predict) -> tuple:
    source = data_dir / "conll2003" / "eng.testa"
    if not source.is_file():
        pytest.skip(f"{source} not found (../shared is absent)")
    lines, sentence = [], []

    def flush():
        if sentence:
            for line, predicted in zip(sentence, predict([line.split()[-1] for line in sentence])):
                lines.append(f"{line} {predicted}")
            sentence.clear()

    for line in source.read_text(encoding="utf-8").split("\n"):
        if line.strip():
            sentence.append(line)
        else:
            flush()
            lines.append("")
    flush()
    path = tmp_path / "testa.out"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path, conlleval_file(path)


def test_real_conll2003_gold_against_itself(data_dir, tmp_path):
    _, result = _testa_with_predictions(data_dir, tmp_path, lambda tags: tags)
    # What conlleval reports for eng.testa: 51,362 words + 216 -DOCSTART- lines, 5,942 entities.
    assert (result.tokens, result.overall.gold, result.overall.found, result.overall.correct) == \
        (51578, 5942, 5942, 5942)
    assert {kind: counts.gold for kind, counts in result.per_type.items()} == \
        {"LOC": 1837, "MISC": 922, "ORG": 1341, "PER": 1842}
    assert (result.precision, result.recall, result.f1, result.accuracy) == (100.0, 100.0, 100.0, 100.0)


def test_real_conll2003_iob1_gold_against_bio(data_dir, tmp_path):
    _, result = _testa_with_predictions(data_dir, tmp_path, iob1_to_bio)
    assert (result.overall.gold, result.overall.correct, result.f1) == (5942, 5942, 100.0)
    assert result.accuracy < 100.0  # the tags differ (every chunk-initial I- became B-), the chunks do not


def test_real_conll2003_all_o(data_dir, tmp_path):
    path, result = _testa_with_predictions(data_dir, tmp_path, lambda tags: ["O"] * len(tags))
    gold_tags = [g for sentence in read_conlleval(path) for g, _ in sentence]
    assert (result.overall.found, result.precision, result.recall, result.f1) == (0, 0.0, 0.0, 0.0)
    assert result.accuracy == pytest.approx(100 * gold_tags.count("O") / 51578)


# ---- SQuAD v1.1 -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("text, normalised", [
    ("Denver BRONCOS", "denver broncos"),  # lower case
    ("U.S. (1990)!", "us 1990"),  # ASCII punctuation is removed, not replaced by a space
    ("rock-n-roll", "rocknroll"),
    ("the Eiffel Tower", "eiffel tower"),  # articles as whole words
    ("A cat and an owl", "cat and owl"),
    ("theatre of Athena", "theatre of athena"),  # not inside words
    ("the,cat", "thecat"),  # punctuation goes first, so "the" is no longer a word of its own
    ("  many \t spaces\n here ", "many spaces here"),  # whitespace collapsed
    ("Café’s «best»", "café’s «best»"),  # only string.punctuation: Unicode quotes stay
    ("The", ""),
])
def test_normalize_answer(text, normalised):
    assert normalize_answer(text) == normalised


def test_exact_match_and_f1():
    assert squad_exact_match("The Broncos!", "broncos") == 1.0
    assert squad_exact_match("Broncos team", "broncos") == 0.0
    assert squad_f1("the cat sat", "a cat sat on the mat") == pytest.approx(2 * 1 * 0.5 / 1.5)
    assert squad_f1("cat cat", "cat") == pytest.approx(2 * 0.5 * 1 / 1.5)  # a multiset intersection
    assert squad_f1("cat cat", "cat cat dog") == pytest.approx(2 * 1 * (2 / 3) / (1 + 2 / 3))
    assert squad_f1("dog", "cat") == 0.0
    # Both normalise to nothing: equal (EM 1), yet no shared token (F1 0), as v1.1 scores them.
    assert (squad_exact_match("the", "a"), squad_f1("the", "a")) == (1.0, 0.0)


def test_squad_v1_max_over_answers_and_average():
    gold = [("q1", ["Denver Broncos", "Broncos"]), ("q2", ["Santa Clara, California"]), ("q3", ["1990"])]
    predictions = {"q1": "the broncos", "q2": "Santa Clara", "q3": "in 1991", "extra": "ignored"}
    result = squad_v1(gold, predictions)
    assert result.exact_match == pytest.approx(100 / 3)
    assert result.f1 == pytest.approx(100 * (1 + 2 * 1 * (2 / 3) / (1 + 2 / 3) + 0) / 3)
    assert result.total == 3 and result.missing == ()
    assert result.to_dict() == {"exact_match": result.exact_match, "f1": result.f1}


def test_squad_v1_missing_predictions():
    gold = [("q1", ["a dog"]), ("q2", ["cat"]), ("q3", ["owl"])]
    with pytest.raises(DataError, match=r"^2 of 3 questions have no prediction: q2, q3$"):
        squad_v1(gold, {"q1": "dog"})
    result = squad_v1(gold, {"q1": "dog"}, allow_missing=True)  # the official script's 0 for each
    assert (result.exact_match, result.f1, result.missing) == (pytest.approx(100 / 3), pytest.approx(100 / 3),
                                                              ("q2", "q3"))


def test_real_squad_gold_answers_score_100(data_dir):
    path = data_dir / "squad" / "squad-v1.1-dev-part-a.json"
    if not path.is_file():
        pytest.skip(f"{path} not found")
    from bertology.tasks.readers import read_squad

    gold = [(example.id, [answer.text for answer in example.answers]) for example in read_squad(path)]
    assert len(gold) == 5397 and sum(len(answers) for _, answers in gold) == 18368
    result = squad_v1(gold, {qid: answers[0] for qid, answers in gold})
    assert (result.exact_match, result.f1, result.total) == (100.0, 100.0, 5397)
    # The last answers: one of them is ".", which normalises to nothing: EM 1 against itself, F1 0 against all.
    last = squad_v1(gold, {qid: answers[-1] for qid, answers in gold})
    assert dict(gold)["57340d124776f419006617bf"][-1] == "."
    assert (last.exact_match, last.f1) == (100.0, pytest.approx(100 * 5396 / 5397))


# ---- GLUE -----------------------------------------------------------------------------------------------------


def test_accuracy_and_positive_class_f1():
    assert accuracy([1, 0, 1, 1], [1, 1, 1, 0]) == 0.5
    assert accuracy(["entailment", "not_entailment"], ["entailment", "entailment"]) == 0.5
    # tp = 2, fp = 1, fn = 1: precision = recall = 2/3
    assert f1_binary([1, 1, 1, 0, 0], [1, 1, 0, 1, 0]) == pytest.approx(2 / 3)
    assert f1_binary([0, 0], [0, 0]) == 0.0  # no positive anywhere: 0, as scikit-learn
    assert f1_binary(["1", "0"], ["1", "1"], positive="1") == pytest.approx(2 / 3)
    with pytest.raises(ValueError, match="equal length"):
        accuracy([1, 0], [1])
    with pytest.raises(ValueError, match="no examples"):
        accuracy([], [])


def test_matthews_corrcoef():
    # tp = 1, tn = 2, fp = 0, fn = 1: (1*2 - 0*1) / sqrt(1 * 2 * 2 * 3)
    assert matthews_corrcoef([1, 1, 0, 0], [1, 0, 0, 0]) == pytest.approx(2 / math.sqrt(12))
    assert matthews_corrcoef([1, 0, 1], [1, 0, 1]) == pytest.approx(1.0)
    assert matthews_corrcoef([1, 0, 1], [0, 1, 0]) == pytest.approx(-1.0)
    assert matthews_corrcoef([1, 0, 1, 0], [1, 1, 1, 1]) == 0.0  # undefined: one predicted class
    assert matthews_corrcoef([1, 1], [1, 1]) == 0.0
    rng = np.random.default_rng(0)
    for classes in (2, 2, 3, 5):
        gold, predicted = rng.integers(0, classes, 200), rng.integers(0, classes, 200)
        predicted[:80] = gold[:80]
        # Independent: the covariance of one-hot matrices (Gorodkin's R_K); for two classes the phi coefficient.
        x, y = np.eye(classes)[gold], np.eye(classes)[predicted]
        cov = lambda a, b: np.sum((a - a.mean(0)) * (b - b.mean(0)))  # noqa: E731
        expected = cov(x, y) / math.sqrt(cov(x, x) * cov(y, y))
        assert matthews_corrcoef(gold, predicted) == pytest.approx(expected, abs=1e-12)
        if classes == 2:
            assert matthews_corrcoef(gold, predicted) == pytest.approx(np.corrcoef(gold, predicted)[0, 1])


def brute_force_ranks(values) -> np.ndarray:
    """1 + the number of smaller values + half the number of other equal values."""
    values = np.asarray(values, dtype=float)
    return np.array([1 + np.sum(values < v) + (np.sum(values == v) - 1) / 2 for v in values])


def test_average_ranks():
    assert average_ranks([10, 20, 20, 5]).tolist() == [2.0, 3.5, 3.5, 1.0]
    assert average_ranks([3, 3, 3]).tolist() == [2.0, 2.0, 2.0]
    assert average_ranks([0.5]).tolist() == [1.0]
    values = np.random.default_rng(1).integers(0, 6, 300)
    np.testing.assert_array_equal(average_ranks(values), brute_force_ranks(values))


def test_pearson_and_spearman():
    rng = np.random.default_rng(2)
    for ties in (False, True):
        x = rng.integers(0, 5, 400).astype(float) if ties else rng.normal(size=400)
        y = x + rng.normal(size=400)
        assert pearson(x, y) == pytest.approx(np.corrcoef(x, y)[0, 1], abs=1e-12)
        expected = np.corrcoef(brute_force_ranks(x), brute_force_ranks(y))[0, 1]
        assert spearman(x, y) == pytest.approx(expected, abs=1e-12)
    assert spearman([1, 2, 3, 4], [1, 4, 9, 16]) == pytest.approx(1.0)  # monotonic, not linear
    assert pearson([1, 2, 3, 4], [1, 4, 9, 16]) < 0.99
    assert spearman([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
    assert math.isnan(pearson([1, 1, 1], [1, 2, 3])) and math.isnan(spearman([1, 2, 3], [2, 2, 2]))

