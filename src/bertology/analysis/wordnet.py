"""Princeton WordNet 3.0 read from its published database files (`index.sense`, `data.{noun,verb,adj,adv}`,
`lexnames`): sense keys, synsets with their glosses, lemmas, hypernyms and lexicographer file names, and the
candidate senses of a lemma and part of speech in WordNet's sense-number order.

A sense key is `lemma%ss_type:lex_filenum:lex_id:head_word:head_id` (ss_type 1 noun, 2 verb, 3 adjective,
4 adverb, 5 adjective satellite). `index.sense` maps each key to its synset's byte offset in the data file of its
part of speech (satellites live in `data.adj`) and to its sense number, 1 being the most frequent sense.
"""

from __future__ import annotations

import functools
import os
import re
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from bertology.errors import DataError
from bertology.inputs import text_lines

# The data file holding each ss_type; satellites (5) are adjectives.
_SS_TYPE_FILE = {"1": "n", "2": "v", "3": "a", "4": "r", "5": "a"}
_DATA_FILES = {"n": "data.noun", "v": "data.verb", "a": "data.adj", "r": "data.adv"}
# Parts of speech as callers name them: WordNet's letters and the universal tags of the WSD framework.
_POS_ALIASES = {"n": "n", "noun": "n", "v": "v", "verb": "v", "a": "a", "s": "a", "adj": "a", "r": "r", "adv": "r"}
_ADJ_MARKER = re.compile(r"\((?:a|p|ip)\)$")  # syntactic markers on adjective lemmas in data.adj: "galore(ip)"
_QUOTED = re.compile(r'"[^"]*"')


class WordNetError(DataError):
    """A WordNet database file is missing or malformed."""


def wordnet_pos(pos: str) -> str:
    """WordNet's file letter (n, v, a, r) for a part of speech given as a letter (s counts as a) or as the WSD
    framework's NOUN / VERB / ADJ / ADV."""
    letter = _POS_ALIASES.get(pos.lower())
    if letter is None:
        raise DataError(f"unknown part of speech {pos!r}; expected NOUN, VERB, ADJ, ADV or n, v, a, s, r")
    return letter


@dataclass(frozen=True)
class Synset:
    """One synset: `id` is "<file letter>:<offset>" (e.g. "n:00001740"); `ss_type` is n, v, a, s or r."""

    id: str
    ss_type: str
    lexname: str
    lemmas: tuple[str, ...]  # as the data file spells them, markers removed ("physical_entity", "Atlanta")
    definition: str  # the gloss without its quoted examples, as nltk's Synset.definition()
    gloss: str  # the whole gloss, examples included
    hypernyms: tuple[str, ...]  # synset ids of the "@" pointers
    instance_hypernyms: tuple[str, ...]  # "@i" pointers


@dataclass(frozen=True)
class Sense:
    key: str
    synset: str  # synset id
    number: int  # sense number of the key's lemma in its part of speech (1 = first)
    tag_count: int  # SemCor-based frequency from index.sense


class WordNet:
    """WordNet 3.0 from a directory of its database files. Load it with `load_wordnet` (cached per directory)."""

    def __init__(self, directory: str | os.PathLike) -> None:
        self.directory = Path(directory)
        if not self.directory.is_dir():
            raise WordNetError(f"{self.directory}: not a directory holding WordNet's database files")
        self.lexnames = self._read_lexnames()
        self.synsets: dict[str, Synset] = {}
        for letter, name in _DATA_FILES.items():
            self._read_data(letter, self.directory / name)
        self.senses: dict[str, Sense] = {}
        self._by_lemma: dict[tuple[str, str], list[Sense]] = defaultdict(list)
        self._by_synset: dict[str, list[str]] = defaultdict(list)
        self._read_index_sense(self.directory / "index.sense")
        for senses in self._by_lemma.values():
            senses.sort(key=lambda s: (s.number, s.key))

    # ------------------------------------------------------------------------------------------------ queries

    def candidates(self, lemma: str, pos: str) -> list[str]:
        """Sense keys of `lemma` (case-insensitive, spaces or underscores) in part of speech `pos`, by sense
        number; empty when WordNet has no such lemma."""
        return [s.key for s in self._by_lemma.get((_lemma_form(lemma), wordnet_pos(pos)), ())]

    def first_sense(self, lemma: str, pos: str) -> str | None:
        """The key with the lowest sense number in `index.sense`, or None when the lemma has no senses."""
        senses = self._by_lemma.get((_lemma_form(lemma), wordnet_pos(pos)))
        return senses[0].key if senses else None

    def synset_of(self, key: str) -> Synset:
        return self.synsets[self.senses[key].synset]

    def keys_of(self, synset_id: str) -> list[str]:
        """The sense keys of a synset's lemmas, in `index.sense` order."""
        return self._by_synset.get(synset_id, [])

    def gloss_text(self, key: str) -> str:
        """The text LMMS embeds for a sense: "lemma - lemma1 , lemma2 - definition" (Loureiro & Jorge 2019,
        emb_glosses.py), underscores as spaces."""
        synset = self.synset_of(key)
        lemma = key.split("%", 1)[0].replace("_", " ")
        names = " , ".join(name.replace("_", " ") for name in synset.lemmas)
        return f"{lemma} - {names} - {synset.definition}"

    def __contains__(self, key: object) -> bool:
        return key in self.senses

    # ---------------------------------------------------------------------------------------------- readers

    def _read_lexnames(self) -> dict[int, str]:
        path = self.directory / "lexnames"
        names = {}
        for number, line in _lines(path):
            fields = line.split()
            if len(fields) < 2 or not fields[0].isdigit():
                raise WordNetError(f"{path}, line {number}: expected 'number name pos', got {line!r}")
            names[int(fields[0])] = fields[1]
        return names

    def _read_data(self, letter: str, path: Path) -> None:
        for number, line in _lines(path):
            if line.startswith("  "):  # the licence header
                continue
            try:
                self._parse_data_line(letter, line)
            except (ValueError, IndexError, KeyError) as error:
                raise WordNetError(f"{path}, line {number}: not a WordNet data line ({error}): "
                                   f"{line[:80]!r}") from None

    def _parse_data_line(self, letter: str, line: str) -> None:
        fields, _, gloss = line.partition(" | ")
        parts = fields.split()
        offset, lex_filenum, ss_type = parts[0], int(parts[1]), parts[2]
        if lex_filenum not in self.lexnames:
            raise ValueError(f"lexicographer file {lex_filenum} is not in lexnames")
        word_count = int(parts[3], 16)
        lemmas = tuple(_ADJ_MARKER.sub("", parts[4 + 2 * i]) for i in range(word_count))
        at = 4 + 2 * word_count
        pointer_count = int(parts[at])
        hypernyms, instances = [], []
        for i in range(pointer_count):
            symbol, target, target_pos = parts[at + 1 + 4 * i: at + 4 + 4 * i]
            if symbol in ("@", "@i"):
                (hypernyms if symbol == "@" else instances).append(f"{_POS_ALIASES[target_pos]}:{target}")
        gloss = gloss.strip()
        definition = _QUOTED.sub("", gloss).strip().strip("; ").strip()
        synset_id = f"{letter}:{offset}"
        self.synsets[synset_id] = Synset(synset_id, ss_type, self.lexnames[lex_filenum], lemmas, definition, gloss,
                                         tuple(hypernyms), tuple(instances))

    def _read_index_sense(self, path: Path) -> None:
        for number, line in _lines(path):
            fields = line.split()
            key = fields[0] if fields else ""
            lemma, percent, lex_sense = key.partition("%")
            if len(fields) != 4 or not percent or lex_sense[:1] not in _SS_TYPE_FILE or not fields[2].isdigit():
                raise WordNetError(f"{path}, line {number}: expected 'sense_key synset_offset sense_number "
                                   f"tag_count', got {line!r}")
            synset_id = f"{_SS_TYPE_FILE[lex_sense[0]]}:{fields[1]}"
            if synset_id not in self.synsets:
                raise WordNetError(f"{path}, line {number}: {key} points to synset offset {fields[1]}, which is not "
                                   f"in {_DATA_FILES[synset_id[0]]}")
            sense = Sense(key, synset_id, int(fields[2]), int(fields[3]))
            self.senses[key] = sense
            self._by_lemma[(lemma, synset_id[0])].append(sense)
            self._by_synset[synset_id].append(key)


def _lemma_form(lemma: str) -> str:
    return lemma.strip().lower().replace(" ", "_")


def _lines(path: Path) -> Iterable[tuple[int, str]]:
    if not path.is_file():
        raise WordNetError(f"{path}: missing; a WordNet 3.0 directory holds index.sense, lexnames and "
                           f"data.noun/verb/adj/adv")
    for number, line in text_lines(path, WordNetError):
        if line.strip():
            yield number, line


@functools.lru_cache(maxsize=2)
def _cached(directory: str) -> WordNet:
    return WordNet(directory)


def load_wordnet(directory: str | os.PathLike) -> WordNet:
    """The WordNet in `directory`, read once per process (reading takes a few seconds)."""
    return _cached(str(Path(directory).resolve()))
