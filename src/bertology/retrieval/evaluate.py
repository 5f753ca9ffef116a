"""Open-retrieval evaluation on SQuAD: every question is searched against all paragraphs of the file, and a
retrieved paragraph counts as a hit when it contains a gold answer string (DPR's rule) or is the question's own
paragraph.

The answer-string match is DPR's ``has_answer`` with ``match_type="string"`` (Karpukhin et al. 2020,
``dpr/data/qa_validation.py``): the paragraph and each answer are NFD-normalised, split by DPR's SimpleTokenizer
(runs of letters, digits and marks, ``[\\p{L}\\p{N}\\p{M}]+``, and every other character that is not a separator or
control, ``[^\\p{Z}\\p{C}]``, on its own), lower-cased, and an answer matches when its token sequence occurs as a
contiguous run of the paragraph's tokens. So "Denver" matches "Denver's" but not "Denverite". The question's own
paragraph is added as a hit because an answer span cut inside a word ("nver" in "Denver") is no token match there.
"""

from __future__ import annotations

import os
import sys
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from bertology.errors import ConfigError, DataError
from bertology.retrieval.passages import Passage
from bertology.tasks.examples import QAExample

DEFAULT_KS = (1, 5, 20, 100)
MRR_DEPTH = 10  # MRR@10
# Joins tokens for substring matching: a control character, which DPR's tokens never contain.
_SEPARATOR = "\x00"


def dpr_tokens(text: str) -> list[str]:
    """DPR's SimpleTokenizer words of ``unicodedata.normalize("NFD", text)``, lower-cased (see the module doc)."""
    tokens: list[str] = []
    run: list[str] = []
    for char in unicodedata.normalize("NFD", text):
        kind = unicodedata.category(char)[0]
        if kind in "LNM":
            run.append(char)
            continue
        if run:
            tokens.append("".join(run).lower())
            run = []
        if kind not in "ZC":
            tokens.append(char.lower())
    if run:
        tokens.append("".join(run).lower())
    return tokens


def _joined(tokens: list[str]) -> str:
    return _SEPARATOR + _SEPARATOR.join(tokens) + _SEPARATOR


def has_answer(answers: Sequence[str], text: str) -> bool:
    """Whether `text` contains any of `answers` as a run of DPR tokens (DPR's string match)."""
    haystack = _joined(dpr_tokens(text))
    return any(_joined(dpr_tokens(answer)) in haystack for answer in answers)


@dataclass(frozen=True)
class RetrievalScores:
    """Recall@k in percent: `recall` counts a paragraph holding a gold answer string or the question's own
    paragraph; `paragraph_recall` only the question's own paragraph. `mrr`: MRR@10 in percent, the mean over the
    questions of 1 / (the rank of the first hit, from 1), 0 when no hit is among the first 10."""

    recall: dict[int, float]
    paragraph_recall: dict[int, float]
    questions: int
    ks: tuple[int, ...] = field(default=DEFAULT_KS)
    mrr: float = 0.0

    def summary(self) -> dict[str, float | int]:
        """``{"recall@1": .., "recall@5": .., "recall@20": .., "recall@100": .., "mrr@10": .., "questions": N}``
        (what the CLI prints; percentages rounded to 2 decimals)."""
        return {**{f"recall@{k}": round(self.recall[k], 2) for k in self.ks}, f"mrr@{MRR_DEPTH}": round(self.mrr, 2),
                "questions": self.questions}


def _check_ks(ks: Sequence[int]) -> tuple[int, ...]:
    ks = tuple(ks)
    if not ks or any(isinstance(k, bool) or not isinstance(k, int) or k < 1 for k in ks):
        raise ConfigError(f"ks must be positive integers, got {ks!r}")
    return tuple(sorted(set(ks)))


def recall_at_k(questions: Sequence[QAExample], passages: Sequence[Passage], rankings: Sequence[Sequence[int]],
                ks: Sequence[int] = DEFAULT_KS) -> RetrievalScores:
    """Recall@k of `rankings` (for each question, passage rows best first; at least max(ks) of them when there are
    that many passages) by the rules of the module docstring. A question counts as found at k when any of its
    first k rows is a hit."""
    ks = _check_ks(ks)
    if len(rankings) != len(questions):
        raise ConfigError(f"{len(rankings)} rankings for {len(questions)} questions")
    if not questions:
        raise ConfigError("no questions to evaluate")
    depth = max(*ks, MRR_DEPTH)
    reciprocal = 0.0
    tokens: dict[int, str] = {}  # passage row -> joined DPR tokens, computed once per retrieved passage
    found = {k: 0 for k in ks}
    own_found = {k: 0 for k in ks}
    for question, ranking in zip(questions, rankings):
        answers = [_joined(dpr_tokens(answer.text)) for answer in question.answers]
        first_hit = first_own = None
        for position, row in enumerate(list(ranking)[:depth]):
            row = int(row)
            if not 0 <= row < len(passages):
                raise ConfigError(f"question {question.id!r}: ranked row {row} is outside the {len(passages)} "
                                  f"passages")
            own = passages[row].text == question.context
            if own and first_own is None:
                first_own = position
            if first_hit is None:
                if row not in tokens:
                    tokens[row] = _joined(dpr_tokens(passages[row].text))
                if own or any(answer in tokens[row] for answer in answers):
                    first_hit = position
            if first_hit is not None and first_own is not None:
                break
        if first_hit is not None and first_hit < MRR_DEPTH:
            reciprocal += 1.0 / (first_hit + 1)
        for k in ks:
            found[k] += first_hit is not None and first_hit < k
            own_found[k] += first_own is not None and first_own < k
    n = len(questions)
    return RetrievalScores({k: 100.0 * found[k] / n for k in ks}, {k: 100.0 * own_found[k] / n for k in ks}, n, ks,
                           100.0 * reciprocal / n)


def squad_questions(path: str | os.PathLike, split: str | None = None) -> list[QAExample]:
    """The questions of a SQuAD v1.1 file (`bertology.tasks.read_squad`); with `split` (``train`` or ``dev``),
    that split's questions as ``finetune --task squad`` takes them from `path` (a folder with the official files,
    or one file split by article: `bertology.tasks.qa`)."""
    if split is None:
        from bertology.tasks.readers import read_squad

        return read_squad(path)
    from bertology.tasks.lookup import get_task

    task = get_task("squad")
    return task.read(task.path(str(path), split))


def check_paragraphs(questions: Sequence[QAExample], passages: Sequence[Passage], source: str) -> None:
    """Every question's paragraph must be among the passages (else the index was built from other texts)."""
    texts = {passage.text for passage in passages}
    missing = [q for q in questions if q.context not in texts]
    if missing:
        raise DataError(f"{source}: the paragraph of question {missing[0].id!r} (and of {len(missing) - 1} more "
                        f"questions) is not in the index; build the index from this file's paragraphs "
                        f"(bertology index build --squad FILE)")


def evaluate_squad(index, squad: str | os.PathLike, *, ks: Sequence[int] = DEFAULT_KS, batch_size: int = 32,
                   show_progress: bool = False, split: str | None = None, reranker: Any = None,
                   rerank_depth: int = 100) -> RetrievalScores:
    """Open-retrieval recall@k and MRR@10 of `index` (an index of any kind, `bertology.retrieval.kinds`; a dense
    or hybrid one with its model attached) built from the paragraphs of the SQuAD file `squad`, e.g. by
    ``Index.build(model, squad_passages(squad))``: every question (of `split`, see `squad_questions`) is searched
    against all passages of the index. `reranker` (a `bertology.retrieval.rerank.Reranker`) re-scores each
    question's first `rerank_depth` passages."""
    ks = _check_ks(ks)
    questions = squad_questions(squad, split)
    check_paragraphs(questions, index.passages, str(squad))
    texts = [q.question for q in questions]
    depth = min(max(*ks, MRR_DEPTH), len(index))
    if reranker is not None:
        from bertology.retrieval.rerank import reranked

        _, rows = reranked(reranker, index, texts, depth, rerank_depth, batch_size=batch_size,
                           show_progress=show_progress)
    else:
        _, rows = index.rank(texts, depth, batch_size=batch_size, show_progress=show_progress)
    return recall_at_k(questions, index.passages, [[r for r in row if r >= 0] for row in rows], ks)


def evaluate_retrieval(index: str | os.PathLike | None, squad: str | os.PathLike | None,
                       model: str | os.PathLike | None = None, *, device: Any = None, dtype: str = "float32",
                       kind: str | None = None, split: str | None = None, rerank: str | os.PathLike | None = None,
                       rerank_depth: int = 100) -> dict[str, float | int | str]:
    """`bertology evaluate --task retrieval`: open the index directory (`kind`: the kind it must be; a dense or
    hybrid one with `model`, default the recorded one, run on `device` in `dtype` as `Index.attach` takes them)
    and return `evaluate_squad(...).summary()` with the index's kind (and the split)."""
    from bertology.retrieval.kinds import open_index

    if index is None or squad is None:
        raise ConfigError("evaluate --task retrieval: --index INDEX and --squad FILE are required")
    loaded = open_index(index, kind=kind, model=model, device=device, dtype=dtype)
    reranker = None
    if rerank is not None:
        from bertology.retrieval.rerank import Reranker

        reranker = Reranker.load(rerank, device=device, dtype=dtype)
    scores = evaluate_squad(loaded, squad, split=split, show_progress=sys.stderr.isatty(), reranker=reranker,
                            rerank_depth=rerank_depth)
    extra: dict[str, Any] = {"kind": loaded.kind}
    if split is not None:
        extra["split"] = split
    if rerank is not None:
        extra.update(rerank=str(rerank), rerank_depth=rerank_depth)
    return {**scores.summary(), **extra}
