"""The encoder, its heads and extensions, checkpoints (Hugging Face's layout and bertology's own), which model a
loaded one is (`fingerprint`) and int8 inference (`with_dtype`, `bertology.model.quantize`)."""

from bertology.model.checkpoint import Pretrained, load, load_model, save_model
from bertology.model.config import TransformerConfig, preset
from bertology.model.attention import BIDIRECTIONAL, CAUSAL, MaskPolicy, sliding_window
from bertology.model.blocks import Block, BlockSpec, KVCache
from bertology.model.context import AttentionContext, RelativeScores, ScoreProvider
from bertology.model.encoder import Encoder, EncoderModel, EncoderOutput
from bertology.model.extensions import register_extension
from bertology.model.heads import HeadInputs, HeadSpec, register_head
from bertology.model.packing import Layout
from bertology.model.base import BaseModel
from bertology.model.protocol import (DECODER_ONLY, ENCODER_DECODER, GENERATES, MASKED_LM, Model, capabilities,
                                      require)
from bertology.model.registry import register_model
from bertology.model.transformer import DecoderModel, Seq2SeqModel
from bertology.model.xlnet import XLNetConfig, XLNetModel
from bertology.model.longformer import LongformerConfig, LongformerModel
from bertology.model.elmo import ElmoConfig, ElmoModel  # after the transformers: registered in this order
from bertology.model.identity import fingerprint
from bertology.model.quantize import with_dtype

__all__ = [
    "DECODER_ONLY",
    "ENCODER_DECODER",
    "GENERATES",
    "MASKED_LM",
    "capabilities",
    "BIDIRECTIONAL",
    "AttentionContext",
    "Block",
    "BlockSpec",
    "RelativeScores",
    "ScoreProvider",
    "CAUSAL",
    "DecoderModel",
    "ElmoConfig",
    "ElmoModel",
    "Seq2SeqModel",
    "TransformerConfig",
    "XLNetConfig",
    "XLNetModel",
    "register_model",
    "HeadInputs",
    "KVCache",
    "LongformerConfig",
    "LongformerModel",
    "Layout",
    "MaskPolicy",
    "Model",
    "register_head",
    "require",
    "BaseModel",
    "sliding_window",
    "Encoder",
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
