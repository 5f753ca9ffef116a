"""Train a WordPiece (BERT), byte-level BPE (RoBERTa) or Unigram (XLM-R / ALBERT) tokenizer from text files or
an iterator of strings."""

from __future__ import annotations

import glob
import os
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import tokenizers
from tokenizers import decoders, models, normalizers, pre_tokenizers, trainers

from bertology.errors import DataError, TokenizerError
from bertology.tokenization._pipeline import (
    KINDS,
    STYLES,
    TRAINING_SPECIALS,
    SpecialTokens,
    check_choice,
    default_specials,
)
from bertology.tokenization.tokenizer import Tokenizer

_DEFAULT_STYLE = {"wordpiece": "bert", "bpe": "roberta", "unigram": "roberta"}
_GLOB_CHARS = frozenset("*?[")
# Lines go to the trainer in batches: one Python call per batch instead of per line.
_BATCH_LINES = 1000


def train_tokenizer(
    files_or_texts: str | os.PathLike | Sequence[str | os.PathLike] | Iterable[str],
    kind: str,
    vocab_size: int,
    *,
    style: str | None = None,
    lowercase: bool | None = None,
    min_frequency: int = 2,
    show_progress: bool = True,
    model_max_length: int | None = 512,
    limit_alphabet: int | None = 1000,
) -> Tokenizer:
    """Train a tokenizer of ``kind`` ("wordpiece", "bpe", "unigram") with ``vocab_size`` entries.

    ``files_or_texts``: a path (file, directory, or glob) or a list/tuple of them (directories are read recursively,
    hidden files skipped), each read as UTF-8 one line at a time; or any other iterable (a generator, ``iter(list)``)
    of texts. ``style``: "bert" or "roberta"; WordPiece is always BERT-style and byte-level BPE RoBERTa-style,
    Unigram is XLM-R-style by default and ALBERT-style with "bert". ``lowercase`` defaults to the reference model
    of the kind (BERT uncased and ALBERT lower-case; RoBERTa and XLM-R keep case). ``min_frequency`` does not apply
    to Unigram. BPE training is deterministic; WordPiece and Unigram ids can differ between runs on the same
    text, because the tokenizers library breaks count ties in hash-map order: save the result, do not retrain.
    """
    check_choice(kind, KINDS, "tokenizer kind")
    style = check_choice(style or _DEFAULT_STYLE[kind], STYLES, "tokenizer style")
    if (kind, style) not in TRAINING_SPECIALS:
        raise TokenizerError(f"a {kind} tokenizer is trained in {_DEFAULT_STYLE[kind]} style only, not {style!r}")
    if not isinstance(vocab_size, int) or vocab_size < 1:
        raise TokenizerError(f"vocab_size must be a positive integer, got {vocab_size!r}")
    if lowercase is None:
        lowercase = kind == "wordpiece" or (kind == "unigram" and style == "bert")
    special_list = TRAINING_SPECIALS[(kind, style)]
    if vocab_size <= len(special_list):
        raise TokenizerError(f"vocab_size {vocab_size} leaves no room beside the {len(special_list)} special tokens")

    backend, trainer = _pipeline(kind, style, lowercase, vocab_size, min_frequency, show_progress, special_list,
                                 limit_alphabet)
    texts = _corpus(files_or_texts)
    seen = 0

    def batches() -> Iterator[list[str]]:
        nonlocal seen
        batch: list[str] = []
        for text in texts:
            if not isinstance(text, str):
                raise TokenizerError(f"training texts must be strings, got {type(text).__name__}")
            if text.strip():
                batch.append(text)
                if len(batch) == _BATCH_LINES:
                    seen += len(batch)
                    yield batch
                    batch = []
        if batch:
            seen += len(batch)
            yield batch

    backend.train_from_iterator(batches(), trainer)
    if seen == 0:
        raise DataError("no training text: every input was empty or whitespace")
    specials: SpecialTokens = default_specials(style, kind)
    return Tokenizer(backend, style=style, specials=specials, model_max_length=model_max_length)


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
        unk = "<unk>"
        backend = tokenizers.Tokenizer(models.Unigram())
        if style == "bert":
            # ALBERT's normaliser: quotes unified, accents stripped when lower-casing.
            steps = [normalizers.Replace("``", '"'), normalizers.Replace("''", '"')]
            if lowercase:
                steps += [normalizers.NFKD(), normalizers.StripAccents(), normalizers.Lowercase()]
            backend.normalizer = normalizers.Sequence(steps)
        elif lowercase:
            backend.normalizer = normalizers.Lowercase()
        backend.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")]
        )
        backend.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
        trainer = trainers.UnigramTrainer(
            vocab_size=vocab_size, show_progress=show_progress, special_tokens=special_list, unk_token=unk,
        )
    return backend, trainer


def _corpus(files_or_texts: str | os.PathLike | Sequence[str | os.PathLike] | Iterable[str]) -> Iterator[str]:
    """Texts from paths (str / PathLike, or a list or tuple of them) or from any other iterable of strings."""
    if isinstance(files_or_texts, (str, os.PathLike)):
        return _read_files(expand_paths([files_or_texts]))
    if isinstance(files_or_texts, (list, tuple)):
        return _read_files(expand_paths(files_or_texts))
    if isinstance(files_or_texts, Iterable):
        return iter(files_or_texts)
    raise TokenizerError(f"cannot train from {type(files_or_texts).__name__}: give paths or an iterable of strings")


def expand_paths(paths: Sequence[str | os.PathLike]) -> list[Path]:
    """Files named by ``paths``: files as given, directories recursively (hidden entries skipped), globs expanded."""
    files: list[Path] = []
    if not paths:
        raise DataError("no training files given")
    for item in paths:
        if not isinstance(item, (str, os.PathLike)):
            raise TokenizerError(f"training input {item!r} is not a path (to train from texts pass an iterator)")
        path = Path(item)
        if path.is_file():
            files.append(path)
        elif path.is_dir():
            found = sorted(
                p for p in path.rglob("*")
                if p.is_file() and not any(part.startswith(".") for part in p.relative_to(path).parts)
            )
            if not found:
                raise DataError(f"training directory {path} holds no files")
            files.extend(found)
        elif _GLOB_CHARS & set(str(item)):
            found = sorted(Path(p) for p in glob.glob(str(item), recursive=True) if Path(p).is_file())
            if not found:
                raise DataError(f"training glob {str(item)!r} matches no files")
            files.extend(found)
        else:
            # A list of texts passed where paths are expected shows up here; say how to pass texts.
            hint = " (to train from a list of texts, pass iter(texts))" if any(c.isspace() for c in str(item)) else ""
            raise DataError(f"training input {str(item)!r} does not exist{hint}")
    return files


def _read_files(files: list[Path]) -> Iterator[str]:
    """Lines of each file, decoded as strict UTF-8; a bad byte raises DataError with file, line and byte offset."""
    for path in files:
        offset = 0
        with open(path, "rb") as handle:
            for number, raw in enumerate(handle, start=1):
                try:
                    line = raw.decode("utf-8")
                except UnicodeDecodeError as error:
                    raise DataError(
                        f"{path}: not valid UTF-8 at byte offset {offset + error.start} (line {number}): "
                        f"byte 0x{raw[error.start]:02x}"
                    ) from None
                if number == 1:
                    line = line.removeprefix("\ufeff")
                offset += len(raw)
                yield line.rstrip("\r\n")
