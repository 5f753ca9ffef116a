"""Small tokenizers of each built-in framing, trained in memory with the ``tokenizers`` library (no downloads),
and the transformers class that frames the same backend the family's way."""

from __future__ import annotations

from pathlib import Path

import tokenizers
from tokenizers import decoders, models, normalizers, pre_tokenizers, trainers

from bertology.tokenization import Tokenizer
from bertology.tokenization._pipeline import SpecialTokenTexts, default_specials

TEXTS = [
    "the cat sat on the mat",
    "a dog ran in the park with the cat",
    "hello world , again and again",
    "she read the old book by the window",
    "we walked home after the rain stopped",
] * 4

# T5 numbers its sentinels downward from the end of the vocabulary: <extra_id_0> has the highest id.
SENTINELS = 3


def _wordpiece() -> tokenizers.Tokenizer:
    backend = tokenizers.Tokenizer(models.WordPiece(unk_token="[UNK]"))
    backend.normalizer = normalizers.BertNormalizer(lowercase=True)
    backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    backend.decoder = decoders.WordPiece()
    backend.train_from_iterator(TEXTS, trainers.WordPieceTrainer(
        vocab_size=120, special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"], show_progress=False))
    return backend


def _byte_level(specials: list[str]) -> tokenizers.Tokenizer:
    backend = tokenizers.Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    backend.train_from_iterator(TEXTS, trainers.BpeTrainer(
        vocab_size=300, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False))
    return backend


def _unigram(specials: list[str], unk: str = "<unk>") -> tokenizers.Tokenizer:
    backend = tokenizers.Tokenizer(models.Unigram())
    backend.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Metaspace()])
    backend.decoder = decoders.Metaspace()
    backend.train_from_iterator(TEXTS, trainers.UnigramTrainer(
        vocab_size=80, special_tokens=specials, unk_token=unk, show_progress=False))
    return backend


def backend(style: str) -> tokenizers.Tokenizer:
    """A fresh backend of the family's kind with the family's special tokens in its vocabulary."""
    if style == "bert":
        return _wordpiece()
    if style in ("roberta", "bart"):
        return _byte_level(["<s>", "<pad>", "</s>", "<unk>", "<mask>"])
    if style == "gpt2":
        return _byte_level(["<|endoftext|>"])
    if style == "t5":
        made = _unigram(["<pad>", "</s>", "<unk>"])
        made.add_special_tokens([f"<extra_id_{i}>" for i in reversed(range(SENTINELS))])
        return made
    if style == "xlnet":
        return _unigram(["<unk>", "<s>", "</s>", "<cls>", "<sep>", "<pad>", "<mask>"])
    if style == "deberta":
        return _unigram(["[PAD]", "[CLS]", "[SEP]", "[UNK]", "[MASK]"], unk="[UNK]")
    raise ValueError(style)


def kind(style: str) -> str:
    return {"bert": "wordpiece", "t5": "unigram", "xlnet": "unigram", "deberta": "unigram"}.get(style, "bpe")


def specials(style: str) -> SpecialTokenTexts:
    """The family's tokens; GPT-2 pads with <|endoftext|> (as a special_tokens_map.json naming it does)."""
    texts = default_specials(style, kind(style))
    if style == "gpt2":
        texts = SpecialTokenTexts(None, None, "<|endoftext|>", None, "<|endoftext|>")
    return texts


def tokenizer(style: str, backend_: tokenizers.Tokenizer | None = None) -> Tokenizer:
    made = backend_ if backend_ is not None else backend(style)
    return Tokenizer(tokenizers.Tokenizer.from_str(made.to_str()), style=style, specials=specials(style))


def saved(style: str, directory: Path, tokenizer_class: str | None = None) -> Path:
    """A directory with the backend's tokenizer.json and a tokenizer_config.json naming the family's class."""
    directory.mkdir(parents=True, exist_ok=True)
    backend(style).save(str(directory / "tokenizer.json"))
    name = tokenizer_class or {"bert": "BertTokenizer", "roberta": "RobertaTokenizer", "bart": "BartTokenizer",
                               "gpt2": "GPT2Tokenizer", "t5": "T5Tokenizer", "xlnet": "XLNetTokenizer",
                               "deberta": "DebertaV2Tokenizer"}[style]
    (directory / "tokenizer_config.json").write_text(f'{{"tokenizer_class": "{name}"}}', encoding="utf-8")
    return directory
