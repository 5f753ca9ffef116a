"""Domain- and task-adaptive pretraining measured on one budget (docs/ADAPTATION.md), with three fine-tuning seeds.

Part `tapt` (task-adaptive, Gururangan et al. 2020): all-MiniLM-L6-v2 as it is against all-MiniLM-L6-v2 further
pretrained by masked LM on SST-2's training sentences (configs/adapt-tapt.yaml for a calibrated budget), both
fine-tuned on SST-2. MiniLM is saved without an MLM head: `minilm-head` first trains the fresh head alone
(`optim.train_only`, the encoder frozen) for HEAD_STEPS steps, so that the held-out MLM loss at TAPT's step 0 is
the encoder's as it is, not a random head's; `tapt` continues from that model.

Part `dapt` (domain-adaptive, and SciBERT's vocabulary question): a BERT-tiny-shaped encoder (docs/OBJECTIVES.md's
shape and recipe) pretrained on Gutenberg + Brown without Brown's press categories (A-C: reportage, editorial,
reviews; `cats.txt` calls A "news"), then
- `base`: as it is;
- `dapt`: + masked-LM pretraining on news text (Brown's news section and the quickstart's Lee news articles),
  vocabulary kept;
- `dapt-extend`: the same with the vocabulary extended by the news text's 500 most frequent missing entries;
- `scratch`: pretrained from scratch on the news text with a news vocabulary for the base's budget + DAPT's;
- `base-more`: DAPT's control, the base continued for DAPT's budget on more of its general text (run seed 1);
each fine-tuned on CoNLL-2003 (dev = eng.testa, conlleval F1).

Equal compute is equal calibrated time: `calibrate` measures each row's CPU seconds per optimizer step on one
thread (a run of 1 + N steps less a run of 1 step), and `pretrain` gives a row `minutes * 60 / seconds-per-step`
steps, so a busy machine during `pretrain` slows every run without changing its share. Every run is one thread.

    python benchmarks/adaptation.py prepare            # news corpus files, base + news tokenizers and shards
    python benchmarks/adaptation.py calibrate          # seconds per step of each pretraining row
    python benchmarks/adaptation.py pretrain --part dapt
    python benchmarks/adaptation.py finetune --part dapt
    python benchmarks/adaptation.py table              # the Markdown tables of docs/ADAPTATION.md
    python benchmarks/adaptation.py figure             # docs/adaptation.png

The phases take `--part tapt|dapt|all`. The fine-tuning and step-time measurement are benchmarks/objectives.py's
(finetune_model, seconds_per_step, merge, BASE). Everything is written under runs/adaptation/ (`--out`).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import yaml

import objectives
from objectives import BASE, DATA, DROP, ROOT, finetune_model, merge, seconds_per_step

RUNS = ROOT / "runs" / "adaptation"
SEEDS = (0, 1, 2)
BROWN = DATA / "brown-nltk"
GUTENBERG = DATA / "gutenberg-nltk"
PRESS = ("news", "editorial", "reviews")  # Brown's categories A, B, C (CONTENTS: "PRESS: ..."), kept out of the base
NEWS = "news"  # the category of Brown's reportage files ca01-ca44 in cats.txt
MINILM = "all-MiniLM-L6-v2"

# The budgets in calibrated minutes of one thread (sized to a 50 CPU-minute allowance; docs/ADAPTATION.md).
BUDGETS = {"base": 1.5, "dapt": 0.75, "dapt-extend": 0.75, "scratch": 2.25, "base-more": 0.75, "tapt": 14.0,
           "minilm-head": None}
# Rows of a fixed number of steps instead of a budget: the MLM head's warm-up over MiniLM's frozen encoder
HEAD_STEPS = 200
FIXED_STEPS = {"minilm-head": HEAD_STEPS}
HEAD_LR = 1e-3  # the fresh head alone: a head's rate, not the encoder's 1e-4 of TAPT
# base-more, the control of DAPT: base continued for DAPT's steps on more of its general text instead of news
PARTS = {"tapt": ["minilm-head", "tapt"], "dapt": ["base", "dapt", "dapt-extend", "scratch", "base-more"]}
# The fine-tuned models of each part: the pretraining rows and the out-of-box MiniLM
MODELS = {"tapt": ["minilm", "tapt"], "dapt": ["base", "dapt", "dapt-extend", "scratch", "base-more"]}
TASK = {"tapt": "sst2", "dapt": "conll2003"}
OUT_OF_BOX = {"base": "dapt", "minilm": "tapt"}
CONTINUES = {"dapt": "base", "dapt-extend": "base", "base-more": "base", "tapt": "minilm-head"}
GENERAL = {"base-more"}  # rows whose held-out text is the general corpus's, not the news  # the rows that continue another row's model  # the models as they are, and the run whose step 0 evaluates them
FINETUNE = {
    # all-MiniLM-L6-v2's SST-2 recipe of docs/FINETUNING.md (lr 1e-4, 64 tokens), warm-up 10 % as objectives'
    "sst2": {"data": DATA / "glue", "limit_train": 8000, "epochs": 1, "max_length": 64, "lr": 1e-4},
    # docs/OBJECTIVES.md's CoNLL recipe for this encoder size, on the first 4,000 sentences
    "conll2003": {"data": DATA / "conll2003", "limit_train": 4000, "epochs": 2, "max_length": 128, "lr": 5e-4},
}
# DAPT's rows are one shape (2 layers, 128 wide, 128 tokens, 8,000 entries; the extended vocabulary's 500 more rows
# are read only at the embedding and the masked positions): one step costs them the same, and the spread of their
# calibrations (0.195 to 0.237 CPU s a step at load 7 to 11, the extended row among the cheapest) is the
# calibration's noise on the shared machine, not a difference of work. They are charged the mean.
SAME_SHAPE = [("base", "dapt", "dapt-extend", "scratch", "base-more")]
EXTEND_SIZE = 500  # as configs/adapt-dapt.yaml
NEWS_HELDOUT = 0.1  # of the news documents, held out of DAPT and of the scratch run (the same documents for both)
TAPT_CONFIG = ROOT / "configs" / "adapt-tapt.yaml"


def paths(runs: Path) -> dict[str, Path]:
    return {"corpus": runs / "corpus", "base-tokenizer": runs / "tokenizers" / "base",
            "news-tokenizer": runs / "tokenizers" / "news", "base-shards": runs / "shards" / "base",
            "news-base-shards": runs / "shards" / "news-base-vocab",
            "news-news-shards": runs / "shards" / "news-news-vocab"}


def brown_files(keep) -> list[str]:
    """Brown's files whose category (cats.txt) satisfies ``keep``, in file order."""
    files = []
    for number, line in enumerate((BROWN / "cats.txt").read_text(encoding="latin-1").splitlines(), 1):
        if not line.strip():
            continue
        name, *categories = line.split()
        if not categories:
            raise SystemExit(f"{BROWN / 'cats.txt'}:{number}: expected 'FILE CATEGORY', got {line!r}")
        if keep(categories[0]):
            files.append(str(BROWN / name))
    return files


def base_sources(quick: bool):
    from bertology.data.corpus import CorpusSource

    books = sorted(str(p) for p in GUTENBERG.glob("*.txt"))
    brown = brown_files(lambda category: category not in PRESS)
    if quick:
        books, brown = books[:1], brown[:10]
    return [CorpusSource(books, "text", encoding="latin-1"), CorpusSource(brown, "brown", encoding="latin-1")]


def write_news(corpus: Path, quick: bool) -> list[str]:
    """The news text as "bert"-format files (one sentence a line, a blank line after each document): Brown's
    reportage (ca01-ca44) and the Lee articles of the quickstart's corpus (gensim's test data)."""
    from bertology.data.builtin import write_builtin_corpus
    from bertology.data.corpus import read_documents
    from bertology.io import atomic_write

    corpus.mkdir(parents=True, exist_ok=True)
    brown = brown_files(lambda category: category == NEWS)[: 10 if quick else None]
    with atomic_write(corpus / "brown-news.txt", "w", encoding="utf-8") as handle:
        for document in read_documents(brown, "brown", encoding="latin-1"):
            handle.write("\n".join(document) + "\n\n")
    written = write_builtin_corpus(corpus, ["news"], max_documents=60 if quick else None)
    return [str(corpus / "brown-news.txt"), str(written[0].path)]


def news_files(runs: Path) -> list[str]:
    return [str(paths(runs)["corpus"] / "brown-news.txt"), str(paths(runs)["corpus"] / "news.txt")]


def prepare(args: argparse.Namespace) -> None:
    """The news corpus files; the base vocabulary (8,000-entry WordPiece on Gutenberg + Brown without its press) and
    the news vocabulary (the same on the news text); shards of the base corpus (2 % of documents held out, as
    docs/PRETRAINING.md's) and of the news text in each vocabulary (10 % held out, seed 0: the same documents)."""
    from bertology.data.corpus import CorpusSource
    from bertology.data.shards import prepare_corpus
    from bertology.tokenization import load_tokenizer
    from bertology.tokenization.training import train_tokenizer

    where = paths(RUNS)
    news = write_news(where["corpus"], args.quick)
    news_source = CorpusSource(news, "bert")
    for name, sources in (("base", base_sources(args.quick)), ("news", [news_source])):
        if not where[f"{name}-tokenizer"].is_dir():
            train_tokenizer(sources, "wordpiece", 8000, show_progress=False).save(where[f"{name}-tokenizer"])
    for shards, tokenizer, sources, heldout in (
            ("base-shards", "base-tokenizer", base_sources(args.quick), 0.02),
            ("news-base-shards", "base-tokenizer", [news_source], NEWS_HELDOUT),
            ("news-news-shards", "news-tokenizer", [news_source], NEWS_HELDOUT)):
        if not (where[shards] / "metadata.json").is_file():
            prepare_corpus(sources, load_tokenizer(where[tokenizer]), where[shards], heldout_documents=heldout,
                           seed=0, show_progress=False)
    for name in ("base-shards", "news-base-shards", "news-news-shards"):
        metadata = json.loads((where[name] / "metadata.json").read_text())
        print(f"{name}: {json.dumps({k: v for k, v in metadata.items() if not isinstance(v, (dict, list))})}")


# --- the pretraining rows ------------------------------------------------------------------------------------------

RUN = {"eval_at_start": True, "eval_every": 0, "eval_batches": None, "checkpoint_every": 0, "log_every": 5,
       "progress": False}


def run_config(name: str, steps: int, out: Path, runs: Path, base: Path | None = None,
               evaluate_start: bool = True) -> dict:
    """The run config of pretraining row ``name`` for ``steps`` optimizer steps into ``out``; DAPT's rows continue
    ``base`` (default: the base row's model)."""
    where = paths(runs)
    run = {**RUN, "eval_at_start": evaluate_start}
    tiny = merge(BASE, {"speed": {"threads": 1}, "run": run})
    continued = {"model": {"init_from": str(base or runs / "base" / "model")}}
    if name == "base":
        config = merge(tiny, {"tokenizer": {"path": str(where["base-tokenizer"])},
                              "data": {"shards": str(where["base-shards"])}})
    elif name == "dapt":  # the base model's own tokenizer (saved with it), the news shards in that vocabulary
        config = merge(merge(tiny, {"tokenizer": DROP, "model": DROP}),
                       {**continued, "data": {"shards": str(where["news-base-shards"])}})
    elif name == "dapt-extend":  # the base vocabulary + the news text's most frequent missing entries
        config = merge(merge(tiny, {"tokenizer": DROP, "model": DROP}), {
            **continued,
            "tokenizer": {"adapt": "extend", "extend_size": EXTEND_SIZE, "kind": "wordpiece", "vocab_size": 8000,
                          "min_frequency": 2},
            "data": {"shards": DROP, "corpus": news_files(runs), "format": "bert",
                     "heldout_documents": NEWS_HELDOUT}})
    elif name == "base-more":  # the control: the base's own text and tokenizer, continued as DAPT is
        config = merge(merge(tiny, {"tokenizer": DROP, "model": DROP}),
                       {**continued, "data": {"shards": str(where["base-shards"])}})
    elif name == "scratch":
        config = merge(tiny, {"tokenizer": {"path": str(where["news-tokenizer"])},
                              "data": {"shards": str(where["news-news-shards"])}})
    elif name in ("tapt", "minilm-head"):  # the shipped TAPT config, one thread, evaluated before and after
        config = merge(yaml.safe_load(TAPT_CONFIG.read_text()), {"speed": {"threads": 1}, "run": run})
        config["data"]["corpus"] = [str(DATA / "glue" / "SST-2")]
        if name == "minilm-head":  # MiniLM's fresh MLM head alone, the encoder frozen; its curve every 25 steps
            config["optim"] = {**config["optim"], "train_only": ["heads.mlm.*"], "lr": HEAD_LR}
            config["run"] = {**config["run"], "eval_every": 25}
        else:  # TAPT continues the warmed head's model (a calibration: MiniLM itself, the step costs the same)
            config["model"] = {**config["model"], "init_from": str(base or runs / "minilm-head" / "model")}
    else:
        raise SystemExit(f"unknown pretraining row {name!r}; expected one of {', '.join(BUDGETS)}")
    config["optim"] = {**config["optim"], "total_steps": steps}
    # base-more's seed is not base's: with base's, its 212 steps would replay base's first batches, masks included
    config["run"] = {**config["run"], "output_dir": str(out), "seed": 1 if name == "base-more" else 0}
    return config


def pretrain(name: str, steps: int, out: Path, runs: Path, **options) -> dict:
    """Run ``bertology pretrain`` for row ``name`` (``options``: run_config's); its wall and CPU seconds and the
    load average around it."""
    out.parent.mkdir(parents=True, exist_ok=True)
    path = out.parent / f"{out.name}.yaml"
    path.write_text(yaml.safe_dump(run_config(name, steps, out, runs, **options), sort_keys=False))
    command = [sys.executable, "-m", "bertology", "pretrain", "--config", str(path), "--overwrite"]
    print(" ".join(command), flush=True)
    load, cpu, started = os.getloadavg()[0], resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    subprocess.run(command, check=True, cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"})
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return {"name": name, "steps": steps, "seconds": time.perf_counter() - started,
            "cpu_seconds": (after.ru_utime + after.ru_stime) - (cpu.ru_utime + cpu.ru_stime),
            "load_before": load, "load_after": os.getloadavg()[0]}


def rows_of(part: str) -> list[str]:
    return [name for p in (PARTS if part == "all" else [part]) for name in PARTS[p]]


def calibrate(args: argparse.Namespace) -> None:
    """Each row's CPU seconds per optimizer step on one thread: the CPU time of a run of 1 + N steps less that of a
    run of 1 step (start-up, data preparation and the final evaluation cancel), N = --calibration-steps (a third
    of it for TAPT's 22.7M-parameter model). CPU time, not wall time: on the shared machine (load average 4 to 9)
    the wall-clock seconds per step of two rows of the same shape differed twofold (0.34 and 0.68 s). The wall-clock
    figure of objectives.seconds_per_step is kept beside it. DAPT's rows continue the calibration's base model (a
    step's cost does not depend on what the weights have learnt)."""
    log = RUNS / "calibrate.jsonl"
    base = RUNS / "calibrate" / "base" / "model"
    for name in args.only or rows_of(args.part):
        if name.startswith("dapt") and not base.exists():
            pretrain("base", 1 + args.calibration_steps, RUNS / "calibrate" / "base", RUNS, evaluate_start=False)
        steps = max(3, args.calibration_steps // (3 if name in ("tapt", "minilm-head") else 1))
        options = {"base": MINILM if name == "tapt" else base, "evaluate_start": False}
        short = pretrain(name, 1, RUNS / "calibrate" / f"{name}-1", RUNS, **options)
        long = pretrain(name, 1 + steps, RUNS / "calibrate" / name, RUNS, **options)
        row = {"name": name, "steps": steps, "cpu_seconds_per_step": (long["cpu_seconds"] - short["cpu_seconds"]) / steps,
               "wall_seconds_per_step": wall_seconds_per_step(RUNS / "calibrate" / name / "metrics.jsonl"),
               "load": [short["load_before"], long["load_after"]]}
        print(json.dumps(row), flush=True)
        with log.open("a") as handle:  # appended row by row: calibrations of both parts may run side by side
            handle.write(json.dumps(row) + "\n")


def wall_seconds_per_step(metrics: Path) -> float | None:
    """objectives.seconds_per_step, or None where the run logged too few windows for it."""
    try:
        return seconds_per_step(metrics)
    except statistics.StatisticsError:
        return None


def calibrated() -> dict[str, float]:
    """The CPU seconds per step of each calibrated row (its last calibration)."""
    log = RUNS / "calibrate.jsonl"
    if not log.exists():
        raise SystemExit(f"{log} is missing: run the calibrate phase first")
    return {row["name"]: row["cpu_seconds_per_step"] for row in map(json.loads, log.read_text().splitlines())}


def planned_steps(name: str, timings: dict, args: argparse.Namespace) -> int:
    if args.steps is not None:
        return args.steps
    if name in FIXED_STEPS:
        return FIXED_STEPS[name]
    return max(1, int(BUDGETS[name] * 60 / step_cost(name, timings)))


def step_cost(name: str, timings: dict) -> float:
    """The CPU seconds one step of row ``name`` is charged: for rows of one shape (SAME_SHAPE) the mean of their
    calibrations, so that their budgets in steps keep the budgets' ratios exactly."""
    group = next((rows for rows in SAME_SHAPE if name in rows), (name,))
    return statistics.mean(timings[row] for row in group if row in timings)


def pretrain_all(args: argparse.Namespace) -> None:
    timings = calibrated()
    log = RUNS / "pretrain.jsonl"
    for name in args.only or rows_of(args.part):
        steps = planned_steps(name, timings, args)
        row = {**pretrain(name, steps, RUNS / name, RUNS), "budget_minutes": BUDGETS[name],
               "seconds_per_step": step_cost(name, timings) if args.steps is None and name in timings else None}
        print(json.dumps(row), flush=True)
        with log.open("a") as handle:
            handle.write(json.dumps(row) + "\n")


# --- fine-tuning -------------------------------------------------------------------------------------------------

def model_dir(name: str) -> Path | str:
    return MINILM if name == "minilm" else RUNS / name / "model"


def finetune_all(args: argparse.Namespace) -> None:
    """Every model of the part x seeds, skipping those in finetune.jsonl. Several processes started alike share the
    runs: the first to reach one claims it (a file under finetune/claims; remove the folder to redo the runs of a
    killed process)."""
    path = RUNS / "finetune.jsonl"
    claims = RUNS / "finetune" / "claims"
    claims.mkdir(parents=True, exist_ok=True)
    for seed in args.seeds:  # seed-major: a partial run already has one seed of every model
        for part in (PARTS if args.part == "all" else [args.part]):
            task, spec = TASK[part], dict(FINETUNE[TASK[part]])
            if args.quick:
                spec.update(limit_train=32, limit_dev=48, epochs=1)
            for name in args.only or MODELS[part]:
                done = {(r["model"], r["task"], r["seed"]) for r in map(json.loads, path.read_text().splitlines())
                        } if path.exists() else set()
                if name not in MODELS[part] or (name, task, seed) in done:
                    continue
                try:
                    (claims / f"{name}-{task}-s{seed}").open("x").close()
                except FileExistsError:
                    continue
                load = os.getloadavg()[0]
                row = finetune_model(model_dir(name), name, task, spec, seed,
                                     RUNS / "finetune" / f"{name}-{task}-s{seed}", 1)
                row["load_before"] = load
                print(json.dumps(row), flush=True)
                with path.open("a") as handle:
                    handle.write(json.dumps(row) + "\n")


# --- the tables and the figure -------------------------------------------------------------------------------------

def evaluations(name: str) -> list[dict]:
    from bertology.training import read_metrics

    metrics = RUNS / name / "metrics.jsonl"
    return [r for r in read_metrics(metrics) if r["kind"] == "eval"] if metrics.exists() else []


def heldout_loss(name: str) -> tuple[float | None, float | None]:
    """The held-out MLM loss of row ``name`` before its first step and after its last (None where not run)."""
    evals = evaluations(name)
    before = next((r["mlm_loss"] for r in evals if r["step"] == 0), None)
    after = next((r["mlm_loss"] for r in reversed(evals) if r["step"] > 0), None)
    return before, after


def results() -> tuple[list[dict], dict[str, dict]]:
    rows = [json.loads(line) for line in (RUNS / "finetune.jsonl").read_text().splitlines()] \
        if (RUNS / "finetune.jsonl").exists() else []
    runs = {}
    if (RUNS / "pretrain.jsonl").exists():
        for line in (RUNS / "pretrain.jsonl").read_text().splitlines():
            row = json.loads(line)
            runs[row["name"]] = row  # the last run of each row
    return rows, runs


def values(rows: list[dict], name: str, task: str) -> list[tuple[int, float]]:
    return sorted((r["seed"], r["value"]) for r in rows if r["model"] == name and r["task"] == task)


def cell(seeded: list[tuple[int, float]]) -> tuple[str, str]:
    if not seeded:
        return "-", "-"
    numbers = [v for _, v in seeded]
    spread = statistics.stdev(numbers) if len(numbers) > 1 else 0.0
    return f"{statistics.mean(numbers):.2f} ± {spread:.2f}", ", ".join(f"{v:.2f}" for _, v in seeded)


def fmt(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def table(args: argparse.Namespace) -> None:
    rows, runs = results()
    for part in (PARTS if args.part == "all" else [args.part]):
        task = TASK[part]
        metric = objectives.METRIC[task]
        print(f"\n| model | pretraining steps | calibrated min | with its start, min | CPU s | held-out MLM loss before | "
              f"after | {task} dev {metric} (mean ± sd) | per seed |")
        print("|---|---:|---:|---:|---:|---:|---:|---:|---|")
        for name in MODELS[part]:
            run = runs.get(name)
            before, after = heldout_loss(name) if run else (None, None)
            if name in OUT_OF_BOX:  # its in-domain loss is the adaptive run's step 0 (the base's own held-out
                before = after = heldout_loss(OUT_OF_BOX[name])[0]  # text is general text, not news)
            mean, seeds = cell(values(rows, name, task))
            steps = f"{run['steps']:,}" if run else "0"
            own = run["steps"] * run["seconds_per_step"] / 60 if run and run["seconds_per_step"] else None
            start = runs.get(CONTINUES.get(name, ""))  # the run it continued: the model's whole budget
            total = own + start["steps"] * start["seconds_per_step"] / 60 if own and start and \
                start["seconds_per_step"] else own
            cpu = f"{run['cpu_seconds']:.0f}" if run else "-"
            where = " (general text)" if name in GENERAL else ""
            print(f"| {name} | {steps} | {fmt(own, 2)} | {fmt(total, 2)} | {cpu} | {fmt(before)}{where} | {fmt(after)} | "
                  f"{mean} | {seeds} |")
        finetuned = [r for r in rows if r["task"] == task]
        if finetuned:
            cpu = sum(r.get("cpu_seconds", 0.0) for r in finetuned)
            loads = [r["load_before"] for r in finetuned if "load_before" in r]
            print(f"\nfine-tuning: {len(finetuned)} runs, {cpu:.0f} CPU s"
                  + (f", load average {min(loads):.1f} to {max(loads):.1f}" if loads else ""))
    for name, run in runs.items():
        print(f"{name}: {run['steps']} steps, {run['seconds']:.0f} s wall, {run['cpu_seconds']:.0f} CPU s, "
              f"load {run['load_before']:.1f} -> {run['load_after']:.1f}")


def figure(args: argparse.Namespace) -> None:
    """Each part's dev metric per model: the seeds as points, their mean as a dash with its standard deviation."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows, _ = results()
    parts = [p for p in (PARTS if args.part == "all" else [args.part]) if any(r["task"] == TASK[p] for r in rows)]
    if not parts:
        raise SystemExit(f"{RUNS / 'finetune.jsonl'}: no fine-tuning results to plot")
    fig, axes = plt.subplots(1, len(parts), figsize=(3.2 * len(parts) + 1, 3.0), squeeze=False)
    titles = {"tapt": "TAPT: SST-2 dev accuracy", "dapt": "DAPT: CoNLL-2003 dev F1"}
    for ax, part in zip(axes[0], parts):
        names = [n for n in MODELS[part] if values(rows, n, TASK[part])]
        for x, name in enumerate(names):
            seeded = [v for _, v in values(rows, name, TASK[part])]
            spread = statistics.stdev(seeded) if len(seeded) > 1 else 0.0
            ax.errorbar(x, statistics.mean(seeded), yerr=spread, fmt="_", markersize=18, capsize=6, color="#58a")
            ax.plot([x] * len(seeded), seeded, "o", color="#234", markersize=4, alpha=0.8)
        low = min(v for n in names for _, v in values(rows, n, TASK[part]))
        high = max(v for n in names for _, v in values(rows, n, TASK[part]))
        ax.set_ylim(max(0.0, low - 0.15 * (high - low + 1)), high + 0.15 * (high - low + 1))
        ax.set_xticks(range(len(names)), names, fontsize=8)
        ax.set_xlim(-0.6, len(names) - 0.4)
        ax.grid(axis="y", alpha=0.3)
        ax.set_title(titles[part], fontsize=9)
        ax.tick_params(axis="y", labelsize=8)
    fig.tight_layout()
    out = Path(args.figure)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp.png")
    fig.savefig(tmp, dpi=110)
    os.replace(tmp, out)
    print(f"wrote {out}")


def main() -> None:
    global RUNS
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("phase", choices=["prepare", "calibrate", "pretrain", "finetune", "table", "figure"])
    parser.add_argument("--part", choices=["tapt", "dapt", "all"], default="all")
    parser.add_argument("--only", nargs="*", help="the rows (calibrate, pretrain) or models (finetune) to run")
    parser.add_argument("--calibration-steps", type=int, default=30)
    parser.add_argument("--steps", type=int, help="pretrain: this many steps for every row instead of the budget's")
    parser.add_argument("--seeds", nargs="*", type=int, default=list(SEEDS), help="finetune: the seeds")
    parser.add_argument("--quick", action="store_true",
                        help="a check of the whole pipeline: a book and 10 Brown files as the base corpus, 10 news "
                             "files and 60 articles as the news text, 32 fine-tuning examples and 48 of dev")
    parser.add_argument("--figure", default=str(ROOT / "docs" / "adaptation.png"), help="figure: the PNG to write")
    parser.add_argument("--out", help="the runs' directory (default runs/adaptation)")
    args = parser.parse_args()
    RUNS = Path(args.out) if args.out else RUNS
    if not RUNS.is_absolute():
        RUNS = ROOT / RUNS
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    RUNS.mkdir(parents=True, exist_ok=True)
    phases = {"prepare": prepare, "calibrate": calibrate, "pretrain": pretrain_all, "finetune": finetune_all,
              "table": table, "figure": figure}
    phases[args.phase](args)


if __name__ == "__main__":
    main()
