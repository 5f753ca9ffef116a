"""The backbone protocol: what `embed` (and analyses built on it) needs from a contextual encoder.

A backbone turns a batch of token-id sequences into hidden states, and says how a sequence of content ids is
framed with its special tokens. `embed` uses nothing else, so any encoder that implements it — bertology's
BERT-family `Encoder` (through `EncoderBackbone`), a biLSTM over characters (ELMo), XLNet with ``<sep> <cls>`` at
the end — gets token, word and sentence vectors and long-text windows for free.

    class Backbone(Protocol):
        num_layers: int    # hidden states returned = num_layers + 1, the embedding output first
        hidden_size: int   # H, the width of every hidden state
        max_length: int    # the longest sequence the backbone takes, specials included
        pad_id: int        # an id for padded positions (they are masked out; any valid id will do)
        def frame(self, ids: Sequence[int]) -> Framed: ...
        def hidden_states(self, input_ids, attention_mask, token_type_ids) -> tuple[Tensor, ...]: ...

`frame(ids)` wraps content ids (a whole text or one window of it) in the backbone's specials and returns a
`Framed`: the framed ids, where the content sits (``ids[start:stop]``, the content in order, one position per
content id), the position of the "summary" token that `sentence="cls"` reads (BERT [CLS]: 0; XLNet <cls>: the
last position; None when there is none) and optional segment ids. The specials must not depend on the content:
every call adds the same number before and after (checked), so a window of C content tokens is C + that number
long. BERT: ``[CLS] ids [SEP]``, start 1, summary 0; XLNet: ``ids <sep> <cls>``, start 0, summary len - 1.

`hidden_states(input_ids, attention_mask, token_type_ids)` takes right-padded [B, L] long tensors on the CPU
(attention_mask 1 = real position) and returns num_layers + 1 tensors [B, L, H], position for position; values at
padded positions are ignored. The backbone moves the inputs to its own device. `embed` calls it under
`torch.inference_mode()` and, when the backbone is a `torch.nn.Module`, in eval mode (every submodule's mode is
restored afterwards). A backbone may carry a `tokenizer` attribute, which `embed` uses when given none.

Texts are tokenised without specials (`Tokenizer.encode(text, add_special_tokens=False)`), so the tokenizer gives
content ids, offsets and words and the backbone alone decides the framing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch
from torch import Tensor

from bertology.embeddings.result import EmbeddingError
from bertology.errors import TokenizerError
from bertology.model import Model, Pretrained
from bertology.model.base import as_model
from bertology.model.encoder import Encoder
from bertology.model.protocol import CHARACTERS, GLOBAL_TOKENS, capabilities
from bertology.tokenization import Tokenizer


@dataclass(frozen=True)
class Framed:
    """Content ids wrapped in a backbone's specials: `ids[start:stop]` is the content, `summary` the position of
    the summary token (None if the backbone has none), `type_ids` the segment ids (None: all 0)."""

    ids: list[int]
    start: int
    stop: int
    summary: int | None = None
    type_ids: list[int] | None = None

    @property
    def before(self) -> int:
        """Specials before the content."""
        return self.start

    @property
    def after(self) -> int:
        """Specials after the content."""
        return len(self.ids) - self.stop


@runtime_checkable
class Backbone(Protocol):
    """A contextual encoder as `embed` sees it (see the module docstring)."""

    @property
    def num_layers(self) -> int: ...

    @property
    def hidden_size(self) -> int: ...

    @property
    def max_length(self) -> int: ...

    @property
    def pad_id(self) -> int: ...

    def frame(self, ids: Sequence[int]) -> Framed: ...

    def hidden_states(self, input_ids: Tensor, attention_mask: Tensor, token_type_ids: Tensor) -> tuple[Tensor, ...]: ...


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
        from bertology.embeddings.elmo import ElmoBackbone

        return ElmoBackbone(model, tokenizer)  # type: ignore[arg-type]
    if isinstance(model, Pretrained) or callable(getattr(as_model(model), "layer_states", None)):
        return EncoderBackbone(model, tokenizer)
    if isinstance(model, Backbone):
        return model
    raise EmbeddingError(f"embed needs a Backbone (num_layers, hidden_size, max_length, pad_id, frame, "
                         f"hidden_states), or a Pretrained, a bertology model or an Encoder; got "
                         f"{type(model).__name__}")
