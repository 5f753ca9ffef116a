"""Tokenization: a typed wrapper over HF ``tokenizers`` that loads HF tokenizer files, trains WordPiece /
byte-level BPE / Unigram tokenizers, and encodes with offsets and word ids; ``framing`` is the one place special
tokens are laid out."""

from bertology.tokenization.framing import FRAMINGS, Framing, Layout, register_framing
from bertology.tokenization.loading import load_tokenizer
from bertology.tokenization.tokenizer import Batch, Encoding, Tokenizer
from bertology.tokenization.training import train_tokenizer

__all__ = ["FRAMINGS", "Batch", "Encoding", "Framing", "Layout", "Tokenizer", "load_tokenizer", "register_framing",
           "train_tokenizer"]
