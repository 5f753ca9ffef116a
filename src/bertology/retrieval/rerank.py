"""Re-scoring a first stage's passages with a cross-encoder (`finetune --task rerank`, `bertology.retrieval.reranker_task`).

`Reranker.load(directory)` takes a model with a two-label sequence classifier whose labels are ``irrelevant`` and
``relevant`` (what ``finetune --task rerank-cls`` writes; the ``segment_cosine`` head of ``finetune --task rerank``
gives them in that order); anything else is refused naming the directory and the heads
it has. A (query, passage) pair's score is logit(relevant) - logit(irrelevant); `rerank_hits` re-sorts each query's
first-stage hits by it (equal scores keep the first stage's order) and keeps the best k.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from bertology.errors import ConfigError
from bertology.retrieval.index import Hit, check_query_lengths

CLASSIFIER = "classifier"
RELEVANT, IRRELEVANT = "relevant", "irrelevant"
SEGMENT_COSINE = "segment_cosine"  # the head kind of `finetune --task rerank`: logits (irrelevant, relevant)


class Reranker:
    """A cross-encoder with a relevant / irrelevant classifier, and how long its pairs may be."""

    def __init__(self, pretrained: Any, where: str, max_length: int = 256) -> None:
        spec = next((s for s in pretrained.model.head_specs if s.name == CLASSIFIER), None)
        labels = pretrained.model.config.extra.get("id2label") if hasattr(pretrained.model.config, "extra") else None
        names = [labels.get(str(i)) for i in range(2)] if isinstance(labels, dict) else []
        if spec is not None and spec.kind == SEGMENT_COSINE and not names:  # its labels are the head's own order
            names = [IRRELEVANT, RELEVANT]  # (the native format it is saved in keeps no id2label)
        if spec is None or spec.num_labels != 2 or sorted(names) != [IRRELEVANT, RELEVANT]:
            heads = ", ".join(f"{s.name} ({s.kind}, {s.num_labels} labels)" for s in pretrained.model.head_specs)
            raise ConfigError(f"--rerank {where}: not a reranker: it needs a two-label sequence classifier "
                              f"'{CLASSIFIER}' labelled {IRRELEVANT}/{RELEVANT} (heads: {heads or 'none'}, labels: "
                              f"{labels or 'none'}); train one with bertology finetune --task rerank")
        if pretrained.tokenizer is None:
            raise ConfigError(f"--rerank {where}: the model has no tokenizer files")
        self.pretrained, self.where = pretrained, where
        self.relevant = names.index(RELEVANT)
        self.max_length = min(max_length, pretrained.model.config.max_length)

    @classmethod
    def load(cls, directory: str | os.PathLike, *, device: Any = None, dtype: str = "float32",
             max_length: int = 256) -> Reranker:
        """The reranker in a model directory, placed on `device` (`bertology.device.place`)."""
        from bertology.device import place
        from bertology.model import load

        if not Path(directory).is_dir():
            raise ConfigError(f"--rerank {directory}: no such model directory")
        pretrained = load(directory)
        reranker = cls(pretrained, str(directory), max_length)
        place(pretrained, device, dtype)
        return reranker

    def score(self, query: str, passages: Sequence[str], batch_size: int = 32) -> np.ndarray:
        """The relevance score of each (query, passage) pair [P] (a query longer than the model reads is refused)."""
        from bertology.tasks.sequence import EncodedExamples, predict_logits

        if not passages:
            return np.zeros(0, dtype=np.float32)
        check_query_lengths(self.pretrained, [query], self.max_length)
        encoded = EncodedExamples.from_texts(self.pretrained.tokenizer, [query] * len(passages), list(passages),
                                             max_length=self.max_length, shuffle=False)
        logits = predict_logits(self.pretrained.model, encoded, batch_size=batch_size, head=CLASSIFIER)
        return logits[:, self.relevant] - logits[:, 1 - self.relevant]


def rerank_hits(reranker: Reranker, queries: Sequence[str], hits: Sequence[Sequence[Hit]], k: int,
                batch_size: int = 32) -> list[list[Hit]]:
    """Each query's first-stage `hits` re-scored by `reranker`, best first, the first `k` (`Hit.score`: the
    reranker's score)."""
    out: list[list[Hit]] = []
    for query, found in zip(queries, hits):
        scores = reranker.score(query, [h.text for h in found], batch_size)
        order = np.argsort(-scores, kind="stable")[:k]
        out.append([Hit(found[i].id, float(scores[i]), found[i].text, found[i].row) for i in order.tolist()])
    return out


def reranked(reranker: Reranker, index: Any, queries: Sequence[str], depth: int, rerank_depth: int, *,
             batch_size: int = 32, show_progress: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """The first stage's `rerank_depth` best passages of each query re-sorted by `reranker`, then the rest of the
    first stage's first `depth` in their order: scores and rows [Q, depth] (the rows past the reranked ones score
    -inf)."""
    if rerank_depth < 1:
        raise ConfigError(f"--rerank-depth must be a positive integer, got {rerank_depth}")
    _, rows = index.rank(list(queries), max(depth, rerank_depth), batch_size=batch_size, show_progress=show_progress)
    out_rows = np.full((len(queries), min(depth, rows.shape[1])), -1, dtype=np.int64)
    out_scores = np.full(out_rows.shape, -np.inf)
    for i, (query, ranked) in enumerate(zip(queries, rows)):
        head = [int(r) for r in ranked[:rerank_depth] if r >= 0]
        scores = reranker.score(query, [index.passages[r].text for r in head], batch_size)
        order = np.argsort(-scores, kind="stable")
        merged = [head[j] for j in order.tolist()] + [int(r) for r in ranked[rerank_depth:] if r >= 0]
        merged = merged[:out_rows.shape[1]]
        out_rows[i, :len(merged)] = merged
        out_scores[i, :len(order[:len(merged)])] = scores[order][:len(merged)]
    return out_scores, out_rows
