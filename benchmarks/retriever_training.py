"""Dense retriever training throughput on CPU: `bertology finetune --task retrieval` against sentence-transformers'
training (SentenceTransformerTrainer, which `fit` runs, with MultipleNegativesRankingLoss), the same model
(all-MiniLM-L6-v2), batch, data, maximum length and threads.

The data: the train split of SQuAD v1.1 dev part A as `finetune --task retrieval` reads it (each question, its
paragraph, and one BM25 hard negative: `bertology.retrieval.retriever_task`), the first `--batch` x `--steps`
examples, written as the task's JSONL (`train.jsonl`, and a 4-line `dev.jsonl` so that bertology's closing dev pass
is short) and given to sentence-transformers as (anchor, positive, negative) triplets. Both sides: AdamW, lr 5e-5,
no warm-up, `--max-length` tokens (128), fp32, `--threads` threads (1). A step's time is its optimizer step as each
side runs it, in wall time and in the process's CPU time (`time.process_time`, which a loaded machine inflates far
less): bertology's `Trainer._step` (forward, backward, clipping, AdamW, the scheduler) wrapped, and a transformers
TrainerCallback around sentence-transformers' steps (on_step_begin to on_step_end; without `datasets`, which its
trainer needs, the same work in a plain loop: tokenise, the loss, backward, clipping, AdamW); the first
`--warmup` steps of each are left out and the median of the rest is taken; examples/s = batch / that median. The two sides run one
after the other, so a busy neighbour can favour either: rerun to see the spread.

    python benchmarks/retriever_training.py --quick                 # 2 steps of 4: checks the script
    python benchmarks/retriever_training.py [--batch 16] [--steps 12] [--threads 1] [--json OUT.json]
"""

from __future__ import annotations

import argparse
import json
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


def sentence_transformers_steps(rows: list[dict], out: Path, batch: int, steps: int,
                                max_length: int) -> tuple[list[float], list[float]]:
    from datasets import Dataset
    from sentence_transformers import SentenceTransformer, SentenceTransformerTrainer, losses
    from sentence_transformers.training_args import SentenceTransformerTrainingArguments
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
    dataset = Dataset.from_dict({"anchor": [r["query"] for r in rows], "positive": [r["positive"] for r in rows],
                                 "negative": [r["negatives"][0] for r in rows]})
    arguments = SentenceTransformerTrainingArguments(
        output_dir=str(out), per_device_train_batch_size=batch, max_steps=steps, learning_rate=5e-5, warmup_ratio=0.0,
        save_strategy="no", report_to=[], logging_steps=steps, use_cpu=True, dataloader_num_workers=0, seed=0)
    clock = Clock()
    trainer = SentenceTransformerTrainer(model=model, args=arguments, train_dataset=dataset,
                                         loss=losses.MultipleNegativesRankingLoss(model), callbacks=[clock])
    trainer.train()
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
                    "max_length": args.max_length}
    with tempfile.TemporaryDirectory() as scratch:
        data = Path(scratch) / "pairs"
        data.mkdir()
        (data / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
        (data / "dev.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[:4]), encoding="utf-8")
        sides = {"bertology": bertology_steps(data, Path(scratch) / "bertology", args.batch, args.steps,
                                              args.max_length, args.threads)}
        try:
            import datasets  # noqa: F401  (SentenceTransformerTrainer's data)

            sides["sentence-transformers"] = sentence_transformers_steps(rows, Path(scratch) / "st", args.batch,
                                                                         args.steps, args.max_length)
        except ImportError as error:
            try:
                sides["sentence-transformers (its loss, a plain loop)"] = sentence_transformers_loop(
                    rows, args.batch, args.steps, args.max_length)
                print(f"sentence-transformers' trainer not run ({error}); its model and loss in a plain AdamW loop "
                      "instead")
            except ImportError as missing:
                print(f"sentence-transformers not run: {missing}")
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
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
