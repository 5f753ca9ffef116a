"""A word vocabulary (ELMo's softmax reads words, its input their characters): words split from text by one rule,
the most frequent kept, saved one a line in `words.txt`.

Ids: 0 `<pad>` (never predicted), 1 `<S>`, 2 `</S>`, 3 `<UNK>`, then the words by descending count (ties in
order of first occurrence), so the same corpus gives the same vocabulary in every run."""

from __future__ import annotations

import os
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path

from bertology.errors import TokenizerError
from bertology.io import atomic_write

WORDS_FILE = "words.txt"
RELEASED_FILE = "vocab.txt"  # beside ELMo's options.json and weights.hdf5 (bertology.model.elmo_format)
PAD, BOS, EOS, UNK = "<pad>", "<S>", "</S>", "<UNK>"
SPECIALS = (PAD, BOS, EOS, UNK)
# A word: letters/digits joined by inner apostrophes, hyphens or periods (don't, 1.5, well-known), or one other
# non-space character (punctuation).
WORD = re.compile(r"\w+(?:[-'’.]\w+)*|[^\w\s]")


class WordVocabulary:
    """Words <-> ids. `split(text)` is the one word splitter (lower-cased when `lowercase`)."""

    def __init__(self, words: Sequence[str], lowercase: bool = False) -> None:
        if tuple(words[:4]) != SPECIALS:
            raise TokenizerError(f"a word vocabulary starts with {', '.join(SPECIALS)}; got {list(words[:4])}")
        self.words = list(words)
        self.lowercase = lowercase
        self.index = {w: i for i, w in enumerate(self.words)}
        if len(self.index) != len(self.words):
            repeated = sorted(w for w, n in Counter(self.words).items() if n > 1)
            raise TokenizerError(f"word vocabulary: {repeated[0]!r} appears twice")
        self.pad_id, self.bos_id, self.eos_id, self.unk_id = range(4)

    @property
    def vocab_size(self) -> int:
        return len(self.words)

    def split(self, text: str) -> list[str]:
        return WORD.findall(text.lower() if self.lowercase else text)

    def id(self, word: str) -> int:
        return self.index.get(word, self.unk_id)

    def encode(self, words: Iterable[str]) -> list[int]:
        return [self.index.get(w, self.unk_id) for w in words]

    @classmethod
    def build(cls, texts: Iterable[str], vocab_size: int, min_frequency: int = 1,
              lowercase: bool = False) -> WordVocabulary:
        """The `vocab_size - 4` most frequent words of `texts` seen at least `min_frequency` times."""
        if vocab_size <= len(SPECIALS):
            raise TokenizerError(f"vocab_size must be > {len(SPECIALS)} (the special words), got {vocab_size}")
        splitter = cls(SPECIALS, lowercase)
        counts: Counter[str] = Counter()
        for text in texts:
            counts.update(splitter.split(text))
        for special in SPECIALS:
            counts.pop(special, None)
        kept = [w for w, n in counts.most_common() if n >= min_frequency][:vocab_size - len(SPECIALS)]
        return cls([*SPECIALS, *kept], lowercase)

    def save(self, directory: str | os.PathLike) -> None:
        path = Path(directory) / WORDS_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        header = "# lowercase\n" if self.lowercase else ""
        with atomic_write(path, "w", encoding="utf-8") as handle:
            handle.write(header + "".join(f"{w}\n" for w in self.words))

    @classmethod
    def find(cls, directory: str | os.PathLike) -> WordVocabulary | None:
        """The vocabulary saved in a model directory: words.txt, or the vocab.txt `write_elmo` writes beside
        ELMo's released files (one word a line, starting with the special words); None when there is neither."""
        directory = Path(directory)
        if (directory / WORDS_FILE).is_file():
            return cls.load(directory)
        if (directory / RELEASED_FILE).is_file():
            return cls.load(directory, RELEASED_FILE)
        return None

    @classmethod
    def load(cls, directory: str | os.PathLike, name: str = WORDS_FILE) -> WordVocabulary:
        path = Path(directory) / name
        if not path.is_file():
            raise TokenizerError(f"{path}: no word vocabulary")
        try:
            lines = path.read_text(encoding="utf-8").split("\n")
        except UnicodeDecodeError as error:
            raise TokenizerError(f"{path}: not UTF-8 text ({error})") from None
        lowercase = bool(lines) and lines[0] == "# lowercase"
        words = lines[1 if lowercase else 0:]
        if words and words[-1] == "":
            words.pop()
        for number, word in enumerate(words, start=2 if lowercase else 1):
            if not word or any(c.isspace() for c in word):
                raise TokenizerError(f"{path}, line {number}: {word!r} is not a word (empty or with spaces)")
        try:
            return cls(words, lowercase)
        except TokenizerError as error:
            raise TokenizerError(f"{path}: {error}") from None
