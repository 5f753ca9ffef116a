"""A tiny random BERT with a WordPiece vocabulary of the given words, saved as a model directory: the base that the
fine-tuning tests train (a cue word decides each label, so a 2-layer model learns it in seconds)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import torch

from bertology.model import EncoderModel, Pretrained, preset
from bertology.tokenization import train_tokenizer


# The cue words: a sentence is positive when it holds a GOOD word, negative when it holds a BAD one.
GOOD, BAD, FILL = ["good", "great", "nice"], ["bad", "awful", "dull"], ["the", "film", "plot", "was", "very", "a"]


def cue_sentence(rng, positive) -> str:
    """2-6 filler words with one cue word of the label's kind inserted at a random place."""
    words = list(rng.choice(FILL, int(rng.integers(2, 7))))
    words.insert(int(rng.integers(len(words) + 1)), str(rng.choice(GOOD if positive else BAD)))
    return " ".join(words)


def save_tiny_model(directory: Path, words: Iterable[str], vocab_size: int = 40) -> Path:
    tokenizer = train_tokenizer(iter(list(words)), "wordpiece", vocab_size, show_progress=False, min_frequency=1)
    config = preset("tiny", vocab_size=tokenizer.vocab_size, num_layers=2, hidden_size=32, num_heads=2,
                    intermediate_size=64, max_position_embeddings=64)
    model = EncoderModel(config)
    model.init_weights(torch.Generator().manual_seed(0))
    Pretrained(model, tokenizer).save(directory)
    return directory
