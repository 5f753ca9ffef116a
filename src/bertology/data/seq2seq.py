"""Sequence-to-sequence pretraining batches: the interface between a noise function and the encoder-decoder.

An encoder-decoder (T5, BART) is pretrained on pairs: the encoder reads a corrupted *source*, the decoder is
trained to write a *target* (T5: the dropped spans behind their sentinels; BART: the original text). Every
denoising scheme is a batch maker in two steps:

1. A **source-target maker** (any ``BatchMaker``, ``bertology.data.dataset``) turns collated instances into a
   ``SourceTarget``: the sources and targets of the batch, each right-padded with its mask, framed by the
   tokenizer (``</s>`` closing both for T5, ``<s> ... </s>`` for BART). It is a pure function of its instances,
   its randomness keyed by (seed, instance, epoch) like MLM masking (``masking_seeds``), so that resumed runs see
   the same batches. T5's span corruption (``bertology.data.span_corruption``) is one; BART's noise functions are
   others; anything with the four fields of ``SourceTarget`` fits.
2. ``Seq2SeqBatches`` wraps the maker and makes the training batch (``seq2seq_batch``): the decoder's labels
   (the targets; -100 at padding), its mask, and the (row, column) of every target token with its id, which the
   denoising objective (``bertology.objectives.denoise``) reads. The decoder inputs are the labels shifted right
   behind the model's ``decoder_start_token_id``, made by the model itself (``Seq2SeqModel.forward``), so the
   batch does not depend on which family reads it.

To add a scheme: write the maker (a class with ``__call__(InstanceBatch) -> SourceTarget``), a config section for
its options, and have the pretrain recipe wrap it in ``Seq2SeqBatches`` (``bertology.recipes.pretrain``).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Protocol

import torch
from torch import Tensor

from bertology.data.dataset import BatchMaker, InstanceBatch
from bertology.errors import DataError


class SourceTarget(Protocol):
    """What a source-target maker returns: right-padded sources and targets with their real-token masks."""

    input_ids: Tensor  # [B, Ls] the sources
    attention_mask: Tensor  # [B, Ls]
    target_ids: Tensor  # [B, Lt] the targets
    target_mask: Tensor  # [B, Lt]


@dataclass
class SourceTargetBatch:
    """A plain ``SourceTarget`` (what ``span_corruption`` makes)."""

    input_ids: Tensor
    attention_mask: Tensor
    target_ids: Tensor
    target_mask: Tensor
    instance_ids: Tensor | None = None


@dataclass
class Seq2SeqBatch:
    """A training batch of an encoder-decoder: the encoder's ``input_ids`` / ``attention_mask``, the decoder's
    ``labels`` [B, Lt] (-100 at padding; the model shifts them into its inputs) and ``decoder_attention_mask``, and
    ``masked_positions`` [N, 2] (row, column) of the N target tokens with their ids ``lm_labels`` [N], where the
    model computes vocabulary logits."""

    input_ids: Tensor
    attention_mask: Tensor
    labels: Tensor
    decoder_attention_mask: Tensor
    masked_positions: Tensor
    lm_labels: Tensor
    instance_ids: Tensor | None = None

    def to(self, device: torch.device | str, non_blocking: bool = False) -> Seq2SeqBatch:
        return Seq2SeqBatch(**{f.name: None if getattr(self, f.name) is None
                               else getattr(self, f.name).to(device, non_blocking=non_blocking) for f in fields(self)})

    def __len__(self) -> int:
        return self.input_ids.shape[0]


def seq2seq_batch(input_ids: Tensor, attention_mask: Tensor, target_ids: Tensor, target_mask: Tensor,
                  instance_ids: Tensor | None = None) -> Seq2SeqBatch:
    """The training batch of padded sources and targets (see ``Seq2SeqBatch``)."""
    if input_ids.shape != attention_mask.shape or target_ids.shape != target_mask.shape:
        raise DataError(f"seq2seq_batch: ids and masks differ in shape: source {tuple(input_ids.shape)} / "
                        f"{tuple(attention_mask.shape)}, target {tuple(target_ids.shape)} / {tuple(target_mask.shape)}")
    if input_ids.shape[0] != target_ids.shape[0]:
        raise DataError(f"seq2seq_batch: {input_ids.shape[0]} sources but {target_ids.shape[0]} targets")
    real = target_mask.bool()
    rows, cols = real.nonzero(as_tuple=True)
    labels = target_ids.masked_fill(~real, -100)
    return Seq2SeqBatch(input_ids, attention_mask, labels, target_mask, torch.stack([rows, cols], 1),
                        target_ids[rows, cols], instance_ids)


class Seq2SeqBatches:
    """A batch maker for encoder-decoders: ``maker`` makes the sources and targets, this the training batch."""

    def __init__(self, maker: BatchMaker) -> None:
        self.maker = maker
        self.needs_position = getattr(maker, "needs_position", False)

    def __call__(self, instances: InstanceBatch) -> Seq2SeqBatch:
        made: Any = self.maker(instances)
        return seq2seq_batch(made.input_ids, made.attention_mask, made.target_ids, made.target_mask,
                             getattr(made, "instance_ids", None))
