"""Causal-LM and prefix-LM batches: the batch makers of decoder pretraining (GPT-2).

Instances of kind ``packed-documents`` (``bertology.data.instances``) fill every row with documents laid end to
end; the batch keeps each token's document id, so that the model attends only within a document
(``bertology.model.packing``: each document is a sequence of the packed layout, its positions counted from 0) and
a position predicts the next token only when that token is of the same document (``lm_batch``).
Other instance kinds give one document part per row. A causal-LM batch is a function of its instances; a prefix-LM
batch's splits are keyed by seed, instance and epoch, so it is a pure function of them too.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from bertology.data.dataset import InstanceBatch
from bertology.data.masking import masking_seeds
from bertology.data.span_masking import row_key_generator


@dataclass
class LMBatch:
    """A padded batch of token sequences for causal LM (see `lm_batch`); `documents` [B, L] when rows hold several
    packed documents (the model then attends within each), `instance_ids` [B] when they come from a dataset."""

    input_ids: Tensor
    attention_mask: Tensor
    masked_positions: Tensor
    lm_labels: Tensor
    documents: Tensor | None = None
    instance_ids: Tensor | None = None

    def to(self, device: torch.device | str, non_blocking: bool = False) -> LMBatch:
        return LMBatch(*(None if t is None else t.to(device, non_blocking=non_blocking) for t in (
            self.input_ids, self.attention_mask, self.masked_positions, self.lm_labels, self.documents,
            self.instance_ids)))


def lm_batch(input_ids: Tensor, attention_mask: Tensor | None = None, documents: Tensor | None = None,
             instance_ids: Tensor | None = None) -> LMBatch:
    """The causal-LM targets of a padded batch, vectorised: every real position whose next position is real predicts
    that token (padding on either side). With `documents` [B, L] (an id per token), only a position whose next
    token is of the same document predicts it: the last token of a document does not predict the first of the
    next."""
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids)
    real = attention_mask.bool()
    predicts = real[:, :-1] & real[:, 1:]
    if documents is not None:
        predicts &= documents[:, :-1] == documents[:, 1:]
    rows, cols = predicts.nonzero(as_tuple=True)
    return LMBatch(input_ids, attention_mask, torch.stack([rows, cols], 1), input_ids[rows, cols + 1], documents,
                   instance_ids)


@dataclass
class PrefixLMBatch:
    """A causal batch (see `LMBatch`) with `lm_prefix` [B, L] bool, the prefix tokens, and
    `split` [B], each row's first continuation position."""

    input_ids: Tensor
    attention_mask: Tensor
    masked_positions: Tensor
    lm_labels: Tensor
    lm_prefix: Tensor
    split: Tensor
    documents: Tensor | None = None
    instance_ids: Tensor | None = None

    def to(self, device: torch.device | str, non_blocking: bool = False) -> PrefixLMBatch:
        return PrefixLMBatch(*(None if t is None else t.to(device, non_blocking=non_blocking) for t in (
            self.input_ids, self.attention_mask, self.masked_positions, self.lm_labels, self.lm_prefix, self.split,
            self.documents, self.instance_ids)))


class CausalBatches:
    """Collated instances -> next-token targets (``LMBatch``), confined to documents when rows carry their ids."""

    needs_position = False

    def __call__(self, instances: InstanceBatch) -> LMBatch:
        return lm_batch(instances.input_ids, instances.attention_mask, instances.documents, instances.instance_ids)


class PrefixLMBatches:
    """Collated instances -> prefix-LM batches (``objectives.prefixlm``): each row of n real tokens (n >= 2) is
    split at s, uniform over 1 .. n - 1 (at least one prefix and one continuation token), from the row's key
    (``masking_seeds``: seed, instance, epoch; a new split every epoch); tokens before s are the prefix, and only the
    next-token targets at or after s remain (within documents, as for causal LM). A row of one token has no target."""

    needs_position = False

    def __init__(self, seed: int) -> None:
        self.seed = seed

    def __call__(self, instances: InstanceBatch) -> PrefixLMBatch:
        lm = lm_batch(instances.input_ids, instances.attention_mask, instances.documents, instances.instance_ids)
        keys = masking_seeds(self.seed, instances.instance_ids.numpy(), instances.epoch, 1, dynamic=True).tolist()
        lengths = instances.attention_mask.sum(1).tolist()
        split = torch.tensor([1 + int(row_key_generator(key).integers(n - 1)) if n >= 2 else n
                              for key, n in zip(keys, lengths)], dtype=torch.long)
        columns = torch.arange(instances.input_ids.shape[1])[None, :]
        prefix = (columns < split[:, None]) & instances.attention_mask.bool()
        rows, cols = lm.masked_positions.unbind(1)
        keep = cols + 1 >= split[rows]
        return PrefixLMBatch(lm.input_ids, lm.attention_mask, lm.masked_positions[keep], lm.lm_labels[keep], prefix,
                             split, instances.documents, instances.instance_ids)
