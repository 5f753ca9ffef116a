"""Contextual embeddings from any `Backbone`: layer choice, subword pooling, sentence vectors, long-text windows;
corpus-scale embedding into resumable shards (`embed_corpus`, read back with `load_corpus` / `iter_shards`)."""

from bertology.embeddings.backbone import Backbone, EncoderBackbone, Framed, as_backbone
from bertology.embeddings.core import embed, word_vector
from bertology.embeddings.corpus import CorpusReport, CorpusSettings, embed_corpus, iter_shards, load_corpus
from bertology.embeddings.files import check_output, load_vectors, read_texts, save_vectors
from bertology.embeddings.layers import LayerSelection, parse_layers, select_layers
from bertology.embeddings.sentence_config import SentenceConfig, read_sentence_config
from bertology.embeddings.result import EmbeddingError, Embeddings, Pieces, normalize, pool
from bertology.embeddings.windows import max_context_window, plan_windows

__all__ = [
    "Backbone",
    "CorpusReport",
    "CorpusSettings",
    "EncoderBackbone",
    "Framed",
    "as_backbone",
    "EmbeddingError",
    "Embeddings",
    "LayerSelection",
    "Pieces",
    "SentenceConfig",
    "check_output",
    "embed",
    "embed_corpus",
    "iter_shards",
    "load_corpus",
    "load_vectors",
    "max_context_window",
    "normalize",
    "parse_layers",
    "plan_windows",
    "pool",
    "read_sentence_config",
    "read_texts",
    "save_vectors",
    "select_layers",
    "word_vector",
]
