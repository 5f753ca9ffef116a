"""A hybrid index: a dense index and a BM25 index of the same passages, their rankings fused.

Each retriever ranks its `Fusion.depth` best passages (at least the k asked for); the union is re-scored by one of:

- ``rrf``, reciprocal rank fusion (Cormack et al. 2009): ``sum_r 1 / (rrf_k + rank_r(p))`` over the two rankings,
  ranks from 1, a passage absent from a ranking adding nothing (`rrf_k` 60, as the paper);
- ``interpolate``: each ranking's scores min-max normalised over its own top `depth` for the query (best 1, the
  last of the list 0; all equal: all 1), a passage absent from a ranking counted 0 there, then
  ``weight * dense + (1 - weight) * bm25`` (`weight` 0.5).

Equal fused scores are ordered by passage row. The directory holds ``index.json`` (``"kind": "hybrid"``, the fusion,
the number of passages) and the two indexes as ``dense/`` and ``bm25/``, each a complete index of its kind.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

import numpy as np

from bertology.config import from_mapping, to_mapping, validate
from bertology.errors import ConfigError, DataError
from bertology.io import atomic_directory
from bertology.retrieval.index import FORMAT, VERSION, EmbeddingOptions, Hit, Index, Structure, check_k, check_output
from bertology.retrieval.kinds import read_meta
from bertology.retrieval.passages import Passage, as_passages
from bertology.retrieval.sparse import BM25Options, SparseIndex

DENSE_DIR = "dense"
BM25_DIR = "bm25"


@dataclass(frozen=True)
class Fusion:
    """How a hybrid index fuses its two rankings (see the module docstring)."""

    method: Literal["rrf", "interpolate"] = "rrf"
    weight: float = 0.5
    rrf_k: int = 60
    depth: int = 100

    def __post_init__(self) -> None:
        validate(self, "fusion")
        if not 0 <= self.weight <= 1:
            raise ConfigError(f"fusion.weight must be between 0 and 1, got {self.weight}")
        if self.rrf_k < 0:
            raise ConfigError(f"fusion.rrf_k must be at least 0, got {self.rrf_k}")
        if self.depth < 1:
            raise ConfigError(f"fusion.depth must be at least 1, got {self.depth}")


def _normalised(scores: np.ndarray) -> np.ndarray:
    low, high = float(scores.min()), float(scores.max())
    if high - low <= 0:
        return np.ones_like(scores, dtype=np.float64)
    return (scores.astype(np.float64) - low) / (high - low)


def fuse(dense: tuple[np.ndarray, np.ndarray], sparse: tuple[np.ndarray, np.ndarray], fusion: Fusion,
         k: int) -> tuple[np.ndarray, np.ndarray]:
    """Fuse two rankings (each scores [Q, d] and rows [Q, d], best first; rows < 0 are ignored) by `fusion`: the
    `k` best fused scores [Q, k'] and rows [Q, k'] (k' = min(k, passages in either ranking))."""
    out_scores, out_rows = [], []
    for (ds, dr), (ss, sr) in zip(zip(*dense), zip(*sparse)):
        fused: dict[int, float] = {}
        for scores, rows, weight in ((ds, dr, fusion.weight), (ss, sr, 1.0 - fusion.weight)):
            keep = rows >= 0
            scores, rows = scores[keep], rows[keep]
            if fusion.method == "rrf":
                values = 1.0 / (fusion.rrf_k + np.arange(1, len(rows) + 1, dtype=np.float64))
            else:
                values = weight * _normalised(scores) if len(rows) else np.zeros(0)
            for row, value in zip(rows.tolist(), values.tolist()):
                fused[row] = fused.get(row, 0.0) + value
        order = sorted(fused.items(), key=lambda item: (-item[1], item[0]))[:k]
        out_rows.append([row for row, _ in order])
        out_scores.append([value for _, value in order])
    width = max((len(r) for r in out_rows), default=0)
    rows = np.full((len(out_rows), width), -1, dtype=np.int64)
    scores = np.full((len(out_rows), width), -np.inf, dtype=np.float64)
    for i, (r, s) in enumerate(zip(out_rows, out_scores)):
        rows[i, :len(r)] = r
        scores[i, :len(s)] = s
    return scores, rows


class HybridIndex:
    """A dense `Index` and a BM25 `SparseIndex` of the same passages, searched together and fused (`Fusion`)."""

    kind = "hybrid"

    def __init__(self, dense: Index, sparse: SparseIndex, fusion: Fusion) -> None:
        if [p.id for p in dense.passages] != [p.id for p in sparse.passages]:
            raise DataError("a hybrid index needs its dense and bm25 indexes over the same passages, in one order")
        self.dense, self.sparse, self.fusion = dense, sparse, fusion
        self.passages: list[Passage] = dense.passages

    def __len__(self) -> int:
        return len(self.passages)

    @property
    def model_path(self) -> str | None:
        return self.dense.model_path

    @property
    def model(self) -> Any:
        return self.dense.model

    def attach(self, model: Any, **options: Any) -> None:
        self.dense.attach(model, **options)

    def encode(self, texts: str | Sequence[str], **options: Any) -> np.ndarray:
        return self.dense.encode(texts, **options)

    # ------------------------------------------------------------------------------------------------- building
    @classmethod
    def build(cls, model: Any, passages: str | os.PathLike | Sequence[Passage | Mapping], *,
              options: EmbeddingOptions | None = None, structure: Structure | None = None,
              bm25: BM25Options | None = None, fusion: Fusion | None = None, **dense_options: Any) -> HybridIndex:
        """Both indexes of `passages`: the dense one as `Index.build(model, passages, options=, structure=,
        **dense_options)` makes it, the BM25 one with `bm25`; searched with `fusion` (RRF by default)."""
        passages = as_passages(passages)
        sparse = SparseIndex.build(passages, options=bm25)
        dense = Index.build(model, passages, options=options, structure=structure, **dense_options)
        return cls(dense, sparse, fusion if fusion is not None else Fusion())

    @property
    def meta(self) -> dict[str, Any]:
        return {"format": FORMAT, "version": VERSION, "kind": self.kind, "fusion": to_mapping(self.fusion),
                "passages": len(self.passages), "dense": DENSE_DIR, "bm25": BM25_DIR}

    def save(self, directory: str | os.PathLike) -> Path:
        """Write the index directory (atomically; an existing hybrid index there is replaced)."""
        directory = check_output(directory, files=(DENSE_DIR, BM25_DIR))
        with atomic_directory(directory) as tmp:
            self.dense.save(tmp / DENSE_DIR)
            self.sparse.save(tmp / BM25_DIR)
            (tmp / "index.json").write_text(json.dumps(self.meta, indent=2) + "\n", encoding="utf-8")
        return directory

    @classmethod
    def load(cls, directory: str | os.PathLike, model: Any = None, **options: Any) -> HybridIndex:
        """Read a hybrid index directory; `model` and `options` (``device``, ``dtype``) as `Index.load` takes them."""
        directory = Path(directory)
        meta = read_meta(directory, cls.kind)
        meta_file = directory / "index.json"
        if "fusion" not in meta:
            raise DataError(f"{meta_file}: missing key 'fusion'")
        try:
            fusion = from_mapping(Fusion, meta["fusion"], "fusion")
        except ConfigError as error:
            raise DataError(f"{meta_file}: {error}") from None
        dense = Index.load(directory / DENSE_DIR, model=model, **options)
        sparse = SparseIndex.load(directory / BM25_DIR)
        if [p.id for p in dense.passages] != [p.id for p in sparse.passages] or meta.get("passages") != len(dense):
            raise DataError(f"{directory}: {DENSE_DIR}/ and {BM25_DIR}/ hold other passages ({len(dense)} and "
                            f"{len(sparse)}; {meta_file.name} says {meta.get('passages')!r})")
        return cls(dense, sparse, fusion)

    # --------------------------------------------------------------------------------------------------- search
    def rank(self, queries: str | Sequence[str], depth: int, *, fusion: Fusion | None = None, batch_size: int = 32,
             show_progress: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """The `depth` best passages of each query by the fused score (`fusion`: another fusion for this call)."""
        fusion = fusion if fusion is not None else self.fusion
        queries = [queries] if isinstance(queries, str) else list(queries)
        candidates = max(depth, fusion.depth)
        dense = self.dense.rank(queries, candidates, batch_size=batch_size, show_progress=show_progress)
        sparse = self.sparse.rank(queries, candidates)
        return fuse(dense, sparse, fusion, min(depth, len(self)))

    def rankings(self, queries: Sequence[str], depth: int, fusions: Sequence[Fusion], *,
                 batch_size: int = 32, show_progress: bool = False) -> list[tuple[np.ndarray, np.ndarray]]:
        """`rank` under several fusions, each retriever run once (for comparing fusions)."""
        candidates = max([depth, *(f.depth for f in fusions)])
        dense = self.dense.rank(queries, candidates, batch_size=batch_size, show_progress=show_progress)
        sparse = self.sparse.rank(queries, candidates)
        result = []
        for fusion in fusions:
            cut = lambda pair, d=max(depth, fusion.depth): (pair[0][:, :d], pair[1][:, :d])  # noqa: E731
            result.append(fuse(cut(dense), cut(sparse), fusion, min(depth, len(self))))
        return result

    def search(self, queries: str | Sequence[str], k: int = 10, *, fusion: Fusion | None = None,
               batch_size: int = 32, **_: Any) -> list[list[Hit]]:
        """The `k` best passages for each query by the fused score (`Hit.score` is the fused score)."""
        check_k(k)
        queries = [queries] if isinstance(queries, str) else list(queries)
        scores, rows = self.rank(queries, k, fusion=fusion, batch_size=batch_size)
        return [[Hit(self.passages[r].id, float(s), self.passages[r].text, int(r))
                 for s, r in zip(srow, rrow) if r >= 0] for srow, rrow in zip(scores, rows)]

    def with_fusion(self, **changes: Any) -> HybridIndex:
        """The same indexes under another fusion (``method=``, ``weight=``, ``rrf_k=``, ``depth=``)."""
        return HybridIndex(self.dense, self.sparse, replace(self.fusion, **changes))


