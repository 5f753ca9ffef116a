"""Prefix language modelling (Raffel et al. 2020, section 3.2.1; Liu et al. 2018): a causal decoder whose attention
is bidirectional over a prefix of each row and causal after it, trained on the continuation only:

    L = mean over positions t with s <= t + 1 (and x_{t+1} of t's document) of -log P(x_{t+1} | x_{<=t}, prefix)

with s a row's split point. A prefix token sees every prefix token of its document (the mask of
`bertology.model.attention.combined_mask` with `lm_prefix`), a continuation token the prefix and the tokens up to
itself; so the prefix's own next tokens are not targets (a prefix position sees its successor), and the last prefix
position predicts the first continuation token. The split is drawn per row (`bertology.data.causal.PrefixLMBatches`:
uniform over 1 .. n - 1 for a row of n tokens, keyed by seed, instance and epoch). The model is the same decoder
as for causal LM: the same `lm` head, saved as GPT2LMHeadModel."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from bertology.objectives.clm import CausalLM

if TYPE_CHECKING:
    from bertology.tokenization.framing import Framing


@dataclass
class PrefixLMBatch:
    """A causal batch (see `bertology.objectives.clm.LMBatch`) with `lm_prefix` [B, L] bool, the prefix tokens, and
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


@dataclass
class PrefixLM(CausalLM):
    """Next-token prediction after a random split, the prefix seen in both directions; the same ``lm`` head and
    statistics as causal LM (``lm_units``, ``lm_loss_sum``, ``lm_correct``), so their perplexities compare."""

    def batch_maker(self, special: Framing, seed: int, max_seq_length: int) -> Any:
        from bertology.data.causal import PrefixLMBatches

        return PrefixLMBatches(seed)
