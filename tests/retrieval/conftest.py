"""Tiny random models for the retrieval tests: two with the same vocabulary and different weights."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from bertology.model import EncoderModel, Pretrained, load, preset
from bertology.tasks.qa import qa_head
from bertology.tokenization import train_tokenizer

WORDS = ("the cat sat on the mat . paris is the capital of france . python is a programming language . "
         "dogs chase cats in the park . rain fell over london all day . bread is baked from flour and water .").split()


def save_model(directory: Path, seed: int, reader: bool = False) -> Path:
    """A tiny random encoder (with the SQuAD reader's head when `reader`) and its tokenizer, saved."""
    tokenizer = train_tokenizer(iter([" ".join(WORDS)] * 4), "wordpiece", 80, show_progress=False, min_frequency=1)
    config = preset("tiny", vocab_size=tokenizer.vocab_size, num_layers=2, hidden_size=32, num_heads=2,
                    intermediate_size=64, max_position_embeddings=64)
    model = EncoderModel(config, [qa_head(config)] if reader else [])
    model.init_weights(torch.Generator().manual_seed(seed))
    Pretrained(model, tokenizer).save(directory)
    return directory


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory) -> Path:
    return save_model(tmp_path_factory.mktemp("tiny") / "model", seed=0)


@pytest.fixture(scope="session")
def other_dir(tmp_path_factory) -> Path:
    return save_model(tmp_path_factory.mktemp("other") / "model", seed=1)


@pytest.fixture(scope="session")
def reader_dir(tmp_path_factory) -> Path:
    """A tiny random model with the SQuAD reader's head (its spans are arbitrary but deterministic)."""
    return save_model(tmp_path_factory.mktemp("reader") / "model", seed=3, reader=True)


@pytest.fixture(scope="session")
def tiny(tiny_dir) -> Pretrained:
    return load(tiny_dir)


@pytest.fixture(scope="session")
def minilm(minilm_path) -> Pretrained:
    return load(minilm_path)


MINI_SQUAD = {"version": "1.1", "data": [
    {"title": "Paris", "paragraphs": [
        {"context": "paris is the capital of france . rain fell over london all day .",
         "qas": [{"id": "q1", "question": "the capital of france",
                  "answers": [{"text": "paris", "answer_start": 0}]},
                 {"id": "q2", "question": "rain over london",
                  "answers": [{"text": "rain", "answer_start": 33}, {"text": "rain fell", "answer_start": 33}]}]},
        {"context": "the cat sat on the mat .", "qas": []}]},
    {"title": "Bread", "paragraphs": [
        {"context": "bread is baked from flour and water .",
         "qas": [{"id": "q3", "question": "flour and water",
                  "answers": [{"text": "bread", "answer_start": 0}]}]},
        {"context": "dogs chase cats in the park . python is a programming language .",
         "qas": [{"id": "q4", "question": "programming language python",
                  "answers": [{"text": "python", "answer_start": 30}]}]}]}]}


@pytest.fixture
def mini_squad(tmp_path):
    path = tmp_path / "mini-squad.json"
    path.write_text(json.dumps(MINI_SQUAD), encoding="utf-8")
    return path
