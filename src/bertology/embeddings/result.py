"""What `embed` returns: sentence vectors and stacked token and word vectors with an index per row."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

import numpy as np

from bertology.errors import BertologyError, ConfigError

Pooling = Literal["first", "mean", "last"]
POOLINGS: tuple[str, ...] = ("first", "mean", "last")
SentencePooling = Literal["mean", "cls", "max"]
SENTENCE_POOLINGS: tuple[str, ...] = ("mean", "cls", "max")
Level = Literal["token", "word", "sentence"]
LEVELS: tuple[str, ...] = ("token", "word", "sentence")


class EmbeddingError(BertologyError):
    """A text cannot be embedded, or a word or character span is not in the embedded text."""


@dataclass(frozen=True)
class Pieces:
    """Tokens or words of every text, stacked: row r is piece `index[r]` of text `text_index[r]`, which spans
    characters `start[r]:end[r]` of that text. Rows of text i are `rows(i)`, in text order."""

    vectors: np.ndarray  # [n, D] float32
    text_index: np.ndarray  # [n] int64
    index: np.ndarray  # [n] int64: token or word number within its text
    word_index: np.ndarray  # [n] int64: the word a token belongs to (-1 if none); for words, equal to index
    start: np.ndarray  # [n] int64 character offsets into the text
    end: np.ndarray  # [n] int64
    strings: list[str]  # tokens as the vocabulary spells them ("##ing"), or each word's text
    ids: np.ndarray | None  # [n] int64 vocabulary ids (tokens only)
    bounds: np.ndarray  # [num_texts + 1]: rows of text i are bounds[i]:bounds[i + 1]

    def __len__(self) -> int:
        return int(self.vectors.shape[0])

    def rows(self, text: int) -> slice:
        return slice(int(self.bounds[text]), int(self.bounds[text + 1]))


@dataclass(frozen=True)
class Embeddings:
    """Contextual vectors of `texts`. `sentences` is [N, D]; `tokens` holds the content tokens (specials excluded)
    and `words` the tokenizer's pre-tokenised words. A level not asked for is None. D is the hidden size, or four
    times it for concatenated layers."""

    texts: list[str]
    sentences: np.ndarray | None
    tokens: Pieces | None
    words: Pieces | None
    layers: tuple[int, ...]  # hidden states used, 0 = embedding output
    combine: str
    pooling: Pooling
    sentence: SentencePooling
    window_length: int  # tokens per window, specials included
    stride: int  # content tokens between the starts of consecutive windows

    def __len__(self) -> int:
        return len(self.texts)

    @property
    def dim(self) -> int:
        # `is not None`: a level computed for texts without words or tokens is empty, not missing.
        for part in (self.sentences, self.tokens.vectors if self.tokens is not None else None,
                     self.words.vectors if self.words is not None else None):
            if part is not None:
                return int(part.shape[1])
        raise EmbeddingError("no level was computed")

    def find(self, text: int, word: str, occurrence: int = 0) -> tuple[int, int]:
        """Character span of the `occurrence`-th (0-based) whole-word, case-sensitive match of `word` in text."""
        source = self._text(text)
        if not word or not word.strip():
            raise EmbeddingError("find: the word to look for is empty")
        pattern = re.compile(rf"(?<!\w){re.escape(word)}(?!\w)")
        matches = [m.span() for m in pattern.finditer(source)]
        if occurrence < 0 or occurrence >= len(matches):
            raise EmbeddingError(
                f"texts[{text}]: {word!r} occurs {len(matches)} time(s) as a whole word; occurrence {occurrence} "
                f"asked for (text starts {source[:60]!r})"
            )
        return matches[occurrence]

    def span(self, text: int, start: int, end: int, pooling: Pooling | None = None) -> np.ndarray:
        """Vector of characters start:end of a text: the subword tokens overlapping it (those that cover more
        than whitespace), pooled by `pooling` (default: the pooling words were made with). Needs the token level."""
        source = self._text(text)
        if self.tokens is None:
            raise EmbeddingError("span: the token level was not computed (embed with levels including 'token')")
        if not 0 <= start < end <= len(source):
            raise EmbeddingError(f"texts[{text}]: span {start}:{end} is not a non-empty span of its "
                                 f"{len(source)} characters")
        rows = self.tokens.rows(text)
        starts, ends = self.tokens.start[rows], self.tokens.end[rows]
        visible = self.tokens.word_index[rows] >= 0  # tokens of nothing but whitespace never count
        hit = np.flatnonzero((starts < end) & (ends > start) & visible)
        if hit.size == 0:
            raise EmbeddingError(f"texts[{text}]: no token overlaps characters {start}:{end} "
                                 f"({source[start:end]!r})")
        return pool(self.tokens.vectors[rows][hit], pooling or self.pooling)

    def span_means(self, text: int, spans: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Mean vectors of many character spans of text `text` at once (`spans`: [S, 2] start, end pairs): each is
        the mean, in float64, of the subword tokens overlapping the span that cover more than whitespace (`span`
        with mean pooling). Returns the [S, D] float32 means, a zero row for a span no token overlaps, and the [S]
        mask of the spans some token overlaps. Needs the token level."""
        self._text(text)
        if self.tokens is None:
            raise EmbeddingError("span_means: the token level was not computed (embed with levels including 'token')")
        spans = np.asarray(spans, dtype=np.int64).reshape(-1, 2)
        rows = self.tokens.rows(text)
        starts, ends = self.tokens.start[rows], self.tokens.end[rows]
        visible = self.tokens.word_index[rows] >= 0
        # hit[s, j]: token j covers some of span s's characters
        hit = (starts[None, :] < spans[:, 1:2]) & (ends[None, :] > spans[:, 0:1]) & visible[None, :]
        sizes = hit.sum(1)
        weights = hit / np.maximum(sizes, 1)[:, None]
        means = (weights @ self.tokens.vectors[rows].astype(np.float64)).astype(np.float32)
        return means, sizes > 0

    def vector(self, text: int, target: str | tuple[int, int], occurrence: int = 0,
               pooling: Pooling | None = None) -> np.ndarray:
        """Vector of a word occurrence (see `find`) or of a (start, end) character span in text `text`."""
        start, end = self.find(text, target, occurrence) if isinstance(target, str) else target
        return self.span(text, start, end, pooling)

    def _text(self, text: int) -> str:
        if not 0 <= text < len(self.texts):
            raise EmbeddingError(f"text index {text} is out of range for {len(self.texts)} texts")
        return self.texts[text]


def pool(vectors: np.ndarray, pooling: str) -> np.ndarray:
    """Pool [n, D] subword vectors (n >= 1) into one [D] vector."""
    if pooling == "first":
        return vectors[0].copy()
    if pooling == "last":
        return vectors[-1].copy()
    if pooling == "mean":
        return vectors.mean(0, dtype=np.float64).astype(np.float32)
    raise ConfigError(f"pooling: unknown {pooling!r}; expected one of {', '.join(POOLINGS)}")


def normalize(vectors: np.ndarray) -> np.ndarray:
    """Rows scaled to unit L2 norm (float32; an all-zero row stays zero), e.g. for inner-product search."""
    vectors = np.asarray(vectors, dtype=np.float32)
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return np.ascontiguousarray(vectors / np.maximum(norms, 1e-12), dtype=np.float32)
