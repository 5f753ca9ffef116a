"""Cloze-prompt classification (pattern-exploiting training, Schick & Schütze 2021): a GLUE classification task
asked as a fill-in-the-blank question to the model's own masked-LM head.

A *template* turns an example into one text with a mask slot, e.g. ``"{text} It was [MASK] ."`` for SST-2 or
``"{text} ? [MASK] , {text_pair}"`` for RTE (``[MASK]`` stands for the tokenizer's own mask token, ``<mask>`` for
RoBERTa); a *verbaliser* maps one answer word per label to that label (``great`` -> 1, ``terrible`` -> 0), each word
a single token of the tokenizer. The score of a label is the masked-LM logit of its word at the mask; the
prediction is the best-scoring label, and training is cross-entropy over the verbaliser words' logits only
(``ClozeClassification``; the head's logits are computed only at the mask, ``masked_positions``).

The task's head is the family's masked-LM head named ``mlm``; the fine-tuning recipe keeps a pretrained one, so
zero-shot (``zero_shot``: ``predict`` with the checkpoint untouched) and few-shot (``finetune`` with
``task.limit_train: 32``) start from what pretraining learned. Files, label names, metrics and the predictions
file are the base GLUE task's. Registered: ``sst2-cloze`` and ``rte-cloze``.

The filled template is one text (one segment). When it is longer than ``max_length`` the example's own text is
shortened (longest field first), never the template, so the mask is always there.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from bertology.errors import CheckpointError, ConfigError, DataError
from bertology.model.checkpoint import HEADS
from bertology.model.config import TransformerConfig
from bertology.model.heads import HeadSpec
from bertology.model.protocol import Model
from bertology.objectives.base import (
    Objective,
    ObjectiveOutput,
    Passes,
    check_objective,
    classification_output,
    classification_summary,
)
from bertology.tasks.base import FinetuneTask
from bertology.tasks.lookup import get_task
from bertology.tasks.examples import TextExample
from bertology.tasks.glue import GlueFinetuneTask
from bertology.tasks.readers import GLUE_TASKS
from bertology.tasks.sequence import EncodedExamples, TaskBatch
from bertology.tokenization import Tokenizer

MASK_SLOT = "[MASK]"  # in a template: where the tokenizer's own mask token goes
MLM = "mlm"
_SLOTS = re.compile(r"(\{text\}|\{text_pair\}|\[MASK\])")
_MAX_SHORTENINGS = 16


def mlm_head(config: TransformerConfig) -> HeadSpec:
    """The masked-LM head of the model's family, named ``mlm``, as its checkpoints carry it."""
    table = HEADS.get(config.family, {}).get(MLM)
    if table is None:
        raise ConfigError(f"cloze tasks need a masked-LM head; {config.family} models have none")
    kind, act, _ = table
    return HeadSpec(MLM, kind, activation=act or config.hidden_act)  # type: ignore[arg-type]


@dataclass
class ClozeBatch(TaskBatch):
    """A task batch with the mask of every row (``masked_positions [B, 2]``, row i's at row i) and the verbaliser
    token ids in label order (``label_token_ids [K]``)."""

    masked_positions: Tensor
    label_token_ids: Tensor

    def to(self, device: torch.device | str, non_blocking: bool = False) -> ClozeBatch:
        moved = super().to(device, non_blocking)
        return ClozeBatch(moved.input_ids, moved.attention_mask, moved.token_type_ids, moved.labels,
                          moved.example_ids, self.masked_positions.to(device, non_blocking=non_blocking),
                          self.label_token_ids.to(device, non_blocking=non_blocking))


class EncodedCloze(EncodedExamples):
    """Filled templates tokenised once (see ``EncodedExamples``), each with the column of its mask."""

    def __init__(self, ids: Sequence[Sequence[int]], type_ids: Sequence[Sequence[int]], labels: Tensor | None,
                 pad_id: int, mask_columns: Sequence[int], label_token_ids: Sequence[int], **options: Any) -> None:
        super().__init__(ids, type_ids, labels, pad_id, **options)
        if len(mask_columns) != len(ids):
            raise DataError(f"EncodedCloze: {len(ids)} examples but {len(mask_columns)} mask columns")
        self.mask_columns = np.asarray(mask_columns, dtype=np.int64)
        self.label_token_ids = torch.tensor(list(label_token_ids), dtype=torch.long)

    def collate(self, rows: np.ndarray) -> ClozeBatch:
        base = super().collate(rows)
        columns = torch.from_numpy(self.mask_columns[rows])
        positions = torch.stack([torch.arange(len(rows), dtype=torch.long), columns], dim=1)
        return ClozeBatch(base.input_ids, base.attention_mask, base.token_type_ids, base.labels, base.example_ids,
                          positions, self.label_token_ids)


@dataclass
class ClozeClassification(Objective):
    """Cross-entropy over the verbaliser tokens' masked-LM logits at the mask, against class ids. Stats:
    ``{name}_units`` (examples), ``_loss_sum``, ``_correct``."""

    head: HeadSpec
    weight: float = 1.0
    name: str = "cloze"

    def __post_init__(self) -> None:
        check_objective(self)
        if self.head.kind != "masked_lm":
            raise ConfigError(f"objectives.{self.name}: needs a masked-LM head, got {self.head.kind!r}")

    def heads(self) -> Sequence[HeadSpec]:
        return (self.head,)

    def reads(self, batch: ClozeBatch) -> Tensor:
        return batch.masked_positions  # the head's logits are computed only there

    def units(self, batch: ClozeBatch) -> Tensor:
        return torch.tensor(len(batch), dtype=torch.int64)

    def __call__(self, passes: Passes, batch: ClozeBatch) -> ObjectiveOutput:
        if batch.labels is None:
            raise DataError(f"objective {self.name!r} needs labels; the batch has none")
        logits = passes.shared.head_logits[self.head.name][:, batch.label_token_ids]  # [B, K]
        loss = F.cross_entropy(logits.float(), batch.labels, reduction="sum")
        return classification_output(self.name, logits, batch.labels, loss)

    def summarize(self, totals: Mapping[str, float]) -> dict[str, float]:
        return classification_summary(self.name, totals)


@torch.no_grad()
def cloze_scores(model: Model, encoded: EncodedCloze, batch_size: int = 64, head: str = MLM) -> np.ndarray:
    """The label scores ``[N, K]``: the masked-LM logit of each verbaliser token at each example's mask, in the
    examples' order (the last layer runs only at the masks)."""
    if head not in model.heads:
        raise CheckpointError(f"a cloze task needs a masked-LM head named {head!r}; the model has "
                              f"{', '.join(model.heads) or 'no head'}")
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    out = np.zeros((len(encoded), len(encoded.label_token_ids)), dtype=np.float32)
    try:
        for batch in encoded.batches(0, batch_size, drop_last=False):
            batch = batch.to(device)
            inputs = {**model.forward_inputs(batch), "masked_positions": batch.masked_positions,
                      "last_layer_at": batch.masked_positions}
            logits = model(**inputs).head_logits[head]
            out[batch.example_ids.cpu().numpy()] = logits[:, batch.label_token_ids].float().cpu().numpy()
    finally:
        model.train(was_training)
    return out


class ClozeTask:
    """A GLUE classification task (``base_task``) asked through ``template`` and ``verbalizer`` (word -> label
    name, one single-token word per label); see the module docstring."""

    def __init__(self, base_task: GlueFinetuneTask, template: str, verbalizer: Mapping[str, Any],
                 name: str | None = None) -> None:
        self.base = base_task
        self.name = name or f"{base_task.name}-cloze"
        self.metrics = base_task.metrics
        self.predictions_file = base_task.predictions_file
        names = base_task.label_names()
        if names is None:
            raise ConfigError(f"{self.name}: cloze prompts need a classification task; {base_task.name} is "
                              "regression")
        self.pairs = base_task.spec.text_pair is not None
        self.parts = self._parse(template)
        self.template = template
        words = {str(word): str(label) for word, label in verbalizer.items()}
        unknown = sorted({label for label in words.values() if label not in names})
        if unknown:
            raise ConfigError(f"{self.name}: verbaliser labels {unknown} are not {base_task.name}'s labels "
                              f"{list(names)}")
        by_label = {label: [w for w, lab in words.items() if lab == label] for label in names}
        wrong = {label: found for label, found in by_label.items() if len(found) != 1}
        if wrong:
            raise ConfigError(f"{self.name}: the verbaliser needs exactly one word per label; got "
                              + ", ".join(f"{label!r}: {found}" for label, found in wrong.items()))
        self.words = tuple(by_label[label][0] for label in names)  # in label-id order
        self.verbalizer = dict(words)

    def _parse(self, template: str) -> list[str]:
        if not isinstance(template, str):
            raise ConfigError(f"{self.name}: the template must be a string, got {type(template).__name__}")
        parts = [p for p in _SLOTS.split(template) if p]
        counts = {slot: parts.count(slot) for slot in ("{text}", "{text_pair}", MASK_SLOT)}
        if counts[MASK_SLOT] != 1:
            raise ConfigError(f"{self.name}: the template {template!r} needs exactly one mask slot {MASK_SLOT} "
                              f"(the tokenizer's mask token goes there), found {counts[MASK_SLOT]}")
        if counts["{text}"] != 1:
            raise ConfigError(f"{self.name}: the template {template!r} needs exactly one {{text}}, found "
                              f"{counts['{text}']}")
        if self.pairs and counts["{text_pair}"] != 1:
            raise ConfigError(f"{self.name}: {self.base.name} has sentence pairs: the template {template!r} needs "
                              f"exactly one {{text_pair}}, found {counts['{text_pair}']}")
        if not self.pairs and counts["{text_pair}"]:
            raise ConfigError(f"{self.name}: {self.base.name} has single sentences: the template {template!r} "
                              "has a {text_pair}")
        return parts

    # ------------------------------------------------------------------ the prompt
    def label_token_ids(self, tokenizer: Tokenizer) -> list[int]:
        """The verbaliser words' token ids in label order; each word must be one token (as it is inside a text)."""
        ids = []
        for word in self.words:
            encoding = tokenizer.encode_words([word], add_special_tokens=False)
            if len(encoding.ids) != 1 or encoding.ids[0] == tokenizer.unk_id:
                raise ConfigError(f"{self.name}: the verbaliser word {word!r} is not a single token of the "
                                  f"tokenizer: it is {encoding.tokens}")
            ids.append(encoding.ids[0])
        if len(set(ids)) != len(ids):
            raise ConfigError(f"{self.name}: the verbaliser words {list(self.words)} share a token")
        return ids

    def render(self, mask_token: str, text: str, text_pair: str | None = None) -> tuple[str, int]:
        """The filled template and the character offset of its mask token."""
        pieces: list[str] = []
        at = 0
        for part in self.parts:
            if part == MASK_SLOT:
                at = sum(len(p) for p in pieces)
                pieces.append(mask_token)
            elif part == "{text}":
                pieces.append(text)
            elif part == "{text_pair}":
                pieces.append(text_pair or "")
            else:
                pieces.append(part)
        return "".join(pieces), at

    def _mask_column(self, tokenizer: Tokenizer, ids: Sequence[int], offsets: Sequence[tuple[int, int]],
                     at: int, where: str) -> int:
        found = [i for i, token in enumerate(ids) if token == tokenizer.mask_id]
        exact = [i for i in found if offsets[i][0] == at]
        if len(exact) == 1 or len(found) == 1:
            return (exact or found)[0]
        raise DataError(f"{self.name}: {where}: cannot find the template's mask token among {len(found)} in the "
                        "encoded text")

    def _fit(self, tokenizer: Tokenizer, text: str, pair: str | None, max_length: int,
             where: str) -> tuple[list[int], int]:
        """One example's ids and mask column within ``max_length``, its text shortened longest-first."""
        fields = [text, pair] if pair is not None else [text]
        for _ in range(_MAX_SHORTENINGS):
            rendered, at = self.render(tokenizer.mask_token, fields[0], fields[1] if pair is not None else None)
            encoding = tokenizer.encode(rendered)
            excess = len(encoding.ids) - max_length
            if excess <= 0:
                return encoding.ids, self._mask_column(tokenizer, encoding.ids, encoding.offsets, at, where)
            pieces = [tokenizer.encode(f, add_special_tokens=False) for f in fields]
            lengths = [len(p.ids) for p in pieces]
            if sum(lengths) == 0:
                raise DataError(f"{self.name}: the template alone is {len(encoding.ids)} tokens, more than "
                                f"max_length {max_length}")
            longest = int(np.argmax(lengths))
            gap = lengths[longest] - min(lengths)
            cut = min(excess, gap) if gap > 0 else max(1, (excess + len(fields) - 1) // len(fields))
            keep = max(0, lengths[longest] - cut)
            offsets = pieces[longest].offsets
            fields[longest] = fields[longest][:offsets[keep - 1][1]] if keep else ""
        raise DataError(f"{self.name}: {where}: cannot shorten the example to {max_length} tokens")

    # ------------------------------------------------------------------ FinetuneTask
    def path(self, data: str, split: str) -> Path:
        return self.base.path(data, split)

    def read(self, path: Path, limit: int | None = None) -> list[TextExample]:
        return self.base.read(path, limit)

    def label_names(self) -> tuple[str, ...] | None:
        return self.base.label_names()

    def heads(self, config: TransformerConfig) -> list[HeadSpec]:
        return [mlm_head(config)]

    def objectives(self, heads: Sequence[HeadSpec]) -> list[ClozeClassification]:
        return [ClozeClassification(heads[0])]

    def encode(self, tokenizer: Tokenizer, examples: Sequence[TextExample], max_length: int, *, train: bool,
               seed: int = 0) -> EncodedCloze:
        label_ids = self.label_token_ids(tokenizer)
        rendered = [self.render(tokenizer.mask_token, e.text, (e.text_pair or "") if self.pairs else None)
                    for e in examples]
        if not rendered:
            raise DataError(f"{self.name}: no examples")
        batch = tokenizer.encode_batch([text for text, _ in rendered])  # fast path; long ones shortened below
        ids: list[list[int]] = []
        columns: list[int] = []
        for example, (_, at), encoding in zip(examples, rendered, batch.encodings, strict=True):
            where = f"example {example.id}"
            if len(encoding.ids) <= max_length:
                ids.append(encoding.ids)
                columns.append(self._mask_column(tokenizer, encoding.ids, encoding.offsets, at, where))
            else:
                row, column = self._fit(tokenizer, example.text, (example.text_pair or "") if self.pairs else None,
                                        max_length, where)
                ids.append(row)
                columns.append(column)
        types = [[0] * len(row) for row in ids]
        return EncodedCloze(ids, types, self.base.labels(examples), tokenizer.pad_id, columns, label_ids,
                            shuffle=train, seed=seed)

    def predict(self, model: Model, encoded: EncodedCloze, examples: Sequence[TextExample],
                batch_size: int) -> list[Any]:
        names = self.label_names()
        assert names is not None
        return [names[i] for i in cloze_scores(model, encoded, batch_size).argmax(1).tolist()]

    def scores(self, predictions: Sequence[Any], examples: Sequence[TextExample]) -> dict[str, float]:
        return self.base.scores(predictions, examples)

    def write(self, path: Path, predictions: Sequence[Any], examples: Sequence[TextExample]) -> None:
        self.base.write(path, predictions, examples)

    def evaluate(self, predictions_path: Path, gold_path: Path) -> dict[str, Any]:
        return self.base.evaluate(predictions_path, gold_path)


def zero_shot(model_dir: str | Path, task: str | FinetuneTask, data: str, limit: int | None = None, *,
              split: str = "dev", max_length: int = 128, batch_size: int = 64) -> dict[str, float]:
    """The task's metrics (x100) on ``split`` (its first ``limit`` examples) of a cloze task predicted by the
    model in ``model_dir`` as it is: its pretrained masked-LM head, nothing trained."""
    from bertology.model.checkpoint import load

    task = get_task(task) if isinstance(task, str) else task
    if not isinstance(task, ClozeTask):
        raise ConfigError(f"zero-shot needs a cloze task (sst2-cloze, rte-cloze, a ClozeTask), got {task.name!r}")
    pretrained = load(model_dir)
    if pretrained.tokenizer is None:
        raise ConfigError(f"{model_dir}: no tokenizer files")
    if MLM not in pretrained.model.heads:
        raise CheckpointError(f"{model_dir}: zero-shot cloze needs the pretrained masked-LM head; the checkpoint "
                              f"has {', '.join(pretrained.model.heads) or 'no head'}")
    examples = task.read(task.path(data, split), limit)
    encoded = task.encode(pretrained.tokenizer, examples, min(max_length, pretrained.model.config.max_length),
                          train=False)
    return task.scores(task.predict(pretrained.model, encoded, examples, batch_size), examples)


SST2_CLOZE = ClozeTask(GlueFinetuneTask(GLUE_TASKS["sst2"]), "{text} It was [MASK] .", {"great": "1", "terrible": "0"})
RTE_CLOZE = ClozeTask(GlueFinetuneTask(GLUE_TASKS["rte"]), "{text} ? [MASK] , {text_pair}",
                      {"yes": "entailment", "no": "not_entailment"})
