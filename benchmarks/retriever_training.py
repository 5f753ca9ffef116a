"""Dense retriever training throughput on CPU: `bertology finetune --task retrieval` against sentence-transformers'
own `fit` (MultipleNegativesRankingLoss), the same model (all-MiniLM-L6-v2), batch, data, maximum length and threads.

The data: the train split of SQuAD v1.1 dev part A as `finetune --task retrieval` reads it (each question, its
paragraph, and one BM25 hard negative: `bertology.retrieval.retriever_task`), the first `--batch` x `--steps`
examples, written as the task's JSONL (`train.jsonl`, and a 4-line `dev.jsonl` so that bertology's closing dev pass
is short) and given to `fit` as (anchor, positive, negative) InputExamples. Both sides: AdamW, lr 5e-5, no warm-up,
clipping at 1.0, `--max-length` tokens (128), fp32, `--threads` threads (1). A step's time is its optimizer step as
each side runs it, in wall time and in the process's CPU time (`time.process_time`, which a loaded machine inflates
far less): bertology's `Trainer._step` (forward, backward, clipping, AdamW, the scheduler) wrapped, and a
transformers TrainerCallback handed to the trainer `fit` builds (on_step_begin to on_step_end; without `datasets`,
which `fit` needs, the same work in a plain loop: tokenise, the loss, backward, clipping, AdamW); the first
`--warmup` steps of each are left out and the median of the rest is taken; examples/s = batch / that median. The two
sides run one after the other (`--order` says which first), so a busy neighbour can favour either: rerun, in both
orders, to see the spread.

    python benchmarks/retriever_training.py --quick                 # 2 steps of 4: checks the script
    python benchmarks/retriever_training.py [--batch 16] [--steps 12] [--threads 1] [--order st-first] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import DATA, machine_facts, minilm_dir  # noqa: E402

SQUAD = DATA / "squad" / "squad-v1.1-dev-part-a.json"


def triplets(limit: int) -> list[dict]:
    from bertology.tasks.lookup import get_task

    task = get_task("retrieval")
    examples = task.read(task.path(str(SQUAD), "train"))  # hard negatives from the whole split, as training mines them
    rows = [{"query": e.query, "positive": e.positive, "negatives": list(e.negatives)[:1]} for e in examples]
    return [r for r in rows if r["negatives"]][:limit]


def bertology_steps(data: Path, out: Path, batch: int, steps: int, max_length: int,
                    threads: int) -> tuple[list[float], list[float]]:
    """The wall and the process CPU seconds of each optimizer step (`Trainer._step`: forward, backward, clipping,
    AdamW, the scheduler), timed around the trainer's own step."""
    from bertology.cli.main import main
    from bertology.training.trainer import Trainer

    wall: list[float] = []
    cpu: list[float] = []
    step = Trainer._step

    def timed(self, batches):
        start, clock = time.perf_counter(), time.process_time()
        result = step(self, batches)
        float(result[0].sum())  # the step's tensors are computed by now
        wall.append(time.perf_counter() - start)
        cpu.append(time.process_time() - clock)
        return result

    Trainer._step = timed
    try:
        code = main(["finetune", "--task", "retrieval", "--model", str(minilm_dir()), "--data", str(data), "--out",
                 str(out), "--set", f"optim.batch_size={batch}", "--set", "optim.lr=5e-5", "--set",
                 "optim.warmup_ratio=0", "--set", f"task.max_length={max_length}", "--set", "run.log_every=1",
                     "--set", f"run.eval_every={steps}", "--set", f"speed.threads={threads}", "--max-steps",
                     str(steps)])
    finally:
        Trainer._step = step
    if code != 0:
        raise SystemExit(f"bertology finetune --task retrieval failed ({code})")
    return wall, cpu


def sentence_transformers_fit(rows: list[dict], out: Path, batch: int, steps: int,
                              max_length: int) -> tuple[list[float], list[float]]:
    """The wall and the process CPU seconds of each step of sentence-transformers' own `fit` (its
    SentenceTransformerTrainer inside: the collator's tokenising, MultipleNegativesRankingLoss, backward, clipping at
    1.0, AdamW at lr 5e-5 without warm-up, zero_grad), timed by a TrainerCallback from on_step_begin to on_step_end.
    `fit` builds its trainer itself, so the callback is handed to that trainer's constructor."""
    from sentence_transformers import InputExample, SentenceTransformer, losses
    from sentence_transformers.sentence_transformer.trainer import SentenceTransformerTrainer
    from torch.utils.data import DataLoader
    from transformers import TrainerCallback

    class Clock(TrainerCallback):
        def __init__(self) -> None:
            self.seconds: list[float] = []
            self.cpu: list[float] = []

        def on_step_begin(self, args, state, control, **kwargs):
            self.start, self.clock = time.perf_counter(), time.process_time()

        def on_step_end(self, args, state, control, **kwargs):
            self.seconds.append(time.perf_counter() - self.start)
            self.cpu.append(time.process_time() - self.clock)

    model = SentenceTransformer(str(minilm_dir()), device="cpu")
    model.max_seq_length = max_length
    examples = [InputExample(texts=[r["query"], r["positive"], r["negatives"][0]]) for r in rows]
    clock = Clock()
    constructor = SentenceTransformerTrainer.__init__

    def with_clock(self, *args, **kwargs):
        kwargs["callbacks"] = [*(kwargs.get("callbacks") or []), clock]
        constructor(self, *args, **kwargs)

    here = Path.cwd()
    out.mkdir(parents=True, exist_ok=True)
    SentenceTransformerTrainer.__init__ = with_clock
    os.chdir(out)  # fit's trainer takes a default output directory under the working directory
    try:
        model.fit(train_objectives=[(DataLoader(examples, batch_size=batch, shuffle=True),
                                     losses.MultipleNegativesRankingLoss(model))],
                  epochs=1, steps_per_epoch=steps, scheduler="constantlr", warmup_steps=0,
                  optimizer_params={"lr": 5e-5}, max_grad_norm=1.0, show_progress_bar=False)
    finally:
        os.chdir(here)
        SentenceTransformerTrainer.__init__ = constructor
    if len(clock.cpu) != steps:
        raise SystemExit(f"sentence-transformers' fit ran {len(clock.cpu)} steps, not {steps}")
    return clock.seconds, clock.cpu


def sentence_transformers_loop(rows: list[dict], batch: int, steps: int,
                               max_length: int) -> tuple[list[float], list[float]]:
    """What SentenceTransformerTrainer's step does (tokenise each column, MultipleNegativesRankingLoss, backward,
    AdamW), in a plain loop: for a machine without `datasets`, which the trainer and `fit` need."""
    from sentence_transformers import SentenceTransformer, losses

    torch.manual_seed(0)
    model = SentenceTransformer(str(minilm_dir()), device="cpu")
    model.max_seq_length = max_length
    loss = losses.MultipleNegativesRankingLoss(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-5)
    model.train()
    seconds, cpu = [], []
    for step in range(steps):
        chunk = rows[step * batch:(step + 1) * batch]
        start, clock = time.perf_counter(), time.process_time()
        features = [model.tokenize([r[key] if key != "negatives" else r[key][0] for r in chunk])
                    for key in ("query", "positive", "negatives")]
        value = loss(features, None)
        value.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad()
        seconds.append(time.perf_counter() - start)
        cpu.append(time.process_time() - clock)
    return seconds, cpu


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--max-length", type=int, default=128)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--order", choices=("bertology-first", "st-first"), default="bertology-first")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.quick:
        args.batch, args.steps, args.warmup = 4, 2, 0
    if not SQUAD.is_file():
        raise SystemExit(f"{SQUAD} not found (../shared/data is absent)")
    torch.set_num_threads(args.threads)
    rows = triplets(args.batch * args.steps)
    print(f"{len(rows)} triplets, batch {args.batch}, {args.steps} steps; {machine_facts(args.threads)}",
          file=sys.stderr)
    result: dict = {"machine": machine_facts(args.threads), "batch": args.batch, "steps": args.steps,
                    "max_length": args.max_length, "order": args.order, "load_average": list(os.getloadavg())}
    with tempfile.TemporaryDirectory() as scratch:
        data = Path(scratch) / "pairs"
        data.mkdir()
        (data / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
        (data / "dev.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[:4]), encoding="utf-8")
        sides: dict[str, tuple[list[float], list[float]]] = {}

        def ours() -> None:
            sides["bertology"] = bertology_steps(data, Path(scratch) / "bertology", args.batch, args.steps,
                                                 args.max_length, args.threads)
            torch.set_num_threads(args.threads)

        def theirs() -> None:
            try:
                import datasets  # noqa: F401  (fit's trainer reads a datasets.Dataset)
            except ImportError as error:
                try:
                    sides["sentence-transformers (its loss, a plain loop)"] = sentence_transformers_loop(
                        rows, args.batch, args.steps, args.max_length)
                    print(f"sentence-transformers' fit not run ({error}); its model and loss in a plain AdamW loop "
                          "instead")
                except ImportError as missing:
                    print(f"sentence-transformers not run: {missing}")
            else:
                sides["sentence-transformers (fit)"] = sentence_transformers_fit(
                    rows, Path(scratch) / "st", args.batch, args.steps, args.max_length)
            torch.set_num_threads(args.threads)

        for side in ((ours, theirs) if args.order == "bertology-first" else (theirs, ours)):
            side()
        sides = dict(sorted(sides.items(), key=lambda item: item[0] != "bertology"))  # bertology's row first
        torch.set_num_threads(args.threads)
    print("| side | steps timed | median step CPU s | examples per CPU s | median step wall s | examples/s (wall) |")
    print("|---|---|---|---|---|---|")
    for side, (seconds, cpu) in sides.items():
        kept, kept_cpu = seconds[args.warmup:] or seconds, cpu[args.warmup:] or cpu
        median, median_cpu = float(np.median(kept)), float(np.median(kept_cpu))
        result[side] = {"step_s": [round(s, 3) for s in seconds], "step_cpu_s": [round(s, 3) for s in cpu],
                        "median_step_s": round(median, 3), "examples_per_s": round(args.batch / median, 2),
                        "median_step_cpu_s": round(median_cpu, 3),
                        "examples_per_cpu_s": round(args.batch / median_cpu, 2)}
        print(f"| {side} | {len(kept)} | {median_cpu:.3f} | {args.batch / median_cpu:.2f} | {median:.3f} | "
              f"{args.batch / median:.2f} |")
    if len(sides) == 2:
        other = [side for side in sides if side != "bertology"][0]
        result["speed_up_cpu"] = round(result["bertology"]["examples_per_cpu_s"] / result[other]["examples_per_cpu_s"], 2)
        result["speed_up_wall"] = round(result["bertology"]["examples_per_s"] / result[other]["examples_per_s"], 2)
        print(f"speed-up (bertology / sentence-transformers): {result['speed_up_cpu']:.2f}x by CPU time, "
              f"{result['speed_up_wall']:.2f}x by wall time")
    result["load_average_after"] = list(os.getloadavg())
    print(f"load average {result['load_average']} before, {result['load_average_after']} after")
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
