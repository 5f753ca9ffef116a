"""The sentence splitter, defined in ``bertology.text.sentences`` and named here too."""

from bertology.text.sentences import split_sentences

__all__ = ["split_sentences"]
