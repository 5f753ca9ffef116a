"""The GLUE tasks as fine-tuning tasks: SST-2 and CoLA (single sentences), MRPC and RTE (pairs), STS-B (pairs,
regression). Files, labels and metrics follow ``bertology.tasks.readers.GLUE_TASKS``; predictions are the
``index<TAB>prediction`` tsv that ``bertology evaluate`` reads."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bertology.errors import ConfigError
from bertology.io import atomic_write
from bertology.model.checkpoint import HEADS, TEXT_TO_TEXT
from bertology.model.config import TransformerConfig
from bertology.model.heads import HeadSpec
from bertology.model.protocol import Model
from bertology.objectives.base import Objective
from bertology.tasks import metrics
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

    def for_model(self, model: Model, text_to_text: bool | None = None) -> Any:
        """The task as text-to-text (``bertology.tasks.text_to_text``) or through the family's sequence classifier
        (the task itself). ``text_to_text`` (``task.text_to_text``) chooses on an encoder-decoder; None: the
        classifier where the model has one already (a fine-tuned classifier), else text-to-text where the family
        has no classifier or fine-tunes as text-to-text (``TEXT_TO_TEXT``: T5), else the classifier (BART)."""
        from bertology.model.protocol import ENCODER_DECODER, capabilities
        from bertology.tasks.text_to_text import GlueTextToText, start_token

        family = model.config.family
        has_classifier = CLASSIFIER in HEADS.get(family, {})
        if ENCODER_DECODER not in capabilities(model):
            if text_to_text:
                raise ConfigError(f"task.text_to_text: true generates the labels with an encoder-decoder (T5, "
                                  f"BART); this is a {type(model).__name__} of the {family} family")
            return self
        if text_to_text is None:
            fine_tuned = any(spec.name == CLASSIFIER for spec in model.head_specs)
            text_to_text = not has_classifier or (TEXT_TO_TEXT.get(family, False) and not fine_tuned)
        if text_to_text:
            return GlueTextToText(self, start_token(model))
        if not has_classifier:
            raise ConfigError(f"task.text_to_text: false needs a sequence classifier, which the {family} family "
                              "does not have; it runs GLUE as text-to-text")
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


SST2, COLA, MRPC, RTE, STSB = (GlueFinetuneTask(GLUE_TASKS[name]) for name in ("sst2", "cola", "mrpc", "rte", "stsb"))
