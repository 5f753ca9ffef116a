"""Pretraining instances from tokenised documents.

The kinds:

* ``nsp``: BERT segment pairs with next-sentence prediction, following the logic of BERT's
  ``create_pretraining_data.py``: a target length per document (short with probability ``short_seq_prob``),
  sentences gathered into a chunk up to that length, a random split point into A and B, B replaced by text from a
  random other document half of the time (the unused sentences of the chunk are put back), and pair truncation
  from the longer side, front or back at random.
* ``segment-pair``: the same chunks without the random-next replacement (plain MLM); a chunk of one sentence
  becomes a single-segment instance.
* ``sop`` (ALBERT's sentence order): the same chunks, A and B swapped with probability 1/2 (label 1 = swapped),
  following ALBERT's ``create_pretraining_data.py``: as there, a chunk of one sentence takes its B from a random
  other document and is labelled 1.
* ``full-sentences`` (RoBERTa): contiguous sentences packed up to ``max_seq_length - 2`` tokens, crossing document
  boundaries with an extra separator between documents.
* ``doc-sentences`` (RoBERTa): the same packing, never crossing a document boundary.
* ``packed-documents`` (GPT-2's causal LM): every document framed on its own (the tokenizer's framing of one
  text, e.g. ``<s> ... </s>``), the framed documents laid end to end and cut into rows of exactly
  ``max_seq_length`` tokens (the last row shorter), a document continuing in the next row where it does not fit.
  Every token carries the id of its document (``Instance.document_ids``), so that attention and next-token
  prediction stay inside each document (``bertology.data.causal``).
* ``word-stream`` (ELMo): not made here. Documents become streams of words read in windows of ``max_seq_length``
  words by a bidirectional LM with truncated backpropagation (``bertology.data.word_streams``).
* ``segment-stream`` (XLNet with memory): not made here. Documents become consecutive segments that each batch row
  reads in order, so that the model's memory carries from one batch to the next (``bertology.data.segment_streams``).

Everything is deterministic given ``(seed, duplicate)``; the document order is shuffled per duplicate.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, Protocol, get_args, runtime_checkable

import numpy as np

from bertology.config import derived, from_mapping, validate
from bertology.errors import ConfigError, DataError
from bertology.tokenization.framing import Framing

Style = Literal["bert", "roberta"]
STYLES: tuple[str, ...] = get_args(Style)
Kind = Literal["nsp", "segment-pair", "sop", "full-sentences", "doc-sentences", "packed-documents", "word-stream",
               "segment-stream"]
KINDS: tuple[str, ...] = get_args(Kind)

# Keeps the instance stream apart from the other streams derived from the same user seed (see dataset.py).
_INSTANCE_STREAM = 1


def derive_seed(*parts: int) -> int:
    """A 64-bit seed that is a deterministic function of non-negative integers ``parts``."""
    state = np.random.SeedSequence([int(p) for p in parts]).generate_state(2, dtype=np.uint32)
    return int(state[0]) << 32 | int(state[1])


@dataclass(frozen=True)
class SpecialTokens(Framing):
    """A BERT-family framing from ids alone, every token present: ``bert`` frames a pair
    ``[CLS] A [SEP] B [SEP]`` with segment ids 0 / 1, ``roberta`` ``<s> A </s></s> B </s>``, all 0. Any other
    framing (GPT-2 without specials, XLNet's summary token last) comes from its tokenizer: ``Tokenizer.framing``.
    """

    cls_id: int
    sep_id: int
    pad_id: int
    mask_id: int
    style: Style = "bert"

    _STYLES: ClassVar[tuple[str, ...]] = STYLES

    @classmethod
    def from_tokenizer(cls, tokenizer: Any) -> SpecialTokens:
        """The ids and layout of a ``bertology.tokenization.Tokenizer`` (anything with the same attributes)."""
        missing = [a for a in ("cls_id", "sep_id", "pad_id", "mask_id", "style") if getattr(tokenizer, a, None) is None]
        if missing:
            raise ConfigError(f"SpecialTokens.from_tokenizer: the tokenizer has no {', '.join(missing)}")
        return cls(tokenizer.cls_id, tokenizer.sep_id, tokenizer.pad_id, tokenizer.mask_id, tokenizer.style)


@runtime_checkable
class DocumentSource(Protocol):
    """Random access to tokenised documents (sentences of token ids without specials)."""

    def __len__(self) -> int: ...

    def document(self, i: int) -> list[np.ndarray]: ...

    def word_starts(self, i: int) -> list[np.ndarray]: ...


class InMemoryDocuments:
    """A DocumentSource over Python lists; ``word_starts`` defaults to every token starting a word."""

    def __init__(
        self,
        documents: Sequence[Sequence[Sequence[int] | np.ndarray]],
        word_starts: Sequence[Sequence[Sequence[bool] | np.ndarray]] | None = None,
    ) -> None:
        self._docs = [[np.asarray(s, dtype=np.int64).reshape(-1) for s in doc] for doc in documents]
        if word_starts is None:
            self._starts = [[np.ones(len(s), dtype=bool) for s in doc] for doc in self._docs]
        else:
            if len(word_starts) != len(self._docs):
                raise DataError(f"word_starts: {len(word_starts)} documents for {len(self._docs)} documents of ids")
            self._starts = [[np.asarray(s, dtype=bool).reshape(-1) for s in doc] for doc in word_starts]

    def __len__(self) -> int:
        return len(self._docs)

    def document(self, i: int) -> list[np.ndarray]:
        return self._docs[i]

    def word_starts(self, i: int) -> list[np.ndarray]:
        return self._starts[i]


@dataclass
class Instance:
    """One pretraining sequence framed with its specials; ``word_starts`` is False at specials.
    ``sentence_starts``: True at the first token of each sentence, for the packed kinds (else None)."""

    input_ids: np.ndarray
    token_type_ids: np.ndarray
    word_starts: np.ndarray
    is_random_next: bool | None = None
    document_ids: np.ndarray | None = None  # packed documents: the document of every token
    sentence_starts: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.input_ids)


@dataclass
class InstanceConfig:
    """How instances are cut from documents (the run config's ``data.instances``).

    ``nsp`` follows ``kind`` (True for ``nsp``, False otherwise); in Python, ``segment-pair`` with ``nsp=True`` is
    the same as ``nsp``. ``short_seq_prob`` only applies to the segment-pair kinds. ``dupe_factor`` is the number of
    distinct instance lists (and static masks) cycled through across epochs. ``seed`` is set by the code that makes
    the dataset (the pretrain recipe passes ``run.seed``), never by a config file.
    """

    kind: Kind = "nsp"
    max_seq_length: int = 128
    short_seq_prob: float = 0.1
    nsp: bool | None = derived(None, "it follows kind ('nsp': segment pairs with next-sentence prediction)")
    dupe_factor: int = 1
    seed: int = derived(0, "the seed is run.seed")

    def __post_init__(self) -> None:
        where = "InstanceConfig"
        validate(self, where)
        if self.nsp is None:
            self.nsp = self.kind == "nsp"
        if self.kind == "nsp" and not self.nsp:
            raise ConfigError(f"{where}.nsp: kind 'nsp' needs nsp=True (use kind 'segment-pair' without NSP)")
        if self.nsp and self.kind not in ("nsp", "segment-pair"):
            raise ConfigError(f"{where}.nsp: next-sentence prediction needs segment pairs, not kind {self.kind!r}")
        # Pairs need room for 4 specials (RoBERTa's framing) and two tokens of text.
        if self.max_seq_length < 6:
            raise ConfigError(f"{where}.max_seq_length: must be >= 6, got {self.max_seq_length}")
        if not 0.0 <= self.short_seq_prob <= 1.0:
            raise ConfigError(f"{where}.short_seq_prob: must be in [0, 1], got {self.short_seq_prob}")
        if self.dupe_factor < 1:
            raise ConfigError(f"{where}.dupe_factor: must be >= 1, got {self.dupe_factor}")
        if not 0 <= self.seed < 2**63:
            raise ConfigError(f"{where}.seed: must be in [0, 2**63), got {self.seed}")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> InstanceConfig:
        return from_mapping(cls, data, "instances")

    @property
    def sentence_labels(self) -> bool:
        """Instances carry a sentence-relation label: next sentence (``nsp``) or sentence order (``sop``)."""
        return bool(self.nsp) or self.kind == "sop"

    @property
    def pairs(self) -> bool:
        """Instances are segment pairs (BERT's chunks), not packed sentences."""
        return self.kind in ("nsp", "segment-pair", "sop")


@dataclass
class InstanceStats:
    """Counts from one pass of instance creation (what was skipped and why)."""

    documents: int = 0
    empty_documents: int = 0  # no tokens at all: skipped, as BERT does
    empty_sentences: int = 0  # zero-length sentences: skipped
    single_sentence_documents: int = 0
    # Chunks of one sentence: under NSP their B is always a random next segment (as in BERT), else they are
    # single-segment instances.
    single_sentence_chunks: int = 0
    short_targets: int = 0  # documents that drew a short target length
    split_sentences: int = 0  # sentences longer than the packing budget, split into pieces
    truncated_tokens: int = 0
    instances: int = 0
    random_next: int = 0

    def as_dict(self) -> dict[str, int]:
        return dataclasses.asdict(self)


# A document: (token ids, word starts) per non-empty sentence.
_Document = list[tuple[np.ndarray, np.ndarray]]


def _source_name(source: DocumentSource) -> str:
    path = getattr(source, "path", None) or getattr(source, "directory", None)
    return f"{path}: " if path is not None else ""


def _load_documents(source: DocumentSource, stats: InstanceStats) -> list[_Document]:
    """Read and check every document; empty sentences and documents are dropped and counted."""
    name = _source_name(source)
    documents: list[_Document] = []
    for i in range(len(source)):
        sentences = source.document(i)
        starts = source.word_starts(i)
        if len(sentences) != len(starts):
            raise DataError(f"{name}document {i}: {len(sentences)} sentences but {len(starts)} word-start arrays")
        doc: _Document = []
        for j, (ids, ws) in enumerate(zip(sentences, starts)):
            ids = np.asarray(ids)
            ws = np.asarray(ws)
            if ids.ndim != 1 or not np.issubdtype(ids.dtype, np.integer):
                raise DataError(f"{name}document {i} sentence {j}: token ids must be a 1-D integer array, "
                                f"got shape {ids.shape} dtype {ids.dtype}")
            if ws.shape != ids.shape:
                raise DataError(f"{name}document {i} sentence {j}: {ids.shape[0]} token ids but "
                                f"{ws.reshape(-1).shape[0]} word starts")
            if len(ids) and ids.min() < 0:
                raise DataError(f"{name}document {i} sentence {j}: negative token id {int(ids.min())}")
            if len(ids) == 0:
                stats.empty_sentences += 1
                continue
            doc.append((ids.astype(np.int64, copy=False), ws.astype(bool, copy=False)))
        stats.documents += 1
        if not doc:
            stats.empty_documents += 1
            continue
        if len(doc) == 1:
            stats.single_sentence_documents += 1
        documents.append(doc)
    return documents


def create_instances(
    source: DocumentSource, config: InstanceConfig, special: Framing, duplicate: int = 0
) -> tuple[list[Instance], InstanceStats]:
    """All instances of one duplicate (a deterministic function of ``config.seed`` and ``duplicate``), framed by
    ``special`` (`SpecialTokens`, or any tokenizer's ``framing``: room is left for its specials around one text or
    a pair, and packed documents are separated by its separator, back to back without one).

    Instances come in shuffled document order; shuffling the instances themselves is left to the reader.
    Raises DataError when the corpus cannot give any (useful) instance, saying why, and TokenizerError when a
    sentence-relation label is asked of a framing without a separator.
    """
    if config.kind == "word-stream":
        raise ConfigError("InstanceConfig.kind 'word-stream' makes word streams (bertology.data.word_streams."
                          "WordStreams), not subword instances")
    if config.kind == "segment-stream":
        raise ConfigError("InstanceConfig.kind 'segment-stream' makes segment streams (bertology.data."
                          "segment_streams.SegmentStreams), not instances")
    if config.sentence_labels and special.sep_id is None:
        raise special.missing("sep", "next-sentence prediction" if config.nsp else "sentence order prediction")
    if config.max_seq_length <= special.overhead(config.pairs) + 1:
        raise ConfigError(f"InstanceConfig.max_seq_length: {config.max_seq_length} leaves no room for two tokens "
                          f"beside the {special.overhead(config.pairs)} specials of the {special.style} framing")
    stats = InstanceStats()
    documents = _load_documents(source, stats)
    name = _source_name(source)
    if not documents:
        raise DataError(f"{name}the corpus has no tokens: {stats.documents} document(s), "
                        f"{stats.empty_documents} empty, {stats.empty_sentences} empty sentence(s)")
    if config.kind == "sop" and len(documents) < 2:
        raise DataError(f"{name}sentence-order instances (kind 'sop') need at least two non-empty documents: as "
                        f"in ALBERT, a one-sentence chunk takes its second segment from another document; the "
                        f"corpus has {len(documents)}")
    if config.nsp:
        if len(documents) < 2:
            raise DataError(f"{name}NSP needs at least two non-empty documents to draw random next segments; "
                            f"the corpus has {len(documents)}")
        if stats.single_sentence_documents == len(documents):
            raise DataError(f"{name}every document has one sentence; NSP needs two (the label would always be "
                            f"'random next'). Mark document boundaries with blank lines only between documents.")
    rng = random.Random(derive_seed(config.seed, _INSTANCE_STREAM, duplicate))
    rng.shuffle(documents)
    instances: list[Instance] = []
    if config.pairs:
        for index in range(len(documents)):
            _segment_pairs(documents, index, config, special, rng, stats, instances)
    elif config.kind == "packed-documents":
        _pack_documents(documents, config, special, instances)
    else:
        _pack(documents, config, special, stats, instances, cross_documents=config.kind == "full-sentences")
    stats.instances = len(instances)
    stats.random_next = sum(1 for inst in instances if inst.is_random_next)
    return instances, stats


def _concat(sentences: Sequence[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    return np.concatenate([s[0] for s in sentences]), np.concatenate([s[1] for s in sentences])


def truncation_amounts(len_a: int, len_b: int, max_tokens: int) -> tuple[int, int]:
    """Tokens BERT's truncate_seq_pair removes from A and from B: one at a time from the longer segment (from B
    on ties) until the pair fits, in closed form."""
    excess = max(0, len_a + len_b - max_tokens)
    gap = min(excess, abs(len_a - len_b))
    rest = excess - gap  # removed alternately once the lengths are equal, B first
    if len_a > len_b:
        return gap + rest // 2, (rest + 1) // 2
    return rest // 2, gap + (rest + 1) // 2


def _truncate_pair(len_a: int, len_b: int, max_tokens: int,
                   rng: random.Random) -> tuple[tuple[int, int], tuple[int, int]]:
    """(front, back) cut counts per segment; each removed token is from the front or the back with probability
    1/2, as in BERT, so the front count is a fair binomial (a popcount of random bits)."""
    cuts = []
    for amount in truncation_amounts(len_a, len_b, max_tokens):
        front = rng.getrandbits(amount).bit_count() if amount else 0
        cuts.append((front, amount - front))
    return cuts[0], cuts[1]


def _cut(ids: np.ndarray, starts: np.ndarray, cut: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    end = len(ids) - cut[1]
    return ids[cut[0]:end], starts[cut[0]:end]


def _build(special: Framing, a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray] | None,
           is_random_next: bool | None) -> Instance:
    """Frame one or two segments with the family's specials (`Framing.pieces`)."""
    texts = (a, b)
    ids, types, starts = [], [], []
    for piece in special.pieces(b is not None):
        if piece.text is None:
            ids.append(np.asarray(piece.ids, dtype=np.int64))
            starts.append(np.zeros(len(piece.ids), dtype=bool))
        else:
            ids.append(texts[piece.text][0])
            starts.append(texts[piece.text][1])
        types.append(np.full(len(ids[-1]), piece.segment, dtype=np.int64))
    return Instance(np.concatenate(ids), np.concatenate(types), np.concatenate(starts), is_random_next)


def _segment_pairs(documents: list[_Document], index: int, config: InstanceConfig, special: Framing,
                   rng: random.Random, stats: InstanceStats, out: list[Instance]) -> None:
    """Instances of document ``index``: BERT's create_instances_from_document (ALBERT's, for ``sop``)."""
    document = documents[index]
    sop = config.kind == "sop"
    max_num_tokens = config.max_seq_length - special.overhead(pair=True)
    # Mostly fill the whole sequence; sometimes (short_seq_prob) use a shorter one so that pretraining also sees
    # the short inputs of fine-tuning. Drawn once per document, as in BERT.
    target = max_num_tokens
    if rng.random() < config.short_seq_prob:
        target = rng.randint(2, max_num_tokens)
        stats.short_targets += 1
    chunk: list[tuple[np.ndarray, np.ndarray]] = []
    length = 0
    i = 0
    while i < len(document):
        chunk.append(document[i])
        length += len(document[i][0])
        if i == len(document) - 1 or length >= target:
            a_end = rng.randint(1, len(chunk) - 1) if len(chunk) >= 2 else 1
            a = _concat(chunk[:a_end])
            if len(chunk) == 1:
                stats.single_sentence_chunks += 1
            b: tuple[np.ndarray, np.ndarray] | None
            is_random_next: bool | None = None
            if config.nsp and (len(chunk) == 1 or rng.random() < 0.5):
                is_random_next = True
                b = _random_segment(documents, index, target - len(a[0]), rng)
                # The sentences of this chunk that B did not use start the next chunk.
                i -= len(chunk) - a_end
            elif sop and len(chunk) == 1:
                # ALBERT's create_pretraining_data does this too: one segment, B from a random other document.
                is_random_next = True
                b = _random_segment(documents, index, target - len(a[0]), rng)
            elif sop and rng.random() < 0.5:
                is_random_next = True  # label 1: the two segments in swapped order
                a, b = _concat(chunk[a_end:]), a
            elif len(chunk) >= 2:
                is_random_next = False if config.sentence_labels else None
                b = _concat(chunk[a_end:])
            else:
                b = None
            if b is None:
                budget = config.max_seq_length - special.overhead(pair=False)
                cut, _ = _truncate_pair(len(a[0]), 0, budget, rng)
                stats.truncated_tokens += sum(cut)
                out.append(_build(special, _cut(*a, cut), None, None))
            else:
                cut_a, cut_b = _truncate_pair(len(a[0]), len(b[0]), max_num_tokens, rng)
                stats.truncated_tokens += sum(cut_a) + sum(cut_b)
                out.append(_build(special, _cut(*a, cut_a), _cut(*b, cut_b), is_random_next))
            chunk = []
            length = 0
        i += 1


def _random_segment(documents: list[_Document], index: int, target_length: int,
                    rng: random.Random) -> tuple[np.ndarray, np.ndarray]:
    """Sentences of a random other document from a random start, up to ``target_length`` tokens (at least one)."""
    other = index
    for _ in range(10):  # BERT's retries
        other = rng.randint(0, len(documents) - 1)
        if other != index:
            break
    if other == index:
        # BERT would use the same document here; a "random next" from it would be a wrong label.
        other = rng.randint(0, len(documents) - 2)
        other += other >= index
    document = documents[other]
    taken: list[tuple[np.ndarray, np.ndarray]] = []
    length = 0
    for j in range(rng.randint(0, len(document) - 1), len(document)):
        taken.append(document[j])
        length += len(document[j][0])
        if length >= target_length:
            break
    return _concat(taken)


def _pack(documents: list[_Document], config: InstanceConfig, special: Framing, stats: InstanceStats,
          out: list[Instance], cross_documents: bool) -> None:
    """RoBERTa FULL-SENTENCES (``cross_documents``) or DOC-SENTENCES packing, greedy in corpus order."""
    budget = config.max_seq_length - special.overhead(pair=False)
    brk = special.document_break
    separator = (np.array(brk, dtype=np.int64), np.zeros(len(brk), dtype=bool))
    pieces: list[tuple[np.ndarray, np.ndarray]] = []
    length = 0

    def emit() -> None:
        nonlocal pieces, length
        if pieces:
            ids, starts = _concat(pieces)
            instance = _build(special, (ids, starts), None, None)
            # A sentence (or a piece of a split one) starts at each piece's first token; a separator starts none.
            firsts = np.concatenate([(np.arange(len(p[0])) == 0) & (p is not separator) for p in pieces])
            instance.sentence_starts = _build(special, (ids, firsts), None, None).word_starts
            out.append(instance)
        pieces, length = [], 0

    for document in documents:
        starts_document = True
        for ids, starts in document:
            if len(ids) > budget:
                stats.split_sentences += 1
            for begin in range(0, len(ids), budget):
                piece = (ids[begin:begin + budget], starts[begin:begin + budget])
                # The extra separator marks a document boundary inside a sequence, never at its start.
                needs_separator = starts_document and length > 0 and len(brk) > 0
                if length + needs_separator * len(brk) + len(piece[0]) > budget:
                    emit()
                    needs_separator = False
                if needs_separator:
                    pieces.append(separator)
                    length += len(brk)
                pieces.append(piece)
                length += len(piece[0])
                starts_document = False
        if not cross_documents:
            emit()
    emit()


def _pack_documents(documents: list[_Document], config: InstanceConfig, special: Framing, out: list[Instance]) -> None:
    """``packed-documents``: each document framed as one text, all laid end to end, cut every ``max_seq_length``
    tokens; a token's document id is the document's index in the (shuffled) order."""
    ids, types, starts, owners = [], [], [], []
    for index, document in enumerate(documents):
        framed = _build(special, _concat(document), None, None)
        ids.append(framed.input_ids)
        types.append(framed.token_type_ids)
        starts.append(framed.word_starts)
        owners.append(np.full(len(framed.input_ids), index, dtype=np.int64))
    stream = [np.concatenate(parts) for parts in (ids, types, starts, owners)]
    for begin in range(0, len(stream[0]), config.max_seq_length):
        row = [part[begin:begin + config.max_seq_length] for part in stream]
        out.append(Instance(row[0], row[1], row[2], None, row[3]))
