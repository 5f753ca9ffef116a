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
2. ``Seq2SeqBatches`` wraps the maker and makes the training batch (``seq2seq_batch``): the decoder's inputs
   (the targets shifted right behind the family's decoder start token: T5's padding token, BART's ``</s>``), its
   mask, the labels (the targets; -100 at padding) and the (row, column) of every target token with its id, which
   the denoising objective (``bertology.objectives.denoise``) reads.

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
    ``decoder_input_ids`` and ``decoder_attention_mask`` [B, Lt], the ``labels`` [B, Lt] (the targets, -100 at
    padding), and ``masked_positions`` [N, 2] (row, column) of the N target tokens with their ids ``lm_labels``
    [N], where the model computes vocabulary logits."""

    input_ids: Tensor
    attention_mask: Tensor
    decoder_input_ids: Tensor
    decoder_attention_mask: Tensor
    labels: Tensor
    masked_positions: Tensor
    lm_labels: Tensor
    instance_ids: Tensor | None = None

    def to(self, device: torch.device | str, non_blocking: bool = False) -> Seq2SeqBatch:
        return Seq2SeqBatch(**{f.name: None if getattr(self, f.name) is None
                               else getattr(self, f.name).to(device, non_blocking=non_blocking) for f in fields(self)})

    def __len__(self) -> int:
        return self.input_ids.shape[0]


def seq2seq_batch(input_ids: Tensor, attention_mask: Tensor, target_ids: Tensor, target_mask: Tensor,
                  decoder_start_id: int, instance_ids: Tensor | None = None) -> Seq2SeqBatch:
    """The training batch of padded sources and targets (see ``Seq2SeqBatch``); the decoder reads the targets
    shifted right behind ``decoder_start_id``."""
    if input_ids.shape != attention_mask.shape or target_ids.shape != target_mask.shape:
        raise DataError(f"seq2seq_batch: ids and masks differ in shape: source {tuple(input_ids.shape)} / "
                        f"{tuple(attention_mask.shape)}, target {tuple(target_ids.shape)} / {tuple(target_mask.shape)}")
    if input_ids.shape[0] != target_ids.shape[0]:
        raise DataError(f"seq2seq_batch: {input_ids.shape[0]} sources but {target_ids.shape[0]} targets")
    real = target_mask.bool()
    rows, cols = real.nonzero(as_tuple=True)
    decoder_input_ids = torch.empty_like(target_ids)
    decoder_input_ids[:, 0] = decoder_start_id
    decoder_input_ids[:, 1:] = target_ids[:, :-1]
    return Seq2SeqBatch(input_ids, attention_mask, decoder_input_ids, target_mask, target_ids.masked_fill(~real, -100),
                        torch.stack([rows, cols], 1), target_ids[rows, cols], instance_ids)


class Seq2SeqBatches:
    """A batch maker for encoder-decoders: ``maker`` makes the sources and targets, this the training batch (the
    decoder starting from ``decoder_start_id``, the model's ``decoder_start_token_id``)."""

    def __init__(self, maker: BatchMaker, decoder_start_id: int) -> None:
        self.maker = maker
        self.decoder_start_id = int(decoder_start_id)
        self.needs_position = getattr(maker, "needs_position", False)

    def __call__(self, instances: InstanceBatch) -> Seq2SeqBatch:
        made: Any = self.maker(instances)
        return seq2seq_batch(made.input_ids, made.attention_mask, made.target_ids, made.target_mask,
                             self.decoder_start_id, getattr(made, "instance_ids", None))
