"""Open-domain question answering over an index (REALM's and DPR's setting): the retrieval half, shared by every
open-QA evaluation, and the extractive reader over what was retrieved (``evaluate --task open-qa --reader DIR``).

The retrieval half is `retrieve(questions, index, k)`: for each question text, the index's `k` best passages, best
first, with their scores (`Retrieved`). It takes an index of any kind (`bertology.retrieval.kinds`: dense, bm25,
hybrid; a dense or hybrid one with its model attached) and, with ``reranker=`` (`bertology.retrieval.rerank.Reranker`),
re-scores the first stage's `rerank_depth` best passages and keeps the reranker's `k` best (scores are then its
log-odds of relevance). A `k` larger than the index is refused naming ``--k`` and the index's size, and so is a
query longer than the query encoder reads (the dense index's check). A generator over the retrieved passages (RAG)
calls this same function, so the reader and the generator are measured on the same retrieved sets; `retrieval_recall`
is the recall of those sets by the rule of ``evaluate --task retrieval`` (`bertology.retrieval.evaluate`).
"""

from __future__ import annotations

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
