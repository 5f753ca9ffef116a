"""Fill-mask: the masked-LM head's most probable tokens at each mask token of a text."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from bertology.device import place, to_cpu
from bertology.errors import BertologyError, CheckpointError
from bertology.model.protocol import Model


@dataclass(frozen=True)
class Prediction:
    """One candidate for one mask: the token, its id, its probability and the text with the mask filled in."""

    token: str
    token_id: int
    probability: float
    sequence: str


@torch.no_grad()
def fill_mask(model: Model, tokenizer: Any, text: str, top_k: int = 5, *,
              device: str | torch.device | None = None, dtype: str = "float32") -> list[list[Prediction]]:
    """Top-``top_k`` predictions for every mask token in ``text`` (the tokenizer's own mask token, e.g. ``[MASK]``
    or ``<mask>``), in order of the masks. Other masks in the filled ``sequence`` stay as they are.
    ``device`` (None: where the model is) and ``dtype`` say where and how the model runs (`bertology.device`)."""
    if "mlm" not in model.heads:
        raise CheckpointError("fill-mask needs a model with a masked-LM head; this one has "
                              f"{', '.join(model.heads) or 'no head'}")
    if top_k < 1:
        raise BertologyError(f"top_k must be >= 1, got {top_k}")
    framing = tokenizer.framing
    framing.require("mask", "fill-mask")
    mask = tokenizer.mask_token
    if mask not in text:
        raise BertologyError(f"no mask token in the input: write {mask!r} where a word should be predicted "
                             f"(e.g. {('Please turn your homework ' + mask + '.')!r})")
    encoding = tokenizer.encode(text)
    ids = torch.tensor([encoding.ids])
    positions = (ids[0] == tokenizer.mask_id).nonzero().squeeze(1)
    if positions.numel() == 0:  # the mask token's text was there but the tokenizer split it
        raise BertologyError(f"the tokenizer did not keep {mask!r} as one token in {text!r}")
    limit = model.encoder.max_length  # fewer than max_position_embeddings with RoBERTa's position offset
    if ids.shape[1] > limit:
        raise BertologyError(f"the input is {ids.shape[1]} tokens long; the model takes at most {limit}")
    where = place(model, device, dtype)
    was_training = model.training
    model.eval()
    try:
        index = torch.stack([torch.zeros_like(positions), positions], dim=1)
        with where.autocast():
            out = model(*where.inputs(ids, torch.ones_like(ids), torch.tensor([encoding.type_ids])),
                        masked_positions=where.inputs(index)[0])
    finally:
        model.train(was_training)
    probs = to_cpu(out.head_logits["mlm"]).float().softmax(-1)
    top = probs.topk(min(top_k, probs.shape[-1]), dim=-1)
    frame = torch.tensor([i for i in (framing.cls_id, framing.sep_id, framing.pad_id) if i is not None])
    results: list[list[Prediction]] = []
    for row, position in enumerate(positions.tolist()):
        candidates = []
        for p, token_id in zip(top.values[row].tolist(), top.indices[row].tolist()):
            filled = ids[0].clone()
            filled[position] = token_id
            kept = filled[~torch.isin(filled, frame)]  # drop the framing's [CLS]/[SEP] but keep any other mask
            sequence = tokenizer.decode(kept, skip_special_tokens=False).strip()
            candidates.append(Prediction(tokenizer.id_to_token(token_id) or "", token_id, p, sequence))
        results.append(candidates)
    return results
