"""Instruction-format multi-task fine-tuning (FLAN, Wei et al. 2022; InstructGPT's demonstrations): several tasks,
each example written as an instruction by one of several templates, mixed into one training set, the loss on the
target only, and every task scored by its own metric from the generated text.

An *instructions file* is a YAML or JSON mapping with an ``instructions:`` section (``InstructionsConfig``)::

    instructions:
      templates: instruction-templates.yaml   # the template file (relative paths: from this file's folder)
      limit: 3000                             # K: no task weighs more than K examples in the mixture
      seed: 0                                 # the template of each example and the mixture's draws
      tasks:                                  # the mixture
        - {name: rte}
        - {name: squad, data: ../shared/data/squad}
        - {name: notes, train: notes-train.jsonl, dev: notes-dev.jsonl}   # a user's {instruction, input, output}
      heldout:                                # a task family never trained on: scored zero-shot
        - {name: sst2}

Wherever a task name is taken its path may stand instead (``bertology finetune --task instructions.yaml``); tasks
without a ``data`` of their own read ``--data`` (``task.data``).

The *template file* maps a template set's name (by default a task's name; ``templates:`` in a task's entry picks
another) to a list of templates, each ``{name, prompt, target}`` (``target`` defaults to ``"{answer}"``). Fields:

    sst2, cola                {sentence} {options} {answer}
    mrpc, rte                 {sentence1} {sentence2} {options} {answer}
    stsb                      {sentence1} {sentence2} {answer}           (the score rounded to 0.2, as T5's)
    squad                     {question} {context} {answer}
    conll2003                 {sentence} {options} {answer}              (options: the entity types)
    a user's JSONL            {instruction} {input} {answer}             ({output} is {answer})

``{options}`` lists the label words, ", "-separated (SST-2: ``negative, positive``, the words of T5's formats,
``bertology.tasks.text_to_text.GLUE_FORMATS``); ``{answer}`` is the gold label's word, the first gold answer, the
entities as ``text: TYPE`` joined by ``"; "`` (``none`` without one), or the record's ``output``. A field that the
task does not have is a ConfigError naming the template file, the template and the field. Each example's template
is drawn by a generator keyed by (seed, task, split, example number): the same in every run and order.

**Mixing** (T5's examples-proportional mixing with limit K, Raffel et al. 2020, section 3.5.2): task m with n_m
training examples is drawn with rate r_m = min(n_m, K) / sum_n min(n_n, K). An epoch is sum_m min(n_m, K) draws:
for each draw a task by these rates (a generator keyed by seed and epoch), then that task's next example in an
order shuffled anew each epoch (cycled when a small task is drawn more often than it has examples).

**The loss on the target only.** An encoder-decoder (T5, BART) reads the prompt in its encoder; its decoder learns
the target (``bertology.tasks.text_to_text``: teacher forcing, the cross-entropy at the target's tokens and its
EOS). A decoder (GPT-2) reads ``prompt + " " + target + EOS`` as one sequence (the prompt and the response
tokenised apart, so the boundary is exact; EOS: the model's eos_token_id, else the tokenizer's end-of-text token);
the prompt's positions are labelled -100: only the positions that predict a response token or the EOS carry loss
(``ResponseBatch``). A prompt too long for the model keeps its end.

**Evaluation.** Every dev example is answered by greedy generation (a decoder: after its prompt, up to the first
EOS or line break), read back as the task's prediction (a label word, a number, an answer, entities) and scored
by the task's official metric: accuracy (and F1 / MCC) for GLUE classification, Pearson / Spearman for STS-B, EM and
F1 for SQuAD, conlleval F1 for CoNLL-2003, EM and F1 (SQuAD's normalisation) for a user's JSONL. The metrics are
``mixture_mean`` (the mean of each mixture task's first metric: what selects the model), ``<task>_<metric>`` for
each mixture task and ``heldout_<task>_<metric>`` for each held-out one. Held-out tasks' training files are never
read. Predictions: ``dev_predictions.jsonl``, one object per dev example (task, id, template, the generated text).
"""

from __future__ import annotations

import json
import math
import os
import string
import zlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from bertology.config import from_mapping, validate
from bertology.errors import ConfigError, DataError
from bertology.inputs import json_object, text_lines
from bertology.io import atomic_write
from bertology.model.heads import HeadSpec
from bertology.model.protocol import DECODER_ONLY, ENCODER_DECODER, GENERATES, Model, capabilities, model_kind
from bertology.tasks import metrics
from bertology.tasks.base import TASKS
from bertology.tasks.examples import TaggedSentence, TextExample
from bertology.tasks.sequence import EncodedExamples, bucketed_plan
from bertology.tasks.text_to_text import (MAX_TARGET_TOKENS, GlueTextToText, TargetCrossEntropy, TextPairs,
                                          lm_head, score_text, start_token)
from bertology.tokenization import Tokenizer

__all__ = ["InstructionsConfig", "InstructionTask", "InstructionExample", "ResponseBatch", "PromptResponses",
           "Mixture", "mixing_rates", "is_instructions_file", "load_instructions", "render", "template_fields"]

SECTION = "instructions"
GLUE_NAMES = ("sst2", "cola", "mrpc", "rte", "stsb")
ANSWER_TOKENS = {"squad": 32, "conll2003": 48, "jsonl": MAX_TARGET_TOKENS}  # generated at most (GLUE: its words)
NO_ENTITY = "none"


# ------------------------------------------------------------------------------------------------ the file
@dataclass
class InstructionTaskConfig:
    """One task of the mixture or of the held-out family: a registered ``name`` (sst2, cola, mrpc, rte, stsb,
    squad, conll2003) read from ``data`` (default: ``task.data``), or with ``train`` / ``dev`` a user's JSONL files
    of ``{instruction, input, output}`` records; ``templates``: the template set (default: ``name``)."""

    name: str = ""
    data: str | None = None
    templates: str | None = None
    train: str | None = None
    dev: str | None = None

    def __post_init__(self) -> None:
        validate(self, "InstructionTaskConfig")
        if not self.name.strip():
            raise ConfigError("InstructionTaskConfig.name: required")
        if (self.train is None) != (self.dev is None):
            raise ConfigError("InstructionTaskConfig: a user's JSONL task names both train and dev files")
        if self.train is None and self.name not in (*GLUE_NAMES, "squad", "conll2003"):
            raise ConfigError(f"InstructionTaskConfig.name: {self.name!r} is not a task instruction tuning reads "
                              f"(known: {', '.join((*GLUE_NAMES, 'squad', 'conll2003'))}; or train/dev JSONL files)")
        if self.train is not None and self.data is not None:
            raise ConfigError("InstructionTaskConfig.data: a JSONL task names its own files (train, dev)")


@dataclass
class InstructionsConfig:
    """The ``instructions:`` section (see the module docstring)."""

    templates: str = ""
    tasks: list[InstructionTaskConfig] = field(default_factory=list)
    heldout: list[InstructionTaskConfig] = field(default_factory=list)
    limit: int = 3000
    seed: int = 0

    def __post_init__(self) -> None:
        validate(self, "InstructionsConfig")
        if not self.templates.strip():
            raise ConfigError("InstructionsConfig.templates: required (the template file)")
        if not self.tasks:
            raise ConfigError("InstructionsConfig.tasks: at least one task to train on")
        if self.limit < 1:
            raise ConfigError(f"InstructionsConfig.limit: must be >= 1, got {self.limit}")
        names = [t.name for t in [*self.tasks, *self.heldout]]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ConfigError(f"InstructionsConfig: task {twice[0]!r} is named twice (a held-out task is never in "
                              "the mixture)")


_LOADED: dict[tuple[str, int, int], Any] = {}


def _read(path: Path) -> dict[str, Any]:
    from bertology.training.config import read_config_file

    stat = path.stat()
    key = (str(path.resolve()), stat.st_mtime_ns, stat.st_size)
    if key not in _LOADED:
        _LOADED[key] = read_config_file(path)
    return _LOADED[key]


def is_instructions_file(path: str | os.PathLike) -> bool:
    """Whether a task file is an instructions file (a mapping with an ``instructions:`` section)."""
    path = Path(path)
    return path.is_file() and SECTION in _read(path)


def load_instructions(path: str | os.PathLike) -> InstructionTask:
    """The ``InstructionTask`` of an instructions file; errors are ConfigErrors naming the file (and the key)."""
    path = Path(path)
    data = _read(path)
    if set(data) != {SECTION}:
        extra = sorted(set(data) - {SECTION})
        raise ConfigError(f"{path}: an instructions file holds the {SECTION} section only; got {extra}")
    try:
        config = from_mapping(InstructionsConfig, data[SECTION], SECTION)
    except ConfigError as error:
        raise ConfigError(f"{path}: {str(error).replace('InstructionsConfig', SECTION)}") from None
    return InstructionTask(config, path)


# ------------------------------------------------------------------------------------------------ templates
@dataclass(frozen=True)
class Template:
    name: str
    prompt: str
    target: str = "{answer}"


def template_fields(text: str, where: str) -> list[str]:
    """The fields of a template text (``{name}``; ``{{`` and ``}}`` are braces), in order; a malformed one, a
    conversion or a format spec is a ConfigError naming ``where``."""
    try:
        parsed = list(string.Formatter().parse(text))
    except ValueError as error:
        raise ConfigError(f"{where}: not a template ({error})") from None
    fields = []
    for _, name, spec, conversion in parsed:
        if name is None:
            continue
        if not name.isidentifier() or spec or conversion:
            raise ConfigError(f"{where}: field {{{name}{'!' + conversion if conversion else ''}"
                              f"{':' + spec if spec else ''}}} is not a plain {{name}}")
        fields.append(name)
    return fields


def render(text: str, values: Mapping[str, str]) -> str:
    """A checked template text filled with ``values`` (every field of it is there: ``template_fields``)."""
    return text.format_map(values)


def read_templates(path: Path) -> dict[str, list[Template]]:
    """The template file: set name -> its templates (each a mapping of name, prompt, target)."""
    from bertology.training.config import read_config_file

    if not path.is_file():
        raise ConfigError(f"{SECTION}.templates: {path}: no such template file")
    data = read_config_file(path)
    sets: dict[str, list[Template]] = {}
    for set_name, entries in data.items():
        where = f"{path}: {set_name}"
        if not isinstance(entries, list) or not entries:
            raise ConfigError(f"{where}: expected a non-empty list of templates ({{name, prompt, target}})")
        templates = []
        for number, entry in enumerate(entries):
            if not isinstance(entry, Mapping):
                raise ConfigError(f"{where}[{number}]: expected a mapping of name, prompt, target")
            unknown = sorted(set(entry) - {"name", "prompt", "target"})
            if unknown or "prompt" not in entry:
                raise ConfigError(f"{where}[{number}]: " + (f"unknown key {unknown[0]!r} (known: name, prompt, "
                                  "target)" if unknown else "prompt: required"))
            values = {key: entry.get(key) for key in ("name", "prompt", "target")}
            for key, value in values.items():
                if value is not None and not isinstance(value, str):
                    raise ConfigError(f"{where}[{number}].{key}: expected a string, got {type(value).__name__}")
            name = values["name"] or f"{set_name}-{number}"
            templates.append(Template(name, values["prompt"], values["target"] or "{answer}"))
        names = [t.name for t in templates]
        if len(set(names)) != len(names):
            raise ConfigError(f"{where}: two templates are named {next(n for n in names if names.count(n) > 1)!r}")
        sets[str(set_name)] = templates
    return sets


# ------------------------------------------------------------------------------------------------ sources
class Source:
    """One task as instructions: where its files are, the fields of an example, its answer, and how a generated
    text is read back and scored."""

    name: str
    metrics: tuple[str, ...]
    fields: tuple[str, ...]
    answer_tokens: int | None = None  # at most this many generated tokens; None: the longest answer word + 1

    def path(self, data: str | None, split: str) -> Path: ...

    def read(self, path: Path, limit: int | None) -> Sequence[Any]: ...

    def values(self, example: Any) -> dict[str, str]: ...

    def answer(self, example: Any) -> str: ...

    def answers(self) -> list[str] | None:
        """Every answer there is (a classification's label words), or None."""
        return None

    def scores(self, texts: Sequence[str], examples: Sequence[Any]) -> dict[str, float]: ...


def _need_data(name: str, data: str | None) -> str:
    if not data:
        raise ConfigError(f"{SECTION}: task {name}: no data folder: give it data: in the instructions file or "
                          "task.data (--data)")
    return data


def clean(text: str) -> str:
    """A generated text as it is read back: its first line, whitespace collapsed."""
    return " ".join(text.strip().split("\n", 1)[0].split())


class GlueSource(Source):
    def __init__(self, name: str) -> None:
        self.task = GlueTextToText(TASKS[name], start_id=-1)  # its label words and their reading only
        self.name, self.metrics = name, self.task.metrics
        pairs = self.task.glue.spec.text_pair is not None
        self.fields = (("sentence1", "sentence2") if pairs else ("sentence",)) + \
            (("options",) if self.task.words is not None else ()) + ("answer",)

    def path(self, data: str | None, split: str) -> Path:
        return self.task.path(_need_data(self.name, data), split)

    def read(self, path: Path, limit: int | None) -> list[TextExample]:
        return self.task.read(path, limit)

    def values(self, example: TextExample) -> dict[str, str]:
        values = {"sentence1": example.text, "sentence2": example.text_pair or ""} if "sentence1" in self.fields \
            else {"sentence": example.text}
        if self.task.words is not None:
            values["options"] = ", ".join(self.task.words.values())
        return values

    def answer(self, example: TextExample) -> str:
        return self.task.target(example)

    def answers(self) -> list[str] | None:
        return list(self.task.words.values()) if self.task.words is not None else None

    def scores(self, texts: Sequence[str], examples: Sequence[TextExample]) -> dict[str, float]:
        return self.task.scores([self.task.prediction(clean(t)) for t in texts], examples)


class SquadSource(Source):
    name, fields, answer_tokens = "squad", ("question", "context", "answer"), ANSWER_TOKENS["squad"]

    def __init__(self) -> None:
        self.task = TASKS["squad"]
        self.metrics = self.task.metrics

    def path(self, data: str | None, split: str) -> Path:
        return self.task.path(_need_data(self.name, data), split)

    def read(self, path: Path, limit: int | None) -> Sequence[Any]:
        return self.task.read(path, limit)

    def values(self, example: Any) -> dict[str, str]:
        return {"question": example.question, "context": example.context}

    def answer(self, example: Any) -> str:
        if not example.answers:
            raise DataError(f"squad question {example.id}: no answer to train on")
        return example.answers[0].text

    def scores(self, texts: Sequence[str], examples: Sequence[Any]) -> dict[str, float]:
        return self.task.scores([clean(t) for t in texts], examples)


def entities_text(sentence: TaggedSentence) -> str:
    """A sentence's entities as the answer says them: ``text: TYPE`` joined by "; " in order, or ``none``."""
    spans = metrics.chunk_spans(sentence.tags or [])
    return "; ".join(f"{' '.join(sentence.words[s:e])}: {kind}" for kind, s, e in spans) or NO_ENTITY


def read_entities(text: str, words: Sequence[str], types: Sequence[str]) -> list[str]:
    """BIO tags of ``words`` from a generated entity list (``entities_text``'s format): each ``text: TYPE`` of a
    known type tags the first untagged run of words equal to its text; anything else is ignored."""
    tags = ["O"] * len(words)
    for item in clean(text).split(";"):
        surface, _, kind = item.strip().rpartition(":")
        kind, piece = kind.strip(), surface.split()
        if kind not in types or not piece:
            continue
        for start in range(len(words) - len(piece) + 1):
            if list(words[start:start + len(piece)]) == piece and \
                    all(tag == "O" for tag in tags[start:start + len(piece)]):
                tags[start:start + len(piece)] = [f"B-{kind}"] + [f"I-{kind}"] * (len(piece) - 1)
                break
    return tags


class ConllSource(Source):
    name, fields, answer_tokens = "conll2003", ("sentence", "options", "answer"), ANSWER_TOKENS["conll2003"]

    def __init__(self) -> None:
        self.task = TASKS["conll2003"]
        self.metrics = ("f1", "precision", "recall")
        self.types = sorted({name[2:] for name in self.task.label_names() if name[:2] in ("B-", "I-")})

    def path(self, data: str | None, split: str) -> Path:
        return self.task.path(_need_data(self.name, data), split)

    def read(self, path: Path, limit: int | None) -> Sequence[TaggedSentence]:
        return list(self.task.read(path, limit))

    def values(self, example: TaggedSentence) -> dict[str, str]:
        return {"sentence": " ".join(example.words), "options": ", ".join(self.types)}

    def answer(self, example: TaggedSentence) -> str:
        return entities_text(example)

    def scores(self, texts: Sequence[str], examples: Sequence[TaggedSentence]) -> dict[str, float]:
        return self.task.scores([read_entities(t, e.words, self.types) for t, e in zip(texts, examples,
                                                                                        strict=True)], examples)


@dataclass(frozen=True)
class Record:
    """One record of a user's JSONL task."""

    id: str
    instruction: str
    input: str
    output: str


class JsonlSource(Source):
    """A user's JSONL: one ``{"instruction": ..., "input": ..., "output": ...}`` object a line (``input`` may be
    missing or empty); scored by SQuAD's exact match and F1 of the generated text against ``output``."""

    fields, answer_tokens = ("instruction", "input", "output", "answer"), ANSWER_TOKENS["jsonl"]
    metrics = ("exact_match", "f1")

    def __init__(self, name: str, files: Mapping[str, Path]) -> None:
        self.name, self.files = name, dict(files)

    def path(self, data: str | None, split: str) -> Path:
        return self.files[split]

    def read(self, path: Path, limit: int | None) -> list[Record]:
        if not path.is_file():
            raise ConfigError(f"{SECTION}: task {self.name}: {path}: no such file")
        records: list[Record] = []
        for number, line in text_lines(path):
            if not line.strip():
                continue
            if limit is not None and len(records) >= limit:
                break
            where = f"{path}:{number}"
            record = json_object(line, where)
            for key in ("instruction", "output"):
                if not isinstance(record.get(key), str) or not record[key].strip():
                    raise DataError(f"{where}: {key!r}: a non-empty string is required")
            if not isinstance(record.get("input", ""), str):
                raise DataError(f"{where}: 'input': expected a string, got {type(record['input']).__name__}")
            unknown = sorted(set(record) - {"instruction", "input", "output"})
            if unknown:
                raise DataError(f"{where}: unknown field {unknown[0]!r} (known: instruction, input, output)")
            records.append(Record(str(len(records)), record["instruction"], record.get("input", ""),
                                  record["output"]))
        if not records:
            raise DataError(f"{path}: no records")
        return records

    def values(self, example: Record) -> dict[str, str]:
        return {"instruction": example.instruction, "input": example.input, "output": example.output}

    def answer(self, example: Record) -> str:
        return example.output

    def scores(self, texts: Sequence[str], examples: Sequence[Record]) -> dict[str, float]:
        if not examples:
            return {"exact_match": math.nan, "f1": math.nan}
        pairs = list(zip((clean(t) for t in texts), (e.output for e in examples), strict=True))
        return {"exact_match": 100 * float(np.mean([metrics.squad_exact_match(p, g) for p, g in pairs])),
                "f1": 100 * float(np.mean([metrics.squad_f1(p, g) for p, g in pairs]))}


# ------------------------------------------------------------------------------------------------ examples
@dataclass(frozen=True)
class InstructionExample:
    """One example as an instruction: ``prompt`` and ``target`` rendered by ``template`` from ``example``, an
    example of task ``task`` (``heldout``: of the held-out family)."""

    id: str
    task: str
    template: str
    prompt: str
    target: str
    example: Any
    heldout: bool = False


def _key(name: str) -> int:
    return zlib.crc32(name.encode("utf-8"))


def template_index(seed: int, task: str, split: str, number: int, count: int) -> int:
    """Which of ``count`` templates example ``number`` of ``task``'s ``split`` is written with: a draw keyed by all
    four (the same whatever else is read, in any order)."""
    return int(np.random.default_rng([seed, _key(task), _key(split), number]).integers(count))


class SplitPath(type(Path())):  # type: ignore[misc]
    """The instructions file as a split of the instruction task: the path is the file's, ``split`` and ``data`` (the
    run's task.data) say which examples ``InstructionTask.read`` gives."""

    split: str = "train"
    data: str | None = None


# ------------------------------------------------------------------------------------------------ batches
@dataclass
class ResponseBatch:
    """A right-padded batch of prompt + response sequences for a decoder. ``labels`` [B, L]: the token each
    position holds where it is a response token or the EOS, -100 on the prompt and padding (transformers'
    convention: position t predicts labels[t + 1]); ``masked_positions`` [N, 2] the positions that predict one,
    ``lm_labels`` [N] the tokens they predict."""

    input_ids: Tensor
    attention_mask: Tensor
    labels: Tensor
    masked_positions: Tensor
    lm_labels: Tensor
    example_ids: Tensor

    def to(self, device: torch.device | str, non_blocking: bool = False) -> ResponseBatch:
        return ResponseBatch(*(t.to(device, non_blocking=non_blocking) for t in (
            self.input_ids, self.attention_mask, self.labels, self.masked_positions, self.lm_labels,
            self.example_ids)))

    def __len__(self) -> int:
        return self.input_ids.shape[0]


class PromptResponses(EncodedExamples):
    """Prompts and responses tokenised apart and joined: ``prompt ids + " " + target ids + EOS`` (``targets`` None:
    the prompts alone, for generation), each at most ``max_length`` tokens (a long prompt keeps its end, a long
    target its first MAX_TARGET_TOKENS tokens)."""

    def __init__(self, tokenizer: Tokenizer, prompts: Sequence[str], targets: Sequence[str] | None, *,
                 max_length: int, eos_id: int, max_new_tokens: int, shuffle: bool = True, seed: int = 0) -> None:
        prompt_ids = [e.ids for e in tokenizer.encode_batch(list(prompts)).encodings]
        if any(not row for row in prompt_ids):
            raise DataError("an instruction prompt encodes to no tokens")
        rows: list[list[int]] = []
        starts: list[int] = []
        if targets is None:
            keep = max(1, max_length - max_new_tokens)
            rows = [row[-keep:] for row in prompt_ids]
            starts = [len(row) for row in rows]
        else:
            spaced = [t if t[:1].isspace() else " " + t for t in targets]
            responses = [e.ids for e in tokenizer.encode_batch(spaced, add_special_tokens=False).encodings]
            for prompt, response in zip(prompt_ids, responses, strict=True):
                response = response[:MAX_TARGET_TOKENS - 1] + [eos_id]
                prompt = prompt[-max(1, max_length - len(response)):]
                rows.append(prompt + response)
                starts.append(len(prompt))
        super().__init__(rows, [[0] * len(row) for row in rows], None, tokenizer.fill_id, shuffle=shuffle,
                         seed=seed)
        self.labelled = targets is not None
        self.starts = np.asarray(starts, dtype=np.int64)
        self.tokenizer, self.eos_id, self.max_new_tokens = tokenizer, eos_id, max_new_tokens

    def collate(self, rows: np.ndarray) -> ResponseBatch:  # type: ignore[override]
        base = super().collate(rows)
        width = base.input_ids.shape[1]
        columns = torch.arange(width)[None, :]
        response = (columns >= torch.from_numpy(self.starts[rows])[:, None]) & base.attention_mask.bool()
        if not self.labelled:
            response = torch.zeros_like(response)
        labels = base.input_ids.masked_fill(~response, -100)
        rows_, cols = (labels[:, 1:] != -100).nonzero(as_tuple=True)
        return ResponseBatch(base.input_ids, base.attention_mask, labels, torch.stack([rows_, cols], 1),
                             base.input_ids[rows_, cols + 1], base.example_ids)

    def prompts(self, indices: Sequence[int]) -> list[list[int]]:
        """The prompt ids of examples ``indices``."""
        return [self.flat_ids[self.offsets[i]:self.offsets[i] + self.starts[i]].tolist() for i in indices]


def mixing_rates(sizes: Sequence[int], limit: int) -> np.ndarray:
    """T5's examples-proportional mixing with limit K: r_m = min(n_m, K) / sum_n min(n_n, K)."""
    capped = np.minimum(np.asarray(sizes, dtype=np.float64), limit)
    if capped.sum() <= 0:
        raise DataError("mixing: every task is empty")
    return capped / capped.sum()


class Mixture:
    """The training batches of a mixture: an epoch of sum_m min(n_m, K) examples, each drawn from task m at its
    ``mixing_rates`` (keyed by seed and epoch), the task's examples in a new shuffled order each epoch, cycled;
    batches of similar lengths (within windows of 50 batches, their order shuffled). ``inner`` collates."""

    def __init__(self, inner: EncodedExamples, tasks: Sequence[int], limit: int, seed: int = 0,
                 bucket_window: int = 50) -> None:
        self.inner, self.limit, self.seed, self.bucket_window = inner, limit, seed, bucket_window
        self.tasks = np.asarray(tasks, dtype=np.int64)
        count = int(self.tasks.max()) + 1 if len(self.tasks) else 0
        self.members = [np.flatnonzero(self.tasks == m) for m in range(count)]
        self.rates = mixing_rates([len(m) for m in self.members], limit)
        self.epoch_size = int(sum(min(len(m), limit) for m in self.members))

    def draw(self, epoch: int) -> np.ndarray:
        """The examples of ``epoch`` in the order drawn."""
        rng = np.random.default_rng([self.seed, epoch, 0x4D4958])
        chosen = rng.choice(len(self.members), size=self.epoch_size, p=self.rates)
        out = np.empty(self.epoch_size, dtype=np.int64)
        for m, members in enumerate(self.members):
            where = np.flatnonzero(chosen == m)
            if not len(where):
                continue
            cycles = -(-len(where) // len(members))
            order = np.concatenate([rng.permutation(members) for _ in range(cycles)])
            out[where] = order[:len(where)]
        return out

    def _order(self, epoch: int, batch_size: int, rank: int, world_size: int, drop_last: bool) -> list[np.ndarray]:
        if batch_size < 1 or world_size < 1 or not 0 <= rank < world_size:
            raise ConfigError(f"batch_size {batch_size}, rank {rank} of {world_size}: invalid")
        rng = np.random.default_rng([self.seed, epoch, 0x42415443])
        return bucketed_plan(self.draw(epoch), self.inner.lengths, rng, batch_size, rank, world_size, drop_last,
                             self.bucket_window)

    def num_batches(self, epoch: int, batch_size: int, rank: int = 0, world_size: int = 1,
                    drop_last: bool = True) -> int:
        return len(self._order(epoch, batch_size, rank, world_size, drop_last))

    def batches(self, epoch: int, batch_size: int, start_batch: int = 0, rank: int = 0, world_size: int = 1,
                drop_last: bool = True) -> Iterator[Any]:
        plan = self._order(epoch, batch_size, rank, world_size, drop_last)
        return (self.inner.collate(rows) for rows in plan[start_batch:])


class DevInstructions:
    """The dev examples encoded once (every task's, for the dev loss: a ``BatchSource``) and each task's own
    prompts for generation."""

    def __init__(self, inner: EncodedExamples, groups: Mapping[str, tuple[list[int], EncodedExamples]]) -> None:
        self.inner, self.groups = inner, dict(groups)

    def num_batches(self, epoch: int, batch_size: int, rank: int = 0, world_size: int = 1,
                    drop_last: bool = True) -> int:
        return self.inner.num_batches(epoch, batch_size, rank, world_size, drop_last)

    def batches(self, epoch: int, batch_size: int, start_batch: int = 0, rank: int = 0, world_size: int = 1,
                drop_last: bool = True) -> Iterator[Any]:
        return self.inner.batches(epoch, batch_size, start_batch, rank, world_size, drop_last)


@torch.no_grad()
def generate_responses(model: Model, encoded: PromptResponses, batch_size: int = 32) -> list[str]:
    """A decoder's greedy response to every prompt (left-padded, up to the first EOS), decoded and stripped, in the
    examples' order."""
    from bertology.generation import generate

    out = [""] * len(encoded)
    device = next(model.parameters()).device
    pad = encoded.tokenizer.fill_id
    order = np.argsort(encoded.starts, kind="stable")
    for begin in range(0, len(order), batch_size):
        indices = order[begin:begin + batch_size].tolist()
        prompts = encoded.prompts(indices)
        width = max(map(len, prompts))
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)
        sequences = generate(model, ids, mask, max_new_tokens=encoded.max_new_tokens, eos_token_id=encoded.eos_id,
                             pad_token_id=pad)
        for index, row in zip(indices, sequences[:, width:].cpu().tolist(), strict=True):
            new = row[:row.index(encoded.eos_id)] if encoded.eos_id in row else row
            out[index] = encoded.tokenizer.decode(new, skip_special_tokens=True).strip()
    return out


# ------------------------------------------------------------------------------------------------ the task
class InstructionTask:
    """The ``FinetuneTask`` of an instructions file (see the module docstring). As loaded it reads, renders and
    scores; ``for_model`` binds it to a decoder or an encoder-decoder, which it then encodes and predicts for."""

    predictions_file = "dev_predictions.jsonl"
    max_length = 256

    def __init__(self, config: InstructionsConfig, source: str | os.PathLike, mode: str | None = None,
                 start_id: int | None = None, eos_id: int | None = None) -> None:
        self.config, self.source = config, Path(source)
        self.root = self.source.resolve().parent
        self.name = self.source.stem
        self.mode, self.start_id, self.eos_id = mode, start_id, eos_id
        templates_path = self._local(config.templates)
        sets = read_templates(templates_path)
        self.sources: dict[str, Source] = {}
        self.templates: dict[str, list[Template]] = {}
        self.heldout = [t.name for t in config.heldout]
        self.data: dict[str, str | None] = {}
        for entry in [*config.tasks, *config.heldout]:
            if entry.train is not None:
                task: Source = JsonlSource(entry.name, {"train": self._local(entry.train),
                                                        "dev": self._local(entry.dev or "")})
            elif entry.name in GLUE_NAMES:
                task = GlueSource(entry.name)
            elif entry.name == "squad":
                task = SquadSource()
            else:
                task = ConllSource()
            self.sources[entry.name] = task
            self.data[entry.name] = None if entry.data is None else str(self._local(entry.data))
            set_name = entry.templates or entry.name
            if set_name not in sets:
                raise ConfigError(f"{templates_path}: no templates for {set_name!r} (task {entry.name}); the file "
                                  f"has {', '.join(sets) or 'none'}")
            for template in sets[set_name]:
                for part, text in (("prompt", template.prompt), ("target", template.target)):
                    where = f"{templates_path}: template {template.name!r} ({set_name}) {part}"
                    for name in template_fields(text, where):
                        if name not in task.fields:
                            raise ConfigError(f"{where}: unknown field {{{name}}} for task {entry.name} (its "
                                              f"fields: {', '.join('{' + f + '}' for f in task.fields)})")
            self.templates[entry.name] = sets[set_name]
        self.mixture = [t.name for t in config.tasks]
        self.metrics = ("mixture_mean",
                        *(f"{name}_{m}" for name in self.mixture for m in self.sources[name].metrics),
                        *(f"heldout_{name}_{m}" for name in self.heldout for m in self.sources[name].metrics))

    def _local(self, path: str) -> Path:
        value = Path(path)
        return value if value.is_absolute() else self.root / value

    # ---------------------------------------------------------------------------------------------- files
    def path(self, data: str | None, split: str) -> SplitPath:
        """The instructions file standing for ``split`` ("train": the mixture's training examples; "dev": every
        task's dev examples, the held-out tasks' included) of the tasks read from ``data`` (``task.data``)."""
        if split not in ("train", "dev"):
            raise ConfigError(f"{self.name}: no split {split!r} (known: train, dev)")
        path = SplitPath(self.source)
        path.split, path.data = split, data or None
        return path

    def examples(self, name: str, split: str, data: str | None, limit: int | None) -> list[InstructionExample]:
        """Task ``name``'s examples of ``split`` (its first ``limit``), each rendered by its keyed template."""
        task, templates = self.sources[name], self.templates[name]
        items = task.read(task.path(self.data[name] or data, split), limit)
        out = []
        for number, example in enumerate(items):
            template = templates[template_index(self.config.seed, name, split, number, len(templates))]
            values = {**task.values(example), "answer": task.answer(example)}
            out.append(InstructionExample(f"{name}:{getattr(example, 'id', number)}", name, template.name,
                                          render(template.prompt, values), render(template.target, values),
                                          example, name in self.heldout))
        return out

    def read(self, path: Path, limit: int | None = None) -> list[InstructionExample]:
        """The examples of a split (``path`` from ``path``; a plain path: the dev split with each task's own
        data): train, every mixture task's (never a held-out one's); dev, every task's. ``limit``: per task."""
        if Path(path).resolve() != self.source.resolve():
            raise ConfigError(f"{self.source}: an instruction task reads the tasks its file names, not {path} (to "
                              "predict a file of one task, use that task: --task sst2, squad, ...)")
        split = getattr(path, "split", "dev")
        data = getattr(path, "data", None)
        names = self.mixture if split == "train" else [*self.mixture, *self.heldout]
        return [e for name in names for e in self.examples(name, split, data, limit)]

    def label_names(self) -> None:
        return None  # the answers are generated text

    # ---------------------------------------------------------------------------------------------- the model
    def for_model(self, model: Model) -> InstructionTask:
        """The task bound to ``model``: a decoder (capability decoder-only) or an encoder-decoder, which generate."""
        kinds = capabilities(model)
        if GENERATES not in kinds or not kinds & {DECODER_ONLY, ENCODER_DECODER}:
            raise ConfigError(f"{self.source}: instruction tuning needs a model that generates text, a decoder "
                              f"(capability {DECODER_ONLY!r}: GPT-2) or an encoder-decoder ({ENCODER_DECODER!r}: "
                              f"T5, BART); the model ({model_kind(model)}) is neither")
        if DECODER_ONLY in kinds:
            eos = model.config.eos_token_id
            return InstructionTask(self.config, self.source, "decoder", eos_id=None if eos is None else int(eos))
        return InstructionTask(self.config, self.source, "seq2seq", start_id=start_token(model))

    def _bound(self) -> str:
        if self.mode is None:
            raise ConfigError(f"{self.name}: the instruction task is not bound to a model yet (for_model)")
        return self.mode

    def end_id(self, tokenizer: Tokenizer) -> int:
        """What ends a decoder's response: the model's eos_token_id, else the tokenizer's separator, else its pad
        token (GPT-2's <|endoftext|> is both its padding and the end of a text)."""
        for value in (self.eos_id, tokenizer.framing.sep_id, tokenizer.pad_id):
            if value is not None:
                return int(value)
        raise ConfigError("a decoder's response ends with an end-of-text token: the model's config has no "
                          "eos_token_id and the tokenizer no separator or padding token")

    def heads(self, config: Any) -> list[HeadSpec]:
        return [lm_head(config)]

    def objectives(self, heads: Sequence[HeadSpec]) -> list[TargetCrossEntropy]:
        return [TargetCrossEntropy(heads[0])]

    def answer_tokens(self, tokenizer: Tokenizer, name: str) -> int:
        """At most this many tokens are generated for task ``name``: its bound, or its longest answer word + 1."""
        task = self.sources[name]
        if task.answer_tokens is not None:
            return task.answer_tokens
        said = task.answers() or [score_text(v / 5) for v in range(26)]
        return max(len(e.ids) for e in tokenizer.encode_batch([" " + s for s in said],
                                                               add_special_tokens=False).encodings) + 1

    def _encoded(self, tokenizer: Tokenizer, examples: Sequence[InstructionExample], max_length: int,
                 labelled: bool, max_new_tokens: int, shuffle: bool, seed: int) -> EncodedExamples:
        prompts = [e.prompt for e in examples]
        targets = [e.target for e in examples] if labelled else None
        if self._bound() == "decoder":
            return PromptResponses(tokenizer, prompts, targets, max_length=max_length, eos_id=self.end_id(tokenizer),
                                   max_new_tokens=max_new_tokens, shuffle=shuffle, seed=seed)
        assert self.start_id is not None
        return TextPairs(tokenizer, prompts, targets, max_length=max_length, start_id=self.start_id,
                         max_new_tokens=max_new_tokens, shuffle=shuffle, seed=seed)

    def encode(self, tokenizer: Tokenizer, examples: Sequence[InstructionExample], max_length: int, *,
               train: bool, seed: int = 0) -> Mixture | DevInstructions:
        """Training: the ``Mixture`` of the examples (seeded by the file's seed and ``seed``). Otherwise: every
        example for the dev loss, and each task's prompts for generation."""
        if not examples:
            raise DataError(f"{self.name}: no examples")
        longest = max(self.answer_tokens(tokenizer, name) for name in {e.task for e in examples})
        if train:
            inner = self._encoded(tokenizer, examples, max_length, True, longest, False, seed)
            index = {name: k for k, name in enumerate(dict.fromkeys(e.task for e in examples))}
            return Mixture(inner, [index[e.task] for e in examples], self.config.limit,
                           seed=self.config.seed * 1_000_003 + seed)
        inner = self._encoded(tokenizer, examples, max_length, True, longest, False, seed)
        groups = {}
        for name in dict.fromkeys(e.task for e in examples):
            members = [k for k, e in enumerate(examples) if e.task == name]
            groups[name] = (members, self._encoded(tokenizer, [examples[k] for k in members], max_length, False,
                                                   self.answer_tokens(tokenizer, name), False, seed))
        return DevInstructions(inner, groups)

    def predict(self, model: Model, encoded: DevInstructions, examples: Sequence[InstructionExample],
                batch_size: int) -> list[str]:
        """The generated text of every example, in the examples' order."""
        from bertology.tasks.text_to_text import generate_texts

        out = [""] * len(examples)
        for members, prompts in encoded.groups.values():
            if self._bound() == "decoder":
                texts = generate_responses(model, prompts, batch_size)  # type: ignore[arg-type]
            else:
                texts = generate_texts(model, prompts, batch_size)  # type: ignore[arg-type]
            for k, text in zip(members, texts, strict=True):
                out[k] = text
        return out

    # ---------------------------------------------------------------------------------------------- scoring
    def scores(self, predictions: Sequence[str], examples: Sequence[InstructionExample]) -> dict[str, float]:
        """Each task's metrics of its generated texts (``<task>_<metric>``, ``heldout_<task>_<metric>``) and the
        mean of the mixture tasks' first metrics (``mixture_mean``)."""
        if len(predictions) != len(examples):
            raise DataError(f"{self.name}: {len(predictions)} predictions for {len(examples)} examples")
        out: dict[str, float] = {}
        firsts = []
        for name in [*self.mixture, *self.heldout]:
            chosen = [(p, e.example) for p, e in zip(predictions, examples) if e.task == name]
            if not chosen:
                continue
            task = self.sources[name]
            result = task.scores([p for p, _ in chosen], [e for _, e in chosen])
            prefix = f"heldout_{name}" if name in self.heldout else name
            out.update({f"{prefix}_{metric}": float(result[metric]) for metric in task.metrics})
            if name not in self.heldout:
                firsts.append(float(result[task.metrics[0]]))
        out["mixture_mean"] = float(np.mean(firsts)) if firsts else math.nan
        return {name: out[name] for name in self.metrics if name in out}

    def write(self, path: Path, predictions: Sequence[str], examples: Sequence[InstructionExample]) -> None:
        with atomic_write(path, "w", encoding="utf-8") as handle:
            for example, text in zip(examples, predictions, strict=True):
                handle.write(json.dumps({"task": example.task, "id": example.id, "template": example.template,
                                         "prediction": text}, ensure_ascii=False) + "\n")

    def evaluate(self, predictions_path: Path, gold_path: Path) -> dict[str, Any]:
        """The metrics of a written predictions file against the dev examples (``gold_path``: ``path(data,
        "dev")``, or the instructions file itself when every task names its data)."""
        examples = self.read(gold_path)
        by_id: dict[str, str] = {}
        for number, line in text_lines(predictions_path):
            if not line.strip():
                continue
            record = json_object(line, f"{predictions_path}:{number}")
            if not isinstance(record.get("id"), str) or not isinstance(record.get("prediction"), str):
                raise DataError(f"{predictions_path}:{number}: 'id' and 'prediction' strings are required")
            if record["id"] in by_id:
                raise DataError(f"{predictions_path}:{number}: id {record['id']!r} is repeated")
            by_id[record["id"]] = record["prediction"]
        missing = [e.id for e in examples if e.id not in by_id]
        if missing:
            raise DataError(f"{predictions_path}: no prediction for {len(missing)} of {len(examples)} examples "
                            f"(the first: {missing[0]})")
        scores = self.scores([by_id[e.id] for e in examples], examples)
        return {name: (value if math.isfinite(value) else None) for name, value in scores.items()}
