"""The pretraining objectives side by side on one budget: MLM, MLM+NSP, MLM+SOP, SpanBERT, ELECTRA and DistilBERT-
style distillation, each pretraining the same BERT-tiny-sized encoder (2 layers, 128 wide) on the same corpus
(Gutenberg + Brown, one 8k WordPiece tokenizer, one set of shards) for the same wall-clock budget, then fine-tuned
the same way on SST-2 and CoNLL-2003 with three seeds each. docs/OBJECTIVES.md holds the results. DeBERTa-v3's
recipes are entries too: `electra-gdes` (ELECTRA with gradient-disentangled embedding sharing), `deberta-mlm`
(a DeBERTa of the same shape, disentangled attention over relative positions, with MLM) and `deberta-v3` (that
DeBERTa as ELECTRA's discriminator with GDES). With
`--suite architectures` the same phases compare an MLM encoder, a GPT-2 causal LM, a prefix LM, T5's span
corruption and BART's denoising (about 1.5 M parameters each; `prepare` first makes their tokenizers and shards),
fine-tuned on SST-2 and SQuAD: docs/ARCHITECTURES.md. With `--suite t5-objectives` they compare T5's seven
pretraining objectives (`data.span_corruption.objective`) on that suite's tiny T5, fine-tuned on SST-2 through
T5ForSequenceClassification's head, and with `finetune --tasks squad` on SQuAD with generated answers
(docs/ARCHITECTURES.md, "T5's objectives on one budget"). `pretrain --steps NAME=STEPS ...` redoes an earlier plan's
runs at its step counts where its calibration file is gone.

    python benchmarks/objectives.py calibrate   # seconds per step of each objective (run it on an idle machine)
    python benchmarks/objectives.py pretrain    # each objective for budget / its seconds per step steps
    python benchmarks/objectives.py finetune    # every pretrained model x {sst2, conll2003} x seeds 0, 1, 2
    python benchmarks/objectives.py table       # the Markdown table of docs/OBJECTIVES.md
    python benchmarks/objectives.py diagnostics # held-out RTD against its base rate, embedding-table geometry

Equal wall clock is enforced as equal step time x steps: `calibrate` measures each objective's seconds per optimizer
step on this machine, and `pretrain` gives each objective `--budget-minutes * 60 / seconds-per-step` steps, so that a
busy machine during `pretrain` slows every run without changing its share of compute. On a machine that is busy
during `calibrate` too, `--cpu-time` measures each step's process CPU seconds (one thread) instead of its wall clock. The distillation teacher
(the same width, 4 layers, MLM) is trained first for twice the budget; its cost is not charged to the student, as in
DistilBERT, whose teacher was BERT-base.

The tokenizer and shards are `bertology data prepare`'s (docs/PRETRAINING.md, "BERT-mini on Gutenberg + Brown"):
    runs/mini-gb/tokenizer, runs/mini-gb/shards (10 documents held out for evaluation)
Everything is written under runs/objectives/.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING
import yaml

if TYPE_CHECKING:
    from bertology.recipes.finetune import FinetuneConfig

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

ELECTRA = {"generator_size": 0.25, "generator_weight": 1.0, "rtd_weight": 50.0}
ELECTRA_MASKING = {"mask_token_prob": 0.85, "random_token_prob": 0.0}
# DeBERTa-v3's settings at this size: disentangled attention (content-to-position and position-to-content terms)
# over log-bucketed relative positions (64 buckets each side for 128 positions, as v3's 256 for 512), keys shared
# with the content's, a layer-normed relative table, no absolute positions, no token types.
DEBERTA = {"family": "deberta-v2", "relative_attention": True, "pos_att_type": ["p2c", "c2p"],
           "position_buckets": 64, "max_relative_positions": -1, "share_att_key": True, "relative_norm": True,
           "positions": "none", "type_vocab_size": 0}

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
                "data": {"masking": ELECTRA_MASKING},
                "objectives": {"electra": ELECTRA}},
    # The same with DeBERTa-v3's gradient-disentangled embedding sharing instead of ELECTRA's shared embeddings.
    "electra-gdes": {"model": {"family": "electra"},
                     "data": {"masking": ELECTRA_MASKING},
                     "objectives": {"electra": {**ELECTRA, "embedding_sharing": "gdes"}}},
    # DeBERTa (family deberta-v2) of the same shape with MLM, and DeBERTa-v3's pretraining: ELECTRA's generator
    # (the same 1/4 width) and replaced-token detection with gradient-disentangled embedding sharing.
    "deberta-mlm": {"model": DEBERTA},
    "deberta-v3": {"model": DEBERTA,
                   "data": {"masking": ELECTRA_MASKING},
                   "objectives": {"electra": {**ELECTRA, "embedding_sharing": "gdes"}}},
    # Permutation LM (K = 6, whole-word spans of up to 5 words, configs/xlnet-tiny.yaml) on an XLNet of the same
    # shape: relative positions (no position table), its one dropout rate the hidden one.
    "xlnet": {"model": {"architecture": "xlnet", "max_position_embeddings": DROP, "attention_dropout": DROP,
                        "summary_last_dropout": 0.0},
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
METRIC = {"sst2": "accuracy", "conll2003": "f1", "squad": "f1"}


def finetune_recipe(recipe: dict, settings: list[str]) -> dict:
    """``recipe`` (task -> its fine-tuning settings) with ``TASK.KEY=VALUE`` settings (VALUE read as YAML)."""
    out = {task: dict(spec) for task, spec in recipe.items()}
    for setting in settings:
        key, sep, value = setting.partition("=")
        task, dot, name = key.partition(".")
        if not sep or not dot or task not in out or name not in out[task]:
            raise SystemExit(f"--finetune-set {setting}: expected TASK.KEY=VALUE with TASK one of {', '.join(out)} "
                             f"and KEY one of {', '.join(next(iter(out.values())))}")
        out[task][name] = yaml.safe_load(value)
    return out


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


# --- The architectures suite (docs/ARCHITECTURES.md): an MLM encoder, a causal decoder (GPT-2), a prefix LM, T5's
# span corruption and BART's text infilling + sentence permutation, each of about BERT-tiny's parameter count (the
# encoder-decoders have one encoder and one decoder layer: with 2 + 2 they would have 37 % more parameters), on
# the same corpus (one 8k tokenizer of each kind trained on it: `prepare`), the same recipe and the same calibrated
# budget, fine-tuned on SST-2 and SQuAD (part A, split by article: extractive for the encoder and the decoders,
# generated for the encoder-decoders). Positions: 256 (pretraining rows are 128 tokens; SQuAD reads 192).
PREPARED = ROOT / "runs" / "architectures-data"  # the tokenizers and shards, one set per tokenizer kind
# name -> (tokenizer kind, special-token style); 8,000 tokens each, lowercased, trained on the corpus. The same
# byte-level BPE (the same merges) with RoBERTa's and BART's specials (<s> A </s></s> B </s>) or GPT-2's (none);
# T5's Unigram with its 100 sentinels for span corruption.
TOKENIZERS = {"bpe": ("bpe", "bart"), "gpt2": ("bpe", "gpt2"), "t5": ("unigram", "t5")}
CORPUS = [str(DATA / "gutenberg-nltk" / "*.txt"), f"brown:{DATA / 'brown-nltk'}"]


def prepared(name: str) -> dict:
    return {"tokenizer": {"path": str(PREPARED / f"tokenizer-{name}")},
            "data": {"shards": str(PREPARED / f"shards-{name}")}}


def decoder(objective: str) -> dict:
    return merge(prepared("gpt2"), {"model": {"architecture": "decoder", "family": "gpt2"},
                                    "data": {"instances": {"kind": "packed-documents"}},
                                    "objectives": {objective: {}}})


ARCHITECTURES = {
    # RoBERTa counts its two unused position rows in max_position_embeddings: 258 reads 256 tokens
    "mlm": merge(prepared("bpe"), {"model": {"family": "roberta", "max_position_embeddings": 258}}),
    "clm": decoder("clm"),
    "prefixlm": merge(decoder("prefixlm"), {"model": {"prefix_lm": True}}),  # fine-tuned on inputs seen whole
    "t5": merge(prepared("t5"), {
        "model": {"architecture": "seq2seq", "family": "t5", "num_layers": 1, "num_decoder_layers": 1},
        "data": {"instances": {"kind": "doc-sentences"},
                 "span_corruption": {"noise_density": 0.15, "mean_noise_span_length": 3.0}},
        "objectives": {"denoise": {}}}),
    "bart": merge(prepared("bpe"), {
        "model": {"architecture": "seq2seq", "family": "bart", "num_layers": 1, "num_decoder_layers": 1},
        "data": {"instances": {"kind": "doc-sentences"},
                 "noise": {"text_infilling": {"rate": 0.3, "poisson_lambda": 3.0},
                           "sentence_permutation": {"rate": 1.0}}},
        "objectives": {"denoise": {}}}),
}
ARCHITECTURE_BASE = {"model": {"max_position_embeddings": 256}, "speed": {"threads": 1}}
ARCHITECTURE_FINETUNE = {  # sized for a shared 2-core machine: the first questions of each split only
    "sst2": {"data": DATA / "glue", "limit_train": 8000, "epochs": 1, "max_length": 64, "lr": 3e-4},
    "squad": {"data": DATA / "squad", "limit_train": 2000, "limit_dev": 600, "epochs": 1, "max_length": 192,
              "lr": 5e-4},
}


# --- T5's table of objectives (docs/ARCHITECTURES.md, "T5's objectives on one budget"; Raffel et al. 2020, Tables
# 3 to 5): the architectures suite's tiny T5 (one encoder and one decoder layer, its Unigram tokenizer and shards),
# one run per `data.span_corruption.objective`, each with 15 % noise (random spans of mean length 3), on the same
# calibrated budget; fine-tuned on SST-2 through T5ForSequenceClassification's head (the decoder at the input's last
# </s>, `task.text_to_text: false`) on a fixed subset of the training phrases.
T5_OBJECTIVES = ("random-spans", "iid-spans", "bert", "mass", "drop", "deshuffle", "prefix-lm")
T5_TABLE = {name: merge(ARCHITECTURES["t5"], {"data": {"span_corruption": {"objective": name}}})
            for name in T5_OBJECTIVES}
T5_TABLE_FINETUNE = {  # lr 1e-3: the better of the two rates docs/ARCHITECTURES.md tried on SST-2's dev set
    "sst2": {"data": DATA / "glue", "limit_train": 4000, "epochs": 1, "max_length": 64, "lr": 1e-3,
             "text_to_text": False},
    # SQuAD generated (`--tasks squad`, not run by default): on a seq2seq model `squad` is text-to-text already
    # (SquadTextToText; `task.text_to_text` is for the GLUE tasks only). All 4,376 training questions of the split,
    # two epochs (272 steps), scored on the first 300 dev questions; lr 3e-3, whose dev loss was the lower of the
    # two rates probed (every probe's EM and F1 were 0: docs/ARCHITECTURES.md).
    "squad": {"data": DATA / "squad", "limit_train": None, "limit_dev": 300, "epochs": 2, "max_length": 192,
              "lr": 3e-3},
}


@dataclass(frozen=True)
class Suite:
    runs: str  # the default output directory
    base: dict
    entries: dict
    references: list
    finetune: dict
    threads: int
    random_from: str = "mlm"  # the entry whose fresh model is the "no pretraining" reference
    tasks: tuple | None = None  # the tasks `finetune` runs without `--tasks` (None: every task of `finetune`)


SUITES = {
    "objectives": Suite("runs/objectives", BASE, OBJECTIVES, REFERENCES, FINETUNE, 2),
    "architectures": Suite("runs/architectures", merge(BASE, ARCHITECTURE_BASE), ARCHITECTURES, [RANDOM],
                           ARCHITECTURE_FINETUNE, 1),
    # the held-out evaluation at the end on 10 batches (320 rows of the 10 held-out documents)
    "t5-objectives": Suite("runs/t5-objectives", merge(BASE, {**ARCHITECTURE_BASE, "run": {"eval_batches": 10}}),
                           T5_TABLE, [RANDOM], T5_TABLE_FINETUNE, 1, random_from="random-spans", tasks=("sst2",)),
}
SUITE = SUITES["objectives"]


def run_config(name: str, steps: int, out: Path) -> dict:
    extra = TEACHER_CONFIG if name == TEACHER else SUITE.entries[name]
    config = merge(SUITE.base, extra)
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


def cpu_seconds_per_step(name: str, steps: int, out: Path, overrides: list[str]) -> float:
    """Median process CPU seconds per optimizer step of ``name``'s run for ``steps`` steps (after the first 5, which
    hold start-up and the data pipeline's warm-up), measured in this process. Unlike the wall-clock figure of
    `seconds_per_step`, it does not grow with what else the machine runs (one thread: the run's CPU time is the
    time it computed)."""
    from bertology.recipes.pretrain import pretrain as run
    from bertology.training.config import load_config

    out.parent.mkdir(parents=True, exist_ok=True)
    path = out.parent / f"{out.name}.yaml"
    path.write_text(yaml.safe_dump(run_config(name, steps, out), sort_keys=False))
    marks = []
    run(load_config(path, overrides), hooks=[lambda trainer, report: marks.append(time.process_time())],
        overwrite=True)
    if len(marks) < 7:
        raise SystemExit(f"--cpu-time: {name} ran {len(marks)} steps, at least 7 are needed (--calibration-steps)")
    return statistics.median(after - before for before, after in zip(marks[5:], marks[6:]))


def pretrained_names() -> list[str]:
    """What `calibrate` and `pretrain` run by default: the suite's entries (and the distillation teacher, first)."""
    return [TEACHER, *SUITE.entries] if "distill" in SUITE.entries else list(SUITE.entries)


def prepare(args: argparse.Namespace) -> None:
    """The architectures suite's tokenizers (one of each kind, 8,000 tokens, lowercased, trained on the corpus) and
    their shards, with the same 10 documents held out (docs/PRETRAINING.md's split)."""
    used = {entry["tokenizer"]["path"] for entry in SUITE.entries.values() if "tokenizer" in entry}
    for name, (kind, style) in TOKENIZERS.items():
        tokenizer, shards = PREPARED / f"tokenizer-{name}", PREPARED / f"shards-{name}"
        if str(tokenizer) not in used:  # the suite's entries do not read it (t5-objectives: T5's alone)
            continue
        bertology = [sys.executable, "-m", "bertology"]
        read = ["--format", "text", "--encoding", "latin-1"]
        if not tokenizer.exists():
            subprocess.run([*bertology, "tokenizer", "train", *CORPUS, *read, "--kind", kind, "--style", style,
                            "--lowercase", "--vocab-size", "8000", "--out", str(tokenizer), "--quiet"],
                           check=True, cwd=ROOT)
        if not shards.exists():
            subprocess.run([*bertology, "data", "prepare", *CORPUS, *read, "--tokenizer", str(tokenizer),
                            "--out", str(shards), "--heldout-documents", "0.02", "--seed", "0"], check=True, cwd=ROOT)


def calibrate(args: argparse.Namespace) -> None:
    """Seconds per step of each objective (`--only`: these, added to the file's earlier ones). `--scale-to
    NAME=SECONDS` rescales the ones measured now so that NAME's equals its earlier (idle) figure: on a busy machine,
    objectives calibrated back to back keep their ratios, and the budget stays the one the earlier runs had."""
    path = RUNS / "seconds_per_step.json"
    timings = json.loads(path.read_text()) if path.exists() else {}
    measured = {}
    for name in args.only or pretrained_names():
        if name == "distill" and not (RUNS / TEACHER / "model").exists():
            # the student's step does not depend on what the teacher has learnt: a 1-step teacher will do
            pretrain(TEACHER, 1, RUNS / TEACHER)
        out = RUNS / "calibrate" / name
        if args.cpu_time:
            measured[name] = cpu_seconds_per_step(name, args.calibration_steps, out, args.set)
        else:
            pretrain(name, args.calibration_steps, out, args.set)
            measured[name] = seconds_per_step(out / "metrics.jsonl")
        print(f"{name}: {measured[name]:.4f} {'CPU ' if args.cpu_time else ''}s/step", flush=True)
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
    steps = dict(fixed_steps(args.steps))
    timings = json.loads(timings_path.read_text()) if timings_path.exists() or not steps else {}
    budget = args.budget_minutes * 60
    names = args.only or (list(steps) if steps else pretrained_names())
    plan = {name: steps[name] if name in steps else int(budget * (2 if name == TEACHER else 1) / timings[name])
            for name in names}
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


def fixed_steps(settings: list[str]) -> list[tuple[str, int]]:
    """`pretrain --steps NAME=STEPS ...`: these step counts instead of the budget's (an earlier plan's, to redo its
    runs where its calibration file is gone)."""
    out = []
    for setting in settings:
        name, sep, steps = setting.partition("=")
        if not sep or name not in [*SUITE.entries, TEACHER] or not steps.isdigit():
            raise SystemExit(f"--steps {setting}: expected NAME=STEPS with NAME one of {', '.join(SUITE.entries)}")
        out.append((name, int(steps)))
    return out


def random_encoder(out: Path) -> None:
    """The "no pretraining" reference: the model of the suite's `random_from` run (MLM's; T5's for the T5 table) as
    initialised (seed 0), saved without a step."""
    from bertology.model import Pretrained
    from bertology.objectives import build_objectives
    from bertology.recipes.pretrain import build_model, build_tokenizer, seed_everything
    from bertology.training import PretrainConfig

    config = PretrainConfig.from_dict(run_config(SUITE.random_from, 1, out))
    seed_everything(config.run.seed)
    tokenizer = build_tokenizer(config)
    Pretrained(build_model(config, tokenizer, build_objectives(config.objectives)), tokenizer).save(out / "model")


RECIPE_TAG = ""  # `--recipe-tag`: the suffix of runs made with a changed recipe (`--finetune-set`)


def results_tag(lr: float | None) -> str:
    """The suffix of the runs made with another fine-tuning learning rate than the recipe's (`--lr`) or with another
    recipe (`--recipe-tag`)."""
    return (f"-lr{lr:g}" if lr is not None else "") + (f"-{RECIPE_TAG}" if RECIPE_TAG else "")


def finetune_output(name: str, task: str, seed: int, lr: float | None = None) -> Path:
    return RUNS / "finetune" / f"{name}-{task}-s{seed}{results_tag(lr)}"


def finetune_config(name: str, task: str, seed: int, lr: float | None = None) -> FinetuneConfig:
    """The suite's fine-tuning run of the model ``name`` on ``task`` with ``seed``."""
    return finetune_run_config(RUNS / name / "model", task, SUITE.finetune[task], seed,
                               finetune_output(name, task, seed, lr), SUITE.threads, lr)


def finetune_one(name: str, task: str, seed: int, lr: float | None = None) -> dict:
    return finetune_model(RUNS / name / "model", name, task, SUITE.finetune[task], seed,
                          finetune_output(name, task, seed, lr), SUITE.threads, lr)


def finetune_run_config(model: Path | str, task: str, spec: dict, seed: int, out: Path, threads: int,
                        lr: float | None = None) -> FinetuneConfig:
    """The fine-tuning run of ``model`` (a directory or an installed model's name) on ``task`` by ``spec`` (a
    FINETUNE entry: data, limit_train, epochs, max_length, lr, text_to_text) with ``seed``, evaluated once on dev at
    the end, into ``out``."""
    from bertology.recipes.finetune import FinetuneConfig

    return FinetuneConfig.from_dict({
        "model": str(model),
        "task": {"name": task, "data": str(spec["data"]), "epochs": spec["epochs"], "limit_train": spec["limit_train"],
                 "limit_dev": spec.get("limit_dev"), "max_length": spec["max_length"],
                 **({"text_to_text": spec["text_to_text"]} if "text_to_text" in spec else {})},
        "optim": {"batch_size": 32, "lr": lr or spec["lr"], "warmup_ratio": 0.1, "weight_decay": 0.01, "clip_norm": 1.0},
        "run": {"output_dir": str(out), "progress": False, "seed": seed, "eval_every": 10**9, "log_every": 100,
                "keep_last": 1},
        "speed": {"threads": threads, "prefetch": 2},
    })


def finetune_model(model: Path | str, name: str, task: str, spec: dict, seed: int, out: Path, threads: int,
                   lr: float | None = None) -> dict:
    """Run ``finetune_run_config``'s fine-tuning; its result row (named ``name``), with the run's wall and CPU seconds
    and the load average at its end."""
    from bertology.recipes.finetune import finetune

    config = finetune_run_config(model, task, spec, seed, out, threads, lr)
    started, cpu = time.perf_counter(), time.process_time()
    result = finetune(config, overwrite=True)
    return {"model": name, "task": task, "seed": seed, "metric": METRIC[task],
            "value": result.dev_metrics[METRIC[task]], "dev": result.dev_metrics,
            "seconds": time.perf_counter() - started, "cpu_seconds": time.process_time() - cpu,
            "load": os.getloadavg()[0]}


def finetune_all(args: argparse.Namespace) -> None:
    path = RUNS / f"finetune{results_tag(args.lr)}.jsonl"
    done = set()
    if path.exists():
        done = {(r["model"], r["task"], r["seed"]) for r in map(json.loads, path.read_text().splitlines())}
    if not (RUNS / RANDOM / "model").exists():
        random_encoder(RUNS / RANDOM)
    claims = RUNS / "finetune" / f"claims{results_tag(args.lr)}"  # a run is claimed by the first process to reach it (remove the folder
    claims.mkdir(parents=True, exist_ok=True)  # to redo the runs of a killed process)
    for seed in args.seeds:  # seed-major: a partial run already has one seed of everything
        for task in args.tasks:
            for name in args.only or [*SUITE.references, *SUITE.entries]:
                if (name, task, seed) in done or not (RUNS / name / "model").exists():
                    continue
                try:  # several processes share the runs (each started with the same arguments)
                    (claims / f"{name}-{task}-s{seed}").open("x").close()
                except FileExistsError:
                    continue
                row = finetune_one(name, task, seed, args.lr)
                print(json.dumps(row), flush=True)
                with path.open("a") as f:
                    f.write(json.dumps(row) + "\n")


def heldout(name: str) -> dict:
    """The run's last held-out evaluation ({} without one)."""
    from bertology.training import read_metrics

    evals = [r for r in read_metrics(RUNS / name / "metrics.jsonl") if r["kind"] == "eval"]
    return evals[-1] if evals else {}


# The token-embedding rows whose geometry `diagnostics` reports: frequent WordPieces (ids 1,000 to 2,999 of the 8k
# vocabulary; the ids below are specials, single characters and the most frequent words).
EMBEDDING_ROWS = range(1000, 3000)


def mean_pairwise_cosine(table) -> float:
    """The mean cosine similarity over the distinct pairs of rows of ``table`` [n, d] (n >= 2): with u the unit rows,
    (||sum u||^2 - n) / (n (n - 1)), exactly, in float64."""
    import torch

    units = torch.nn.functional.normalize(table.detach().to(torch.float64), dim=1)
    n = units.shape[0]
    if n < 2:
        raise ValueError(f"mean_pairwise_cosine: {n} row(s), need at least 2")
    return float((units.sum(0).square().sum() - n) / (n * (n - 1)))


def replaced_rate(accuracy: float, precision: float, recall: float) -> float:
    """The share of real tokens that were replaced, from the discriminator's accuracy and its precision and recall
    of "replaced" (the logged metrics): with p that share, accuracy = 1 - p + p r (2 - 1 / q), so
    p = (1 - accuracy) / (1 - r (2 - 1 / q)); with recall 0 (nothing flagged correctly), p = 1 - accuracy."""
    if recall == 0:
        return 1.0 - accuracy
    return (1.0 - accuracy) / (1.0 - recall * (2.0 - 1.0 / precision))


def binary_entropy(p: float) -> float:
    """The RTD loss (nats per token) of predicting the base rate p at every token."""
    return 0.0 if p in (0.0, 1.0) else -(p * math.log(p) + (1 - p) * math.log(1 - p))


def diagnostics(args: argparse.Namespace) -> None:
    """Each pretrained row's held-out discriminator (RTD loss against the base rate's entropy, precision and recall
    of "replaced") and its token embeddings: the mean pairwise cosine of EMBEDDING_ROWS of the model's table and,
    for ELECTRA-style rows, of the generator's table E_G, and ||E_D - E_G|| / ||E_G|| over the whole tables (0 with
    `shared`; with `gdes`, E_D - E_G is the residual E_delta). One JSON line per row."""
    from bertology.model import load

    names = args.only or [RANDOM, *SUITE.entries]
    if RANDOM in names and not (RUNS / RANDOM / "model").exists():
        random_encoder(RUNS / RANDOM)
    for name in names:
        if not (RUNS / name / "model").exists():
            continue
        table = load(RUNS / name / "model").model.word_embeddings.weight.detach()
        row = {"model": name, "cosine": mean_pairwise_cosine(table[EMBEDDING_ROWS.start:EMBEDDING_ROWS.stop])}
        if (RUNS / name / "generator").exists():
            generator = load(RUNS / name / "generator").model.word_embeddings.weight.detach()
            row["generator_cosine"] = mean_pairwise_cosine(generator[EMBEDDING_ROWS.start:EMBEDDING_ROWS.stop])
            row["delta_ratio"] = float((table - generator).norm() / generator.norm())
        last = heldout(name) if name != RANDOM else {}
        if "rtd_loss" in last:
            p = replaced_rate(last["rtd_accuracy"], last["rtd_precision"], last["rtd_recall"])
            row.update({key: last[key] for key in ("rtd_loss", "rtd_accuracy", "rtd_precision", "rtd_recall")})
            row.update(replaced=p, base_rate_loss=binary_entropy(p))
        print(json.dumps(row), flush=True)


PROMPT = "{text} it was [MASK] ."  # SST-2 prompted: the label word the language model finds likelier at [MASK]
VERBALIZER = {"bad": "0", "good": "1"}  # SST-2's labels 0 and 1, one token each (with their space) in the BPE
SHOTS = 4  # labelled training phrases before each dev phrase, one set drawn per seed


def prompt_all(args: argparse.Namespace) -> None:
    """The decoders prompted as language models on SST-2's dev phrases, zero-shot and with SHOTS demonstrations
    (seeds 0, 1, 2), no training: `bertology prompt`'s protocol (bertology.tasks.prompting), a phrase classified by
    the likelier of VERBALIZER's words at PROMPT's [MASK]. A prefix LM reads the prompt as its prefix (its
    `prefix_lm` setting)."""
    import torch

    from bertology.model import load
    from bertology.tasks.prompting import PromptSetup, prompt_evaluate

    torch.set_num_threads(SUITE.threads)
    setup = PromptSetup("sst2", PROMPT, VERBALIZER)
    train_path = DATA / "glue" / "SST-2" / "train.tsv"
    train, dev = setup.glue.read(train_path), setup.glue.read(DATA / "glue" / "SST-2" / "dev.tsv")
    rows = []
    for name in args.only or ["clm", "prefixlm"]:
        pretrained = load(RUNS / name / "model")
        for shots in (0, SHOTS):
            result = prompt_evaluate(pretrained.model, pretrained.tokenizer, setup, train, dev, shots=shots,
                                     seeds=args.seeds, train_path=train_path)
            for run in result["per_seed"]:
                row = {"model": name, "shots": shots, "seed": run["seed"], "accuracy": run["accuracy"]}
                print(json.dumps(row), flush=True)
                rows.append(row)
    with (RUNS / "prompt.jsonl").open("w") as f:
        f.writelines(json.dumps(row) + "\n" for row in rows)


COLUMNS = {"sst2": [("accuracy", "SST-2 dev acc.")], "conll2003": [("f1", "CoNLL-2003 dev F1")],
           "squad": [("exact_match", "SQuAD dev EM"), ("f1", "SQuAD dev F1")]}
HELDOUT = {"mlm_accuracy": "", "generator_accuracy": " (generator)", "lm_accuracy": " (next token)",
           "denoise_accuracy": " (target token)"}  # the held-out accuracy each objective logs


def parameters(name: str) -> int:
    """The pretrained model's parameter count, heads included (a tied head counted once)."""
    from safetensors import safe_open

    total = 0
    for file in sorted((RUNS / name / "model").glob("*.safetensors")):
        with safe_open(str(file), "pt") as weights:
            total += sum(math.prod(weights.get_slice(key).get_shape()) for key in weights.keys())
    return total


ANSWER_LOSS = "answer_loss"  # the table's column of a generated task's dev loss


def answer_loss(name: str, task: str, seed: int, lr: float | None) -> float | None:
    """The dev loss (nats per target token, teacher-forced) of a fine-tuning run whose answers are generated (its
    `lm_loss`, logged at the end): None for other runs. It separates rows whose generated answers all score 0."""
    from bertology.training import read_metrics

    path = finetune_output(name, task, seed, lr) / "metrics.jsonl"
    if task != "squad" or not path.exists():
        return None
    evals = [r for r in read_metrics(path) if r["kind"] == "eval" and "lm_loss" in r]
    return evals[-1]["lm_loss"] if evals else None


def table(args: argparse.Namespace) -> None:
    plan = json.loads((RUNS / "plan.json").read_text())
    timings_path = RUNS / "seconds_per_step.json"  # absent where `pretrain --steps` set the steps
    timings = json.loads(timings_path.read_text()) if timings_path.exists() else {}
    rows = [json.loads(line) for line in (RUNS / f"finetune{results_tag(args.lr)}.jsonl").read_text().splitlines()]
    tasks = [task for task in SUITE.finetune if any(r["task"] == task for r in rows)]  # those the file holds
    columns = [(task, metric, title) for task in tasks for metric, title in COLUMNS[task]]
    # each generated run's answer loss, read from its metrics once: (model, seed) -> nats per target token
    answers = {(r["model"], r["seed"]): loss for r in rows
               if (loss := answer_loss(r["model"], r["task"], r["seed"], args.lr)) is not None}
    if answers:
        columns.append(("squad", ANSWER_LOSS, "SQuAD dev answer loss (generated answers' targets)"))
    print(f"Budget: {plan['budget_minutes']} minutes of pretraining each.\n")
    print(f"| model | parameters | s / step | steps | tokens read | held-out acc. % | "
          f"{' | '.join(c[2] for c in columns)} |")
    print(f"|---|---:|---:|---:|---:|---:|{'---:|' * len(columns)}")
    for name in [*SUITE.references, *SUITE.entries]:
        if not any(r["model"] == name for r in rows):
            continue
        cells = []
        for task, metric, _ in columns:
            mine = [r for r in rows if r["model"] == name and r["task"] == task]
            if metric == ANSWER_LOSS:
                values = [answers[name, r["seed"]] for r in mine if (name, r["seed"]) in answers]
            else:
                values = [r["dev"][metric] if "dev" in r else r["value"] for r in mine]
            if not values:
                cells.append("-")
                continue
            spread = statistics.stdev(values) if len(values) > 1 else 0.0
            cells.append(f"{statistics.mean(values):.2f} ± {spread:.2f} ({len(values)})")
        last = heldout(name) if name != RANDOM else {}
        key = next((key for key in HELDOUT if key in last), None)
        label = " (PLM)" if key == "lm_accuracy" and name == "xlnet" else HELDOUT.get(key, "")
        accuracy = f"{100 * last[key]:.1f}{label}" if key else "-"  # XLNet: its permutation LM's targets
        seconds = f"{timings[name]:.3f}" if name in timings else "-"
        tokens = f"{last['tokens']:,}" if "tokens" in last else "-"  # the tokens of the batches (inputs)
        print(f"| {name} | {parameters(name):,} | {seconds} | {plan['steps'].get(name, 0):,} | {tokens} | "
              f"{accuracy} | {' | '.join(cells)} |")


def main() -> None:
    global RUNS, SUITE, RECIPE_TAG
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("phase", choices=["prepare", "prepare-xlnet", "calibrate", "pretrain", "finetune", "prompt",
                                          "table", "diagnostics"])
    parser.add_argument("--suite", choices=list(SUITES), default="objectives",
                        help="objectives (docs/OBJECTIVES.md), architectures or t5-objectives (T5's table of "
                             "objectives; both docs/ARCHITECTURES.md)")
    parser.add_argument("--budget-minutes", type=float, default=5.0)
    parser.add_argument("--calibration-steps", type=int, default=60)
    parser.add_argument("--cpu-time", action="store_true",
                        help="calibrate: measure process CPU seconds per step (median, in this process) instead of "
                             "wall-clock ones, so that other work on the machine does not change the ratios")
    parser.add_argument("--scale-to", metavar="NAME=SECONDS",
                        help="calibrate: rescale so that NAME's seconds per step are SECONDS (its idle figure)")
    parser.add_argument("--only", nargs="*", help="objectives to run (default: all)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="calibrate, pretrain: a run-config setting for every run of this call (e.g. "
                             "optim.lr=3e-3, speed.threads=1)")
    parser.add_argument("--tasks", nargs="*", help="finetune: the tasks (default: the suite's)")
    parser.add_argument("--seeds", nargs="*", type=int, default=list(SEEDS), help="finetune: the seeds")
    parser.add_argument("--lr", type=float, help="finetune, table: this learning rate for every task instead of "
                                                 "the recipe's (its runs and results kept apart)")
    parser.add_argument("--timings", help="pretrain: seconds per step from an earlier calibrate (its JSON file)")
    parser.add_argument("--steps", nargs="*", default=[], metavar="NAME=STEPS",
                        help="pretrain: these step counts (an earlier plan's) instead of the budget's; with no "
                             "--only, the objectives named here")
    parser.add_argument("--finetune-set", action="append", default=[], metavar="TASK.KEY=VALUE",
                        help="finetune: change the suite's fine-tuning recipe for every model of this call (e.g. "
                             "sst2.limit_train=4000, conll2003.epochs=1); use another --out for another recipe")
    parser.add_argument("--recipe-tag", default="", help="finetune, table: a name for the recipe of this call's "
                                                         "--finetune-set, its runs and results kept apart")
    parser.add_argument("--threads", type=int, help="torch threads of every run (pretraining, fine-tuning) instead "
                                                    "of the suite's")
    parser.add_argument("--out", help="the runs' directory (default runs/objectives or runs/architectures); "
                                      "calibrate reads and writes it too")
    args = parser.parse_args()
    SUITE = SUITES[args.suite]
    RECIPE_TAG = args.recipe_tag
    if args.threads:
        SUITE = dataclasses.replace(SUITE, threads=args.threads,
                                    base=merge(SUITE.base, {"speed": {"threads": args.threads}}))
    RUNS = ROOT / (args.out or SUITE.runs)
    if args.finetune_set:
        SUITE = dataclasses.replace(SUITE, finetune=finetune_recipe(SUITE.finetune, args.finetune_set))
    args.tasks = args.tasks or list(SUITE.tasks or SUITE.finetune)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if SUITE.threads == 1:
        os.environ.setdefault("OMP_NUM_THREADS", "1")
    if args.phase not in ("prepare", "prepare-xlnet"):
        # pretraining reads the named systems' tokenizers and shards; the other phases the MLM run's (the
        # no-pretraining reference is built from its config)
        names = (args.only or list(SUITE.entries)) if args.phase in ("calibrate", "pretrain") else [SUITE.random_from]
        configs = [merge(SUITE.base, SUITE.entries[name]) for name in names if name in SUITE.entries]
        needed = sorted({Path(c["tokenizer"]["path"]) for c in configs} | {Path(c["data"]["shards"]) for c in configs})
        for path in needed:
            if not path.exists():
                raise SystemExit(f"{path} is missing: prepare it as docs/PRETRAINING.md says (BERT-mini on Gutenberg "
                                 f"+ Brown), with the phase `prepare-xlnet` (XLNet's) or with `prepare --suite "
                                 f"architectures`")
    RUNS.mkdir(parents=True, exist_ok=True)
    phases = {"prepare": prepare, "prepare-xlnet": prepare_xlnet, "calibrate": calibrate, "pretrain": pretrain_all,
              "finetune": finetune_all, "prompt": prompt_all, "table": table,
              "diagnostics": diagnostics}
    phases[args.phase](args)


if __name__ == "__main__":
    main()
