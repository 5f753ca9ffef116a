"""The pretraining objectives side by side on one budget: MLM, MLM+NSP, MLM+SOP, SpanBERT, ELECTRA and DistilBERT-
style distillation, each pretraining the same BERT-tiny-sized encoder (2 layers, 128 wide) on the same corpus
(Gutenberg + Brown, one 8k WordPiece tokenizer, one set of shards) for the same wall-clock budget, then fine-tuned
the same way on SST-2 and CoNLL-2003 with three seeds each. docs/OBJECTIVES.md holds the results.

    python benchmarks/objectives.py calibrate   # seconds per step of each objective (run it on an idle machine)
    python benchmarks/objectives.py pretrain    # each objective for budget / its seconds per step steps
    python benchmarks/objectives.py finetune    # every pretrained model x {sst2, conll2003} x seeds 0, 1, 2
    python benchmarks/objectives.py table       # the Markdown table of docs/OBJECTIVES.md

Equal wall clock is enforced as equal step time x steps: `calibrate` measures each objective's seconds per optimizer
step on this machine, and `pretrain` gives each objective `--budget-minutes * 60 / seconds-per-step` steps, so that a
busy machine during `pretrain` slows every run without changing its share of compute. The distillation teacher
(the same width, 4 layers, MLM) is trained first for twice the budget; its cost is not charged to the student, as in
DistilBERT, whose teacher was BERT-base.

The tokenizer and shards are `bertology data prepare`'s (docs/PRETRAINING.md, "BERT-mini on Gutenberg + Brown"):
    runs/mini-gb/tokenizer, runs/mini-gb/shards (10 documents held out for evaluation)
Everything is written under runs/objectives/.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data"
RUNS = ROOT / "runs" / "objectives"
TOKENIZER = ROOT / "runs" / "mini-gb" / "tokenizer"
SHARDS = ROOT / "runs" / "mini-gb" / "shards"
# XLNet reads texts framed as XLNet's (<sep> <cls> at the end, left padding), which only its style of tokenizer
# gives: an 8k lower-cased Unigram trained on the same text, the same documents held out (`prepare_xlnet`).
XLNET_TOKENIZER = ROOT / "runs" / "mini-gb-xlnet" / "tokenizer"
XLNET_SHARDS = ROOT / "runs" / "mini-gb-xlnet" / "shards"
SEEDS = (0, 1, 2)

# One recipe for every objective: the quickstart's lessons (docs/PRETRAINING.md) at sequence length 128.
BASE = {
    "model": {"preset": "tiny", "max_position_embeddings": 128, "hidden_dropout": 0.0, "attention_dropout": 0.0,
              "initializer_range": 0.06},
    "tokenizer": {"path": str(TOKENIZER)},
    "data": {"shards": str(SHARDS),
             "instances": {"kind": "full-sentences", "max_seq_length": 128, "short_seq_prob": 0.1},
             "masking": {"mlm_probability": 0.15, "dynamic": True}},
    "objectives": {"mlm": {"weight": 1.0}},
    "optim": {"batch_size": 32, "lr": 1.0e-3, "warmup_ratio": 0.06, "schedule": "linear", "weight_decay": 0.01,
              "clip_norm": 1.0},
    "run": {"seed": 0, "log_every": 10, "eval_every": 0, "eval_batches": None, "checkpoint_every": 0,
            "keep_last": 1, "progress": False},
    "speed": {"threads": 2, "prefetch": 2},
}

DROP = object()  # in an objective's settings: leave the base's setting out

TEACHER = "teacher"
RANDOM = "random"
REFERENCES = [RANDOM, TEACHER]  # fine-tuned beside the objectives: no pretraining, and the distillation teacher
OBJECTIVES = {
    "mlm": {},
    "mlm+nsp": {"data": {"instances": {"kind": "nsp"}}, "objectives": {"mlm": {"weight": 1.0}, "nsp": {"weight": 1.0}}},
    "mlm+sop": {"data": {"instances": {"kind": "sop"}}, "objectives": {"mlm": {"weight": 1.0}, "sop": {"weight": 1.0}}},
    "spanbert": {"data": {"instances": {"kind": "doc-sentences"},
                          "masking": {"mask_token_prob": 0.8, "random_token_prob": 0.1,
                                      "spans": {"geometric_p": 0.2, "max_words": 10}}},
                 "objectives": {"mlm": {"weight": 1.0}, "span_boundary": {"weight": 1.0, "max_positions": 32}}},
    "electra": {"model": {"family": "electra"},
                "data": {"masking": {"mask_token_prob": 0.85, "random_token_prob": 0.0}},
                "objectives": {"electra": {"generator_size": 0.25, "generator_weight": 1.0, "rtd_weight": 50.0}}},
    # Permutation LM (K = 6, whole-word spans of up to 5 words, configs/xlnet-tiny.yaml) on an XLNet of the same
    # shape: relative positions (no position table), its one dropout rate the hidden one.
    "xlnet": {"model": {"max_position_embeddings": DROP, "attention_dropout": DROP, "summary_last_dropout": 0.0},
              "tokenizer": {"path": str(XLNET_TOKENIZER)},
              "data": {"shards": str(XLNET_SHARDS), "instances": {"kind": "doc-sentences"}, "masking": DROP},
              "objectives": {"plm": {"k": 6, "max_span": 5}}},
    "distill": {"model": {"preset": None},
                "objectives": {"distill": {"teacher": None, "temperature": 2.0,  # set by run_config
                                           "alpha_ce": 5.0, "alpha_mlm": 2.0, "alpha_cos": 1.0,
                                           "init_from_teacher": True}}},
}
TEACHER_CONFIG = {"model": {"num_layers": 4}}

FINETUNE = {  # one recipe per task for every pretrained model; one evaluation, at the end (no dev selection)
    "sst2": {"data": DATA / "glue", "limit_train": 20000, "epochs": 1, "max_length": 64, "lr": 3e-4},
    "conll2003": {"data": DATA / "conll2003", "limit_train": 8000, "epochs": 2, "max_length": 128, "lr": 5e-4},
}
METRIC = {"sst2": "accuracy", "conll2003": "f1"}


def merge(base: dict, extra: dict) -> dict:
    out = dict(base)
    for key, value in extra.items():
        if key == "objectives":  # an objective set replaces the base one
            out[key] = value
        elif value is DROP:  # a setting of the base this run does not take
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


def run_config(name: str, steps: int, out: Path) -> dict:
    extra = TEACHER_CONFIG if name == TEACHER else OBJECTIVES[name]
    config = merge(BASE, extra)
    config["optim"] = {**config["optim"], "total_steps": steps}
    config["run"] = {**config["run"], "output_dir": str(out)}
    if "distill" in config["objectives"]:
        config["objectives"]["distill"] = {**config["objectives"]["distill"], "teacher": str(RUNS / TEACHER / "model")}
    return config


def pretrain(name: str, steps: int, out: Path, overrides: list[str] | None = None) -> None:
    """``overrides``: ``KEY=VALUE`` settings passed to ``bertology pretrain --set`` (e.g. ``optim.lr=3e-3``)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    path = out.parent / f"{out.name}.yaml"
    path.write_text(yaml.safe_dump(run_config(name, steps, out), sort_keys=False))
    command = [sys.executable, "-m", "bertology", "pretrain", "--config", str(path), "--overwrite"]
    for setting in overrides or ():
        command += ["--set", setting]
    print(" ".join(command), flush=True)
    subprocess.run(command, check=True, cwd=ROOT)


def prepare_xlnet(args: argparse.Namespace) -> None:
    """XLNet's tokenizer and shards: an 8,000-token lower-cased Unigram in XLNet's style trained on the text of the
    WordPiece (docs/PRETRAINING.md, "BERT-mini on Gutenberg + Brown"), and the shards prepared as there (the same
    10 documents held out)."""
    from bertology.data.corpus import CorpusSource
    from bertology.tokenization.training import train_tokenizer

    gutenberg = sorted(str(path) for path in (DATA / "gutenberg-nltk").glob("*.txt"))
    sources = [CorpusSource(gutenberg, "text", encoding="latin-1"),
               CorpusSource(str(DATA / "brown-nltk"), "brown", encoding="latin-1")]
    train_tokenizer(sources, "unigram", 8000, style="xlnet", lowercase=True, show_progress=False).save(XLNET_TOKENIZER)
    command = [sys.executable, "-m", "bertology", "data", "prepare", *gutenberg, f"brown:{DATA / 'brown-nltk'}",
               "--format", "text", "--encoding", "latin-1", "--tokenizer", str(XLNET_TOKENIZER), "--out",
               str(XLNET_SHARDS), "--heldout-documents", "0.02", "--seed", "0"]
    subprocess.run(command, check=True, cwd=ROOT)


def seconds_per_step(metrics: Path) -> float:
    """Median seconds per optimizer step over the logged windows after the first (which holds start-up)."""
    from bertology.training import read_metrics

    train = [r for r in read_metrics(metrics) if r["kind"] == "train"]
    windows = []
    for before, after in zip(train[1:], train[2:]):
        seconds = (after["tokens"] - before["tokens"]) / after["tokens_per_s"]
        windows.append(seconds / (after["step"] - before["step"]))
    return statistics.median(windows)


def calibrate(args: argparse.Namespace) -> None:
    """Seconds per step of each objective (`--only`: these, added to the file's earlier ones). `--scale-to
    NAME=SECONDS` rescales the ones measured now so that NAME's equals its earlier (idle) figure: on a busy machine,
    objectives calibrated back to back keep their ratios, and the budget stays the one the earlier runs had."""
    path = RUNS / "seconds_per_step.json"
    timings = json.loads(path.read_text()) if path.exists() else {}
    measured = {}
    for name in args.only or [TEACHER, *OBJECTIVES]:
        if name == "distill" and not (RUNS / TEACHER / "model").exists():
            # the student's step does not depend on what the teacher has learnt: a 1-step teacher will do
            pretrain(TEACHER, 1, RUNS / TEACHER)
        out = RUNS / "calibrate" / name
        pretrain(name, args.calibration_steps, out)
        measured[name] = seconds_per_step(out / "metrics.jsonl")
        print(f"{name}: {measured[name]:.4f} s/step", flush=True)
    if args.scale_to:
        reference, seconds = args.scale_to.split("=")
        factor = float(seconds) / measured[reference]
        print(f"scaled by {factor:.4f} ({reference}: {measured[reference]:.4f} s/step now, {seconds} before)")
        (RUNS / "seconds_per_step_measured.json").write_text(json.dumps(measured, indent=2) + "\n")
        measured = {name: value * factor for name, value in measured.items()}
    path.write_text(json.dumps({**timings, **measured}, indent=2) + "\n")


def pretrain_all(args: argparse.Namespace) -> None:
    timings_path = RUNS / "seconds_per_step.json"
    if not timings_path.exists() and args.timings:
        timings_path.write_text(Path(args.timings).read_text())
    timings = json.loads(timings_path.read_text())
    budget = args.budget_minutes * 60
    names = args.only or [TEACHER, *OBJECTIVES]
    plan = {name: int(budget * (2 if name == TEACHER else 1) / timings[name]) for name in names}
    plan_path = RUNS / "plan.json"
    earlier = json.loads(plan_path.read_text()) if plan_path.exists() else {}
    if earlier and earlier["budget_minutes"] != args.budget_minutes:
        raise SystemExit(f"{plan_path} planned {earlier['budget_minutes']} minutes each, not {args.budget_minutes}: "
                         "use another --out for another budget")
    steps = {**earlier.get("steps", {}), **plan}  # `--only` adds to the runs already planned there
    plan_path.write_text(json.dumps({"budget_minutes": args.budget_minutes, "steps": steps}, indent=2))
    for name in plan:
        started = time.perf_counter()
        pretrain(name, plan[name], RUNS / name, args.set)
        print(f"{name}: {plan[name]} steps in {time.perf_counter() - started:.0f} s", flush=True)


def random_encoder(out: Path) -> None:
    """The "no pretraining" reference: the MLM run's model as initialised (seed 0), saved without a step."""
    from bertology.model import Pretrained
    from bertology.objectives import build_objectives
    from bertology.recipes.pretrain import build_model, build_tokenizer, seed_everything
    from bertology.training import PretrainConfig

    config = PretrainConfig.from_dict(run_config("mlm", 1, out))
    seed_everything(config.run.seed)
    tokenizer = build_tokenizer(config)
    Pretrained(build_model(config, tokenizer, build_objectives(config.objectives)), tokenizer).save(out / "model")


def finetune_one(name: str, task: str, seed: int) -> dict:
    from bertology.recipes.finetune import FinetuneConfig, finetune

    spec = FINETUNE[task]
    out = RUNS / "finetune" / f"{name}-{task}-s{seed}"
    config = FinetuneConfig.from_dict({
        "model": str(RUNS / name / "model"),
        "task": {"name": task, "data": str(spec["data"]), "epochs": spec["epochs"], "limit_train": spec["limit_train"],
                 "max_length": spec["max_length"]},
        "optim": {"batch_size": 32, "lr": spec["lr"], "warmup_ratio": 0.1, "weight_decay": 0.01, "clip_norm": 1.0},
        "run": {"output_dir": str(out), "progress": False, "seed": seed, "eval_every": 10**9, "log_every": 100,
                "keep_last": 1},
        "speed": {"threads": 2, "prefetch": 2},
    })
    started = time.perf_counter()
    result = finetune(config, overwrite=True)
    return {"model": name, "task": task, "seed": seed, "metric": METRIC[task],
            "value": result.dev_metrics[METRIC[task]], "seconds": time.perf_counter() - started}


def finetune_all(args: argparse.Namespace) -> None:
    path = RUNS / "finetune.jsonl"
    done = set()
    if path.exists():
        done = {(r["model"], r["task"], r["seed"]) for r in map(json.loads, path.read_text().splitlines())}
    if not (RUNS / RANDOM / "model").exists():
        random_encoder(RUNS / RANDOM)
    for seed in SEEDS:  # seed-major: a partial run already has one seed of everything
        for task in args.tasks:
            for name in args.only or REFERENCES + list(OBJECTIVES):
                if (name, task, seed) in done or not (RUNS / name / "model").exists():
                    continue
                row = finetune_one(name, task, seed)
                print(json.dumps(row), flush=True)
                with path.open("a") as f:
                    f.write(json.dumps(row) + "\n")


def heldout(name: str) -> dict:
    """The run's last held-out evaluation ({} without one)."""
    from bertology.training import read_metrics

    evals = [r for r in read_metrics(RUNS / name / "metrics.jsonl") if r["kind"] == "eval"]
    return evals[-1] if evals else {}


def table(args: argparse.Namespace) -> None:
    plan = json.loads((RUNS / "plan.json").read_text())
    timings = json.loads((RUNS / "seconds_per_step.json").read_text())
    rows = [json.loads(line) for line in (RUNS / "finetune.jsonl").read_text().splitlines()]
    print(f"Budget: {plan['budget_minutes']} minutes of pretraining each.\n")
    print("| objective | s / step | steps | held-out MLM acc. | SST-2 dev acc. | CoNLL-2003 dev F1 |")
    print("|---|---|---|---|---|---|")
    for name in REFERENCES + list(OBJECTIVES):
        if not any(r["model"] == name for r in rows):
            continue
        cells = []
        for task in FINETUNE:
            values = [r["value"] for r in rows if r["model"] == name and r["task"] == task]
            if not values:
                cells.append("-")
                continue
            spread = statistics.stdev(values) if len(values) > 1 else 0.0
            cells.append(f"{statistics.mean(values):.2f} ± {spread:.2f} ({len(values)})")
        last = heldout(name) if name != RANDOM else {}
        if "mlm_accuracy" in last:
            mlm_cell = f"{100 * last['mlm_accuracy']:.1f}"
        elif "lm_accuracy" in last:  # XLNet: its permutation LM's targets, not comparable with MLM's
            mlm_cell = f"{100 * last['lm_accuracy']:.1f} (PLM)"
        elif "generator_accuracy" in last:  # ELECTRA: its generator's, with 15 % of the targets left visible
            mlm_cell = f"{100 * last['generator_accuracy']:.1f} (generator)"
        else:
            mlm_cell = "-"
        seconds = f"{timings[name]:.3f}" if name in timings else "-"
        print(f"| {name} | {seconds} | {plan['steps'].get(name, 0)} | {mlm_cell} | {' | '.join(cells)} |")


def main() -> None:
    global RUNS
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("phase", choices=["prepare-xlnet", "calibrate", "pretrain", "finetune", "table"])
    parser.add_argument("--budget-minutes", type=float, default=5.0)
    parser.add_argument("--calibration-steps", type=int, default=60)
    parser.add_argument("--scale-to", metavar="NAME=SECONDS",
                        help="calibrate: rescale so that NAME's seconds per step are SECONDS (its idle figure)")
    parser.add_argument("--only", nargs="*", help="objectives to run (default: all)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="pretrain: a run-config setting for every run of this call (e.g. optim.lr=3e-3)")
    parser.add_argument("--tasks", nargs="*", default=list(FINETUNE))
    parser.add_argument("--timings", help="pretrain: seconds per step from an earlier calibrate (its JSON file)")
    parser.add_argument("--out", default=str(RUNS.relative_to(ROOT)),
                        help="the runs' directory (default runs/objectives); calibrate reads and writes it too")
    args = parser.parse_args()
    RUNS = ROOT / args.out
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    for path in (TOKENIZER, SHARDS) if args.phase != "prepare-xlnet" else ():
        if not path.exists():
            raise SystemExit(f"{path} is missing: prepare it as docs/PRETRAINING.md says (BERT-mini on Gutenberg "
                             f"+ Brown)")
    if args.phase in ("calibrate", "pretrain") and "xlnet" in (args.only or OBJECTIVES):
        for path in (XLNET_TOKENIZER, XLNET_SHARDS):
            if not path.exists():
                raise SystemExit(f"{path} is missing: run `python benchmarks/objectives.py prepare-xlnet` first")
    RUNS.mkdir(parents=True, exist_ok=True)
    {"prepare-xlnet": prepare_xlnet, "calibrate": calibrate, "pretrain": pretrain_all, "finetune": finetune_all,
     "table": table}[args.phase](args)


if __name__ == "__main__":
    main()
