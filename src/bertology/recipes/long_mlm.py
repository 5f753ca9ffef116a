"""Held-out masked-LM loss on long documents, the same masked tokens for every model: a short model reading each
document in windows, a Longformer reading it in one forward (Beltagy et al. 2020, table 5's comparison).

    documents = mask_documents(tokenizer, texts, length=4094, seed=0)   # token ids cut into documents, masked once
    long_document_mlm_loss(short, documents)    # windows of 512 overlapping by half, each mask in its best window
    long_document_mlm_loss(longformer, documents)                        # one forward per document

A text's tokens (no specials) are cut into consecutive documents of ``length`` tokens (the tail shorter than that is
dropped, unless it is the whole text). Each document is masked once, over all its tokens, by the pretraining masker
(``bertology.data.masking``: 15 %, 80/10/10 by default) keyed by ``(seed, document number)``, so every model sees
the same corrupted ids and predicts the same positions. A model reads a document framed with its specials when it
fits, else in windows of its length (``plan_windows``, the step half the content capacity unless given) and each
masked token is scored in the window where it has the most context (``max_context_window``, embed's rule). The
loss is the mean cross-entropy over all masked tokens (nats), with the number of masked tokens and of forwards."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from bertology.data.masking import Masker, MaskingConfig, masking_seeds
from bertology.embeddings.windows import max_context_window, plan_windows
from bertology.errors import ConfigError, DataError
from bertology.model import Pretrained


@dataclass(frozen=True)
class MaskedDocuments:
    """Documents of token ids (no specials): ``ids[d]`` as corrupted, ``positions[d]`` the masked indices into it
    and ``labels[d]`` their original ids."""

    ids: list[np.ndarray]
    positions: list[np.ndarray]
    labels: list[np.ndarray]

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def masked(self) -> int:
        return sum(len(p) for p in self.positions)


@dataclass(frozen=True)
class LongMLMLoss:
    loss: float  # mean cross-entropy over the masked tokens (nats)
    masked: int  # masked tokens scored
    documents: int
    forwards: int  # windows read (those holding a masked token's best context; one per document read whole)
    window: int  # tokens per window, specials included


def document_ids(tokenizer, texts: Sequence[str], length: int, max_documents: int | None = None) -> list[np.ndarray]:
    """The texts' token ids cut into consecutive documents of ``length`` tokens (see the module docstring)."""
    if isinstance(length, bool) or not isinstance(length, int) or length < 1:
        raise ConfigError(f"length (--length): must be a positive number of tokens, got {length!r}")
    documents: list[np.ndarray] = []
    for text in texts:
        ids = np.asarray(tokenizer.encode(text, add_special_tokens=False).ids, dtype=np.int64)
        starts = range(0, max(len(ids) - length, 0) + 1, length) if len(ids) else ()
        documents.extend(ids[s:s + length] for s in starts)
        if max_documents is not None and len(documents) >= max_documents:
            return documents[:max_documents]
    if not documents:
        raise DataError("no documents: the texts have no tokens")
    return documents


def mask_documents(tokenizer, texts: Sequence[str], length: int, *, seed: int = 0,
                   masking: MaskingConfig | None = None, max_documents: int | None = None) -> MaskedDocuments:
    """Cut the texts into documents of ``length`` tokens and mask each once, keyed by (seed, document number)."""
    masking = masking or MaskingConfig()
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**63:
        raise ConfigError(f"seed (--seed): must be an integer in [0, 2**63), got {seed!r}")
    if masking.whole_word or masking.spans is not None:
        raise ConfigError("masking: the long-document loss masks single tokens (whole_word and spans are off)")
    masker = Masker(masking, tokenizer.framing, tokenizer.vocab_size)
    documents = document_ids(tokenizer, texts, length, max_documents)
    keys = masking_seeds(seed, range(len(documents)), 0, 1, False)
    ids, positions, labels = [], [], []
    for d, document in enumerate(documents):
        row = torch.from_numpy(document)[None]
        out = masker(row, torch.ones_like(row), seeds=keys[d:d + 1])
        ids.append(out.input_ids[0].numpy())
        positions.append(out.masked_positions[:, 1].numpy())
        labels.append(out.mlm_labels.numpy())
    return MaskedDocuments(ids, positions, labels)


@torch.no_grad()
def long_document_mlm_loss(pretrained: Pretrained, documents: MaskedDocuments, *, window: int | None = None,
                           stride: int | None = None, batch_size: int = 8) -> LongMLMLoss:
    """The held-out MLM loss of a model with a masked-LM head on masked documents (see the module docstring):
    windows of ``window`` tokens (default and at most the model's length), ``stride`` content tokens apart."""
    model, tokenizer = pretrained.model, pretrained.tokenizer
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ConfigError(f"batch_size: expected a positive number of windows per forward, got {batch_size!r}")
    if "mlm" not in model.heads:
        raise ConfigError(f"model: {type(model).__name__} has no masked-LM head ('mlm'); heads: "
                          f"{', '.join(model.heads) or 'none'}")
    if tokenizer is None:
        raise ConfigError("model: no tokenizer files")
    framing = tokenizer.framing
    specials = len(framing.frame([]).ids)
    length = min(window or model.config.max_length, model.config.max_length)
    capacity = length - specials
    if capacity < 1:
        raise ConfigError(f"window: {length} tokens leave no room after the {specials} special tokens")
    step = stride or max(1, capacity // 2)
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    # Every window of every document, with the masked positions it scores: (document, start, stop, columns).
    jobs: list[tuple[int, int, int, np.ndarray]] = []
    for d, ids in enumerate(documents.ids):
        plan = plan_windows(len(ids), capacity, min(step, capacity))
        choice = max_context_window(plan, len(ids))
        for k, (start, stop) in enumerate(plan):
            mine = np.flatnonzero(choice[documents.positions[d]] == k)
            if len(mine):
                jobs.append((d, start, stop, mine))
    total, count = 0.0, 0
    try:
        for begin in range(0, len(jobs), batch_size):
            part = jobs[begin:begin + batch_size]
            rows, where, labels = [], [], []
            for r, (d, start, stop, mine) in enumerate(part):
                framed = framing.frame(documents.ids[d][start:stop].tolist())
                rows.append(framed.ids)
                first = framed.spans[0][0]
                where.extend((r, first + int(documents.positions[d][m]) - start) for m in mine)
                labels.extend(int(documents.labels[d][m]) for m in mine)
            width = max(map(len, rows))
            input_ids = torch.full((len(rows), width), framing.fill_id, dtype=torch.long)
            mask = torch.zeros_like(input_ids)
            for r, row in enumerate(rows):
                input_ids[r, :len(row)] = torch.tensor(row)
                mask[r, :len(row)] = 1
            positions = torch.tensor(where, dtype=torch.long)
            out = model(input_ids.to(device), mask.to(device), masked_positions=positions.to(device))
            logits = out.head_logits["mlm"].float()
            total += float(F.cross_entropy(logits, torch.tensor(labels, device=device), reduction="sum"))
            count += len(labels)
    finally:
        model.train(was_training)
    if count == 0:
        raise DataError("no masked tokens in the documents")
    return LongMLMLoss(total / count, count, len(documents), len(jobs), length)
