"""Open-domain question answering over an index (REALM's and DPR's setting): the retrieval half, shared by every
open-QA evaluation, and the extractive reader over what was retrieved (``evaluate --task open-qa --reader DIR``).

The retrieval half is `retrieve(questions, index, k)`: for each question text, the index's `k` best passages, best
first, with their scores (`Retrieved`). It takes an index of any kind (`bertology.retrieval.kinds`: dense, bm25,
hybrid; a dense or hybrid one with its model attached) and, with ``reranker=`` (`bertology.retrieval.rerank.Reranker`),
re-scores the first stage's `rerank_depth` best passages and keeps the reranker's `k` best (scores are then its
log-odds of relevance). A `k` larger than the index is refused naming ``--k`` and the index's size, and so is a
query longer than the query encoder reads (the dense index's check). A RAG generator (``--generator``,
`open_qa_generator`) retrieves with its own trained query encoder over the index's fixed vectors instead (the index
embeds queries only with the model that built it); `retrieval_recall`, for both,
is the recall of those sets by the rule of ``evaluate --task retrieval`` (`bertology.retrieval.evaluate`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from bertology.errors import ConfigError
from bertology.retrieval.evaluate import recall_at_k
from bertology.retrieval.passages import Passage
from bertology.tasks.examples import QAExample


@dataclass(frozen=True)
class Retrieved:
    """One question's retrieved passages, best first: `passages`, their rows in the index, and their `scores`
    (the first stage's score, or the reranker's log-odds when one re-scored them)."""

    passages: list[Passage]
    rows: list[int]
    scores: list[float]


def check_depth(k: object, index: Any, option: str = "--k") -> int:
    """`k` as a number of passages to retrieve from `index`: a positive integer no larger than the index
    (a ConfigError naming `option` and the index's size otherwise)."""
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ConfigError(f"{option} must be a positive integer, got {k!r}")
    if k > len(index):
        raise ConfigError(f"{option} {k}: the index holds only {len(index)} passages; ask for at most {len(index)}")
    return k


def retrieve(questions: Sequence[str], index: Any, k: int, *, reranker: Any = None, rerank_depth: int = 100,
             batch_size: int = 32, show_progress: bool = False) -> list[Retrieved]:
    """The `k` best passages of `index` for each of `questions` (texts), best first (see the module docstring).
    With `reranker`, the first stage's ``max(k, rerank_depth)`` best (at most the index) are re-scored and its
    `k` best kept."""
    check_depth(k, index)
    questions = list(questions)
    for i, question in enumerate(questions):
        if not isinstance(question, str):
            raise ConfigError(f"question {i + 1}: expected a string, got {type(question).__name__}")
    if not questions:
        return []
    if reranker is not None:
        from bertology.retrieval.rerank import reranked

        if isinstance(rerank_depth, bool) or not isinstance(rerank_depth, int) or rerank_depth < 1:
            raise ConfigError(f"--rerank-depth must be a positive integer, got {rerank_depth!r}")
        scores, rows = reranked(reranker, index, questions, k, min(max(k, rerank_depth), len(index)),
                                batch_size=batch_size, show_progress=show_progress)
    else:
        scores, rows = index.rank(questions, k, batch_size=batch_size, show_progress=show_progress)
    out: list[Retrieved] = []
    for score_row, row_ids in zip(np.asarray(scores), np.asarray(rows)):
        kept = [(int(r), float(s)) for s, r in zip(score_row[:k], row_ids[:k]) if r >= 0]
        out.append(Retrieved([index.passages[r] for r, _ in kept], [r for r, _ in kept], [s for _, s in kept]))
    return out


def retrieval_recall(questions: Sequence[QAExample], index: Any, retrieved: Sequence[Retrieved]) -> float:
    """The percentage of `questions` with a hit among their retrieved passages (a passage holding a gold answer
    string by DPR's match, or the question's own paragraph: `bertology.retrieval.evaluate.recall_at_k` at the
    depth retrieved)."""
    if len(retrieved) != len(questions):
        raise ConfigError(f"{len(retrieved)} retrieved sets for {len(questions)} questions")
    depth = max((len(r.rows) for r in retrieved), default=0)
    if depth == 0:
        raise ConfigError("no passages were retrieved")
    return recall_at_k(questions, index.passages, [r.rows for r in retrieved], ks=(depth,)).recall[depth]


# ------------------------------------------------------------------------------------------------- the reader
READER_HEAD = "qa"  # bertology.tasks.qa.QA: the family's question-answering head (start and end)
SELECTIONS = ("reader", "reranker")
DEFAULT_K = 10
PREDICTIONS_FILE = "predictions.json"
METRICS_FILE = "metrics.json"


@dataclass(frozen=True)
class Candidate:
    """The reader's best span in one retrieved passage: its `text`, `span` (the start and end logits summed, as the
    SQuAD reader scores spans) and `span_log_prob` (log P_start + log P_end, each a softmax over the context
    positions of the window the span lies in, DPR's span probability), and the passage's `rank` (from 0) among the
    question's retrieved passages. `text` is "" and the scores -inf when the passage holds no valid span."""

    text: str
    span: float
    span_log_prob: float
    rank: int


def _log_softmax(values: np.ndarray) -> np.ndarray:
    values = values.astype(np.float64)
    top = values.max()
    return values - (top + np.log(np.exp(values - top).sum()))


class Reader:
    """The SQuAD reader (``finetune --task squad``: a model with the ``qa`` head) run over retrieved passages, each
    passage read as the SQuAD task reads a context: ``[CLS] question [SEP] window [SEP]`` windows of `max_length`
    tokens a `doc_stride` step apart (`bertology.tasks.qa.QAWindows`), the question cut at `max_query_length`
    tokens, spans of at most `max_answer_length` tokens among the `n_best` starts and ends of each window, a start
    counted only in the window where it has the most context (`bertology.tasks.qa.question_answers`)."""

    def __init__(self, pretrained: Any, where: str, *, max_length: int = 384, max_query_length: int = 64,
                 doc_stride: int = 128, max_answer_length: int = 30, n_best: int = 20) -> None:
        from bertology.tasks.qa import SquadTask

        specs = list(pretrained.model.head_specs)
        spec = next((s for s in specs if s.name == READER_HEAD), None)
        if spec is None or spec.num_labels != 2:
            heads = ", ".join(f"{s.name} ({s.kind}, {s.num_labels} outputs)" for s in specs)
            raise ConfigError(f"--reader {where}: not an extractive reader: it needs the question-answering head "
                              f"'{READER_HEAD}' (start and end; heads: {heads or 'none'}); train one with "
                              f"bertology finetune --task squad")
        if pretrained.tokenizer is None:
            raise ConfigError(f"--reader {where}: the model has no tokenizer files")
        if isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 1:
            raise ConfigError(f"--max-length must be a positive integer, got {max_length!r}")
        self.task = SquadTask(max_query_length=max_query_length, doc_stride=doc_stride,
                              max_answer_length=max_answer_length, n_best=n_best)
        self.pretrained, self.where = pretrained, where
        self.max_length = min(max_length, pretrained.model.config.max_length)

    @classmethod
    def load(cls, directory: Any, *, device: Any = None, dtype: str = "float32", **options: Any) -> Reader:
        """The reader in a model directory, placed on `device` (`bertology.device.place`)."""
        from pathlib import Path

        from bertology.device import place
        from bertology.model import load

        if not Path(directory).is_dir():
            raise ConfigError(f"--reader {directory}: no such model directory")
        pretrained = load(directory)
        reader = cls(pretrained, str(directory), **options)
        place(pretrained, device, dtype)
        return reader

    def check_questions(self, questions: Sequence[str]) -> None:
        """Refuse a question longer (in tokens, specials included) than the reader's positions or `max_length`,
        naming it (`bertology.retrieval.index.check_query_lengths`)."""
        from bertology.retrieval.index import check_query_lengths

        check_query_lengths(self.pretrained, questions, self.max_length)

    def read(self, questions: Sequence[str], passages: Sequence[Sequence[str]], *,
             batch_size: int = 64) -> list[list[Candidate]]:
        """For each question, the best span of each of its passages (`Candidate`, in the passages' order). Every
        (question, passage) pair's windows go through the model in one run of batches sorted by length (the SQuAD
        predict path, `bertology.tasks.qa.window_logits`)."""
        from bertology.tasks.qa import QAWindows, question_answers, span_text, window_logits

        if len(passages) != len(questions):
            raise ConfigError(f"{len(passages)} passage lists for {len(questions)} questions")
        self.check_questions(questions)
        examples: list[QAExample] = []
        where: list[tuple[int, int]] = []
        for q, (question, texts) in enumerate(zip(questions, passages)):
            for rank, text in enumerate(texts):
                examples.append(QAExample(f"{q}:{rank}", question, text, [], ""))
                where.append((q, rank))
        out: list[list[Candidate]] = [[] for _ in questions]
        if not examples:
            return out
        windows = QAWindows.encode(self.pretrained.tokenizer, examples, self.max_length,
                                   max_query_length=self.task.max_query_length, doc_stride=self.task.doc_stride)
        logits = window_logits(self.pretrained.model, windows, batch_size, head=READER_HEAD)
        found = question_answers(windows, logits, n_best=self.task.n_best,
                                 max_answer_length=self.task.max_answer_length, with_scores=True)
        for e, ((q, rank), example, best) in enumerate(zip(where, examples, found)):
            if best is None:
                out[q].append(Candidate("", -np.inf, -np.inf, rank))
                continue
            first, last, w, score = best
            begin = int(windows.offsets[w] + windows.content[w])
            part = logits[begin:begin + int(windows.stop[w] - windows.start[w])]
            at_first, at_last = first - int(windows.start[w]), last - int(windows.start[w])
            log_prob = float(_log_softmax(part[:, 0])[at_first] + _log_softmax(part[:, 1])[at_last])
            text = span_text(example.context, windows.context_offsets[e], (first, last))
            out[q].append(Candidate(text, float(score), log_prob, rank))
        return out


def log_sigmoid(x: float) -> float:
    """log(1 / (1 + exp(-x))), without overflow."""
    return -float(np.logaddexp(0.0, -x))


def choose(candidates: Sequence[Candidate], selection: str = "reader",
           passage_scores: Sequence[float] | None = None) -> Candidate | None:
    """The answer among one question's candidates (one per retrieved passage), by DPR's passage selection score plus
    span score (Karpukhin et al. 2020, section 6), ties to the better-ranked passage:

    - ``reader``: the span score ``start + end logit``. This is DPR's log P_sel(p) + log P_start + log P_end with
      P_sel the reader's own: passage p's share of the reader's total mass, softmax over the passages of
      ``lse(start logits) + lse(end logits)`` of p: the normalisers cancel and the raw span score is left (the
      shared normalisation of Clark and Gardner 2018).
    - ``reranker``: ``log sigmoid(reranker log-odds of p) + log P_start + log P_end``: the cross-encoder reranker's
      probability that p is relevant as DPR's selection model, `passage_scores` (one per candidate) its log-odds.

    None when no passage holds a valid span."""
    if selection not in SELECTIONS:
        raise ConfigError(f"--selection: expected one of {', '.join(SELECTIONS)}, got {selection!r}")
    best: tuple[float, int] | None = None
    for i, candidate in enumerate(candidates):
        if not np.isfinite(candidate.span):
            continue
        if selection == "reader":
            score = candidate.span
        else:
            if passage_scores is None or len(passage_scores) != len(candidates):
                raise ConfigError("--selection reranker: needs the reranker's score of every retrieved passage "
                                  "(--rerank DIR)")
            score = log_sigmoid(float(passage_scores[i])) + candidate.span_log_prob
        if best is None or score > best[0]:
            best = (score, i)
    return None if best is None else candidates[best[1]]


def check_out(out: Any) -> Any:
    """Where the predictions go: a directory (created when missing), not a file, not below a file."""
    from pathlib import Path

    from bertology.io import file_in_the_way

    if out is None:
        return None
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out}: is a file; the predictions are written into a directory")
    blocker = file_in_the_way(out)
    if blocker is not None:
        raise ConfigError(f"--out {out}: cannot create it, {blocker} is a file, not a directory")
    return out


def evaluate_open_qa(index: Any, squad: Any, reader: Reader, *, k: int = 10, split: str | None = None,
                     reranker: Any = None, rerank_depth: int = 100, selection: str = "reader", out: Any = None,
                     batch_size: int = 32, show_progress: bool = False) -> dict[str, Any]:
    """Open-domain extractive QA on a SQuAD v1.1 file (`bertology.retrieval.evaluate.squad_questions`, `split`):
    each question's `k` passages `retrieve`d from `index` (re-scored by `reranker` when given), the `reader` over
    each, the answer `choose`n across them by `selection`. Returns the official SQuAD v1.1 ``exact_match`` and
    ``f1`` (`bertology.tasks.metrics.squad_v1`, percentages) and ``recall@k`` of the retrieved sets
    (`retrieval_recall`), with ``questions``, ``k``, the index's ``kind`` (and ``split``, ``rerank``,
    ``rerank_depth``, ``selection``); with `out`, writes ``predictions.json`` (``{question id: answer}``, the official
    format) and ``metrics.json`` into it, each atomically, and nothing else anywhere."""
    from bertology.io import atomic_write
    from bertology.retrieval.evaluate import squad_questions
    from bertology.tasks import metrics

    if selection not in SELECTIONS:
        raise ConfigError(f"--selection: expected one of {', '.join(SELECTIONS)}, got {selection!r}")
    if selection == "reranker" and reranker is None:
        raise ConfigError("--selection reranker: needs --rerank DIR (the reranker's score is the passage selection "
                          "score)")
    check_depth(k, index)
    out = check_out(out)
    questions = squad_questions(squad, split)
    texts = [q.question for q in questions]
    reader.check_questions(texts)
    found = retrieve(texts, index, k, reranker=reranker, rerank_depth=rerank_depth, batch_size=batch_size,
                     show_progress=show_progress)
    candidates = reader.read(texts, [[p.text for p in r.passages] for r in found], batch_size=max(batch_size, 64))
    predictions: dict[str, str] = {}
    for question, retrieved, options in zip(questions, found, candidates):
        best = choose(options, selection, retrieved.scores if selection == "reranker" else None)
        predictions[question.id] = "" if best is None else best.text
    scores = metrics.squad_v1([(q.id, [a.text for a in q.answers]) for q in questions], predictions)
    result: dict[str, Any] = {"exact_match": round(scores.exact_match, 2), "f1": round(scores.f1, 2),
                              f"recall@{k}": round(retrieval_recall(questions, index, found), 2),
                              "questions": len(questions), "k": k, "kind": index.kind, "selection": selection}
    if split is not None:
        result["split"] = split
    if reranker is not None:
        result.update(rerank=str(reranker.where), rerank_depth=rerank_depth)
    if out is not None:
        with atomic_write(out / PREDICTIONS_FILE, "w", encoding="utf-8") as handle:
            json.dump(predictions, handle, ensure_ascii=False, indent=1)
            handle.write("\n")
        with atomic_write(out / METRICS_FILE, "w", encoding="utf-8") as handle:
            json.dump(result, handle, indent=1)
            handle.write("\n")
    return result


def open_qa(index: Any, squad: Any, reader: Any, *, k: int | None = None, model: Any = None, device: Any = None,
            dtype: str = "float32", kind: str | None = None, split: str | None = None, rerank: Any = None,
            rerank_depth: int = 100, selection: str = "reader", out: Any = None, max_length: int = 384,
            show_progress: bool = False, generator: Any = None) -> dict[str, Any]:
    """`bertology evaluate --task open-qa --reader DIR`: open the index directory (as `evaluate --task retrieval`
    does: `bertology.retrieval.kinds.open_index`), the reader and the reranker, and `evaluate_open_qa` (`k` None:
    10, or every passage of a smaller index, as `bertology search` takes it). The options are checked before any
    model is loaded or any question embedded. With `generator` (``--generator DIR``, a RAG model) instead of
    `reader`: `open_qa_generator`."""
    from bertology.retrieval.kinds import open_index

    if generator is not None:
        if reader is not None:
            raise ConfigError("--reader, --generator: give one (an extractive reader or a RAG generator)")
        return open_qa_generator(index, squad, generator, k=k, device=device, dtype=dtype, kind=kind, split=split,
                                 rerank=rerank, selection=selection, out=out, model=model)
    if index is None or squad is None or reader is None:
        raise ConfigError("evaluate --task open-qa: --index INDEX, --squad FILE and --reader DIR (or --generator "
                          "DIR) are required")
    if selection not in SELECTIONS:
        raise ConfigError(f"--selection: expected one of {', '.join(SELECTIONS)}, got {selection!r}")
    if selection == "reranker" and rerank is None:
        raise ConfigError("--selection reranker: needs --rerank DIR (the reranker's score is the passage selection "
                          "score)")
    check_out(out)
    loaded = open_index(index, kind=kind, model=model, device=device, dtype=dtype)
    k = min(DEFAULT_K, len(loaded)) if k is None else check_depth(k, loaded)
    the_reader = Reader.load(reader, device=device, dtype=dtype, max_length=max_length)
    reranker = None
    if rerank is not None:
        from bertology.retrieval.rerank import Reranker

        reranker = Reranker.load(rerank, device=device, dtype=dtype)
    return evaluate_open_qa(loaded, squad, the_reader, k=k, split=split, reranker=reranker,
                            rerank_depth=rerank_depth, selection=selection, out=out, show_progress=show_progress)


def open_qa_generator(index: Any, squad: Any, generator: Any, *, k: int | None = None, device: Any = None,
                      dtype: str = "float32", kind: str | None = None, split: str | None = None, rerank: Any = None,
                      selection: str = "reader", out: Any = None, model: Any = None) -> dict[str, Any]:
    """`bertology evaluate --task open-qa --generator DIR`: a RAG model (``finetune --task rag``) answering each
    question from its k passages (`evaluate_open_qa_generator`), retrieved by its own
    trained query encoder from `index` (default: the index its ``rag.json`` records); the same JSON object as the
    reader's."""
    from bertology.device import place
    from bertology.retrieval.rag import load_rag

    if squad is None:
        raise ConfigError("evaluate --task open-qa --generator DIR: --squad FILE is required")
    for flag, given in (("--rerank", rerank is not None), ("--selection", selection != "reader"),
                        ("--model", model is not None)):
        if given:
            raise ConfigError(f"{flag}: not with --generator (a RAG model retrieves with its own query encoder and "
                              f"weighs its passages by p(z|x))")
    if kind is not None and kind != "dense":
        raise ConfigError(f"--kind {kind}: a RAG model retrieves from a dense index")
    check_out(out)
    rag = load_rag(generator, index)
    place(rag.generator, device, dtype)
    place(rag.retriever, device, dtype)
    return evaluate_open_qa_generator(rag, squad, k=k, split=split, out=out, where=str(generator))


def evaluate_open_qa_generator(rag: Any, squad: Any, *, k: int | None = None, split: str | None = None,
                               out: Any = None, batch_size: int = 16, max_new_tokens: int = 32,
                               where: str | None = None) -> dict[str, Any]:
    """``evaluate --task open-qa --generator DIR``: each question of the SQuAD v1.1 file (`split` as
    ``evaluate --task retrieval`` takes it) answered by the RAG model (`bertology.retrieval.rag.Rag`: its own
    query encoder retrieving its k passages, its marginalisation decoding); the official v1.1 ``exact_match`` and ``f1`` and ``recall@k`` of the
    retrieved sets by `retrieval_recall`, as for the extractive reader; with `out`,
    ``predictions.json`` and ``metrics.json`` written there atomically."""
    from bertology.io import atomic_write
    from bertology.retrieval.evaluate import squad_questions
    from bertology.retrieval.rag import check_k
    from bertology.tasks import metrics

    out = check_out(out)
    k = rag.options.k if k is None else k
    check_k(k, rag.retriever, "--k")
    questions = squad_questions(squad, split)
    answers = rag.answer([q.question for q in questions], k=k, batch_size=batch_size, max_new_tokens=max_new_tokens)
    found = [Retrieved([rag.retriever.passages[r] for r in a.rows], a.rows, a.scores) for a in answers]
    predictions = {q.id: a.text for q, a in zip(questions, answers)}
    scores = metrics.squad_v1([(q.id, [a.text for a in q.answers]) for q in questions], predictions)
    result: dict[str, Any] = {"exact_match": round(scores.exact_match, 2), "f1": round(scores.f1, 2),
                              f"recall@{k}": round(retrieval_recall(questions, rag.retriever.index, found), 2),
                              "questions": len(questions), "k": k, "kind": "dense",
                              "marginalise": rag.options.marginalise}
    if where is not None:
        result["generator"] = where
    if split is not None:
        result["split"] = split
    if out is not None:
        with atomic_write(out / PREDICTIONS_FILE, "w", encoding="utf-8") as handle:
            json.dump(predictions, handle, ensure_ascii=False, indent=1)
            handle.write("\n")
        with atomic_write(out / METRICS_FILE, "w", encoding="utf-8") as handle:
            json.dump(result, handle, indent=1)
            handle.write("\n")
    return result
