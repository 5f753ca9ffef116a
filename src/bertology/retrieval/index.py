"""A dense passage index: normalised sentence vectors of one model in a faiss index, searched by inner product.

An index directory holds (written atomically: a temporary directory renamed into place):

- ``index.json``: the format, the model's fingerprint and directory, the embedding options, the faiss structure and
  its parameters, the number of passages and the vector width;
- ``vectors.faiss``: the faiss index (faiss's own binary format, not a pickle); row i is passage i;
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
import torch

from bertology.config import from_mapping, to_mapping, validate
from bertology.embeddings.result import normalize
from bertology.embeddings.sentence_config import read_sentence_config
from bertology.errors import BertologyError, ConfigError, DataError
from bertology.inputs import check_faiss
from bertology.io import atomic_directory, file_in_the_way
from bertology.model import Pretrained
from bertology.model import fingerprint as model_fingerprint
from bertology.retrieval.kinds import FORMAT, VERSION, read_meta
from bertology.retrieval.passages import Passage, as_passages, read_passages, write_passages

META_FILE = "index.json"
FAISS_FILE = "vectors.faiss"
PASSAGES_FILE = "passages.jsonl"
SENTENCE_TRANSFORMERS = "sentence-transformers config"  # EmbeddingOptions.source of a directory's own settings


class IndexMismatchError(BertologyError):
    """An index is searched with a model other than the one that built it (their fingerprints differ)."""


# ------------------------------------------------------------------------------------------------------ options
@dataclass(frozen=True)
class EmbeddingOptions:
    """How passages and queries become vectors (the same for both, recorded in the index).

    `layers`, `combine`, `sentence`, `max_length`, `stride` are `bertology.embed`'s options. `long_texts`: what
    happens to a text longer than `max_length` tokens (specials included): ``"windows"`` embeds all of it in
    overlapping windows (embed's behaviour), ``"truncate"`` keeps its first tokens, as sentence-transformers does.
    Vectors are always L2-normalised, so inner product is cosine similarity. `source` says where the options came
    from (``"sentence-transformers config"`` or ``"bertology defaults"`` or ``"given"``)."""

    layers: Union[str, int, list[int]] = "last"
    combine: Union[Literal["sum", "mean", "concat"], None] = None
    sentence: Literal["mean", "cls", "max"] = "mean"
    max_length: Union[int, None] = None
    stride: Union[int, None] = None
    long_texts: Literal["windows", "truncate"] = "windows"
    source: str = "given"

    def __post_init__(self) -> None:
        validate(self, "embedding")
        if self.long_texts == "truncate" and self.max_length is None:
            raise ConfigError('embedding.long_texts: "truncate" needs embedding.max_length')


def model_options(model_dir: str | os.PathLike | None) -> EmbeddingOptions:
    """The sentence-embedding options a model was trained with: from a sentence-transformers directory (its
    pooling mode of the last layer, and ``max_seq_length`` with truncation, as sentence-transformers encodes; read
    by `bertology.embeddings.read_sentence_config`, which `embed` also follows, prompts and lower-casing included);
    otherwise bertology's defaults (mean of the last layer, long texts in windows)."""
    settings = read_sentence_config(model_dir)
    if settings is None:
        return EmbeddingOptions(source="bertology defaults")
    return EmbeddingOptions(sentence=settings.sentence, max_length=settings.max_length,  # type: ignore[arg-type]
                            long_texts="truncate" if settings.max_length is not None else "windows",
                            source=SENTENCE_TRANSFORMERS)


@dataclass(frozen=True)
class Structure:
    """The faiss structure: ``"flat"`` (exact inner product, IndexFlatIP), ``"hnsw"`` (IndexHNSWFlat: `hnsw_m`
    neighbours per node, `ef_construction` when building, `ef_search` when searching) or ``"ivf"`` (IndexIVFFlat
    over a flat inner-product quantizer: `nlist` k-means cells, default 4 sqrt(N) but at most N / 39, and `nprobe` cells
    visited per query). All use the inner-product metric."""

    kind: Literal["flat", "hnsw", "ivf"] = "flat"
    hnsw_m: int = 32
    ef_construction: int = 200
    ef_search: int = 128
    nlist: Union[int, None] = None
    nprobe: int = 16

    def __post_init__(self) -> None:
        validate(self, "structure")
        for name in ("hnsw_m", "ef_construction", "ef_search", "nprobe"):
            if getattr(self, name) < 1:
                raise ConfigError(f"structure.{name} must be at least 1, got {getattr(self, name)}")
        if self.nlist is not None and self.nlist < 1:
            raise ConfigError(f"structure.nlist must be at least 1, got {self.nlist}")

    def parameters(self) -> dict[str, Any]:
        """The parameters that apply to this kind (what the index records)."""
        if self.kind == "hnsw":
            return {"kind": "hnsw", "hnsw_m": self.hnsw_m, "ef_construction": self.ef_construction,
                    "ef_search": self.ef_search}
        if self.kind == "ivf":
            return {"kind": "ivf", "nlist": self.nlist, "nprobe": self.nprobe}
        return {"kind": "flat"}


# ----------------------------------------------------------------------------------------------------- the index
@dataclass(frozen=True)
class Hit:
    """One search result: the passage's id and text, its inner product with the query (cosine: both are
    normalised), and its row in the index."""

    id: str
    score: float
    text: str
    row: int


def _faiss() -> Any:
    try:
        import faiss
    except ImportError:
        raise ConfigError("dense retrieval needs faiss: pip install 'bertology[index]' (faiss-cpu)") from None
    return faiss


def set_threads(threads: int | None) -> None:
    """Use `threads` torch threads (None: leave torch's setting); faiss's own are left alone."""
    if threads is None:
        return
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ConfigError(f"threads must be a positive integer, got {threads!r}")
    import torch

    torch.set_num_threads(threads)


def _load_model(model: Pretrained | str | os.PathLike) -> tuple[Pretrained, str | None]:
    if isinstance(model, Pretrained):
        return model, None
    from bertology.model import load

    return load(model), str(Path(model).resolve())


class Index:
    """Passages, their normalised sentence vectors in a faiss index, and the model and options that made them.

    Make one with `Index.build`, write it with `save`, read it with `Index.load`; `search` takes query texts
    (embedded with the recorded options by the index's model) or query vectors."""

    kind = "dense"

    def __init__(self, faiss_index: Any, passages: list[Passage], meta: dict[str, Any],
                 model: Pretrained | None = None) -> None:
        self.faiss_index = faiss_index
        self.passages = passages
        self.meta = meta
        self.options: EmbeddingOptions = from_mapping(EmbeddingOptions, meta["embedding"], "embedding")
        self.structure: Structure = from_mapping(Structure, meta["structure"], "structure")
        self.model: Pretrained | None = None
        self.dtype = "float32"  # how `encode` runs the attached model (`attach`)
        if model is not None:
            self.attach(model)

    # ----------------------------------------------------------------------------------------------- properties
    @property
    def fingerprint(self) -> str:
        return self.meta["model"]["fingerprint"]

    @property
    def model_path(self) -> str | None:
        """The model directory the index was built from, as recorded (None if it was built from a loaded model)."""
        return self.meta["model"].get("path")

    @property
    def dim(self) -> int:
        return int(self.meta["dim"])

    def __len__(self) -> int:
        return len(self.passages)

    # ------------------------------------------------------------------------------------------------- building
    @classmethod
    def build(cls, model: Pretrained | str | os.PathLike, passages: str | os.PathLike | Sequence[Passage | Mapping],
              *, options: EmbeddingOptions | None = None, structure: Structure | None = None, batch_size: int = 32,
              show_progress: bool = False, model_dir: str | os.PathLike | None = None,
              device: str | torch.device | None = None, dtype: str = "float32") -> Index:
        """Embed `passages` (a JSON-lines file, or Passage objects / ``{"id", "text"}`` mappings) with `model` (a
        model directory or a loaded `Pretrained`) and index the normalised vectors. `options` default to what the
        model was trained for (`model_options` of its directory; for a loaded model, of `model_dir` if given, else
        bertology's defaults); `structure` to exact search (``Structure("flat")``). `model_dir`: where a loaded
        model came from, recorded so that `bertology search` can load it. `device` (None: where the model is) and
        `dtype` say where and how the passages are embedded (`bertology.device`)."""
        passages = as_passages(passages)
        pretrained, path = _load_model(model)
        if path is None and model_dir is not None:
            path = str(Path(model_dir).resolve())
        options = options if options is not None else model_options(path)
        vectors = encode(pretrained, [p.text for p in passages], options, batch_size=batch_size,
                         show_progress=show_progress, device=device, dtype=dtype)
        return cls.from_vectors(pretrained, passages, vectors, options=options, structure=structure, model_dir=path,
                                check=0)

    @classmethod
    def from_vectors(cls, model: Pretrained | str | os.PathLike,
                     passages: str | os.PathLike | Sequence[Passage | Mapping], vectors: np.ndarray, *,
                     options: EmbeddingOptions | None = None, structure: Structure | None = None,
                     model_dir: str | os.PathLike | None = None, check: int = 16) -> Index:
        """An index of sentence vectors computed elsewhere (a corpus run of `bertology embed`, on Ray, say): row i
        of `vectors` [N, D] belongs to passage i; they are normalised here. They must be what `model` gives with
        `options` (defaults as in `build`); `check` passages, spread over the corpus, are embedded again and any
        difference over 1e-4 is an error (0 skips the check)."""
        passages = as_passages(passages)
        pretrained, path = _load_model(model)
        if path is None and model_dir is not None:
            path = str(Path(model_dir).resolve())
        options = options if options is not None else model_options(path)
        structure = structure if structure is not None else Structure()
        vectors = np.asarray(vectors)
        if vectors.ndim != 2 or len(vectors) != len(passages):
            raise ConfigError(f"vectors must have shape [{len(passages)}, D] (one row per passage), got "
                              f"{list(vectors.shape)}")
        if not np.isfinite(vectors).all():
            bad = int(np.flatnonzero(~np.isfinite(vectors).all(axis=1))[0])
            raise DataError(f"vectors[{bad}] (passage {passages[bad].id!r}) holds NaN or infinite values")
        vectors = normalize(vectors)
        if isinstance(check, bool) or not isinstance(check, int) or check < 0:
            raise ConfigError(f"check must be a non-negative integer, got {check!r}")
        if check:
            rows = np.unique(np.linspace(0, len(passages) - 1, num=min(check, len(passages))).round().astype(int))
            fresh = encode(pretrained, [passages[r].text for r in rows], options)
            if fresh.shape[1] != vectors.shape[1]:
                raise DataError(f"vectors have {vectors.shape[1]} dimensions; this model with these options gives "
                                f"{fresh.shape[1]}")
            difference = np.abs(fresh - vectors[rows]).max(axis=1)
            worst = int(np.argmax(difference))
            if difference[worst] > 1e-4:
                raise DataError(f"vectors[{rows[worst]}] (passage {passages[rows[worst]].id!r}) differs from this "
                                f"model's embedding of its text by up to {difference[worst]:.3g}: the vectors were "
                                f"made by another model, with other options, or for other texts")
        faiss_index, parameters = _build_faiss(vectors, structure)
        meta = {
            "format": FORMAT,
            "version": VERSION,
            "kind": "dense",
            "model": {"fingerprint": model_fingerprint(pretrained), "path": path,
                      "family": pretrained.config.family, "hidden_size": pretrained.config.hidden_size},
            "embedding": to_mapping(options),
            "structure": to_mapping(Structure(**parameters)),
            "structure_parameters": parameters,
            "passages": len(passages),
            "dim": int(vectors.shape[1]),
            "faiss_version": _faiss().__version__,
        }
        return cls(faiss_index, passages, meta, pretrained)

    def vectors(self) -> np.ndarray:
        """The passages' normalised vectors [N, D], read back from the faiss index (row i is passage i)."""
        faiss = _faiss()
        if self.structure.kind == "ivf":
            faiss.extract_index_ivf(self.faiss_index).make_direct_map()  # IVF lists keep no row -> vector map
        return self.faiss_index.reconstruct_n(0, self.faiss_index.ntotal)

    def restructured(self, structure: Structure) -> Index:
        """The same passages and vectors in another faiss structure (e.g. exact -> HNSW), without embedding again."""
        faiss_index, parameters = _build_faiss(self.vectors(), structure)
        meta = {**self.meta, "structure": to_mapping(Structure(**parameters)), "structure_parameters": parameters}
        index = Index(faiss_index, self.passages, meta, self.model)
        index.dtype = self.dtype
        return index

    # ---------------------------------------------------------------------------------------------------- files
    def save(self, directory: str | os.PathLike) -> Path:
        """Write the index directory atomically (a temporary directory renamed into place; an existing index
        there is replaced). Returns its path."""
        directory = check_output(directory)
        faiss = _faiss()
        with atomic_directory(directory) as tmp:
            (tmp / META_FILE).write_text(json.dumps(self.meta, indent=2) + "\n", encoding="utf-8")
            faiss.write_index(self.faiss_index, str(tmp / FAISS_FILE))
            write_passages(self.passages, tmp / PASSAGES_FILE)
        return directory

    @classmethod
    def load(cls, directory: str | os.PathLike, model: Pretrained | str | os.PathLike | None = None, *,
             device: str | torch.device | None = None, dtype: str = "float32") -> Index:
        """Read an index directory. With `model` (a loaded model or a model directory), it is checked against the
        recorded fingerprint (an `IndexMismatchError` if it differs) and used to embed text queries (on `device`
        in `dtype`, as `attach` says); without one, only vector queries work until `attach` is called (the
        recorded directory is `model_path`)."""
        directory = Path(directory)
        meta = read_meta(directory, "dense")  # format, version, and an index of another kind refused
        meta_file = directory / META_FILE
        for key in ("model", "embedding", "structure", "passages", "dim"):
            if key not in meta:
                raise DataError(f"{meta_file}: missing key {key!r}")
        faiss_file = directory / FAISS_FILE
        if not faiss_file.is_file():
            raise DataError(f"{directory}: {FAISS_FILE} is missing")
        for key in ("passages", "dim"):
            if isinstance(meta[key], bool) or not isinstance(meta[key], int) or meta[key] < (key == "dim"):
                raise DataError(f"{meta_file}: {key} must be a {'positive' if key == 'dim' else 'non-negative'} "
                                f"integer, got {meta[key]!r}")
        try:
            kind = from_mapping(Structure, meta["structure"], "structure").kind
        except ConfigError as error:
            raise DataError(f"{meta_file}: {error}") from None
        # The headers and every length field against the file's size, before faiss allocates what they claim.
        check_faiss(faiss_file, kind, meta["dim"], meta["passages"])
        try:
            faiss_index = _faiss().read_index(str(faiss_file))
        except (RuntimeError, MemoryError) as error:
            raise DataError(f"{faiss_file}: faiss cannot read it: {str(error).strip().splitlines()[-1]}") from None
        passages = read_passages(directory / PASSAGES_FILE)
        if not (len(passages) == faiss_index.ntotal == meta["passages"]) or faiss_index.d != meta["dim"]:
            raise DataError(f"{directory}: the files disagree: {len(passages)} passages, {faiss_index.ntotal} "
                            f"vectors of width {faiss_index.d}, {META_FILE} says {meta['passages']} of width "
                            f"{meta['dim']}")
        try:
            index = cls(faiss_index, passages, meta)
        except ConfigError as error:  # a recorded option or structure that is not valid
            raise DataError(f"{meta_file}: {error}") from None
        if model is not None:
            index.attach(model, device=device, dtype=dtype)
        return index

    def attach(self, model: Pretrained | str | os.PathLike, *, device: str | torch.device | None = None,
               dtype: str = "float32") -> None:
        """Use `model` to embed text queries, after checking that it is the model that built the index; the model
        is moved to `device` (None: it stays where it is) and run in `dtype` there (`bertology.device`)."""
        from bertology.device import place

        pretrained, path = _load_model(model)
        found = model_fingerprint(pretrained)
        if found != self.fingerprint:
            where = f" ({path})" if path else ""
            raise IndexMismatchError(
                f"the index was built with another model: its fingerprint is {self.fingerprint[:16]}... (model "
                f"{self.model_path or 'given as a loaded object'}), this model's{where} is {found[:16]}...; search "
                f"with the model that built the index, or build a new index with this one")
        self.dtype = place(pretrained, device, dtype).dtype
        self.model = pretrained

    # --------------------------------------------------------------------------------------------------- search
    def encode(self, texts: str | Sequence[str], *, batch_size: int = 32, show_progress: bool = False) -> np.ndarray:
        """Normalised sentence vectors [N, D] of `texts`, made as the passages' were (needs the model)."""
        if self.model is None:
            raise ConfigError("this index has no model attached: load it with Index.load(path, model=...) or call "
                              f"index.attach(model) (it was built with {self.model_path or 'a loaded model'})")
        texts = [texts] if isinstance(texts, str) else list(texts)
        check_query_lengths(self.model, texts, self.options.max_length)
        return encode(self.model, texts, self.options, batch_size=batch_size, show_progress=show_progress,
                      dtype=self.dtype)

    def search(self, queries: str | Sequence[str] | np.ndarray, k: int = 10, *, batch_size: int = 32,
               ef_search: int | None = None, nprobe: int | None = None) -> list[list[Hit]]:
        """The `k` passages with the largest inner product for each query, best first (fewer when the index holds
        fewer). `queries`: texts (a string counts as one), embedded with the index's options, or vectors [N, D]
        (a [D] vector counts as one) from the same model and options, normalised here. `ef_search` (hnsw) and
        `nprobe` (ivf) override the recorded search parameters for this call."""
        check_k(k)
        if isinstance(queries, np.ndarray):
            vectors = queries[None, :] if queries.ndim == 1 else queries
            if vectors.ndim != 2 or vectors.shape[1] != self.dim:
                raise ConfigError(f"query vectors must have shape [N, {self.dim}], got {list(queries.shape)}")
            if not np.isfinite(vectors).all():
                raise ConfigError("query vectors hold NaN or infinite values")
            vectors = normalize(vectors)
        else:
            vectors = self.encode(queries, batch_size=batch_size)
        if len(vectors) == 0:
            return []
        scores, rows = self.search_vectors(vectors, k, ef_search=ef_search, nprobe=nprobe)
        return [[Hit(self.passages[r].id, float(s), self.passages[r].text, int(r))
                 for s, r in zip(score_row, row_ids) if r >= 0]
                for score_row, row_ids in zip(scores, rows)]

    def rank(self, queries: str | Sequence[str], depth: int, *, batch_size: int = 32,
             show_progress: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """The `depth` best passages of each query text: scores [Q, depth] and rows [Q, depth], best first; `depth`
        is capped at the number of passages (the same interface as the other index kinds)."""
        vectors = self.encode(queries, batch_size=batch_size, show_progress=show_progress)
        return self.search_vectors(vectors, min(depth, len(self)))

    def search_vectors(self, vectors: np.ndarray, k: int, *, ef_search: int | None = None,
                       nprobe: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """faiss's answer for normalised float32 query vectors: scores [N, k] and rows [N, k] (-1 past the end)."""
        for name, value in (("ef_search", ef_search), ("nprobe", nprobe)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ConfigError(f"{name} must be a positive integer, got {value!r}")
        faiss = _faiss()
        if self.structure.kind == "hnsw":
            params = faiss.SearchParametersHNSW(efSearch=ef_search or self.structure.ef_search)
        elif self.structure.kind == "ivf":
            params = faiss.SearchParametersIVF(nprobe=nprobe or self.structure.nprobe)
        else:
            params = None
        return self.faiss_index.search(np.ascontiguousarray(vectors, dtype=np.float32), k, params=params)


def check_query_lengths(model: Pretrained, queries: Sequence[str], max_length: int | None = None) -> None:
    """Refuse a query longer (in tokens, specials included) than `max_length` or the model's positions: a query is
    embedded whole or not at all, never silently cut or split into windows. The error names the query's position
    and both lengths."""
    from bertology.embeddings.backbone import as_backbone

    tokenizer = model.tokenizer
    limit = as_backbone(model, tokenizer).max_length
    if max_length is not None:
        limit = min(limit, max_length)
    settings = read_sentence_config(model.directory) if getattr(model, "directory", None) else None
    lower = settings is not None and settings.lower_case
    for i, query in enumerate(queries):
        if not isinstance(query, str):
            raise ConfigError(f"query {i + 1}: expected a string, got {type(query).__name__}")
        encoded = tokenizer.encode(query.lower() if lower else query)
        length = len(getattr(encoded, "ids", encoded))  # ELMo's word tokenizer gives the words themselves
        if length > limit:
            raise ConfigError(f"query {i + 1} ({query[:40]!r}...): {length} tokens, more than the {limit} the model "
                              f"reads (its positions or the index's max_length); shorten the query")


def check_k(k: object) -> None:
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ConfigError(f"k must be a positive integer, got {k!r}")


def check_output(directory: str | os.PathLike, files: Sequence[str] = (FAISS_FILE,)) -> Path:
    """Where an index may be saved (checked before any embedding work): a new directory or an existing index
    (of any kind) holding nothing but `files` (the kind's own, besides index.json and passages.jsonl), not a file,
    not a directory holding something else, not below a file."""
    directory = Path(directory)
    if directory.exists() and not directory.is_dir():
        raise ConfigError(f"{directory}: is a file; the index is written as a directory")
    if directory.is_dir() and any(directory.iterdir()) and not (directory / META_FILE).is_file():
        raise ConfigError(f"{directory}: exists and is not an index; refusing to replace it")
    if (directory / META_FILE).is_file():  # an index is replaced as a whole: nothing else may be lost with it
        others = sorted(entry.name for entry in os.scandir(directory) if not entry.name.startswith(".")
                        and entry.name not in (META_FILE, PASSAGES_FILE, *files))
        if others:
            raise ConfigError(f"{directory}: an index, but it also holds {', '.join(others[:5])}, which replacing "
                              "it would remove; move them out or choose another directory")
    blocker = file_in_the_way(directory)
    if blocker is not None:
        raise ConfigError(f"{directory}: cannot create it, {blocker} is a file, not a directory")
    return directory


# IVF's k-means trains on at most this many vectors a cell, sampled by faiss with the seeded generator. At 1M vectors
# and 4,000 cells faiss's default (256 a cell) trains on every vector; k-means' cost grows with sample x cells.
IVF_TRAIN_PER_CELL = 64


def _build_faiss(vectors: np.ndarray, structure: Structure) -> tuple[Any, dict[str, Any]]:
    faiss = _faiss()
    n, dim = vectors.shape
    parameters = structure.parameters()
    if structure.kind == "hnsw":
        index = faiss.IndexHNSWFlat(dim, structure.hnsw_m, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = structure.ef_construction
        index.hnsw.efSearch = structure.ef_search
    elif structure.kind == "ivf":
        # faiss's guidance: about 4 sqrt(N) cells, with at least 39 training points each for k-means.
        nlist = structure.nlist if structure.nlist is not None else max(1, min(round(4 * n ** 0.5), n // 39))
        if nlist > n:
            raise ConfigError(f"structure.nlist {nlist} exceeds the {n} passages (k-means needs a passage per cell)")
        parameters["nlist"] = nlist
        quantizer = faiss.IndexFlatIP(dim)
        index = faiss.IndexIVFFlat(quantizer, dim, nlist, faiss.METRIC_INNER_PRODUCT)
        index.cp.seed = 1234  # k-means is seeded, so a rebuild gives the same cells
        # k-means on a seeded sample of IVF_TRAIN_PER_CELL vectors a cell (faiss's own cap is 256): see the constant
        index.cp.max_points_per_centroid = IVF_TRAIN_PER_CELL
        index.train(vectors)
        index.nprobe = structure.nprobe
    else:
        index = faiss.IndexFlatIP(dim)
    index.add(vectors)
    return index, parameters


# ---------------------------------------------------------------------------------------------------- embedding
def encode(model: Pretrained, texts: str | Sequence[str], options: EmbeddingOptions, *, batch_size: int = 32,
           show_progress: bool = False, device: str | torch.device | None = None,
           dtype: str = "float32") -> np.ndarray:
    """Normalised sentence vectors [N, D] of `texts` by `bertology.embed` with `options` (on `device` in `dtype`,
    as `embed` takes them)."""
    from bertology.embeddings import embed

    # Options read from a sentence-transformers directory follow the rest of its settings too (prompts,
    # lower-casing), as `embed` does by default; other options are embed's plain ones.
    result = embed(model, texts, layers=options.layers, combine=options.combine, sentence=options.sentence,
                   levels=("sentence",), batch_size=batch_size, max_length=options.max_length,
                   stride=options.stride, long_texts=options.long_texts, normalize=True,
                   model_settings=options.source == SENTENCE_TRANSFORMERS, show_progress=show_progress,
                   device=device, dtype=dtype)
    return result.sentences


def corpus_vectors(output: str | os.PathLike, passages: Sequence[Passage]) -> tuple[np.ndarray, EmbeddingOptions]:
    """The sentence vectors of a complete corpus run of `bertology embed` (a directory of shards, see
    `bertology.embeddings.corpus`) in the order of `passages`, matched by id (the run's jsonl `id_field`), and the
    embedding options the run used (long texts in windows, as `embed` does). For `Index.from_vectors`."""
    from bertology.embeddings.corpus import load_corpus, read_manifest

    output = Path(output)
    vectors, rows = load_corpus(output)
    settings = read_manifest(output)["fingerprint"]
    if settings.get("level") != "sentence":
        raise ConfigError(f"{output}: holds {settings.get('level')} vectors; an index needs sentence vectors "
                          f"(bertology embed --level sentence)")
    if settings.get("dtype", "float32") != "float32":
        raise ConfigError(f"{output}: the run embedded in {settings['dtype']}; index float32 vectors (the index "
                          f"checks them against a float32 embedding of a sample)")
    where: dict[str, int] = {}
    for i, row in enumerate(rows):
        if row.get("id") is None:
            raise DataError(f"{output}: row {i} ({row.get('file')}: line {row.get('line')}) has no id; embed the "
                            f"passages as jsonl with their id field (--format jsonl --id-field id)")
        key = str(row["id"])
        if key in where:
            first = rows[where[key]]
            raise DataError(f"{output}: id {key!r} of {row.get('file')}: line {row.get('line')} repeats the one of "
                            f"{first.get('file')}: line {first.get('line')}")
        where[key] = i
    missing = [p.id for p in passages if p.id not in where]
    if missing:
        raise DataError(f"{output}: no vector for passage {missing[0]!r} (and {len(missing) - 1} more)")
    if len(where) != len(passages):
        raise DataError(f"{output}: {len(where)} vectors for {len(passages)} passages; the run embedded other texts")
    order = np.asarray([where[p.id] for p in passages], dtype=np.int64)
    options = EmbeddingOptions(layers=list(settings["layers"]) if isinstance(settings["layers"], list)
                               else settings["layers"], combine=settings.get("combine"),
                               sentence=settings.get("sentence", "mean"), max_length=settings.get("max_length"),
                               stride=settings.get("stride"), long_texts="windows",
                               source=f"corpus run {output}")
    return np.asarray(vectors[order], dtype=np.float32), options


