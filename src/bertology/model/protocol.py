"""The `Model` protocol: what the trainer, objectives, tasks, PEFT and tools may ask of any model.

`EncoderModel` (bidirectional), `DecoderModel` (causal, with a key/value cache) and `Seq2SeqModel` implement it. Code
above the model package types its arguments as `Model`; where a feature is truly encoder-only it checks with
`require_encoder` and says so."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import torch
from torch import Tensor, nn

from bertology.errors import ConfigError, InputError
from bertology.model.heads import HeadSpec


@runtime_checkable
class Model(Protocol):
    """A model with named heads, extension slots and a forward pass taking transformers' keyword names."""

    config: Any
    head_specs: tuple[HeadSpec, ...]
    heads: nn.ModuleDict
    extensions: dict[str, tuple[str, dict[str, Any]]]

    def __call__(self, input_ids: Tensor, attention_mask: Tensor | None = None, *args: Any, **kwargs: Any) -> Any: ...

    def forward_inputs(self, batch: Any) -> dict[str, Any]:
        """The keyword arguments of this model's forward pass for a training batch (the fields it reads)."""
        ...

    def blocks(self) -> Sequence[nn.Module]:
        """The transformer blocks, in order: the unit of sharding and activation checkpointing."""
        ...

    def layer_states(self, input_ids: Tensor, attention_mask: Tensor,
                     token_type_ids: Tensor | None = None) -> tuple[Tensor, ...]:
        """The contextual representations that embeddings and analyses read: the embedding output, then each
        block's output ([B, L, H] each; an encoder-decoder's encoder side)."""
        ...

    def add_extension(self, where: str, factory: str, **options: Any) -> nn.Module: ...

    def init_weights(self, generator: Any = None) -> None: ...

    @property
    def word_embeddings(self) -> nn.Embedding: ...


# What a model can do, declared by its class as `capabilities` (a frozenset of these names), so that code above the
# model package asks for what it needs instead of which class it holds.
GENERATES = "generates"              # autoregressive decoding through a key/value cache (`bertology.generate`)
DECODER_ONLY = "decoder-only"        # a causal decoder: a prompt is the start of its own output
ENCODER_DECODER = "encoder-decoder"  # an encoder read once, then a decoder generating from its start token
MASKED_LM = "masked-lm"              # a bidirectional encoder with a masked-LM head ('mlm')


def capabilities(model: Any) -> frozenset[str]:
    """What `model` declares it can do; nothing for a model that declares nothing."""
    return frozenset(getattr(model, "capabilities", ()))


def require_encoder(model: Any, feature: str) -> Any:
    """`model` when it is a bidirectional encoder; else a ConfigError saying that `feature` needs one."""
    from bertology.model.encoder import EncoderModel

    if not isinstance(model, EncoderModel):
        raise ConfigError(f"{feature} needs a bidirectional encoder (BERT family); this model is a "
                          f"{type(model).__name__}")
    return model


def check_id_range(ids: Tensor, vocab_size: int, what: str) -> None:
    """`ids` all in [0, vocab_size), else an InputError naming `what` and the range found. On an accelerator the
    check runs on the device (reading the values would make the host wait for it)."""
    if not ids.numel():
        return
    if ids.device.type != "cpu":
        torch._assert_async(((ids >= 0) & (ids < vocab_size)).all(), f"{what} must lie in [0, {vocab_size})")
    elif int(ids.min()) < 0 or int(ids.max()) >= vocab_size:
        raise InputError(f"{what} must lie in [0, {vocab_size}), got [{int(ids.min())}, {int(ids.max())}]: does the "
                         "tokenizer match the model?")
