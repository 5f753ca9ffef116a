"""Text-to-text fine-tuning (T5's recipe): every example is an input text and a target text; the decoder of an
encoder-decoder learns the target by its cross-entropy (teacher forcing, the language-model head at the target's
positions only), and predictions are generated (greedy, ``bertology.generate``) and read back as the task's labels
or answers.

    GLUE on T5   "sst2 sentence: it was great"             ->  "positive"
                 "mrpc sentence1: ... sentence2: ..."      ->  "equivalent" / "not_equivalent"
                 "stsb sentence1: ... sentence2: ..."      ->  "3.8" (the score rounded to 0.2, as T5 has it)
    SQuAD        "question: ... context: ..."              ->  the answer's text (``bertology.tasks.qa``)

A generated text that is none of the task's label words counts as wrong: it is kept as generated, so it equals no
gold label (and is a class of its own for the MCC); the predictions file holds it too, scored with
``evaluate_files(..., open_labels=True)``. For STS-B a text that is not a number reads as -1 (T5's post-processing).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from bertology.errors import ConfigError, DataError
from bertology.io import atomic_write
from bertology.model.checkpoint import HEADS
from bertology.model.heads import HeadSpec
from bertology.model.protocol import Model
from bertology.objectives.base import Objective, ObjectiveOutput, Passes, check_objective
from bertology.objectives.mlm import token_prediction, token_prediction_summary
from bertology.tasks import metrics
from bertology.tasks.examples import TextExample
from bertology.tasks.sequence import EncodedExamples
from bertology.tokenization import Tokenizer

LM = "lm"
MAX_TARGET_TOKENS = 64  # targets are labels and short answers; longer ones are cut (their EOS kept)


def lm_head(config: Any) -> HeadSpec:
    """The language-model head of the model's family (tied to the word embeddings unless the family says not)."""
    table = HEADS.get(getattr(config, "family", ""), {})
    kind = table[LM][0] if LM in table else "tied_lm"
    return HeadSpec(LM, kind)


def require_seq2seq(model: Model, task: str) -> None:
    from bertology.model.protocol import ENCODER_DECODER, require

    require(model, ENCODER_DECODER, f"{task} as text-to-text (its answers generated: T5, BART)")


@dataclass
class TextToTextBatch:
    """A right-padded batch of input texts and their targets. The decoder reads ``decoder_input_ids`` (the start
    token, then the target but its last token); the head predicts at ``masked_positions`` [N, 2] (every target
    token) the tokens ``lm_labels`` [N]. Unlabelled examples have the start token alone and no positions."""

    input_ids: Tensor
    attention_mask: Tensor
    decoder_input_ids: Tensor
    decoder_attention_mask: Tensor
    masked_positions: Tensor
    lm_labels: Tensor
    example_ids: Tensor

    def to(self, device: torch.device | str, non_blocking: bool = False) -> TextToTextBatch:
        return TextToTextBatch(*(t.to(device, non_blocking=non_blocking) for t in (
            self.input_ids, self.attention_mask, self.decoder_input_ids, self.decoder_attention_mask,
            self.masked_positions, self.lm_labels, self.example_ids)))

    def __len__(self) -> int:
        return self.input_ids.shape[0]


class TextPairs(EncodedExamples):
    """Input texts and target texts tokenised once, as a ``BatchSource`` (the order, shuffling and resumption of
    ``EncodedExamples``, by the inputs' lengths). ``targets`` None: unlabelled. The tokenizer is kept to read the
    generated ids back; ``max_new_tokens`` bounds what prediction generates."""

    def __init__(self, tokenizer: Tokenizer, sources: Sequence[str], targets: Sequence[str] | None, *,
                 max_length: int, start_id: int, max_new_tokens: int, shuffle: bool = True, seed: int = 0) -> None:
        ids = [e.ids for e in tokenizer.encode_batch(list(sources), max_length=max_length).encodings]
        super().__init__(ids, [[0] * len(row) for row in ids], None, tokenizer.pad_id, shuffle=shuffle, seed=seed)
        self.targets = None if targets is None else [
            e.ids for e in tokenizer.encode_batch(list(targets), max_length=MAX_TARGET_TOKENS).encodings]
        if self.targets is not None and any(not row for row in self.targets):
            raise DataError("a text-to-text target encodes to no tokens")
        self.tokenizer, self.start_id, self.max_new_tokens = tokenizer, start_id, max_new_tokens

    def collate(self, rows: np.ndarray) -> TextToTextBatch:  # type: ignore[override]
        base = super().collate(rows)
        count = len(rows)
        if self.targets is None:
            start = torch.full((count, 1), self.start_id, dtype=torch.long)
            return TextToTextBatch(base.input_ids, base.attention_mask, start, torch.ones_like(start),
                                   torch.zeros(0, 2, dtype=torch.long), torch.zeros(0, dtype=torch.long),
                                   base.example_ids)
        targets = [self.targets[i] for i in rows.tolist()]
        width = max(len(t) for t in targets)
        decoder = torch.full((count, width), self.pad_id, dtype=torch.long)
        mask = torch.zeros(count, width, dtype=torch.long)
        decoder[:, 0] = self.start_id
        for row, target in enumerate(targets):
            decoder[row, 1:len(target)] = torch.tensor(target[:-1], dtype=torch.long)
            mask[row, :len(target)] = 1
        positions = mask.nonzero()
        labels = torch.tensor([token for target in targets for token in target], dtype=torch.long)
        return TextToTextBatch(base.input_ids, base.attention_mask, decoder, mask, positions, labels, base.example_ids)


@dataclass
class TargetCrossEntropy(Objective):
    """The decoder's cross-entropy of the target tokens (teacher forcing) through the language-model head. Stats:
    ``{name}_units`` (target tokens), ``_loss_sum``, ``_correct``."""

    head: HeadSpec
    weight: float = 1.0
    name: str = LM

    def __post_init__(self) -> None:
        check_objective(self)

    def heads(self) -> Sequence[HeadSpec]:
        return (self.head,)

    def reads(self, batch: TextToTextBatch) -> Tensor:
        return batch.masked_positions

    def units(self, batch: TextToTextBatch) -> Tensor:
        return torch.tensor(batch.lm_labels.shape[0], dtype=torch.int64)

    def __call__(self, passes: Passes, batch: TextToTextBatch) -> ObjectiveOutput:
        return token_prediction(self.name, passes.shared.head_logits[self.head.name], batch.lm_labels)

    def summarize(self, totals: Mapping[str, float]) -> dict[str, float]:
        return token_prediction_summary(self.name, totals)


@torch.no_grad()
def generate_texts(model: Model, encoded: TextPairs, batch_size: int = 64) -> list[str]:
    """The greedy generation for every input, decoded without special tokens and stripped, in the examples' order."""
    from bertology.generation import generate

    out = [""] * len(encoded)
    device = next(model.parameters()).device
    for batch in encoded.batches(0, batch_size, drop_last=False):
        ids = generate(model, batch.input_ids.to(device), batch.attention_mask.to(device),
                       max_new_tokens=encoded.max_new_tokens)
        for row, index in enumerate(batch.example_ids.tolist()):
            out[index] = encoded.tokenizer.decode(ids[row], skip_special_tokens=True).strip()
    return out


def start_token(model_or_config: Any) -> int:
    config = getattr(model_or_config, "config", model_or_config)
    if config.decoder_start_token_id is None:
        raise ConfigError("decoder_start_token_id is not set in the model's config: text-to-text needs it to start "
                          "the decoder")
    return int(config.decoder_start_token_id)


# ------------------------------------------------------------------------------------------------ GLUE as text
# T5's formats: the input's prefix and fields, and each label's word.
GLUE_FORMATS: dict[str, tuple[str, dict[str, str] | None]] = {
    "sst2": ("sst2 sentence: {text}", {"0": "negative", "1": "positive"}),
    "cola": ("cola sentence: {text}", {"0": "unacceptable", "1": "acceptable"}),
    "mrpc": ("mrpc sentence1: {text} sentence2: {pair}", {"0": "not_equivalent", "1": "equivalent"}),
    "rte": ("rte sentence1: {text} sentence2: {pair}", {"entailment": "entailment",
                                                         "not_entailment": "not_entailment"}),
    "stsb": ("stsb sentence1: {text} sentence2: {pair}", None),
}


def score_text(score: float) -> str:
    """An STS-B score as T5's target: rounded to the nearest 0.2, one decimal."""
    return f"{round(float(score) * 5) / 5:.1f}"


def read_score(text: str) -> float:
    """A generated STS-B score; -1 for a text that is not a finite number (T5's default)."""
    try:
        value = float(text)
    except ValueError:
        return -1.0
    return value if math.isfinite(value) else -1.0


class GlueTextToText:
    """A GLUE task (``bertology.tasks.glue.GlueFinetuneTask``) as text-to-text: what the GLUE task becomes on an
    encoder-decoder whose family has no classifier of its own (T5). Reading, scoring and the files are the GLUE
    task's; the predictions file holds a label, or the generated text where it is none."""

    def __init__(self, glue: Any, start_id: int) -> None:
        if glue.name not in GLUE_FORMATS:
            raise ConfigError(f"{glue.name}: no text-to-text format (known: {', '.join(GLUE_FORMATS)})")
        self.glue, self.start_id = glue, start_id
        self.name, self.metrics, self.predictions_file = glue.name, glue.metrics, glue.predictions_file
        self.template, self.words = GLUE_FORMATS[glue.name]
        self.labels_of = {word: label for label, word in (self.words or {}).items()}

    def path(self, data: str, split: str) -> Path:
        return self.glue.path(data, split)

    def read(self, path: Path, limit: int | None = None) -> list[TextExample]:
        return self.glue.read(path, limit)

    def label_names(self) -> None:
        return None  # the labels are words the decoder says, not classifier outputs

    def heads(self, config: Any) -> list[HeadSpec]:
        return [lm_head(config)]

    def objectives(self, heads: Sequence[HeadSpec]) -> list[TargetCrossEntropy]:
        return [TargetCrossEntropy(heads[0])]

    def source(self, example: TextExample) -> str:
        return self.template.format(text=example.text, pair=example.text_pair or "")

    def target(self, example: TextExample) -> str:
        if self.words is None:
            return score_text(float(example.label))  # type: ignore[arg-type]
        if str(example.label) not in self.words:
            raise DataError(f"{self.name} row {example.id}: label {example.label!r} is not one of "
                            f"{', '.join(self.words)}")
        return self.words[str(example.label)]

    def encode(self, tokenizer: Tokenizer, examples: Sequence[TextExample], max_length: int, *, train: bool,
               seed: int = 0) -> TextPairs:
        labelled = bool(examples) and examples[0].label is not None
        said = list(self.words.values()) if self.words is not None else [score_text(v / 5) for v in range(26)]
        longest = max(len(e.ids) for e in tokenizer.encode_batch(said).encodings)
        return TextPairs(tokenizer, [self.source(e) for e in examples],
                         [self.target(e) for e in examples] if labelled else None, max_length=max_length,
                         start_id=self.start_id, max_new_tokens=longest + 1,
                         shuffle=train, seed=seed)

    def prediction(self, text: str) -> Any:
        """A generated text as the task's prediction: its label, the score, or the text itself (counted wrong)."""
        if self.words is None:
            return read_score(text)
        return self.labels_of.get(text, " ".join(text.split()))

    def predict(self, model: Model, encoded: TextPairs, examples: Sequence[TextExample], batch_size: int) -> list[Any]:
        return [self.prediction(text) for text in generate_texts(model, encoded, batch_size)]

    def scores(self, predictions: Sequence[Any], examples: Sequence[TextExample]) -> dict[str, float]:
        return self.glue.scores(predictions, examples)

    def write(self, path: Path, predictions: Sequence[Any], examples: Sequence[TextExample]) -> None:
        """STS-B: the GLUE file (every prediction is a number). A classification: ``index<TAB>prediction<TAB>
        generated``, the prediction empty where the generated text is none of the task's words, which
        `bertology evaluate` then counts as wrong (``bertology.tasks.metrics.GENERATED``)."""
        if self.words is None:
            self.glue.write(path, predictions, examples)
            return
        with atomic_write(path, "w", encoding="utf-8") as handle:
            handle.write("\t".join(metrics.GENERATED) + "\n")
            for example, prediction in zip(examples, predictions, strict=True):
                label = str(prediction) if str(prediction) in self.words else ""
                handle.write(f"{example.id}\t{label}\t{self.words[label] if label else prediction}\n")

    def evaluate(self, predictions_path: Path, gold_path: Path) -> dict[str, Any]:
        return metrics.evaluate_files(self.name, predictions_path, gold=gold_path, open_labels=True)


# ----------------------------------------------------------------------------------------------- SQuAD as text
class SquadTextToText:
    """SQuAD v1.1 as text-to-text (``bertology.tasks.qa.SquadTask`` on an encoder-decoder, T5 and BART alike):
    ``question: Q context: C`` -> the first gold answer's text; the answer is generated (at most
    ``max_answer_tokens`` tokens) and scored with the official v1.1 EM and F1. The input is cut to the task's length
    at the end of the context; files, splits, scoring and the written JSON are the ``squad`` task's."""

    max_length = 384
    max_answer_tokens = 32

    def __init__(self, squad: Any, start_id: int) -> None:
        self.squad, self.start_id = squad, start_id
        self.name, self.metrics, self.predictions_file = squad.name, squad.metrics, squad.predictions_file

    def path(self, data: str, split: str) -> Path:
        return self.squad.path(data, split)

    def read(self, path: Path, limit: int | None = None) -> list[Any]:
        return self.squad.read(path, limit)

    def label_names(self) -> None:
        return None

    def heads(self, config: Any) -> list[HeadSpec]:
        return [lm_head(config)]

    def objectives(self, heads: Sequence[HeadSpec]) -> list[TargetCrossEntropy]:
        return [TargetCrossEntropy(heads[0])]

    @staticmethod
    def source(example: Any) -> str:
        return f"question: {example.question} context: {example.context}"

    def encode(self, tokenizer: Tokenizer, examples: Sequence[Any], max_length: int, *, train: bool,
               seed: int = 0) -> TextPairs:
        labelled = bool(examples) and all(e.answers for e in examples)
        return TextPairs(tokenizer, [self.source(e) for e in examples],
                         [e.answers[0].text for e in examples] if labelled else None, max_length=max_length,
                         start_id=self.start_id, max_new_tokens=self.max_answer_tokens, shuffle=train, seed=seed)

    def predict(self, model: Model, encoded: TextPairs, examples: Sequence[Any], batch_size: int) -> list[str]:
        if len(encoded) != len(examples):
            raise ConfigError(f"{self.name}: {len(encoded)} encoded inputs for {len(examples)} questions")
        return generate_texts(model, encoded, batch_size)

    def scores(self, predictions: Sequence[str], examples: Sequence[Any]) -> dict[str, float]:
        return self.squad.scores(predictions, examples)

    def write(self, path: Path, predictions: Sequence[str], examples: Sequence[Any]) -> None:
        self.squad.write(path, predictions, examples)

    def evaluate(self, predictions_path: Path, gold_path: Path) -> dict[str, Any]:
        return self.squad.evaluate(predictions_path, gold_path)
