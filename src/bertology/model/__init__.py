"""The encoder, its heads and extensions, checkpoints (Hugging Face's layout and bertology's own), which model a
loaded one is (`fingerprint`) and int8 inference (`with_dtype`, `bertology.model.quantize`)."""

from bertology.model.checkpoint import Pretrained, load, load_model, save_model
from bertology.model.config import EncoderConfig, preset
from bertology.model.encoder import Encoder, EncoderModel, EncoderOutput, HeadSpec, register_extension
from bertology.model.identity import fingerprint
from bertology.model.quantize import with_dtype

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
    "with_dtype",
]
