"""A small corpus, tokenizer and shards for the trainer tests, and a config factory for tiny, fast runs."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from bertology.data.shards import prepare_corpus
from bertology.tokenization import train_tokenizer
from bertology.training.config import PretrainConfig

WORDS = ("the cat dog bird sat ran flew over under near house tree river stone red blue green small large old "
         "young quick slow happy sad morning evening city garden road window light dark water fire").split()


def write_corpus(path: Path, documents: int = 24, seed: int = 0, sentences: tuple[int, int] = (3, 6)) -> Path:
    """A corpus in the BERT format (a sentence per line, a blank line between documents)."""
    rng = random.Random(seed)
    lines = []
    for _ in range(documents):
        for _ in range(rng.randint(*sentences)):
            lines.append(" ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 12))) + " .")
        lines.append("")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def make_assets(root: Path, heldout: int = 3, kind: str = "wordpiece", **options: Any) -> dict[str, Path]:
    """Corpus, tokenizer (WordPiece, or ``kind`` with ``options`` such as ``style``) and shards (with ``heldout``
    held-out documents) under ``root``."""
    corpus = write_corpus(root / "corpus.txt")
    tokenizer = train_tokenizer([str(corpus)], kind, 120, show_progress=False, min_frequency=1, **options)
    tokenizer.save(root / "tokenizer")
    prepare_corpus(str(corpus), tokenizer, root / "shards", heldout_documents=heldout, show_progress=False)
    return {"corpus": corpus, "tokenizer": root / "tokenizer", "shards": root / "shards"}


def tiny_config(assets: dict[str, Path], output_dir: Path, **sections: dict[str, Any]) -> dict[str, Any]:
    """A raw config for a 2-layer, 32-wide model: a few steps take well under a second."""
    config: dict[str, Any] = {
        "model": {"preset": None, "hidden_size": 32, "num_layers": 2, "num_heads": 2, "intermediate_size": 64,
                  "max_position_embeddings": 64},
        "tokenizer": {"path": str(assets["tokenizer"])},
        "data": {"shards": str(assets["shards"]), "instances": {"kind": "nsp", "max_seq_length": 48}},
        "optim": {"batch_size": 4, "total_steps": 6, "lr": 1e-3, "warmup_steps": 2},
        "run": {"seed": 0, "output_dir": str(output_dir), "log_every": 1, "eval_every": 3, "eval_batches": 2,
                "checkpoint_every": 2, "keep_last": 2, "progress": False},
        "speed": {"threads": 1, "prefetch": 0},
    }
    for name, values in sections.items():
        _merge(config.setdefault(name, {}), values)
    return config


def _merge(into: dict[str, Any], values: dict[str, Any]) -> None:
    for key, value in values.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = value


def build(raw: dict[str, Any]) -> PretrainConfig:
    return PretrainConfig.from_dict(raw)


def run_shipped_config_briefly(config: Path, output_dir: Path, corpus: list[Path], heldout: int = 1) -> int:
    """``bertology pretrain --config CONFIG`` for 3 steps of 4 sequences on ``corpus`` (Brown files, say) with a
    1,000-word tokenizer, one thread and no checkpoints: a shipped config runs end to end. Returns the exit code."""
    from bertology.cli.main import main

    settings = [f"data.corpus=[{','.join(str(p) for p in corpus)}]", "tokenizer.vocab_size=1000",
                "optim.total_steps=3", "optim.batch_size=4", f"run.output_dir={output_dir}",
                f"data.heldout_documents={heldout}", "run.eval_batches=1", "run.checkpoint_every=0",
                "speed.threads=1", "speed.prefetch=0", "run.progress=false"]
    argv = ["pretrain", "--config", str(config)]
    for setting in settings:
        argv += ["--set", setting]
    return main(argv)


class Crash(Exception):
    """Raised by a hook to stop a run between steps (the resume tests)."""


def assert_resume_is_bitwise(make_raw: Any, tmp_path: Path, crash_at: int = 5) -> None:
    """Train `make_raw(output_dir)` (a raw run config) once through; train it again, stopped by an exception after
    step `crash_at` and resumed from its last checkpoint: the two final models are bitwise equal."""
    import torch
    from safetensors.torch import load_file

    from bertology.recipes.pretrain import pretrain

    pretrain(build(make_raw(tmp_path / "reference")))

    def crash(trainer: Any, report: Any) -> None:
        if report.step == crash_at:
            raise Crash()

    try:
        pretrain(build(make_raw(tmp_path / "stopped")), hooks=[crash])
    except Crash:
        pass
    else:
        raise AssertionError(f"the run was not stopped at step {crash_at}")
    pretrain(build(make_raw(tmp_path / "stopped")), resume=True)
    ours = load_file(tmp_path / "stopped" / "model" / "model.safetensors")
    theirs = load_file(tmp_path / "reference" / "model" / "model.safetensors")
    assert ours.keys() == theirs.keys()
    assert all(torch.equal(ours[key], theirs[key]) for key in ours)
