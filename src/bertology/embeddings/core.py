"""`embed`: contextual token, word and sentence vectors from any encoder, with long texts split into windows."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from tqdm.auto import tqdm

from bertology.embeddings.layers import Combine, LayerSelection, LayerSpec, select_layers
from bertology.embeddings.result import (
    LEVELS,
    POOLINGS,
    SENTENCE_POOLINGS,
    EmbeddingError,
    Embeddings,
    Level,
    Pieces,
    Pooling,
    SentencePooling,
)
from bertology.embeddings.windows import max_context_window, plan_windows
from bertology.errors import ConfigError, TokenizerError
from bertology.model import EncoderConfig, EncoderModel, Pretrained
from bertology.model.encoder import Encoder
from bertology.tokenization import Encoding, Tokenizer

# Texts are tokenised and run a chunk at a time (sorted by length within it), so memory stays bounded on big inputs.
CHUNK_WINDOWS = 4096


def embed(
    model: Pretrained | EncoderModel | Encoder,
    texts: str | Sequence[str],
    *,
    tokenizer: Tokenizer | None = None,
    layers: LayerSpec = "last",
    combine: Combine | None = None,
    pooling: Pooling = "mean",
    sentence: SentencePooling = "mean",
    levels: Sequence[Level] = LEVELS,
    batch_size: int = 32,
    max_length: int | None = None,
    stride: int | None = None,
    show_progress: bool = False,
) -> Embeddings:
    """Contextual vectors of `texts` (one string counts as a list of one), as float32 numpy arrays.

    - tokens: every content token (specials excluded) with its character offsets and vocabulary id.
    - words: the tokenizer's pre-tokenised words, grouped by word id from the tokens that cover more than
      whitespace (so byte-level BPE's runs of spaces make no words); each word's vector pools its subword tokens
      by `pooling` ("first", "mean" or "last"), and its span runs from its first token's start to its last
      token's end.
    - sentences: `sentence="mean"` averages every token the model saw, [CLS]/[SEP] included (sentence-transformers'
      mean pooling); `"cls"` takes the first token. An empty or whitespace-only text has no tokens and no words,
      and its sentence vector comes from its specials alone.

    `layers` picks hidden states (see `select_layers`: "last", "sum-last-four", "mean", "concat", or indices with
    `combine`). Texts are sorted by length into batches of `batch_size` windows; results come back in input order.

    Windows: a window holds `max_length` tokens, specials included (default and upper bound: the model's position
    count, capped by the tokenizer's model_max_length). A longer text is split into overlapping windows whose
    starts are `stride` content tokens apart (stride is the step, not the overlap; consecutive windows share
    capacity - stride tokens; default half the capacity). A token in several windows takes its vector from the
    one where it has the most context, max over windows of min(left context, right context) + 0.01 * window
    length, as BERT's SQuAD script does; ties go to the earlier window. [CLS] comes from the first window and the
    final [SEP] from the last. A text that fits in one window gets exactly the model's direct forward.
    `levels` limits what is kept (e.g. ("sentence",) for large inputs).
    """
    encoder, tokenizer = _unpack(model, tokenizer)
    config: EncoderConfig = encoder.config
    selection = select_layers(layers, combine, config.num_layers)
    if pooling not in POOLINGS:
        raise ConfigError(f"pooling: unknown {pooling!r}; expected one of {', '.join(POOLINGS)}")
    if sentence not in SENTENCE_POOLINGS:
        raise ConfigError(f"sentence: unknown {sentence!r}; expected one of {', '.join(SENTENCE_POOLINGS)}")
    wanted = _check_levels(levels)
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ConfigError(f"batch_size must be a positive integer, got {batch_size!r}")
    texts = _check_texts(texts)
    window_length = _window_length(config, tokenizer, max_length)
    capacity = window_length - 2  # one [CLS] and one [SEP] per window
    if stride is None:
        stride = max(1, capacity // 2)
    if isinstance(stride, bool) or not isinstance(stride, int):
        raise ConfigError(f"stride must be an integer, got {stride!r}")
    plan_windows(0, capacity, stride)  # validates stride against the capacity

    width = selection.width(config.hidden_size)
    collected = _Collector(texts, width, wanted)
    device = next(encoder.parameters()).device
    with _evaluating(encoder), torch.inference_mode(), tqdm(
        total=len(texts), unit="text", disable=not show_progress, dynamic_ncols=True
    ) as bar:
        for chunk in _chunks(texts, tokenizer, capacity, stride):
            _run(encoder, chunk, selection, tokenizer.pad_id, batch_size, device, bar)
            for doc in chunk:
                collected.add(doc, pooling, sentence)
    return Embeddings(
        texts=texts,
        sentences=collected.sentence_array() if "sentence" in wanted else None,
        tokens=collected.pieces("token") if "token" in wanted else None,
        words=collected.pieces("word") if "word" in wanted else None,
        layers=selection.indices,
        combine=selection.combine,
        pooling=pooling,
        sentence=sentence,
        window_length=window_length,
        stride=stride,
    )


def word_vector(
    model: Pretrained | EncoderModel | Encoder,
    text: str,
    target: str | tuple[int, int],
    *,
    occurrence: int = 0,
    tokenizer: Tokenizer | None = None,
    layers: LayerSpec = "last",
    combine: Combine | None = None,
    pooling: Pooling = "mean",
    max_length: int | None = None,
    stride: int | None = None,
) -> np.ndarray:
    """The vector of one word occurrence in `text`: `target` is a word (its `occurrence`-th whole-word,
    case-sensitive match) or a (start, end) character span; the overlapping subword tokens are pooled."""
    result = embed(model, [text], tokenizer=tokenizer, layers=layers, combine=combine, pooling=pooling,
                   levels=("token",), max_length=max_length, stride=stride)
    return result.vector(0, target, occurrence)


# --------------------------------------------------------------------------------------------------- internals


@dataclass
class _Document:
    """One text's content tokens, its windows, and (once run) its assembled [n + 2, D] token vectors."""

    index: int
    encoding: Encoding
    spans: list[tuple[int, int]]
    choice: np.ndarray  # [n] window chosen for each content token
    cls_id: int
    sep_id: int
    vectors: np.ndarray | None = None
    remaining: int = 0

    @property
    def num_tokens(self) -> int:
        return len(self.encoding.ids) - 2

    def window_ids(self, k: int) -> list[int]:
        start, stop = self.spans[k]
        return [self.cls_id, *self.encoding.ids[1 + start: 1 + stop], self.sep_id]

    def receive(self, k: int, rows: np.ndarray) -> bool:
        """Store the rows this window contributes; True once every window has arrived."""
        start, stop = self.spans[k]
        if k == 0:
            self.vectors[0] = rows[0]
        if k == len(self.spans) - 1:
            self.vectors[-1] = rows[-1]
        mine = np.flatnonzero(self.choice[start:stop] == k)
        self.vectors[1 + start + mine] = rows[1 + mine]
        self.remaining -= 1
        return self.remaining == 0


def _chunks(texts: list[str], tokenizer: Tokenizer, capacity: int, stride: int) -> Iterator[list[_Document]]:
    chunk: list[_Document] = []
    windows = 0
    cls_id, sep_id = tokenizer.cls_id, tokenizer.sep_id
    for index, text in enumerate(texts):
        encoding = tokenizer.encode(text)
        _check_layout(encoding, cls_id, sep_id, index)
        n = len(encoding.ids) - 2
        spans = plan_windows(n, capacity, stride)
        chunk.append(_Document(index, encoding, spans, max_context_window(spans, n), cls_id, sep_id))
        windows += len(spans)
        if windows >= CHUNK_WINDOWS:
            yield chunk
            chunk, windows = [], 0
    if chunk:
        yield chunk


def _run(encoder: Encoder, docs: list[_Document], selection: LayerSelection, pad_id: int, batch_size: int,
         device: torch.device, bar: tqdm) -> None:
    width = selection.width(encoder.config.hidden_size)
    jobs = []
    for doc in docs:
        doc.vectors = np.zeros((doc.num_tokens + 2, width), dtype=np.float32)
        doc.remaining = len(doc.spans)
        jobs.extend((doc, k, doc.window_ids(k)) for k in range(len(doc.spans)))
    jobs.sort(key=lambda job: len(job[2]), reverse=True)  # stable: equal lengths keep input order
    for first in range(0, len(jobs), batch_size):
        batch = jobs[first: first + batch_size]
        length = len(batch[0][2])
        input_ids = torch.full((len(batch), length), pad_id, dtype=torch.long)
        attention_mask = torch.zeros((len(batch), length), dtype=torch.long)
        for row, (_, _, ids) in enumerate(batch):
            input_ids[row, : len(ids)] = torch.tensor(ids)
            attention_mask[row, : len(ids)] = 1
        out = encoder(input_ids.to(device), attention_mask.to(device), torch.zeros_like(input_ids).to(device),
                      output_hidden_states=True)
        combined = selection.apply(out.hidden_states).cpu().numpy()
        for row, (doc, k, ids) in enumerate(batch):
            if doc.receive(k, combined[row, : len(ids)]):
                bar.update(1)


class _Collector:
    """Accumulates each finished document's requested levels, in input order."""

    def __init__(self, texts: list[str], width: int, wanted: set[str]) -> None:
        self.texts = texts
        self.width = width
        self.wanted = wanted
        self.sentences = np.zeros((len(texts), width), dtype=np.float32)
        self.parts: dict[str, dict[str, list]] = {level: {} for level in ("token", "word")}
        self.counts: dict[str, list[int]] = {"token": [], "word": []}

    def _append(self, level: str, **columns) -> None:
        for name, value in columns.items():
            self.parts[level].setdefault(name, []).append(value)
        self.counts[level].append(len(columns["index"]))

    def add(self, doc: _Document, pooling: str, sentence: str) -> None:
        vectors = doc.vectors
        self.sentences[doc.index] = vectors[0] if sentence == "cls" else vectors.mean(0, dtype=np.float64)
        n = doc.num_tokens
        enc = doc.encoding
        content = slice(1, 1 + n)
        offsets = np.asarray(enc.offsets[content], dtype=np.int64).reshape(n, 2)
        raw_words = np.asarray([-1 if w is None else w for w in enc.word_ids[content]], dtype=np.int64)
        # Tokens covering only whitespace (byte-level BPE's lone "Ġ", whose trimmed span is empty) belong to no
        # word, so runs of spaces make no words and a word's vector and span come from its visible pieces.
        source = self.texts[doc.index]
        raw_words[np.asarray([not source[a:b].strip() for a, b in enc.offsets[content]], dtype=bool)] = -1
        # Word numbers in order of first appearance, so they run 0..m-1 whatever the tokenizer's numbering.
        valid = np.flatnonzero(raw_words >= 0)
        unique, first = np.unique(raw_words[valid], return_index=True)
        rank = np.empty(len(unique), dtype=np.int64)
        rank[np.argsort(first)] = np.arange(len(unique))
        word_index = np.full(n, -1, dtype=np.int64)
        word_index[valid] = rank[np.searchsorted(unique, raw_words[valid])]
        if "token" in self.wanted:
            self._append("token", vectors=vectors[1: 1 + n], index=np.arange(n), word_index=word_index,
                         start=offsets[:, 0], end=offsets[:, 1], strings=enc.tokens[content],
                         ids=np.asarray(enc.ids[content], dtype=np.int64))
        if "word" in self.wanted:
            self._add_words(doc.index, vectors[1: 1 + n], word_index, offsets, pooling)
        doc.vectors = None  # the document's token buffer is no longer needed

    def _add_words(self, text: int, vectors: np.ndarray, word_index: np.ndarray, offsets: np.ndarray,
                   pooling: str) -> None:
        valid = np.flatnonzero(word_index >= 0)
        order = valid[np.argsort(word_index[valid], kind="stable")]  # tokens grouped by word, text order inside
        m = int(word_index.max()) + 1 if valid.size else 0
        grouped = word_index[order]
        starts = np.flatnonzero(np.r_[True, grouped[1:] != grouped[:-1]]) if m else np.zeros(0, dtype=np.int64)
        ends = np.r_[starts[1:], len(order)] if m else starts
        if not m:
            pooled = np.zeros((0, self.width), dtype=np.float32)
        elif pooling == "first":
            pooled = vectors[order[starts]]
        elif pooling == "last":
            pooled = vectors[order[ends - 1]]
        else:
            sums = np.add.reduceat(vectors[order].astype(np.float64), starts, axis=0)
            pooled = (sums / (ends - starts)[:, None]).astype(np.float32)
        char_start = np.minimum.reduceat(offsets[order, 0], starts) if m else np.zeros(0, dtype=np.int64)
        char_end = np.maximum.reduceat(offsets[order, 1], starts) if m else np.zeros(0, dtype=np.int64)
        source = self.texts[text]
        self._append("word", vectors=pooled, index=np.arange(m), word_index=np.arange(m), start=char_start,
                     end=char_end, strings=[source[a:b] for a, b in zip(char_start.tolist(), char_end.tolist())],
                     ids=None)

    def sentence_array(self) -> np.ndarray:
        return self.sentences

    def pieces(self, level: str) -> Pieces:
        parts, counts = self.parts[level], self.counts[level]
        bounds = np.zeros(len(counts) + 1, dtype=np.int64)
        np.cumsum(counts, out=bounds[1:])

        def stack(name: str, dtype, empty_shape: tuple[int, ...]) -> np.ndarray:
            values = parts.get(name, [])
            return np.concatenate(values).astype(dtype, copy=False) if values else np.zeros(empty_shape, dtype)

        strings = [s for chunk in parts.get("strings", []) for s in chunk]
        text_index = np.repeat(np.arange(len(counts), dtype=np.int64), counts)
        return Pieces(
            vectors=stack("vectors", np.float32, (0, self.width)),
            text_index=text_index,
            index=stack("index", np.int64, (0,)),
            word_index=stack("word_index", np.int64, (0,)),
            start=stack("start", np.int64, (0,)),
            end=stack("end", np.int64, (0,)),
            strings=strings,
            ids=stack("ids", np.int64, (0,)) if level == "token" else None,
            bounds=bounds,
        )


def _unpack(model: Pretrained | EncoderModel | Encoder, tokenizer: Tokenizer | None) -> tuple[Encoder, Tokenizer]:
    if isinstance(model, Pretrained):
        encoder, tokenizer = model.model.encoder, tokenizer or model.tokenizer
    elif isinstance(model, EncoderModel):
        encoder = model.encoder
    elif isinstance(model, Encoder):
        encoder = model
    else:
        raise EmbeddingError(f"embed needs a Pretrained, EncoderModel or Encoder, got {type(model).__name__}")
    if tokenizer is None:
        raise EmbeddingError("embed needs a tokenizer: the model has none, pass tokenizer=")
    if tokenizer.vocab_size > encoder.config.vocab_size:
        raise TokenizerError(f"the tokenizer has {tokenizer.vocab_size} tokens but the model's vocabulary only "
                             f"{encoder.config.vocab_size}: they do not belong together")
    return encoder, tokenizer


def _check_texts(texts: str | Sequence[str]) -> list[str]:
    if isinstance(texts, str):
        return [texts]
    if not isinstance(texts, Sequence):
        raise EmbeddingError(f"texts must be a string or a sequence of strings, got {type(texts).__name__}")
    texts = list(texts)
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise EmbeddingError(f"texts[{i}] is a {type(text).__name__}, expected a string")
    return texts


def _check_levels(levels: Sequence[Level]) -> set[str]:
    wanted = {levels} if isinstance(levels, str) else set(levels)
    unknown = sorted(wanted - set(LEVELS))
    if unknown or not wanted:
        raise ConfigError(f"levels: expected a non-empty subset of {', '.join(LEVELS)}, got {levels!r}")
    return wanted


def _window_length(config: EncoderConfig, tokenizer: Tokenizer, max_length: int | None) -> int:
    # RoBERTa-style positions start after the padding index, which takes pad_token_id + 1 of the table's rows.
    positions = config.max_position_embeddings - (config.pad_token_id + 1 if config.positions_after_padding else 0)
    if max_length is None:
        return min(positions, tokenizer.model_max_length or positions)
    if isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 3:
        raise ConfigError(f"max_length must be an integer of at least 3 (two specials and a token), got {max_length!r}")
    if max_length > positions:
        raise ConfigError(f"max_length {max_length} exceeds the model's {positions} positions")
    return max_length


def _check_layout(encoding: Encoding, cls_id: int, sep_id: int, index: int) -> None:
    ids, seq = encoding.ids, encoding.sequence_ids
    if len(ids) < 2 or ids[0] != cls_id or ids[-1] != sep_id or seq[0] is not None or seq[-1] is not None or any(
        s is None for s in seq[1:-1]
    ):
        raise EmbeddingError(f"texts[{index}]: the tokenizer does not wrap a text as one start special, the text's "
                             f"tokens and one end special (got {encoding.tokens[:4]}...)")


@contextlib.contextmanager
def _evaluating(module: torch.nn.Module) -> Iterator[None]:
    """Eval mode (no dropout) for the duration, then the caller's mode again."""
    was_training = module.training
    module.eval()
    try:
        yield
    finally:
        module.train(was_training)
