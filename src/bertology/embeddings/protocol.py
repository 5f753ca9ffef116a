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

from torch import Tensor


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
