"""Backbones of bertology's models for `embed` (the protocol, `Backbone` and `Framed`, is
`bertology.embeddings.protocol`, named here too): `EncoderBackbone` over any bertology model, ELMo's `ElmoBackbone`
(`bertology.embeddings.elmo`), and `as_backbone`, which picks one."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from bertology.embeddings.elmo import ElmoBackbone
from bertology.embeddings.protocol import Backbone, Framed
from bertology.embeddings.result import EmbeddingError
from bertology.errors import TokenizerError
from bertology.model import Model, Pretrained
from bertology.model.encoder import as_model
from bertology.model.encoder import Encoder
from bertology.model.protocol import CHARACTERS, GLOBAL_TOKENS, capabilities
from bertology.tokenization import Tokenizer


class EncoderBackbone(torch.nn.Module):
    """A bertology model as a `Backbone`: content framed by the tokenizer's framing (``Tokenizer.framing``: BERT
    ``[CLS] ids [SEP]``, RoBERTa ``<s> ids </s>``, GPT-2 nothing, XLNet ``ids <sep> <cls>``) with its segment ids,
    its cls token as the summary. Hidden states come from the model's `layer_states` (the BERT-family encoder's
    layers, a causal decoder's blocks, an encoder-decoder's encoder side; a bare `Encoder` stack is read the same
    way)."""

    def __init__(self, model: Pretrained | Model | Encoder, tokenizer: Tokenizer | None = None) -> None:
        super().__init__()
        if isinstance(model, Pretrained):
            model, tokenizer = model.model, tokenizer or model.tokenizer
        model = as_model(model)
        if not callable(getattr(model, "layer_states", None)):
            raise EmbeddingError(f"EncoderBackbone needs a Pretrained, a bertology model or an Encoder, got "
                                 f"{type(model).__name__}")
        if tokenizer is None:
            raise EmbeddingError("embed needs a tokenizer: the model has none, pass tokenizer=")
        if tokenizer.vocab_size > model.config.vocab_size:
            raise TokenizerError(f"the tokenizer has {tokenizer.vocab_size} tokens but the model's vocabulary only "
                                 f"{model.config.vocab_size}: they do not belong together")
        self.encoder = model  # the model, whose layer_states are read
        self.training = model.training  # a new Module starts in training mode; follow the model's instead
        self.tokenizer = tokenizer  # embed's default tokenizer
        self.framing = tokenizer.framing
        # A windowed encoder (Longformer) reads a whole long text in one forward, its summary token global (when
        # the framing puts it first, as BERT's and RoBERTa's do).
        self.global_summary = GLOBAL_TOKENS in capabilities(model) and self.framing.frame([]).summary == 0

    @property
    def num_layers(self) -> int:
        return self.encoder.config.num_layers  # a decoder's blocks, an encoder-decoder's encoder side

    @property
    def hidden_size(self) -> int:
        return self.encoder.config.hidden_size

    @property
    def max_length(self) -> int:
        return self.encoder.config.max_length  # RoBERTa's positions after the padding index already taken off

    @property
    def pad_id(self) -> int:
        return self.framing.fill_id

    def frame(self, ids: Sequence[int]) -> Framed:
        framed = self.framing.frame(ids)
        (start, stop), = framed.spans
        type_ids = framed.type_ids if any(framed.type_ids) else None
        return Framed(framed.ids, start, stop, summary=framed.summary, type_ids=type_ids)

    def hidden_states(self, input_ids: Tensor, attention_mask: Tensor, token_type_ids: Tensor) -> tuple[Tensor, ...]:
        device = next(self.encoder.parameters()).device
        inputs = (input_ids.to(device), attention_mask.to(device), token_type_ids.to(device))
        if not self.global_summary:
            return self.encoder.layer_states(*inputs)
        flags = torch.zeros_like(inputs[0])
        flags[:, 0] = inputs[1][:, 0]
        return self.encoder.layer_states(*inputs, global_attention_mask=flags)


def as_backbone(model: Backbone | Pretrained | Model | Encoder, tokenizer: Tokenizer | None) -> Backbone:
    """`model` itself when it is a `Backbone`, an ELMo model in an `ElmoBackbone` (it reads words), bertology's other
    models wrapped in an `EncoderBackbone`."""
    if CHARACTERS in capabilities(model.model if isinstance(model, Pretrained) else model):
        return ElmoBackbone(model, tokenizer)  # type: ignore[arg-type]
    if isinstance(model, Pretrained) or callable(getattr(as_model(model), "layer_states", None)):
        return EncoderBackbone(model, tokenizer)
    if isinstance(model, Backbone):
        return model
    raise EmbeddingError(f"embed needs a Backbone (num_layers, hidden_size, max_length, pad_id, frame, "
                         f"hidden_states), or a Pretrained, a bertology model or an Encoder; got "
                         f"{type(model).__name__}")
