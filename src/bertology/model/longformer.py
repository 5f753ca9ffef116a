"""Longformer (Beltagy et al. 2020): a RoBERTa encoder whose tokens attend to a sliding window of their neighbours,
plus a few global tokens that attend to, and are attended by, every token with projections of their own.

    local token i:  softmax over the keys i - w/2 .. i + w/2 and the global tokens (query, key, value)
    global token:   softmax over every key (query_global, key_global, value_global)

The window is per layer (`attention_window`, transformers' full width w); the attention is the shared kernel
(bertology.model.attention.windowed_attention), linear in the length. transformers pads a batch to a multiple of
the window; the blocked kernel needs no padding (the padding keys are masked there, so the outputs agree).

`LongformerModel` is the encoder with transformers' defaults for the global tokens: with no `global_attention_mask`,
a sequence classifier makes the first token global, a question-answering model every token before the first
separator (the question), as transformers' classes do; the other heads have none.

`longformer_from` turns a BERT or RoBERTa encoder into a Longformer as the paper does: the position embeddings
copied over and over up to the new length, each layer's global projections initialised from its local ones; on
inputs whose tokens all lie within half a window of each other it computes what the short model does."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from bertology.errors import ConfigError, InputError
from bertology.model.config import TransformerConfig, Family, config_from_dict
from bertology.model.convert import checkpoint_family
from bertology.model.encoder import EncoderModel, EncoderOutput
from bertology.model.protocol import ENCODER, GLOBAL_TOKENS, HEAD_MASK


@dataclass
class LongformerConfig(TransformerConfig):
    """An TransformerConfig with a window: RoBERTa's positions (numbered after the padding id) and Longformer's
    defaults; `sep_token_id` finds the question for a question-answering model's global tokens."""

    family: Family = "longformer"
    positions_after_padding: bool = True
    pad_token_id: int = 1
    attention_window: list[int] | None = 512  # type: ignore[assignment]  # one number: every layer's
    sep_token_id: int = 2

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.attention_window is None:
            raise ConfigError("attention_window: a Longformer needs a window (an even number per layer)")
        if not self.stack_embeddings:
            raise ConfigError("stack_embeddings: a Longformer's embeddings are its stack's (RoBERTa's layout)")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LongformerConfig:
        return config_from_dict(cls, data, "longformer")


class LongformerModel(EncoderModel):
    """The encoder with windowed attention and transformers' default global tokens (see the module docstring)."""

    config_class = LongformerConfig
    config: LongformerConfig
    # Every Longformer keeps BERT's layout (its stack's own embeddings) and its windows' global tokens.
    CAPABILITIES = EncoderModel.CAPABILITIES | {ENCODER, HEAD_MASK, GLOBAL_TOKENS}

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None, token_type_ids: Tensor | None = None,
                position_ids: Tensor | None = None, *, global_attention_mask: Tensor | None = None,
                **options: Any) -> EncoderOutput:
        """EncoderModel.forward with `global_attention_mask` [B, L] (1 = global; real tokens only), defaulted as
        transformers' class with these heads does."""
        if input_ids.dim() == 2 and input_ids.shape[1] > self.config.max_length:
            raise InputError(f"input_ids: a sequence of {input_ids.shape[1]} tokens is longer than this Longformer's "
                             f"{self.config.max_length} positions (max_position_embeddings "
                             f"{self.config.max_position_embeddings} less the padding offset); make a longer one with "
                             "`bertology longformer convert --max-length`, or embed the text in windows")
        if global_attention_mask is None:
            global_attention_mask = self.default_global_tokens(input_ids)
        return super().forward(input_ids, attention_mask, token_type_ids, position_ids,
                               global_attention_mask=global_attention_mask, **options)

    def default_global_tokens(self, input_ids: Tensor) -> Tensor | None:
        """transformers' defaults: the first token for a sequence classifier, the question (every token before the
        first separator; transformers asks for RoBERTa's three a row, a pair of BERT's has two) for question
        answering, none otherwise."""
        primary = self.head_specs[0].name if self.head_specs else None
        if primary == "classifier":
            flags = torch.zeros_like(input_ids)
            flags[:, 0] = 1
            return flags
        if primary == "qa" and input_ids.dim() == 2:
            separators = input_ids == self.config.sep_token_id
            counts = separators.sum(1)
            if not bool((counts >= 2).all()):
                row = int((counts < 2).nonzero()[0])
                raise InputError(f"global_attention_mask: row {row} has {int(counts[row])} separator token(s) "
                                 f"(sep_token_id {self.config.sep_token_id}); question answering reads a question "
                                 "and a context (the question before the first separator), or pass "
                                 "global_attention_mask")
            question_end = separators.int().argmax(1)  # the first separator (RoBERTa's pairs have three, BERT's two)
            return (torch.arange(input_ids.shape[1], device=input_ids.device)[None, :]
                    < question_end[:, None]).long()
        return None

    def forward_inputs(self, batch: Any) -> dict[str, Any]:
        return {**super().forward_inputs(batch), "global_attention_mask": getattr(batch, "global_attention_mask", None)}

# Families a Longformer can be made from (learned absolute positions, token types, one set of layers each).
SOURCE_FAMILIES = ("bert", "roberta", "xlm-roberta")


# The longest Longformer `longformer convert` makes: 2**17 = 131,072 tokens, 32 times the published models' 4,096.
# Its position table repeats the source's rows (nothing is learned past them), and one document of that length
# already asks window x length scores per head and layer (512 x 2**17 x 12 heads: 3 GiB a layer in float32); the
# table alone of 10**8 positions would be 300 GB at width 768.
MAX_LENGTH = 1 << 17


def check_max_length(max_length: Any, source_length: int | None = None) -> int:
    """`max_length` (--max-length) for a Longformer: an integer from the source model's positions up to
    MAX_LENGTH."""
    if isinstance(max_length, bool) or not isinstance(max_length, int):
        raise ConfigError(f"max_length (--max-length) {max_length!r}: expected a number of tokens")
    if max_length > MAX_LENGTH:
        raise ConfigError(f"max_length (--max-length) {max_length} is above the limit of {MAX_LENGTH} tokens: the "
                          "position table repeats the source's positions, and one document that long already asks "
                          "window x length attention scores per head and layer (see docs/LONG.md)")
    if source_length is not None and max_length < source_length:
        raise ConfigError(f"max_length (--max-length) {max_length!r} is shorter than the source model's "
                          f"{source_length} positions: a Longformer is longer than the model it is made from")
    return max_length


def check_source(model: Any) -> None:
    """A ConfigError unless `model` is an encoder a Longformer can be made from."""
    source = model.config
    if type(model) is not EncoderModel or getattr(source, "family", None) not in SOURCE_FAMILIES:
        raise ConfigError(f"model (--model): a Longformer is made from a {', '.join(SOURCE_FAMILIES)} encoder, got "
                          f"{getattr(source, 'family', type(model).__name__)!r}")
    if source.num_layer_groups is not None or source.embedding_size is not None or source.pruned_heads \
            or model.extensions or source.attention_window is not None:
        raise ConfigError("model (--model): shared layers, projected embeddings, pruned heads, windows and extensions "
                          "have no place in a Longformer")


def check_window(window: Any) -> int:
    if isinstance(window, bool) or not isinstance(window, int) or window <= 0 or window % 2:
        raise ConfigError(f"window (--window) {window!r}: the attention window must be an even, positive number of "
                          "tokens (half of it on each side of a token)")
    return window


@torch.no_grad()
def longformer_from(model: EncoderModel, max_length: int, window: int,
                    sep_token_id: int | None = None) -> tuple[LongformerModel, list[str]]:
    """A Longformer made from the BERT or RoBERTa `model` (Beltagy et al. 2020, section 5): positions for
    `max_length` tokens, each new one a copy of the source's at the same place modulo its length; `window` tokens of
    attention window in every layer; every layer's query_global, key_global and value_global copies of its query,
    key and value. Positions are numbered after the padding id, as in RoBERTa (a BERT source's then shift by one).
    Returns the model and the names of the source's heads a Longformer has no place for (dropped: BERT's NSP and
    pooled classifier)."""
    heads_table = checkpoint_family("longformer").heads
    check_window(window)
    check_source(model)
    source = model.config
    check_max_length(max_length, source.max_length)
    values = {f.name: getattr(source, f.name) for f in dataclasses.fields(TransformerConfig)}
    extra = {k: v for k, v in source.extra.items() if k not in ("model_type", "architectures", "_name_or_path")}
    if sep_token_id is None:
        sep_token_id = int(extra.get("sep_token_id") or extra.get("eos_token_id") or 2)
    offset = source.pad_token_id + 1
    values.update(family="longformer", positions_after_padding=True, max_position_embeddings=max_length + offset,
                  attention_window=[window] * source.num_layers, extra=extra)
    config = LongformerConfig(**values, sep_token_id=sep_token_id)
    kept, dropped = [], []
    for spec in model.head_specs:
        head = heads_table.get(spec.name)
        fits = head is not None and head.kind == spec.kind and (
            spec.kind not in ("masked_lm", "first_token") or spec.activation == (head.activation or config.hidden_act))
        (kept if fits else dropped).append(spec)
    longformer = LongformerModel(config, kept)
    state = {name: tensor for name, tensor in model.state_dict().items()
             if not name.startswith(tuple(f"heads.{spec.name}." for spec in dropped))}
    old = state["encoder.embeddings.position.weight"]
    new = old.new_zeros(config.max_position_embeddings, old.shape[1])
    new[:min(offset, len(old))] = old[:offset]  # the padding positions
    tokens = torch.arange(max_length)
    new[offset + tokens] = old[source.first_position + tokens % source.max_length]
    state["encoder.embeddings.position.weight"] = new
    for i in range(config.num_layers):
        for part in ("query", "key", "value"):
            for param in ("weight", "bias"):
                state[f"encoder.layers.{i}.{part}_global.{param}"] = state[f"encoder.layers.{i}.{part}.{param}"].clone()
    longformer.load_state_dict(state)
    return longformer.eval(), [spec.name for spec in dropped]
