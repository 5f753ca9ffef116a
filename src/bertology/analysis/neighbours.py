"""Contextual nearest neighbours: which occurrences in a corpus are closest to a word in a sentence.

The corpus's word vectors (one hidden state, or a combination of them) are normalised and put in an exact
inner-product index (faiss `IndexFlatIP`, so scores are cosines); a query word in its sentence is embedded the
same way and its nearest occurrences come back with their sentences. Beside them, the static view: each word
type's vector is the mean of its occurrences' vectors (type-averaged, lower-cased types), and the query type's
nearest types are listed, so the two can be compared (a sense-specific neighbourhood against a blend of senses).
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bertology.analysis.base import Section, shell_command, write_numbers
from bertology.analysis.geometry import layer_vectors
from bertology.device import place
from bertology.embeddings.result import normalize
from bertology.errors import BertologyError, ConfigError


class NeighboursError(BertologyError):
    """A query word is not in its sentence, a corpus is empty, or faiss is missing."""


def _faiss() -> Any:
    try:
        import faiss
    except ImportError:
        raise NeighboursError("contextual neighbours need faiss: pip install 'bertology[analysis]' "
                              "(or faiss-cpu)") from None
    return faiss


@dataclass
class NeighbourIndex:
    """Normalised occurrence vectors of a corpus in an exact inner-product index, and type-averaged vectors."""

    texts: list[str]
    strings: list[str]
    text_index: np.ndarray
    index: Any  # faiss.IndexFlatIP over the occurrences
    types: list[str]
    type_counts: np.ndarray
    type_vectors: np.ndarray  # [T, D] normalised means of each type's (raw) occurrence vectors
    layer: int
    pretrained: Any
    dtype: str = "float32"  # how queries run the model (`bertology.device`)

    @classmethod
    def build(cls, pretrained: Any, texts: Sequence[str], layer: int = -1, batch_size: int = 32,
              show_progress: bool = False, *, device: Any = None, dtype: str = "float32") -> NeighbourIndex:
        """Embed `texts` at hidden state `layer` (default the last) and index their words. `device` (None: where
        the model is) and `dtype` say where and how the model runs, for the queries too (`bertology.device`)."""
        faiss = _faiss()
        where = place(pretrained, device, dtype)
        data = layer_vectors(pretrained, texts, layers=[layer], batch_size=batch_size, show_progress=show_progress,
                             description="indexing", dtype=where.dtype)
        if not len(data.strings):
            raise NeighboursError("the corpus has no words to index")
        vectors = data.vectors[0]
        index = faiss.IndexFlatIP(vectors.shape[1])
        index.add(normalize(vectors))
        lowered = np.array([s.lower() for s in data.strings], dtype=object)
        types, inverse, counts = np.unique(lowered, return_inverse=True, return_counts=True)
        sums = np.zeros((len(types), vectors.shape[1]), dtype=np.float64)
        np.add.at(sums, inverse, vectors)
        return cls(list(data.texts), list(data.strings), data.text_index, index, [str(t) for t in types], counts,
                   normalize(sums / counts[:, None]), data.layers[0], pretrained, where.dtype)

    def __len__(self) -> int:
        return len(self.strings)

    def query(self, sentence: str, word: str, occurrence: int = 0, k: int = 10,
              exclude_same_sentence: bool = True) -> dict[str, Any]:
        """The `k` occurrences nearest to `word` (its `occurrence`-th whole-word match) in `sentence`, and the
        `k` types nearest to the word's static (type-averaged) vector."""
        if k < 1:
            raise ConfigError(f"k must be positive, got {k}")
        matches = [m.span() for m in re.finditer(rf"(?<!\w){re.escape(word)}(?!\w)", sentence)] if word.strip() \
            else []
        if occurrence < 0 or occurrence >= len(matches):
            raise NeighboursError(f"{word!r} occurs {len(matches)} time(s) as a whole word in the sentence "
                                  f"{sentence[:80]!r}; occurrence {occurrence} asked for")
        data = layer_vectors(self.pretrained, [sentence], spans=[[matches[occurrence]]], layers=[self.layer],
                             dtype=self.dtype)
        if not len(data.strings):
            raise NeighboursError(f"{word!r}: the tokenizer gives it no tokens")
        query = normalize(data.vectors[0])
        # more than k: occurrences from the query's own sentence (when it is in the corpus) are dropped
        scores, rows = self.index.search(query, min(len(self), k + 50))
        contextual = []
        for score, row in zip(scores[0].tolist(), rows[0].tolist()):
            if row < 0:
                continue
            text = self.texts[int(self.text_index[row])]
            if exclude_same_sentence and text == sentence:
                continue
            contextual.append({"word": self.strings[row], "cosine": round(score, 6), "sentence": text})
            if len(contextual) == k:
                break
        lowered = word.lower()
        known = lowered in self.types
        static_query = self.type_vectors[self.types.index(lowered)][None] if known else query
        similarity = (self.type_vectors @ static_query[0]).astype(np.float64)
        static = []
        for row in np.argsort(-similarity):
            if self.types[row] == lowered:
                continue
            static.append({"type": self.types[row], "cosine": round(float(similarity[row]), 6),
                           "occurrences": int(self.type_counts[row])})
            if len(static) == k:
                break
        return {
            "sentence": sentence,
            "word": word,
            "occurrence": occurrence,
            "layer": self.layer,
            "contextual": contextual,
            "static": static,
            "static_vector": "type average over the corpus" if known else
            "the query occurrence (the type is not in the corpus)",
            "type_occurrences": int(self.type_counts[self.types.index(lowered)]) if known else 0,
        }


def neighbours(pretrained: Any, corpus: Sequence[str], queries: Sequence[tuple[str, str]], out_dir: str | os.PathLike,
               *, layer: int = -1, k: int = 10, batch_size: int = 32,
               show_progress: bool = False, device: Any = None,
               dtype: str = "float32") -> tuple[dict[str, Any], list[Path]]:
    """Index `corpus` and answer every (sentence, word) query; writes `neighbours.json` into `out_dir`.
    `device` (None: where the model is) and `dtype` say where and how the model runs (`bertology.device`)."""
    index = NeighbourIndex.build(pretrained, corpus, layer, batch_size, show_progress, device=device, dtype=dtype)
    numbers = {
        "corpus_sentences": len(corpus),
        "indexed_occurrences": len(index),
        "types": len(index.types),
        "layer": index.layer,
        "index": "faiss IndexFlatIP on unit vectors (exact cosine)",
        "queries": [index.query(sentence, word, k=k) for sentence, word in queries],
    }
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    write_numbers(out_dir / "neighbours.json", numbers)
    return numbers, []


# Queries of the report: one ambiguous word in two senses, each sentence not in the indexed corpus.
REPORT_QUERIES: tuple[tuple[str, str], ...] = (
    ("She deposited the cheque at the bank on Monday.", "bank"),
    ("They had a picnic on the bank of the river.", "bank"),
    ("The plant was closed and the workers lost their jobs.", "plant"),
    ("Water the plant once a week.", "plant"),
)


def report_section(pretrained: Any, out_dir: str | os.PathLike, data_dir: str | os.PathLike,
                   model_dir: str = "MODEL", limit: int = 4000, quick: bool = False) -> Section:
    """Neighbours of the report's queries among the first `limit` sentences of UD English-EWT train (a quarter of
    them with `quick`)."""
    from bertology.analysis.ud import read_split

    limit = limit // 4 if quick else limit
    ud = Path(data_dir) / "ud-english-ewt"
    corpus = [s.text for s in read_split(ud, "train", limit)]
    numbers, figures = neighbours(pretrained, corpus, REPORT_QUERIES, out_dir)
    notes = []
    headline = {}
    for query in numbers["queries"]:
        near = ", ".join(n["word"] for n in query["contextual"][:5])
        headline[f"nearest to {query['word']!r} in \u201c{query['sentence']}\u201d"] = near
        static = ", ".join(n["type"] for n in query["static"][:5])
        notes.append(f"{query['word']!r} in {query['sentence']!r}: nearest occurrences {near}; static type "
                     f"neighbours {static}")
    queries = [part for sentence, word in REPORT_QUERIES for part in ("--query", word, sentence)]
    command = shell_command("bertology", "neighbours", "--model", model_dir, "--ud", ud, "--limit", limit, *queries,
                            "--out", out_dir)
    return Section("neighbours", "Contextual nearest neighbours", numbers, figures, command, notes, headline)
