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

from bertology.data.causal import PrefixLMBatch as PrefixLMBatch, PrefixLMBatches  # the batch: re-exported
from bertology.objectives.clm import CausalLM

if TYPE_CHECKING:
    from bertology.tokenization.framing import Framing


@dataclass
class PrefixLM(CausalLM):
    """Next-token prediction after a random split, the prefix seen in both directions; the same ``lm`` head and
    statistics as causal LM (``lm_units``, ``lm_loss_sum``, ``lm_correct``), so their perplexities compare."""

    def batch_maker(self, special: Framing, seed: int, max_seq_length: int) -> Any:
        return PrefixLMBatches(seed)
