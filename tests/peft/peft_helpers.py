"""Tiny models, a batch and a toy training loop shared by the parameter-efficient fine-tuning tests."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from bertology.model import TransformerConfig, EncoderModel, HeadSpec

HIDDEN, INTERMEDIATE, LAYERS, HEADS, LABELS, VOCAB = 32, 40, 3, 4, 3, 60


def tiny_config(**overrides) -> TransformerConfig:
    values = dict(vocab_size=VOCAB, hidden_size=HIDDEN, num_layers=LAYERS, num_heads=HEADS,
                  intermediate_size=INTERMEDIATE, max_position_embeddings=32, hidden_dropout=0.0,
                  attention_dropout=0.0)
    values.update(overrides)
    return TransformerConfig(**values)


def tiny_model(seed: int = 0, heads=(HeadSpec("classifier", "pooled", num_labels=LABELS),), **overrides) -> EncoderModel:
    model = EncoderModel(tiny_config(**overrides), list(heads))
    model.init_weights(torch.Generator().manual_seed(seed))
    return model.eval()


def batch(seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, VOCAB, (4, 10), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 6:] = 0
    mask[3, 3:] = 0
    labels = torch.randint(0, LABELS, (4,), generator=g)
    return ids, mask, labels


def outputs(model, packed: bool = True):
    ids, mask, _ = batch()
    model.eval()
    with torch.no_grad():
        out = model(ids, mask, packed=packed)
    return out.last_hidden_state * mask[..., None], out.logits


def snapshot(model) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def train_steps(model, steps: int = 3, lr: float = 1e-2, seed: int = 1) -> None:
    """A few AdamW steps on a classification loss over every parameter of the model (frozen ones get no gradient)."""
    ids, mask, labels = batch(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    model.train()
    for _ in range(steps):
        optimizer.zero_grad()
        F.cross_entropy(model(ids, mask).logits, labels).backward()
        optimizer.step()
    model.eval()


def changed(before: dict[str, torch.Tensor], model) -> set[str]:
    return {name for name, p in model.named_parameters() if not torch.equal(before[name], p.detach())}


def trainable_names(model) -> set[str]:
    return {name for name, p in model.named_parameters() if p.requires_grad}
