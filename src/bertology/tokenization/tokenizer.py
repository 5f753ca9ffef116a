"""The Tokenizer: a typed wrapper over a ``tokenizers.Tokenizer`` that encodes texts, pairs and pre-split words with
offsets and word ids, pads batches into tensors, and saves in the Hugging Face file layout."""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tokenizers
import torch

from bertology.errors import TokenizerError
from bertology.io import atomic_directory, atomic_write, file_in_the_way
from bertology.tokenization._pipeline import (
    MODEL_TYPE_TO_KIND,
    SpecialTokenTexts,
    byte_level_prefix_space,
    check_choice,
    transformers_class,
    with_byte_level_prefix_space,
)
from bertology.tokenization.framing import FRAMINGS, Framing

# Rounds of save/load after which a definition reads back unchanged (one is enough in every case measured).
_SETTLE_ROUNDS = 4


def as_saved(backend: tokenizers.Tokenizer) -> tokenizers.Tokenizer:
    """``backend`` as it reads back from its own JSON: what a saved copy loads as.

    The tokenizers library writes a float with the shortest digits that name it, but its JSON reader rounds some
    17-digit numbers to a neighbouring double: a Unigram model just trained and its saved copy differ in the last
    digit of some scores (532 of 3,000 on Brown) until it has been through one save and load, after which another
    changes nothing. WordPiece and BPE definitions hold no floats and are returned as they are."""
    if type(backend.model).__name__ != "Unigram":
        return backend
    text = backend.to_str()
    for _ in range(_SETTLE_ROUNDS):
        reloaded = tokenizers.Tokenizer.from_str(text)
        again = reloaded.to_str()
        if again == text:
            return reloaded
        backend, text = reloaded, again
    raise TokenizerError(f"the tokenizer's definition still changes after {_SETTLE_ROUNDS} rounds of save and load")


TRUNCATION_STRATEGIES: tuple[str, ...] = ("longest_first", "only_first", "only_second")
PADDING_STRATEGIES: tuple[str, ...] = ("longest", "max_length")


def backend_of(tokenizer: Any) -> tokenizers.Tokenizer:
    """The ``tokenizers.Tokenizer`` behind a bertology ``Tokenizer`` (or the backend itself)."""
    backend = getattr(tokenizer, "backend", tokenizer)
    if not (hasattr(backend, "encode_batch") and hasattr(backend, "to_str")):
        raise TokenizerError(
            f"expected a bertology Tokenizer or a tokenizers.Tokenizer, got {type(tokenizer).__name__}"
        )
    return backend


def tokenizer_fingerprint(tokenizer: Any) -> str:
    """SHA-256 of the tokenizer's JSON definition as a saved copy of it loads (``as_saved``: a Unigram model's
    scores read back rounded in the last digit), ignoring runtime padding and truncation settings: a tokenizer,
    its saved copy and that copy loaded again have one fingerprint."""
    definition = json.loads(as_saved(backend_of(tokenizer)).to_str())
    definition.pop("padding", None)
    definition.pop("truncation", None)
    canonical = json.dumps(definition, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class Encoding:
    """One encoded text or text pair. ``offsets`` are character offsets into the text each token came from (for
    pre-split words: into that word); specials have offset (0, 0), word id None and sequence id None."""

    ids: list[int]
    tokens: list[str]
    type_ids: list[int]
    offsets: list[tuple[int, int]]
    word_ids: list[int | None]
    sequence_ids: list[int | None]
    special_tokens_mask: list[int]

    def __len__(self) -> int:
        return len(self.ids)

    @classmethod
    def from_backend(cls, encoding: tokenizers.Encoding) -> Encoding:
        return cls(
            ids=list(encoding.ids),
            tokens=list(encoding.tokens),
            type_ids=list(encoding.type_ids),
            offsets=encoding.offsets,  # already a list of (int, int) tuples
            word_ids=list(encoding.word_ids),
            sequence_ids=list(encoding.sequence_ids),
            special_tokens_mask=list(encoding.special_tokens_mask),
        )


@dataclass
class Batch:
    """A padded batch: ``input_ids``, ``attention_mask`` (1 = real token), ``token_type_ids``, all [B, L]; padded
    on the right, or on the left for a framing that pads left (XLNet)."""

    input_ids: torch.LongTensor
    attention_mask: torch.LongTensor
    token_type_ids: torch.LongTensor
    encodings: list[Encoding]


class Tokenizer:
    """Encodes text for a transformer family. ``style`` names the family's framing (`bertology.tokenization.
    framing`), which fixes how specials wrap a text or pair: "bert" gives ``[CLS] a [SEP] b [SEP]`` with type ids
    0/1, "roberta" gives ``<s> a </s></s> b </s>`` with type ids 0, "xlnet" ``a <sep> b <sep> <cls>``, ...
    ``self.framing`` holds the layout with this tokenizer's ids. Padding and truncation are chosen per call; none
    is baked into the backend.

    ``specials`` names the token of each role (None: the tokenizer has none); every named token must be in the
    vocabulary, and so must every role the family needs. ``source`` (the file it came from) is named in errors.

    The ``backend`` is taken over: its post-processor, padding and truncation are replaced. Truncation is set on it
    per call, so one Tokenizer must not be used from several threads at once."""

    def __init__(
        self,
        backend: tokenizers.Tokenizer,
        *,
        style: str,
        specials: SpecialTokenTexts,
        model_max_length: int | None = None,
        trim_offsets: bool = True,
        source: str | os.PathLike | None = None,
    ) -> None:
        self.style = check_choice(style, tuple(FRAMINGS), "tokenizer style")  # registered framings included
        self.source = str(source) if source is not None else None
        where = self.source or "tokenizer"
        model_type = type(backend.model).__name__
        if model_type not in MODEL_TYPE_TO_KIND:
            raise TokenizerError(f"unsupported tokenizer model {model_type!r}; expected WordPiece, BPE or Unigram")
        self.kind: str = MODEL_TYPE_TO_KIND[model_type]
        layout = FRAMINGS[self.style]
        absent = [role for role in layout.needs if getattr(specials, role) is None]
        if absent:
            raise TokenizerError(f"{where}: the {self.style} framing needs a {absent[0]} token; none is named")
        missing = [(role, t) for role, t in specials.roles().items() if backend.token_to_id(t) is None]
        if missing:
            named = ", ".join(f"{role} token {t!r}" for role, t in missing)
            raise TokenizerError(f"{where}: the {self.style} framing's {named} not in the vocabulary")
        self.specials = specials
        self.model_max_length = model_max_length
        self.trim_offsets = trim_offsets
        # Specials must be matched whole in raw text (never split or lower-cased), as transformers does.
        registered = {t.content for t in backend.get_added_tokens_decoder().values() if t.special}
        backend.add_special_tokens(
            [tokenizers.AddedToken(t, special=True, normalized=False) for t in specials.as_list() if t not in registered]
        )
        backend.no_padding()
        backend.no_truncation()
        ids = {role: backend.token_to_id(t) for role, t in specials.roles().items()}
        sentinels: list[int] = []
        while layout.sentinels is not None:
            found = backend.token_to_id(layout.sentinels.format(len(sentinels)))
            if found is None:
                break
            sentinels.append(found)
        self.framing = Framing(ids.get("cls"), ids.get("sep"), ids.get("pad"), ids.get("mask"), self.style,
                               tuple(sentinels), source=self.source)
        # Only byte-level BPE has a prefix-space setting; serialising a big vocabulary to find it is not free.
        self._add_prefix_space = self.kind == "bpe" and byte_level_prefix_space(json.loads(backend.to_str()))
        backend.post_processor = self._post_processor(backend, self._add_prefix_space)
        self.backend = backend
        self._word_backend: tokenizers.Tokenizer | None = None

    # ----------------------------------------------------------------- vocabulary
    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    # A role's token and id are None where the tokenizer has no such token (GPT-2 has no [CLS]/[SEP]/[MASK]).
    @property
    def cls_token(self) -> str | None:
        return self.specials.cls

    @property
    def sep_token(self) -> str | None:
        return self.specials.sep

    @property
    def pad_token(self) -> str | None:
        return self.specials.pad

    @property
    def mask_token(self) -> str | None:
        return self.specials.mask

    @property
    def unk_token(self) -> str | None:
        return self.specials.unk

    @property
    def cls_id(self) -> int | None:
        return self.framing.cls_id

    @property
    def sep_id(self) -> int | None:
        return self.framing.sep_id

    @property
    def pad_id(self) -> int | None:
        return self.framing.pad_id

    @property
    def fill_id(self) -> int:
        """The id a padded batch puts at its padding: the pad token, else 0 (a GPT-2 tokenizer names none; the
        attention mask hides the padding, so any id will do)."""
        return self.framing.fill_id

    @property
    def padding_side(self) -> str:
        """Where batches of this tokenizer's rows are padded: "right", or "left" (XLNet)."""
        return self.framing.padding_side

    @property
    def mask_id(self) -> int | None:
        return self.framing.mask_id

    @property
    def unk_id(self) -> int | None:
        return None if self.specials.unk is None else self.backend.token_to_id(self.specials.unk)

    @property
    def special_ids(self) -> frozenset[int]:
        added = {i for i, token in self.backend.get_added_tokens_decoder().items() if token.special}
        named = {self.backend.token_to_id(t) for t in self.specials.as_list()}
        return frozenset(added | named | self.framing.ids)

    def token_to_id(self, token: str) -> int | None:
        return self.backend.token_to_id(token)

    def id_to_token(self, id: int) -> str | None:
        return self.backend.id_to_token(id) if 0 <= id < self.vocab_size else None

    def __repr__(self) -> str:
        return f"Tokenizer(kind={self.kind!r}, style={self.style!r}, vocab_size={self.vocab_size})"

    # ----------------------------------------------------------------- encoding
    def encode(
        self,
        text: str,
        pair: str | None = None,
        *,
        add_special_tokens: bool = True,
        max_length: int | None = None,
        truncation: str = "longest_first",
    ) -> Encoding:
        """Encode a text or a text pair. With ``max_length`` the result (specials included) is truncated to it.
        An empty ``pair`` still gives the pair layout (``[CLS] a [SEP] [SEP]``); transformers would drop it."""
        _check_text(text, "text")
        if pair is not None:
            _check_text(pair, "pair")
        self._set_truncation(max_length, truncation, has_pair=pair is not None)
        try:
            encoding = self.backend.encode(text, pair, add_special_tokens=add_special_tokens)
        except Exception as error:  # the Rust library raises plain Exceptions
            raise TokenizerError(f"cannot encode (max_length={max_length}, truncation={truncation}): {error}") from None
        return Encoding.from_backend(encoding)

    def encode_words(
        self,
        words: Sequence[str],
        pair: Sequence[str] | None = None,
        *,
        add_special_tokens: bool = True,
        max_length: int | None = None,
        truncation: str = "longest_first",
    ) -> Encoding:
        """Encode pre-split words; ``word_ids`` index ``words`` (and ``pair``) and offsets are into each word.
        Byte-level BPE encodes every word as if preceded by a space (transformers' ``add_prefix_space=True``)."""
        for name, value in (("words", words), ("pair", pair)):
            if value is None:
                continue
            if isinstance(value, str) or not all(isinstance(w, str) for w in value):
                raise TokenizerError(f"encode_words: {name} must be a list of strings, got {type(value).__name__}")
        backend = self._words_backend()
        self._set_truncation(max_length, truncation, has_pair=pair is not None, backend=backend)
        try:
            encoding = backend.encode(list(words), list(pair) if pair is not None else None, is_pretokenized=True,
                                      add_special_tokens=add_special_tokens)
        except Exception as error:
            raise TokenizerError(f"cannot encode words (max_length={max_length}, truncation={truncation}): {error}") from None
        return Encoding.from_backend(encoding)

    def encode_batch(
        self,
        texts: Sequence[str],
        pairs: Sequence[str] | None = None,
        *,
        add_special_tokens: bool = True,
        max_length: int | None = None,
        truncation: str = "longest_first",
        padding: str = "longest",
        pad_to_multiple_of: int | None = None,
    ) -> Batch:
        """Encode texts (or text pairs) and pad them into [B, L] tensors on the framing's side (the pad token's id,
        0 without one). ``padding="longest"`` pads to the
        longest row, ``"max_length"`` to ``max_length``; ``pad_to_multiple_of`` then rounds L up."""
        check_choice(padding, PADDING_STRATEGIES, "padding")
        if isinstance(texts, str):
            raise TokenizerError("encode_batch: texts must be a list of strings, not one string (use encode)")
        texts = list(texts)
        if not texts:
            raise TokenizerError("encode_batch: no texts given")
        for i, text in enumerate(texts):
            _check_text(text, f"texts[{i}]")
        if pairs is not None:
            if isinstance(pairs, str):
                raise TokenizerError("encode_batch: pairs must be a list of strings, not one string")
            pairs = list(pairs)
            if len(pairs) != len(texts):
                raise TokenizerError(f"encode_batch: {len(texts)} texts but {len(pairs)} pairs")
            for i, pair in enumerate(pairs):
                _check_text(pair, f"pairs[{i}]")
        if padding == "max_length" and max_length is None:
            raise TokenizerError('encode_batch: padding="max_length" needs max_length')
        if pad_to_multiple_of is not None and pad_to_multiple_of < 1:
            raise TokenizerError(f"encode_batch: pad_to_multiple_of must be >= 1, got {pad_to_multiple_of}")
        self._set_truncation(max_length, truncation, has_pair=pairs is not None)
        inputs: list[Any] = texts if pairs is None else list(zip(texts, pairs))
        try:
            raw = self.backend.encode_batch(inputs, add_special_tokens=add_special_tokens)
        except Exception as error:
            raise TokenizerError(f"cannot encode batch (max_length={max_length}, truncation={truncation}): {error}") from None
        encodings = [Encoding.from_backend(e) for e in raw]
        length = max(len(e) for e in encodings) if padding == "longest" else max_length
        if pad_to_multiple_of:
            length = math.ceil(length / pad_to_multiple_of) * pad_to_multiple_of
        # One tensor from nested lists is much faster than filling rows one at a time.
        pads = [length - len(e) for e in encodings]
        fill = self.framing.fill_id
        if self.framing.padding_side == "left":
            input_ids = torch.tensor([[fill] * p + e.ids for e, p in zip(encodings, pads)], dtype=torch.long)
            token_type_ids = torch.tensor([[0] * p + e.type_ids for e, p in zip(encodings, pads)], dtype=torch.long)
            attention_mask = torch.tensor([[0] * p + [1] * len(e) for e, p in zip(encodings, pads)], dtype=torch.long)
        else:
            input_ids = torch.tensor([e.ids + [fill] * p for e, p in zip(encodings, pads)], dtype=torch.long)
            token_type_ids = torch.tensor([e.type_ids + [0] * p for e, p in zip(encodings, pads)], dtype=torch.long)
            attention_mask = torch.tensor([[1] * len(e) + [0] * p for e, p in zip(encodings, pads)], dtype=torch.long)
        return Batch(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids,
                     encodings=encodings)

    def decode(self, ids: Sequence[int] | torch.Tensor, skip_special_tokens: bool = True) -> str:
        """Turn ids back into text."""
        ids = ids.tolist() if isinstance(ids, torch.Tensor) else [int(i) for i in ids]
        bad = [i for i in ids if not 0 <= i < self.vocab_size]
        if bad:
            raise TokenizerError(f"decode: id {bad[0]} is outside the vocabulary (size {self.vocab_size})")
        return self.backend.decode(ids, skip_special_tokens=skip_special_tokens)

    def _set_truncation(
        self, max_length: int | None, truncation: str, *, has_pair: bool, backend: tokenizers.Tokenizer | None = None
    ) -> None:
        check_choice(truncation, TRUNCATION_STRATEGIES, "truncation")
        if truncation == "only_second" and not has_pair and max_length is not None:
            raise TokenizerError('truncation="only_second" needs a text pair')
        if max_length is not None and (not isinstance(max_length, int) or max_length < 1):
            raise TokenizerError(f"max_length must be a positive integer, got {max_length!r}")
        backend = backend or self.backend
        if max_length is None:
            if backend.truncation is not None:
                backend.no_truncation()
        else:
            wanted = {"max_length": max_length, "strategy": truncation, "stride": 0}
            current = backend.truncation
            if current is None or any(current.get(k) != v for k, v in wanted.items()):
                backend.enable_truncation(max_length, stride=0, strategy=truncation)

    def _words_backend(self) -> tokenizers.Tokenizer:
        """Pre-split words need a space before each word for byte-level BPE to see word starts."""
        if self.kind != "bpe" or self._add_prefix_space:
            return self.backend
        if self._word_backend is None:
            backend = with_byte_level_prefix_space(self.backend, True)
            backend.post_processor = self._post_processor(backend, True)
            self._word_backend = backend
        return self._word_backend

    def _post_processor(self, backend: tokenizers.Tokenizer, add_prefix_space: bool) -> Any:
        """The framing's post-processor with this tokenizer's texts and ids of its special tokens."""
        tokens = {backend.token_to_id(t): t for t in self.specials.as_list()}
        return self.framing.post_processor(tokens, self.kind, trim_offsets=self.trim_offsets,
                                           add_prefix_space=add_prefix_space)

    # ----------------------------------------------------------------- saving
    def save(self, directory: str | os.PathLike) -> None:
        """Write tokenizer.json, tokenizer_config.json, special_tokens_map.json and the vocabulary files of the
        kind (vocab.txt for WordPiece, vocab.json + merges.txt for BPE); transformers' AutoTokenizer loads them
        to the same ids. Other files in ``directory`` are left alone. A directory that does not exist yet is
        written under a temporary name and renamed into place, so it never exists half-written; in an existing
        one each file is replaced atomically."""
        directory = Path(directory)
        if directory.exists() and not directory.is_dir():
            raise TokenizerError(f"cannot save the tokenizer to {directory}: it is a file, not a directory")
        blocker = file_in_the_way(directory)
        if blocker is not None:
            raise TokenizerError(f"cannot save the tokenizer to {directory}: {blocker} is a file, not a directory")
        if directory.is_dir():
            self._write_files(directory)
        else:
            with atomic_directory(directory) as tmp:
                self._write_files(tmp)

    def _write_files(self, directory: Path) -> None:
        state = json.loads(self.backend.to_str())
        with atomic_write(directory / "tokenizer.json", "w", encoding="utf-8") as handle:
            handle.write(self.backend.to_str(pretty=True))
        vocab = self.backend.get_vocab(with_added_tokens=False)
        by_id = sorted(vocab.items(), key=lambda item: item[1])
        if self.kind == "wordpiece":
            _check_dense(by_id)
            with atomic_write(directory / "vocab.txt", "w", encoding="utf-8") as handle:
                handle.writelines(f"{token}\n" for token, _ in by_id)
        elif self.kind == "bpe":
            with atomic_write(directory / "vocab.json", "w", encoding="utf-8") as handle:
                json.dump(dict(by_id), handle, ensure_ascii=False)
            merges = [m if isinstance(m, str) else " ".join(m) for m in state["model"]["merges"]]
            with atomic_write(directory / "merges.txt", "w", encoding="utf-8") as handle:
                handle.write("#version: 0.2\n")
                handle.writelines(f"{merge}\n" for merge in merges)
        sentinels = [self.backend.id_to_token(i) for i in self.framing.sentinels]
        tokenizer_class, options = transformers_class(state, self.kind, self.style, self.trim_offsets, sentinels)
        # Each role under its family's keys: the first of each in role order, then the other names.
        layout = self.framing.layout
        roles = self.specials.roles()
        special_map = {layout.token_keys(role)[0]: text for role, text in roles.items()}
        for role, text in roles.items():
            special_map.update(dict.fromkeys(layout.token_keys(role)[1:], text))
        if self.style == "bert" and self.kind == "unigram":  # ALBERT names [CLS]/[SEP] its bos/eos
            special_map.update(bos_token=self.specials.cls, eos_token=self.specials.sep)
        config: dict[str, Any] = {"tokenizer_class": tokenizer_class, **options, **special_map}
        if self.model_max_length is not None:
            config["model_max_length"] = self.model_max_length
        with atomic_write(directory / "tokenizer_config.json", "w", encoding="utf-8") as handle:
            json.dump(config, handle, indent=2, ensure_ascii=False)
        with atomic_write(directory / "special_tokens_map.json", "w", encoding="utf-8") as handle:
            json.dump(special_map, handle, indent=2, ensure_ascii=False)


def _check_text(text: Any, name: str) -> None:
    if not isinstance(text, str):
        raise TokenizerError(f"{name} must be a string, got {type(text).__name__}")


def _check_dense(by_id: list[tuple[str, int]]) -> None:
    """vocab.txt stores ids as line numbers, so they must run 0..n-1 without gaps."""
    for expected, (token, index) in enumerate(by_id):
        if index != expected:
            raise TokenizerError(f"cannot write vocab.txt: token {token!r} has id {index}, expected {expected} (gap)")
