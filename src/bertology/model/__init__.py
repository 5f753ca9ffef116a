"""The encoder, its heads, and Hugging Face checkpoints."""

from bertology.model.checkpoint import Pretrained, load, load_model, save_model
from bertology.model.config import EncoderConfig, preset
from bertology.model.encoder import Encoder, EncoderModel, EncoderOutput, HeadSpec

__all__ = [
    "Encoder",
    "EncoderConfig",
    "EncoderModel",
    "EncoderOutput",
    "HeadSpec",
    "Pretrained",
    "load",
    "load_model",
    "preset",
    "save_model",
]
