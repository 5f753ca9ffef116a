"""The official evaluation metrics, computed exactly as the reference scorers define them.

* **conlleval** (the CoNLL-2000/2003 chunk scorer): a chunk counts as correct only when both of its boundaries and
  its type match. Chunks begin and end by conlleval's rules over the tag prefixes ``B``, ``I``, ``E``, ``O``,
  ``[``, ``]`` and ``.``, and a change of type always ends one chunk and begins another. So IOB1 (``I-X`` opens a
  chunk after ``O`` or another type; ``B-X`` only where two chunks of one type touch) and BIO tags of the same
  segmentation score alike. IOBES ``S-``/``E-`` tags are not IOBES to conlleval (its ``E`` is IOE's): convert them
  to BIO first. Precision, recall, F1 and token accuracy are percentages; a precision or recall with nothing to
  divide by is 0, and so is an F1 whose precision and recall are both 0, as conlleval prints them.
* **SQuAD v1.1** exact match and F1: answers are normalised (lower case; the ASCII punctuation of
  ``string.punctuation`` removed; the articles *a*, *an*, *the* removed as whole words; whitespace collapsed).
  EM is equality of the normalised texts; F1 is the overlap F1 of their whitespace tokens (a multiset
  intersection), 0 when nothing overlaps, even when both are empty. Each is the maximum over a question's gold
  answers, averaged over all questions and given as a percentage.
* **GLUE**: accuracy, F1 of the positive class (MRPC), Matthews correlation (CoLA; 0 where undefined, as
  scikit-learn), Pearson and Spearman correlation (STS-B; Spearman ranks ties by their average rank). These
  functions return plain fractions and correlations (accuracy 0.84, correlation 0.87), as scikit-learn and SciPy
  do; `evaluate_files` (the ``bertology evaluate`` command) reports every metric multiplied by 100, the scale of
  the GLUE leaderboard, the SQuAD script and conlleval, so that all of its numbers share one scale.

`evaluate_files` reads a task's gold file and a predictions file and returns the task's metrics by name. Its
minimal gold readers (``_read_glue_gold``, ``_read_squad_gold``) are private stand-ins for
`bertology.tasks.readers`.
"""

from __future__ import annotations

import json
import math
import re
import string
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Hashable

import numpy as np

from bertology.errors import ConfigError, DataError
from bertology.inputs import check_unicode
from bertology.tasks.readers import GLUE_TASKS, GlueTask, read_glue, read_squad

# --------------------------------------------------------------------------------------------------------------
# conlleval
# --------------------------------------------------------------------------------------------------------------

BOUNDARY = "-X-"  # conlleval's sentence boundary: a line whose first column is this (or an empty line)


def _split_tag(tag: str) -> tuple[str, str]:
    """A tag's prefix and type, split at its first hyphen (types may contain hyphens): ``B-ORG`` -> ``(B, ORG)``,
    ``O`` -> ``(O, "")``. conlleval reads its type through Perl truthiness, so a type ``0`` is no type."""
    prefix, hyphen, kind = tag.partition("-")
    if not hyphen:
        return tag, ""
    return prefix, ("" if kind == "0" else kind)


def chunk_ends(previous: str, current: str, previous_type: str, current_type: str) -> bool:
    """conlleval's ``endOfChunk``: whether a chunk ended between the previous token and this one (prefixes and
    types as `_split_tag` gives them)."""
    if previous in ("[", "]"):  # bracket chunks have length 1
        return True
    if previous not in ("O", ".") and previous_type != current_type:
        return True
    return (previous, current) in _ENDS


def chunk_starts(previous: str, current: str, previous_type: str, current_type: str) -> bool:
    """conlleval's ``startOfChunk``: whether a chunk starts at this token."""
    if current in ("[", "]"):
        return True
    if current not in ("O", ".") and previous_type != current_type:
        return True
    return (previous, current) in _STARTS


_ENDS = frozenset({("B", "B"), ("B", "O"), ("I", "B"), ("I", "O"), ("E", "E"), ("E", "I"), ("E", "O")})
_STARTS = frozenset({("B", "B"), ("I", "B"), ("O", "B"), ("O", "I"), ("E", "E"), ("E", "I"), ("O", "E")})


def chunk_spans(tags: Sequence[str]) -> list[tuple[str, int, int]]:
    """The chunks of one sentence's tags as conlleval delimits them: ``(type, start, end)`` with ``end``
    exclusive, in order. ``chunk_spans(["I-PER", "I-PER", "O", "B-LOC"]) == [("PER", 0, 2), ("LOC", 3, 4)]``."""
    spans: list[tuple[str, int, int]] = []
    previous, previous_type, start = "O", "", None
    for position, tag in enumerate([*tags, "O"]):  # a final O closes the last chunk, as a sentence boundary does
        prefix, kind = _split_tag(tag)
        starts = position < len(tags) and chunk_starts(previous, prefix, previous_type, kind)
        if start is not None and (starts or chunk_ends(previous, prefix, previous_type, kind)):
            spans.append((previous_type, start, position))
            start = None
        if starts:
            start = position
        previous, previous_type = prefix, kind
    if start is not None:  # only after a "." tag, which no boundary closes
        spans.append((previous_type, start, len(tags)))
    return spans


@dataclass(frozen=True)
class ChunkCounts:
    """Chunk counts of one type (or all types) and conlleval's percentages over them."""

    gold: int = 0  # chunks in the gold tags (conlleval's "phrases")
    found: int = 0  # chunks in the predicted tags (conlleval's "found")
    correct: int = 0  # predicted chunks with the gold chunk's boundaries and type

    @property
    def precision(self) -> float:
        return 100 * self.correct / self.found if self.found > 0 else 0.0

    @property
    def recall(self) -> float:
        return 100 * self.correct / self.gold if self.gold > 0 else 0.0

    @property
    def f1(self) -> float:
        precision, recall = self.precision, self.recall
        return 2 * precision * recall / (precision + recall) if precision + recall > 0 else 0.0

    def to_dict(self) -> dict[str, float | int]:
        return {"precision": self.precision, "recall": self.recall, "f1": self.f1,
                "gold": self.gold, "found": self.found, "correct": self.correct}


@dataclass(frozen=True)
class ConllevalResult:
    """What conlleval reports: token counts and accuracy, chunk precision/recall/F1 overall and per type (the types
    of every gold or predicted chunk, sorted). Percentages."""

    tokens: int
    correct_tags: int
    overall: ChunkCounts
    per_type: dict[str, ChunkCounts] = field(default_factory=dict)

    @property
    def accuracy(self) -> float:
        return 100 * self.correct_tags / self.tokens if self.tokens > 0 else 0.0

    @property
    def precision(self) -> float:
        return self.overall.precision

    @property
    def recall(self) -> float:
        return self.overall.recall

    @property
    def f1(self) -> float:
        return self.overall.f1

    def to_dict(self) -> dict[str, Any]:
        """The JSON ``bertology evaluate`` prints: ``precision``, ``recall``, ``f1``, ``accuracy``, the counts
        (``tokens``, ``gold``, ``found``, ``correct`` chunks) and ``per_type``."""
        return {"precision": self.precision, "recall": self.recall, "f1": self.f1, "accuracy": self.accuracy,
                "tokens": self.tokens, "gold": self.overall.gold, "found": self.overall.found,
                "correct": self.overall.correct,
                "per_type": {kind: counts.to_dict() for kind, counts in self.per_type.items()}}


class _Conlleval:
    """conlleval's pass over a token stream: one `step` per token line, `boundary` per sentence break."""

    def __init__(self) -> None:
        self.tokens = self.correct_tags = 0
        self.gold: Counter[str] = Counter()
        self.found: Counter[str] = Counter()
        self.correct: Counter[str] = Counter()
        self.last_gold, self.last_gold_type = "O", ""
        self.last_guess, self.last_guess_type = "O", ""
        self.matching = False  # the chunk being read matches in both so far (conlleval's inCorrect)

    def step(self, gold_tag: str, guess_tag: str, boundary: bool = False) -> None:
        gold, gold_type = _split_tag(gold_tag)
        guess, guess_type = _split_tag(guess_tag)
        gold_ends = chunk_ends(self.last_gold, gold, self.last_gold_type, gold_type)
        guess_ends = chunk_ends(self.last_guess, guess, self.last_guess_type, guess_type)
        if self.matching:
            if gold_ends and guess_ends and self.last_guess_type == self.last_gold_type:
                self.matching = False
                self.correct[self.last_gold_type] += 1
            elif gold_ends != guess_ends or guess_type != gold_type:
                self.matching = False
        gold_starts = chunk_starts(self.last_gold, gold, self.last_gold_type, gold_type)
        guess_starts = chunk_starts(self.last_guess, guess, self.last_guess_type, guess_type)
        if gold_starts and guess_starts and guess_type == gold_type:
            self.matching = True
        if gold_starts:
            self.gold[gold_type] += 1
        if guess_starts:
            self.found[guess_type] += 1
        if not boundary:
            self.tokens += 1
            self.correct_tags += gold == guess and gold_type == guess_type
        self.last_gold, self.last_gold_type = gold, gold_type
        self.last_guess, self.last_guess_type = guess, guess_type

    def boundary(self) -> None:
        self.step("O", "O", boundary=True)

    def result(self) -> ConllevalResult:
        correct = self.correct.copy()
        if self.matching:  # a chunk still open at the end of the input
            correct[self.last_gold_type] += 1
        per_type = {kind: ChunkCounts(self.gold[kind], self.found[kind], correct[kind])
                    for kind in sorted(set(self.gold) | set(self.found))}
        overall = ChunkCounts(sum(self.gold.values()), sum(self.found.values()), sum(correct.values()))
        return ConllevalResult(self.tokens, self.correct_tags, overall, per_type)


def conlleval(sentences: Iterable[Sequence[tuple[str, str]]]) -> ConllevalResult:
    """Score sentences of ``(gold_tag, predicted_tag)`` pairs as conlleval scores a file holding them with a
    blank line between sentences: chunks never cross a sentence boundary."""
    scorer = _Conlleval()
    for number, sentence in enumerate(sentences):
        if number:
            scorer.boundary()
        for gold, guess in sentence:
            scorer.step(gold, guess)
    return scorer.result()


def read_conlleval(path: str | Path) -> list[list[tuple[str, str]]]:
    """Read conlleval's input format: whitespace-separated columns, the last two the gold and the predicted tag;
    sentences end at empty lines and at lines whose first column is ``-X-``. As in conlleval, every non-empty line
    must have as many columns as the first non-empty line of the file, and at least two. A ``-DOCSTART-`` line
    (``-DOCSTART- -X- O O O`` in CoNLL-2003 output) is a token like any other, as conlleval counts it: its tags
    are ``O``, so it ends chunks as a boundary does, and it adds one correct tag to the token accuracy (conlleval
    reports 51,578 tokens for eng.testa: 51,362 words and 216 such lines).

    conlleval's default column delimiter is a single space; this reads any run of spaces and tabs as one, which
    reads the same on files conlleval accepts."""
    sentences: list[list[tuple[str, str]]] = []
    current: list[tuple[str, str]] = []
    width = first_line = 0
    for number, line in _text_lines(path):
        stripped = line.strip(" \t")
        columns = _COLUMN_SEPARATOR.split(stripped) if stripped else []
        if not columns:
            if current:
                sentences.append(current)
                current = []
            continue
        boundary = columns[0] == BOUNDARY
        if not width:
            width, first_line = len(columns), number
        if len(columns) < 2 and not boundary:
            raise DataError(f"{path}:{number}: {len(columns)} column; conlleval input needs at least 2 "
                            f"(the gold and the predicted tag last)")
        if len(columns) != width:
            raise DataError(f"{path}:{number}: {len(columns)} columns, but line {first_line} has {width} "
                            f"(every line must have the same number of columns)")
        if boundary:
            if current:
                sentences.append(current)
                current = []
            continue
        current.append((columns[-2], columns[-1]))
    if current:
        sentences.append(current)
    if not width:
        raise DataError(f"{path}: no tagged lines (the file is empty or blank)")
    return sentences


_COLUMN_SEPARATOR = re.compile(r"[ \t]+")  # not str.split(): a no-break space inside a word is no separator


def conlleval_file(path: str | Path) -> ConllevalResult:
    """`conlleval` of the file `read_conlleval` reads."""
    return conlleval(read_conlleval(path))


# --------------------------------------------------------------------------------------------------------------
# SQuAD v1.1
# --------------------------------------------------------------------------------------------------------------

_PUNCTUATION = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")


def normalize_answer(text: str) -> str:
    """SQuAD v1.1's answer normalisation: lower case, drop ASCII punctuation, drop the articles a/an/the as whole
    words, collapse whitespace (in that order)."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def squad_exact_match(prediction: str, truth: str) -> float:
    """1.0 when the normalised texts are equal, else 0.0."""
    return float(normalize_answer(prediction) == normalize_answer(truth))


def squad_f1(prediction: str, truth: str) -> float:
    """Token-overlap F1 of the normalised texts (a fraction); 0 when no token is shared, even if both are empty."""
    predicted, gold = normalize_answer(prediction).split(), normalize_answer(truth).split()
    shared = sum((Counter(predicted) & Counter(gold)).values())
    if shared == 0:
        return 0.0
    precision, recall = shared / len(predicted), shared / len(gold)
    return 2 * precision * recall / (precision + recall)


@dataclass(frozen=True)
class SquadResult:
    """Percentages over all ``total`` questions; ``missing`` lists the ids without a prediction (scored 0)."""

    exact_match: float
    f1: float
    total: int
    missing: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, float]:
        return {"exact_match": self.exact_match, "f1": self.f1}


def squad_v1(gold: Iterable[tuple[str, Sequence[str]]], predictions: Mapping[str, str],
             allow_missing: bool = False) -> SquadResult:
    """SQuAD v1.1 EM and F1 of ``predictions`` (question id -> answer text) against ``gold`` (question id, its
    answer texts), in percent. A question without a prediction is an error naming the ids, unless
    ``allow_missing``: then, as the official script does, it scores 0 and counts in the average. Predictions for
    ids not in ``gold`` are ignored, as the official script ignores them."""
    em_sum = f1_sum = 0.0
    total = 0
    missing: list[str] = []
    for qid, answers in gold:
        total += 1
        if qid not in predictions:
            missing.append(qid)
            continue
        prediction = predictions[qid]
        if not answers:
            raise DataError(f"question {qid}: no gold answers (SQuAD v1.1 gives every question at least one)")
        em_sum += max(squad_exact_match(prediction, answer) for answer in answers)
        f1_sum += max(squad_f1(prediction, answer) for answer in answers)
    if missing and not allow_missing:
        raise DataError(f"{len(missing)} of {total} questions have no prediction: {_some(missing)}")
    if total == 0:
        raise DataError("no questions to score")
    return SquadResult(100 * em_sum / total, 100 * f1_sum / total, total, tuple(missing))


def _some(items: Sequence[Any], limit: int = 5) -> str:
    shown = ", ".join(str(item) for item in items[:limit])
    return shown + (f", ... ({len(items) - limit} more)" if len(items) > limit else "")


# --------------------------------------------------------------------------------------------------------------
# GLUE
# --------------------------------------------------------------------------------------------------------------


def _pair(gold: Sequence[Any], predicted: Sequence[Any]) -> tuple[np.ndarray, np.ndarray]:
    gold_array, predicted_array = np.asarray(gold), np.asarray(predicted)
    if gold_array.ndim != 1 or gold_array.shape != predicted_array.shape:
        raise ValueError(f"gold and predictions must be 1-d and of equal length, got shapes {gold_array.shape} "
                         f"and {predicted_array.shape}")
    if len(gold_array) == 0:
        raise ValueError("no examples to score")
    return gold_array, predicted_array


def accuracy(gold: Sequence[Hashable], predicted: Sequence[Hashable]) -> float:
    """The fraction of predictions equal to the gold label."""
    gold_array, predicted_array = _pair(gold, predicted)
    return float(np.mean(gold_array == predicted_array))


def f1_binary(gold: Sequence[Hashable], predicted: Sequence[Hashable], positive: Hashable = 1) -> float:
    """F1 of the ``positive`` class (MRPC: 1): 2TP / (2TP + FP + FN), 0 when there is no positive in either."""
    gold_array, predicted_array = _pair(gold, predicted)
    gold_positive, predicted_positive = gold_array == positive, predicted_array == positive
    true_positives = int(np.sum(gold_positive & predicted_positive))
    denominator = int(np.sum(gold_positive)) + int(np.sum(predicted_positive))
    return 2 * true_positives / denominator if denominator else 0.0


def matthews_corrcoef(gold: Sequence[Hashable], predicted: Sequence[Hashable]) -> float:
    """Matthews correlation (any number of classes, from the confusion matrix); 0 when undefined (all gold or all
    predicted labels one class), as scikit-learn returns it."""
    gold_array, predicted_array = _pair(gold, predicted)
    _, codes = np.unique(np.concatenate([gold_array, predicted_array]), return_inverse=True)
    codes = codes.reshape(-1)
    n = len(gold_array)
    classes = int(codes.max()) + 1
    confusion = np.zeros((classes, classes), dtype=np.float64)
    np.add.at(confusion, (codes[:n], codes[n:]), 1)
    true_counts, predicted_counts = confusion.sum(axis=1), confusion.sum(axis=0)
    correct, samples = np.trace(confusion), confusion.sum()
    covariance = correct * samples - true_counts @ predicted_counts
    spread = (samples ** 2 - predicted_counts @ predicted_counts) * (samples ** 2 - true_counts @ true_counts)
    return float(covariance / math.sqrt(spread)) if spread > 0 else 0.0


def pearson(x: Sequence[float], y: Sequence[float]) -> float:
    """Pearson correlation; NaN when either side is constant (undefined, as SciPy returns it)."""
    a, b = (np.asarray(v, dtype=np.float64) for v in _pair(x, y))
    a, b = a - a.mean(), b - b.mean()
    denominator = math.sqrt(float(a @ a) * float(b @ b))
    if denominator == 0:
        return math.nan
    return float(np.clip((a @ b) / denominator, -1.0, 1.0))


def average_ranks(values: Sequence[float]) -> np.ndarray:
    """Ranks from 1, tied values sharing the mean of the ranks they span (SciPy's ``rankdata(method="average")``)."""
    array = np.asarray(values, dtype=np.float64)
    order = np.argsort(array, kind="stable")
    ordered = array[order]
    new_value = np.concatenate([[True], ordered[1:] != ordered[:-1]])
    starts = np.flatnonzero(np.concatenate([new_value, [True]]))  # first position of each run of ties, then n
    mean_rank = (starts[:-1] + starts[1:] + 1) / 2  # mean of the 1-based ranks start+1 .. end
    ranks = np.empty(len(array), dtype=np.float64)
    ranks[order] = mean_rank[np.cumsum(new_value) - 1]
    return ranks


def spearman(x: Sequence[float], y: Sequence[float]) -> float:
    """Spearman rank correlation: Pearson of the average ranks; NaN when either side is constant."""
    a, b = _pair(x, y)
    return pearson(average_ranks(a), average_ranks(b))


# --------------------------------------------------------------------------------------------------------------
# Files: `bertology evaluate`
# --------------------------------------------------------------------------------------------------------------


CONLL_TASKS = ("conll", "conll2003")
TASKS = ("squad", *CONLL_TASKS, *GLUE_TASKS)


def evaluate_files(task: str, predictions: str | Path, gold: str | Path | None = None,
                   allow_missing: bool = False, open_labels: bool = False) -> dict[str, Any]:
    """The metrics of a predictions file against a gold file, by name, every one a percentage (x100):

    * ``squad``: ``exact_match``, ``f1``. ``gold`` is the SQuAD JSON, ``predictions`` a JSON object of question id
      to answer text; a question without a prediction is an error unless ``allow_missing`` (then it scores 0 and
      ``missing`` counts such questions).
    * ``conll`` / ``conll2003``: conlleval on ``predictions`` alone (its input format: gold and predicted tag the
      last two columns): ``precision``, ``recall``, ``f1``, ``accuracy``, chunk counts and ``per_type``.
    * ``sst2``, ``rte``: ``accuracy``; ``cola``: ``mcc``; ``mrpc``: ``accuracy``, ``f1``; ``stsb``: ``pearson``,
      ``spearman`` (``None`` where undefined). ``gold`` is the task's GLUE dev tsv, ``predictions`` a tsv with
      the header ``index<TAB>prediction`` and one row per gold row (its 0-based index among the gold file's data
      rows) holding a label of the task (``0``/``1``; ``entailment``/``not_entailment``; a number for STS-B).
      With ``open_labels`` a prediction that is not one of the task's labels counts as wrong (a text-to-text
      model's free text, a class of its own for the MCC) instead of being an error. A text-to-text model's file
      (header ``index<TAB>prediction<TAB>generated``) counts an empty prediction as wrong in the same way.
    """
    task = task.lower()
    if task in CONLL_TASKS:
        if gold is not None:
            raise ConfigError(f"--gold is not used by {task}: the gold tags are the second-to-last column of the "
                              f"predictions file")
        return conlleval_file(predictions).to_dict()
    if gold is None:
        raise ConfigError(f"{task} needs the gold file (--gold)")
    if allow_missing and task != "squad":
        raise ConfigError("--allow-missing applies to squad only: every GLUE row needs a prediction")
    if task == "squad":
        questions = [(example.id, [answer.text for answer in example.answers]) for example in read_squad(gold)]
        answers = _read_squad_predictions(predictions)
        try:
            result = squad_v1(questions, answers, allow_missing)
        except DataError as error:
            raise DataError(f"{predictions}: {error}") from None
        return {**result.to_dict(), "missing": len(result.missing)} if allow_missing else result.to_dict()
    if task not in GLUE_TASKS:
        raise ConfigError(f"unknown task {task!r}; known: {', '.join(TASKS)}")
    spec = GLUE_TASKS[task]
    gold_labels = [example.label for example in read_glue(task, gold)]
    predicted = _read_glue_predictions(predictions, spec, len(gold_labels), gold, open_labels)
    scores = {name: _GLUE_METRICS[name](gold_labels, predicted) for name in spec.metrics}
    return {name: (100 * value if math.isfinite(value) else None) for name, value in scores.items()}


_GLUE_METRICS = {
    "accuracy": accuracy,
    "f1": lambda gold, predicted: f1_binary(gold, predicted, positive="1"),
    "mcc": matthews_corrcoef,
    "pearson": pearson,
    "spearman": spearman,
}


def _text_lines(path: str | Path) -> list[tuple[int, str]]:
    """A text file's lines (split at ``\\n`` only, ``\\r`` dropped, a byte-order mark skipped), numbered from 1;
    an error naming the file when it is missing, empty or not UTF-8 (and the line)."""
    try:
        data = Path(path).read_bytes()
    except OSError as error:
        raise DataError(f"{path}: cannot read: {error.strerror or error}") from None
    if not data.strip():
        raise DataError(f"{path}: empty file")
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    lines = []
    for number, raw in enumerate(data.split(b"\n"), start=1):
        try:
            lines.append((number, raw.decode("utf-8").rstrip("\r")))
        except UnicodeDecodeError as error:
            raise DataError(f"{path}:{number}: not UTF-8 (byte {error.start + 1} of the line)") from None
    if lines and lines[-1][1] == "":
        lines.pop()  # the final newline
    return lines


def _read_json(path: str | Path) -> Any:
    text = "\n".join(line for _, line in _text_lines(path))
    try:
        document = json.loads(text)
    except json.JSONDecodeError as error:
        raise DataError(f"{path}:{error.lineno}:{error.colno}: invalid JSON: {error.msg}") from None
    except RecursionError:
        raise DataError(f"{path}: invalid JSON: arrays or objects nested too deeply") from None
    return check_unicode(document, str(path))


def _read_squad_predictions(path: str | Path) -> dict[str, str]:
    predictions = _read_json(path)
    if not isinstance(predictions, dict):
        raise DataError(f"{path}: predictions must be a JSON object of question id -> answer text")
    for qid, answer in predictions.items():
        if not isinstance(answer, str):
            raise DataError(f"{path}: question {qid}: the prediction is a {type(answer).__name__}, not a string")
    return predictions


def _tsv_rows(path: str | Path) -> list[tuple[int, list[str]]]:
    """Tab-separated rows with quoting off (GLUE's text holds ``"`` that is not quoting); no blank lines."""
    rows = []
    for number, line in _text_lines(path):
        if not line:
            raise DataError(f"{path}:{number}: empty line")
        rows.append((number, line.split("\t")))
    return rows


def _check_label(text: str, spec: GlueTask, path: str | Path, number: int, open_labels: bool = False) -> Any:
    if spec.labels is None:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not math.isfinite(value):
            raise DataError(f"{path}:{number}: {text!r} is not a number")
        return value
    if text not in spec.labels and not open_labels:
        raise DataError(f"{path}:{number}: label {text!r} is not one of {', '.join(spec.labels.names)}")
    return text


# The header of a text-to-text model's GLUE predictions (`bertology.tasks.text_to_text`): the label, empty where
# the generated text (the third column) is none of the task's words.
GENERATED = ("index", "prediction", "generated")


def _read_glue_predictions(path: str | Path, spec: GlueTask, count: int, gold: str | Path,
                           open_labels: bool = False) -> list[Any]:
    rows = _tsv_rows(path)
    (_, header), rows = rows[0], rows[1:]
    generated = tuple(header) == GENERATED
    if header != ["index", "prediction"] and not generated:
        raise DataError(f"{path}:1: the header must be 'index<TAB>prediction' (or 'index<TAB>prediction<TAB>"
                        "generated', a text-to-text model's)")
    columns = len(header)
    predicted: list[Any] = [None] * count
    for number, fields in rows:
        if len(fields) != columns:
            raise DataError(f"{path}:{number}: {len(fields)} columns, expected {columns} ({', '.join(header)})")
        index_text, label = fields[:2]
        if not index_text.isascii() or not index_text.isdigit():
            raise DataError(f"{path}:{number}: index {index_text!r} is not a non-negative integer")
        index = int(index_text)
        if index >= count:
            raise DataError(f"{path}:{number}: index {index} is out of range: {gold} has {count} rows")
        if predicted[index] is not None:
            raise DataError(f"{path}:{number}: index {index} is repeated")
        # A generated text that is none of the labels: an empty prediction, counted wrong (as a class of its own).
        predicted[index] = fields[2] if generated and not label else _check_label(label, spec, path, number,
                                                                                    open_labels)
    missing = [index for index, value in enumerate(predicted) if value is None]
    if missing:
        raise DataError(f"{path}: no prediction for {len(missing)} of {count} rows of {gold}: "
                        f"index {_some(missing)}")
    return predicted
