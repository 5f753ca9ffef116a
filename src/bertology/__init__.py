"""bertology: contextual word representations with BERT-family encoders."""

from bertology.embeddings import embed
from bertology.model import EncoderConfig, EncoderModel, Pretrained, load, preset

__version__ = "0.1.0"
__all__ = ["EncoderConfig", "EncoderModel", "Pretrained", "embed", "load", "preset"]
