"""Train a WordPiece (BERT), byte-level BPE (RoBERTa, GPT-2, BART) or Unigram (XLM-R, ALBERT, T5, DeBERTa-v3) tokenizer from
corpus files or an iterator of strings."""

from __future__ import annotations

import dataclasses
import json
import os
import unicodedata
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Union

import tokenizers
from tokenizers import Regex, decoders, models, normalizers, pre_tokenizers, trainers

from bertology.errors import DataError, TokenizerError
from bertology.text.corpus import CorpusSource, read_sources
from bertology.tokenization._pipeline import (
    KINDS,
    DEBERTA_WHITESPACE,
    TRAINING_SPECIALS,
    SpecialTokenTexts,
    check_choice,
    default_specials,
)
from bertology.tokenization.tokenizer import Tokenizer, as_saved
from bertology.tokenization.unigram import unigram_scores

_DEFAULT_STYLE = {"wordpiece": "bert", "bpe": "roberta", "unigram": "roberta"}
# The framings a tokenizer is trained for.
TRAINING_STYLES: tuple[str, ...] = ("bert", "roberta", "gpt2", "bart", "t5", "xlnet", "deberta")
# Another name of a kind: GPT-2's and BART's byte-level BPE is the bpe kind.
KIND_ALIASES = {"bytelevel-bpe": "bpe"}
T5_SENTINELS = 100  # T5's extra_ids
_GLOB_CHARS = frozenset("*?[")
# Lines go to the trainer in batches: one Python call per batch instead of per line.
_BATCH_LINES = 1000
# Far above any real vocabulary (XLM-R: 250k); the trainers allocate for vocab_size up front, and a mistyped
# 10**13 aborts the process with an out-of-memory panic instead of an error.
MAX_VOCAB_SIZE = 2**21
# Unicode categories that make text usable for training: letters, marks, numbers, punctuation, symbols. Whitespace
# (Z*), control and format characters (C*: NUL, ESC, zero-width space, BOM, ...) alone teach a tokenizer nothing.
_USABLE_CATEGORIES = frozenset("LMNPS")

TrainingInput = Union[str, os.PathLike, "CorpusSource", Sequence[Union[str, os.PathLike, "CorpusSource"]],
                      Iterable[str]]


def train_tokenizer(
    files_or_texts: TrainingInput,
    kind: str,
    vocab_size: int,
    *,
    style: str | None = None,
    lowercase: bool | None = None,
    min_frequency: int = 2,
    show_progress: bool = True,
    model_max_length: int | None = 512,
    limit_alphabet: int | None = 1000,
    sentinels: int | None = None,
) -> Tokenizer:
    """Train a tokenizer of ``kind`` ("wordpiece", "bpe" alias "bytelevel-bpe", "unigram") with at most
    ``vocab_size`` entries.

    ``files_or_texts``: a path (file, directory, or glob) or a list/tuple of them, read as the ``bert`` corpus
    format reads them (UTF-8, one sentence per line, blank lines skipped; directories recursively, hidden files
    skipped); a ``bertology.data.corpus.CorpusSource`` or a list of them (any corpus format and encoding, as
    ``bertology tokenizer train`` reads its FILE arguments); or any other iterable (a generator, ``iter(list)``)
    of texts. ``style``: WordPiece is always BERT-style; byte-level BPE is RoBERTa-style by default, "gpt2" (one
    special token, <|endoftext|>, and nothing added around a text) or "bart" (RoBERTa's tokens); Unigram is
    XLM-R-style by default, ALBERT-style with "bert", XLNet-style with "xlnet" (<sep> <cls> at the end, left
    padding), DeBERTa-v3-style with "deberta" (DebertaV2Tokenizer's normaliser and Metaspace, [PAD] 0, [CLS] 1,
    [SEP] 2, [UNK] 3, [MASK] 4, cased by default), and T5-style with "t5": SentencePiece's Metaspace, <pad> 0,
    </s> 1 (the EOS after each text), <unk> 2, then the vocabulary, then ``sentinels`` (default 100, T5's
    extra_ids) sentinel tokens <extra_id_0> ... numbered down from the end of the vocabulary (<extra_id_0> has the
    highest id), on top of ``vocab_size``. Saved, transformers' class of the style loads them to the same ids
    (T5TokenizerFast, GPT2TokenizerFast, BartTokenizerFast, DebertaV2Tokenizer). ``lowercase`` defaults to the reference model
    of the kind (BERT uncased and ALBERT lower-case; RoBERTa and XLM-R keep case). ``min_frequency`` does not apply
    to Unigram. BPE and WordPiece training are deterministic: the same text gives the same tokenizer in every run
    and process (WordPiece reads the text twice for that: ``_train_wordpiece``), and so is Unigram training: the
    trainer chooses the pieces, ``bertology.tokenization.unigram`` scores them in a fixed order
    (``_rescore_unigram``), and the result is already in the form its saved copy loads as (``as_saved``).

    A corpus without usable text (nothing but whitespace, control or format characters once normalised, e.g. a
    file of NUL bytes) is a DataError naming its files. A small corpus legitimately gives a vocabulary smaller
    than ``vocab_size``; compare ``vocab_size`` of the result.
    """
    kind = KIND_ALIASES.get(kind, kind)
    check_choice(kind, KINDS, "tokenizer kind")
    style = check_choice(style or _DEFAULT_STYLE[kind], TRAINING_STYLES, "tokenizer style")
    if (kind, style) not in TRAINING_SPECIALS:
        styles = [s for k, s in TRAINING_SPECIALS if k == kind]
        raise TokenizerError(f"a {kind} tokenizer is trained in {' or '.join(styles)} style"
                             f"{' only' if len(styles) == 1 else ''}, not {style!r}")
    if sentinels is not None and style != "t5":
        raise TokenizerError(f"sentinels: T5's sentinel tokens are for a t5-style unigram tokenizer, not {style}")
    if style == "t5":
        sentinels = T5_SENTINELS if sentinels is None else sentinels
        if isinstance(sentinels, bool) or not isinstance(sentinels, int) or sentinels < 0:
            raise TokenizerError(f"sentinels must be a non-negative integer, got {sentinels!r}")
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < 1:
        raise TokenizerError(f"vocab_size must be a positive integer, got {vocab_size!r}")
    if vocab_size > MAX_VOCAB_SIZE:
        raise TokenizerError(f"vocab_size {vocab_size} is larger than the {MAX_VOCAB_SIZE} tokens bertology trains")
    if isinstance(min_frequency, bool) or not isinstance(min_frequency, int) or min_frequency < 0:
        raise TokenizerError(f"min_frequency must be a non-negative integer, got {min_frequency!r}")
    if model_max_length is not None and (isinstance(model_max_length, bool) or not isinstance(model_max_length, int)
                                         or model_max_length < 1):
        raise TokenizerError(f"model_max_length must be a positive integer or None, got {model_max_length!r}")
    if lowercase is None:
        lowercase = kind == "wordpiece" or (kind == "unigram" and style == "bert")
    special_list = TRAINING_SPECIALS[(kind, style)]
    if vocab_size <= len(special_list):
        raise TokenizerError(f"vocab_size {vocab_size} leaves no room beside the {len(special_list)} special tokens")

    backend, trainer = _pipeline(kind, style, lowercase, vocab_size, min_frequency, show_progress, special_list,
                                 limit_alphabet)
    texts, describe = _corpus(files_or_texts)
    if kind == "wordpiece":
        backend = _train_wordpiece(backend, files_or_texts, texts, describe, vocab_size, min_frequency,
                                   show_progress, special_list, limit_alphabet)
    elif kind == "unigram":
        words: Counter[str] = Counter()
        backend.train_from_iterator(_batches(texts, backend.normalizer, describe, words=words,
                                             pre_tokenizer=backend.pre_tokenizer), trainer)
        backend = _rescore_unigram(backend, special_list, words)
    else:
        backend.train_from_iterator(_batches(texts, backend.normalizer, describe), trainer)
    if sentinels:  # numbered down from the end: <extra_id_0> last
        backend.add_special_tokens([f"<extra_id_{i}>" for i in reversed(range(sentinels))])
    specials: SpecialTokenTexts = default_specials(style, kind)
    if style == "gpt2":  # GPT-2 has no padding token: its batches pad with <|endoftext|> (the attention mask
        specials = dataclasses.replace(specials, pad=specials.unk)  # hides it), named as pad_token on disk
    return Tokenizer(backend, style=style, specials=specials, model_max_length=model_max_length)


def _has_usable_character(text: str) -> bool:
    return any(unicodedata.category(char)[0] in _USABLE_CATEGORIES for char in text)


def _batches(texts: Iterable[str], normalizer: normalizers.Normalizer | None, describe: Callable[[int, int], str],
             counts: Counter[str] | None = None, words: Counter[str] | None = None,
             pre_tokenizer: pre_tokenizers.PreTokenizer | None = None) -> Iterator[list[str]]:
    """The non-blank texts in batches for the trainer (``counts``, when given, counts their characters; ``words``
    the words the trainer sees: the texts normalised and split by ``pre_tokenizer``); a corpus without usable text
    is a DataError raised from inside, so the trainer stops before computing a vocabulary."""
    lines = characters = 0
    usable = False
    batch: list[str] = []
    for text in texts:
        if not isinstance(text, str):
            raise TokenizerError(f"training texts must be strings, got {type(text).__name__}")
        lines += 1
        characters += len(text)
        if not text.strip():
            continue
        # Checked until the first usable text, which for real corpora is the first line.
        usable = usable or _has_usable_character(normalizer.normalize_str(text) if normalizer else text)
        if counts is not None:
            counts.update(text)
        if words is not None and pre_tokenizer is not None:
            words.update(word for word, _ in
                         pre_tokenizer.pre_tokenize_str(normalizer.normalize_str(text) if normalizer else text))
        batch.append(text)
        if len(batch) == _BATCH_LINES:
            yield batch
            batch = []
    if not usable:
        raise DataError(
            f"no usable text in {describe(lines, characters)}: only whitespace, control or format characters "
            "(e.g. NUL bytes) after normalisation, no words to learn from"
        )
    if batch:
        yield batch


def _train_wordpiece(backend: tokenizers.Tokenizer, files_or_texts: TrainingInput, texts: Iterator[str],
                     describe: Callable[[int, int], str], vocab_size: int, min_frequency: int, show_progress: bool,
                     special_list: list[str], limit_alphabet: int | None) -> tokenizers.Tokenizer:
    """``backend`` trained as the tokenizers library's WordPiece trainer trains it, but the same on every run.

    That trainer numbers the continuation pieces (``##a``) in the iteration order of a hash map seeded afresh in
    every process (and every call), and breaks ties between equally frequent merges by those numbers: two runs on
    the same text give different ids and sometimes different merges. So a first, cheap pass (no merges) finds the
    alphabet (cut to ``limit_alphabet`` by character count, ties by code point) and the continuation pieces; the
    second pass gets both fixed, as reserved tokens after the specials in the library's own layout (the alphabet,
    then the pieces, each in code-point order), which leaves the trainer nothing to number in hash order and breaks
    merge ties as the library does (lower ids first). The reserved tokens are then made ordinary vocabulary
    again. Path inputs are read twice; the texts of an iterator are held in memory."""
    if not isinstance(files_or_texts, (str, os.PathLike, list, tuple)) and not _is_corpus_source(files_or_texts):
        held = list(texts)
        texts, again = iter(held), iter(held)
    else:
        again = _corpus(files_or_texts)[0]
    survey = tokenizers.Tokenizer(models.WordPiece(unk_token="[UNK]", max_input_chars_per_word=100))
    survey.normalizer, survey.pre_tokenizer = backend.normalizer, backend.pre_tokenizer
    counts: Counter[str] = Counter()
    survey.train_from_iterator(_batches(texts, backend.normalizer, describe, counts), trainers.WordPieceTrainer(
        vocab_size=1, min_frequency=0, show_progress=False, special_tokens=[],
        continuing_subword_prefix="##"))
    found = survey.get_vocab()
    alphabet = sorted(token for token in found if len(token) == 1)
    if limit_alphabet is not None and len(alphabet) > limit_alphabet:
        normalised: Counter[str] = Counter()  # the raw characters' counts, carried through the normaliser
        for char, count in counts.items():
            for piece in backend.normalizer.normalize_str(char) if backend.normalizer else char:
                normalised[piece] += count
        alphabet = sorted(sorted(alphabet, key=lambda c: (-normalised[c], c))[:limit_alphabet])
    continuation = [f"##{char}" for char in alphabet if f"##{char}" in found]
    trainer = trainers.WordPieceTrainer(
        vocab_size=vocab_size, min_frequency=min_frequency, show_progress=show_progress,
        special_tokens=special_list + alphabet + continuation, initial_alphabet=alphabet,
        limit_alphabet=len(alphabet), continuing_subword_prefix="##",
    )
    backend.train_from_iterator(_batches(again, backend.normalizer, describe), trainer)
    state = json.loads(backend.to_str())
    reserved = set(alphabet + continuation)  # plain vocabulary, not tokens matched in the raw text
    state["added_tokens"] = [entry for entry in state["added_tokens"] if entry["content"] not in reserved]
    return tokenizers.Tokenizer.from_str(json.dumps(state))


def _rescore_unigram(backend: tokenizers.Tokenizer, special_list: list[str], words: Counter[str]
                     ) -> tokenizers.Tokenizer:
    """``backend`` (just trained) with the pieces the trainer chose, scored again by ``unigram_scores`` and listed
    by score (ties by piece) after the special tokens: the same on every run and in every process (see
    ``bertology.tokenization.unigram`` for what the trainer leaves to hash order)."""
    state = json.loads(backend.to_str())
    vocab = state["model"]["vocab"]
    specials = vocab[:len(special_list)]
    if [piece for piece, _ in specials] != special_list:
        raise TokenizerError(f"the Unigram trainer did not put the special tokens {special_list} first "
                             f"(found {[piece for piece, _ in specials]})")
    # The trainer lists its pieces in an order that changes between processes, and the EM's sums follow that order:
    # scored as listed, ties such as three letters of equal counts came out a unit in the last place apart, in
    # another order in one process of five. Sorted first, the inputs and so the scores are the same in every process;
    # scores rounded to 12 decimals (far above float64's rounding, far below any real difference) keep such ties
    # ties on CPUs whose exp and log round differently, and ties go by piece.
    pieces = sorted(piece for piece, _ in vocab[len(special_list):])
    scored = sorted(((piece, round(score, 12)) for piece, score in zip(pieces, unigram_scores(pieces, words))),
                    key=lambda item: (-item[1], item[0]))
    state["model"]["vocab"] = specials + [[piece, score] for piece, score in scored]
    return as_saved(tokenizers.Tokenizer.from_str(json.dumps(state, ensure_ascii=False)))


def _is_corpus_source(item: object) -> bool:
    return isinstance(item, CorpusSource)


def _pipeline(
    kind: str,
    style: str,
    lowercase: bool,
    vocab_size: int,
    min_frequency: int,
    show_progress: bool,
    special_list: list[str],
    limit_alphabet: int | None,
) -> tuple[tokenizers.Tokenizer, trainers.Trainer]:
    """An untrained backend of the reference model's layout and the trainer that fills its vocabulary."""
    if kind == "wordpiece":
        backend = tokenizers.Tokenizer(models.WordPiece(unk_token="[UNK]", max_input_chars_per_word=100))
        backend.normalizer = normalizers.BertNormalizer(
            clean_text=True, handle_chinese_chars=True, strip_accents=None, lowercase=lowercase
        )
        backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        backend.decoder = decoders.WordPiece(prefix="##")
        trainer = trainers.WordPieceTrainer(
            vocab_size=vocab_size, min_frequency=min_frequency, show_progress=show_progress,
            special_tokens=special_list, limit_alphabet=limit_alphabet, continuing_subword_prefix="##",
        )
    elif kind == "bpe":
        backend = tokenizers.Tokenizer(models.BPE())
        if lowercase:
            backend.normalizer = normalizers.Lowercase()
        # Like roberta-base: no space is added before the first word.
        backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        backend.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size, min_frequency=min_frequency, show_progress=show_progress,
            special_tokens=special_list, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        )
    else:
        unk = "[UNK]" if style == "deberta" else "<unk>"
        backend = tokenizers.Tokenizer(models.Unigram())
        if style == "deberta":  # DebertaV2Tokenizer's pipeline, so that transformers rebuilds it alike
            steps = [normalizers.Lowercase()] if lowercase else []
            steps += [normalizers.Replace(Regex(DEBERTA_WHITESPACE), " "), normalizers.NFC(),
                      normalizers.Strip(left=False, right=True)]
            backend.normalizer = normalizers.Sequence(steps)
            backend.pre_tokenizer = pre_tokenizers.Sequence(
                [pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")])
        elif style == "bert":
            # ALBERT's normaliser: quotes unified, accents stripped when lower-casing.
            steps = [normalizers.Replace("``", '"'), normalizers.Replace("''", '"')]
            if lowercase:
                steps += [normalizers.NFKD(), normalizers.StripAccents(), normalizers.Lowercase()]
            backend.normalizer = normalizers.Sequence(steps)
        elif lowercase:
            backend.normalizer = normalizers.Lowercase()
        if style != "deberta":
            backend.pre_tokenizer = pre_tokenizers.Sequence(
                [pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")]
            )
        backend.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
        trainer = trainers.UnigramTrainer(
            vocab_size=vocab_size, show_progress=show_progress, special_tokens=special_list, unk_token=unk,
        )
    return backend, trainer


def _corpus(files_or_texts: TrainingInput) -> tuple[Iterator[str], Callable[[int, int], str]]:
    """The training texts, and a function that describes them (given the texts and characters read) for errors."""
    if isinstance(files_or_texts, (str, os.PathLike, CorpusSource)):
        files_or_texts = [files_or_texts]
    if isinstance(files_or_texts, (list, tuple)):
        if not files_or_texts:
            raise DataError("no training files given")
        sources: list[CorpusSource] = []
        run: list[str | os.PathLike] = []  # consecutive plain paths make one bert-format source, as on the CLI
        for item in [*files_or_texts, None]:
            if isinstance(item, (str, os.PathLike)):
                _check_path(item)
                run.append(item)
                continue
            if run:
                sources.append(CorpusSource(run))
                run = []
            if isinstance(item, CorpusSource):
                sources.append(item)
            elif item is not None:
                raise TokenizerError(f"training input {item!r} is not a path (to train from texts pass an iterator)")
        documents = read_sources(sources)  # every source is resolved before any is read

        def describe(texts: int, characters: int) -> str:
            files = [file for source in sources for file in source.files()]
            names = ", ".join(str(file) for file in files[:3]) + (", ..." if len(files) > 3 else "")
            count = f"{len(files)} files, " if len(files) > 1 else ""
            size = sum(file.stat().st_size for file in files)
            return f"{names} ({count}{size} bytes, {_plural(texts, 'non-blank line')})"

        return (sentence for document in documents for sentence in document), describe
    if isinstance(files_or_texts, Iterable):
        return iter(files_or_texts), lambda texts, characters: (
            f"the training texts ({_plural(texts, 'text')}, {_plural(characters, 'character')})")
    raise TokenizerError(f"cannot train from {type(files_or_texts).__name__}: give paths or an iterable of strings")


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


def _check_path(item: str | os.PathLike) -> None:
    """A list of texts passed where paths are expected shows up as a missing path with spaces; say how to pass texts."""
    text = os.fspath(item)
    if not Path(text).exists() and not _GLOB_CHARS & set(text) and any(c.isspace() for c in text):
        raise DataError(f"training input {text!r} does not exist (to train from a list of texts, pass iter(texts))")
