"""Every config file shipped in configs/ parses into a valid run config."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bertology.training.config import PretrainConfig, load_config

# task-*.yaml are fine-tuning task files (bertology.tasks.user), checked by tests/tasks/test_user_task.py.
CONFIGS = sorted(p for p in (Path(__file__).resolve().parents[2] / "configs").glob("*.yaml")
                 if not p.name.startswith("task-"))


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
