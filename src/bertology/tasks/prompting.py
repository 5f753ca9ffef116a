"""In-context classification with no training (`bertology prompt`): a decoder prompted zero- or k-shot (GPT-3's
recipe, Brown et al. 2020), or an encoder asked a cloze question (``bertology.tasks.cloze``), with verbalisers and,
as an option, contextual calibration (Zhao et al. 2021).

A *template* holds ``{text}`` (and ``{text_pair}`` for a pair task) and one ``[MASK]``, where a label's word goes;
a *verbaliser* maps one word per label (``good=1,bad=0`` for SST-2). For an example the prompt is

    decoder:  demonstration_1 "\\n" ... demonstration_k "\\n" the template filled up to [MASK]
    encoder:  demonstration_1 " " ... demonstration_k " " the template filled, its [MASK] the tokenizer's mask

where a demonstration is a training example's filled template with its gold label's word at [MASK]. A label's
score is the log-probability of its word as the next token after the prompt (a decoder: the template's space
before [MASK] goes with the word, as byte-level BPE writes " good"), or its word's masked-LM logit at the mask (an
encoder: ``cloze_scores``); the prediction is the best label. Each word must be one token (else a ConfigError
naming it). A decoder's prompt longer than its positions keeps its end (the start of the first demonstration goes);
an encoder's text is shortened as the cloze task shortens it (the demonstrations sit at the start of its text).

Demonstrations are ``shots`` training examples drawn uniformly without replacement by a generator seeded by the seed,
one set per seed for the whole dev set (Zhao et al.'s setting: calibration corrects one prompt); never dev
examples. A train split with fewer examples than ``shots`` is a ConfigError naming --shots and the file.

**Contextual calibration.** With the same demonstrations, the content-free input "N/A" (every text field) gives
label probabilities p_cf (the label words' probabilities renormalised over the labels); each example's p is
corrected by W = diag(p_cf)^-1, b = 0: q = softmax(W p), i.e. q proportional to p / p_cf (``calibrate``).

The result: the task's metrics (x100; ``accuracy`` for SST-2) per seed and their mean and standard deviation over
the seeds (zero-shot: one run, no demonstrations to draw).
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bertology.errors import CheckpointError, ConfigError
from bertology.model.protocol import DECODER_ONLY, MASKED_LM, Model, capabilities, model_kind
from bertology.tasks.cloze import MASK_SLOT, ClozeTask, cloze_scores
from bertology.tasks.examples import TextExample
from bertology.tasks.glue import GlueFinetuneTask
from bertology.tasks.readers import GLUE_TASKS
from bertology.tokenization import Tokenizer

__all__ = ["CONTENT_FREE", "DEFAULTS", "PromptSetup", "calibrate", "decoder_prompt", "draw_demonstrations",
           "parse_verbalizer", "prompt_evaluate"]

CONTENT_FREE = "N/A"
SEPARATOR = "\n"  # between a decoder's demonstrations and before the query
# Each GLUE classification task's default template and verbaliser (word -> label as the file writes it).
DEFAULTS: dict[str, tuple[str, dict[str, str]]] = {
    "sst2": ("{text} It was [MASK] .", {"good": "1", "bad": "0"}),
    "cola": ("{text} This sentence is [MASK] .", {"correct": "1", "wrong": "0"}),
    "mrpc": ("{text} ? [MASK] , {text_pair}", {"Yes": "1", "No": "0"}),
    "rte": ("{text} ? [MASK] , {text_pair}", {"Yes": "entailment", "No": "not_entailment"}),
}
_FIELDS = re.compile(r"\{(text|text_pair)\}")


def parse_verbalizer(text: str, option: str = "--verbalizer") -> dict[str, str]:
    """``good=1,bad=0`` as ``{"good": "1", "bad": "0"}`` (word -> label); a malformed item is a ConfigError."""
    out: dict[str, str] = {}
    for item in text.split(","):
        word, sep, label = item.partition("=")
        if not sep or not word.strip() or not label.strip():
            raise ConfigError(f"{option}: {item!r} is not WORD=LABEL (e.g. good=1,bad=0)")
        if word.strip() in out:
            raise ConfigError(f"{option}: the word {word.strip()!r} is given twice")
        out[word.strip()] = label.strip()
    return out


def calibrate(probabilities: np.ndarray, content_free: np.ndarray) -> np.ndarray:
    """Zhao et al.'s contextual calibration: q = softmax(W p + b) with W = diag(p_cf)^-1 and b = 0, read as
    probabilities renormalised (q_i proportional to p_i / p_cf_i). ``probabilities`` [N, K], ``content_free``
    [K], both probabilities over the K labels."""
    scaled = np.asarray(probabilities, dtype=np.float64) / np.asarray(content_free, dtype=np.float64)[None, :]
    return scaled / scaled.sum(axis=1, keepdims=True)


def draw_demonstrations(train: Sequence[TextExample], shots: int, seed: int) -> list[TextExample]:
    """``shots`` training examples drawn uniformly without replacement by a generator seeded by ``seed``."""
    rng = np.random.default_rng(seed)
    return [train[int(i)] for i in rng.choice(len(train), size=shots, replace=False)] if shots else []


def fill(template: str, text: str, pair: str | None, word: str) -> str:
    """The template with its fields and [MASK] filled (``word`` at the mask)."""
    values = {"text": text, "text_pair": pair or ""}
    return _FIELDS.sub(lambda m: values[m.group(1)], template).replace(MASK_SLOT, word)


def decoder_prompt(template: str, words: Mapping[str, str], demonstrations: Sequence[TextExample],
                   text: str, pair: str | None) -> tuple[str, bool]:
    """A decoder's prompt text for one example after the demonstrations, and whether the label words follow a
    space (the template's space before [MASK], which then belongs to the word's token)."""
    label_word = {label: word for word, label in words.items()}
    shown = [fill(template, d.text, d.text_pair, label_word[str(d.label)]) for d in demonstrations]
    head = fill(template.split(MASK_SLOT, 1)[0], text, pair, "")
    spaced = head.endswith(" ")
    return SEPARATOR.join([*shown, head.rstrip(" ") if spaced else head]), spaced


@dataclass
class PromptSetup:
    """What is asked: the GLUE classification ``task``, its ``template`` and ``verbalizer`` (word -> label)."""

    task: str
    template: str
    verbalizer: dict[str, str]

    def __post_init__(self) -> None:
        if self.task not in GLUE_TASKS or GLUE_TASKS[self.task].labels is None:
            known = [name for name, spec in GLUE_TASKS.items() if spec.labels is not None]
            raise ConfigError(f"--task: prompting classifies: one of {', '.join(known)}; got {self.task!r}")
        self.glue = GlueFinetuneTask(GLUE_TASKS[self.task])
        # the cloze task checks the template's slots and that the verbaliser has one word for each label
        self.cloze = ClozeTask(self.glue, self.template, self.verbalizer, name=self.task)
        self.labels = self.glue.label_names()

    def label_token_ids(self, tokenizer: Tokenizer, decoder: bool, spaced: bool) -> list[int]:
        """Each label's word as one token, in label order: a decoder's as it follows the prompt (with its space),
        an encoder's as the cloze task encodes it."""
        if not decoder:
            return self.cloze.label_token_ids(tokenizer)
        ids = []
        for word in self.cloze.words:
            encoding = tokenizer.encode((" " if spaced else "") + word, add_special_tokens=False)
            if len(encoding.ids) != 1 or encoding.ids[0] == tokenizer.unk_id:
                raise ConfigError(f"--verbalizer: the word {word!r} is not one token of the tokenizer after the "
                                  f"prompt: it is {encoding.tokens}")
            ids.append(encoding.ids[0])
        if len(set(ids)) != len(ids):
            raise ConfigError(f"--verbalizer: the words {list(self.cloze.words)} share a token")
        return ids


@torch.no_grad()
def decoder_scores(model: Model, tokenizer: Tokenizer, prompts: Sequence[str], label_ids: Sequence[int],
                   batch_size: int = 32) -> np.ndarray:
    """[N, K]: the log-probability of each label token as the next token after each prompt (left-padded batches,
    the logits at the last column only; a prompt longer than the model keeps its last positions)."""
    limit = model.config.max_length
    encoded = [ids[-limit:] for ids in (tokenizer.encode(p).ids for p in prompts)]
    device = next(model.parameters()).device
    pad = tokenizer.fill_id
    out = np.zeros((len(prompts), len(label_ids)), dtype=np.float64)
    order = np.argsort([len(e) for e in encoded], kind="stable")
    for begin in range(0, len(order), batch_size):
        rows = order[begin:begin + batch_size].tolist()
        width = max(len(encoded[r]) for r in rows)
        ids = torch.tensor([[pad] * (width - len(encoded[r])) + encoded[r] for r in rows], device=device)
        mask = torch.tensor([[0] * (width - len(encoded[r])) + [1] * len(encoded[r]) for r in rows], device=device)
        last = torch.stack([torch.arange(len(rows), device=device), torch.full((len(rows),), width - 1,
                                                                               device=device)], 1)
        logits = model(ids, mask, masked_positions=last).logits.float()
        scores = torch.log_softmax(logits, dim=-1)[:, list(label_ids)]
        out[rows] = scores.double().cpu().numpy()
    return out


def label_probabilities(scores: np.ndarray) -> np.ndarray:
    """Scores (log-probabilities or logits) [N, K] as probabilities over the K labels."""
    shifted = scores - scores.max(axis=1, keepdims=True)
    exp = np.exp(shifted)
    return exp / exp.sum(axis=1, keepdims=True)


def prompt_evaluate(model: Model, tokenizer: Tokenizer, setup: PromptSetup, train: Sequence[TextExample],
                    dev: Sequence[TextExample], *, shots: int = 0, seeds: Sequence[int] = (0,),
                    calibrated: bool = False, train_path: str | Path = "train", batch_size: int = 32,
                    max_length: int = 512) -> dict[str, Any]:
    """The task's metrics of ``model`` prompted on ``dev`` (see the module docstring): ``per_seed`` (each seed's
    metrics) and, for each metric, the mean over seeds and ``<metric>_sd`` (the sample standard deviation; 0 for
    one run). ``train_path`` names the training file in errors."""
    kinds = capabilities(model)
    decoder = DECODER_ONLY in kinds
    if not decoder and MASKED_LM not in kinds:
        raise ConfigError(f"prompting needs a decoder (capability {DECODER_ONLY!r}: GPT-2) or an encoder with a "
                          f"masked-LM head ({MASKED_LM!r}, cloze); the model ({model_kind(model)}) is neither")
    if not decoder and tokenizer.mask_token is None:
        raise CheckpointError("cloze prompting needs the tokenizer's mask token; this tokenizer has none")
    if shots < 0:
        raise ConfigError(f"--shots: must be >= 0, got {shots}")
    if shots > len(train):
        raise ConfigError(f"--shots {shots}: the train split {train_path} has only {len(train)} examples")
    if not dev:
        raise ConfigError("the dev split has no examples")
    was_training = model.training
    model.eval()
    runs = []
    try:
        for seed in (list(seeds) if shots else [None]):
            shown = draw_demonstrations(train, shots, seed) if shots else []
            probabilities = _probabilities(model, tokenizer, setup, shown, dev, decoder, batch_size, max_length)
            if calibrated:
                free = _probabilities(model, tokenizer, setup, shown, [TextExample(
                    "content-free", CONTENT_FREE, CONTENT_FREE if setup.cloze.pairs else None)], decoder, batch_size,
                    max_length)[0]
                probabilities = calibrate(probabilities, free)
            predictions = [setup.labels[i] for i in probabilities.argmax(axis=1).tolist()]
            runs.append({"seed": seed, **setup.glue.scores(predictions, dev)})
    finally:
        model.train(was_training)
    result: dict[str, Any] = {"per_seed": runs}
    for metric in setup.glue.metrics:
        values = [run[metric] for run in runs]
        result[metric] = float(np.mean(values))
        result[f"{metric}_sd"] = statistics.stdev(values) if len(values) > 1 else 0.0
    return result


def _probabilities(model: Model, tokenizer: Tokenizer, setup: PromptSetup, shown: Sequence[TextExample],
                   examples: Sequence[TextExample], decoder: bool, batch_size: int, max_length: int) -> np.ndarray:
    """[N, K]: the label probabilities of each example after the demonstrations ``shown``."""
    pair = setup.cloze.pairs
    if decoder:
        built = [decoder_prompt(setup.template, setup.verbalizer, shown, e.text, e.text_pair if pair else None)
                 for e in examples]
        label_ids = setup.label_token_ids(tokenizer, True, built[0][1])
        return label_probabilities(decoder_scores(model, tokenizer, [p for p, _ in built], label_ids, batch_size))
    label_word = {label: word for word, label in setup.verbalizer.items()}
    prefix = "".join(fill(setup.template, d.text, d.text_pair, label_word[str(d.label)]) + " " for d in shown)
    asked = [TextExample(e.id, prefix + e.text, e.text_pair if pair else None, e.label) for e in examples]
    encoded = setup.cloze.encode(tokenizer, asked, min(max_length, model.config.max_length), train=False)
    return label_probabilities(cloze_scores(model, encoded, batch_size).astype(np.float64))


def prompt_task(model_dir: str | Path, task: str, data: str | Path, *, shots: int = 0, seeds: Sequence[int] = (0,),
                calibrated: bool = False, template: str | None = None, verbalizer: Mapping[str, str] | None = None,
                limit: int | None = None, batch_size: int = 32, max_length: int = 512,
                device: str | torch.device | None = None, dtype: str = "float32") -> dict[str, Any]:
    """``prompt_evaluate`` of the model in ``model_dir`` on GLUE task ``task`` under the GLUE folder ``data``: its
    train split for demonstrations, its dev split (the first ``limit`` examples) scored. ``template`` and
    ``verbalizer`` default to the task's (``DEFAULTS``). The result also names what was asked."""
    from bertology.device import placement
    from bertology.model.checkpoint import load

    if task not in DEFAULTS:
        raise ConfigError(f"--task: prompting has a default template for {', '.join(DEFAULTS)}; got {task!r}")
    setup = PromptSetup(task, template if template is not None else DEFAULTS[task][0],
                        dict(verbalizer) if verbalizer is not None else dict(DEFAULTS[task][1]))
    if limit is not None and limit < 1:
        raise ConfigError(f"--limit: must be >= 1, got {limit}")
    if batch_size < 1:
        raise ConfigError(f"--batch-size: must be >= 1, got {batch_size}")
    if shots and not seeds:
        raise ConfigError("--seeds: at least one seed to draw demonstrations with")
    where = placement(device, dtype, device_option="--device", dtype_option="--dtype")
    train_path, dev_path = setup.glue.path(str(data), "train"), setup.glue.path(str(data), "dev")
    for path in (train_path, dev_path):
        if not path.is_file():
            raise ConfigError(f"--data: {path}: no such file")
    train = setup.glue.read(train_path) if shots else []
    dev = setup.glue.read(dev_path, limit)
    pretrained = where.move(load(model_dir))
    if pretrained.tokenizer is None:
        raise CheckpointError(f"{model_dir}: no tokenizer files next to the model")
    with where.autocast():
        result = prompt_evaluate(pretrained.model, pretrained.tokenizer, setup, train, dev, shots=shots,
                                 seeds=seeds, calibrated=calibrated, train_path=train_path, batch_size=batch_size,
                                 max_length=max_length)
    kind = "decoder" if DECODER_ONLY in capabilities(pretrained.model) else "cloze"
    return {"task": task, "model": str(model_dir), "kind": kind, "shots": shots, "calibrate": calibrated,
            "template": setup.template, "verbalizer": setup.verbalizer, "examples": len(dev), **result}
