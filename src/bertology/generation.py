"""Text generation from a decoder (`DecoderModel`) or an encoder-decoder (`Seq2SeqModel`): greedy search, beam search
(length penalty, early stopping) and sampling (temperature, top-k, top-p, a seed), one position at a time through the
model's key/value cache, with the vocabulary logits computed at the last position only.

    sequences = prompt          a decoder: the left-padded prompt; an encoder-decoder: decoder_start_token_id
                                (its encoder runs once; every block caches the memory's keys and values)
    logits    = model(sequences)[last position]
    repeat up to max_new_tokens times:
        token     = argmax(logits)  |  a sample of softmax(filter(logits / temperature))  |  the beams' best
        sequences = sequences + token        (a row that has said EOS gets pad_token_id from then on)
        stop when every row has said EOS
        logits    = model(token, cache)[last position]

Greedy and beam search give transformers' `generate` tokens (tests/test_generation.py), with its conventions: a
decoder returns prompt + new tokens, an encoder-decoder the decoder sequence from its start token; the length penalty
divides a finished beam's log-probability by (new tokens) ** length_penalty; beam search stops early by transformers'
heuristic (`early_stopping` False, True or "never") and pads its shorter results with pad_token_id, or with the
(first) EOS id where the pad id is 0 (T5's).

What may be asked is bounded per family: the decoder holds at most its position table's length, or with relative
positions (T5) or none RELATIVE_DECODE_LIMIT positions; beam search keeps its hypotheses as wide as the longest
one made so far, so its memory grows with what is generated, not with what max_new_tokens allows."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from bertology.errors import ConfigError, InputError
from bertology.model.blocks import KVCache
from bertology.model.heads import head_reads
from bertology.model.protocol import DECODER_ONLY, ENCODER_DECODER, GENERATES, capabilities, model_kind, require
from bertology.model.transformer import DecoderModel, Seq2SeqModel

NEVER = -1.0e9  # transformers' score of a hypothesis that must not be chosen


# ----------------------------------------------------------------------------------------------------------------
# The settings, checked before anything runs


@dataclass(frozen=True)
class Settings:
    """What `generate` was asked for, checked: each bad value is a ConfigError naming its option."""

    max_new_tokens: int
    num_beams: int
    do_sample: bool
    temperature: float
    top_k: int | None
    top_p: float | None
    length_penalty: float
    early_stopping: bool | str
    eos_token_ids: tuple[int, ...]
    pad_token_id: int
    seed: int | None
    num_return_sequences: int = 1

    def __post_init__(self) -> None:
        for name in ("max_new_tokens", "num_beams", "num_return_sequences"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"{name} must be an integer of at least 1, got {value!r}")
        if self.top_k is not None and (not isinstance(self.top_k, int) or isinstance(self.top_k, bool)
                                       or self.top_k < 1):
            raise ConfigError(f"top_k must be an integer of at least 1 (or None for no top-k), got {self.top_k!r}")
        if self.top_p is not None and not 0.0 < self.top_p <= 1.0:
            raise ConfigError(f"top_p must lie in (0, 1], got {self.top_p!r}")
        if not math.isfinite(self.temperature) or (self.do_sample and self.temperature <= 0):
            raise ConfigError(f"temperature must be a positive number when sampling (do_sample=True), got "
                              f"{self.temperature!r}; for the most probable tokens use do_sample=False")
        if not self.do_sample:
            for name, value, default in (("temperature", self.temperature, 1.0), ("top_k", self.top_k, None),
                                         ("top_p", self.top_p, None)):
                if value != default:
                    raise ConfigError(f"{name}={value!r} applies to sampling only: add do_sample=True")
        if self.do_sample and self.num_beams > 1:
            raise ConfigError(f"do_sample with num_beams={self.num_beams}: sampling draws one hypothesis per prompt; "
                              "use num_beams=1 to sample or do_sample=False for beam search")
        if not (self.early_stopping is False or self.early_stopping is True or self.early_stopping == "never"):
            raise ConfigError(f"early_stopping must be False, True or 'never', got {self.early_stopping!r}")
        if self.num_beams == 1:
            for name, value, default in (("length_penalty", self.length_penalty, 1.0),
                                         ("early_stopping", self.early_stopping, False)):
                if value != default:
                    raise ConfigError(f"{name}={value!r} applies to beam search only: set num_beams above 1")
        if self.num_return_sequences > 1 and (self.do_sample or self.num_return_sequences > self.num_beams):
            raise ConfigError(f"num_return_sequences={self.num_return_sequences} needs beam search with at least as "
                              f"many beams (num_beams={self.num_beams}, do_sample={self.do_sample})")
        if not math.isfinite(self.length_penalty):
            raise ConfigError(f"length_penalty must be a finite number, got {self.length_penalty!r}")
        if self.seed is not None and (not isinstance(self.seed, int) or isinstance(self.seed, bool)
                                      or not 0 <= self.seed < 2**63):
            raise ConfigError(f"seed must be an integer in [0, 2**63) or None, got {self.seed!r}")

    def check_vocabulary(self, vocab_size: int) -> None:
        if not isinstance(self.pad_token_id, int) or isinstance(self.pad_token_id, bool):
            raise ConfigError(f"pad_token_id must be a token id, got {self.pad_token_id!r}")
        for name, ids in (("eos_token_id", self.eos_token_ids), ("pad_token_id", (self.pad_token_id,))):
            for token in ids:
                if not 0 <= token < vocab_size:
                    raise ConfigError(f"{name} {token} is outside the model's vocabulary [0, {vocab_size})")


def token_ids(value: int | Sequence[int] | None, option: str) -> tuple[int, ...]:
    if value is None:
        return ()
    values = (value,) if isinstance(value, int) else tuple(value)
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        raise ConfigError(f"{option} must be a token id or a list of token ids, got {value!r}")
    return values


# ----------------------------------------------------------------------------------------------------------------
# The model, one position at a time


class Stepper:
    """Runs the model through its key/value cache and returns the logits [rows, vocab] of each row's last position.
    The first call reads the whole prefix (a decoder's prompt, an encoder-decoder's start token); each later call
    one new token per row. `reorder(rows)` keeps the cache rows `rows` (beam search's surviving hypotheses)."""

    def __init__(self, model: DecoderModel | Seq2SeqModel, input_ids: Tensor, attention_mask: Tensor,
                 prefix_lm: bool = False) -> None:
        self.model = model
        self.prefix_lm = prefix_lm
        self.caches: list[Any] | None = None
        self.memory: Tensor | None = None
        self.memory_mask: Tensor | None = None
        if ENCODER_DECODER in capabilities(model):
            start = model.config.decoder_start_token_id
            if start is None:
                raise ConfigError("decoder_start_token_id is not set in the model's config: an encoder-decoder "
                                  "needs it to start the decoder")
            self.memory, self.memory_mask = model.encode(input_ids, attention_mask), attention_mask
            self.prefix = input_ids.new_full((input_ids.shape[0], 1), start)
            self.mask = torch.ones_like(self.prefix)
        else:
            self.prefix, self.mask = input_ids, attention_mask

    def logits(self, ids: Tensor) -> Tensor:
        rows, length = ids.shape
        if self.caches is not None:  # one more real position for every row
            self.mask = torch.cat([self.mask, self.mask.new_ones(rows, 1)], 1)
        last = torch.stack([torch.arange(rows, device=ids.device), ids.new_full((rows,), length - 1)], 1)
        if self.memory is None:
            # A prefix LM reads its prompt as the prefix, in both directions (the cache then holds those keys and
            # values; each new token sees them all and the tokens before it, as in training).
            prefix = self.mask.bool() if self.prefix_lm and self.caches is None else None
            out = self.model(ids, self.mask, past_key_values=self.caches, use_cache=True, masked_positions=last,
                             lm_prefix=prefix)
        else:
            out = self.model(attention_mask=self.memory_mask, decoder_input_ids=ids, decoder_attention_mask=self.mask,
                             encoder_outputs=self.memory, past_key_values=self.caches, use_cache=True,
                             masked_positions=last)
        self.caches = out.past_key_values
        if out.logits.shape != (rows, self.model.config.vocab_size):
            raise ConfigError(f"generation needs logits over the vocabulary from the model's first head; "
                              f"{self.model.head_specs[0].name!r} gave shape {tuple(out.logits.shape)}")
        return out.logits.float()

    def reorder(self, rows: Tensor) -> None:
        for cache in self.caches or ():
            cache.reorder(rows)
        self.mask = self.mask[rows]
        if self.memory is not None and self.memory_mask is not None:
            self.memory, self.memory_mask = self.memory[rows], self.memory_mask[rows]

    def join(self, other: Stepper) -> None:
        """Append `other`'s rows (their prefix read already) after this one's: the caches aligned on their last
        position, the shorter side padded on the left (masked: positions count real tokens, relative biases
        depend on key - query only), an encoder-decoder's memories padded on the right (masked too)."""
        assert self.caches is not None and other.caches is not None, "join steppers that have read their prefix"
        a, b = self.mask.shape[1], other.mask.shape[1]
        width = max(a, b)
        caches = []
        for mine, theirs in zip(self.caches, other.caches):
            cache = KVCache()
            cache.extend(*(torch.cat([F.pad(x, (0, 0, width - a, 0)), F.pad(y, (0, 0, width - b, 0))])
                           for x, y in ((mine.keys, theirs.keys), (mine.values, theirs.values))))
            if mine.memory is not None and theirs.memory is not None:
                span = max(mine.memory[0].shape[-2], theirs.memory[0].shape[-2])
                cache.memory = tuple(torch.cat([F.pad(x, (0, 0, 0, span - x.shape[-2])),  # type: ignore[assignment]
                                                F.pad(y, (0, 0, 0, span - y.shape[-2]))])
                                     for x, y in zip(mine.memory, theirs.memory))
            caches.append(cache)
        self.caches = caches
        self.mask = torch.cat([F.pad(self.mask, (width - a, 0)), F.pad(other.mask, (width - b, 0))])
        if self.memory is not None and other.memory is not None:
            assert self.memory_mask is not None and other.memory_mask is not None
            span = max(self.memory.shape[1], other.memory.shape[1])
            self.memory = torch.cat([F.pad(m, (0, 0, 0, span - m.shape[1])) for m in (self.memory, other.memory)])
            self.memory_mask = torch.cat([F.pad(m, (0, span - m.shape[1])) for m in (self.memory_mask,
                                                                                    other.memory_mask)])

    def keep(self, rows: Tensor) -> None:
        """Keep the rows `rows` (others leave the batch), then drop the leading positions that are padding in
        every row left, so that the cache is as wide as its longest row."""
        self.reorder(rows)
        real = self.mask.bool().any(0)
        first = int(real.nonzero()[0]) if bool(real.any()) else 0
        if first and self.caches is not None:
            caches = []
            for cache in self.caches:
                trimmed = KVCache()
                trimmed.extend(cache.keys[..., first:, :], cache.values[..., first:, :])
                trimmed.memory = cache.memory
                caches.append(trimmed)
            self.caches = caches
            self.mask = self.mask[:, first:]


# ----------------------------------------------------------------------------------------------------------------
# Choosing tokens


def filtered(scores: Tensor, s: Settings) -> Tensor:
    """Temperature, then top-k, then top-p (transformers' order) on logits or log-probabilities [rows, vocab]: the
    tokens left out get -inf. Top-p keeps the most probable tokens until their probability reaches top_p: it drops,
    from the least probable up, the tokens whose cumulative probability stays within 1 - top_p (the best stays)."""
    if s.temperature != 1.0:
        scores = scores / s.temperature
    if s.top_k is not None and s.top_k < scores.shape[-1]:
        kth_best = scores.topk(s.top_k, dim=-1).values[:, -1:]
        scores = scores.masked_fill(scores < kth_best, -math.inf)
    if s.top_p is not None and s.top_p < 1.0:
        ascending, order = scores.sort(dim=-1)
        dropped = ascending.softmax(-1).cumsum(-1) <= 1 - s.top_p
        dropped[:, -1] = False
        scores = scores.masked_fill(torch.zeros_like(dropped).scatter(1, order, dropped), -math.inf)
    return scores


def choose(logits: Tensor, s: Settings, generator: torch.Generator | None) -> Tensor:
    """Each row's next token [rows]: the most probable one, or a sample of the filtered softmax drawn from
    `generator` (one draw for all the rows, so the rows of one call share its sequence of random numbers)."""
    if s.do_sample:
        return torch.multinomial(filtered(logits, s).softmax(-1), 1, generator=generator).squeeze(1)
    return logits.argmax(-1)


def greedy_or_sample(step: Stepper, s: Settings, generator: torch.Generator | None) -> Tensor:
    """One hypothesis per row: the most probable token, or a sample, at every step."""
    sequences = step.prefix
    eos = torch.tensor(s.eos_token_ids, dtype=torch.long, device=sequences.device)
    unfinished = torch.ones(sequences.shape[0], dtype=torch.bool, device=sequences.device)
    logits = step.logits(sequences)
    for new in range(1, s.max_new_tokens + 1):
        token = choose(logits, s, generator)
        token = torch.where(unfinished, token, s.pad_token_id)
        sequences = torch.cat([sequences, token[:, None]], 1)
        unfinished &= ~torch.isin(token, eos)
        if new == s.max_new_tokens or not unfinished.any():
            break
        logits = step.logits(token[:, None])
    return sequences


def beam_search(step: Stepper, s: Settings) -> Tensor:
    """`num_beams` hypotheses per row; its `num_return_sequences` best finished ones are returned, best first, in
    consecutive rows. Transformers' algorithm: at each step the 2 * num_beams best continuations of all beams (more
    with several EOS ids); those that end join the finished hypotheses when among the num_beams best and better than
    the worst kept; the num_beams best others go on."""
    prefix, n = step.prefix, s.num_beams
    batch, device = prefix.shape[0], prefix.device
    eos = torch.tensor(s.eos_token_ids, dtype=torch.long, device=device)
    k = max(2, 1 + len(s.eos_token_ids)) * n  # enough candidates that n go on even when n of them end
    rows = torch.arange(batch, device=device)[:, None]
    copies = torch.arange(batch, device=device).repeat_interleave(n)
    logits = step.logits(prefix)[copies]  # the prefix runs once per row; its cache is copied to the row's beams
    step.reorder(copies)
    vocab = logits.shape[-1]

    # the running hypotheses: new tokens [B, n, t] and total log-probabilities; beam 0 alone at first (all equal)
    running = prefix.new_empty(batch, n, 0)
    running_scores = torch.zeros(batch, n, device=device)
    running_scores[:, 1:] = NEVER
    # the finished hypotheses: tokens (padded), length-penalised scores, which slots hold one, their lengths
    fill = s.pad_token_id or (s.eos_token_ids[0] if s.eos_token_ids else 0)  # transformers' padding of beams
    finished = prefix.new_full((batch, n, 0), fill)  # as wide as the longest step so far: grows with what is made
    finished_scores = torch.full((batch, n), NEVER, device=device)
    is_finished = torch.zeros(batch, n, dtype=torch.bool, device=device)
    lengths = torch.zeros(batch, n, dtype=torch.long, device=device)
    hopeful = torch.ones(batch, 1, dtype=torch.bool, device=device)  # may a running beam still beat a finished one?
    among_best = torch.arange(k, device=device) < n

    for new in range(1, s.max_new_tokens + 1):
        scores = (logits.log_softmax(-1).view(batch, n, vocab) + running_scores[..., None]).view(batch, n * vocab)
        top, picked = scores.topk(k)
        beam, token = picked // vocab, picked % vocab
        candidates = torch.cat([running[rows, beam], token[..., None]], 2)  # [B, k, new]
        ends = torch.isin(token, eos) | (new == s.max_new_tokens)

        # the n best candidates that do not end go on, and the cache follows them
        going_on = top + ends.float() * NEVER
        keep = going_on.topk(n).indices
        running, running_scores = candidates[rows, keep], going_on[rows, keep]
        step.reorder((beam[rows, keep] + rows * n).flatten())

        # those among the n best that end replace worse finished hypotheses (unless the row is closed)
        ending = ends & among_best
        penalised = top / new ** s.length_penalty
        penalised = penalised + (is_finished.all(-1, keepdim=True) & (s.early_stopping is True)).float() * NEVER
        penalised = penalised + (~hopeful).float() * NEVER
        penalised = penalised + (~ending).float() * NEVER
        pool = torch.cat([F.pad(finished, (0, 1), value=fill), candidates], 1)  # [B, n + k, new]
        pool_scores = torch.cat([finished_scores, penalised], 1)
        best = pool_scores.topk(n).indices
        finished, finished_scores = pool[rows, best], pool_scores[rows, best]
        is_finished = torch.cat([is_finished, ending], 1)[rows, best]
        lengths = torch.cat([lengths, torch.full_like(ending, new, dtype=torch.long)], 1)[rows, best]

        # transformers' heuristic: the best running beam, penalised at this length (at the longest with "never" and
        # a positive penalty), against the worst finished hypothesis once every slot holds one
        horizon = s.max_new_tokens if s.early_stopping == "never" and s.length_penalty > 0 else new
        best_running = running_scores[:, :1] / horizon ** s.length_penalty
        worst = torch.where(is_finished, finished_scores.min(-1, keepdim=True).values, NEVER)
        hopeful = hopeful & (best_running > worst).any(-1, keepdim=True)
        if not hopeful.any() or (s.early_stopping is True and is_finished.all()) or ends.all():
            break
        logits = step.logits(running[:, :, -1].reshape(-1, 1))

    r = s.num_return_sequences
    width = int(lengths[:, :r].max())
    return torch.cat([prefix.repeat_interleave(r, 0), finished[:, :r, :width].reshape(batch * r, width)], 1)


# ----------------------------------------------------------------------------------------------------------------
# The entry point


def generation_model(model_or_pretrained: Any) -> DecoderModel | Seq2SeqModel:
    model = getattr(model_or_pretrained, "model", model_or_pretrained)
    require(model, GENERATES, "generation")
    # a language-model head predicts tokens where it is told (tied_lm, masked_lm): the last position here
    if not model.head_specs or head_reads(model.head_specs[0].kind) != "masked_positions":
        first = f"{model.head_specs[0].name!r} of kind {model.head_specs[0].kind!r}" if model.head_specs else "none"
        raise ConfigError(f"generation needs a language-model head (such as tied_lm) first among the model's heads; "
                          f"its first head: {first}")
    return model


# The most positions a decoder with no position table (T5's relative buckets, none at all) decodes: four times the
# 512 T5's models are trained on. Its relative buckets tell no distance past relative_attention_max_distance (128)
# apart, and every position decoded adds to each beam's key/value cache, so nothing else would bound it.
RELATIVE_DECODE_LIMIT = 2048


def decode_limit(config: Any) -> tuple[int, str]:
    """The most positions the model's decoder may hold while generating, and what sets it: its position table
    (max_position_embeddings) where it has one, RELATIVE_DECODE_LIMIT otherwise."""
    if getattr(config, "positions", "learned") in ("learned", "sinusoidal"):
        return config.max_length, "the model's"
    return min(config.max_length, RELATIVE_DECODE_LIMIT), "the generation limit of relative positions:"


def check_prompts(model: DecoderModel | Seq2SeqModel, input_ids: Tensor, attention_mask: Tensor,
                  max_new_tokens: int) -> None:
    if input_ids.dim() != 2 or not input_ids.numel():
        raise InputError(f"input_ids must be a non-empty [batch, length] tensor, got shape {tuple(input_ids.shape)}")
    if attention_mask.shape != input_ids.shape:
        raise InputError(f"attention_mask has shape {tuple(attention_mask.shape)}; input_ids {tuple(input_ids.shape)}")
    width, positions = input_ids.shape[1], model.config.max_length
    if width > positions:
        raise ConfigError(f"input_ids: a prompt of {width} tokens is longer than the model's {positions} positions")
    decoder = DECODER_ONLY in capabilities(model)
    decoded = width if decoder else 1  # an encoder-decoder's decoder starts from one token
    limit, what_limits = decode_limit(model.config)
    if decoded + max_new_tokens > limit:
        what = "prompt" if decoder else "start"
        raise ConfigError(f"max_new_tokens: {decoded} {what} token(s) + "
                          f"{max_new_tokens} new tokens exceed {what_limits} {limit} positions")
    if decoder:
        ending_in_padding = (attention_mask[:, -1] == 0).nonzero().flatten().tolist()
        if ending_in_padding:
            raise InputError(f"attention_mask: prompt row {ending_in_padding[0]} ends with padding; pad a decoder's "
                             "prompts on the left (the new tokens follow the last column)")


def make_settings(config: Any, *, max_new_tokens: int = 20, num_beams: int = 1, do_sample: bool = False,
                  temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None,
                  length_penalty: float = 1.0, early_stopping: bool | str = False,
                  eos_token_id: int | Sequence[int] | None = None, pad_token_id: int | None = None,
                  seed: int | None = None, num_return_sequences: int = 1) -> Settings:
    """`generate`'s options checked against the model's config (its EOS and pad ids the defaults)."""
    settings = Settings(
        max_new_tokens=max_new_tokens, num_beams=num_beams, do_sample=bool(do_sample), temperature=float(temperature),
        top_k=top_k, top_p=None if top_p is None else float(top_p), length_penalty=float(length_penalty),
        early_stopping=early_stopping,
        eos_token_ids=token_ids(eos_token_id if eos_token_id is not None else config.eos_token_id, "eos_token_id"),
        pad_token_id=pad_token_id if pad_token_id is not None else config.pad_token_id,
        seed=seed, num_return_sequences=num_return_sequences)
    settings.check_vocabulary(config.vocab_size)
    return settings


@torch.no_grad()
def generate(
    model_or_pretrained: Any,
    input_ids: Tensor,
    attention_mask: Tensor | None = None,
    max_new_tokens: int = 20,
    num_beams: int = 1,
    do_sample: bool = False,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    length_penalty: float = 1.0,
    early_stopping: bool | str = False,
    eos_token_id: int | Sequence[int] | None = None,
    pad_token_id: int | None = None,
    seed: int | None = None,
    num_return_sequences: int = 1,
    prefix_lm: bool = False,
) -> Tensor:
    """Generate up to `max_new_tokens` tokens after each prompt of `input_ids` [B, L] (`attention_mask` [B, L], 1 =
    real token; a decoder's prompts padded on the left). Returns [B, L'] token ids on the model's device: prompt +
    new tokens for a `DecoderModel`, the decoder's sequence from `decoder_start_token_id` for a `Seq2SeqModel`;
    rows that said EOS (`eos_token_id`: an id, a list, [] for none; None: the model config's) are padded with
    `pad_token_id` (default the config's). `num_beams` > 1: beam search; `do_sample`: sampling with `temperature`,
    `top_k`, `top_p`, from a torch.Generator seeded with `seed` (None: torch's global generator).
    `num_return_sequences` (beam search, at most `num_beams`): the best finished hypotheses of each prompt, best
    first, as consecutive rows [B * num_return_sequences, L'] (transformers' layout). `prefix_lm`: a decoder
    trained as a prefix LM (objective `prefixlm`) reads the prompt as its prefix, in both directions. The model runs
    in eval mode (restored afterwards)."""
    model = generation_model(model_or_pretrained)
    config = model.config
    settings = make_settings(config, max_new_tokens=max_new_tokens, num_beams=num_beams, do_sample=do_sample,
                             temperature=temperature, top_k=top_k, top_p=top_p, length_penalty=length_penalty,
                             early_stopping=early_stopping, eos_token_id=eos_token_id, pad_token_id=pad_token_id,
                             seed=seed, num_return_sequences=num_return_sequences)
    if prefix_lm and DECODER_ONLY not in capabilities(model):
        raise ConfigError(f"prefix_lm: a decoder's option (its prompt read in both directions, capability "
                          f"{DECODER_ONLY!r}); the model ({model_kind(model)}) does not declare it")
    device = model.embeddings.weight.device
    input_ids = torch.as_tensor(input_ids).to(device=device, dtype=torch.long)
    attention_mask = (torch.ones_like(input_ids) if attention_mask is None
                      else torch.as_tensor(attention_mask).to(device=device, dtype=torch.long))
    check_prompts(model, input_ids, attention_mask, max_new_tokens)
    generator = torch.Generator(device=device).manual_seed(seed) if seed is not None else None
    training = model.training
    model.eval()
    try:
        step = Stepper(model, input_ids, attention_mask, prefix_lm)
        if settings.num_beams > 1:
            return beam_search(step, settings)
        return greedy_or_sample(step, settings, generator)
    finally:
        model.train(training)


def generate_texts(model_or_pretrained: Any, tokenizer: Any, texts: Sequence[str], **options: Any) -> list[str]:
    """`generate` on texts: each text tokenised by `tokenizer` (its framing), the prompts batched (a decoder's
    padded on the left, an encoder-decoder's on the right), and per text the decoded output up to the first EOS: a
    decoder's prompt and its continuation, an encoder-decoder's generated text. `options` are `generate`'s. An
    `InputError` names a text (1-based) that has no tokens."""
    model = generation_model(model_or_pretrained)
    decoder = DECODER_ONLY in capabilities(model)
    prompts = [tokenizer.encode(text).ids for text in texts]
    for number, ids in enumerate(prompts, start=1):
        if not ids:
            raise InputError(f"TEXT {number} ({texts[number - 1]!r}) has no tokens")
    if not prompts:
        return []
    width, pad = max(map(len, prompts)), model.config.pad_token_id
    pad = pad if pad is not None else 0
    # a decoder's prompts are padded on the left (its new tokens follow the last column), an encoder's on the right
    input_ids = torch.tensor([[pad] * (width - len(p)) + p if decoder else p + [pad] * (width - len(p))
                              for p in prompts])
    attention_mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) if decoder else
                                   [1] * len(p) + [0] * (width - len(p)) for p in prompts])
    device = next(model.parameters()).device
    sequences = generate(model, input_ids=input_ids.to(device), attention_mask=attention_mask.to(device), **options)
    eos = model.config.eos_token_id
    eos_ids = set(token_ids(eos, "eos_token_id")) if eos is not None else set()
    return [output_text(tokenizer, prompt, row[width:] if decoder else row[1:], decoder, eos_ids)
            for prompt, row in zip(prompts, sequences.cpu().tolist())]  # after the prompt, the start token


def output_text(tokenizer: Any, prompt: Sequence[int], new: Sequence[int], decoder: bool,
                eos_ids: set[int]) -> str:
    """The text of one output, as `generate_texts` gives it: the new tokens up to the first EOS, after the prompt
    for a decoder (a decoder's prompt is the start of its output), alone for an encoder-decoder."""
    new = list(new)
    for k, token in enumerate(new):
        if token in eos_ids:
            new = new[:k]
            break
    return tokenizer.decode((list(prompt) if decoder else []) + new)


# ----------------------------------------------------------------------------------------------------------------
# Continuous batching: requests join and leave one running batch between decoding steps


@dataclass(eq=False)
class Group:
    """One request's rows in a `RunningBatch`: `rows` copies of its prompt decoded as `generate` decodes that prompt
    repeated `rows` times (greedy, or sampled from its own `generator`: one draw for all its rows at each step, so
    the same seed gives `generate`'s draws), until each row has said EOS or `settings.max_new_tokens` are made.
    `logprobs`: how many of the most probable alternatives each step reports (None: no log-probabilities)."""

    settings: Settings
    rows: int
    generator: torch.Generator | None = None
    logprobs: int | None = None
    made: int = 0
    done: bool = False
    cancelled: bool = False


@dataclass
class Chosen:
    """What one step chose for one group: each row's token (pad_token_id for a row that had said EOS), whether it
    is EOS now, the model's log-probability of it and of the `logprobs` most probable tokens (log-softmax of the
    logits, before temperature and filtering); `done` when the group has finished and left the batch."""

    group: Group
    tokens: list[int]
    ended: list[bool]
    live: list[bool]  # the rows that made a token at this step (not finished before it)
    logprob: list[float] | None = None
    top: list[list[tuple[int, float]]] | None = None
    done: bool = False
    made: int = 0  # the group's new tokens with this one


class RunningBatch:
    """A batch of rows decoded together one position at a time, which requests (`Group`s) join with `add` (or
    several at once with `add_many`) and leave when they finish (or are `cancel`led) between steps. Each row has
    its own cache row, positions and stopping rule; the rows share every forward. It runs `generate`'s own pieces:
    `Stepper` (the key/value cache: the joining prompts are read together, padded as `generate_texts` pads them,
    then their cache joins the running one, aligned on the last position), `choose` (greedy or sampling) and
    `Settings`; a group's tokens equal `generate`'s on its prompt (tested)."""

    def __init__(self, model_or_pretrained: Any) -> None:
        self.model = generation_model(model_or_pretrained)
        self.device = self.model.embeddings.weight.device
        self.decoder = DECODER_ONLY in capabilities(self.model)
        self.groups: list[Group] = []
        self.step_state: Stepper | None = None
        self.logits: Tensor | None = None  # [rows, vocab]: every row's next choice
        # per row: not said EOS yet, its padding id, its EOS ids (-1 filling the table)
        self.unfinished = torch.zeros(0, dtype=torch.bool, device=self.device)
        self.pad = torch.zeros(0, dtype=torch.long, device=self.device)
        self.eos = torch.zeros(0, 0, dtype=torch.long, device=self.device)

    @property
    def rows(self) -> int:
        return sum(group.rows for group in self.groups)

    def __len__(self) -> int:
        return len(self.groups)

    def add(self, prompt: Sequence[int], group: Group) -> Group:
        """Read `prompt` (token ids: a decoder's prompt, an encoder-decoder's source) for `group`, whose rows then
        take part in the next `step`."""
        self.add_many([(prompt, group)])
        return group

    @torch.no_grad()
    def add_many(self, items: Sequence[tuple[Sequence[int], Group]]) -> None:
        """`add` for several groups, their prompts read in one forward (each prompt once; its cache then copied
        to its group's rows)."""
        if not items:
            return
        prompts = [list(prompt) for prompt, _ in items]
        for prompt, (_, group) in zip(prompts, items):
            ids = torch.tensor([prompt], dtype=torch.long, device=self.device)
            check_prompts(self.model, ids, torch.ones_like(ids), group.settings.max_new_tokens)
            group.settings.check_vocabulary(self.model.config.vocab_size)
        width = max(map(len, prompts))
        pad = self.model.config.pad_token_id if self.model.config.pad_token_id is not None else 0
        # a decoder's prompts padded on the left (its new tokens follow the last column), an encoder's on the right
        ids = torch.tensor([[pad] * (width - len(p)) + p if self.decoder else p + [pad] * (width - len(p))
                            for p in prompts], device=self.device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) if self.decoder else
                             [1] * len(p) + [0] * (width - len(p)) for p in prompts], device=self.device)
        step = Stepper(self.model, ids, mask)
        logits = step.logits(step.prefix)
        sizes = torch.tensor([group.rows for _, group in items], device=self.device)
        copies = torch.arange(len(items), device=self.device).repeat_interleave(sizes)
        step.reorder(copies)
        logits = logits[copies]
        eos_width = max([self.eos.shape[1]] + [len(group.settings.eos_token_ids) for _, group in items])
        eos = [list(g.settings.eos_token_ids) + [-1] * (eos_width - len(g.settings.eos_token_ids))
               for _, g in items for _ in range(g.rows)]
        new_eos = torch.tensor(eos, dtype=torch.long, device=self.device).view(len(eos), eos_width)
        new_pad = torch.tensor([g.settings.pad_token_id for _, g in items for _ in range(g.rows)],
                               dtype=torch.long, device=self.device)
        self.eos = torch.cat([F.pad(self.eos, (0, eos_width - self.eos.shape[1]), value=-1), new_eos])
        self.pad = torch.cat([self.pad, new_pad])
        self.unfinished = torch.cat([self.unfinished, torch.ones(len(eos), dtype=torch.bool, device=self.device)])
        if self.step_state is None:
            self.step_state, self.logits = step, logits
        else:
            assert self.logits is not None
            self.step_state.join(step)
            self.logits = torch.cat([self.logits, logits])
        self.groups.extend(group for _, group in items)

    def cancel(self, group: Group) -> None:
        """`group` leaves the batch at the next step (its client went away)."""
        group.cancelled = True

    @torch.no_grad()
    def step(self) -> list[Chosen]:
        """One token for every row of every group, then one forward of the rows that go on."""
        self._leave([g for g in self.groups if g.cancelled])
        if not self.groups:
            return []
        assert self.logits is not None and self.step_state is not None
        logits = self.logits
        token = logits.argmax(-1)  # the greedy rows' choice (argmax is per row); sampled groups draw theirs
        start = 0
        for group in self.groups:
            if group.settings.do_sample:
                token[start:start + group.rows] = choose(logits[start:start + group.rows], group.settings,
                                                         group.generator)
            start += group.rows
        live = self.unfinished
        token = torch.where(live, token, self.pad)
        ended = (token[:, None] == self.eos).any(1) & live
        self.unfinished = live & ~ended
        tokens, ended_rows, live_rows, left = (token.tolist(), ended.tolist(), live.tolist(),
                                               self.unfinished.tolist())
        chosen: list[Chosen] = []
        start = 0
        for group in self.groups:
            rows = slice(start, start + group.rows)
            group.made += 1
            group.done = group.made >= group.settings.max_new_tokens or not any(left[rows])
            outcome = Chosen(group, tokens[rows], ended_rows[rows], live_rows[rows], done=group.done,
                             made=group.made)
            if group.logprobs is not None:
                logprobs = logits[rows].log_softmax(-1)
                outcome.logprob = logprobs.gather(1, token[rows, None]).squeeze(1).tolist()
                if group.logprobs > 0:
                    values, ids = logprobs.topk(min(group.logprobs, logprobs.shape[-1]), dim=-1)
                    outcome.top = [list(zip(i, v)) for i, v in zip(ids.tolist(), values.tolist())]
            chosen.append(outcome)
            start += group.rows
        if any(group.done for group in self.groups):
            staying = [g for g in self.groups if not g.done]
            if staying:
                token = token[self._rows_of(staying)]
            self._leave([g for g in self.groups if g.done])
        if self.groups:
            assert self.step_state is not None
            self.logits = self.step_state.logits(token[:, None])
        return chosen

    def _rows_of(self, kept: list[Group]) -> Tensor:
        rows, start = [], 0
        wanted = set(map(id, kept))
        for group in self.groups:
            if id(group) in wanted:
                rows.extend(range(start, start + group.rows))
            start += group.rows
        return torch.tensor(rows, dtype=torch.long, device=self.device)

    def _leave(self, leaving: list[Group]) -> None:
        if not leaving:
            return
        gone = set(map(id, leaving))
        staying = [g for g in self.groups if id(g) not in gone]
        if not staying:
            self.groups, self.step_state, self.logits = [], None, None
            self.unfinished, self.pad, self.eos = self.unfinished[:0], self.pad[:0], self.eos[:0]
            return
        keep = self._rows_of(staying)
        assert self.step_state is not None and self.logits is not None
        self.step_state.keep(keep)
        self.logits = self.logits[keep]
        self.unfinished, self.pad, self.eos = self.unfinished[keep], self.pad[keep], self.eos[keep]
        self.groups = staying
