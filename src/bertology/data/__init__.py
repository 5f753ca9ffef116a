"""Corpus readers, pretraining instance creation, masking and memory-mapped shards."""

from bertology.data.dataset import PackedInstances, PretrainingBatch, PretrainingDataset
from bertology.data.instances import (
    DocumentSource,
    InMemoryDocuments,
    Instance,
    InstanceConfig,
    InstanceStats,
    SpecialTokens,
    create_instances,
)
from bertology.data.masking import MaskedInputs, Masker, MaskingConfig, masking_seeds

__all__ = [
    "DocumentSource",
    "InMemoryDocuments",
    "Instance",
    "InstanceConfig",
    "InstanceStats",
    "MaskedInputs",
    "Masker",
    "MaskingConfig",
    "PackedInstances",
    "PretrainingBatch",
    "PretrainingDataset",
    "SpecialTokens",
    "create_instances",
    "masking_seeds",
]
