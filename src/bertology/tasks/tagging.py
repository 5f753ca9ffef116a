"""Token tagging as a fine-tuning task: CoNLL-2003 named entities (``conll2003``) with the family's
``*ForTokenClassification`` head, scored by conlleval.

Encoding. A sentence's words go through ``Tokenizer.encode_words`` (each word tokenised on its own, as
transformers does for pre-split words); the **first subword** of each word carries the word's BIO tag and the
other subwords are ignored (-100) unless ``label_all_subwords``, where a continuation subword carries the ``I-`` tag
of its word's type (``O`` for an ``O`` word). Predictions are read at first subwords only, so a word's predicted tag
never depends on that option.

Long sentences. A sentence whose subwords do not fit in ``max_length`` (specials included) is cut into consecutive
*chunks* of whole words, each as long as fits, each framed by the tokenizer's specials and encoded as its own
example; predictions are put back per word, so no word is dropped. A word with no subword at all (characters the
normaliser removes) is given the unknown token, and a single word longer than a whole chunk keeps only its first
subwords; either way every word has a first subword to be predicted at. Chunks do not see each other's context.

Files: ``eng.train`` (train), ``eng.testa`` (dev), ``eng.testb`` (test) under the task's data folder; tags are read
as IOB1 and converted to BIO (``read_conll``); every tag must be one of the task's label set (``O`` and ``B-``/``I-``
of LOC, MISC, ORG, PER), else a DataError names the file, the sentence and the word.

Predictions are written in conlleval's input format: each token's original columns, the gold tag (BIO) and the
predicted tag (6 columns for CoNLL-2003's 4-column files), a blank line after each sentence, and the ``-DOCSTART-``
lines of the input file (as lines of ``O O`` tags) where its documents begin; ``bertology evaluate --task conll``
scores that file. New text to tag (``read_input``, what ``bertology predict`` reads) may also be a file of words
only: one word a line, a blank line after each sentence (the 1-column CoNLL form, ``-DOCSTART-`` lines allowed);
its predictions are ``word tag`` lines in the same layout, one predicted tag per word.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from bertology.errors import ConfigError, DataError
from bertology.io import atomic_write
from bertology.model.checkpoint import HEADS
from bertology.model.config import TransformerConfig
from bertology.model.crf import compact
from bertology.model.heads import HeadSpec
from bertology.model.protocol import Model
from bertology.objectives.base import (
    Objective,
    ObjectiveOutput,
    Passes,
    check_objective,
    classification_output,
    classification_summary,
)
from bertology.tasks import metrics
from bertology.tasks.examples import LabelSet, TaggedSentence
from bertology.tasks.readers import read_conll
from bertology.tasks.sequence import EncodedExamples, TaskBatch
from bertology.tokenization import Tokenizer

TOKEN_CLASSIFIER = "token_classifier"
IGNORE = -100  # the label of a position no loss is taken at (specials, continuation subwords, padding)
CONLL2003_TYPES = ("LOC", "MISC", "ORG", "PER")
DOCSTART = "-DOCSTART-"


def bio_labels(types: Sequence[str]) -> LabelSet:
    """``O`` then ``B-T``, ``I-T`` for each type in order: the label ids of a BIO tagger."""
    return LabelSet(("O", *(f"{prefix}-{kind}" for kind in types for prefix in "BI")))


def bio_constraints(labels: LabelSet) -> tuple[Tensor, Tensor]:
    """The valid moves of BIO tags: ``allowed[i, j]`` (tag j may follow tag i: ``I-X`` only after ``B-X`` or
    ``I-X``) and ``allowed_start[j]`` (no ``I-`` tag first); what a CRF tagger's Viterbi decoding keeps to."""
    names = labels.names
    inside = [name[2:] if name.startswith("I-") else None for name in names]
    allowed = torch.tensor([[kind is None or (prev in (f"B-{kind}", f"I-{kind}")) for kind in inside]
                            for prev in names])
    return allowed, torch.tensor([kind is None for kind in inside])


def token_classifier_head(config: TransformerConfig, num_labels: int) -> HeadSpec:
    """The token-classification head of the model's family, as transformers' ``*ForTokenClassification``; for a
    family without one, a linear layer on every token (kind "token")."""
    table = HEADS.get(config.family, {})
    if TOKEN_CLASSIFIER not in table:  # a family without one in transformers (BART's encoder): dropout and a linear
        return HeadSpec(TOKEN_CLASSIFIER, "token", num_labels=num_labels)
    kind, act, _ = table[TOKEN_CLASSIFIER]
    return HeadSpec(TOKEN_CLASSIFIER, kind, num_labels=num_labels, activation=act or config.hidden_act)  # type: ignore[arg-type]


# --------------------------------------------------------------------------------------------------- reading
class TaggedSentences(list):
    """The sentences of a CoNLL file (a list), plus the columns of its ``-DOCSTART-`` line (None when the file has
    none), so that predictions are written with the file's document lines."""

    docstart: list[str] | None = None


def _docstart_columns(path: Path) -> list[str] | None:
    """The columns of the file's first line when it is a ``-DOCSTART-`` line (CoNLL-2003: ``-DOCSTART- -X- O O``)."""
    with open(path, encoding="utf-8", errors="replace") as handle:
        for line in handle:
            fields = line.split()
            if fields:
                return fields if fields[0] == DOCSTART else None
    return None


def read_tagged(path: Path, labels: LabelSet, limit: int | None = None) -> TaggedSentences:
    """The BIO-tagged sentences of a CoNLL file (the first ``limit``); a tag outside ``labels`` is a DataError
    naming the file, the sentence (0-based) and the word."""
    sentences = TaggedSentences()
    for sentence in read_conll(path):
        if limit is not None and len(sentences) >= limit:
            break
        for position, tag in enumerate(sentence.tags or ()):
            if tag not in labels:
                raise DataError(f"{path}: sentence {sentence.id}, word {position + 1} "
                                f"({sentence.words[position]!r}): tag {tag!r} is not one of "
                                f"{', '.join(labels.names)}")
        sentences.append(sentence)
    sentences.docstart = _docstart_columns(Path(path))
    return sentences


def read_words_or_tagged(path: Path, labels: LabelSet) -> TaggedSentences:
    """A file to predict: a file of words only (every token line holds one column) gives sentences without tags;
    any other file is read as :func:`read_tagged` reads it (the tags in the last column)."""
    untagged = read_conll(path, tag_column=None, scheme_out=None)
    first = next(untagged)  # a file with no sentence is a DataError here
    if len(first.columns[0]) != 1:
        return read_tagged(path, labels)
    sentences = TaggedSentences([first, *untagged])
    sentences.docstart = _docstart_columns(Path(path))
    return sentences


# --------------------------------------------------------------------------------------------------- encoding
@dataclass(frozen=True)
class WordChunk:
    """One encoded example: the words ``first_word .. first_word + len(starts)`` of sentence ``sentence``, their
    token ``ids`` framed by specials, and the token positions of each word's first (``starts``) and last (``ends``)
    subword."""

    sentence: int
    first_word: int
    ids: list[int]
    starts: np.ndarray
    ends: np.ndarray

    @property
    def num_words(self) -> int:
        return len(self.starts)


def word_pieces(tokenizer: Tokenizer, words: Sequence[str]) -> tuple[list[int], list[list[int]], list[int]]:
    """``(leading specials, subword ids of each word, trailing specials)`` of a sentence of pre-split words; a word
    with no subword gets the unknown token."""
    encoding = tokenizer.encode_words(list(words))
    pieces: list[list[int]] = [[] for _ in words]
    inside = [k for k, word in enumerate(encoding.word_ids) if word is not None]
    if not inside:  # no word has a subword: the specials' split comes from a sentence of one unknown token
        framed = tokenizer.encode_words([tokenizer.unk_token])
        inside = [k for k, word in enumerate(framed.word_ids) if word is not None]
        return framed.ids[:inside[0]], [[tokenizer.unk_id] for _ in words], framed.ids[inside[-1] + 1:]
    for token, word in zip(encoding.ids, encoding.word_ids):
        if word is not None:
            pieces[word].append(token)
    for piece in pieces:
        if not piece:
            piece.append(tokenizer.unk_id)
    return encoding.ids[:inside[0]], pieces, encoding.ids[inside[-1] + 1:]


def chunk_words(sizes: Sequence[int], budget: int, breakable: Sequence[bool] | None = None) -> list[tuple[int, int]]:
    """Consecutive ``[begin, end)`` word ranges whose ``sizes`` sum to at most ``budget`` (greedy, each as long as
    fits). ``breakable[k]`` False: a chunk should not start at word ``k`` (inside an entity); the cut moves back
    to the last word where it may, unless that leaves nothing before it. A word larger than ``budget`` is a chunk
    of its own (its caller truncates it)."""
    ranges: list[tuple[int, int]] = []
    begin, used = 0, 0
    k = 0
    while k < len(sizes):
        if used and used + sizes[k] > budget:
            cut = k
            if breakable is not None:
                while cut > begin and not breakable[cut]:
                    cut -= 1
                if cut == begin:  # no allowed cut inside this chunk: cut where the budget ends
                    cut = k
            ranges.append((begin, cut))
            begin, used, k = cut, 0, cut
            continue
        used += sizes[k]
        k += 1
    ranges.append((begin, len(sizes)))
    return ranges


def encode_chunks(tokenizer: Tokenizer, sentences: Sequence[Sequence[str]], max_length: int,
                  breakable: Sequence[Sequence[bool]] | None = None) -> list[WordChunk]:
    """Every sentence (a list of words) as one or more chunks of at most ``max_length`` tokens (see the module
    docstring); ``breakable`` per sentence as in :func:`chunk_words`."""
    chunks: list[WordChunk] = []
    for number, words in enumerate(sentences):
        if not words:
            raise DataError(f"sentence {number}: no words")
        head, pieces, tail = word_pieces(tokenizer, words)
        budget = max_length - len(head) - len(tail)
        if budget < 1:
            raise ConfigError(f"max_length {max_length} leaves no room for words after {len(head) + len(tail)} "
                              f"special tokens")
        ranges = chunk_words([len(p) for p in pieces], budget, None if breakable is None else breakable[number])
        for begin, end in ranges:
            ids = list(head)
            starts, ends = [], []
            for piece in pieces[begin:end]:
                piece = piece[:budget]
                starts.append(len(ids))
                ids.extend(piece)
                ends.append(len(ids) - 1)
            ids.extend(tail)
            chunks.append(WordChunk(number, begin, ids, np.array(starts, dtype=np.int64),
                                    np.array(ends, dtype=np.int64)))
    return chunks


class TokenExamples(EncodedExamples):
    """Chunks of tagged sentences as a ``BatchSource`` (an ``EncodedExamples`` whose labels are per token: a
    ``[B, L]`` batch of label ids, -100 where no loss is taken). ``chunks[i]`` says which words example ``i``
    holds and where, ``words[s]`` the number of words of sentence ``s``."""

    def __init__(self, chunks: Sequence[WordChunk], words: Sequence[int], token_labels: Sequence[Sequence[int]] | None,
                 pad_id: int, **options: Any) -> None:
        super().__init__([c.ids for c in chunks], [[0] * len(c.ids) for c in chunks], None, pad_id, **options)
        self.chunks = list(chunks)
        self.words = list(words)
        self.flat_labels = None
        if token_labels is not None:
            if [len(row) for row in token_labels] != self.lengths.tolist():
                raise DataError("TokenExamples: the token labels do not match the token ids")
            self.flat_labels = np.fromiter((t for row in token_labels for t in row), dtype=np.int64,
                                           count=int(self.offsets[-1]))

    def collate(self, rows: np.ndarray) -> TaskBatch:
        batch = super().collate(rows)
        if self.flat_labels is None:
            return batch
        real, flat = self.layout(rows)
        return replace(batch, labels=torch.from_numpy(np.where(real, self.flat_labels[flat], IGNORE)))


def token_labels(chunk: WordChunk, tags: Sequence[str], labels: LabelSet, all_subwords: bool) -> list[int]:
    """The label id of every token of ``chunk``: the word's tag at its first subword; at the others -100, or with
    ``all_subwords`` the ``I-`` tag of the word's type (``O`` for ``O`` words); -100 at specials."""
    out = [IGNORE] * len(chunk.ids)
    for k, (start, end) in enumerate(zip(chunk.starts.tolist(), chunk.ends.tolist())):
        tag = tags[chunk.first_word + k]
        out[start] = labels.index(tag)
        if all_subwords and end > start:
            inside = labels.index(tag if tag == "O" else "I-" + tag[2:])
            out[start + 1:end + 1] = [inside] * (end - start)
    return out


def encode_tagged(tokenizer: Tokenizer, sentences: Sequence[TaggedSentence], labels: LabelSet, max_length: int, *,
                  label_all_subwords: bool = False, **options: Any) -> TokenExamples:
    """Tagged sentences as chunks of at most ``max_length`` tokens with per-token labels (none when the sentences
    have no tags)."""
    chunks = encode_chunks(tokenizer, [s.words for s in sentences], max_length)
    tagged = bool(sentences) and all(s.tags is not None for s in sentences)
    rows = [token_labels(c, sentences[c.sentence].tags, labels, label_all_subwords)  # type: ignore[arg-type]
            for c in chunks] if tagged else None
    return TokenExamples(chunks, [len(s) for s in sentences], rows, tokenizer.fill_id,
                         padding_side=tokenizer.padding_side, **options)


# --------------------------------------------------------------------------------------------------- objective
@dataclass
class TokenClassification(Objective):
    """Cross-entropy of the token classifier summed over the labelled positions (label != -100); the units are the
    labelled tokens. Stats: ``{name}_units``, ``_loss_sum``, ``_correct``. Every token is read, so the last
    layer is not pruned."""

    head: HeadSpec
    weight: float = 1.0
    name: str = TOKEN_CLASSIFIER

    def __post_init__(self) -> None:
        check_objective(self)

    def heads(self) -> Sequence[HeadSpec]:
        return (self.head,)

    def reads(self, batch: TaskBatch) -> None:
        return None

    def units(self, batch: TaskBatch) -> Tensor:
        if batch.labels is None:
            return torch.tensor(0, dtype=torch.int64)
        return (batch.labels != IGNORE).sum()

    def __call__(self, passes: Passes, batch: TaskBatch) -> ObjectiveOutput:
        if batch.labels is None:
            raise DataError(f"objective {self.name!r} needs token labels; the batch has none")
        logits = passes.shared.head_logits[self.name]
        labelled = batch.labels != IGNORE
        logits, labels = logits[labelled], batch.labels[labelled]
        loss = F.cross_entropy(logits.float(), labels, reduction="sum")
        return classification_output(self.name, logits, labels, loss)

    def summarize(self, totals: Mapping[str, float]) -> dict[str, float]:
        return classification_summary(self.name, totals)


@dataclass
class CRFTagging(TokenClassification):
    """The negative log-likelihood of the gold tags under a BiLSTM-CRF head (kind "bilstm_crf",
    ``bertology.model.crf``), over each row's labelled tokens in order (a word's first subword); the units are the
    labelled tokens. Stats as ``TokenClassification``'s, ``_correct`` counting the Viterbi path's right tags."""

    def __call__(self, passes: Passes, batch: TaskBatch) -> ObjectiveOutput:
        if batch.labels is None:
            raise DataError(f"objective {self.name!r} needs token labels; the batch has none")
        crf = passes.model.heads[self.name].crf
        labelled = batch.labels != IGNORE
        scores, mask = compact(passes.shared.head_logits[self.name], labelled)
        tags, _ = compact(batch.labels, labelled)
        tags = tags.masked_fill(~mask, 0)
        loss = -crf.log_likelihood(scores, tags, mask).sum()
        correct = ((crf.viterbi(scores, mask) == tags) & mask).sum()
        return ObjectiveOutput(loss, {f"{self.name}_units": mask.sum(), f"{self.name}_loss_sum": loss.detach(),
                                      f"{self.name}_correct": correct})


@torch.no_grad()
def predict_word_labels(model: Model, examples: TokenExamples, batch_size: int = 64, head: str = TOKEN_CLASSIFIER,
                        constraints: tuple[Tensor, Tensor] | None = None) -> list[np.ndarray]:
    """Per sentence, the label id of each word at its first subword (padding-free forward in eval mode, batches in
    order of length), the chunks of a long sentence put back together: the argmax, or with a CRF head (one with a
    ``decode`` method) the Viterbi path over each chunk's words, kept to ``constraints`` (``bio_constraints``)."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    decode = getattr(model.heads[head], "decode", None)
    out = [np.full(n, -1, dtype=np.int64) for n in examples.words]
    try:
        for batch in examples.batches(0, batch_size, drop_last=False):
            batch = batch.to(device)
            logits = model(**model.forward_inputs(batch)).head_logits[head]
            example_ids = batch.example_ids.cpu().numpy()
            rows = [examples.chunks[index] for index in example_ids.tolist()]
            shifts = examples.shift(example_ids, logits.shape[1]).tolist()  # left padding moves a row's tokens
            if decode is None:
                best = logits.argmax(-1).cpu().numpy()
                words = [best[row, chunk.starts + shift] for row, (chunk, shift) in enumerate(zip(rows, shifts))]
            else:
                at = torch.zeros(logits.shape[:2], dtype=torch.bool)
                for row, (chunk, shift) in enumerate(zip(rows, shifts)):
                    at[row, torch.from_numpy(chunk.starts + shift)] = True
                moves = None if constraints is None else [c.to(device) for c in constraints]
                tags, _ = decode(logits, at.to(device), *(moves or ()))
                best = tags.cpu().numpy()
                words = [best[row, :chunk.num_words] for row, chunk in enumerate(rows)]
            for chunk, tags_of_words in zip(rows, words):
                out[chunk.sentence][chunk.first_word:chunk.first_word + chunk.num_words] = tags_of_words
    finally:
        model.train(was_training)
    assert all((labels >= 0).all() for labels in out), "a word without a prediction"
    return out


# --------------------------------------------------------------------------------------------------- writing
def conlleval_lines(predictions: Sequence[Sequence[str]], sentences: Sequence[TaggedSentence],
                    docstart: Sequence[str] | None = None) -> Iterator[str]:
    """conlleval's input, line by line: each token's columns, the gold and the predicted tag; a blank line after
    each sentence; with ``docstart`` (the file's ``-DOCSTART-`` columns) that line, tagged ``O O``, before the
    first sentence of each document."""
    previous: int | None = None
    for tags, sentence in zip(predictions, sentences, strict=True):
        if sentence.tags is None:
            raise DataError(f"sentence {sentence.id}: no gold tags, which conlleval's format needs")
        if len(tags) != len(sentence):
            raise DataError(f"sentence {sentence.id}: {len(tags)} predicted tags for {len(sentence)} words")
        if docstart is not None and sentence.document != previous:
            width = len(sentence.columns[0])
            columns = list(docstart) if len(docstart) == width else [DOCSTART, *["-X-"] * (width - 2), "O"][:width]
            yield " ".join([*columns, "O", "O"])
            yield ""
        previous = sentence.document
        for columns, gold, guess in zip(sentence.columns, sentence.tags, tags):
            yield " ".join([*columns, gold, guess])
        yield ""


def predicted_lines(predictions: Sequence[Sequence[str]], sentences: Sequence[TaggedSentence],
                    docstart: Sequence[str] | None = None) -> Iterator[str]:
    """Untagged sentences with their predictions, line by line: each token's columns and its predicted tag, a blank
    line after each sentence; with ``docstart`` that line, tagged ``O``, before the first sentence of each
    document."""
    previous: int | None = None
    for tags, sentence in zip(predictions, sentences, strict=True):
        if len(tags) != len(sentence):
            raise DataError(f"sentence {sentence.id}: {len(tags)} predicted tags for {len(sentence)} words")
        if docstart is not None and sentence.document != previous:
            yield " ".join([*docstart[:len(sentence.columns[0])], "O"])
            yield ""
        previous = sentence.document
        for columns, guess in zip(sentence.columns, tags):
            yield " ".join([*columns, guess])
        yield ""


class TaggingTask:
    """A BIO tagging task over CoNLL files (see the module docstring); ``conll2003`` is registered."""

    metrics = ("f1", "precision", "recall")
    predictions_file = "dev_predictions.conll"
    labels_input_tokens = True  # on an encoder-decoder the encoder alone is fine-tuned (the tags are its tokens')
    files = {"train": "eng.train", "dev": "eng.testa", "test": "eng.testb"}

    def __init__(self, name: str = "conll2003", types: Sequence[str] = CONLL2003_TYPES, *,
                 label_all_subwords: bool = False) -> None:
        self.name = name
        self.labels = bio_labels(types)
        self.label_all_subwords = label_all_subwords

    def path(self, data: str, split: str) -> Path:
        if split not in self.files:
            raise ConfigError(f"{self.name}: no split {split!r} (known: {', '.join(self.files)})")
        return Path(data) / self.files[split]

    def read(self, path: Path, limit: int | None = None) -> TaggedSentences:
        return read_tagged(path, self.labels, limit)

    def read_input(self, path: Path) -> TaggedSentences:
        """What ``bertology predict`` reads: a file of words only (untagged) or a tagged file (``read``)."""
        return read_words_or_tagged(path, self.labels)

    def label_names(self) -> tuple[str, ...]:
        return self.labels.names

    def heads(self, config: TransformerConfig) -> list[HeadSpec]:
        return [token_classifier_head(config, len(self.labels))]

    def objectives(self, heads: Sequence[HeadSpec]) -> list[TokenClassification | CRFTagging]:
        if heads[0].kind == "bilstm_crf":
            if self.label_all_subwords:
                raise ConfigError(f"{self.name}: a CRF tagger reads the words' first subwords only; it cannot be "
                                  "trained with label_all_subwords")
            return [CRFTagging(heads[0])]
        return [TokenClassification(heads[0])]

    def encode(self, tokenizer: Tokenizer, examples: Sequence[TaggedSentence], max_length: int, *, train: bool,
               seed: int = 0) -> TokenExamples:
        return encode_tagged(tokenizer, examples, self.labels, max_length, label_all_subwords=self.label_all_subwords,
                             shuffle=train, seed=seed)

    def predict(self, model: Model, encoded: TokenExamples, examples: Sequence[TaggedSentence],
                batch_size: int) -> list[list[str]]:
        if encoded.words != [len(s) for s in examples]:
            raise DataError(f"{self.name}: the encoded examples are not these sentences")
        names = self.labels.names
        return [[names[i] for i in ids.tolist()] for ids in
                predict_word_labels(model, encoded, batch_size, constraints=bio_constraints(self.labels))]

    def scores(self, predictions: Sequence[Sequence[str]], examples: Sequence[TaggedSentence]) -> dict[str, float]:
        result = metrics.conlleval([list(zip(s.tags or (), p, strict=True)) for s, p in
                                    zip(examples, predictions, strict=True)])
        return {"f1": result.f1, "precision": result.precision, "recall": result.recall}

    def write(self, path: Path, predictions: Sequence[Sequence[str]], examples: Sequence[TaggedSentence]) -> None:
        docstart = getattr(examples, "docstart", None)
        untagged = bool(examples) and all(s.tags is None for s in examples)
        lines = (predicted_lines if untagged else conlleval_lines)(predictions, examples, docstart)
        with atomic_write(path, "w", encoding="utf-8") as handle:
            for line in lines:
                handle.write(line + "\n")

    def evaluate(self, predictions_path: Path, gold_path: Path) -> dict[str, Any]:
        """conlleval of the predictions file (its gold tags are in it; ``gold_path`` is not read)."""
        return metrics.evaluate_files("conll", predictions_path)


CONLL2003 = TaggingTask()
