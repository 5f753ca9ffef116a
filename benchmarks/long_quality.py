"""From a short model to a long one, measured: held-out MLM loss on long documents and SQuAD with the whole article.

    python benchmarks/long_quality.py all            # every stage below, in order (hours on one CPU thread)
    python benchmarks/long_quality.py STAGE ...      # one or more stages; a stage whose output exists is skipped
    python benchmarks/long_quality.py squad --runs short:1 long:1   # some of the six fine-tuning runs
    python benchmarks/long_quality.py table          # the tables of docs/LONG.md from the runs' files

Stages (every command is a `bertology` command, run with one thread; outputs under --root, default
runs/long-quality):

- `prepare`: an 8k byte-level BPE tokenizer and pretraining shards of Gutenberg + Brown, chesterton-thursday.txt left
  out of both (it is the held-out long text), 2 % of the other documents held out for the runs' own evaluation.
- `short`: the short model, `long_quality/short-pretrain.yaml` (a RoBERTa-shaped MLM model of 128 positions).
- `convert`: `bertology longformer convert --max-length 2048 --window 128` of it.
- `long`: continued MLM pretraining of the converted model on sequences of 2,048 tokens, `long_quality/long-pretrain.yaml`.
- `mlm-loss`: `bertology longformer mlm-loss` on chesterton-thursday.txt cut into documents of 2,046 tokens, for the
  short model reading windows, the converted model before pretraining, every checkpoint of the continued
  pretraining and its final model (the same masked tokens for all).
- `squad-data`: a subset of SQuAD v1.1 part A split by article as `squad-article` splits it: every article whole (one
  context: its paragraphs joined as `whole_articles` joins them), --train-questions questions of each of the 18
  training articles and --dev-questions of each of the 6 dev articles (evenly spaced through the article).
- `squad`: `bertology finetune --task squad-article` of the short model (windows of 128 tokens, 32 a step) and of the
  continued-pretrained Longformer (windows of 2,048 tokens, 2 a step, the question global), the same steps,
  learning rate and schedule, seeds 1-3; each scored once at the end with the official EM/F1 on the dev subset.
- `control`: the short model pretrained further with the same steps, tokens per step and optimizer as the
  Longformer (`long_quality/short-more.yaml`), scored on the same masked tokens (`mlm-loss-control.jsonl`).
- `masking`: (a), (b), (c) and the control once more on another masking of the same documents (seed 1).
- `table`: the tables (markdown) and `--root/long-quality.json`.

With `--short-model DIR` a pretrained BERT or RoBERTa (such as all-MiniLM-L6-v2) replaces the small model: `convert`
makes the Longformer of it (`--long-length`, `--window`) and `squad` fine-tunes both on the whole-article subset
(`--long-model`: the converted directory; `--short-length`, `--tokens-per-step`, `--threads`); docs/LONG.md, "Whole-
article SQuAD with a pretrained model", has the command and its results on a GPU."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
DATA = Path("../shared/data")
HELDOUT = "chesterton-thursday.txt"
STAGES = ("prepare", "short", "convert", "long", "mlm-loss", "squad-data", "squad", "control", "masking", "table")
SIDES = ("short", "long")
SEEDS = (1, 2, 3)
# The short model: the step-1,000 checkpoint of short-pretrain.yaml's 1,500-step schedule (the measured run was
# stopped there for time; its learning rate was then 0.35 of the peak).
SHORT = Path("short") / "checkpoints" / "step-0001000"


THREADS = 1  # --threads


def bertology(*args: str, log: Path | None = None) -> str:
    """Run one `bertology` command with THREADS threads; its stdout returned (and its stderr into `log` when given)."""
    threads = str(THREADS)
    env = {**os.environ, "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads, "RAYON_NUM_THREADS": threads,
           "TOKENIZERS_PARALLELISM": "false", "PYTHONPATH": str(HERE.parent / "src")}
    print("$ bertology " + " ".join(args), file=sys.stderr, flush=True)
    started = time.perf_counter()
    with open(log, "a", encoding="utf-8") if log else open(os.devnull, "w") as err:
        done = subprocess.run([sys.executable, "-m", "bertology", *args], env=env, stdout=subprocess.PIPE,
                              stderr=err if log else None, text=True)
    if done.returncode:
        raise SystemExit(f"bertology {args[0]} failed ({done.returncode}){f'; see {log}' if log else ''}")
    print(f"  {time.perf_counter() - started:.0f} s", file=sys.stderr, flush=True)
    return done.stdout


def corpus() -> list[str]:
    books = DATA / "gutenberg-nltk"
    return [str(books / "[!c]*.txt"), str(books / "chesterton-b*.txt"), f"brown:{DATA / 'brown-nltk'}"]


def config(name: str, root: Path) -> list[str]:
    """The yaml in long_quality/ with its paths moved under `root` (they name runs/long-quality)."""
    sets = {"short-pretrain.yaml": ["tokenizer.path=tokenizer", "data.shards=shards", "run.output_dir=short"],
            "long-pretrain.yaml": ["model.init_from=long", "tokenizer.path=long", "data.shards=shards",
                                   "run.output_dir=long-pretrained"],
            "short-more.yaml": [f"model.init_from={SHORT}", f"tokenizer.path={SHORT}", "data.shards=shards",
                                "run.output_dir=short-more"]}[name]
    args = ["--config", str(HERE / "long_quality" / name)]
    for item in sets:
        key, value = item.split("=")
        args += ["--set", f"{key}={root / value}"]
    return args


def prepare(root: Path) -> None:
    if not (root / "tokenizer").is_dir():
        bertology("tokenizer", "train", *corpus(), "--format", "text", "--encoding", "latin-1", "--kind", "bpe",
                  "--vocab-size", "8000", "--out", str(root / "tokenizer"), "--quiet")
    if not (root / "shards").is_dir():
        bertology("data", "prepare", *corpus(), "--format", "text", "--encoding", "latin-1", "--tokenizer",
                  str(root / "tokenizer"), "--out", str(root / "shards"), "--heldout-documents", "0.02", "--seed",
                  "0", "--quiet")


def pretrain(root: Path, name: str, out: str, model: Path = Path("model")) -> None:
    if not (root / out / model).is_dir():
        bertology("pretrain", *config(name, root), log=root / f"{out}.log")


def convert(root: Path, short: Path, max_length: int, window: int) -> None:
    if not (root / "long").is_dir():
        bertology("longformer", "convert", "--model", str(short), "--max-length", str(max_length),
                  "--window", str(window), "--out", str(root / "long"))


def mlm_loss(root: Path) -> None:
    out = root / "mlm-loss.jsonl"
    if out.is_file():
        return
    checkpoints = sorted((root / "long-pretrained" / "checkpoints").glob("step-*"), key=lambda p: int(p.name[5:]))
    models = [root / SHORT, root / "long", *checkpoints, root / "long-pretrained" / "model"]
    args = ["longformer", "mlm-loss", "--text", str(DATA / "gutenberg-nltk" / HELDOUT), "--encoding", "latin-1"]
    for model in models:
        args += ["--model", str(model)]
    lines = bertology(*args)
    out.write_text(lines, encoding="utf-8")


def control(root: Path) -> None:
    """The short model pretrained further as the Longformer was (same steps and tokens), scored as `mlm-loss` (the
    same documents: run after it)."""
    pretrain(root, "short-more.yaml", "short-more")
    out = root / "mlm-loss-control.jsonl"
    if not out.is_file():
        length = json.loads((root / "mlm-loss.jsonl").read_text(encoding="utf-8").splitlines()[0])["document_tokens"]
        out.write_text(bertology("longformer", "mlm-loss", "--text", str(DATA / "gutenberg-nltk" / HELDOUT),
                                 "--encoding", "latin-1", "--length", str(length), "--model", str(root / SHORT),
                                 "--model", str(root / "short-more" / "model")), encoding="utf-8")


def masking(root: Path) -> None:
    """(a), (b), (c) and the control again on another masking of the same documents (seed 1)."""
    out = root / "mlm-loss-seed1.jsonl"
    if not out.is_file():
        length = json.loads((root / "mlm-loss.jsonl").read_text(encoding="utf-8").splitlines()[0])["document_tokens"]
        models = [root / SHORT, root / "long", root / "long-pretrained" / "model", root / "short-more" / "model"]
        out.write_text(bertology("longformer", "mlm-loss", "--text", str(DATA / "gutenberg-nltk" / HELDOUT),
                                 "--encoding", "latin-1", "--length", str(length), "--seed", "1",
                                 *[arg for model in models for arg in ("--model", str(model))]), encoding="utf-8")


def squad_data(root: Path, train_questions: int, dev_questions: int,
               source: Path = DATA / "squad" / "squad-v1.1-dev-part-a.json") -> None:
    """Whole articles, a few questions of each, as the official file pair (train-v1.1.json, dev-v1.1.json)."""
    sys.path.insert(0, str(HERE.parent / "src"))
    from bertology.tasks.lookup import get_task
    from bertology.tasks.qa import split_path

    folder = root / "squad"
    if (folder / "dev-v1.1.json").is_file():
        return
    folder.mkdir(parents=True, exist_ok=True)
    task = get_task("squad-article")
    for split, per_article in (("train", train_questions), ("dev", dev_questions)):
        by_article: dict[str, list] = {}
        for example in task.read(split_path(source, split)):
            by_article.setdefault(example.title, []).append(example)
        data = []
        for title, questions in by_article.items():
            step = max(1, len(questions) // per_article)
            chosen = questions[::step][:per_article]
            qas = [{"id": e.id, "question": e.question,
                    "answers": [{"text": a.text, "answer_start": a.start} for a in e.answers]} for e in chosen]
            data.append({"title": title, "paragraphs": [{"context": questions[0].context, "qas": qas}]})
        (folder / f"{split}-v1.1.json").write_text(json.dumps({"version": "1.1", "data": data}), encoding="utf-8")


def squad(root: Path, runs: list[str], steps: int, lr: float, models: dict[str, Path], lengths: dict[str, int],
          tokens_per_step: int) -> None:
    for run in runs:
        side, seed = run.split(":")
        out = root / "squad-runs" / f"{side}-{seed}"
        if (out / "dev_metrics.json").is_file():
            continue
        length = lengths[side]
        if tokens_per_step % length:
            raise SystemExit(f"--tokens-per-step {tokens_per_step} is not a multiple of the {side} length {length}")
        out.parent.mkdir(parents=True, exist_ok=True)
        started = time.time()
        bertology("finetune", "--task", "squad-article", "--data", str(root / "squad"), "--model", str(models[side]),
                  "--out", str(out), "--max-steps", str(steps), "--overwrite",
                  "--set", f"task.max_length={length}", "--set", f"optim.batch_size={tokens_per_step // length}",
                  "--set", f"optim.lr={lr}", "--set", "optim.warmup_ratio=0.1", "--set", f"run.seed={seed}",
                  "--set", f"run.eval_every={steps}", "--set", "run.log_every=25", "--set", f"speed.threads={THREADS}",
                  "--set", "run.progress=false", log=root / "squad-runs" / f"{side}-{seed}.log")
        (out / "wall.json").write_text(json.dumps({"seconds": round(time.time() - started)}) + "\n", encoding="utf-8")


def unigram_loss(root: Path) -> float:
    """The context-free baseline: cross-entropy at the same masked tokens of the token frequencies of the training
    shards (add-one)."""
    sys.path.insert(0, str(HERE.parent / "src"))
    import numpy as np

    from bertology.recipes.long_mlm import mask_documents
    from bertology.tokenization import load_tokenizer

    text = (DATA / "gutenberg-nltk" / HELDOUT).read_text(encoding="latin-1")
    tokenizer = load_tokenizer(root / SHORT)
    length = json.loads((root / "mlm-loss.jsonl").read_text(encoding="utf-8").splitlines()[0])["document_tokens"]
    labels = np.concatenate([np.asarray(x) for x in mask_documents(tokenizer, [text], length, seed=0).labels])
    counts = np.load(root / "shards" / "unigram_counts.npy").astype(np.float64) + 1
    return float(-np.log(counts[labels] / counts.sum()).mean())


def window_counts(root: Path, short: Path, lengths: dict[str, int]) -> dict:
    """The windows each side reads of the SQuAD subset: all of them, and the training windows holding the answer."""
    out = root / "squad-windows.json"
    if not out.is_file():
        sys.path.insert(0, str(HERE.parent / "src"))
        from bertology.tasks.lookup import get_task
        from bertology.tokenization import load_tokenizer

        task, tokenizer, counts = get_task("squad-article"), load_tokenizer(short), {}
        for side in SIDES:
            for split in ("train", "dev"):
                windows = task.encode(tokenizer, task.read(task.path(str(root / "squad"), split)), lengths[side],
                                      train=False)
                # a window without the answer is labelled at <s>, position 0
                answered = int((windows.labels[:, 0] != 0).sum()) if split == "train" else None
                counts[f"{side}-{split}"] = {"windows": int(windows.num_windows.sum()), "with_answer": answered,
                                             "per_question": [int(windows.num_windows.min()),
                                                              int(windows.num_windows.max())]}
        out.write_text(json.dumps(counts, indent=2) + "\n", encoding="utf-8")
    return json.loads(out.read_text(encoding="utf-8"))


def table(root: Path, short: Path, lengths: dict[str, int]) -> None:
    result: dict = {}
    files = [root / "mlm-loss.jsonl", root / "mlm-loss-control.jsonl", root / "mlm-loss-seed1.jsonl"]
    rows = [{**json.loads(line), "masking_seed": int(f.name.endswith("seed1.jsonl"))} for f in files if f.is_file()
            for line in f.read_text(encoding="utf-8").splitlines() if line.strip()]
    if rows:
        result["mlm_loss"] = rows
        result["unigram_loss"] = unigram = unigram_loss(root)
        print("| model | reads | masking seed | loss (nats) | perplexity | masked tokens | documents |\n"
              "|---|---|---:|---:|---:|---:|---:|")
        for row in rows:
            name = Path(row["model"]).relative_to(root) if Path(row["model"]).is_relative_to(root) else row["model"]
            reads = "one forward" if row["forwards"] == row["documents"] else f"{row['forwards']} windows of {row['window']}"
            print(f"| {name} | {reads} | {row['masking_seed']} | {row['loss']:.4f} | {2.718281828 ** row['loss']:.1f} | {row['masked']} | "
                  f"{row['documents']} |")
        print(f"| token frequencies (add-one) | no context | 0 | {unigram:.4f} | {2.718281828 ** unigram:.1f} | | |")
    scores: dict = {}
    for side in SIDES:
        for seed in SEEDS:
            metrics = root / "squad-runs" / f"{side}-{seed}" / "dev_metrics.json"
            if metrics.is_file():
                values = json.loads(metrics.read_text(encoding="utf-8"))
                wall = root / "squad-runs" / f"{side}-{seed}" / "wall.json"
                values["seconds"] = json.loads(wall.read_text(encoding="utf-8"))["seconds"] if wall.is_file() else None
                scores.setdefault(side, {})[seed] = values
    if scores:
        result["squad_article"] = scores
        result["squad_windows"] = window_counts(root, short, lengths)
        print(json.dumps(result["squad_windows"]))
        print("\n| model | runs | EM mean ± std | F1 mean ± std | EM per seed | F1 per seed |\n|---|---:|---:|---:|---|---|")
        for side, runs in scores.items():
            em = [r["exact_match"] for r in runs.values()]
            f1 = [r["f1"] for r in runs.values()]
            spread = (lambda xs: statistics.stdev(xs) if len(xs) > 1 else float("nan"))
            print(f"| {side} | {len(runs)} | {statistics.mean(em):.2f} ± {spread(em):.2f} | "
                  f"{statistics.mean(f1):.2f} ± {spread(f1):.2f} | {', '.join(f'{x:.2f}' for x in em)} | "
                  f"{', '.join(f'{x:.2f}' for x in f1)} |")
    (root / "long-quality.json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("stages", nargs="+", choices=(*STAGES, "all"))
    parser.add_argument("--root", type=Path, default=Path("runs/long-quality"))
    parser.add_argument("--runs", nargs="+", default=[f"{s}:{seed}" for seed in SEEDS for s in SIDES],
                        help="squad: SIDE:SEED of the runs to make (default all six)")
    parser.add_argument("--steps", type=int, default=300, help="squad: optimizer steps of every run (default 300)")
    parser.add_argument("--lr", type=float, default=5e-4, help="squad: peak learning rate (default 5e-4)")
    parser.add_argument("--train-questions", type=int, default=30, help="squad-data: per training article")
    parser.add_argument("--dev-questions", type=int, default=10, help="squad-data: per dev article")
    parser.add_argument("--short-model", type=Path,
                        help="convert, squad: the short model (default: the one `short` pretrains); another "
                             "pretrained BERT or RoBERTa directory, e.g. all-MiniLM-L6-v2")
    parser.add_argument("--long-model", type=Path, help="squad: the Longformer (default: the one `long` pretrains)")
    parser.add_argument("--short-length", type=int, default=128, help="squad: the short model's windows (default 128)")
    parser.add_argument("--long-length", type=int, default=2048,
                        help="convert: the Longformer's positions; squad: its windows (default 2048)")
    parser.add_argument("--window", type=int, default=128, help="convert: attention_window (default 128)")
    parser.add_argument("--tokens-per-step", type=int, default=4096,
                        help="squad: token positions of every optimizer step, both sides (default 4096)")
    parser.add_argument("--threads", type=int, default=1, help="threads of every command (default 1)")
    args = parser.parse_args()
    global THREADS
    THREADS = args.threads
    short = args.short_model or args.root / SHORT
    models = {"short": short, "long": args.long_model or args.root / "long-pretrained" / "model"}
    lengths = {"short": args.short_length, "long": args.long_length}
    for run in args.runs:
        side, _, seed = run.partition(":")
        if side not in SIDES or not seed.isdigit():
            parser.error(f"--runs: expected short:SEED or long:SEED, got {run!r}")
    stages = STAGES if "all" in args.stages else args.stages
    args.root.mkdir(parents=True, exist_ok=True)
    for stage in stages:
        if stage == "prepare":
            prepare(args.root)
        elif stage == "short":
            pretrain(args.root, "short-pretrain.yaml", "short", SHORT.relative_to("short"))
        elif stage == "convert":
            convert(args.root, short, args.long_length, args.window)
        elif stage == "long":
            pretrain(args.root, "long-pretrain.yaml", "long-pretrained")
        elif stage == "mlm-loss":
            mlm_loss(args.root)
        elif stage == "squad-data":
            squad_data(args.root, args.train_questions, args.dev_questions)
        elif stage == "squad":
            squad(args.root, args.runs, args.steps, args.lr, models, lengths, args.tokens_per_step)
        elif stage == "control":
            control(args.root)
        elif stage == "masking":
            masking(args.root)
        else:
            table(args.root, short, lengths)


if __name__ == "__main__":
    main()
