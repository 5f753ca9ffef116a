"""Vocabulary extension: a tokenizer grown by the frequent entries of a domain's own vocabulary.

Domain-adaptive pretraining with ``tokenizer.adapt: extend`` keeps every id of the model's tokenizer and appends
new entries after them (docs/ADAPTATION.md):

1. a tokenizer of the same kind is trained on the domain corpus (``train_tokenizer``, the model tokenizer's
   lower-casing);
2. its entries absent from the old vocabulary are ranked by how often they occur when it tokenises the corpus
   (ties by the entry's text), and the first ``size`` of them are appended (`domain_entries`);
3. they enter the old tokenizer's own model (`extend_tokenizer`), so that they are matched as the old entries are:
   a WordPiece entry by the greedy longest match (``##`` pieces inside a word), a byte-level BPE entry through the
   merge that makes it, appended after the old merges (an entry whose merge needs a part the vocabulary lacks is
   passed over);
4. `old_pieces` gives, for each new entry, the ids the old tokenizer splits it into: the rows whose mean becomes
   its embedding (`bertology.model.vocabulary.extend_vocabulary`).

The old ids must run 0..V-1 without gaps (every added token inside the model's vocabulary), so that the new
entries take the ids V, V+1, ...; the result may not exceed ``MAX_VOCAB_SIZE`` entries (the ids bertology's
tokenizers and shards hold)."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Sequence

import tokenizers

from bertology.errors import TokenizerError
from bertology.tokenization.tokenizer import Tokenizer
from bertology.tokenization.training import MAX_VOCAB_SIZE

__all__ = ["check_extension", "domain_entries", "extend_tokenizer", "lowercases", "old_pieces"]

EXTENDABLE_KINDS = ("wordpiece", "bpe")


def _state(tokenizer: Tokenizer) -> dict:
    return json.loads(tokenizer.backend.to_str())


def lowercases(tokenizer: Tokenizer) -> bool:
    """Whether ``tokenizer``'s normaliser lower-cases text (BERT's normaliser's option, or a Lowercase step)."""

    def lower(node: object) -> bool:
        if not isinstance(node, dict):
            return False
        if node.get("type") == "Lowercase" or (node.get("type") == "BertNormalizer" and node.get("lowercase")):
            return True
        return any(lower(child) for child in node.get("normalizers") or ())

    return lower(_state(tokenizer).get("normalizer"))


def check_extension(tokenizer: Tokenizer, size: int, where: str) -> None:
    """``tokenizer`` can take ``size`` new entries: a WordPiece or byte-level BPE kind, ids 0..V-1 without gaps, and
    V + size within ``MAX_VOCAB_SIZE``. ``where`` names the tokenizer in errors."""
    if tokenizer.kind not in EXTENDABLE_KINDS:
        raise TokenizerError(f"{where}: a {tokenizer.kind} tokenizer cannot be extended (WordPiece and byte-level "
                             f"BPE can)")
    if tokenizer.vocab_size + size > MAX_VOCAB_SIZE:
        raise TokenizerError(f"{where}: extending its {tokenizer.vocab_size} entries by {size} would give ids up to "
                             f"{tokenizer.vocab_size + size - 1}, past the id range of {MAX_VOCAB_SIZE} entries "
                             f"(tokenizer.extend_size at most {max(0, MAX_VOCAB_SIZE - tokenizer.vocab_size)})")
    vocab = tokenizer.backend.get_vocab(with_added_tokens=False)
    if len(vocab) != tokenizer.vocab_size or sorted(vocab.values()) != list(range(len(vocab))):
        raise TokenizerError(f"{where}: its ids do not run 0..{tokenizer.vocab_size - 1} inside the model's "
                             f"vocabulary (added tokens outside it, or gaps), so new entries have no place after them")


def domain_entries(old: Tokenizer, domain: Tokenizer, documents: Iterable[Sequence[str]], size: int) -> list[str]:
    """The ``size`` entries of ``domain``'s vocabulary that ``old``'s lacks, the most frequent first as ``domain``
    tokenises ``documents`` (lists of sentences; ties by the entry's text); specials and entries never produced
    are left out. For byte-level BPE only entries whose merge has both parts in the old vocabulary or among the
    entries taken before can be matched, so only those are taken."""
    old_vocab = old.backend.get_vocab(with_added_tokens=True)
    specials = {domain.backend.id_to_token(i) for i in domain.special_ids}
    counts: Counter[str] = Counter()
    batch: list[str] = []

    def count() -> None:
        for encoding in domain.backend.encode_batch(batch, add_special_tokens=False):
            counts.update(encoding.tokens)
        batch.clear()

    for document in documents:
        batch.extend(document)
        if len(batch) >= 1024:
            count()
    count()
    ranked = sorted((token for token in counts if token not in old_vocab and token not in specials),
                    key=lambda token: (-counts[token], token))
    if domain.kind != "bpe":
        return ranked[:size]
    made_by = _merges_by_result(_state(domain))
    known, taken = set(old_vocab), []
    for token in ranked:
        if len(taken) == size:
            break
        parts = made_by.get(token)
        if parts is not None and parts[0] in known and parts[1] in known:
            taken.append(token)
            known.add(token)
    return taken


def _merges(state: dict) -> list[tuple[str, str]]:
    return [tuple(m.split(" ", 1)) if isinstance(m, str) else (m[0], m[1]) for m in state["model"]["merges"]]


def _merges_by_result(state: dict) -> dict[str, tuple[str, str]]:
    made: dict[str, tuple[str, str]] = {}
    for first, second in _merges(state):
        made.setdefault(first + second, (first, second))
    return made


def extend_tokenizer(old: Tokenizer, entries: Sequence[str], domain: Tokenizer | None = None) -> Tokenizer:
    """``old`` with ``entries`` appended to its model's vocabulary (ids ``old.vocab_size`` on, in order); for
    byte-level BPE the merge making each entry (``domain``'s) is appended after the old merges."""
    where = old.source or "tokenizer"
    check_extension(old, len(entries), where)
    state = _state(old)
    vocab = state["model"]["vocab"]
    repeated = [entry for entry in entries if entry in vocab]
    if repeated or len(set(entries)) != len(entries):
        first = (repeated or entries)[0]
        raise TokenizerError(f"{where}: the new entries repeat one of its own or each other ({first!r})")
    if old.kind == "bpe":
        if domain is None:
            raise TokenizerError("a byte-level BPE tokenizer is extended with the merges of the domain's tokenizer")
        made_by = _merges_by_result(_state(domain))
        merges = state["model"]["merges"]
        as_strings = bool(merges) and isinstance(merges[0], str)
        for entry in entries:
            if entry not in made_by:
                raise TokenizerError(f"{where}: no merge of the domain tokenizer makes the new entry {entry!r}")
            first, second = made_by[entry]
            merges.append(f"{first} {second}" if as_strings else [first, second])
    for offset, entry in enumerate(entries):
        vocab[entry] = old.vocab_size + offset
    backend = tokenizers.Tokenizer.from_str(json.dumps(state))
    return Tokenizer(backend, style=old.style, specials=old.specials, model_max_length=old.model_max_length,
                     trim_offsets=old.trim_offsets, source=old.source)


def old_pieces(old: Tokenizer, entry: str) -> list[int]:
    """The ids of the pieces ``old`` splits the vocabulary entry ``entry`` into (its normalised, pre-tokenised form,
    as the entry is stored): WordPiece's greedy longest match (a ``##`` entry as the inside of a word), BPE's merges;
    ``[unk]``'s id alone where WordPiece cannot split it."""
    if old.kind == "wordpiece":
        model = _state(old)["model"]
        vocab, prefix = model["vocab"], model.get("continuing_subword_prefix") or "##"
        inside = entry.startswith(prefix) and len(entry) > len(prefix)
        word = entry[len(prefix):] if inside else entry
        pieces, start = [], 0
        while start < len(word):
            for end in range(len(word), start, -1):
                piece = (prefix if start > 0 or inside else "") + word[start:end]
                if piece in vocab:
                    pieces.append(vocab[piece])
                    start = end
                    break
            else:
                unk = old.unk_id
                if unk is None:
                    raise TokenizerError(f"{old.source or 'tokenizer'}: cannot split {entry!r} and has no unknown "
                                         "token")
                return [unk]
        return pieces
    return [token.id for token in old.backend.model.tokenize(entry)]
