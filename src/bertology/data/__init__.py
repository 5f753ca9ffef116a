"""Corpus readers, pretraining instance creation, masking (token, whole-word, SpanBERT spans), BART's noise,
memory-mapped shards and XLM-R's multilingual sampling."""

from bertology.data.bart_noise import BartNoise, DenoisingBatches, NoiseConfig, NoisedBatch
from bertology.text.corpus import CORPUS_FORMATS, list_corpus_files, read_documents
from bertology.data.dataset import PackedInstances, PretrainingBatch, PretrainingDataset, StepClock
from bertology.data.instances import (
    DocumentSource,
    InMemoryDocuments,
    Instance,
    InstanceConfig,
    InstanceStats,
    SpecialTokens,
    create_instances,
)
from bertology.data.masking import MaskedInputs, Masker, MaskingConfig, SpanConfig, masking_seeds
from bertology.data.multilingual import (
    LanguageCorpus,
    Mixture,
    MultilingualConfig,
    sample_mixture,
    sampling_probabilities,
    write_mixture,
)
from bertology.text.sentences import split_sentences
from bertology.data.shards import TokenizedCorpus, prepare_corpus, tokenizer_fingerprint
from bertology.data.span_masking import SpanBatch, SpanBatches

__all__ = [
    "BartNoise",
    "CORPUS_FORMATS",
    "DenoisingBatches",
    "DocumentSource",
    "InMemoryDocuments",
    "Instance",
    "LanguageCorpus",
    "InstanceConfig",
    "InstanceStats",
    "MaskedInputs",
    "Masker",
    "MaskingConfig",
    "Mixture",
    "MultilingualConfig",
    "NoiseConfig",
    "NoisedBatch",
    "PackedInstances",
    "PretrainingBatch",
    "PretrainingDataset",
    "SpanBatch",
    "SpanBatches",
    "SpanConfig",
    "SpecialTokens",
    "StepClock",
    "TokenizedCorpus",
    "create_instances",
    "list_corpus_files",
    "masking_seeds",
    "prepare_corpus",
    "read_documents",
    "sample_mixture",
    "sampling_probabilities",
    "split_sentences",
    "tokenizer_fingerprint",
    "write_mixture",
]
