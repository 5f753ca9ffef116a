"""Tokenised, memory-mapped corpus shards: written once by :func:`prepare_corpus`, streamed by
:class:`TokenizedCorpus`.

A shards directory holds, per shard ``shard-NNNNN``, four ``.npy`` arrays that ``np.load(..., mmap_mode="r")`` maps
without reading them:

- ``shard-NNNNN.ids.npy``: every token id of the shard, flat (``uint16`` when the vocabulary has at most 65,536
  entries, else ``uint32``); no special tokens.
- ``shard-NNNNN.word_start.npy``: ``bool``, parallel to the ids; true where a token begins a word (from the
  tokenizer's word ids), which whole-word masking needs.
- ``shard-NNNNN.sentences.npy``: ``int64 [S + 1]``, token offsets of the shard's sentences.
- ``shard-NNNNN.documents.npy``: ``int64 [D + 1]``, sentence offsets of the shard's documents.

plus ``unigram_counts.npy`` (``int64 [vocab_size]``, token frequencies over the split) and ``metadata.json``
(format version, vocabulary size, tokenizer fingerprint, counts, shard list, source). A held-out split, when asked
for, is a complete shards directory of the same layout in the ``heldout`` subdirectory. Documents never straddle
shards; sentences that tokenise to nothing and documents left without sentences are dropped. Special-token
strings in the text (a literal "[SEP]") are tokenised as ordinary text, never as special ids.
"""

from __future__ import annotations

import bisect
import contextlib
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from itertools import chain
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from bertology.text.corpus import CORPUS_FORMATS, CorpusFormat, CorpusSource, PathsLike, read_sources
from bertology.errors import ConfigError, DataError, TokenizerError
from bertology.inputs import load_npy
from bertology.io import atomic_directory, atomic_write
from bertology.prefetch import prefetched
from bertology.tokenization.tokenizer import backend_of, tokenizer_fingerprint

__all__ = [
    "FORMAT_VERSION",
    "HELDOUT_DIR",
    "TokenizedCorpus",
    "prepare_corpus",
    "select_heldout",
    "tokenizer_fingerprint",
]

FORMAT_VERSION = 1
FORMAT_NAME = "bertology-tokenized-corpus"
METADATA_FILE = "metadata.json"
UNIGRAM_FILE = "unigram_counts.npy"
HELDOUT_DIR = "heldout"
_ARRAYS = ("ids", "word_start", "sentences", "documents")
# Sentences handed to one encode_batch call; large enough for the Rust side to parallelise.
_BATCH_SENTENCES = 4096


def _vocab_size(tokenizer: Any) -> int:
    return int(backend_of(tokenizer).get_vocab_size(with_added_tokens=True))


def _id_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16) if vocab_size <= 1 << 16 else np.dtype(np.uint32)


# --------------------------------------------------------------------------------------------------------- reading


class TokenizedCorpus:
    """Read-only view of a shards directory; documents are numbered globally across shards.

    Arrays are memory-mapped, so opening is cheap and only the documents asked for are read. Pass ``tokenizer`` to
    check at once that it is the tokenizer the shards were made with.
    """

    def __init__(self, directory: str | os.PathLike, tokenizer: Any | None = None) -> None:
        self.directory = Path(directory)
        self.metadata = self._read_metadata()
        self._ids: list[np.ndarray] = []
        self._word_start: list[np.ndarray] = []
        self._sentences: list[np.ndarray] = []
        self._documents: list[np.ndarray] = []
        self._first_document: list[int] = [0]
        for shard in self.metadata["shards"]:
            arrays = {name: self._load(f"{shard['name']}.{name}.npy") for name in _ARRAYS}
            self._check_shard(shard, arrays)
            self._ids.append(arrays["ids"])
            self._word_start.append(arrays["word_start"])
            self._sentences.append(arrays["sentences"])
            self._documents.append(arrays["documents"])
            self._first_document.append(self._first_document[-1] + shard["num_documents"])
        if self._first_document[-1] != self.metadata["num_documents"]:
            raise DataError(f"{self.directory / METADATA_FILE}: shard document counts do not add up to num_documents")
        self.unigram_counts: np.ndarray = np.array(self._load(UNIGRAM_FILE), dtype=np.int64)  # small: in memory
        if self.unigram_counts.shape != (self.vocab_size,):
            raise DataError(f"{self.directory / UNIGRAM_FILE}: expected shape ({self.vocab_size},)")
        if tokenizer is not None:
            self.check_tokenizer(tokenizer)

    def _read_metadata(self) -> dict[str, Any]:
        path = self.directory / METADATA_FILE
        if not path.is_file():
            raise DataError(f"{self.directory}: not a tokenized corpus (no {METADATA_FILE})")
        try:
            metadata = json.loads(path.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as error:
            raise DataError(f"{path}: invalid metadata: {error}") from None
        if not isinstance(metadata, dict) or metadata.get("format") != FORMAT_NAME:
            raise DataError(f"{path}: not a {FORMAT_NAME} metadata file")
        version = metadata.get("format_version")
        if version != FORMAT_VERSION:
            raise DataError(f"{path}: format_version {version!r} is not supported (expected {FORMAT_VERSION})")
        for key in ("vocab_size", "tokenizer_sha256", "num_documents", "num_sentences", "num_tokens", "shards"):
            if key not in metadata:
                raise DataError(f"{path}: missing key {key!r}")
        return metadata

    def _load(self, name: str) -> np.ndarray:
        path = self.directory / name
        if not path.is_file():
            raise DataError(f"{self.directory}: missing shard file {name}")
        return load_npy(path)  # the header against the file's size first: a truncated shard is named

    def _check_shard(self, shard: dict[str, Any], arrays: dict[str, np.ndarray]) -> None:
        where = self.directory / f"{shard['name']}.*.npy"
        ids, word_start, sentences, documents = (arrays[name] for name in _ARRAYS)
        if ids.dtype != np.dtype(self.metadata["dtype"]) or word_start.dtype != np.bool_:
            raise DataError(f"{where}: unexpected array dtypes ({ids.dtype}, {word_start.dtype})")
        consistent = (
            len(ids) == len(word_start) == shard["num_tokens"]
            and len(sentences) == shard["num_sentences"] + 1
            and len(documents) == shard["num_documents"] + 1
            and sentences[-1] == len(ids)
            and documents[-1] == shard["num_sentences"]
        )
        if not consistent:
            raise DataError(f"{where}: array sizes disagree with {METADATA_FILE} (truncated or mixed shards?)")

    # -- properties

    @property
    def vocab_size(self) -> int:
        return int(self.metadata["vocab_size"])

    @property
    def num_tokens(self) -> int:
        return int(self.metadata["num_tokens"])

    @property
    def num_sentences(self) -> int:
        return int(self.metadata["num_sentences"])

    @property
    def tokenizer_sha256(self) -> str:
        return str(self.metadata["tokenizer_sha256"])

    def __len__(self) -> int:
        return self._first_document[-1]

    def check_tokenizer(self, tokenizer: Any) -> None:
        """Raise TokenizerError unless ``tokenizer`` is the one these shards were tokenised with."""
        fingerprint = tokenizer_fingerprint(tokenizer)
        if fingerprint != self.tokenizer_sha256:
            raise TokenizerError(
                f"{self.directory}: shards were made with a different tokenizer "
                f"(sha256 {self.tokenizer_sha256[:12]}..., vocab size {self.vocab_size}); the given one has sha256 "
                f"{fingerprint[:12]}..., vocab size {_vocab_size(tokenizer)}. Re-run `bertology data prepare`."
            )

    # -- documents

    def _locate(self, index: int) -> tuple[int, int]:
        if not -len(self) <= index < len(self):
            raise IndexError(f"document {index} out of range for a corpus of {len(self)} documents")
        index %= len(self)
        shard = bisect.bisect_right(self._first_document, index) - 1
        return shard, index - self._first_document[shard]

    def _document_span(self, index: int) -> tuple[int, np.ndarray]:
        """The shard of document ``index`` and its sentence token offsets (``[S + 1]``)."""
        shard, local = self._locate(index)
        first, last = self._documents[shard][local : local + 2]
        return shard, np.asarray(self._sentences[shard][first : last + 1], dtype=np.int64)

    def document(self, index: int) -> list[np.ndarray]:
        """Sentences of document ``index`` as int64 token-id arrays."""
        shard, offsets = self._document_span(index)
        tokens = np.asarray(self._ids[shard][offsets[0] : offsets[-1]], dtype=np.int64)
        return np.split(tokens, offsets[1:-1] - offsets[0])

    def word_starts(self, index: int) -> list[np.ndarray]:
        """Per sentence of document ``index``, a bool array that is true where a token begins a word."""
        shard, offsets = self._document_span(index)
        flags = np.array(self._word_start[shard][offsets[0] : offsets[-1]], dtype=np.bool_)
        return np.split(flags, offsets[1:-1] - offsets[0])

    def document_lengths(self) -> np.ndarray:
        """Tokens per document, int64 ``[len(self)]``."""
        lengths = [np.diff(sentences[documents]) for sentences, documents in zip(self._sentences, self._documents)]
        return np.concatenate(lengths).astype(np.int64) if lengths else np.zeros(0, dtype=np.int64)

    def __iter__(self) -> Iterator[list[np.ndarray]]:
        for index in range(len(self)):
            yield self.document(index)

    def __getstate__(self) -> dict[str, Any]:
        # Pickling (e.g. into DataLoader workers) re-opens the maps instead of copying every shard.
        return {"directory": self.directory}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["directory"])

    def __repr__(self) -> str:
        return (
            f"TokenizedCorpus({str(self.directory)!r}, documents={len(self)}, sentences={self.num_sentences}, "
            f"tokens={self.num_tokens}, shards={len(self._ids)})"
        )


# --------------------------------------------------------------------------------------------------------- writing


@dataclass
class _Batch:
    """Tokenised documents: flat ids and word starts, tokens per sentence, sentences per document."""

    ids: np.ndarray
    word_start: np.ndarray
    sentence_lengths: np.ndarray
    document_sentences: np.ndarray

    def select(self, keep: np.ndarray) -> _Batch:
        """The documents where ``keep`` (bool per document) is true."""
        sentence_keep = np.repeat(keep, self.document_sentences)
        token_keep = np.repeat(sentence_keep, self.sentence_lengths)
        return _Batch(
            self.ids[token_keep],
            self.word_start[token_keep],
            self.sentence_lengths[sentence_keep],
            self.document_sentences[keep],
        )

    def head(self, documents: int) -> tuple[_Batch, _Batch]:
        """Split after the first ``documents`` documents."""
        sentences = int(self.document_sentences[:documents].sum())
        tokens = int(self.sentence_lengths[:sentences].sum())
        first = _Batch(
            self.ids[:tokens], self.word_start[:tokens], self.sentence_lengths[:sentences],
            self.document_sentences[:documents],
        )  # fmt: skip
        rest = _Batch(
            self.ids[tokens:], self.word_start[tokens:], self.sentence_lengths[sentences:],
            self.document_sentences[documents:],
        )  # fmt: skip
        return first, rest


def _tokenize(backend: Any, documents: list[list[str]], dtype: np.dtype) -> tuple[_Batch, np.ndarray]:
    """Encode every sentence of ``documents`` in one parallel batch.

    Sentences and documents left without tokens are dropped; also returns which documents were kept (bool).
    """
    sentences = list(chain.from_iterable(documents))
    encodings = backend.encode_batch(sentences, add_special_tokens=False)
    lengths = np.fromiter((len(encoding.ids) for encoding in encodings), dtype=np.int64, count=len(encodings))
    total = int(lengths.sum())
    ids = np.fromiter(chain.from_iterable(encoding.ids for encoding in encodings), dtype=dtype, count=total)
    try:
        word_ids = np.fromiter(
            chain.from_iterable(encoding.word_ids for encoding in encodings), dtype=np.int64, count=total
        )
    except TypeError:  # a token outside any word (word id None): it counts as a word of its own
        word_ids = np.array(
            [-1 if word is None else word for encoding in encodings for word in encoding.word_ids], dtype=np.int64
        )
    word_start = np.ones(total, dtype=np.bool_)
    if total:
        word_start[1:] = word_ids[1:] != word_ids[:-1]
        word_start[word_ids < 0] = True
        sentence_starts = np.cumsum(lengths) - lengths
        word_start[sentence_starts[lengths > 0]] = True
    document_of_sentence = np.repeat(np.arange(len(documents)), [len(document) for document in documents])
    nonempty = lengths > 0
    document_sentences = np.bincount(document_of_sentence[nonempty], minlength=len(documents))
    kept = document_sentences > 0
    return _Batch(ids, word_start, lengths[nonempty], document_sentences).select(kept), kept


@dataclass
class _SplitWriter:
    """Accumulates documents of one split into shards of about ``shard_size_tokens`` tokens."""

    directory: Path
    dtype: np.dtype
    vocab_size: int
    shard_size_tokens: int
    shards: list[dict[str, Any]] = field(default_factory=list)
    pending: list[_Batch] = field(default_factory=list)
    pending_tokens: int = 0
    unigram_counts: np.ndarray | None = None

    def add(self, batch: _Batch) -> None:
        while len(batch.document_sentences):
            sentence_ends = np.cumsum(batch.sentence_lengths)
            document_tokens = sentence_ends[np.cumsum(batch.document_sentences) - 1]
            room = self.shard_size_tokens - self.pending_tokens
            # Take documents until the shard reaches its size; a document is never split.
            take = min(int(np.searchsorted(document_tokens, room, side="left")) + 1, len(document_tokens))
            head, batch = batch.head(take)
            self.pending.append(head)
            self.pending_tokens += len(head.ids)
            if self.pending_tokens >= self.shard_size_tokens:
                self.flush()

    def flush(self) -> None:
        if not self.pending:
            return
        ids = np.concatenate([batch.ids for batch in self.pending])
        word_start = np.concatenate([batch.word_start for batch in self.pending])
        sentence_lengths = np.concatenate([batch.sentence_lengths for batch in self.pending])
        document_sentences = np.concatenate([batch.document_sentences for batch in self.pending])
        arrays = {
            "ids": ids,
            "word_start": word_start,
            "sentences": np.concatenate([[0], np.cumsum(sentence_lengths)]).astype(np.int64),
            "documents": np.concatenate([[0], np.cumsum(document_sentences)]).astype(np.int64),
        }
        name = f"shard-{len(self.shards):05d}"
        for key, array in arrays.items():
            with atomic_write(self.directory / f"{name}.{key}.npy") as handle:
                np.save(handle, array, allow_pickle=False)
        counts = np.bincount(ids, minlength=self.vocab_size).astype(np.int64)
        self.unigram_counts = counts if self.unigram_counts is None else self.unigram_counts + counts
        self.shards.append(
            {
                "name": name,
                "num_documents": len(document_sentences),
                "num_sentences": len(sentence_lengths),
                "num_tokens": len(ids),
            }
        )
        self.pending, self.pending_tokens = [], 0

    def finish(self, metadata: dict[str, Any]) -> dict[str, Any]:
        """Write the last shard, the unigram counts and ``metadata.json``; return the full metadata."""
        self.flush()
        counts = self.unigram_counts if self.unigram_counts is not None else np.zeros(self.vocab_size, np.int64)
        with atomic_write(self.directory / UNIGRAM_FILE) as handle:
            np.save(handle, counts, allow_pickle=False)
        metadata = {
            **metadata,
            "num_documents": sum(shard["num_documents"] for shard in self.shards),
            "num_sentences": sum(shard["num_sentences"] for shard in self.shards),
            "num_tokens": sum(shard["num_tokens"] for shard in self.shards),
            "shards": self.shards,
        }
        with atomic_write(self.directory / METADATA_FILE, "w", encoding="utf-8") as handle:
            json.dump(metadata, handle, indent=2)
            handle.write("\n")
        return metadata


def select_heldout(num_documents: int, heldout: int | float, seed: int) -> np.ndarray:
    """Bool mask over ``num_documents`` marking the held-out ones, drawn with ``seed``.

    ``heldout`` is a count (int >= 0) or a fraction (float in [0, 1)); a positive fraction holds out at least one
    document. At least one document always stays in training.
    """
    if isinstance(heldout, bool) or not isinstance(heldout, (int, float)):
        raise ConfigError(f"heldout_documents must be an int count or a float fraction, got {heldout!r}")
    if isinstance(heldout, float):
        if not 0.0 <= heldout < 1.0:
            raise ConfigError(f"heldout_documents fraction must be in [0, 1), got {heldout}")
        count = max(1, round(heldout * num_documents)) if heldout > 0 else 0
    else:
        if heldout < 0:
            raise ConfigError(f"heldout_documents must be >= 0, got {heldout}")
        count = heldout
    if count >= num_documents and count > 0:
        raise DataError(
            f"cannot hold out {count} of {num_documents} documents: at least one must remain for training"
        )
    mask = np.zeros(num_documents, dtype=np.bool_)
    mask[np.random.default_rng(seed).choice(num_documents, size=count, replace=False)] = True
    return mask


def _batches(documents: Iterator[list[str]]) -> Iterator[list[list[str]]]:
    """Group documents so that each group holds about ``_BATCH_SENTENCES`` sentences."""
    group: list[list[str]] = []
    sentences = 0
    for document in documents:
        group.append(document)
        sentences += len(document)
        if sentences >= _BATCH_SENTENCES:
            yield group
            group, sentences = [], 0
    if group:
        yield group


@contextlib.contextmanager
def _specials_as_text(backend: Any) -> Iterator[None]:
    """Tokenise special-token strings found in the corpus ("[SEP]", "<mask>") as ordinary text, so that corpus
    text can never inject special ids; the backend's setting is restored afterwards."""
    if not hasattr(backend, "encode_special_tokens"):  # tokenizers < 0.19
        yield
        return
    previous = backend.encode_special_tokens
    backend.encode_special_tokens = True
    try:
        yield
    finally:
        backend.encode_special_tokens = previous


def _check_output(out_dir: Path, overwrite: bool) -> None:
    """Refuse to replace anything but an earlier shards directory, and that only with ``overwrite``."""
    if not out_dir.exists():
        return
    if not out_dir.is_dir():
        raise DataError(f"{out_dir}: exists and is not a directory")
    if not any(out_dir.iterdir()):
        return
    if not (out_dir / METADATA_FILE).is_file():
        raise DataError(f"{out_dir}: exists, is not empty and is not a tokenized corpus; refusing to replace it")
    if not overwrite:
        raise DataError(f"{out_dir}: a tokenized corpus already exists there (pass overwrite=True / --overwrite)")


def _as_sources(
    paths: PathsLike | CorpusSource | list[CorpusSource], format: str, text_field: str, encoding: str
) -> list[CorpusSource]:
    if isinstance(paths, CorpusSource):
        return [paths]
    if not isinstance(paths, (str, os.PathLike)):
        paths = list(paths)
        if paths and all(isinstance(entry, CorpusSource) for entry in paths):
            return paths
        if any(isinstance(entry, CorpusSource) for entry in paths):
            raise ConfigError("paths: mix of CorpusSource objects and plain paths; wrap every entry in CorpusSource")
    if format not in CORPUS_FORMATS:
        raise ConfigError(f"unknown corpus format {format!r}; expected one of {', '.join(CORPUS_FORMATS)}")
    return [CorpusSource(paths, format, text_field, encoding)]


def prepare_corpus(
    paths: PathsLike | CorpusSource | list[CorpusSource],
    tokenizer: Any,
    out_dir: str | os.PathLike,
    format: CorpusFormat = "bert",
    *,
    text_field: str = "text",
    encoding: str = "utf-8",
    shard_size_tokens: int = 1 << 24,
    heldout_documents: int | float = 0,
    seed: int = 0,
    overwrite: bool = False,
    show_progress: bool = True,
) -> TokenizedCorpus:
    """Read a corpus, tokenise every sentence once, and write memory-mapped shards to ``out_dir``.

    ``paths`` is read with ``format``, ``text_field`` and ``encoding`` (see :func:`read_documents`); a
    :class:`CorpusSource` or a list of them mixes formats instead (those three arguments are then unused).
    ``heldout_documents`` (a count, or a fraction of the documents) are chosen with ``seed`` and written to
    ``out_dir/heldout`` instead; choosing them needs the document count, so the corpus is then read twice.
    The directory appears only when complete. Returns the training split, opened.
    """
    sources = _as_sources(paths, format, text_field, encoding)
    if isinstance(shard_size_tokens, bool) or not isinstance(shard_size_tokens, int) or shard_size_tokens < 1:
        raise ConfigError(f"shard_size_tokens must be a positive int, got {shard_size_tokens!r}")
    out_dir = Path(out_dir)
    _check_output(out_dir, overwrite)
    backend = backend_of(tokenizer)
    vocab_size = _vocab_size(tokenizer)
    dtype = _id_dtype(vocab_size)
    # Resolve the files once so that both passes (and the metadata) see the same list.
    sources = [
        CorpusSource(source.files(), source.format, source.text_field, source.encoding, source.task)
        for source in sources
    ]

    heldout_mask = None
    total = None
    if heldout_documents:
        total = sum(1 for _ in read_sources(sources))
        heldout_mask = select_heldout(total, heldout_documents, seed)

    metadata: dict[str, Any] = {
        "format": FORMAT_NAME,
        "format_version": FORMAT_VERSION,
        "vocab_size": vocab_size,
        "dtype": dtype.name,
        "tokenizer_sha256": tokenizer_fingerprint(tokenizer),
        "sources": [
            {
                "format": source.format,
                "encoding": source.encoding,
                **({"text_field": source.text_field} if source.format == "jsonl" else {}),
                **({"task": source.task} if source.format == "glue" else {}),
                "files": [str(path) for path in source.paths],
            }
            for source in sources
        ],
    }
    num_files = sum(len(source.paths) for source in sources)
    with atomic_directory(out_dir) as tmp:
        train = _SplitWriter(tmp, dtype, vocab_size, shard_size_tokens)
        heldout = None
        if heldout_mask is not None:
            (tmp / HELDOUT_DIR).mkdir()
            heldout = _SplitWriter(tmp / HELDOUT_DIR, dtype, vocab_size, shard_size_tokens)
        seen = 0
        groups = prefetched(_batches(read_sources(sources)), name="corpus-reader")
        progress = tqdm(total=total, unit="doc", desc="tokenising", disable=not show_progress)
        with contextlib.closing(groups), progress, _specials_as_text(backend):
            for group in groups:
                batch, kept = _tokenize(backend, group, dtype)
                if heldout is not None:
                    chosen = heldout_mask[seen : seen + len(group)][kept]
                    heldout.add(batch.select(chosen))
                    batch = batch.select(~chosen)
                train.add(batch)
                seen += len(group)
                progress.update(len(group))
                progress.set_postfix(tokens=sum(s["num_tokens"] for s in train.shards) + train.pending_tokens)
        split = {"seed": seed, "heldout_documents": heldout_documents} if heldout is not None else None
        train_metadata = train.finish({**metadata, "split": "train", "heldout": split})
        if heldout is not None:
            heldout.finish({**metadata, "split": "heldout", "heldout": split})
        if train_metadata["num_documents"] == 0:
            raise DataError(f"no document of the corpus has any token under this tokenizer ({num_files} file(s))")
    return TokenizedCorpus(out_dir)
