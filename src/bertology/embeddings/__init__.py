"""Contextual embeddings from any `Backbone`: layer choice, subword pooling, sentence vectors, long-text windows."""

from bertology.embeddings.backbone import Backbone, EncoderBackbone, Framed, as_backbone
from bertology.embeddings.core import embed, word_vector
from bertology.embeddings.files import check_output, load_vectors, read_texts, save_vectors
from bertology.embeddings.layers import LayerSelection, parse_layers, select_layers
from bertology.embeddings.result import EmbeddingError, Embeddings, Pieces, pool
from bertology.embeddings.windows import max_context_window, plan_windows

__all__ = [
    "Backbone",
    "EncoderBackbone",
    "Framed",
    "as_backbone",
    "EmbeddingError",
    "Embeddings",
    "LayerSelection",
    "Pieces",
    "check_output",
    "embed",
    "load_vectors",
    "max_context_window",
    "parse_layers",
    "plan_windows",
    "pool",
    "read_texts",
    "save_vectors",
    "select_layers",
    "word_vector",
]
