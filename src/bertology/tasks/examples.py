"""The typed examples of the fine-tuning tasks: defined in ``bertology.text.examples`` (the GLUE reader, which
pretraining corpora use too, returns them), named here too."""

from bertology.text.examples import Answer, LabelSet, QAExample, TaggedSentence, TextExample

__all__ = ["Answer", "LabelSet", "QAExample", "TaggedSentence", "TextExample"]
