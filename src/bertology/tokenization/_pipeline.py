"""Building blocks shared by loading and training: special-token sets and the transformers
tokenizer class (plus its options) that rebuilds a given pipeline exactly."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import tokenizers

from bertology.errors import TokenizerError
from bertology.tokenization.framing import FRAMINGS, ROLES

KINDS: tuple[str, ...] = ("wordpiece", "bpe", "unigram")

# The backend model type (tokenizer.json "model.type") for each kind.
MODEL_TYPE_TO_KIND: dict[str, str] = {"WordPiece": "wordpiece", "BPE": "bpe", "Unigram": "unigram"}

# config.json model_type -> special-token style.
MODEL_TYPE_STYLE: dict[str, str] = {
    "bert": "bert",
    "electra": "bert",
    "distilbert": "bert",
    "albert": "bert",
    "roberta": "roberta",
    "xlm-roberta": "roberta",
    "longformer": "roberta",
    "gpt2": "gpt2",
    "bart": "bart",
    "t5": "t5",
    "xlnet": "xlnet",
    "modernbert": "bert",
    "deberta-v2": "deberta",
}

# tokenizer_config.json tokenizer_class (without a trailing "Fast") -> style.
CLASS_STYLE: dict[str, str] = {
    "BertTokenizer": "bert",
    "ElectraTokenizer": "bert",
    "DistilBertTokenizer": "bert",
    "AlbertTokenizer": "bert",
    "RobertaTokenizer": "roberta",
    "XLMRobertaTokenizer": "roberta",
    "LongformerTokenizer": "roberta",
    "BartTokenizer": "bart",
    "GPT2Tokenizer": "gpt2",
    "T5Tokenizer": "t5",
    "XLNetTokenizer": "xlnet",
    "DebertaV2Tokenizer": "deberta",
}

# A class that makes transformers load tokenizer.json as it is, for pipelines no family class rebuilds.
GENERIC_CLASS = "PreTrainedTokenizerFast"


@dataclass(frozen=True)
class SpecialTokenTexts:
    """The texts of a tokenizer's special tokens by role (ids: ``Tokenizer.framing``); None where it has none."""

    cls: str | None
    sep: str | None
    pad: str | None
    mask: str | None
    unk: str | None

    def as_list(self) -> list[str]:
        """Distinct tokens in a fixed order (cls, sep, pad, mask, unk), absent ones left out."""
        return [t for t in dict.fromkeys([self.cls, self.sep, self.pad, self.mask, self.unk]) if t is not None]

    def roles(self) -> dict[str, str]:
        """role -> text of every token present."""
        return {role: getattr(self, role) for role in ROLES if getattr(self, role) is not None}


BERT_SPECIALS = SpecialTokenTexts(cls="[CLS]", sep="[SEP]", pad="[PAD]", mask="[MASK]", unk="[UNK]")
ALBERT_SPECIALS = SpecialTokenTexts(cls="[CLS]", sep="[SEP]", pad="<pad>", mask="[MASK]", unk="<unk>")
ROBERTA_SPECIALS = SpecialTokenTexts(cls="<s>", sep="</s>", pad="<pad>", mask="<mask>", unk="<unk>")


def default_specials(style: str, kind: str) -> SpecialTokenTexts:
    """The special tokens of the reference model of this style and kind (BERT; ALBERT for a bert-style Unigram;
    each other family's layout defaults)."""
    if style == "bert" and kind == "unigram":
        return ALBERT_SPECIALS
    return SpecialTokenTexts(**{role: FRAMINGS[style].tokens.get(role) for role in ROLES})


# Training vocabularies start with the specials in the order of the reference checkpoints, so that the ids
# transformers hard-codes (XLM-R <unk>=3, ALBERT <unk>=1) hold.
TRAINING_SPECIALS: dict[tuple[str, str], list[str]] = {
    ("wordpiece", "bert"): ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"],
    ("bpe", "roberta"): ["<s>", "<pad>", "</s>", "<unk>", "<mask>"],
    ("unigram", "roberta"): ["<s>", "<pad>", "</s>", "<unk>", "<mask>"],
    ("unigram", "bert"): ["<pad>", "<unk>", "[CLS]", "[SEP]", "[MASK]"],
    ("bpe", "gpt2"): ["<|endoftext|>"],
    ("bpe", "bart"): ["<s>", "<pad>", "</s>", "<unk>", "<mask>"],
    ("unigram", "t5"): ["<pad>", "</s>", "<unk>"],  # then the vocabulary, then the sentinels (<extra_id_0> last)
    ("unigram", "xlnet"): ["<unk>", "<s>", "</s>", "<cls>", "<sep>", "<pad>", "<mask>"],  # XLNet's ids 0-6
    ("unigram", "deberta"): ["[PAD]", "[CLS]", "[SEP]", "[UNK]", "[MASK]"],  # DeBERTa-v3's ids 0-3, then [MASK]
}

# DeBERTa-v3's normaliser as DebertaV2Tokenizer builds it (after an optional Lowercase): runs of whitespace and
# newlines or tabs to one space, NFC, trailing whitespace stripped.
DEBERTA_WHITESPACE = r"\s{2,}|[\n\r\t]"



def find_components(node: Any, type_name: str) -> list[dict]:
    """Every JSON object with ``"type": type_name`` inside a tokenizer.json component (Sequences included)."""
    found: list[dict] = []
    if isinstance(node, dict):
        if node.get("type") == type_name:
            found.append(node)
        for value in node.values():
            found.extend(find_components(value, type_name))
    elif isinstance(node, list):
        for value in node:
            found.extend(find_components(value, type_name))
    return found


def with_byte_level_prefix_space(backend: tokenizers.Tokenizer, add_prefix_space: bool) -> tokenizers.Tokenizer:
    """A copy of ``backend`` whose ByteLevel pre-tokenizer adds (or does not add) a space before the text."""
    state = json.loads(backend.to_str())
    for component in find_components(state.get("pre_tokenizer"), "ByteLevel"):
        component["add_prefix_space"] = add_prefix_space
    return tokenizers.Tokenizer.from_str(json.dumps(state))


def byte_level_prefix_space(state: dict) -> bool:
    """Whether the ByteLevel pre-tokenizer in a tokenizer.json state adds a prefix space (False when absent)."""
    return any(c.get("add_prefix_space", False) for c in find_components(state.get("pre_tokenizer"), "ByteLevel"))


def _types(node: Any) -> list[str]:
    """The component types of a (possibly Sequence) normalizer or pre-tokenizer, in order."""
    if node is None:
        return []
    if node.get("type") == "Sequence":
        inner = node.get("normalizers", node.get("pretokenizers", []))
        return [t for child in inner for t in _types(child)]
    return [node["type"]]


def transformers_class(state: dict, kind: str, style: str, trim_offsets: bool,
                       sentinels: list[str] | None = None) -> tuple[str, dict[str, Any]]:
    """The ``tokenizer_class`` and tokenizer_config.json options with which transformers rebuilds this exact
    pipeline. Family classes (BertTokenizer, ...) rebuild normaliser and pre-tokeniser from their options and ignore
    those in tokenizer.json, so a family class is named only when its rebuild matches; otherwise the generic class,
    which loads tokenizer.json as it is. ``sentinels``: T5's sentinel tokens in number order."""
    normalizer, pre_tokenizer = state.get("normalizer"), state.get("pre_tokenizer")
    norm_types, pre_types = _types(normalizer), _types(pre_tokenizer)
    if kind == "bpe" and style in ("gpt2", "bart") and not norm_types and pre_types == ["ByteLevel"] \
            and pre_tokenizer.get("use_regex", True):
        prefix = {"add_prefix_space": bool(pre_tokenizer.get("add_prefix_space", False))}
        return ("GPT2Tokenizer", prefix) if style == "gpt2" else ("BartTokenizer", {**prefix,
                                                                                    "trim_offsets": trim_offsets})
    if kind == "unigram" and style == "t5" and not norm_types and pre_types == ["WhitespaceSplit", "Metaspace"] \
            and _t5_layout(state, sentinels or []):
        # T5Tokenizer builds <pad> 0, </s> 1, <unk> 2 and the sentinels from extra_ids; the vocabulary is the file's.
        return "T5Tokenizer", {"extra_ids": len(sentinels or []), "additional_special_tokens": list(sentinels or [])}
    if kind == "unigram" and style == "deberta" and pre_types == ["Metaspace"] \
            and norm_types in (["Replace", "NFC", "Strip"], ["Lowercase", "Replace", "NFC", "Strip"]):
        metaspace = find_components(pre_tokenizer, "Metaspace")[0]
        if metaspace.get("replacement", "▁") == "▁" and metaspace.get("prepend_scheme", "always") in (
                "always", "first"):
            return "DebertaV2Tokenizer", {"do_lower_case": norm_types[0] == "Lowercase", "split_by_punct": False,
                                          "add_prefix_space": metaspace.get("prepend_scheme", "always") == "always"}
    if kind == "wordpiece" and style == "bert" and norm_types == ["BertNormalizer"] and pre_types == ["BertPreTokenizer"]:
        if normalizer.get("clean_text", True):
            return "BertTokenizer", {
                "do_lower_case": bool(normalizer.get("lowercase", True)),
                "strip_accents": normalizer.get("strip_accents"),
                "tokenize_chinese_chars": bool(normalizer.get("handle_chinese_chars", True)),
            }
    if kind == "bpe" and style == "roberta" and not norm_types and pre_types == ["ByteLevel"]:
        if pre_tokenizer.get("use_regex", True):
            return "RobertaTokenizer", {
                "add_prefix_space": bool(pre_tokenizer.get("add_prefix_space", False)),
                "trim_offsets": trim_offsets,
            }
    if kind == "unigram" and pre_types == ["WhitespaceSplit", "Metaspace"]:
        metaspace = find_components(pre_tokenizer, "Metaspace")[0]
        scheme = metaspace.get("prepend_scheme", "always")
        if metaspace.get("replacement", "▁") == "▁" and scheme in ("always", "never"):
            prefix = {"add_prefix_space": scheme == "always"}
            if style == "roberta" and norm_types in ([], ["Precompiled"]):
                return "XLMRobertaTokenizer", prefix
            if style == "bert":
                options = _albert_options(normalizer)
                if options is not None:
                    return "AlbertTokenizer", {**options, **prefix, "trim_offsets": trim_offsets}
    return GENERIC_CLASS, {}


def _t5_layout(state: dict, sentinels: list[str]) -> bool:
    """Whether a Unigram vocabulary is laid out as T5Tokenizer builds its own: <pad>, </s>, <unk> first, the
    sentinels last with <extra_id_0> the highest id, a Metaspace that always prepends and splits."""
    metaspace = find_components(state.get("pre_tokenizer"), "Metaspace")[0]
    if metaspace.get("replacement", "▁") != "▁" or metaspace.get("prepend_scheme", "always") != "always" \
            or not metaspace.get("split", True):
        return False
    vocab = [entry[0] for entry in state["model"]["vocab"]]
    extra = {t["content"]: t["id"] for t in state.get("added_tokens", [])}
    top = max([len(vocab) - 1, *extra.values()])
    return vocab[:3] == ["<pad>", "</s>", "<unk>"] and state["model"].get("unk_id") == 2 \
        and [extra.get(token) for token in sentinels] == [top - k for k in range(len(sentinels))]


def _albert_options(normalizer: dict | None) -> dict[str, bool] | None:
    """do_lower_case / keep_accents when the normaliser is the one AlbertTokenizer builds, else None."""
    types = _types(normalizer)
    if types[-1:] == ["Precompiled"]:
        types = types[:-1]
    if types[:2] != ["Replace", "Replace"]:
        return None
    rest = types[2:]
    for lower in (False, True):
        for keep_accents in (False, True):
            expected = ([] if keep_accents else ["NFKD", "StripAccents"]) + (["Lowercase"] if lower else [])
            if rest == expected:
                return {"do_lower_case": lower, "keep_accents": keep_accents}
    return None


def check_choice(value: str, choices: tuple[str, ...], what: str) -> str:
    if value not in choices:
        raise TokenizerError(f"unknown {what} {value!r}; expected one of {', '.join(choices)}")
    return value
