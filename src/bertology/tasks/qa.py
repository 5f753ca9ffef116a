"""SQuAD v1.1 extractive question answering as a fine-tuning task (``squad``), and ``squad-article``
(:class:`SquadArticleTask`): every question with its whole article as the context, for long models.

Files and splits. ``path(data, split)`` gives the file to read: with a folder holding the official
``train-v1.1.json`` and ``dev-v1.1.json``, that split's file; with a folder holding one SQuAD JSON file (the shared
data has only ``squad-v1.1-dev-part-a.json``), or with the file itself, the file with the split appended after a
``#``: ``squad-v1.1-dev-part-a.json#dev``. ``read`` of such a path reads the file and keeps that split's questions:
the file is split by article with ``split_squad_by_article`` (:data:`DEV_FRACTION` = 0.25 of the articles to dev,
ranked by ``sha256(f"{seed}:{title}")`` with :data:`SPLIT_SEED` = 0; no context is in both splits). A path without
``#train``/``#dev`` (``predict_file`` on any SQuAD JSON) reads every question of the file. The suffix is a plain
string, so the split survives every hand-over (config values, the command line, ``Path(...)`` conversions in the
recipe) and shows in messages; a file whose real name ends in ``#dev`` is read whole, as it exists.

Windows. Each question is tokenised alone without specials and cut to ``max_query_length`` tokens (default 64);
the context is tokenised alone without specials (with character offsets) and covered by windows of
``capacity = max_length - specials - question tokens`` context tokens, planned by
``bertology.embeddings.windows.plan_windows`` (the rule ``embed`` uses for long texts). ``doc_stride`` is the
*step* between the starts of consecutive windows, in tokens, as in BERT's ``run_squad.py`` (``doc_stride=128``
with ``max_seq_length=384``; consecutive windows then overlap by ``capacity - step`` tokens). It is *not* the
overlap, which is what transformers' ``run_qa.py`` and the ``tokenizers`` truncation call ``stride``. The step is
capped at half the capacity, ``min(doc_stride, capacity // 2)`` (at least 1), so consecutive windows overlap by
at least half a window and any answer of up to ``capacity // 2`` tokens lies wholly inside some window; with
BERT's 384/128 the cap does not bind. The last window ends at the context's end and may be shorter. Each window is
framed as the tokenizer frames a pair: ``[CLS] question [SEP] chunk [SEP]`` with segment ids 0/1 for BERT,
``<s> question </s></s> chunk </s>`` for RoBERTa (:class:`PairFrame`, read off the tokenizer's own template).

Labels (training and the held-out loss). An answer's characters ``[start, end)`` map to the context tokens whose
offsets overlap them: the first token ending after ``start`` and the last token starting before ``end``. A window
is labelled with the answer's start and end positions when the answer lies wholly inside it, else both point at
the classification token (BERT's [CLS] at position 0, XLNet's ``<cls>`` last: ``question <sep> chunk <sep> <cls>``,
padded on the left), as BERT and XLNet do; the first answer of a question is the one trained on.

Prediction. The ``qa`` head (the family's ``*ForQuestionAnswering`` layer ``qa_outputs``: a ``token`` head with two
outputs, start and end) scores every position of every window. Per window the ``n_best`` (20) start and end
positions among the window's context tokens are candidates; a span is valid when ``end >= start``, it has at most
``max_answer_length`` (30) tokens, and its start token has the most context in this window (the max-context rule
of ``bertology.embeddings.windows.max_context_window``: ``min(left, right) + 0.01 * window length``, ties to the
earlier window). Its score is ``start logit + end logit``; the best valid span over all windows of a question is
the answer, its text ``context[offsets[start][0]:offsets[end][1]]`` (an empty string when no span is valid).

Scoring. ``scores`` is the official SQuAD v1.1 EM and F1 (percentages, ``bertology.tasks.metrics.squad_v1``);
``write`` gives the official ``{question id: answer text}`` JSON; ``evaluate(predictions, gold)`` scores a written
file with ``evaluate_files("squad", ...)``: against the gold file itself for a plain path, and for a split path
(``file#dev``) against that split's questions only: their gold JSON is written next to the predictions as
``dev_gold.json`` (SQuAD v1.1 layout, for ``bertology predict --input`` and ``bertology evaluate --gold``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from bertology.embeddings.windows import max_context_window, plan_windows
from bertology.errors import ConfigError, DataError
from bertology.io import atomic_write
from bertology.model.checkpoint import HEADS
from bertology.model.config import TransformerConfig
from bertology.model.heads import HeadSpec
from bertology.model.protocol import Model
from bertology.objectives.base import Objective, ObjectiveOutput, Passes, check_objective, classification_summary
from bertology.tasks import metrics
from bertology.tasks.examples import Answer, QAExample
from bertology.tasks.readers import read_squad, split_squad_by_article
from bertology.tasks.sequence import EncodedExamples, TaskBatch
from bertology.tokenization import Tokenizer

QA = "qa"
SPLITS = ("train", "dev")
DEV_FRACTION = 0.25  # the share of the articles of a single file that go to dev
SPLIT_SEED = 0  # the seed of split_squad_by_article's ranking of the articles
OFFICIAL_FILES = {"train": "train-v1.1.json", "dev": "dev-v1.1.json"}
GOLD_FILE = "{split}_gold.json"  # a split's gold, written next to its predictions by evaluate


# ---------------------------------------------------------------------------------------------- files and splits
def split_path(file: str | Path, split: str) -> Path:
    """``file#split``: the questions of ``split`` of a single SQuAD file (see the module docstring)."""
    if split not in SPLITS:
        raise ConfigError(f"split: expected one of {', '.join(SPLITS)}, got {split!r}")
    return Path(f"{file}#{split}")


def parse_split(path: str | Path) -> tuple[Path, str | None]:
    """The file and the split of a path made by :func:`split_path`; ``(path, None)`` for any other path (and for
    an existing file whose name happens to end in ``#dev``)."""
    text = str(path)
    file, mark, split = text.rpartition("#")
    if mark and split in SPLITS and file and not Path(text).exists():
        return Path(file), split
    return Path(text), None


def squad_json(examples: Sequence[QAExample]) -> dict[str, Any]:
    """Questions as a SQuAD v1.1 document (articles by title, paragraphs by context, in the examples' order)."""
    articles: list[dict[str, Any]] = []
    for example in examples:
        if not articles or articles[-1]["title"] != example.title:
            articles.append({"title": example.title, "paragraphs": []})
        paragraphs = articles[-1]["paragraphs"]
        if not paragraphs or paragraphs[-1]["context"] != example.context:
            paragraphs.append({"context": example.context, "qas": []})
        paragraphs[-1]["qas"].append({
            "id": example.id, "question": example.question,
            "answers": [{"text": a.text, "answer_start": a.start} for a in example.answers],
        })
    return {"version": "1.1", "data": articles}


def write_squad_json(path: str | Path, examples: Sequence[QAExample]) -> None:
    """:func:`squad_json` written atomically (UTF-8); ``read_squad`` reads it back to the same questions."""
    with atomic_write(path, "w", encoding="utf-8") as handle:
        json.dump(squad_json(examples), handle, ensure_ascii=False)
        handle.write("\n")


# ----------------------------------------------------------------------------------------------------- windows
@dataclass(frozen=True)
class PairFrame:
    """How the tokenizer frames a (question, context) pair: the special ids before the question, between the two
    and after the context, and the segment ids of every part; read off the tokenizer's own pair template.
    ``null``: where a window without the answer points: 0 (the first special token) or -1 (the last one)."""

    before: tuple[int, ...]
    middle: tuple[int, ...]
    after: tuple[int, ...]
    before_types: tuple[int, ...]
    middle_types: tuple[int, ...]
    after_types: tuple[int, ...]
    question_type: int
    context_type: int
    null: int = 0

    @classmethod
    def of(cls, tokenizer: Tokenizer) -> PairFrame:
        probe = tokenizer.encode("a", "b")
        seq, ids, types = probe.sequence_ids, probe.ids, probe.type_ids
        first = [i for i, s in enumerate(seq) if s == 0]
        second = [i for i, s in enumerate(seq) if s == 1]
        if not first or not second or first != list(range(first[0], first[-1] + 1)) \
                or second != list(range(second[0], second[-1] + 1)) or first[-1] > second[0]:
            raise ConfigError(f"{tokenizer!r}: its pair template is not 'specials question specials context "
                              f"specials' (sequence ids {seq})")
        a, b, c, d = first[0], first[-1] + 1, second[0], second[-1] + 1
        if a == 0 and d == len(seq) and b < c:
            raise ConfigError(f"{tokenizer!r}: its pair template puts no special token first or last (sequence ids "
                              f"{seq}); extractive QA labels a window without the answer at that token")
        # GPT-2 frames nothing: a window without the answer points at its first token, as transformers' run_qa.py
        # does for a tokenizer without a classification token.
        return cls(tuple(ids[:a]), tuple(ids[b:c]), tuple(ids[d:]), tuple(types[:a]), tuple(types[b:c]),
                   tuple(types[d:]), types[a], types[c], 0 if a or d == len(seq) else -1)

    @property
    def specials(self) -> int:
        return len(self.before) + len(self.middle) + len(self.after)

    def frame(self, question: Sequence[int], chunk: Sequence[int]) -> tuple[list[int], list[int], int]:
        """The framed ids, their segment ids, and the position of the chunk's first token."""
        ids = [*self.before, *question, *self.middle, *chunk, *self.after]
        types = [*self.before_types, *[self.question_type] * len(question), *self.middle_types,
                 *[self.context_type] * len(chunk), *self.after_types]
        return ids, types, len(self.before) + len(question) + len(self.middle)


def window_step(capacity: int, doc_stride: int) -> int:
    """The step between window starts: ``doc_stride`` capped at half the capacity (at least 1)."""
    return max(1, min(doc_stride, capacity // 2))


def answer_tokens(offsets: np.ndarray | Sequence[tuple[int, int]], start: int, end: int) -> tuple[int, int] | None:
    """The first and last token (inclusive) whose character offsets overlap ``[start, end)``: the first token
    ending after ``start`` and the last one starting before ``end``; None when no token overlaps."""
    offsets = np.asarray(offsets, dtype=np.int64).reshape(-1, 2)
    real = offsets[:, 1] > offsets[:, 0]  # a token covering no character covers no answer either
    first = np.flatnonzero(real & (offsets[:, 1] > start))
    last = np.flatnonzero(real & (offsets[:, 0] < end))
    if not len(first) or not len(last) or first[0] > last[-1]:
        return None
    return int(first[0]), int(last[-1])


class QAWindows(EncodedExamples):
    """The windows of questions as a ``BatchSource`` (an ``EncodedExamples`` whose examples are windows, with
    ``labels`` [windows, 2]: start and end positions) and where each window came from: ``question`` (index into the
    examples), ``start``/``stop`` (its context tokens), ``content`` (the position of its first context token);
    ``first_window``/``num_windows`` per question; ``context_offsets[question]`` (character offsets of the context's
    tokens, [n, 2]); ``answer_span[question]``: the first answer's context tokens ((-1, -1): none overlap it)."""

    question: np.ndarray
    start: np.ndarray
    stop: np.ndarray
    content: np.ndarray
    first_window: np.ndarray
    num_windows: np.ndarray
    context_offsets: list[np.ndarray]
    answer_span: np.ndarray

    @classmethod
    def encode(cls, tokenizer: Tokenizer, examples: Sequence[QAExample], max_length: int, *,
               max_query_length: int = 64, doc_stride: int = 128, shuffle: bool = False, seed: int = 0,
               **options: Any) -> QAWindows:
        """Windows of every question (see the module docstring); ConfigError naming the question when
        ``max_length`` leaves no room for a single context token after its question and the specials."""
        if not examples:
            raise DataError("squad: no questions to encode")
        frame = PairFrame.of(tokenizer)
        contexts: dict[str, int] = {}
        for example in examples:
            contexts.setdefault(example.context, len(contexts))
        context_encodings = _encode_all(tokenizer, list(contexts))
        question_ids = [e.ids[:max_query_length] for e in _encode_all(tokenizer, [ex.question for ex in examples])]
        context_offsets = [np.asarray(e.offsets, dtype=np.int64).reshape(-1, 2) for e in context_encodings]

        ids: list[list[int]] = []
        types: list[list[int]] = []
        labels: list[tuple[int, int]] = []
        where: list[tuple[int, int, int, int]] = []
        first_window = np.zeros(len(examples), dtype=np.int64)
        num_windows = np.zeros(len(examples), dtype=np.int64)
        answer_span = np.full((len(examples), 2), -1, dtype=np.int64)
        offsets_of: list[np.ndarray] = []
        for q, example in enumerate(examples):
            c = contexts[example.context]
            context = context_encodings[c].ids
            offsets_of.append(context_offsets[c])
            question = question_ids[q]
            capacity = max_length - frame.specials - len(question)
            if capacity < 1:
                raise ConfigError(f"task.max_length: {max_length} tokens leave no room for the context of question "
                                  f"{example.id!r} after its {len(question)} question tokens and {frame.specials} "
                                  f"special tokens")
            span = answer_tokens(context_offsets[c], example.answers[0].start, example.answers[0].end) \
                if example.answers else None
            if span is not None:
                answer_span[q] = span
            first_window[q] = len(ids)
            for start, stop in plan_windows(len(context), capacity, window_step(capacity, doc_stride)):
                window, window_types, content = frame.frame(question, context[start:stop])
                ids.append(window)
                types.append(window_types)
                where.append((q, start, stop, content))
                inside = span is not None and start <= span[0] and span[1] < stop
                null = frame.null % len(window)
                labels.append((content + span[0] - start, content + span[1] - start) if inside else (null, null))
            num_windows[q] = len(ids) - first_window[q]
        encoded = cls(ids, types, torch.tensor(labels, dtype=torch.long), tokenizer.fill_id, shuffle=shuffle,
                      seed=seed, padding_side=tokenizer.padding_side, **options)
        table = np.asarray(where, dtype=np.int64)
        encoded.question, encoded.start, encoded.stop, encoded.content = (table[:, i].copy() for i in range(4))
        encoded.first_window, encoded.num_windows = first_window, num_windows
        encoded.context_offsets, encoded.answer_span = offsets_of, answer_span
        return encoded

    def collate(self, rows: np.ndarray) -> TaskBatch:
        """The windows' batch; under left padding the answer positions move with the tokens."""
        batch = super().collate(rows)
        if batch.labels is None or self.padding_side == "right":
            return batch
        shift = torch.from_numpy(self.shift(rows, batch.input_ids.shape[1]))
        return replace(batch, labels=batch.labels + shift[:, None])

    @property
    def num_questions(self) -> int:
        return len(self.first_window)

    def windows_of(self, question: int) -> range:
        first = int(self.first_window[question])
        return range(first, first + int(self.num_windows[question]))

    def windows_holding(self, question: int, start: int, end: int) -> list[int]:
        """The windows of ``question`` that hold the context characters ``[start, end)`` wholly (by tokens)."""
        span = answer_tokens(self.context_offsets[question], start, end)
        if span is None:
            return []
        return [w for w in self.windows_of(question) if self.start[w] <= span[0] and span[1] < self.stop[w]]


def _encode_all(tokenizer: Tokenizer, texts: list[str], chunk: int = 1024) -> list[Any]:
    out: list[Any] = []
    for begin in range(0, len(texts), chunk):
        out.extend(tokenizer.encode_batch(texts[begin:begin + chunk], add_special_tokens=False).encodings)
    return out


# --------------------------------------------------------------------------------------------- head, objective
def qa_head(config: TransformerConfig) -> HeadSpec:
    """The family's question-answering head (transformers' ``*ForQuestionAnswering.qa_outputs``): start and end."""
    kind, act, _ = HEADS[config.family][QA]
    return HeadSpec(QA, kind, num_labels=2, activation=act or config.hidden_act)  # type: ignore[arg-type]


@dataclass
class SpanExtraction(Objective):
    """Cross-entropy of the start and of the end position over each window's real positions (padding excluded),
    their mean per window, summed over the batch's windows (the units). Stats: ``{name}_units``, ``_loss_sum``,
    ``_correct`` (windows whose most likely start and end are both the labelled ones), summarised as
    ``{name}_loss`` and ``{name}_accuracy``."""

    head: HeadSpec
    weight: float = 1.0
    name: str = QA

    def __post_init__(self) -> None:
        check_objective(self)
        if self.head.num_labels != 2:
            raise ConfigError(f"objectives.{self.name}: span extraction needs a head with 2 outputs (start, end), "
                              f"got {self.head.num_labels}")

    def heads(self) -> Sequence[HeadSpec]:
        return (self.head,)

    def reads(self, batch: TaskBatch) -> Tensor | None:
        return None  # every position

    def units(self, batch: TaskBatch) -> Tensor:
        return torch.tensor(len(batch), dtype=torch.int64)

    def __call__(self, passes: Passes, batch: TaskBatch) -> ObjectiveOutput:
        if batch.labels is None:
            raise DataError(f"objective {self.name!r} needs answer positions; the batch has none")
        logits = passes.shared.head_logits[self.name].float()
        logits = logits.masked_fill(~batch.attention_mask.bool()[..., None], float("-inf"))
        start, end = logits[..., 0], logits[..., 1]
        loss = (F.cross_entropy(start, batch.labels[:, 0], reduction="sum")
                + F.cross_entropy(end, batch.labels[:, 1], reduction="sum")) / 2
        with torch.no_grad():
            correct = ((start.argmax(-1) == batch.labels[:, 0]) & (end.argmax(-1) == batch.labels[:, 1])).sum()
        return ObjectiveOutput(loss, {f"{self.name}_units": self.units(batch).to(loss.device),
                                      f"{self.name}_loss_sum": loss.detach(), f"{self.name}_correct": correct})

    def summarize(self, totals: Mapping[str, float]) -> dict[str, float]:
        return classification_summary(self.name, totals)


# -------------------------------------------------------------------------------------------------- prediction
@torch.no_grad()
def window_logits(model: Model, windows: EncodedExamples, batch_size: int = 64, head: str = QA) -> np.ndarray:
    """The head's logits at every position of every window, ``[total positions, outputs]`` float32 (a QA head's
    start and end; a token classifier's labels): window ``w``'s rows are ``windows.offsets[w]:windows.offsets[w +
    1]``."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    spec = next((spec for spec in model.head_specs if spec.name == head), None)
    if spec is None:
        raise ConfigError(f"the model has no {head!r} head (heads: {', '.join(model.heads) or 'none'})")
    out = np.zeros((int(windows.offsets[-1]), spec.num_labels), dtype=np.float32)
    try:
        for batch in windows.batches(0, batch_size, drop_last=False):
            rows = batch.example_ids.numpy()
            batch = batch.to(device)
            logits = model(**model.forward_inputs(batch)).head_logits[head]
            logits = logits.float().cpu().numpy()
            shifts = windows.shift(rows, logits.shape[1])
            for r, w in enumerate(rows):
                begin, end = int(windows.offsets[w]), int(windows.offsets[w + 1])
                out[begin:end] = logits[r, shifts[r]:shifts[r] + end - begin]
    finally:
        model.train(was_training)
    return out


def _top(values: np.ndarray, n: int) -> np.ndarray:
    return np.argsort(-values, kind="stable")[:n]


def best_span(start_logits: np.ndarray, end_logits: np.ndarray, *, n_best: int = 20, max_answer_length: int = 30,
              allowed_starts: np.ndarray | None = None) -> tuple[float, int, int] | None:
    """The best ``(score, start, end)`` (inclusive positions) among the ``n_best`` start and the ``n_best`` end
    candidates (the highest logits; ties to the earlier position): ``end >= start``, at most ``max_answer_length``
    positions, the start allowed (``allowed_starts[start]``, when given); score = start + end logit, ties to the
    earlier candidate. None when no pair is valid."""
    best: tuple[float, int, int] | None = None
    ends = _top(end_logits, n_best)
    for i in _top(start_logits, n_best):
        if allowed_starts is not None and not allowed_starts[i]:
            continue
        for j in ends:
            if j < i or j - i + 1 > max_answer_length:
                continue
            score = float(start_logits[i]) + float(end_logits[j])
            if best is None or score > best[0]:
                best = (score, int(i), int(j))
    return best


def question_spans(windows: QAWindows, logits: np.ndarray, *, n_best: int = 20,
                   max_answer_length: int = 30) -> list[tuple[int, int] | None]:
    """Per question, the best span's first and last context token over all its windows (see ``best_span``; a
    start counts only in the window where it has the most context), None when no window has a valid span."""
    return [None if found is None else (found[0], found[1])
            for found in question_answers(windows, logits, n_best=n_best, max_answer_length=max_answer_length)]


def question_answers(windows: QAWindows, logits: np.ndarray, *, n_best: int = 20, max_answer_length: int = 30,
                     with_scores: bool = False) -> list[Any]:
    """``question_spans`` with the window each best span was found in: ``(first token, last token, window)``, and
    with ``with_scores`` its score (start + end logit) last: ``(first, last, window, score)``."""
    spans: list[Any] = []
    for q in range(windows.num_questions):
        ws = windows.windows_of(q)
        plan = [(int(windows.start[w]), int(windows.stop[w])) for w in ws]
        choice = max_context_window(plan, len(windows.context_offsets[q]))
        best: tuple[float, int, int, int] | None = None
        for k, w in enumerate(ws):
            start, stop = plan[k]
            if stop == start:
                continue
            begin = int(windows.offsets[w] + windows.content[w])
            part = logits[begin:begin + stop - start]
            found = best_span(part[:, 0], part[:, 1], n_best=n_best, max_answer_length=max_answer_length,
                              allowed_starts=choice[start:stop] == k)
            if found is not None and (best is None or found[0] > best[0]):
                best = (found[0], start + found[1], start + found[2], w)
        if best is None:
            spans.append(None)
        else:
            spans.append((best[1], best[2], best[3], best[0]) if with_scores else (best[1], best[2], best[3]))
    return spans


def span_text(context: str, offsets: np.ndarray, span: tuple[int, int] | None) -> str:
    """The original text of a token span: ``context[offsets[start][0]:offsets[end][1]]`` ("" for None)."""
    if span is None:
        return ""
    return context[int(offsets[span[0]][0]):int(offsets[span[1]][1])]


# ------------------------------------------------------------------------------------------------------ the task
class SquadTask:
    """SQuAD v1.1 (see the module docstring). The options are BERT's ``run_squad.py`` defaults."""

    metrics = ("f1", "exact_match")
    predictions_file = "dev_predictions.json"
    max_length = 384  # question + context windows, as BERT's run_squad.py (the recipe's default for this task)

    def __init__(self, name: str = "squad", *, max_query_length: int = 64, doc_stride: int = 128,
                 max_answer_length: int = 30, n_best: int = 20, dev_fraction: float = DEV_FRACTION,
                 split_seed: int = SPLIT_SEED) -> None:
        for key, value in (("max_query_length", max_query_length), ("doc_stride", doc_stride),
                           ("max_answer_length", max_answer_length), ("n_best", n_best)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{name}.{key}: must be a positive integer, got {value!r}")
        if not 0.0 < dev_fraction < 1.0:
            raise ConfigError(f"{name}.dev_fraction: must be in (0, 1), got {dev_fraction!r}")
        self.name = name
        self.max_query_length, self.doc_stride = max_query_length, doc_stride
        self.max_answer_length, self.n_best = max_answer_length, n_best
        self.dev_fraction, self.split_seed = dev_fraction, split_seed

    def path(self, data: str, split: str) -> Path:
        if split not in SPLITS:
            raise ConfigError(f"split: expected one of {', '.join(SPLITS)}, got {split!r}")
        root = Path(data)
        if root.is_file():
            return split_path(root, split)
        if not root.is_dir():
            raise ConfigError(f"task.data: {root} does not exist (a SQuAD JSON file or the folder holding it)")
        if all((root / name).is_file() for name in OFFICIAL_FILES.values()):
            return root / OFFICIAL_FILES[split]
        files = sorted(p for p in root.glob("*.json") if p.is_file())
        if len(files) != 1:
            raise ConfigError(f"task.data: {root} holds {len(files)} .json files; expected "
                              f"{' and '.join(OFFICIAL_FILES.values())}, or one SQuAD file to split by article")
        return split_path(files[0], split)

    def read(self, path: Path, limit: int | None = None) -> list[QAExample]:
        file, split = parse_split(path)
        examples = read_squad(file)
        if split is not None:
            try:
                train, dev = split_squad_by_article(examples, dev_fraction=self.dev_fraction, seed=self.split_seed)
            except DataError as error:
                raise DataError(f"{file}: {error}") from None
            examples = train if split == "train" else dev
        return examples if limit is None else examples[:limit]

    def label_names(self) -> tuple[str, ...] | None:
        return None

    def heads(self, config: TransformerConfig) -> list[HeadSpec]:
        return [qa_head(config)]

    def objectives(self, heads: Sequence[HeadSpec]) -> list[Objective]:
        return [SpanExtraction(heads[0])]

    def encode(self, tokenizer: Tokenizer, examples: Sequence[QAExample], max_length: int, *, train: bool,
               seed: int = 0) -> QAWindows:
        return QAWindows.encode(tokenizer, examples, max_length, max_query_length=self.max_query_length,
                                doc_stride=self.doc_stride, shuffle=train, seed=seed)

    def for_model(self, model: Model) -> Any:
        """On an encoder-decoder (T5, BART) the task as text-to-text: the answer generated from ``question: ...
        context: ...`` (``bertology.tasks.text_to_text.SquadTextToText``); else the task itself."""
        from bertology.model.protocol import ENCODER_DECODER, capabilities
        from bertology.tasks.text_to_text import SquadTextToText, start_token

        return SquadTextToText(self, start_token(model)) if ENCODER_DECODER in capabilities(model) else self

    def predict(self, model: Model, encoded: QAWindows, examples: Sequence[QAExample],
                batch_size: int) -> list[str]:
        if not isinstance(encoded, QAWindows) or encoded.num_questions != len(examples):
            raise ConfigError(f"{self.name}: predict needs the windows encode made of these {len(examples)} "
                              f"questions")
        logits = window_logits(model, encoded, batch_size)
        spans = question_spans(encoded, logits, n_best=self.n_best, max_answer_length=self.max_answer_length)
        return [span_text(e.context, encoded.context_offsets[q], spans[q]) for q, e in enumerate(examples)]

    def scores(self, predictions: Sequence[str], examples: Sequence[QAExample]) -> dict[str, float]:
        if len(predictions) != len(examples):
            raise DataError(f"{self.name}: {len(predictions)} predictions for {len(examples)} questions")
        result = metrics.squad_v1([(e.id, [a.text for a in e.answers]) for e in examples],
                                  {e.id: p for e, p in zip(examples, predictions)})
        return {"f1": result.f1, "exact_match": result.exact_match}

    def write(self, path: Path, predictions: Sequence[str], examples: Sequence[QAExample]) -> None:
        answers = {e.id: p for e, p in zip(examples, predictions, strict=True)}
        with atomic_write(path, "w", encoding="utf-8") as handle:
            json.dump(answers, handle, ensure_ascii=False, indent=1)
            handle.write("\n")

    def evaluate(self, predictions_path: Path, gold_path: Path) -> dict[str, Any]:
        file, split = parse_split(gold_path)
        if split is not None:
            gold = Path(predictions_path).parent / GOLD_FILE.format(split=split)
            write_squad_json(gold, self.read(gold_path))
            file = gold
        return metrics.evaluate_files("squad", predictions_path, gold=file)


SQUAD = SquadTask()


# ------------------------------------------------------------------------------------------- whole articles
ARTICLE_SEPARATOR = "\n\n"  # between the paragraphs of a joined article


def whole_articles(examples: Sequence[QAExample]) -> list[QAExample]:
    """Each question with its whole article as the context: the article's paragraphs (its questions' contexts, in
    the order they first occur) joined by :data:`ARTICLE_SEPARATOR`, every answer's start moved to the same
    characters of the joined text. Articles are told apart by title; the questions keep their order."""
    paragraphs: dict[str, dict[str, int]] = {}
    for example in examples:
        paragraphs.setdefault(example.title, {}).setdefault(example.context, 0)
    articles: dict[str, str] = {}
    for title, contexts in paragraphs.items():
        at = 0
        for context in contexts:
            contexts[context] = at
            at += len(context) + len(ARTICLE_SEPARATOR)
        articles[title] = ARTICLE_SEPARATOR.join(contexts)
    joined = []
    for example in examples:
        shift = paragraphs[example.title][example.context]
        answers = [Answer(a.text, a.start + shift) for a in example.answers]
        joined.append(QAExample(example.id, example.question, articles[example.title], answers, example.title))
    return joined


class SquadArticleTask(SquadTask):
    """SQuAD v1.1 with the whole article as every question's context (``squad-article``; :func:`whole_articles`),
    split by article as ``squad`` is. A model reads the article in windows of ``task.max_length`` tokens (at most
    its own length) overlapping by half: a short model many windows of a few hundred tokens, a Longformer (its
    question tokens global, as transformers' question-answering class makes them) one window of up to 4,096
    tokens or a few. Predictions, scores and the written files are ``squad``'s (the official EM and F1)."""

    max_length = 4096

    def __init__(self, name: str = "squad-article", **options: Any) -> None:
        super().__init__(name, **options)

    def read(self, path: Path, limit: int | None = None) -> list[QAExample]:
        examples = whole_articles(super().read(path))  # every paragraph of an article, then the first questions
        return examples if limit is None else examples[:limit]

    def encode(self, tokenizer: Tokenizer, examples: Sequence[QAExample], max_length: int, *, train: bool,
               seed: int = 0) -> QAWindows:
        # a step of half the capacity whatever the length (window_step caps doc_stride there)
        return QAWindows.encode(tokenizer, examples, max_length, max_query_length=self.max_query_length,
                                doc_stride=max_length, shuffle=train, seed=seed)


SQUAD_ARTICLE = SquadArticleTask()
