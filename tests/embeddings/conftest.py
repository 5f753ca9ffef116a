"""Fixtures of the embedding tests."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from bertology.model import TransformerConfig, EncoderModel, Pretrained, load


@pytest.fixture(scope="module")
def small_model(minilm_path, tmp_path_factory) -> Path:
    """A random 2-layer encoder with MiniLM's tokenizer, saved: fast to load, also in a subprocess."""
    minilm = load(minilm_path)
    config = TransformerConfig(vocab_size=minilm.config.vocab_size, hidden_size=32, num_layers=2, num_heads=2,
                           intermediate_size=64, max_position_embeddings=64)
    model = EncoderModel(config)
    model.init_weights(torch.Generator().manual_seed(0))
    directory = tmp_path_factory.mktemp("model") / "small"
    Pretrained(model.eval(), minilm.tokenizer).save(directory)
    return directory
