"""Every config file shipped in configs/ parses into a valid run config."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bertology.training.config import PretrainConfig, load_config

# task-*.yaml are fine-tuning task files (bertology.tasks.user), checked by tests/tasks/test_user_task.py;
# instruction*.yaml an instructions file and its templates (bertology.tasks.instructions), checked by
# tests/tasks/test_instructions.py.
CONFIGS = sorted(p for p in (Path(__file__).resolve().parents[2] / "configs").glob("*.yaml")
                 if not p.name.startswith(("task-", "instruction")))


def test_there_are_shipped_configs():
    assert len(CONFIGS) >= 3


@pytest.mark.parametrize("path", CONFIGS, ids=[p.name for p in CONFIGS])
def test_shipped_config_loads(path):
    config = load_config(path)
    # Every pretraining objective predicts tokens: MLM itself, within ELECTRA's generator and distillation, XLNet's
    # permutation LM, ELMo's biLM, the next token (a decoder, also after a prefix) or the corrupted spans (an
    # encoder-decoder).
    assert config.optim.total_steps > 0 and config.objectives and set(config.objectives) & {
        "mlm", "electra", "distill", "plm", "bilm", "clm", "prefixlm", "denoise"}
    assert config.data.instances.max_seq_length <= 512


@pytest.mark.parametrize("path", CONFIGS, ids=[p.name for p in CONFIGS])
def test_shipped_config_round_trips(path):
    """What a checkpoint records (to_dict) reads back to the same config."""
    config = load_config(path)
    assert PretrainConfig.from_dict(json.loads(json.dumps(config.to_dict()))) == config


BROWN = Path(__file__).resolve().parents[3] / "shared" / "data" / "brown-nltk"


def needs_artifacts(raw: dict) -> str | None:
    """Why a shipped config cannot run on a few Brown files alone (a model, tokenizer, shards or corpora of its own),
    or None."""
    model, data = raw.get("model") or {}, raw.get("data") or {}
    if model.get("init_from"):
        return "continues an installed model (model.init_from)"
    if (raw.get("tokenizer") or {}).get("path") or data.get("shards"):
        return "reads a prepared tokenizer and shards"
    if data.get("multilingual"):
        return "mixes language-tagged corpora (data.multilingual)"
    if "distill" in (raw.get("objectives") or {}):
        return "distils a teacher model"
    return None


@pytest.mark.slow
@pytest.mark.parametrize("path", CONFIGS, ids=[p.name for p in CONFIGS])
def test_shipped_config_trains_a_few_steps(path, tmp_path):
    """``bertology pretrain --config X`` for 2 steps of 4 sequences on eight Brown files, two held out (a 1,000-entry
    tokenizer, one thread, no checkpoints): every shipped config in the model section's shape trains and saves its
    model."""
    from bertology.cli.main import main
    from bertology.model import load_model
    from bertology.model.registry import model_name
    from bertology.training.config import read_config_file

    if not BROWN.is_dir():
        pytest.skip(f"the Brown corpus is not at {BROWN} (see ../shared/data/README.md)")
    why = needs_artifacts(read_config_file(path))
    if why is not None:
        pytest.skip(f"{path.name} {why}")
    corpus = ",".join(str(BROWN / f"ca0{i}") for i in range(1, 9))
    settings = [f"data.corpus=[{corpus}]", "data.format=brown", "data.encoding=utf-8", "data.heldout_documents=2",
                "tokenizer.vocab_size=1000", "optim.total_steps=2", "optim.batch_size=4", "run.eval_batches=1",
                "run.checkpoint_every=0", f"run.output_dir={tmp_path / 'run'}", "speed.threads=1", "speed.prefetch=0",
                "run.progress=false"]
    argv = ["pretrain", "--config", str(path)]
    for setting in settings:
        argv += ["--set", setting]
    assert main(argv) == 0
    config = load_config(path)
    model = load_model(tmp_path / "run" / "model")
    # The registered model the section names, of its family.
    assert model_name(model) == config.model.kind and model.config.family == config.model.family
