"""Fixtures for the service tests: a tiny random model directory (with and without a masked-LM head)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/finetune_helpers.py

from finetune_helpers import save_tiny_model  # noqa: E402

from bertology.model import EncoderModel, HeadSpec, Pretrained, load  # noqa: E402

WORDS = ["the cat sat on the mat .", "a dog ran in the park !", "naive cafe bells ring twice", "good bad film"] * 10


@pytest.fixture(scope="session", autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matrices on a shared 2-core machine: one thread is fastest and steadiest
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory) -> Path:
    """A 2-layer random BERT with 64 positions, so a text of a few dozen words needs several windows."""
    return save_tiny_model(tmp_path_factory.mktemp("serve-model") / "tiny", WORDS, vocab_size=60)


@pytest.fixture(scope="session")
def mlm_dir(tiny_dir, tmp_path_factory) -> Path:
    """The tiny model with a (random) masked-LM head."""
    base = load(tiny_dir)
    model = EncoderModel(base.model.config, [HeadSpec("mlm", "masked_lm")])
    model.init_weights(torch.Generator().manual_seed(1))
    directory = tmp_path_factory.mktemp("serve-mlm") / "tiny-mlm"
    Pretrained(model, base.tokenizer).save(directory)
    return directory
