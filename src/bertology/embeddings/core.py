"""`embed`: contextual token, word and sentence vectors from any backbone (see `bertology.embeddings.backbone`),
with long texts split into windows."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Literal

import numpy as np
import torch
from tqdm.auto import tqdm

from bertology.device import place, to_cpu
from bertology.embeddings.backbone import Backbone, Framed, as_backbone
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
    normalize as normalize_rows,
)
from bertology.embeddings.sentence_config import SentenceConfig, read_sentence_config
from bertology.embeddings.windows import max_context_window, plan_windows
from bertology.errors import ConfigError
from bertology.model import Model, Pretrained
from bertology.model.encoder import Encoder
from bertology.tokenization import Encoding, Tokenizer

# Texts are tokenised and run a chunk at a time (sorted by length within it), so memory stays bounded on big inputs.
CHUNK_WINDOWS = 4096


def embed(
    model: Backbone | Pretrained | Model | Encoder,
    texts: str | Sequence[str],
    *,
    tokenizer: Tokenizer | None = None,
    layers: LayerSpec = "last",
    combine: Combine | None = None,
    pooling: Pooling = "mean",
    sentence: SentencePooling | None = None,
    levels: Sequence[Level] = LEVELS,
    batch_size: int = 32,
    max_length: int | None = None,
    stride: int | None = None,
    long_texts: Literal["windows", "truncate"] | None = None,
    truncation_side: Literal["right", "left"] = "right",
    normalize: bool | None = None,
    prompt: str | None = None,
    prompt_name: str | None = None,
    model_settings: bool = True,
    show_progress: bool = False,
    device: str | torch.device | None = None,
    dtype: str = "float32",
) -> Embeddings:
    """Contextual vectors of `texts` (one string counts as a list of one), as float32 numpy arrays.

    `model` is a `Backbone` (see `bertology.embeddings.backbone`), or bertology's `Pretrained`, a bertology model (`EncoderModel`, `DecoderModel`, ...) or
    `Encoder`, which are wrapped in an `EncoderBackbone` (the tokenizer's framing: BERT's [CLS] text [SEP], GPT-2's
    text alone, XLNet's text <sep> <cls>). `tokenizer` defaults to the model's (a `Pretrained`'s, or a backbone's
    `tokenizer` attribute); texts are tokenised without specials and each window is framed by the backbone.

    - tokens: every content token (specials excluded) with its character offsets and vocabulary id.
    - words: the tokenizer's pre-tokenised words, grouped by word id from the tokens that cover more than
      whitespace (so byte-level BPE's runs of spaces make no words); each word's vector pools its subword tokens
      by `pooling` ("first", "mean" or "last"), and its span runs from its first token's start to its last
      token's end.
    - sentences: `sentence="mean"` averages every token the model saw, the specials included (sentence-transformers'
      mean pooling); `"max"` takes each dimension's maximum over the same tokens; `"cls"` takes the backbone's
      summary token ([CLS] for BERT, which comes first; XLNet's <cls> comes last). An empty or whitespace-only text
      has no tokens and no words, and its sentence vector comes from its specials alone. `normalize=True` scales
      each sentence vector to unit L2 norm (token and word vectors are left as they are).

    A sentence-transformers directory (a `Pretrained` loaded from one: its ``modules.json`` names a Pooling module;
    see `bertology.embeddings.sentence_config`) supplies the defaults of the options not given: `sentence` from its
    pooling mode, `long_texts="truncate"` at ``max_seq_length`` tokens (unless a `stride` asks for windows, which
    then hold the model's positions or `max_length`), `normalize` from a Normalize
    module, lower-casing from ``do_lower_case``, and its default prompt (``default_prompt_name``; `prompt_name`
    picks another of its ``prompts``, `prompt` gives the text itself), whose tokens are left out of mean and max
    pooling when its Pooling config says ``include_prompt: false``. So by default `embed` gives what
    ``SentenceTransformer.encode`` gives there; `long_texts="windows"` embeds long texts whole, in windows, instead.
    `model_settings=False` ignores the directory's settings (bertology's defaults: mean, windows, no
    normalisation). Elsewhere the defaults are mean pooling, windows and no normalisation. A prompt is prepended to
    each text; token and word offsets still index the text as given, the prompt's own tokens excluded.

    `layers` picks hidden states (see `select_layers`: "last", "sum-last-four", "mean", "concat", "mix" (the
    model's scalar mix), or indices with `combine`). Texts are sorted by length into batches of `batch_size`
    windows; results come back in input order.

    Long texts: `long_texts="truncate"` keeps a text's first tokens, as many as a window holds (sentence-transformers'
    truncation; `truncation_side="left"` keeps its last ones instead, after a prompt's tokens, which stay);
    `"windows"` (the default outside sentence-transformers directories) embeds all of it. Windows: a
    window holds `max_length` tokens, specials included (default and upper bound: the backbone's
    `max_length`, capped by the tokenizer's model_max_length). A longer text is split into overlapping windows
    whose starts are `stride` content tokens apart (stride is the step, not the overlap; consecutive windows share
    capacity - stride tokens, capacity being max_length minus the specials; default half the capacity). A token
    in several windows takes its vector from the one where it has the most context, max over windows of
    min(left context, right context) + 0.01 * window length, as BERT's SQuAD script does; ties go to the earlier
    window. The specials before the content (BERT's [CLS]) come from the first window and those after it ([SEP])
    from the last. A text that fits in one window gets exactly the backbone's direct forward.
    `levels` limits what is kept (e.g. ("sentence",) for large inputs).

    `device` (None: where the model is; "auto", "cpu", "cuda", "cuda:N") is where the model is moved (in place) and
    run, `dtype` "float16" or "bfloat16" runs the forwards under autocast on a GPU (`bertology.device`); the vectors
    come back as float32 numpy arrays either way.
    """
    backbone = as_backbone(model, tokenizer)
    tokenizer = _tokenizer(model, backbone, tokenizer)
    settings = read_sentence_config(model.directory) if model_settings and isinstance(model, Pretrained) else None
    if sentence is None:
        sentence = settings.sentence if settings is not None else "mean"
    if normalize is None:
        normalize = settings.normalize if settings is not None else False
    if not isinstance(normalize, bool):
        raise ConfigError(f"normalize must be True or False, got {normalize!r}")
    if long_texts is None:  # a stride is the step between windows: asking for one asks for windows
        truncates = settings is not None and settings.max_length is not None and stride is None
        long_texts = "truncate" if truncates else "windows"
    if long_texts not in ("windows", "truncate"):
        raise ConfigError(f'long_texts: unknown {long_texts!r}; expected "windows" or "truncate"')
    if long_texts == "truncate" and max_length is None and settings is not None and settings.max_length is not None:
        max_length = min(settings.max_length, backbone.max_length)
    if truncation_side not in ("right", "left"):
        raise ConfigError(f'truncation_side: unknown {truncation_side!r}; expected "right" or "left"')
    prompt_text = _prompt(settings, prompt, prompt_name)
    where = place(model, device, dtype)
    selection = select_layers(layers, combine, backbone.num_layers, _mix_weights(model, backbone))
    if pooling not in POOLINGS:
        raise ConfigError(f"pooling: unknown {pooling!r}; expected one of {', '.join(POOLINGS)}")
    if sentence not in SENTENCE_POOLINGS:
        raise ConfigError(f"sentence: unknown {sentence!r}; expected one of {', '.join(SENTENCE_POOLINGS)}")
    wanted = _check_levels(levels)
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ConfigError(f"batch_size must be a positive integer, got {batch_size!r}")
    texts = _check_texts(texts)
    lower_case = settings is not None and settings.lower_case
    run_texts = [(prompt_text + text).lower() if lower_case else prompt_text + text for text in texts]
    layout = _Layout.of(backbone)
    if sentence == "cls" and layout.summary is None:
        raise ConfigError(f'sentence="cls": {type(backbone).__name__} has no summary token; use sentence="mean"')
    window_length = _window_length(backbone.max_length, tokenizer, max_length, layout.specials)
    capacity = window_length - layout.specials
    if stride is None:
        stride = max(1, capacity // 2)
    if isinstance(stride, bool) or not isinstance(stride, int):
        raise ConfigError(f"stride must be an integer, got {stride!r}")
    plan_windows(0, capacity, stride)  # validates stride against the capacity

    width = selection.width(backbone.hidden_size)
    prompt_tokens = prompt_content = 0
    if prompt_text:
        run_prompt = prompt_text.lower() if lower_case else prompt_text
        prompt_content = len(tokenizer.encode(run_prompt, add_special_tokens=False).ids)
        if settings is not None and not settings.include_prompt:
            prompt_tokens = layout.before + prompt_content
    collected = _Collector(texts, run_texts, len(prompt_text), prompt_tokens, width, wanted)
    with _evaluating(backbone), torch.inference_mode(), where.autocast(), tqdm(
        total=len(texts), unit="text", disable=not show_progress, dynamic_ncols=True
    ) as bar:
        truncate = truncation_side if long_texts == "truncate" else None
        for chunk in _chunks(run_texts, tokenizer, capacity, stride, layout, truncate, prompt_content):
            _run(backbone, layout, chunk, selection, width, batch_size, bar)
            for doc in chunk:
                collected.add(doc, layout, pooling, sentence)
    return Embeddings(
        texts=texts,
        sentences=(normalize_rows(collected.sentences) if normalize else collected.sentences)
        if "sentence" in wanted else None,
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
    model: Backbone | Pretrained | Model | Encoder,
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
    device: str | torch.device | None = None,
    dtype: str = "float32",
) -> np.ndarray:
    """The vector of one word occurrence in `text`: `target` is a word (its `occurrence`-th whole-word,
    case-sensitive match) or a (start, end) character span; the overlapping subword tokens are pooled."""
    result = embed(model, [text], tokenizer=tokenizer, layers=layers, combine=combine, pooling=pooling,
                   levels=("token",), max_length=max_length, stride=stride, long_texts="windows",
                   model_settings=False, device=device, dtype=dtype)
    return result.vector(0, target, occurrence)


# --------------------------------------------------------------------------------------------------- internals


@dataclass(frozen=True)
class _Layout:
    """How the backbone frames content: `before` specials, the content, `after` specials; `summary` is the
    summary token's position in a text's assembled rows (from the end when negative), or None."""

    backbone: Backbone
    before: int
    after: int
    summary: int | None

    @property
    def specials(self) -> int:
        return self.before + self.after

    @classmethod
    def of(cls, backbone: Backbone) -> _Layout:
        empty = _check_framed(backbone.frame([]), 0, None)
        summary = empty.summary
        if summary is not None and not 0 <= summary < len(empty.ids):
            raise EmbeddingError(f"{type(backbone).__name__}.frame: summary position {summary} is outside the "
                                 f"{len(empty.ids)} specials of an empty text")
        if summary is not None and summary >= empty.before:  # after the content: count from the end
            summary -= len(empty.ids)
        return cls(backbone, empty.before, empty.after, summary)

    def frame(self, ids: list[int]) -> Framed:
        return _check_framed(self.backbone.frame(ids), len(ids), self)


def _check_framed(framed: Framed, content: int, layout: _Layout | None) -> Framed:
    if not isinstance(framed, Framed) or not 0 <= framed.start <= framed.stop <= len(framed.ids):
        raise EmbeddingError(f"frame() must return a Framed with 0 <= start <= stop <= len(ids), got {framed!r}")
    if framed.stop - framed.start != content:
        raise EmbeddingError(f"frame(): {content} content ids framed as {framed.stop - framed.start}")
    if layout is not None and (framed.before, framed.after) != (layout.before, layout.after):
        raise EmbeddingError(f"frame(): the specials must not depend on the content; {layout.before} before and "
                             f"{layout.after} after for an empty text, {framed.before} and {framed.after} for "
                             f"{content} ids")
    if framed.type_ids is not None and len(framed.type_ids) != len(framed.ids):
        raise EmbeddingError(f"frame(): {len(framed.type_ids)} type ids for {len(framed.ids)} ids")
    return framed


@dataclass
class _Document:
    """One text's content tokens, its windows, and (once run) its assembled [before + n + after, D] rows."""

    index: int
    encoding: Encoding  # content tokens only
    spans: list[tuple[int, int]]
    choice: np.ndarray  # [n] window chosen for each content token
    vectors: np.ndarray | None = None
    remaining: int = 0

    @property
    def num_tokens(self) -> int:
        return len(self.encoding.ids)

    def receive(self, k: int, rows: np.ndarray, before: int) -> bool:
        """Store the rows window k contributes (its framed positions); True once every window has arrived."""
        start, stop = self.spans[k]
        if k == 0:
            self.vectors[:before] = rows[:before]
        if k == len(self.spans) - 1:
            self.vectors[before + self.num_tokens:] = rows[before + stop - start:]
        mine = np.flatnonzero(self.choice[start:stop] == k)
        self.vectors[before + start + mine] = rows[before + mine]
        self.remaining -= 1
        return self.remaining == 0


def _chunks(texts: list[str], tokenizer: Tokenizer, capacity: int, stride: int, layout: _Layout,
            truncate: str | None, prompt_tokens: int = 0) -> Iterator[list[_Document]]:
    """The texts' documents, a chunk of at most CHUNK_WINDOWS windows at a time. `truncate` "right" keeps a
    long text's first `capacity` tokens, "left" its first `prompt_tokens` (the prompt's) and then its last ones."""
    chunk: list[_Document] = []
    windows = 0
    for index, text in enumerate(texts):
        encoding = tokenizer.encode(text, add_special_tokens=False)
        n = len(encoding.ids)
        if truncate is not None and n > capacity:  # one window
            head = min(prompt_tokens, capacity) if truncate == "left" else capacity
            tail = n - (capacity - head)
            encoding = replace(encoding, **{name: getattr(encoding, name)[:head] + getattr(encoding, name)[tail:]
                                            if head < capacity else getattr(encoding, name)[:capacity] for name in (
                "ids", "tokens", "type_ids", "offsets", "word_ids", "sequence_ids", "special_tokens_mask")})
        n = len(encoding.ids)
        spans = plan_windows(n, capacity, stride)
        chunk.append(_Document(index, encoding, spans, max_context_window(spans, n)))
        windows += len(spans)
        if windows >= CHUNK_WINDOWS:
            yield chunk
            chunk, windows = [], 0
    if chunk:
        yield chunk


def _run(backbone: Backbone, layout: _Layout, docs: list[_Document], selection: LayerSelection, width: int,
         batch_size: int, bar: tqdm) -> None:
    jobs: list[tuple[_Document, int, Framed]] = []
    for doc in docs:
        doc.vectors = np.zeros((layout.before + doc.num_tokens + layout.after, width), dtype=np.float32)
        doc.remaining = len(doc.spans)
        for k, (start, stop) in enumerate(doc.spans):
            jobs.append((doc, k, layout.frame(doc.encoding.ids[start:stop])))
    jobs.sort(key=lambda job: len(job[2].ids), reverse=True)  # stable: equal lengths keep input order
    for first in range(0, len(jobs), batch_size):
        batch = jobs[first: first + batch_size]
        length = len(batch[0][2].ids)
        input_ids = torch.full((len(batch), length), backbone.pad_id, dtype=torch.long)
        attention_mask = torch.zeros((len(batch), length), dtype=torch.long)
        token_type_ids = torch.zeros((len(batch), length), dtype=torch.long)
        for row, (_, _, framed) in enumerate(batch):
            input_ids[row, : len(framed.ids)] = torch.tensor(framed.ids)
            attention_mask[row, : len(framed.ids)] = 1
            if framed.type_ids is not None:
                token_type_ids[row, : len(framed.ids)] = torch.tensor(framed.type_ids)
        hidden = backbone.hidden_states(input_ids, attention_mask, token_type_ids)
        _check_hidden(backbone, hidden, input_ids.shape)
        combined = to_cpu(selection.apply(hidden)).numpy()
        for row, (doc, k, framed) in enumerate(batch):
            if doc.receive(k, combined[row, : len(framed.ids)], layout.before):
                bar.update(1)


def _check_hidden(backbone: Backbone, hidden: Sequence[torch.Tensor], shape: torch.Size) -> None:
    expected = (*shape, backbone.hidden_size)
    if len(hidden) != backbone.num_layers + 1 or any(tuple(h.shape) != expected for h in hidden):
        raise EmbeddingError(f"{type(backbone).__name__}.hidden_states: expected {backbone.num_layers + 1} tensors "
                             f"of shape {list(expected)}, got {[list(h.shape) for h in hidden]}")


class _Collector:
    """Accumulates each finished document's requested levels, in input order."""

    def __init__(self, texts: list[str], run_texts: list[str], prompt_chars: int, prompt_tokens: int, width: int,
                 wanted: set[str]) -> None:
        self.texts = texts
        self.run_texts = run_texts  # what was tokenised: the prompt, then the text (lower-cased where asked)
        self.prompt_chars = prompt_chars  # the prompt's characters at the start of each run text
        self.prompt_tokens = prompt_tokens  # leading rows left out of mean and max pooling (include_prompt false)
        self.width = width
        self.wanted = wanted
        self.sentences = np.zeros((len(texts), width), dtype=np.float32)
        self.parts: dict[str, dict[str, list]] = {level: {} for level in ("token", "word")}
        self.counts: dict[str, list[int]] = {"token": [], "word": []}

    def _append(self, level: str, **columns) -> None:
        for name, value in columns.items():
            self.parts[level].setdefault(name, []).append(value)
        self.counts[level].append(len(columns["index"]))

    def add(self, doc: _Document, layout: _Layout, pooling: str, sentence: str) -> None:
        vectors = doc.vectors
        pooled = vectors[self.prompt_tokens:]
        if sentence == "cls":
            # sentence-transformers takes the first row it pools: past an excluded prompt when [CLS] comes first
            summary = layout.summary if layout.summary != 0 else min(self.prompt_tokens, len(vectors) - 1)
            self.sentences[doc.index] = vectors[summary]
        elif not len(pooled):
            self.sentences[doc.index] = 0.0
        elif sentence == "max":
            self.sentences[doc.index] = pooled.max(0)
        else:
            self.sentences[doc.index] = pooled.mean(0, dtype=np.float64)
        enc = doc.encoding
        offsets = np.asarray(enc.offsets, dtype=np.int64).reshape(doc.num_tokens, 2)
        keep = np.arange(doc.num_tokens)
        if self.prompt_chars:  # the prompt's tokens are no tokens of the text; offsets index the text as given
            keep = np.flatnonzero(offsets[:, 0] >= self.prompt_chars)
            offsets = offsets[keep] - self.prompt_chars
        n = len(keep)
        content = vectors[layout.before + keep]
        run_source = self.run_texts[doc.index][self.prompt_chars:]
        source = self.texts[doc.index]
        if len(source) != len(run_source):  # lower-casing changed the length: offsets index the lower-cased text
            source = run_source
        self.texts[doc.index] = source
        raw_words = np.asarray([-1 if enc.word_ids[i] is None else enc.word_ids[i] for i in keep], dtype=np.int64)
        # Tokens covering only whitespace (byte-level BPE's lone "Ġ", whose trimmed span is empty) belong to no
        # word, so runs of spaces make no words and a word's vector and span come from its visible pieces.
        raw_words[np.asarray([not run_source[a:b].strip() for a, b in offsets.tolist()], dtype=bool)] = -1
        # Word numbers in order of first appearance, so they run 0..m-1 whatever the tokenizer's numbering.
        valid = np.flatnonzero(raw_words >= 0)
        unique, first = np.unique(raw_words[valid], return_index=True)
        rank = np.empty(len(unique), dtype=np.int64)
        rank[np.argsort(first)] = np.arange(len(unique))
        word_index = np.full(n, -1, dtype=np.int64)
        word_index[valid] = rank[np.searchsorted(unique, raw_words[valid])]
        if "token" in self.wanted:
            self._append("token", vectors=content, index=np.arange(n), word_index=word_index,
                         start=offsets[:, 0], end=offsets[:, 1], strings=[enc.tokens[i] for i in keep],
                         ids=np.asarray(enc.ids, dtype=np.int64)[keep])
        if "word" in self.wanted:
            self._add_words(doc.index, content, word_index, offsets, pooling)
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


def _mix_weights(model: object, backbone: Backbone) -> tuple[float, ...] | None:
    """gamma * softmax(s) of the model's learned scalar mix (`model.mix`, the extension `scalar_mix`), if any."""
    inner = model.model if isinstance(model, Pretrained) else model
    mix = getattr(inner, "mix", None) or getattr(getattr(backbone, "model", None), "mix", None)
    if mix is None or not callable(getattr(mix, "weights", None)):
        return None
    with torch.no_grad():
        return tuple((mix.gamma * mix.weights()).float().cpu().tolist())


def _prompt(settings: SentenceConfig | None, prompt: str | None, prompt_name: str | None) -> str:
    if prompt is not None and prompt_name is not None:
        raise ConfigError("prompt and prompt_name: give one of them, not both")
    if prompt is not None:
        if not isinstance(prompt, str):
            raise ConfigError(f"prompt must be a string, got {type(prompt).__name__}")
        return prompt
    if settings is None:
        if prompt_name is not None:
            raise ConfigError(f"prompt_name {prompt_name!r}: the model is not a sentence-transformers directory with "
                              "named prompts; pass the prompt's text as prompt=")
        return ""
    return settings.prompt(prompt_name)


def _tokenizer(model: object, backbone: Backbone, tokenizer: Tokenizer | None) -> Tokenizer:
    if getattr(backbone, "reads_words", False):  # ELMo: the backbone splits words itself (embeddings.elmo)
        return backbone.tokenizer  # type: ignore[attr-defined]
    if tokenizer is None and isinstance(model, Pretrained):
        tokenizer = model.tokenizer
    if tokenizer is None:
        tokenizer = getattr(backbone, "tokenizer", None)
    if not isinstance(tokenizer, Tokenizer):
        raise EmbeddingError("embed needs a tokenizer: the model has none, pass tokenizer=")
    return tokenizer


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


def _window_length(positions: int, tokenizer: Tokenizer, max_length: int | None, specials: int) -> int:
    if max_length is None:
        length = min(positions, tokenizer.model_max_length or positions)
        if length <= specials:
            raise ConfigError(f"the model's {length} positions leave no room beside its {specials} specials")
        return length
    if isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < specials + 1:
        raise ConfigError(f"max_length must be an integer of at least {specials + 1} ({specials} specials and a "
                          f"token), got {max_length!r}")
    if max_length > positions:
        raise ConfigError(f"max_length {max_length} exceeds the model's {positions} positions")
    return max_length


@contextlib.contextmanager
def _evaluating(module: object) -> Iterator[None]:
    """Eval mode (no dropout) for the duration, then every submodule's own mode again (for torch modules; a
    wrapper such as EncoderBackbone has a mode of its own that need not match the encoder's)."""
    if not isinstance(module, torch.nn.Module):
        yield
        return
    modes = [(child, child.training) for child in module.modules()]
    module.eval()
    try:
        yield
    finally:
        for child, training in modes:
            child.training = training
