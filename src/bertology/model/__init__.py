"""The encoder, its heads and extensions, and checkpoints (Hugging Face's layout and bertology's own)."""

from bertology.model.checkpoint import Pretrained, load, load_model, save_model
from bertology.model.config import EncoderConfig, preset
from bertology.model.encoder import Encoder, EncoderModel, EncoderOutput, HeadSpec, register_extension
from bertology.model.identity import fingerprint

__all__ = [
    "Encoder",
    "EncoderConfig",
    "EncoderModel",
    "EncoderOutput",
    "HeadSpec",
    "Pretrained",
    "fingerprint",
    "load",
    "load_model",
    "preset",
    "register_extension",
    "save_model",
]
