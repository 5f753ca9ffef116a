"""Span typing as a fine-tuning task: the gold entity spans of CoNLL-2003 (``conll2003-spans``) typed as LOC, MISC,
ORG or PER from SpanBERT-style span representations.

A span ``(i, j)`` (its first and last subword) over the encoder's last layer ``z`` is ``[z_i; z_j; g_ij]``, where
``g_ij`` pools ``z_i .. z_j``: their mean (``pooling="mean"``) or ``sum_k softmax_k(w . z_k) z_k`` with a learned
``w`` (``pooling="attention"``). A two-layer MLP (dense, activation, LayerNorm, output) gives the type's logits.

Where the classifier lives. It is a module of the model, not of the objective, so that everything that handles the
model handles it: the optimizer, DDP, training checkpoints, the best model kept, and the saved ``model/``. It is
plugged in with the model's extension mechanism (``model.add_extension("heads", "span_classifier", ...)``
adds it to ``model.heads`` as ``heads.span``; ``SpanTask.extend_model`` does it), so the native checkpoint format
records it and ``bertology.load`` rebuilds it (the factory, ``bertology.model.heads.span_heads``, is a built-in
extension: nothing needs importing first). The module is
the registered head kind ``span`` / ``span_attention`` (``bertology.model.heads.SpanHead``), but not one of the
model's ``head_specs``: the model's forward does not run it; the objective and ``predict`` call it on the last layer,
which the encoder computes only at the span tokens (``SpanTyping.reads``).

Long sentences are cut into chunks of whole words as in ``bertology.tasks.tagging``, never inside an entity unless
the entity alone is longer than a chunk (then its span ends at the chunk's last subword).

Predictions: a tsv ``sentence_id<TAB>start<TAB>end<TAB>predicted<TAB>gold`` (word offsets, ``end`` exclusive, after
a header line), one row per gold span; :func:`evaluate_spans` scores it (accuracy and macro-F1 over types, x100).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from bertology.errors import ConfigError, DataError
from bertology.inputs import text_lines
from bertology.io import atomic_write
from bertology.model.config import TransformerConfig
from bertology.model.heads import SPAN, SPAN_EXTENSION, SPAN_POOLINGS, HeadSpec, SpanHead
from bertology.model.protocol import Model
from bertology.objectives.base import (
    Objective,
    ObjectiveOutput,
    Passes,
    check_objective,
    classification_output,
    classification_summary,
)
from bertology.tasks.examples import LabelSet, TaggedSentence
from bertology.tasks.metrics import chunk_spans
from bertology.tasks.readers import read_conll
from bertology.tasks.sequence import EncodedExamples
from bertology.tasks.tagging import CONLL2003_TYPES, TaggedSentences, WordChunk, bio_labels, encode_chunks, read_tagged
from bertology.tokenization import Tokenizer

EXTENSION, POOLINGS = SPAN_EXTENSION, SPAN_POOLINGS  # the classifier's factory (model.heads.span_heads), its poolings


def add_span_classifier(model: Model, num_labels: int, pooling: str = "mean") -> SpanHead:
    """Plug a span classifier into ``model`` (recorded as an extension: saved and rebuilt with the model)."""
    heads = model.add_extension("heads", EXTENSION, num_labels=num_labels, pooling=pooling)
    return heads[SPAN]  # type: ignore[index,return-value]


def span_classifier(model: Model) -> SpanHead | None:
    """The model's span classifier, None when it has none."""
    module = model.heads[SPAN] if SPAN in model.heads else None
    return module if isinstance(module, SpanHead) else None


def _require(model: Model, task: str) -> SpanHead:
    module = span_classifier(model)
    if module is None:
        raise ConfigError(f"the model has no span classifier (heads.{SPAN}): it was not fine-tuned for {task} "
                          f"(SpanTask.extend_model adds one)")
    return module


def span_positions(spans: Tensor, width: int) -> Tensor:
    """The distinct (row, column) positions inside ``spans`` ``[S, 3]``: boundaries and interior."""
    if not len(spans):
        return spans.new_zeros((0, 2))
    lengths = spans[:, 2] - spans[:, 1] + 1
    owner = torch.repeat_interleave(torch.arange(len(spans), device=spans.device), lengths)
    first = torch.cumsum(lengths, 0) - lengths
    columns = spans[owner, 1] + torch.arange(len(owner), device=spans.device) - first[owner]
    flat = torch.unique(spans[owner, 0] * width + columns)
    return torch.stack([flat // width, flat % width], dim=1)


# --------------------------------------------------------------------------------------------------- data
@dataclass
class SpanBatch:
    """Padded chunks and their spans: ``spans [S, 3]`` = (row, first token, last token), ``labels [S]`` type ids
    (None unlabelled), ``span_ids [S]`` index the spans of the whole data set, ``example_ids [B]`` the chunks."""

    input_ids: Tensor
    attention_mask: Tensor
    token_type_ids: Tensor
    spans: Tensor
    labels: Tensor | None
    span_ids: Tensor
    example_ids: Tensor

    def to(self, device: torch.device | str, non_blocking: bool = False) -> SpanBatch:
        def move(t: Tensor | None) -> Tensor | None:
            return None if t is None else t.to(device, non_blocking=non_blocking)

        fields = (self.input_ids, self.attention_mask, self.token_type_ids, self.spans, self.labels, self.span_ids,
                  self.example_ids)
        return SpanBatch(*(move(t) for t in fields))  # type: ignore[arg-type]

    def __len__(self) -> int:
        return self.input_ids.shape[0]


class SpanExamples(EncodedExamples):
    """Chunks holding at least one span, as a ``BatchSource`` of ``SpanBatch``es. ``spans`` ``[N, 4]``: (chunk,
    first token, last token, type id or -1), sorted by chunk; a span's id is its row."""

    def __init__(self, chunks: Sequence[WordChunk], spans: np.ndarray, labelled: bool, pad_id: int,
                 **options: Any) -> None:
        super().__init__([c.ids for c in chunks], [[0] * len(c.ids) for c in chunks], None, pad_id, **options)
        self.chunks = list(chunks)
        self.spans = spans
        self.labelled = labelled
        self.span_offsets = np.searchsorted(spans[:, 0], np.arange(len(chunks) + 1))

    def collate(self, rows: np.ndarray) -> SpanBatch:  # type: ignore[override]
        batch = super().collate(rows)
        ids = np.concatenate([np.arange(self.span_offsets[c], self.span_offsets[c + 1]) for c in rows])
        row_of = np.repeat(np.arange(len(rows)), self.span_offsets[rows + 1] - self.span_offsets[rows])
        spans = np.stack([row_of, self.spans[ids, 1], self.spans[ids, 2]], axis=1)
        labels = torch.from_numpy(self.spans[ids, 3].copy()) if self.labelled else None
        return SpanBatch(batch.input_ids, batch.attention_mask, batch.token_type_ids, torch.from_numpy(spans),
                         labels, torch.from_numpy(ids.astype(np.int64)), batch.example_ids)


def sentence_spans(sentence: TaggedSentence) -> list[tuple[str, int, int]]:
    """The entities of a BIO-tagged sentence: ``(type, first word, end word exclusive)``."""
    return chunk_spans(sentence.tags or [])


def encode_spans(tokenizer: Tokenizer, sentences: Sequence[TaggedSentence], types: LabelSet, max_length: int,
                 **options: Any) -> SpanExamples:
    """The gold spans of ``sentences`` in chunks of at most ``max_length`` tokens, cut between entities; span ids
    follow the sentences' order and each sentence's spans in order."""
    entities = [sentence_spans(s) for s in sentences]
    breakable = []
    for sentence, spans in zip(sentences, entities):
        allowed = [True] * len(sentence)
        for _, begin, end in spans:
            allowed[begin + 1:end] = [False] * (end - begin - 1)
        breakable.append(allowed)
    chunks = encode_chunks(tokenizer, [s.words for s in sentences], max_length, breakable)
    by_sentence: dict[int, list[int]] = {}
    for index, chunk in enumerate(chunks):
        by_sentence.setdefault(chunk.sentence, []).append(index)
    rows = []
    for number, spans in enumerate(entities):
        for kind, begin, end in spans:
            index = next(i for i in by_sentence[number] if chunks[i].first_word <= begin
                         < chunks[i].first_word + chunks[i].num_words)
            chunk = chunks[index]
            last = min(end, chunk.first_word + chunk.num_words) - 1 - chunk.first_word
            rows.append((index, int(chunk.starts[begin - chunk.first_word]), int(chunk.ends[last]),
                         types.index(kind, f"sentence {sentences[number].id}")))
    if not rows:
        raise DataError("no entity spans to type in these sentences")
    used = sorted({r[0] for r in rows})
    renumber = {old: new for new, old in enumerate(used)}
    table = np.array([(renumber[c], s, e, label) for c, s, e, label in rows], dtype=np.int64)
    return SpanExamples([chunks[i] for i in used], table, True, tokenizer.fill_id, **options)


# --------------------------------------------------------------------------------------------------- objective
@dataclass
class SpanTyping(Objective):
    """Cross-entropy of the model's span classifier against the spans' types; units are spans. Reads the last
    layer only inside the spans. Stats: ``span_units``, ``span_loss_sum``, ``span_correct``."""

    weight: float = 1.0
    name: str = SPAN

    def __post_init__(self) -> None:
        check_objective(self)

    def heads(self) -> Sequence[HeadSpec]:
        return ()

    def reads(self, batch: SpanBatch) -> Tensor:
        return span_positions(batch.spans, batch.input_ids.shape[1])

    def units(self, batch: SpanBatch) -> Tensor:
        return torch.tensor(len(batch.spans), dtype=torch.int64)

    def __call__(self, passes: Passes, batch: SpanBatch) -> ObjectiveOutput:
        if batch.labels is None:
            raise DataError(f"objective {self.name!r} needs span types; the batch has none")
        logits = _require(passes.model, "span typing").classify(passes.shared.last_hidden_state, batch.spans)
        loss = F.cross_entropy(logits.float(), batch.labels, reduction="sum")
        return classification_output(self.name, logits, batch.labels, loss)

    def summarize(self, totals: Mapping[str, float]) -> dict[str, float]:
        return classification_summary(self.name, totals)


@torch.no_grad()
def predict_span_labels(model: Model, examples: SpanExamples, batch_size: int = 64) -> np.ndarray:
    """The argmax type id of every span (by span id), the last layer run only inside the spans."""
    module = _require(model, "span typing")
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    out = np.full(len(examples.spans), -1, dtype=np.int64)
    try:
        for batch in examples.batches(0, batch_size, drop_last=False):
            batch = batch.to(device)
            at = span_positions(batch.spans, batch.input_ids.shape[1])
            z = model(**{**model.forward_inputs(batch), "last_layer_at": at}).last_hidden_state
            out[batch.span_ids.cpu().numpy()] = module.classify(z, batch.spans).argmax(-1).cpu().numpy()
    finally:
        model.train(was_training)
    assert (out >= 0).all(), "a span without a prediction"
    return out


# --------------------------------------------------------------------------------------------------- scoring
def span_scores(gold: Sequence[str], predicted: Sequence[str]) -> dict[str, float]:
    """Accuracy and macro-F1 (the mean over the types seen in either of each type's F1), x100."""
    if len(gold) != len(predicted):
        raise DataError(f"{len(gold)} gold spans but {len(predicted)} predictions")
    if not gold:
        raise DataError("no spans to score")
    g, p = np.asarray(gold, dtype=object), np.asarray(predicted, dtype=object)
    f1s = []
    for kind in sorted(set(gold) | set(predicted)):
        tp = int(((g == kind) & (p == kind)).sum())
        wrong = int(((g == kind) != (p == kind)).sum())
        f1s.append(2 * tp / (2 * tp + wrong) if tp + wrong else 0.0)
    return {"accuracy": 100 * float((g == p).mean()), "macro_f1": 100 * float(np.mean(f1s))}


HEADER = ["sentence_id", "start", "end", "predicted", "gold"]


def read_span_predictions(path: str | Path) -> list[tuple[str, int, int, str, str]]:
    """The rows of a span predictions tsv; errors name the file and the line."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: no such file")
    rows = []
    for number, line in text_lines(path):
        fields = line.split("\t")
        if number == 1:
            if fields != HEADER:
                raise DataError(f"{path}: line 1: expected the header {chr(9).join(HEADER)!r}")
            continue
        if len(fields) != 5:
            raise DataError(f"{path}: line {number}: expected 5 tab-separated columns, got {len(fields)}")
        try:
            start, end = int(fields[1]), int(fields[2])
        except ValueError:
            raise DataError(f"{path}: line {number}: start and end must be integers, got {fields[1]!r}, "
                            f"{fields[2]!r}") from None
        if not 0 <= start < end:
            raise DataError(f"{path}: line {number}: span [{start}, {end}) is empty or negative")
        rows.append((fields[0], start, end, fields[3], fields[4]))
    if not rows:
        raise DataError(f"{path}: no predictions")
    return rows


def evaluate_spans(predictions: str | Path, gold: str | Path | None = None) -> dict[str, float]:
    """Accuracy and macro-F1 of a span predictions file; with ``gold`` (the CoNLL file), its rows must be exactly
    the gold file's entity spans with their gold types."""
    rows = read_span_predictions(predictions)
    if gold is not None:
        expected = {(s.id, begin, end): kind for s in read_conll(gold) for kind, begin, end in sentence_spans(s)}
        seen = set()
        for number, (sentence, start, end, _, kind) in enumerate(rows, start=2):
            key = (sentence, start, end)
            if key in seen:
                raise DataError(f"{predictions}: line {number}: sentence {sentence} span [{start}, {end}) is listed "
                                f"twice")
            if expected.get(key) != kind:
                raise DataError(f"{predictions}: line {number}: sentence {sentence} span [{start}, {end}) {kind} is "
                                f"not a gold span of {gold}")
            seen.add(key)
        if len(seen) != len(expected):
            raise DataError(f"{predictions}: {len(expected) - len(seen)} gold spans of {gold} have no prediction")
    return span_scores([r[4] for r in rows], [r[3] for r in rows])


# --------------------------------------------------------------------------------------------------- the task
class SpanTask:
    """Typing the gold entity spans of CoNLL files (see the module docstring); ``conll2003-spans`` is registered
    with mean pooling."""

    metrics = ("accuracy", "macro_f1")
    predictions_file = "dev_predictions.tsv"
    files = {"train": "eng.train", "dev": "eng.testa", "test": "eng.testb"}

    def __init__(self, name: str = "conll2003-spans", types: Sequence[str] = CONLL2003_TYPES,
                 pooling: str = "mean") -> None:
        if pooling not in POOLINGS:
            raise ConfigError(f"{name}: pooling must be one of {', '.join(POOLINGS)}, got {pooling!r}")
        self.name = name
        self.types = LabelSet(types)
        self.tags = bio_labels(types)
        self.pooling = pooling

    def path(self, data: str, split: str) -> Path:
        if split not in self.files:
            raise ConfigError(f"{self.name}: no split {split!r} (known: {', '.join(self.files)})")
        return Path(data) / self.files[split]

    def read(self, path: Path, limit: int | None = None) -> TaggedSentences:
        return read_tagged(path, self.tags, limit)

    def label_names(self) -> tuple[str, ...]:
        return self.types.names

    def heads(self, config: TransformerConfig) -> list[HeadSpec]:
        return []

    def extend_model(self, model: Model) -> None:
        """Give a freshly built model the span classifier (the recipe calls this before training)."""
        if span_classifier(model) is None:
            add_span_classifier(model, len(self.types), self.pooling)

    def objectives(self, heads: Sequence[HeadSpec]) -> list[SpanTyping]:
        return [SpanTyping()]

    def encode(self, tokenizer: Tokenizer, examples: Sequence[TaggedSentence], max_length: int, *, train: bool,
               seed: int = 0) -> SpanExamples:
        return encode_spans(tokenizer, examples, self.types, max_length, shuffle=train, seed=seed)

    def predict(self, model: Model, encoded: SpanExamples, examples: Sequence[TaggedSentence],
                batch_size: int) -> list[list[str]]:
        """Per sentence, the predicted type of each of its gold spans, in order."""
        names = self.types.names
        flat = [names[i] for i in predict_span_labels(model, encoded, batch_size).tolist()]
        out, at = [], 0
        for sentence in examples:
            count = len(sentence_spans(sentence))
            out.append(flat[at:at + count])
            at += count
        if at != len(flat):
            raise DataError(f"{self.name}: the encoded spans are not those of these sentences")
        return out

    def scores(self, predictions: Sequence[Sequence[str]], examples: Sequence[TaggedSentence]) -> dict[str, float]:
        gold = [kind for s in examples for kind, _, _ in sentence_spans(s)]
        return span_scores(gold, [p for sentence in predictions for p in sentence])

    def write(self, path: Path, predictions: Sequence[Sequence[str]], examples: Sequence[TaggedSentence]) -> None:
        with atomic_write(path, "w", encoding="utf-8") as handle:
            handle.write("\t".join(HEADER) + "\n")
            for sentence, predicted in zip(examples, predictions, strict=True):
                for (kind, begin, end), guess in zip(sentence_spans(sentence), predicted, strict=True):
                    handle.write(f"{sentence.id}\t{begin}\t{end}\t{guess}\t{kind}\n")

    def evaluate(self, predictions_path: Path, gold_path: Path) -> dict[str, Any]:
        return evaluate_spans(predictions_path, gold_path)


CONLL2003_SPANS = SpanTask()
