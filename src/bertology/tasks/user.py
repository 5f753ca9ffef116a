"""A user's own fine-tuning task, described by a task file instead of code.

A task file is a YAML or JSON mapping of :class:`~bertology.tasks.readers.TaskFileConfig` (at the top level or
under a ``task:`` key): the files' ``format`` (tsv, jsonl, conll), the ``text`` / ``text_pair`` / ``label``
columns, ``header``, the ``kind`` (classification, regression, tagging), the ``metric``, the ``labels`` and the
``train`` / ``dev`` files (relative paths are taken from the task file's folder). Wherever a task name is taken
(``bertology finetune --task``, ``bertology predict --task``, ``task.name`` in a run config) the path of such a
file may stand instead (:func:`bertology.tasks.base.get_task`); ``task.data`` is then not needed.

- classification and regression reuse the GLUE machinery (``bertology.tasks.sequence``): the family's
  ``*ForSequenceClassification`` head, cross-entropy or mean squared error. Metrics: ``accuracy``, ``f1`` (of the
  second label when there are two, e.g. ``1`` of ``0``/``1`` or the second of ``labels``; macro-F1 over the labels
  otherwise), ``mcc`` for classification (default ``accuracy``); ``pearson``, ``spearman`` for regression (default
  ``pearson``). Predictions: a tsv ``index<TAB>prediction``, the index being the example's data row number
  (0-based, header excluded; jsonl: the non-blank line number).
- tagging reuses ``bertology.tasks.tagging``: the token-classification head on first subwords, BIO tags, conlleval
  (``f1``, ``precision``, ``recall``; default ``f1``); predictions in conlleval's format (each token's columns,
  the gold and the predicted tag).

The metric named by the file selects the model; the other metrics of its kind are reported beside it. Without
``labels`` the label names are those of the train file (sorted; numerically when all are integers; for tagging
the entity types), read once; a dev or predicted label outside them is a DataError naming the file and the line.
When the train file is missing (predicting with a model moved elsewhere) the model's own ``id2label`` is used.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bertology.errors import ConfigError, DataError
from bertology.io import atomic_write
from bertology.model.config import TransformerConfig
from bertology.model.heads import HeadSpec
from bertology.model.protocol import Model
from bertology.objectives.base import Objective
from bertology.tasks import metrics
from bertology.tasks.examples import LabelSet, TaggedSentence, TextExample
from bertology.tasks.readers import TaskFileConfig, read_task_file
from bertology.tasks.sequence import (
    EncodedExamples,
    SequenceClassification,
    SequenceRegression,
    classifier_head,
    predict_logits,
)
from bertology.tasks.tagging import (
    CRFTagging,
    TokenClassification,
    bio_constraints,
    bio_labels,
    conlleval_lines,
    encode_tagged,
    predict_word_labels,
    token_classifier_head,
)
from bertology.tokenization import Tokenizer

__all__ = ["KIND_METRICS", "TASK_FILE_SUFFIXES", "UserTask", "is_task_file", "load_task_file"]

TASK_FILE_SUFFIXES = (".yaml", ".yml", ".json")
KIND_METRICS: dict[str, tuple[str, ...]] = {
    "classification": ("accuracy", "f1", "mcc"),
    "regression": ("pearson", "spearman"),
    "tagging": ("f1", "precision", "recall"),
}


def is_task_file(name: str | os.PathLike) -> bool:
    """Whether a task name is the path of a task file (it ends in .yaml, .yml or .json)."""
    return str(name).lower().endswith(TASK_FILE_SUFFIXES)


_LOADED: dict[tuple[str, int, int], UserTask] = {}


def load_task_file(path: str | os.PathLike) -> UserTask:
    """The :class:`UserTask` of a task file; errors are ConfigErrors naming the file (and the key). A file is read
    again only when it changed (a run asks for its task several times)."""
    from bertology.training.config import read_config_file

    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"task.name: {path}: no such task file" if not path.exists() else
                          f"task.name: {path}: not a regular file")
    stat = path.stat()
    key = (str(path.resolve()), stat.st_mtime_ns, stat.st_size)
    if key not in _LOADED:
        data = read_config_file(path)
        if set(data) == {"task"} and isinstance(data["task"], dict):
            data = data["task"]
        try:
            config = TaskFileConfig.from_dict(data, "task")
        except ConfigError as error:
            raise ConfigError(f"{path}: {str(error).replace('TaskFileConfig', 'task')}") from None
        _LOADED[key] = UserTask(config, path)
    return _LOADED[key]


class UserTask:
    """A :class:`~bertology.tasks.base.FinetuneTask` built from a :class:`TaskFileConfig`; ``source`` is the task
    file (relative train/dev paths are taken from its folder, and errors name it)."""

    def __init__(self, config: TaskFileConfig, source: str | os.PathLike) -> None:
        self.config = config
        self.source = Path(source)
        self.root = self.source.resolve().parent
        self.name = self.source.stem
        self.kind: str = config.kind  # type: ignore[assignment]
        known = KIND_METRICS[self.kind]
        metric = config.metric or known[0]
        if metric not in known:
            raise ConfigError(f"{self.source}: task.metric: a {self.kind} task is scored by "
                              f"{', '.join(known)}; got {metric!r}")
        if config.label is None:
            raise ConfigError(f"{self.source}: task.label: required to fine-tune (the column of the labels)")
        self.metrics = (metric, *(name for name in known if name != metric))
        self.predictions_file = "dev_predictions.conll" if self.kind == "tagging" else "dev_predictions.tsv"
        self._labels: LabelSet | None = None
        if config.labels is not None:
            self._labels = bio_labels(config.labels) if self.kind == "tagging" else LabelSet(config.labels)

    # ---------------------------------------------------------------------------------------------- files
    def path(self, data: str | None, split: str) -> Path:
        """The task file's ``train`` / ``dev`` file (``data`` is not used)."""
        value = getattr(self.config, split, None) if split in ("train", "dev") else None
        if value is None:
            raise ConfigError(f"{self.source}: task.{split}: no file given for the {split} split")
        path = Path(value)
        return path if path.is_absolute() else self.root / path

    def _labels_from_train(self) -> LabelSet:
        if self.config.train is None:
            raise ConfigError(f"{self.source}: task.labels: required when there is no train file")
        examples = list(read_task_file(self.config, "train", self.root))
        if self.kind == "tagging":
            types = {tag[2:] for sentence in examples for tag in sentence.tags or () if tag != "O"}  # type: ignore[union-attr]
            if not types:
                raise DataError(f"{self.path(None, 'train')}: no entity tags (every tag is O)")
            return bio_labels(LabelSet.from_labels(types).names)
        return LabelSet.from_labels(str(example.label) for example in examples)  # type: ignore[union-attr]

    def label_set(self) -> LabelSet | None:
        """The label ids (tagging: the BIO tags), None for regression; from the train file unless configured."""
        if self.kind == "regression":
            return None
        if self._labels is None:
            self._labels = self._labels_from_train()
        return self._labels

    def _reader_labels(self) -> list[str] | None:
        """What the reader checks every label against: the class names, or the entity types for tagging."""
        labels = self.label_set()
        if labels is None:
            return None
        if self.kind == "tagging":
            return [name[2:] for name in labels.names if name.startswith("B-")]
        return list(labels.names)

    def read(self, path: Path, limit: int | None = None) -> list[TextExample] | list[TaggedSentence]:
        """The examples of ``path`` in the task file's layout (the first ``limit``); a label outside the task's is
        a DataError naming the file and the line."""
        config = replace(self.config, train=str(Path(path).resolve()), labels=self._reader_labels())
        examples: list[Any] = []
        for example in read_task_file(config, "train"):
            if limit is not None and len(examples) >= limit:
                break
            examples.append(example)
        return examples

    def label_names(self) -> tuple[str, ...] | None:
        labels = self.label_set()
        return None if labels is None else labels.names

    # ----------------------------------------------------------------------------------------------- model
    def heads(self, config: TransformerConfig) -> list[HeadSpec]:
        if self._labels is None and self.kind != "regression" and not self.path(None, "train").is_file() \
                and isinstance(config.extra.get("id2label"), dict):  # predicting with a model whose train file is gone
            id2label = config.extra["id2label"]
            self._labels = LabelSet(id2label[key] for key in sorted(id2label, key=int))
        if self.kind == "tagging":
            return [token_classifier_head(config, len(self.label_set()))]  # type: ignore[arg-type]
        names = self.label_names()
        return [classifier_head(config, len(names) if names is not None else 1)]

    def objectives(self, heads: Sequence[HeadSpec]) -> list[Objective]:
        if self.kind == "tagging":
            return [CRFTagging(heads[0]) if heads[0].kind == "bilstm_crf" else TokenClassification(heads[0])]
        return [SequenceRegression(heads[0]) if self.kind == "regression" else SequenceClassification(heads[0])]

    def _label_tensor(self, examples: Sequence[TextExample]) -> torch.Tensor | None:
        if not examples or examples[0].label is None:
            return None
        labels = self.label_set()
        if labels is None:
            return torch.tensor([float(e.label) for e in examples], dtype=torch.float32)  # type: ignore[arg-type]
        return torch.tensor([labels.index(str(e.label), f"row {e.id}") for e in examples], dtype=torch.long)

    def encode(self, tokenizer: Tokenizer, examples: Sequence[Any], max_length: int, *, train: bool,
               seed: int = 0) -> EncodedExamples:
        if self.kind == "tagging":
            return encode_tagged(tokenizer, examples, self.label_set(), max_length,  # type: ignore[arg-type]
                                 shuffle=train, seed=seed)
        pairs = [e.text_pair or "" for e in examples] if self.config.text_pair is not None else None
        return EncodedExamples.from_texts(tokenizer, [e.text for e in examples], pairs, self._label_tensor(examples),
                                          max_length=max_length, shuffle=train, seed=seed)

    def predict(self, model: Model, encoded: EncodedExamples, examples: Sequence[Any],
                batch_size: int) -> list[Any]:
        labels = self.label_set()
        if self.kind == "tagging":
            if getattr(encoded, "words", None) != [len(s) for s in examples]:
                raise DataError(f"{self.name}: the encoded examples are not these sentences")
            return [[labels.names[i] for i in ids.tolist()]  # type: ignore[union-attr]
                    for ids in predict_word_labels(model, encoded, batch_size,  # type: ignore[arg-type]
                                                   constraints=bio_constraints(labels))]  # type: ignore[arg-type]
        logits = predict_logits(model, encoded, batch_size=batch_size)
        if labels is None:
            return [float(v) for v in logits[:, 0].tolist()]
        return [labels.names[i] for i in np.asarray(logits).argmax(1).tolist()]

    # ------------------------------------------------------------------------------------------- scoring
    def _f1(self, gold: Sequence[Any], predicted: Sequence[Any]) -> float:
        names = self.label_set().names  # type: ignore[union-attr]
        if len(names) == 2:
            return metrics.f1_binary(gold, predicted, positive=names[1])
        return float(np.mean([metrics.f1_binary(gold, predicted, positive=name) for name in names]))

    def _text_scores(self, gold: Sequence[Any], predicted: Sequence[Any]) -> dict[str, float]:
        functions = {"accuracy": metrics.accuracy, "f1": self._f1, "mcc": metrics.matthews_corrcoef,
                     "pearson": metrics.pearson, "spearman": metrics.spearman}
        return {name: 100 * functions[name](list(gold), list(predicted)) for name in self.metrics}

    def scores(self, predictions: Sequence[Any], examples: Sequence[Any]) -> dict[str, float]:
        if self.kind == "tagging":
            result = metrics.conlleval([list(zip(s.tags or (), p, strict=True)) for s, p in
                                        zip(examples, predictions, strict=True)])
            return {name: getattr(result, name) for name in self.metrics}
        return self._text_scores([e.label for e in examples], predictions)

    def write(self, path: Path, predictions: Sequence[Any], examples: Sequence[Any]) -> None:
        with atomic_write(path, "w", encoding="utf-8") as handle:
            if self.kind == "tagging":
                for line in conlleval_lines(predictions, examples):
                    handle.write(line + "\n")
                return
            handle.write("index\tprediction\n")
            for example, prediction in zip(examples, predictions, strict=True):
                text = f"{prediction:.6g}" if isinstance(prediction, float) else str(prediction)
                handle.write(f"{example.id}\t{text}\n")

    def evaluate(self, predictions_path: Path, gold_path: Path) -> dict[str, Any]:
        """Tagging: conlleval of the predictions file (the gold tags are in it). Text: the predictions tsv against
        the gold file (read as the task reads its files), one prediction per gold example; NaN scores (a constant
        side of a correlation) are None."""
        if self.kind == "tagging":
            return metrics.evaluate_files("conll", predictions_path)
        gold = [example.label for example in self.read(Path(gold_path))]
        predicted = self._read_predictions(Path(predictions_path), len(gold), Path(gold_path))
        return {name: (value if math.isfinite(value) else None)
                for name, value in self._text_scores(gold, predicted).items()}

    def _read_predictions(self, path: Path, count: int, gold: Path) -> list[Any]:
        rows = metrics._tsv_rows(path)
        if rows[0][1] != ["index", "prediction"]:
            raise DataError(f"{path}:1: the header must be 'index<TAB>prediction'")
        labels = self.label_set()
        predicted: list[Any] = [None] * count
        for number, fields in rows[1:]:
            if len(fields) != 2:
                raise DataError(f"{path}:{number}: {len(fields)} columns, expected 2 (index, prediction)")
            index_text, text = fields
            if not index_text.isascii() or not index_text.isdigit():
                raise DataError(f"{path}:{number}: index {index_text!r} is not a non-negative integer")
            index = int(index_text)
            if index >= count:
                raise DataError(f"{path}:{number}: index {index} is out of range: {gold} has {count} examples")
            if predicted[index] is not None:
                raise DataError(f"{path}:{number}: index {index} is repeated")
            if labels is None:
                try:
                    value: Any = float(text)
                except ValueError:
                    value = math.nan
                if not math.isfinite(value):
                    raise DataError(f"{path}:{number}: {text!r} is not a number")
            else:
                labels.index(text, f"{path}:{number}")
                value = text
            predicted[index] = value
        missing = [index for index, value in enumerate(predicted) if value is None]
        if missing:
            shown = ", ".join(map(str, missing[:5])) + (", ..." if len(missing) > 5 else "")
            raise DataError(f"{path}: no prediction for {len(missing)} of {count} examples of {gold}: index {shown}")
        return predicted
