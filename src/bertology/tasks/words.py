"""The fine-tuning tasks' inputs for a model that reads words as characters (ELMo).

ELMo has no subwords: a task's words go in as they are. `WordTokenizer` stands where a task expects a
`Tokenizer`: it splits a text into words by the word vocabulary's rule (`bertology.tokenization.words`; lower-cased
when the model was trained so) or takes a tagging task's words as given, frames each sentence as `<S> words </S>`
(a pair as `<S> a </S> <S> b </S>`, segment ids 0 then 1), and gives each word one token whose id is the number of
its spelling (`bertology.embeddings.elmo.WordTypes`; 0 padding, 1 `<S>`, 2 `</S>`). So the tasks' encoders, word
chunks and first-subword bookkeeping work unchanged, a word being its own first (and only) token.
`CharacterBatches` wraps the encoded examples so that every batch drawn carries those words' character ids
`[B, L, max_characters]` in place of the numbers, which is what the model reads.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

from bertology.embeddings.elmo import WordTypes
from bertology.errors import TokenizerError
from bertology.tokenization import Encoding
from bertology.tokenization.words import BOS, EOS, PAD, UNK, WORD, WordVocabulary


@dataclass
class WordBatch:
    """What `WordTokenizer.encode_batch` returns: one `Encoding` per text (the tasks read `encodings` only)."""

    encodings: list[Encoding]


class WordTokenizer:
    """One token per word, ids numbering spellings (see the module docstring); `save` writes the vocabulary."""

    pad_token, unk_token = PAD, UNK
    pad_id = 0
    fill_id = 0
    padding_side = "right"

    def __init__(self, max_characters: int, vocabulary: WordVocabulary | None = None) -> None:
        self.types = WordTypes(max_characters)
        self.vocabulary = vocabulary
        self.lowercase = bool(vocabulary is not None and vocabulary.lowercase)
        self.unk_id = self.types.id(UNK)
        self.bos_id, self.eos_id = self.types.id(BOS), self.types.id(EOS)

    def words(self, text: str) -> list[str]:
        return WORD.findall(text.lower() if self.lowercase else text)

    def _ids(self, words: Sequence[str]) -> list[int]:
        return [self.types.id(w.lower() if self.lowercase else w) for w in words]

    def _encoding(self, parts: Sequence[Sequence[str]]) -> Encoding:
        ids: list[int] = []
        types: list[int] = []
        word_ids: list[int | None] = []
        sequence_ids: list[int | None] = []
        tokens: list[str] = []
        for number, words in enumerate(parts):
            ids += [self.bos_id, *self._ids(words), self.eos_id]
            types += [number] * (len(words) + 2)
            word_ids += [None, *range(len(words)), None]
            sequence_ids += [None, *[number] * len(words), None]
            tokens += [BOS, *words, EOS]
        specials = [int(w is None) for w in word_ids]
        return Encoding(ids=ids, tokens=tokens, type_ids=types, offsets=[(0, 0)] * len(ids), word_ids=word_ids,
                        sequence_ids=sequence_ids, special_tokens_mask=specials)

    def encode_words(self, words: Sequence[str], pair: Sequence[str] | None = None, **options: Any) -> Encoding:
        """Pre-split words (a tagging task's), each its own token, between `<S>` and `</S>`."""
        if isinstance(words, str) or not all(isinstance(w, str) for w in words):
            raise TokenizerError(f"encode_words: words must be a list of strings, got {type(words).__name__}")
        return self._encoding([list(words)] if pair is None else [list(words), list(pair)])

    def encode_batch(self, texts: Sequence[str], pairs: Sequence[str] | None = None, *,
                     max_length: int | None = None, **options: Any) -> WordBatch:
        """Texts (or pairs) split into words, truncated longest-first to `max_length` tokens (markers included)."""
        encodings = []
        for k, text in enumerate(texts):
            parts = [self.words(text)] + ([self.words(pairs[k])] if pairs is not None else [])
            if max_length is not None:
                room = max_length - 2 * len(parts)
                if room < len(parts):
                    raise TokenizerError(f"max_length {max_length} leaves no room for words after the "
                                         f"{2 * len(parts)} sentence markers")
                while sum(len(p) for p in parts) > room:
                    longest = max(parts, key=len)
                    longest.pop()
            encodings.append(self._encoding(parts))
        return WordBatch(encodings)

    def save(self, directory: Any) -> None:
        if self.vocabulary is not None:
            self.vocabulary.save(directory)


class CharacterBatches:
    """Encoded examples whose batches carry character ids `[B, L, C]` in place of the spelling numbers (a
    `BatchSource`; any other attribute is the wrapped examples', e.g. a tagging task's `chunks` and `words`)."""

    def __init__(self, source: Any, types: WordTypes) -> None:
        self.source, self.types = source, types

    def __getattr__(self, name: str) -> Any:
        if name in ("source", "types"):
            raise AttributeError(name)
        return getattr(self.source, name)

    def __len__(self) -> int:
        return len(self.source)

    def num_batches(self, epoch: int, batch_size: int, rank: int = 0, world_size: int = 1,
                    drop_last: bool = True) -> int:
        return self.source.num_batches(epoch, batch_size, rank, world_size, drop_last)

    def batches(self, epoch: int, batch_size: int, start_batch: int = 0, rank: int = 0, world_size: int = 1,
                drop_last: bool = True) -> Iterator[Any]:
        for batch in self.source.batches(epoch, batch_size, start_batch, rank, world_size, drop_last):
            yield replace(batch, input_ids=self.types.characters(batch.input_ids))
