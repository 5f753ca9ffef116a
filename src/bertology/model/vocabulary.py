"""Growing an encoder's vocabulary: new word-embedding rows, each the mean of the rows of the old pieces it stood
for, and the output layer grown to match (the masked-LM decoder is the tied embedding matrix; its bias grows by the
mean of the same pieces' biases). Used by vocabulary extension (``tokenizer.adapt: extend``, docs/ADAPTATION.md)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from bertology.errors import ConfigError
from bertology.model.heads import MaskedLMHead
from bertology.model.protocol import ENCODER, require

__all__ = ["extend_vocabulary"]

# Head kinds with parameters over the vocabulary other than the masked-LM head's bias (which is grown).
VOCABULARY_HEADS = ("lm", "tied_lm_bias", "span_boundary")


@torch.no_grad()
def extend_vocabulary(model: nn.Module, pieces: Sequence[Sequence[int]]) -> None:
    """Append ``len(pieces)`` ids to ``model``'s vocabulary, in place: id ``V + i`` gets the mean embedding (and
    masked-LM bias) of the old ids ``pieces[i]``; ``config.vocab_size`` becomes ``V + len(pieces)``. A head with
    other weights over the vocabulary (``VOCABULARY_HEADS``) is refused; the tied decoder grows with the
    embeddings."""
    encoder = require(model, ENCODER, "vocabulary extension")
    embedding = encoder.word_embeddings
    size = embedding.num_embeddings
    if size != encoder.config.vocab_size:
        raise ConfigError(f"vocabulary extension: the word embeddings have {size} rows but the config's vocab_size "
                          f"is {encoder.config.vocab_size}")
    for index, ids in enumerate(pieces):
        if not ids or any(not 0 <= i < size for i in ids):
            raise ConfigError(f"vocabulary extension: new id {size + index} needs old pieces among 0..{size - 1}, "
                              f"got {list(ids)}")
    for spec in encoder.head_specs:
        if spec.kind in VOCABULARY_HEADS:
            raise ConfigError(f"vocabulary extension: the {spec.kind} head {spec.name!r} has weights over the "
                              f"vocabulary that are not grown (only the masked-LM head's are)")
    index = [torch.tensor(list(ids), dtype=torch.long) for ids in pieces]
    weight = embedding.weight
    rows = torch.stack([weight[ids].double().mean(0) for ids in index]).to(weight.dtype) if index else weight[:0]
    embedding.weight = nn.Parameter(torch.cat([weight.detach(), rows]), requires_grad=weight.requires_grad)
    embedding.num_embeddings = size + len(pieces)
    for head in encoder.heads.values():
        if isinstance(head, MaskedLMHead):
            bias = head.bias
            grown = torch.stack([bias[ids].double().mean() for ids in index]).to(bias.dtype) if index else bias[:0]
            head.bias = nn.Parameter(torch.cat([bias.detach(), grown]), requires_grad=bias.requires_grad)
    encoder.config.vocab_size = size + len(pieces)
