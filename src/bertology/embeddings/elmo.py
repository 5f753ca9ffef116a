"""ELMo as an `embed` backbone: word-level vectors from characters.

ELMo reads words, not subword ids, so its backbone brings its own tokenizer (`WordSplitter`): a text's words by
the word vocabulary's rule (`bertology.tokenization.words`, lower-cased when the model was trained so), each with
its character offsets and one token per word (so tokens are words). A token's id is the backbone's number for that
word's spelling (`WordTypes`, grown as texts are split; 0 is padding, 1 `<S>`, 2 `</S>`), from which the backbone
takes the word's characters: a word outside the softmax's vocabulary keeps its own characters. Each window is
framed as a sentence, `<S> words </S>`, and the backbone returns ELMo's three layers (the token layer twice, then
each biLSTM layer); `layers="mean"` is the scalar mix at equal weights, `-1` the top layer."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from bertology.embeddings.protocol import Framed
from bertology.embeddings.result import EmbeddingError
from bertology.model.checkpoint import Pretrained
from bertology.model.elmo import CharacterMapper, ElmoModel
from bertology.model.protocol import CHARACTERS, capabilities, model_kind
from bertology.tokenization import Encoding
from bertology.tokenization.words import BOS, EOS, PAD, WORD, WordVocabulary

# ELMo has no position limit; a window this long is one text in practice (an LSTM's cost is linear in it).
MAX_WORDS = 1 << 16


class WordTypes:
    """Spellings <-> numbers, with each spelling's character ids (2 bytes each; thread-safe: the service splits
    texts in threads)."""

    def __init__(self, max_characters: int) -> None:
        self.mapper = CharacterMapper(max_characters)
        self.width = max_characters
        self.index: dict[str, int] = {}
        self.chars: list[bytes] = []
        self.lock = threading.Lock()
        for word in (PAD, BOS, EOS):
            self.id(word)
        self.chars[0] = bytes(2 * max_characters)  # padding: no characters

    def id(self, word: str) -> int:
        found = self.index.get(word)
        if found is not None:
            return found
        chars = np.asarray(self.mapper.word(word), dtype=np.uint16).tobytes()  # no UTF-8 bytes: an InputError
        with self.lock:
            found = self.index.setdefault(word, len(self.chars))
            if found == len(self.chars):
                self.chars.append(chars)
        return found

    def characters(self, ids: Tensor) -> Tensor:
        """Character ids [..., max_characters] of spelling numbers `ids`, built for the distinct ones only."""
        distinct, inverse = torch.unique(ids, return_inverse=True)
        with self.lock:
            rows = b"".join(self.chars[i] for i in distinct.tolist())
        table = torch.from_numpy(np.frombuffer(rows, dtype=np.uint16).astype(np.int64).reshape(-1, self.width))
        return table[inverse]


class WordSplitter:
    """The tokenizer `embed` uses with an ELMo backbone: one token per word, ids from `WordTypes`."""

    model_max_length: int | None = None

    def __init__(self, types: WordTypes, lowercase: bool = False) -> None:
        self.types, self.lowercase = types, lowercase

    def encode(self, text: str, add_special_tokens: bool = False) -> Encoding:
        matches = list(WORD.finditer(text))
        words = [m.group().lower() if self.lowercase else m.group() for m in matches]
        ids = [self.types.id(w) for w in words]
        n = len(words)
        return Encoding(ids=ids, tokens=words, type_ids=[0] * n, offsets=[m.span() for m in matches],
                        word_ids=list(range(n)), sequence_ids=[0] * n, special_tokens_mask=[0] * n)


class ElmoBackbone(torch.nn.Module):
    """An ElmoModel (or a Pretrained holding one) as a `Backbone`; `tokenizer` is its `WordSplitter`."""

    reads_words = True  # embed takes this backbone's own tokenizer

    def __init__(self, model: Pretrained | ElmoModel, vocabulary: WordVocabulary | None = None) -> None:
        super().__init__()
        if isinstance(model, Pretrained):
            model, vocabulary = model.model, vocabulary or model.tokenizer
        if CHARACTERS not in capabilities(model):
            raise EmbeddingError(f"ElmoBackbone needs a model that reads words as characters (capability "
                                 f"{CHARACTERS!r}: ELMo), got {model_kind(model)}")
        if vocabulary is not None and not isinstance(vocabulary, WordVocabulary):
            raise EmbeddingError(f"an ELMo model splits its own words; got a {type(vocabulary).__name__} as its "
                                 "tokenizer (give a WordVocabulary, or none)")
        self.model = model
        self.training = model.training
        self.types = WordTypes(model.config.max_characters_per_token)
        self.tokenizer = WordSplitter(self.types, bool(vocabulary and vocabulary.lowercase))

    @property
    def num_layers(self) -> int:
        return self.model.config.num_layers

    @property
    def hidden_size(self) -> int:
        return self.model.config.hidden_size

    @property
    def max_length(self) -> int:
        return MAX_WORDS

    @property
    def pad_id(self) -> int:
        return 0

    def frame(self, ids: Sequence[int]) -> Framed:
        return Framed([1, *ids, 2], 1, 1 + len(ids), summary=None)

    def hidden_states(self, input_ids: Tensor, attention_mask: Tensor, token_type_ids: Any = None
                      ) -> tuple[Tensor, ...]:
        device = next(self.model.parameters()).device
        chars = self.types.characters(input_ids)
        return self.model.layer_states(chars.to(device), attention_mask.to(device))
