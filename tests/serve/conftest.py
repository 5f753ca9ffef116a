"""Fixtures for the service tests: a tiny random model directory (with and without a masked-LM head, and as a
sentence-transformers directory)."""

from __future__ import annotations

import json
import shutil
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


@pytest.fixture(scope="session")
def st_dir(tiny_dir, tmp_path_factory):
    """The tiny model as a sentence-transformers directory: CLS pooling, Normalize, max_seq_length 12, a prompt."""
    directory = tmp_path_factory.mktemp("st") / "tiny-st"
    shutil.copytree(tiny_dir, directory)
    (directory / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}]))
    (directory / "1_Pooling").mkdir()
    (directory / "1_Pooling" / "config.json").write_text(json.dumps({"word_embedding_dimension": 32,
                                                                      "pooling_mode": "cls"}))
    (directory / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 12,
                                                                      "do_lower_case": False}))
    (directory / "config_sentence_transformers.json").write_text(json.dumps({"prompts": {"query": "query: "},
                                                                             "default_prompt_name": None}))
    return directory
