"""A cross-encoder reranker (monoBERT, Nogueira and Cho 2019) as a fine-tuning task: ``rerank``.

The data are the retriever's (`bertology.retrieval.retriever_task`: SQuAD split by article with BM25 hard negatives, or
``train.jsonl``/``dev.jsonl`` pairs): every (query, positive) pair is labelled ``relevant`` and every (query, hard
negative) pair ``irrelevant``, each read as one ``[CLS] query [SEP] passage [SEP]`` sequence (the passage cut to
fit ``task.max_length``, 256) by a two-label classifier. ``rerank`` reads the pair's two segments in the last layer
(head kind ``segment_cosine``: the log-odds of ``relevant`` is a learned scale times the cosine of the query's
tokens' mean and the passage's tokens' mean, plus a learned bias) for a model with token types; ``rerank-cls``, and
``rerank`` on a model without token types, read [CLS] through the family's sequence classifier (monoBERT's own head).
A passage's score at search time is the classifier's log-odds of ``relevant``: logit(relevant) - logit(irrelevant)
(`bertology.retrieval.rerank`). Dev metric: the accuracy of the pairs (x100); predictions are the GLUE-style
``index<TAB>prediction`` tsv.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bertology.errors import DataError
from bertology.io import atomic_write
from bertology.model.heads import HeadSpec
from bertology.tasks.examples import TextExample
from bertology.retrieval.retriever_task import RetrievalTask
from bertology.tasks.sequence import (
    CLASSIFIER,
    EncodedExamples,
    SequenceClassification,
    classifier_head,
    predict_logits,
)

LABELS = ("irrelevant", "relevant")


def pairs_of(examples: Sequence[Any]) -> list[TextExample]:
    """The labelled (query, passage) pairs of retrieval examples: the positive, then each hard negative."""
    pairs: list[TextExample] = []
    for example in examples:
        pairs.append(TextExample(f"{example.id}:positive", example.query, example.positive, LABELS[1]))
        pairs.extend(TextExample(f"{example.id}:negative-{j}", example.query, negative, LABELS[0])
                     for j, negative in enumerate(example.negatives))
    return pairs


class RerankTask:
    """``finetune --task rerank`` (see the module docstring)."""

    metrics = ("accuracy",)
    predictions_file = "dev_predictions.tsv"
    max_length = 256

    def __init__(self, name: str = "rerank", head: str = "segments", hard_negatives: int = 1) -> None:
        self.name, self.head = name, head
        self.source = RetrievalTask(hard_negatives=hard_negatives)

    def path(self, data: str, split: str) -> Path:
        return self.source.path(data, split)

    def read(self, path: Path, limit: int | None = None) -> list[TextExample]:
        pairs = pairs_of(self.source.read(path, limit))
        if not any(p.label == LABELS[0] for p in pairs):
            raise DataError(f"{path}: no negative passages to tell the positives from (give 'negatives', or more "
                            f"than one paragraph)")
        return pairs

    def label_names(self) -> tuple[str, ...]:
        return LABELS

    def heads(self, config: Any) -> list[HeadSpec]:
        # Measured on SQuAD part A's held-out articles (docs/RETRIEVAL.md, "Reranking"): all-MiniLM-L6-v2 with
        # monoBERT's [CLS] head stays at chance (loss ln 2, pair accuracy 48 to 50) after 40 to 120 steps at lr 3e-5
        # to 3e-4, pointwise or softmax over each question's pair; a logistic probe of its frozen [CLS] / pooler
        # separates a question's paragraph from its BM25 negative for 60 / 54 % of the dev questions, while the
        # cosine of the two segments' token means in the same joint pass, untrained, does for 75 %: a sentence-
        # embedding model's relevance is in its mean vectors, so the reranker reads them and starts there.
        if self.head == "segments" and getattr(config, "type_vocab_size", 0) >= 2:
            return [HeadSpec(CLASSIFIER, "segment_cosine", num_labels=len(LABELS))]
        return [classifier_head(config, len(LABELS))]

    def objectives(self, heads: Sequence[HeadSpec]) -> list[SequenceClassification]:
        return [SequenceClassification(heads[0])]

    def encode(self, tokenizer: Any, examples: Sequence[TextExample], max_length: int, *, train: bool,
               seed: int = 0) -> EncodedExamples:
        labels = torch.tensor([LABELS.index(str(e.label)) for e in examples], dtype=torch.long)
        return EncodedExamples.from_texts(tokenizer, [e.text for e in examples], [e.text_pair or "" for e in examples],
                                          labels, max_length=max_length, shuffle=train, seed=seed)

    def predict(self, model: Any, encoded: EncodedExamples, examples: Sequence[TextExample],
                batch_size: int) -> list[str]:
        logits = predict_logits(model, encoded, batch_size=batch_size)
        return [LABELS[i] for i in np.asarray(logits).argmax(1).tolist()]

    def scores(self, predictions: Sequence[str], examples: Sequence[TextExample]) -> dict[str, float]:
        if not examples:
            raise DataError("no pairs to score")
        return {"accuracy": 100.0 * sum(p == e.label for p, e in zip(predictions, examples, strict=True))
                / len(examples)}

    def write(self, path: Path, predictions: Sequence[str], examples: Sequence[TextExample]) -> None:
        with atomic_write(path, "w", encoding="utf-8") as handle:
            handle.write("index\tprediction\n")
            for example, prediction in zip(examples, predictions, strict=True):
                handle.write(f"{example.id}\t{prediction}\n")

    def evaluate(self, predictions_path: Path, gold_path: Path | None) -> dict[str, Any]:
        from bertology.data.corpus import read_lines

        rows: dict[str, str] = {}
        for number, line in read_lines(Path(predictions_path), "utf-8"):
            if number == 1 or not line.strip():
                continue
            key, _, label = line.rstrip("\n").partition("\t")
            if label not in LABELS:
                raise DataError(f"{predictions_path}: line {number}: prediction {label!r} is none of "
                                f"{', '.join(LABELS)}")
            rows[key] = label
        if gold_path is None:
            raise DataError("rerank: the gold file (the task's dev data) is needed to score the predictions")
        gold = self.read(Path(gold_path))
        missing = [e.id for e in gold if e.id not in rows]
        if missing:
            raise DataError(f"{predictions_path}: no prediction for pair {missing[0]!r} (and {len(missing) - 1} more)")
        return {**self.scores([rows[e.id] for e in gold], gold), "pairs": len(gold)}


RERANK = RerankTask()  # registered from bertology.builtins
RERANK_CLS = RerankTask("rerank-cls", head="cls")
