"""Load a tokenizer from a Hugging Face model directory: tokenizer.json (any kind), vocab.txt (BERT WordPiece) or
vocab.json + merges.txt (RoBERTa byte-level BPE). config.json's model_type, when present, fixes the style."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import tokenizers
from tokenizers import decoders, models, normalizers, pre_tokenizers

from bertology.errors import TokenizerError
from bertology.inputs import json_file
from bertology.tokenization._pipeline import (
    CLASS_STYLE,
    MODEL_TYPE_STYLE,
    MODEL_TYPE_TO_KIND,
    SpecialTokenTexts,
    byte_level_prefix_space,
    default_specials,
    with_byte_level_prefix_space,
)
from bertology.tokenization.framing import FRAMINGS, ROLES
from bertology.tokenization.tokenizer import Tokenizer

# transformers writes a huge sentinel for "no limit".
_NO_LIMIT = 10**9


def load_tokenizer(directory: str | os.PathLike, model_type: str | None = None) -> Tokenizer:
    """Load the tokenizer stored in ``directory``. ``model_type`` (bert, roberta, xlm-roberta, electra, albert,
    distilbert) overrides config.json's; without either, the style follows tokenizer_config.json's class or the
    special tokens in the vocabulary."""
    directory = Path(directory)
    if not directory.is_dir():
        what = "is not a directory" if directory.exists() else "does not exist"
        raise TokenizerError(f"tokenizer directory {directory} {what}")
    config = _read_json(directory / "config.json")
    if model_type is None:
        model_type = config.get("model_type")
        where = f"{directory / 'config.json'}: key 'model_type'"
    else:
        where = "model_type argument"
    if model_type is not None and model_type not in MODEL_TYPE_STYLE:
        raise TokenizerError(f"{where}: unknown model type {model_type!r}; expected one of {', '.join(MODEL_TYPE_STYLE)}")
    tok_config = _read_json(directory / "tokenizer_config.json")
    special_map = _read_json(directory / "special_tokens_map.json")

    tokenizer_json = directory / "tokenizer.json"
    if tokenizer_json.is_file():
        backend = _read_tokenizer_json(tokenizer_json)
        source = tokenizer_json
    elif (directory / "vocab.txt").is_file():
        backend = _wordpiece_from_vocab(directory / "vocab.txt", tok_config)
        source = directory / "vocab.txt"
    elif (directory / "vocab.json").is_file() or (directory / "merges.txt").is_file():
        for name in ("vocab.json", "merges.txt"):
            if not (directory / name).is_file():
                raise TokenizerError(f"{directory}: has a byte-level BPE vocabulary but no {name} (both are needed)")
        backend = _bpe_from_files(directory / "vocab.json", directory / "merges.txt")
        source = directory / "vocab.json"
    else:
        spm = sorted(p.name for p in directory.glob("*.model"))
        if spm:
            raise TokenizerError(
                f"{directory}: only a sentencepiece model ({', '.join(spm)}) is present; bertology reads "
                "tokenizer.json, so convert it once where transformers and sentencepiece are installed: "
                "AutoTokenizer.from_pretrained(dir).save_pretrained(dir) writes tokenizer.json"
            )
        present = ", ".join(sorted(p.name for p in directory.iterdir())) or "nothing"
        raise TokenizerError(
            f"{directory}: no tokenizer files (need tokenizer.json, vocab.txt, or vocab.json + merges.txt); "
            f"found {present}"
        )

    kind = MODEL_TYPE_TO_KIND.get(type(backend.model).__name__)
    if kind is None:
        raise TokenizerError(f"{directory}: unsupported tokenizer model {type(backend.model).__name__}")
    style = _style(model_type, tok_config, backend, directory)
    if model_type is not None:
        _check_class_fits(style, model_type, where, tok_config, directory)
    specials = _specials(style, kind, tok_config, special_map)
    if kind == "bpe" and isinstance(tok_config.get("add_prefix_space"), bool):
        # transformers' RobertaTokenizer takes add_prefix_space from tokenizer_config.json; follow it.
        state = json.loads(backend.to_str())
        if byte_level_prefix_space(state) != tok_config["add_prefix_space"]:
            backend = with_byte_level_prefix_space(backend, tok_config["add_prefix_space"])
    max_length = tok_config.get("model_max_length")
    if not isinstance(max_length, (int, float)) or isinstance(max_length, bool) or max_length >= _NO_LIMIT:
        max_length = None
    return Tokenizer(
        backend,
        style=style,
        specials=specials,
        model_max_length=int(max_length) if max_length is not None else None,
        trim_offsets=bool(tok_config.get("trim_offsets", True)),
        source=source,
    )


def _read_json(path: Path) -> dict[str, Any]:
    """A JSON object from ``path``, {} when the file does not exist."""
    return json_file(path, TokenizerError) if path.is_file() else {}


def _read_tokenizer_json(path: Path) -> tokenizers.Tokenizer:
    try:
        return tokenizers.Tokenizer.from_file(str(path))
    except Exception as error:
        raise TokenizerError(f"{path}: cannot read tokenizer: {error}") from None


def _read_lines(path: Path) -> list[str]:
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as error:
        raise TokenizerError(f"{path}: not UTF-8 at byte offset {error.start}") from None
    return text.split("\n")


def _wordpiece_from_vocab(path: Path, tok_config: dict[str, Any]) -> tokenizers.Tokenizer:
    """The pipeline BertTokenizer builds from vocab.txt and tokenizer_config.json's options."""
    lines = _read_lines(path)
    if lines and lines[-1] == "":
        lines.pop()
    # One token a line, id = line number; like transformers, only the line break is stripped.
    vocab = {line.rstrip("\r"): index for index, line in enumerate(lines)}
    if not vocab:
        raise TokenizerError(f"{path}: empty vocabulary")
    unk = _token_value(tok_config.get("unk_token")) or "[UNK]"
    if unk not in vocab:
        raise TokenizerError(f"{path}: unknown-word token {unk!r} is not in the vocabulary")
    backend = tokenizers.Tokenizer(models.WordPiece(vocab, unk_token=unk, max_input_chars_per_word=100))
    backend.normalizer = normalizers.BertNormalizer(
        clean_text=True,
        handle_chinese_chars=bool(tok_config.get("tokenize_chinese_chars", True)),
        strip_accents=tok_config.get("strip_accents"),
        lowercase=bool(tok_config.get("do_lower_case", True)),
    )
    backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    backend.decoder = decoders.WordPiece(prefix="##")
    return backend


def _bpe_from_files(vocab_path: Path, merges_path: Path) -> tokenizers.Tokenizer:
    """The pipeline RobertaTokenizer builds from vocab.json and merges.txt."""
    vocab = _read_json(vocab_path)
    bad = next(((k, v) for k, v in vocab.items() if not isinstance(v, int) or isinstance(v, bool)), None)
    if bad is not None:
        raise TokenizerError(f"{vocab_path}: key {bad[0]!r} maps to {bad[1]!r}, expected an integer id")
    merges: list[tuple[str, str]] = []
    for number, line in enumerate(_read_lines(merges_path), start=1):
        line = line.rstrip("\r")
        if not line or (number == 1 and line.startswith("#version")):
            continue
        parts = line.split(" ")
        if len(parts) != 2:
            raise TokenizerError(f"{merges_path}: line {number}: expected two tokens separated by a space, got {line!r}")
        merges.append((parts[0], parts[1]))
    try:
        model = models.BPE(vocab, merges, dropout=None, continuing_subword_prefix="", end_of_word_suffix="",
                           fuse_unk=False)
    except Exception as error:
        raise TokenizerError(f"{merges_path}: merges do not fit {vocab_path.name}: {error}") from None
    backend = tokenizers.Tokenizer(model)
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    return backend


# Model types whose checkpoints may come with another family's tokenizer (a Longformer made from a BERT model): the
# tokenizer's own class or vocabulary says the style, the model type only when they do not.
FILES_TELL_STYLE = frozenset({"longformer"})


def _style(model_type: str | None, tok_config: dict[str, Any], backend: tokenizers.Tokenizer, directory: Path) -> str:
    if model_type is not None and model_type not in FILES_TELL_STYLE:
        return MODEL_TYPE_STYLE[model_type]
    tokenizer_class = tok_config.get("tokenizer_class")
    if isinstance(tokenizer_class, str) and tokenizer_class.removesuffix("Fast") in CLASS_STYLE:
        return CLASS_STYLE[tokenizer_class.removesuffix("Fast")]
    # The first family whose telling tokens are all in the vocabulary (BART's framing is RoBERTa's).
    for style, telling in _TELLING_TOKENS:
        if all(backend.token_to_id(t) is not None for t in telling):
            return style
    if model_type is not None:
        return MODEL_TYPE_STYLE[model_type]
    raise TokenizerError(
        f"{directory}: cannot tell the special-token style (no config.json model_type, no known tokenizer_class, "
        f"none of {', '.join(' + '.join(t) for _, t in _TELLING_TOKENS)} in the vocabulary); pass model_type"
    )


def _check_class_fits(style: str, model_type: str, where: str, tok_config: dict[str, Any], directory: Path) -> None:
    """A tokenizer_config.json naming a tokenizer class that frames texts otherwise than the model's family (an
    XLNet tokenizer, summary token last and padded on the left, beside a BERT model, which reads [CLS] first) is an
    error: the model would read its summary token and padding in the wrong places."""
    name = tok_config.get("tokenizer_class")
    theirs = CLASS_STYLE.get(name.removesuffix("Fast")) if isinstance(name, str) else None
    if theirs is None or FRAMINGS[theirs].frames_like(FRAMINGS[style]):
        return
    raise TokenizerError(
        f"{directory / 'tokenizer_config.json'}: key 'tokenizer_class': {name} frames texts as {theirs} does "
        f"({FRAMINGS[theirs].describe()}), but {where} is {model_type!r}, whose models read {style} framing "
        f"({FRAMINGS[style].describe()}): use the model's own tokenizer"
    )


_TELLING_TOKENS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("bert", ("[CLS]",)),
    ("xlnet", ("<cls>", "<sep>")),
    ("roberta", ("<s>",)),
    ("t5", ("</s>",)),
    ("gpt2", ("<|endoftext|>",)),
)


def _token_value(value: Any) -> str | None:
    """A special token as tokenizer_config.json / special_tokens_map.json store it: a string or {"content": ...}."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _specials(style: str, kind: str, tok_config: dict[str, Any], special_map: dict[str, Any]) -> SpecialTokenTexts:
    """Each role's token: named by special_tokens_map.json, else by tokenizer_config.json (under the family's keys
    for the role, in order), else the family's default (None where the family has no such token)."""
    defaults = default_specials(style, kind)
    layout = FRAMINGS[style]
    chosen = {}
    for role in ROLES:
        keys = layout.token_keys(role)
        named = [_token_value(source.get(key)) for source in (special_map, tok_config) for key in keys]
        chosen[role] = next((t for t in named if t), None) or getattr(defaults, role)
    return SpecialTokenTexts(**chosen)
