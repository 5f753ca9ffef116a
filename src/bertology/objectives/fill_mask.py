"""Fill-mask: the masked-LM head's most probable tokens at each mask token of a text; for XLNet, its language-model
head's through the permutation mask (each mask predicted from the rest of the text, not from the other masks); for
an encoder-decoder, the most probable generated fillings (beam search, any length): T5's sentinel spans, BART's whole
denoised text."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from bertology.device import place, to_cpu
from bertology.errors import BertologyError, CheckpointError, ConfigError, TokenizerError
from bertology.model.protocol import DECODER_ONLY, ENCODER_DECODER, PERMUTATION_LM, Model, capabilities
from bertology.model.transformer import Seq2SeqModel


@dataclass(frozen=True)
class Prediction:
    """One candidate for one mask: the token, its id, its probability and the text with the mask filled in. A
    generated filling (an encoder-decoder's) has ``token`` its text, ``token_id`` -1 and ``token_ids`` its tokens,
    and ``probability`` that of the most probable generated sequence that gives this filling (the whole target,
    through its end token: for T5 every span of that hypothesis, not only this one), not summed over the other
    sequences that give it too."""

    token: str
    token_id: int
    probability: float
    sequence: str
    token_ids: tuple[int, ...] = ()


def check_fits(model: Any, ids: torch.Tensor) -> int:
    """The model's longest input (fewer than max_position_embeddings with RoBERTa's position offset); an error when
    the [1, L] `ids` are longer."""
    limit = model.config.max_length
    if ids.shape[1] > limit:
        raise BertologyError(f"the input is {ids.shape[1]} tokens long; the model takes at most {limit}")
    return limit


@torch.no_grad()
def fill_mask(model: Model, tokenizer: Any, text: str, top_k: int = 5, *,
              device: str | torch.device | None = None, dtype: str = "float32",
              max_new_tokens: int = 20) -> list[list[Prediction]]:
    """Top-``top_k`` predictions for every mask token in ``text`` (the tokenizer's own mask token, e.g. ``[MASK]``
    or ``<mask>``), in order of the masks. Other masks in the filled ``sequence`` stay as they are.
    ``device`` (None: where the model is) and ``dtype`` say where and how the model runs (`bertology.device`).

    An encoder-decoder (`Seq2SeqModel`) generates up to ``max_new_tokens`` tokens by beam search (no length
    penalty) and returns the ``top_k`` best *distinct* fillings: with T5's sentinels (``<extra_id_0>`` ...) in
    ``text`` it generates ``<extra_id_0> span <extra_id_1> span ...`` and returns, for each sentinel of the text in
    order, the distinct texts of that sentinel's span; with BART's ``<mask>`` it generates the whole text and
    returns one list, the distinct texts. Hypotheses that differ only elsewhere (after the span, or in another
    sentinel's span) give one filling, scored by the best of them (`Prediction.probability`), whose tokens and
    filled text it carries. The search keeps every finished hypothesis of max(top_k, 4) beams, and is redone with
    twice and then four times the beams while a list has fewer than ``top_k`` distinct fillings
    (`span_search_beams`); a list can still end shorter than ``top_k`` when the widest search finds no more.

    XLNet predicts every ``<mask>`` with its query stream (``target_mapping`` one row per mask) under a
    ``perm_mask`` that hides every mask from every position: each mask is predicted from the text around it, and
    independently of the other masks, as transformers' ``XLNetLMHeadModel`` computes it with those inputs."""
    can = capabilities(model)
    if ENCODER_DECODER in can:
        return fill_spans(model, tokenizer, text, top_k, device=device, dtype=dtype, max_new_tokens=max_new_tokens)
    if DECODER_ONLY in can:
        raise CheckpointError("fill-mask needs a masked-LM encoder (BERT, RoBERTa, ...) or an encoder-decoder "
                              "(T5's sentinels, BART's <mask>); this is a decoder-only model (DecoderModel, e.g. "
                              "GPT-2), which predicts only the next token: use `bertology generate`")
    head = "lm" if PERMUTATION_LM in can else "mlm"
    if head not in model.heads:
        raise CheckpointError(f"fill-mask needs a model with a {'language-model' if head == 'lm' else 'masked-LM'} "
                              f"head; this one has {', '.join(model.heads) or 'no head'}")
    check_top_k(top_k)
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
    check_fits(model, ids)
    where = place(model, device, dtype)
    was_training = model.training
    model.eval()
    try:
        inputs = where.inputs(ids, torch.ones_like(ids), torch.tensor([encoding.type_ids]))
        with where.autocast():
            if head == "lm":
                perm_mask, target_mapping = where.inputs(*permutation_inputs(ids.shape[1], positions))
                out = model(inputs[0], inputs[1], token_type_ids=inputs[2], perm_mask=perm_mask,
                            target_mapping=target_mapping, use_mems=False)
                logits = out.head_logits[head][0]
            else:
                index = torch.stack([torch.zeros_like(positions), positions], dim=1)
                logits = model(*inputs, masked_positions=where.inputs(index)[0]).head_logits[head]
    finally:
        model.train(was_training)
    probs = to_cpu(logits).float().softmax(-1)
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


def permutation_inputs(length: int, masks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """XLNet's inputs predicting the positions ``masks`` of a text of ``length`` tokens from the others:
    ``perm_mask`` [1, L, L] (1: position i may not see token j) hiding every mask from every position, and
    ``target_mapping`` [1, masks, L] one-hot at each mask."""
    hidden = torch.zeros(length)
    hidden[masks] = 1.0
    perm_mask = hidden.expand(1, length, length).clone()
    target_mapping = torch.nn.functional.one_hot(masks, length).float()[None]
    return perm_mask, target_mapping


def check_top_k(top_k: int) -> None:
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
        raise BertologyError(f"top_k must be >= 1, got {top_k!r}")


def span_beams(top_k: int) -> int:
    """The beams an encoder-decoder's fill-mask first searches with for `top_k` fillings."""
    return max(top_k, 4)


# A search that finds fewer than top_k distinct fillings is redone with twice the beams, twice at most.
SPAN_WIDENINGS = 2


def span_widths(top_k: int) -> tuple[int, ...]:
    """The beams of each search an encoder-decoder's fill-mask may run for `top_k` fillings, in order."""
    return tuple(span_beams(top_k) * 2 ** n for n in range(SPAN_WIDENINGS + 1))


def span_search_beams(top_k: int) -> int:
    """The beams of all the searches an encoder-decoder's fill-mask may run for `top_k` fillings together: the
    most decoder rows per step it can cost (the service bounds a request's work by them)."""
    return sum(span_widths(top_k))


def fill_spans(model: Seq2SeqModel, tokenizer: Any, text: str, top_k: int, *, device: str | torch.device | None,
               dtype: str, max_new_tokens: int) -> list[list[Prediction]]:
    """`fill_mask` for an encoder-decoder: T5's sentinel spans or BART's denoised text, generated."""
    from bertology.generation import decode_limit, generate, generation_model

    check_top_k(top_k)
    try:
        generation_model(model)
    except ConfigError as error:  # e.g. BartForSequenceClassification: no language-model head to generate with
        raise CheckpointError(f"fill-mask with an encoder-decoder: {error}") from error
    framing = tokenizer.framing
    where_file = framing.source or "the tokenizer"
    pattern = framing.layout.sentinels
    if pattern is not None:  # T5: numbered sentinels
        first = pattern.format(0)
        if not framing.sentinels:
            raise TokenizerError(f"{where_file}: no sentinel token {first!r} ({framing.style} framing); fill-mask "
                                 "with an encoder-decoder needs the sentinels the model was pretrained with")
        marks = framing.sentinels
        example = f"The {first} walks in {pattern.format(1)} park."
    else:  # BART: the mask token
        if framing.mask_id is None:
            raise TokenizerError(f"{where_file}: no mask token ('<mask>', {framing.style} framing); fill-mask with "
                                 "an encoder-decoder needs the mask token the model was pretrained with")
        marks = (framing.mask_id,)
        example = f"UN Chief says there is no {tokenizer.mask_token} in Syria"
    ids = torch.tensor([tokenizer.encode(text).ids])
    positions = torch.isin(ids[0], torch.tensor(marks)).nonzero().squeeze(1).tolist()
    if not positions:
        names = ", ".join(repr(tokenizer.id_to_token(m)) for m in marks[:2]) + (", ..." if len(marks) > 2 else "")
        raise BertologyError(f"no {'sentinel' if pattern else 'mask'} token in the input: write {names} where a "
                             f"span should be filled (e.g. {example!r})")
    limit = check_fits(model, ids)
    steps = min(max_new_tokens, limit - 1, decode_limit(model.config)[0] - 1)
    where = place(model, device, dtype)
    was_training = model.training
    model.eval()
    try:
        for beams in span_widths(top_k):
            with where.autocast():
                sequences = generate(model, ids, max_new_tokens=steps, num_beams=beams, num_return_sequences=beams,
                                     length_penalty=0.0)
                log_probs = sequence_log_probabilities(model, ids.to(sequences.device), sequences)
            results = span_fillings(tokenizer, ids[0].tolist(), positions, to_cpu(sequences).tolist(),
                                    to_cpu(log_probs).tolist(), model.config.eos_token_id, top_k)
            if all(len(group) == top_k for group in results):
                break
    finally:
        model.train(was_training)
    return results


def span_fillings(tokenizer: Any, source: list[int], positions: list[int], sequences: list[list[int]],
                  log_probs: list[float], eos: int | list[int] | None, top_k: int) -> list[list[Prediction]]:
    """The ``top_k`` best distinct fillings of each group (T5: each sentinel at ``positions`` of ``source``; BART:
    one group, the generated text) among the generated ``sequences`` with their summed ``log_probs``: a filling
    several hypotheses give is kept once, with the best one's probability, tokens and filled text. Padding
    tokens a hypothesis generated are left out of its filling."""
    framing = tokenizer.framing
    ends = set([eos] if isinstance(eos, int) else (eos or []))
    order = sorted(range(len(sequences)), key=lambda i: -log_probs[i])  # best first (beam order up to rounding)
    # a padding token the model generated before its end is no text (decoding drops it): no filling holds it
    hypotheses = [[t for t in generated(sequences[i], ends) if t != framing.pad_id] for i in order]
    probabilities = [math.exp(log_probs[i]) for i in order]
    if framing.layout.sentinels is None:  # BART: one group, the generated texts
        texts = [tokenizer.decode(h, skip_special_tokens=True).strip() for h in hypotheses]
        return [distinct([Prediction(t, -1, p, t, tuple(h)) for t, h, p in zip(texts, hypotheses, probabilities)],
                         top_k)]
    number = {token: n for n, token in enumerate(framing.sentinels)}
    frame = {i for i in (framing.cls_id, framing.sep_id, framing.pad_id) if i is not None}
    spans = [sentinel_spans(h, number) for h in hypotheses]
    filled = []
    for found in spans:
        kept: list[int] = []
        for token in source:
            if token in number:
                kept.extend(found.get(number[token], ()))
            elif token not in frame:
                kept.append(token)
        filled.append(tokenizer.decode(kept, skip_special_tokens=False).strip())
    results = []
    for position in positions:
        sentinel = number[source[position]]
        results.append(distinct([Prediction(tokenizer.decode(list(found.get(sentinel, ())),
                                                             skip_special_tokens=True).strip(),
                                            -1, p, sequence, tuple(found.get(sentinel, ())))
                                 for found, p, sequence in zip(spans, probabilities, filled)], top_k))
    return results


def distinct(predictions: list[Prediction], top_k: int) -> list[Prediction]:
    """The first ``top_k`` of ``predictions`` (best first) whose fillings (``token``, the text) differ."""
    seen: set[str] = set()
    kept = []
    for prediction in predictions:
        if prediction.token not in seen:
            seen.add(prediction.token)
            kept.append(prediction)
            if len(kept) == top_k:
                break
    return kept


def generated(row: list[int], ends: set[int]) -> list[int]:
    """A decoder sequence's new tokens (after its start token) up to, not including, the first EOS."""
    tokens = row[1:]
    for i, token in enumerate(tokens):
        if token in ends:
            return tokens[:i]
    return tokens


def sentinel_spans(tokens: list[int], number: dict[int, int]) -> dict[int, tuple[int, ...]]:
    """T5's target ``<extra_id_0> a b <extra_id_1> c``: {0: (a, b), 1: (c,)} (tokens before the first sentinel
    belong to none; a sentinel the hypothesis lacks has no span; a sentinel said again ends its span there, and what
    follows it belongs to none)."""
    spans: dict[int, list[int]] = {}
    current: list[int] | None = None
    for token in tokens:
        if token in number:
            current = None if number[token] in spans else spans.setdefault(number[token], [])
        elif current is not None:
            current.append(token)
    return {n: tuple(span) for n, span in spans.items()}


def sequence_log_probabilities(model: Seq2SeqModel, input_ids: torch.Tensor, sequences: torch.Tensor
                               ) -> torch.Tensor:
    """The summed log-probability of each generated sequence (rows of `sequences`, from the decoder's start token;
    one encoder input for all of them) up to and including its first EOS."""
    rows = sequences.shape[0]
    out = model(input_ids.expand(rows, -1), decoder_input_ids=sequences[:, :-1])
    log_probs = out.logits.float().log_softmax(-1).gather(-1, sequences[:, 1:, None]).squeeze(-1)
    eos = model.config.eos_token_id
    ends = torch.tensor([eos] if isinstance(eos, int) else list(eos or []), device=sequences.device)
    is_end = torch.isin(sequences[:, 1:], ends).long()
    counted = (is_end.cumsum(1) - is_end) == 0  # up to and including the first EOS; its padding after it is not
    return (log_probs * counted).sum(1)
