"""Longformer (Beltagy et al. 2020): a RoBERTa encoder whose tokens attend to a sliding window of their neighbours,
plus a few global tokens that attend to, and are attended by, every token with projections of their own.

    local token i:  softmax over the keys i - w/2 .. i + w/2 and the global tokens (query, key, value)
    global token:   softmax over every key (query_global, key_global, value_global)

The window is per layer (`attention_window`, transformers' full width w); the attention is the shared kernel
(bertology.model.attention.windowed_attention), linear in the length. transformers pads a batch to a multiple of
the window; the blocked kernel needs no padding (the padding keys are masked there, so the outputs agree).

`LongformerModel` is the encoder with transformers' defaults for the global tokens: with no `global_attention_mask`,
a sequence classifier makes the first token global, a question-answering model every token before the first
separator (the question), as transformers' classes do; the other heads have none."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from bertology.errors import ConfigError, InputError
from bertology.model.config import EncoderConfig, Family, config_from_dict
from bertology.model.encoder import EncoderModel, EncoderOutput
from bertology.model.registry import register_model


@dataclass
class LongformerConfig(EncoderConfig):
    """An EncoderConfig with a window: RoBERTa's positions (numbered after the padding id) and Longformer's
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

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LongformerConfig:
        return config_from_dict(cls, data, "longformer")


class LongformerModel(EncoderModel):
    """The encoder with windowed attention and transformers' default global tokens (see the module docstring)."""

    config_class = LongformerConfig
    config: LongformerConfig

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None, token_type_ids: Tensor | None = None,
                position_ids: Tensor | None = None, *, global_attention_mask: Tensor | None = None,
                **options: Any) -> EncoderOutput:
        """EncoderModel.forward with `global_attention_mask` [B, L] (1 = global; real tokens only), defaulted as
        transformers' class with these heads does."""
        if global_attention_mask is None:
            global_attention_mask = self.default_global_tokens(input_ids)
        return super().forward(input_ids, attention_mask, token_type_ids, position_ids,
                               global_attention_mask=global_attention_mask, **options)

    def default_global_tokens(self, input_ids: Tensor) -> Tensor | None:
        """transformers' defaults: the first token for a sequence classifier, the question (every token before the
        first separator; three separators a row) for question answering, none otherwise."""
        primary = self.head_specs[0].name if self.head_specs else None
        if primary == "classifier":
            flags = torch.zeros_like(input_ids)
            flags[:, 0] = 1
            return flags
        if primary == "qa" and input_ids.dim() == 2:
            separators = (input_ids == self.config.sep_token_id).nonzero()
            counts = (input_ids == self.config.sep_token_id).sum(1)
            if not bool((counts == 3).all()):
                row = int((counts != 3).nonzero()[0])
                raise InputError(f"global_attention_mask: row {row} has {int(counts[row])} separator tokens "
                                 f"(sep_token_id {self.config.sep_token_id}); question answering puts the question "
                                 "before the first of exactly three, or pass global_attention_mask")
            question_end = separators.view(-1, 3, 2)[:, 0, 1]
            return (torch.arange(input_ids.shape[1], device=input_ids.device)[None, :]
                    < question_end[:, None]).long()
        return None

    def forward_inputs(self, batch: Any) -> dict[str, Any]:
        return {**super().forward_inputs(batch), "global_attention_mask": getattr(batch, "global_attention_mask", None)}


register_model("longformer", LongformerModel)
