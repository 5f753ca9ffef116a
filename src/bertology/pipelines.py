"""Pipelines: raw text in, answers out, for the tasks a model directory is fine-tuned (or pretrained) for.

``bertology.pipeline(task, model)`` loads a model directory (or takes a loaded `Pretrained`) and returns a
`Pipeline`, called on one input or a list of them. Each task reuses the library's own implementation:

- ``text-classification`` (alias ``sentiment-analysis``): a text or a (text, text_pair) pair -> the `top_k` labels
  of config.json's ``id2label`` with their softmax probabilities, best first (a one-output regression head: its
  value as ``score``). Examples are encoded as fine-tuning encodes them (`bertology.tasks.sequence`).
- ``token-classification`` (alias ``ner``): a text -> its entities, with character offsets into the text as given
  and scores. `aggregation`: ``none`` (every token not tagged O, with its tag), ``simple`` (adjacent tokens of one
  type grouped, a ``B-`` tag starting a new entity), ``first``/``average``/``max`` (one label per word of the
  tokenizer's pre-tokenisation: its first token's, the average of its tokens' probabilities, its most confident
  token's; then grouped as ``simple``). Grouping reads the tags as BIO repaired: an ``I-X`` that follows neither
  ``B-X`` nor ``I-X`` starts an entity, so every entity is a valid BIO span. Texts longer than the model's
  positions run in overlapping windows, each token's logits taken from the window where it has the most context
  (`bertology.embeddings.windows`).
- ``question-answering``: ``{"question", "context"}`` -> ``{"answer", "score", "start", "end"}``: the SQuAD task's
  windows over long contexts (`doc_stride`) and its n-best span search (`bertology.tasks.qa`); ``score`` is the
  span's start probability times its end probability, softmax over the context tokens of its window and the
  position a window without the answer points at (an empty answer when no window has a valid span).
- ``fill-mask``: a text with the tokenizer's mask token -> per mask, the `top_k` fillings
  (`bertology.objectives.fill_mask`).
- ``text-generation``: a text -> ``{"generated_text"}`` (`bertology.generation`; a decoder's prompt and its
  continuation, an encoder-decoder's output).
- ``feature-extraction``: a text -> its sentence vector (`bertology.embed`, with a sentence-transformers
  directory's own settings; `options` are embed's).

Inputs are batched by length and run on the padding-free path (the models pack the real tokens), on `device`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from bertology.errors import ConfigError, InputError
from bertology.model import GENERATES, Pretrained, capabilities

TASKS = ("text-classification", "token-classification", "question-answering", "fill-mask", "text-generation",
         "feature-extraction")
ALIASES = {"sentiment-analysis": "text-classification", "ner": "token-classification",
           "qa": "question-answering", "text2text-generation": "text-generation", "generation": "text-generation",
           "embedding": "feature-extraction"}
AGGREGATIONS = ("none", "simple", "first", "average", "max")
# The fields of an input object, per task (JSONL lines, or mappings given to a pipeline).
FIELDS = {"text-classification": ("text", "text_pair"), "token-classification": ("text",),
          "question-answering": ("question", "context"), "fill-mask": ("text",), "text-generation": ("text",),
          "feature-extraction": ("text",)}
REQUIRED = {"text-classification": ("text",), "question-answering": ("question", "context")}

CLASSIFIER = "classifier"
TOKEN_CLASSIFIER = "token_classifier"
QA = "qa"


def task_name(task: str) -> str:
    """The pipeline task `task` names (an alias resolved), or a ConfigError listing them."""
    key = str(task).strip().lower()
    key = ALIASES.get(key, key)
    if key not in TASKS:
        raise ConfigError(f"task: unknown pipeline task {task!r}; expected one of {', '.join(TASKS)} (or "
                          f"{', '.join(ALIASES)})")
    return key


def model_task(pretrained: Pretrained) -> str:
    """The task a model is for, read from its heads (config.json's architecture): a sequence classifier, a token
    classifier, a QA head; else a decoder or an encoder-decoder generates, a masked-LM head fills masks, and any
    other model extracts features."""
    heads = pretrained.model.heads
    for head, task in ((CLASSIFIER, "text-classification"), (TOKEN_CLASSIFIER, "token-classification"),
                       (QA, "question-answering")):
        if head in heads:
            return task
    if GENERATES in capabilities(pretrained.model):
        return "text-generation"
    if "mlm" in heads:
        return "fill-mask"
    return "feature-extraction"


def label_names(pretrained: Pretrained, head: str) -> list[str]:
    """The head's label names in id order: config.json's ``id2label``, else ``LABEL_i``."""
    spec = next(spec for spec in pretrained.model.head_specs if spec.name == head)
    id2label = pretrained.model.config.extra.get("id2label") if isinstance(
        getattr(pretrained.model.config, "extra", None), dict) else None
    names = [f"LABEL_{i}" for i in range(spec.num_labels)]
    if isinstance(id2label, Mapping):
        for key, name in id2label.items():
            try:
                index = int(key)
            except (TypeError, ValueError):
                continue
            if 0 <= index < spec.num_labels and isinstance(name, str):
                names[index] = name
    return names


def pipeline(task: str | None = None, model: str | os.PathLike | Pretrained | None = None, *,
             device: str | torch.device | None = None, dtype: str = "float32", batch_size: int = 32,
             **options: Any) -> Pipeline:
    """A `Pipeline` for `task` (None: the model's own, `model_task`) over `model` (a model directory or a loaded
    `Pretrained`), moved to `device` (None: where it is; "auto", "cpu", "cuda", "cuda:N") and run in `dtype`
    ("float16"/"bfloat16" under autocast on a GPU). `options` are the task's defaults for every call (`top_k`,
    `aggregation`, `doc_stride`, `max_answer_length`, `max_length`, `max_new_tokens`, ...; see `Pipeline`)."""
    from bertology.device import place
    from bertology.model import load

    if model is None:
        raise ConfigError("pipeline: model is required (a model directory or a loaded Pretrained)")
    pretrained = model if isinstance(model, Pretrained) else load(model)
    name = model_task(pretrained) if task is None else task_name(task)
    placement = place(pretrained, device, dtype)
    result = Pipeline(name, pretrained, placement, batch_size)
    result.check_model()
    result.defaults = result.check_options(options)
    return result


@dataclass
class Pipeline:
    """A task over one model; call it on an input or a list of inputs (a list gives a list of results).

    Inputs: a string (the text), or a mapping with the task's fields (text-classification: ``text`` and
    ``text_pair``; question-answering: ``question`` and ``context``; the others: ``text``); a (text, text_pair)
    tuple for text-classification. Options (given to `pipeline` as defaults, or to a call): text-classification
    ``top_k`` (1; None: all labels), ``max_length``; token-classification ``aggregation`` ("simple"),
    ``ignore_labels`` (("O",)), ``stride``; question-answering ``doc_stride`` (128), ``max_question_length``
    (64), ``max_answer_length`` (15), ``n_best`` (20), ``max_length`` (384); fill-mask ``top_k`` (5),
    ``max_new_tokens``; text-generation `bertology.generate`'s (``max_new_tokens``, ``num_beams``, ``do_sample``,
    ...); feature-extraction `bertology.embed`'s."""

    task: str
    pretrained: Pretrained
    placement: Any
    batch_size: int = 32
    defaults: dict[str, Any] = field(default_factory=dict)

    OPTIONS = {
        "text-classification": {"top_k": 1, "max_length": None},
        "token-classification": {"aggregation": "simple", "ignore_labels": ("O",), "stride": None},
        "question-answering": {"doc_stride": 128, "max_question_length": 64, "max_answer_length": 15, "n_best": 20,
                               "max_length": 384},
        "fill-mask": {"top_k": 5, "max_new_tokens": 20},
        "text-generation": None,  # generate's keyword arguments
        "feature-extraction": None,  # embed's keyword arguments
    }

    @property
    def model(self) -> Any:
        return self.pretrained.model

    @property
    def tokenizer(self) -> Any:
        return self.pretrained.tokenizer

    def check_model(self) -> None:
        """A ConfigError when the model cannot run this task (it lacks the head, or a tokenizer)."""
        if self.tokenizer is None or not hasattr(self.tokenizer, "encode"):
            raise ConfigError(f"{self._where()}: no tokenizer files next to the model; a pipeline reads text")
        need = {"text-classification": CLASSIFIER, "token-classification": TOKEN_CLASSIFIER,
                "question-answering": QA}.get(self.task)
        if need is not None and need not in self.model.heads:
            raise ConfigError(f"{self._where()}: the model has no {need!r} head for {self.task} (heads: "
                              f"{', '.join(self.model.heads) or 'none'}); fine-tune it for the task first")
        if self.task == "token-classification" and hasattr(self.model.heads[TOKEN_CLASSIFIER], "decode"):
            raise ConfigError(f"{self._where()}: a BiLSTM-CRF tagger decodes whole word sequences; tag CoNLL "
                              f"files with `bertology predict --task conll2003`")

    def _where(self) -> str:
        return str(self.pretrained.directory) if self.pretrained.directory is not None else "the model"

    def check_options(self, options: Mapping[str, Any]) -> dict[str, Any]:
        known = self.OPTIONS[self.task]
        if known is None:  # generate's or embed's keyword arguments, checked there
            return {**self.defaults, **options}
        unknown = sorted(set(options) - set(known))
        if unknown:
            raise ConfigError(f"{self.task}: unknown option {unknown[0]!r}; expected one of {', '.join(known)}")
        merged = {**known, **self.defaults, **options}
        if self.task == "token-classification" and merged["aggregation"] not in AGGREGATIONS:
            raise ConfigError(f"aggregation: unknown {merged['aggregation']!r}; expected one of "
                              f"{', '.join(AGGREGATIONS)}")
        for key in ("top_k",):
            value = merged.get(key)
            if key in merged and value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                                        or value < 1):
                raise ConfigError(f"{key} must be a positive integer or None, got {value!r}")
        return merged

    # ------------------------------------------------------------------------------------------------ calling
    def __call__(self, inputs: Any, **options: Any) -> Any:
        single = isinstance(inputs, (str, Mapping)) or (isinstance(inputs, tuple) and self.task ==
                                                         "text-classification")
        items = [self.item(value, f"input {i}") for i, value in enumerate([inputs] if single else list(inputs))]
        results = self.run(items, **options)
        return results[0] if single else results

    def item(self, value: Any, where: str) -> dict[str, Any]:
        """One input as a mapping of the task's fields; an InputError naming `where` when it does not fit."""
        fields = FIELDS[self.task]
        if isinstance(value, str):
            if self.task == "question-answering":
                raise InputError(f"{where}: question-answering takes a question and a context, "
                                 f'{{"question": ..., "context": ...}}, not a string')
            return {"text": value}
        if isinstance(value, tuple) and self.task == "text-classification" and len(value) == 2:
            value = {"text": value[0], "text_pair": value[1]}
        if not isinstance(value, Mapping):
            raise InputError(f"{where}: expected a string or an object with {', '.join(fields)}, got "
                             f"{type(value).__name__}")
        unknown = sorted(set(value) - set(fields) - {"id"})
        if unknown:
            raise InputError(f"{where}: unknown field {unknown[0]!r} for {self.task} (fields: {', '.join(fields)})")
        for name in REQUIRED.get(self.task, fields):
            if name not in value:
                raise InputError(f"{where}: missing field {name!r} ({self.task} reads {', '.join(fields)})")
        for name in fields:
            if name in value and value[name] is not None and not isinstance(value[name], str):
                raise InputError(f"{where}: field {name!r} is {type(value[name]).__name__}, not a string")
        return {name: value.get(name) for name in fields}

    def run(self, items: list[dict[str, Any]], **options: Any) -> list[Any]:
        """The results of inputs already checked by `item`, in their order."""
        if not items:
            return []
        options = self.check_options(options)
        run = {"text-classification": self._classify, "token-classification": self._tag,
               "question-answering": self._answer, "fill-mask": self._fill, "text-generation": self._generate,
               "feature-extraction": self._features}[self.task]
        with torch.inference_mode(), self.placement.autocast():
            return run(items, **options)

    # ------------------------------------------------------------------------------------------- the tasks
    def _max_length(self, max_length: int | None) -> int:
        limit = self.model.config.max_length
        if max_length is None:
            return limit
        if isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 2:
            raise ConfigError(f"max_length must be an integer of at least 2, got {max_length!r}")
        return min(max_length, limit)

    def logits(self, items: list[dict[str, Any]], max_length: int | None = None) -> np.ndarray:
        """text-classification: the classifier's logits, (inputs, labels) float32, of inputs already checked by
        `item` (a text, or a text and its pair), each truncated to `max_length` tokens (None: the model's)."""
        from bertology.tasks.sequence import EncodedExamples, predict_logits

        if self.task != "text-classification":
            raise ConfigError(f"logits: a {self.task} pipeline has no classifier logits")
        names = label_names(self.pretrained, CLASSIFIER)
        logits = np.zeros((len(items), len(names)), dtype=np.float32)
        length = self._max_length(max_length)
        with torch.inference_mode(), self.placement.autocast():
            for paired in (False, True):  # single texts and pairs are encoded apart
                rows = [i for i, item in enumerate(items) if (item.get("text_pair") is not None) == paired]
                if not rows:
                    continue
                encoded = EncodedExamples.from_texts(
                    self.tokenizer, [items[i]["text"] for i in rows],
                    [items[i]["text_pair"] for i in rows] if paired else None, max_length=length, shuffle=False)
                logits[rows] = predict_logits(self.model, encoded, self.batch_size)
        return logits

    def _classify(self, items: list[dict[str, Any]], top_k: int | None, max_length: int | None) -> list[Any]:
        names = label_names(self.pretrained, CLASSIFIER)
        logits = self.logits(items, max_length)
        results = []
        for row in logits.astype(np.float64):
            if len(names) == 1:  # regression: the value itself
                results.append([{"label": names[0], "score": float(row[0])}])
                continue
            probabilities = np.exp(row - row.max())
            probabilities /= probabilities.sum()
            order = np.argsort(-probabilities, kind="stable")[:top_k]
            results.append([{"label": names[k], "score": float(probabilities[k])} for k in order])
        return results

    def _tag(self, items: list[dict[str, Any]], aggregation: str, ignore_labels: Sequence[str],
             stride: int | None) -> list[list[dict[str, Any]]]:
        from bertology.embeddings.backbone import as_backbone
        from bertology.embeddings.windows import max_context_window, plan_windows
        from bertology.tasks.qa import window_logits
        from bertology.tasks.sequence import EncodedExamples

        names = label_names(self.pretrained, TOKEN_CLASSIFIER)
        backbone = as_backbone(self.pretrained, None)
        empty = backbone.frame([])
        capacity = self.model.config.max_length - len(empty.ids)
        step = stride if stride is not None else max(1, capacity // 2)
        if isinstance(step, bool) or not isinstance(step, int) or not 1 <= step <= capacity:
            raise ConfigError(f"stride must be an integer between 1 and the window's {capacity} tokens, got {stride!r}")
        texts = [item["text"] or "" for item in items]
        encodings = [self.tokenizer.encode(text, add_special_tokens=False) for text in texts]
        ids, types, where = [], [], []
        for t, encoding in enumerate(encodings):
            spans = plan_windows(len(encoding.ids), capacity, step)
            for k, (start, stop) in enumerate(spans):
                framed = backbone.frame(encoding.ids[start:stop])
                ids.append(framed.ids)
                types.append(framed.type_ids if framed.type_ids is not None else [0] * len(framed.ids))
                where.append((t, k, start, stop, framed.start))
        encoded = EncodedExamples(ids, types, None, self.tokenizer.fill_id, shuffle=False,
                                  padding_side=self.tokenizer.padding_side)
        flat = window_logits(self.model, encoded, self.batch_size, head=TOKEN_CLASSIFIER).astype(np.float64)
        token_logits = [np.zeros((len(e.ids), len(names))) for e in encodings]
        choices = [max_context_window(plan_windows(len(e.ids), capacity, step), len(e.ids)) for e in encodings]
        for w, (t, k, start, stop, content) in enumerate(where):
            mine = np.flatnonzero(choices[t][start:stop] == k)
            token_logits[t][start + mine] = flat[encoded.offsets[w] + content + mine]
        results = []
        for text, encoding, logits in zip(texts, encodings, token_logits):
            scores = np.exp(logits - logits.max(-1, keepdims=True)) if len(logits) else logits
            scores = scores / scores.sum(-1, keepdims=True) if len(scores) else scores
            results.append(entities(text, encoding.offsets, encoding.word_ids, scores, names, aggregation,
                                    tuple(ignore_labels)))
        return results

    def _answer(self, items: list[dict[str, Any]], doc_stride: int, max_question_length: int,
                max_answer_length: int, n_best: int, max_length: int | None) -> list[dict[str, Any]]:
        from bertology.tasks.examples import QAExample
        from bertology.tasks.qa import PairFrame, QAWindows, question_answers, window_logits

        for key, value in (("doc_stride", doc_stride), ("max_question_length", max_question_length),
                           ("max_answer_length", max_answer_length), ("n_best", n_best)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{key} must be a positive integer, got {value!r}")
        examples = [QAExample(str(i), item["question"], item["context"], [], "") for i, item in enumerate(items)]
        windows = QAWindows.encode(self.tokenizer, examples, self._max_length(max_length),
                                   max_query_length=max_question_length, doc_stride=doc_stride)
        logits = window_logits(self.model, windows, self.batch_size).astype(np.float64)
        found = question_answers(windows, logits, n_best=n_best, max_answer_length=max_answer_length)
        null_first = PairFrame.of(self.tokenizer).null == 0  # where a window without the answer points
        results = []
        for q, (example, best) in enumerate(zip(examples, found)):
            if best is None:
                results.append({"answer": "", "score": 0.0, "start": 0, "end": 0})
                continue
            first, last, w = best
            offsets = windows.context_offsets[q]
            begin = int(windows.offsets[w])
            content = begin + int(windows.content[w])
            count = int(windows.stop[w] - windows.start[w])
            null = begin if null_first else begin + int(windows.lengths[w]) - 1
            candidates = np.r_[null, np.arange(content, content + count)]
            probability = 1.0
            for column, token in ((0, first), (1, last)):
                values = logits[candidates, column]
                values = np.exp(values - values.max())
                probability *= float(values[1 + token - int(windows.start[w])] / values.sum())
            start, end = int(offsets[first][0]), int(offsets[last][1])
            results.append({"answer": example.context[start:end], "score": probability, "start": start,
                            "end": end})
        return results

    def _fill(self, items: list[dict[str, Any]], top_k: int, max_new_tokens: int) -> list[Any]:
        from bertology.objectives.fill_mask import fill_mask

        results = []
        for item in items:
            masks = fill_mask(self.model, self.tokenizer, item["text"] or "", top_k, max_new_tokens=max_new_tokens)
            filled = [[{"token_str": p.token, "token": p.token_id, "score": p.probability, "sequence": p.sequence}
                       for p in predictions] for predictions in masks]
            results.append(filled[0] if len(filled) == 1 else filled)
        return results

    def _generate(self, items: list[dict[str, Any]], **options: Any) -> list[dict[str, str]]:
        from bertology.generation import generate_texts

        texts = [item["text"] or "" for item in items]
        out: list[str] = [""] * len(texts)
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))  # batches of similar lengths
        for first in range(0, len(order), self.batch_size):
            rows = order[first:first + self.batch_size]
            for row, text in zip(rows, generate_texts(self.model, self.tokenizer, [texts[i] for i in rows],
                                                      **options)):
                out[row] = text
        return [{"generated_text": text} for text in out]

    def _features(self, items: list[dict[str, Any]], **options: Any) -> list[list[float]]:
        from bertology.embeddings import embed

        unknown = {"levels", "device", "dtype", "tokenizer"} & set(options)
        if unknown:
            raise ConfigError(f"feature-extraction: option {sorted(unknown)[0]!r} is the pipeline's own")
        result = embed(self.pretrained, [item["text"] or "" for item in items], levels=("sentence",),
                       batch_size=self.batch_size, dtype=self.placement.dtype, **options)
        return [row.tolist() for row in result.sentences]


# ------------------------------------------------------------------------------------------------- entities
def split_tag(label: str) -> tuple[str, str]:
    """A label's BIO prefix and type: ``B-LOC`` -> (B, LOC), ``I-LOC`` -> (I, LOC); a label without a prefix
    (``O``, ``LOC``) continues an entity of its own name, as transformers reads it."""
    if label.startswith(("B-", "I-")):
        return label[0], label[2:]
    return "I", label


def entities(text: str, offsets: Sequence[tuple[int, int]], word_ids: Sequence[int | None], scores: np.ndarray,
             names: Sequence[str], aggregation: str, ignore_labels: tuple[str, ...] = ("O",)) -> list[dict[str, Any]]:
    """The entities of one text from its tokens' label probabilities ``scores`` [tokens, labels] (see the module
    docstring for `aggregation`); each has its type (``entity_group``; ``entity``, the tag, with "none"), score,
    ``start``/``end`` character offsets into `text` and ``word`` = ``text[start:end]``."""
    if aggregation not in AGGREGATIONS:
        raise ConfigError(f"aggregation: unknown {aggregation!r}; expected one of {', '.join(AGGREGATIONS)}")
    tokens = []  # (label, score, start, end, token index)
    if aggregation in ("none", "simple"):
        for i, row in enumerate(scores):
            k = int(np.argmax(row))
            tokens.append((names[k], float(row[k]), int(offsets[i][0]), int(offsets[i][1]), i))
    else:
        groups: list[list[int]] = []
        for i, word in enumerate(word_ids):
            if groups and word is not None and word_ids[groups[-1][0]] == word:
                groups[-1].append(i)
            else:
                groups.append([i])
        for group in groups:
            rows = scores[group]
            if aggregation == "first":
                row = rows[0]
            elif aggregation == "max":
                row = rows[int(np.argmax(rows.max(-1)))]
            else:
                row = rows.mean(0)
            k = int(np.argmax(row))
            tokens.append((names[k], float(row[k]), int(offsets[group[0]][0]), int(offsets[group[-1]][1]),
                           group[0]))
    if aggregation == "none":
        return [{"entity": label, "score": score, "index": index, "word": text[start:end], "start": start,
                 "end": end} for label, score, start, end, index in tokens if label not in ignore_labels]
    grouped: list[list[tuple]] = []
    for token in tokens:
        prefix, kind = split_tag(token[0])
        if grouped and prefix != "B" and split_tag(grouped[-1][-1][0])[1] == kind:
            grouped[-1].append(token)
        else:
            grouped.append([token])
    out = []
    for group in grouped:
        kind = split_tag(group[0][0])[1]
        if kind in ignore_labels or group[0][0] in ignore_labels:
            continue
        start, end = group[0][2], group[-1][3]
        out.append({"entity_group": kind, "score": float(np.mean([t[1] for t in group])), "word": text[start:end],
                    "start": start, "end": end})
    return out


def bio_tags(text_entities: Sequence[Mapping[str, Any]], offsets: Sequence[tuple[int, int]]) -> list[str]:
    """The BIO tag of each token (by its character offsets) under grouped entities: ``B-X`` at an entity's first
    token, ``I-X`` inside it, ``O`` elsewhere; valid BIO by construction."""
    tags = ["O"] * len(offsets)
    for entity in text_entities:
        inside = [i for i, (a, b) in enumerate(offsets) if a >= entity["start"] and b <= entity["end"] and b > a]
        for n, i in enumerate(inside):
            tags[i] = ("B-" if n == 0 else "I-") + entity["entity_group"]
    return tags

