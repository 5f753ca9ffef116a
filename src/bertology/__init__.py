"""bertology: contextual word representations with BERT-family encoders."""

__version__ = "0.1.0"
