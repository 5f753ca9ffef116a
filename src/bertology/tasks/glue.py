"""The GLUE tasks as fine-tuning tasks: SST-2 and CoLA (single sentences), MRPC and RTE (pairs), STS-B (pairs,
regression). Files, labels and metrics follow ``bertology.tasks.readers.GLUE_TASKS``; predictions are the
``index<TAB>prediction`` tsv that ``bertology evaluate`` reads."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bertology.io import atomic_write
from bertology.model.checkpoint import HEADS
from bertology.model.config import TransformerConfig
from bertology.model.heads import HeadSpec
from bertology.model.protocol import Model
from bertology.objectives.base import Objective
from bertology.tasks import metrics
from bertology.tasks.base import register_task
from bertology.tasks.examples import TextExample
from bertology.tasks.readers import GLUE_TASKS, GlueTask, read_glue
from bertology.tasks.sequence import (
    CLASSIFIER,
    EncodedExamples,
    SequenceClassification,
    SequenceRegression,
    classifier_head,
    predict_logits,
)
from bertology.tokenization import Tokenizer


class GlueFinetuneTask:
    """One GLUE task (see the module docstring)."""

    predictions_file = "dev_predictions.tsv"

    def __init__(self, spec: GlueTask) -> None:
        self.spec = spec
        self.name = spec.name
        self.metrics = spec.metrics

    def path(self, data: str, split: str) -> Path:
        return self.spec.path(data, split)

    def read(self, path: Path, limit: int | None = None) -> list[TextExample]:
        examples: list[TextExample] = []
        for example in read_glue(self.name, path):
            if limit is not None and len(examples) >= limit:
                break
            examples.append(example)
        return examples

    def label_names(self) -> tuple[str, ...] | None:
        return self.spec.labels.names if self.spec.labels is not None else None

    def config_label_names(self) -> tuple[str, ...] | None:
        """What the labels mean (SST-2: negative, positive), for config.json's ``id2label``; the file's labels
        when they are names already (RTE)."""
        return self.spec.names if self.spec.names is not None else self.label_names()

    def heads(self, config: TransformerConfig) -> list[HeadSpec]:
        names = self.label_names()
        return [classifier_head(config, len(names) if names is not None else 1)]

    def objectives(self, heads: Sequence[HeadSpec]) -> list[Objective]:
        return [SequenceRegression(heads[0]) if self.spec.labels is None else SequenceClassification(heads[0])]

    def labels(self, examples: Sequence[TextExample]) -> torch.Tensor | None:
        if not examples or examples[0].label is None:
            return None
        if self.spec.labels is None:
            return torch.tensor([float(e.label) for e in examples], dtype=torch.float32)  # type: ignore[arg-type]
        return torch.tensor([self.spec.labels.index(str(e.label), f"row {e.id}") for e in examples],
                            dtype=torch.long)

    def encode(self, tokenizer: Tokenizer, examples: Sequence[TextExample], max_length: int, *, train: bool,
               seed: int = 0) -> EncodedExamples:
        pairs = [e.text_pair or "" for e in examples] if self.spec.text_pair is not None else None
        return EncodedExamples.from_texts(tokenizer, [e.text for e in examples], pairs, self.labels(examples),
                                          max_length=max_length, shuffle=train, seed=seed)

    def for_model(self, model: Model) -> Any:
        """On an encoder-decoder whose family has no sequence classifier (T5), the task as text-to-text
        (``bertology.tasks.text_to_text``); else the task itself."""
        from bertology.model.transformer import Seq2SeqModel
        from bertology.tasks.text_to_text import GlueTextToText, start_token

        if isinstance(model, Seq2SeqModel) and CLASSIFIER not in HEADS.get(model.config.family, {}):
            return GlueTextToText(self, start_token(model))
        return self

    def predict(self, model: Model, encoded: EncodedExamples, examples: Sequence[TextExample],
                batch_size: int) -> list[Any]:
        logits = predict_logits(model, encoded, batch_size=batch_size)
        if self.spec.labels is None:
            return [float(v) for v in logits[:, 0].tolist()]
        return [self.spec.labels.names[i] for i in np.asarray(logits).argmax(1).tolist()]

    def scores(self, predictions: Sequence[Any], examples: Sequence[TextExample]) -> dict[str, float]:
        gold = [e.label for e in examples]
        functions = {
            "accuracy": metrics.accuracy,
            "mcc": metrics.matthews_corrcoef,
            "pearson": metrics.pearson,
            "spearman": metrics.spearman,
            "f1": lambda g, p: metrics.f1_binary(g, p, positive=self.spec.labels.names[1]),  # type: ignore[union-attr]
        }
        return {name: 100 * functions[name](gold, list(predictions)) for name in self.metrics}

    def write(self, path: Path, predictions: Sequence[Any], examples: Sequence[TextExample]) -> None:
        with atomic_write(path, "w", encoding="utf-8") as handle:
            handle.write("index\tprediction\n")
            for example, prediction in zip(examples, predictions, strict=True):
                text = f"{prediction:.6g}" if isinstance(prediction, float) else str(prediction)
                handle.write(f"{example.id}\t{text}\n")

    def evaluate(self, predictions_path: Path, gold_path: Path) -> dict[str, Any]:
        return metrics.evaluate_files(self.name, predictions_path, gold=gold_path)


for _spec in GLUE_TASKS.values():
    register_task(GlueFinetuneTask(_spec))
