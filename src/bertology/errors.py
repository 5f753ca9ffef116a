"""Exceptions raised on bad input. Each message says what is wrong and where (file, line, byte offset, key)."""

from __future__ import annotations


class BertologyError(Exception):
    """Base class of every error bertology raises on bad input or bad configuration."""


class CheckpointError(BertologyError):
    """A model directory is missing files, has unknown keys, missing keys or mismatched shapes."""


class ConfigError(BertologyError):
    """A run configuration has an unknown key, a wrong type or an invalid value."""


class DataError(BertologyError):
    """A corpus or data file cannot be read (encoding, format, emptiness)."""


class TokenizerError(BertologyError):
    """A tokenizer cannot be loaded, trained, or does not match the model."""


class InputError(BertologyError, ValueError):
    """Tensors given to a model do not fit it (too long for its positions, ids outside its vocabulary)."""


class TrainingError(BertologyError):
    """A run cannot go on: a non-finite loss or gradient, a run directory that would be overwritten."""
