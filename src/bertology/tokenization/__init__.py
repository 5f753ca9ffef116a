"""Tokenization: a typed wrapper over HF ``tokenizers`` that loads HF tokenizer files, trains WordPiece /
byte-level BPE / Unigram tokenizers, and encodes with offsets and word ids."""

from bertology.tokenization.loading import load_tokenizer
from bertology.tokenization.tokenizer import Batch, Encoding, Tokenizer
from bertology.tokenization.training import train_tokenizer

__all__ = ["Batch", "Encoding", "Tokenizer", "load_tokenizer", "train_tokenizer"]
