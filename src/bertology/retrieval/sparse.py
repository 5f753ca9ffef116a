"""A sparse passage index: BM25 through the bm25s library, as an index kind beside the dense ones.

bm25s tokenises (lower-cased words of two or more word characters, its English stop words removed) and precomputes
every (term, passage) BM25 score into a sparse matrix when indexing; a query's scores are the sum of its terms'
columns. The index directory holds:

- ``index.json``: the format, ``"kind": "bm25"``, the BM25 options (`BM25Options`), the number of passages and of
  terms, bm25s's version;
- ``bm25.npz``: the score matrix in compressed sparse columns (``data``, ``indices``, ``indptr``; one column a term);
- ``vocabulary.json``: the terms, term i at position i;
- ``passages.jsonl``: the passages' ids and texts, row i on line i + 1.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Union

import numpy as np

from bertology.config import from_mapping, to_mapping, validate
from bertology.errors import ConfigError, DataError
from bertology.inputs import json_value, read_npz
from bertology.io import atomic_directory, atomic_write
from bertology.retrieval.index import FORMAT, VERSION, Hit, check_k, check_output
from bertology.retrieval.kinds import read_meta
from bertology.retrieval.passages import Passage, as_passages, read_passages, write_passages

BM25_FILE = "bm25.npz"
VOCABULARY_FILE = "vocabulary.json"


def bm25s_module() -> Any:
    try:
        import bm25s
    except ImportError:
        raise ConfigError("BM25 retrieval needs bm25s: pip install 'bertology[index]' (bm25s)") from None
    return bm25s


@dataclass(frozen=True)
class BM25Options:
    """BM25's parameters and tokenisation (recorded in the index, applied to queries too): `k1` (term-frequency
    saturation), `b` (length normalisation), `method` (bm25s's variant: ``lucene``, Elasticsearch's and Pyserini's
    scoring, or ``robertson``, ``atire``), `stopwords` (``"en"``: bm25s's English list, or
    None), `lower` (lower-case before tokenising)."""

    k1: float = 1.5
    b: float = 0.75
    method: Literal["lucene", "robertson", "atire"] = "lucene"
    stopwords: Union[Literal["en"], None] = "en"
    lower: bool = True

    def __post_init__(self) -> None:
        validate(self, "bm25")
        if not self.k1 >= 0:
            raise ConfigError(f"bm25.k1 must be at least 0, got {self.k1}")
        if not 0 <= self.b <= 1:
            raise ConfigError(f"bm25.b must be between 0 and 1, got {self.b}")


class SparseIndex:
    """Passages and their BM25 score matrix (bm25s). `search` takes query texts; no model is involved."""

    kind = "bm25"

    def __init__(self, retriever: Any, passages: list[Passage], meta: dict[str, Any]) -> None:
        self.retriever = retriever
        self.passages = passages
        self.meta = meta
        self.options: BM25Options = from_mapping(BM25Options, meta["bm25"], "bm25")

    def __len__(self) -> int:
        return len(self.passages)

    # ------------------------------------------------------------------------------------------------- building
    @classmethod
    def build(cls, passages: str | os.PathLike | Sequence[Passage | Mapping], *,
              options: BM25Options | None = None) -> SparseIndex:
        """Tokenise and index `passages` (a JSON-lines file, or Passage objects / ``{"id", "text"}`` mappings)."""
        bm25s = bm25s_module()
        passages = as_passages(passages)
        options = options if options is not None else BM25Options()
        retriever = bm25s.BM25(k1=options.k1, b=options.b, method=options.method)
        tokens = bm25s.tokenize([p.text for p in passages], lower=options.lower, stopwords=options.stopwords,
                                show_progress=False)
        retriever.index(tokens, show_progress=False)
        meta = {"format": FORMAT, "version": VERSION, "kind": cls.kind, "bm25": to_mapping(options),
                "passages": len(passages), "terms": len(retriever.scores["indptr"]) - 1, "bm25s": bm25s.__version__}
        return cls(retriever, passages, meta)

    def save(self, directory: str | os.PathLike) -> Path:
        """Write the index directory (atomically; an existing index of this kind there is replaced)."""
        directory = check_output(directory, files=(BM25_FILE, VOCABULARY_FILE))
        scores = self.retriever.scores
        columns = len(scores["indptr"]) - 1
        # bm25s numbers the terms 0..V-1 and may add an empty token past the last column (it scores nothing)
        terms = sorted(((t, i) for t, i in self.retriever.vocab_dict.items() if i < columns), key=lambda x: x[1])
        if [i for _, i in terms] != list(range(columns)):
            raise ConfigError("bm25s's vocabulary is not numbered 0..V-1; this bm25s version is not supported")
        with atomic_directory(directory) as tmp:
            (tmp / "index.json").write_text(json.dumps(self.meta, indent=2) + "\n", encoding="utf-8")
            with atomic_write(tmp / BM25_FILE) as handle:
                np.savez(handle, data=np.asarray(scores["data"]), indices=np.asarray(scores["indices"]),
                         indptr=np.asarray(scores["indptr"]))
            (tmp / VOCABULARY_FILE).write_text(json.dumps([t for t, _ in terms], ensure_ascii=False) + "\n",
                                               encoding="utf-8")
            write_passages(self.passages, tmp / "passages.jsonl")
        return directory

    @classmethod
    def load(cls, directory: str | os.PathLike, model: Any = None, **_: Any) -> SparseIndex:
        """Read a BM25 index directory (`model` is refused: BM25 needs none)."""
        directory = Path(directory)
        if model is not None:
            raise ConfigError(f"{directory}: a bm25 index takes no model")
        meta = read_meta(directory, cls.kind)
        meta_file = directory / "index.json"
        for key in ("bm25", "passages", "terms"):
            if key not in meta:
                raise DataError(f"{meta_file}: missing key {key!r}")
        try:
            options = from_mapping(BM25Options, meta["bm25"], "bm25")
        except ConfigError as error:
            raise DataError(f"{meta_file}: {error}") from None
        arrays = read_npz(directory / BM25_FILE, ("data", "indices", "indptr"))
        if not (directory / VOCABULARY_FILE).is_file():
            raise DataError(f"{directory}: {VOCABULARY_FILE} is missing")
        terms = json_value(directory / VOCABULARY_FILE)
        if not isinstance(terms, list) or not all(isinstance(t, str) for t in terms):
            raise DataError(f"{directory / VOCABULARY_FILE}: expected a list of strings (the terms)")
        passages = read_passages(directory / "passages.jsonl")
        data, indices, indptr = arrays["data"], arrays["indices"], arrays["indptr"]
        n = len(passages)
        if (meta["passages"] != n or meta["terms"] != len(terms) or indptr.ndim != 1 or len(indptr) != len(terms) + 1
                or len(data) != len(indices) or (len(indptr) and (indptr[0] != 0 or indptr[-1] != len(data)
                                                                  or np.any(np.diff(indptr) < 0)))
                or (len(indices) and (indices.min() < 0 or indices.max() >= n))):
            raise DataError(f"{directory}: the files disagree: {n} passages, {len(terms)} terms, a score matrix "
                            f"of {len(indptr) - 1} columns and {len(data)} entries; {meta_file.name} says "
                            f"{meta['passages']} passages and {meta['terms']} terms")
        bm25s = bm25s_module()
        retriever = bm25s.BM25(k1=options.k1, b=options.b, method=options.method)
        retriever.scores = {"data": data, "indices": indices, "indptr": indptr, "num_docs": n}
        retriever.vocab_dict = {term: i for i, term in enumerate(terms)}
        retriever.unique_token_ids_set = set(retriever.vocab_dict.values())
        retriever.nonoccurrence_array = None  # what bm25s's own load sets for these methods
        return cls(retriever, passages, meta)

    # --------------------------------------------------------------------------------------------------- search
    def tokens(self, queries: Sequence[str]) -> list[list[str]]:
        """Each query's terms, tokenised as the passages were."""
        bm25s = bm25s_module()
        return bm25s.tokenize(list(queries), lower=self.options.lower, stopwords=self.options.stopwords,
                              return_ids=False, show_progress=False)

    def scores(self, queries: str | Sequence[str]) -> np.ndarray:
        """BM25 scores [Q, N] of every passage for each query (0 for a query with no indexed term)."""
        queries = [queries] if isinstance(queries, str) else list(queries)
        result = np.zeros((len(queries), len(self.passages)), dtype=np.float32)
        vocabulary = self.retriever.vocab_dict
        for i, terms in enumerate(self.tokens(queries)):
            known = [t for t in terms if t and t in vocabulary]
            if known:
                result[i] = self.retriever.get_scores(known)
        return result

    def rank(self, queries: str | Sequence[str], depth: int, **_: Any) -> tuple[np.ndarray, np.ndarray]:
        """The `depth` best passages of each query: scores [Q, depth] and rows [Q, depth], best first (equal scores
        in row order); `depth` is capped at the number of passages."""
        scores = self.scores(queries)
        depth = min(depth, len(self.passages))
        rows = np.argsort(-scores, axis=1, kind="stable")[:, :depth]
        return np.take_along_axis(scores, rows, axis=1), rows

    def search(self, queries: str | Sequence[str], k: int = 10, **_: Any) -> list[list[Any]]:
        """The `k` best passages for each query (`Hit`s, best first; fewer when the index holds fewer)."""
        check_k(k)
        queries = [queries] if isinstance(queries, str) else list(queries)
        scores, rows = self.rank(queries, k)
        return [[Hit(self.passages[r].id, float(s), self.passages[r].text, int(r)) for s, r in zip(srow, rrow)]
                for srow, rrow in zip(scores, rows)]



