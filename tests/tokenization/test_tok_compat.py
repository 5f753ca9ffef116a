"""Same ids, type ids, offsets, word ids and sequence ids as transformers' AutoTokenizer for the same files: the
real MiniLM tokenizer and small tokenizers of every kind trained and saved by bertology."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from bertology.tokenization import Encoding, Tokenizer, load_tokenizer

from tok_data import KINDS, PAIRS, SHARED, TEXTS

transformers = pytest.importorskip("transformers")

REFERENCE = SHARED / "reference" / "all-MiniLM-L6-v2"


def hf_tokenizer(directory: Path, **kwargs):
    return transformers.AutoTokenizer.from_pretrained(str(directory), **kwargs)


def assert_same(ours: Encoding, hf, text, pair=None, **kwargs) -> None:
    ref = hf(text, pair, return_offsets_mapping=True, return_token_type_ids=True, **kwargs)
    context = f"text={text!r} pair={pair!r} ours={ours.tokens} hf={hf.convert_ids_to_tokens(ref['input_ids'])}"
    assert ours.ids == ref["input_ids"], context
    assert ours.type_ids == ref["token_type_ids"], context
    assert ours.offsets == [tuple(o) for o in ref["offset_mapping"]], context
    assert ours.word_ids == ref.word_ids(), context
    assert ours.sequence_ids == ref.sequence_ids(), context


def assert_same_everywhere(tokenizer: Tokenizer, hf) -> None:
    for text in TEXTS:
        assert_same(tokenizer.encode(text), hf, text)
    for text, pair in PAIRS:
        if pair == "":
            # transformers drops an empty second text; we keep the pair layout (see test_empty_pair_keeps_layout).
            continue
        assert_same(tokenizer.encode(text, pair), hf, text, pair)


# ------------------------------------------------------------------ the real MiniLM files
def test_minilm_reference_ids(minilm: Path) -> None:
    if not REFERENCE.is_dir():
        pytest.skip(f"shared reference data not found at {REFERENCE}")
    tokenizer = load_tokenizer(minilm)
    texts = json.loads((REFERENCE / "inputs.json").read_text(encoding="utf-8"))
    expected = json.loads((REFERENCE / "token_ids.json").read_text(encoding="utf-8"))
    assert len(texts) == 8
    for text, ids, tokens in zip(texts, expected["token_ids"], expected["tokens"]):
        encoding = tokenizer.encode(text)
        assert encoding.ids == ids
        assert encoding.tokens == tokens
    # The padded batch transformers built for the reference outputs.
    reference = np.load(REFERENCE / "reference_outputs.npz")
    batch = tokenizer.encode_batch(texts)
    for name in ("input_ids", "attention_mask", "token_type_ids"):
        np.testing.assert_array_equal(getattr(batch, name).numpy(), reference[name])


def test_minilm_matches_transformers(minilm: Path) -> None:
    tokenizer = load_tokenizer(minilm)
    assert (tokenizer.kind, tokenizer.style, tokenizer.vocab_size) == ("wordpiece", "bert", 30522)
    assert (tokenizer.cls_id, tokenizer.sep_id, tokenizer.pad_id, tokenizer.mask_id, tokenizer.unk_id) == (
        101, 102, 0, 103, 100)
    assert tokenizer.model_max_length == 512
    assert_same_everywhere(tokenizer, hf_tokenizer(minilm))


def test_minilm_from_vocab_txt_alone(minilm: Path, tmp_path: Path) -> None:
    """vocab.txt + tokenizer_config.json (do_lower_case etc.) without tokenizer.json gives the same encodings."""
    for name in ("vocab.txt", "tokenizer_config.json"):
        shutil.copy(minilm / name, tmp_path / name)
    tokenizer = load_tokenizer(tmp_path)
    assert_same_everywhere(tokenizer, hf_tokenizer(minilm))


def test_minilm_saved_by_us(minilm: Path, tmp_path: Path) -> None:
    load_tokenizer(minilm).save(tmp_path)
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    assert config["tokenizer_class"] == "BertTokenizer" and config["do_lower_case"] is True
    tokenizer = load_tokenizer(tmp_path)
    assert_same_everywhere(tokenizer, hf_tokenizer(tmp_path))
    # Our save has no padding or truncation baked in.
    saved = json.loads((tmp_path / "tokenizer.json").read_text())
    assert saved["padding"] is None and saved["truncation"] is None


# ------------------------------------------------------------------ trained by us
@pytest.mark.parametrize("key", list(KINDS), ids=lambda k: f"{k[0]}-{k[1]}")
def test_trained_matches_transformers(trained, key) -> None:
    tokenizer, directory = trained[key]
    expected_class = {
        ("wordpiece", "bert"): "BertTokenizer",
        ("bpe", "roberta"): "RobertaTokenizer",
        ("unigram", "roberta"): "XLMRobertaTokenizer",
        ("unigram", "bert"): "AlbertTokenizer",
    }[key]
    assert json.loads((directory / "tokenizer_config.json").read_text())["tokenizer_class"] == expected_class
    hf = hf_tokenizer(directory)
    assert type(hf).__name__ == expected_class
    loaded = load_tokenizer(directory)
    assert (loaded.kind, loaded.style, loaded.vocab_size) == (tokenizer.kind, tokenizer.style, tokenizer.vocab_size)
    assert_same_everywhere(tokenizer, hf)
    assert_same_everywhere(loaded, hf)


def test_trained_files(trained) -> None:
    expected = {
        "wordpiece": {"vocab.txt"},
        "bpe": {"vocab.json", "merges.txt"},
        "unigram": set(),
    }
    common = {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"}
    for (kind, _), (_, directory) in trained.items():
        assert {p.name for p in directory.iterdir()} == common | expected[kind]


def test_trained_specials_follow_reference_models(trained) -> None:
    wordpiece = trained[("wordpiece", "bert")][0]
    assert [wordpiece.id_to_token(i) for i in range(5)] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    for key in (("bpe", "roberta"), ("unigram", "roberta")):
        tokenizer = trained[key][0]
        assert [tokenizer.id_to_token(i) for i in range(5)] == ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
        assert (tokenizer.cls_token, tokenizer.sep_token, tokenizer.unk_id) == ("<s>", "</s>", 3)
    albert = trained[("unigram", "bert")][0]
    assert [albert.id_to_token(i) for i in range(5)] == ["<pad>", "<unk>", "[CLS]", "[SEP]", "[MASK]"]
    # Pair layout: BERT style [CLS] a [SEP] b [SEP] with type ids 0/1; RoBERTa style <s> a </s></s> b </s>, all 0.
    encoding = wordpiece.encode("a", "b")
    assert encoding.tokens == ["[CLS]", "a", "[SEP]", "b", "[SEP]"] and encoding.type_ids == [0, 0, 0, 1, 1]
    encoding = trained[("bpe", "roberta")][0].encode("a", "b")
    assert encoding.tokens == ["<s>", "a", "</s>", "</s>", "b", "</s>"] and encoding.type_ids == [0] * 6


def test_wordpiece_from_vocab_txt_alone(trained, tmp_path: Path) -> None:
    tokenizer, directory = trained[("wordpiece", "bert")]
    shutil.copy(directory / "vocab.txt", tmp_path / "vocab.txt")
    alone = load_tokenizer(tmp_path)
    assert alone.style == "bert" and alone.vocab_size == tokenizer.vocab_size
    hf = hf_tokenizer(directory)
    assert_same_everywhere(alone, hf)


def test_bpe_from_vocab_json_and_merges_alone(trained, tmp_path: Path) -> None:
    tokenizer, directory = trained[("bpe", "roberta")]
    for name in ("vocab.json", "merges.txt"):
        shutil.copy(directory / name, tmp_path / name)
    alone = load_tokenizer(tmp_path)
    assert alone.style == "roberta" and alone.vocab_size == tokenizer.vocab_size
    assert_same_everywhere(alone, hf_tokenizer(directory))
    # transformers reading the same two files (plus the class name) agrees too.
    shutil.copy(directory / "tokenizer_config.json", tmp_path / "tokenizer_config.json")
    assert_same_everywhere(alone, hf_tokenizer(tmp_path))


def test_bpe_add_prefix_space_from_config(trained, tmp_path: Path) -> None:
    """tokenizer_config.json's add_prefix_space wins over tokenizer.json's, as in transformers."""
    _, directory = trained[("bpe", "roberta")]
    for path in directory.iterdir():
        shutil.copy(path, tmp_path / path.name)
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    config["add_prefix_space"] = True
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    ours = load_tokenizer(tmp_path)
    assert ours.encode("hello").tokens[1].startswith("Ġ")
    assert_same_everywhere(ours, hf_tokenizer(tmp_path))


def test_model_type_from_config_json(trained, tmp_path: Path) -> None:
    _, directory = trained[("wordpiece", "bert")]
    for name in ("vocab.txt",):
        shutil.copy(directory / name, tmp_path / name)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "electra"}))
    assert load_tokenizer(tmp_path).style == "bert"
    unigram_dir = trained[("unigram", "roberta")][1]
    assert load_tokenizer(unigram_dir, model_type="xlm-roberta").style == "roberta"


@pytest.mark.parametrize("key", list(KINDS), ids=lambda k: f"{k[0]}-{k[1]}")
def test_lowercase_override_still_loads_the_same(corpus_file: Path, tmp_path: Path, key) -> None:
    """A pipeline no family class rebuilds (e.g. lower-cased byte-level BPE) is saved for transformers' generic
    class, which reads tokenizer.json as it is."""
    from bertology.tokenization import train_tokenizer

    kind, style = key
    flipped = not (kind == "wordpiece" or key == ("unigram", "bert"))
    tokenizer = train_tokenizer(corpus_file, kind, KINDS[key], style=style, lowercase=flipped, min_frequency=1,
                                show_progress=False)
    tokenizer.save(tmp_path)
    hf = hf_tokenizer(tmp_path)
    assert_same_everywhere(tokenizer, hf)
    assert_same_everywhere(load_tokenizer(tmp_path), hf)
    upper = tokenizer.encode("HELLO").ids == tokenizer.encode("hello").ids
    assert upper == flipped


# ------------------------------------------------------------------ truncation, padding, pre-split words
@pytest.mark.parametrize("strategy", ["longest_first", "only_first", "only_second"])
def test_truncation_matches_transformers(minilm: Path, trained, strategy: str) -> None:
    long = "The quick brown fox jumps over the lazy dog and keeps running far away."
    short = "A much shorter one."
    # The strategy's target must be the long text, and the other text must fit beside it.
    first, second = (short, long) if strategy == "only_second" else (long, short)
    tokenizers = [(load_tokenizer(minilm), hf_tokenizer(minilm))]
    tokenizers += [(tok, hf_tokenizer(directory)) for tok, directory in trained.values()]
    for ours, hf in tokenizers:
        kept = len(ours.encode(first, "")) if strategy == "only_second" else len(ours.encode("", second))
        full = len(ours.encode(first, second))
        for max_length in (kept + 1, kept + 4):
            assert max_length < full
            encoding = ours.encode(first, second, max_length=max_length, truncation=strategy)
            assert len(encoding) == max_length
            assert_same(encoding, hf, first, second, max_length=max_length, truncation=strategy)


def test_batch_padding_matches_transformers(minilm: Path, trained) -> None:
    texts = [t for t in TEXTS if t.strip()][:5]
    pairs = [p for _, p in PAIRS][:5]
    tokenizers = [(load_tokenizer(minilm), hf_tokenizer(minilm))]
    tokenizers += [(tok, hf_tokenizer(directory)) for tok, directory in trained.values()]
    for ours, hf in tokenizers:
        for kwargs, hf_kwargs in (
            ({}, {"padding": True}),
            ({"pad_to_multiple_of": 8}, {"padding": True, "pad_to_multiple_of": 8}),
            ({"padding": "max_length", "max_length": 24}, {"padding": "max_length", "max_length": 24,
                                                         "truncation": True}),
        ):
            batch = ours.encode_batch(texts, pairs, **kwargs)
            ref = hf(texts, pairs, return_tensors="pt", return_token_type_ids=True, **hf_kwargs)
            assert batch.input_ids.tolist() == ref["input_ids"].tolist()
            assert batch.attention_mask.tolist() == ref["attention_mask"].tolist()
            assert batch.token_type_ids.tolist() == ref["token_type_ids"].tolist()


WORDS = [["EU", "rejects", "German", "call", "to", "boycott", "British", "lamb", "."],
         ["Café", "naïve", "東京", "😀", "unbelievably"],
         ["Peter", "Blackburn"]]


def test_encode_words_matches_transformers(minilm: Path, trained) -> None:
    cases = [(load_tokenizer(minilm), hf_tokenizer(minilm))]
    for tokenizer, directory in trained.values():
        # transformers needs add_prefix_space=True for pre-split words with byte-level BPE.
        extra = {"add_prefix_space": True} if tokenizer.kind == "bpe" else {}
        cases.append((tokenizer, hf_tokenizer(directory, **extra)))
    for ours, hf in cases:
        for words in WORDS:
            encoding = ours.encode_words(words)
            assert_same(encoding, hf, words, is_split_into_words=True)
            assert {w for w in encoding.word_ids if w is not None} == set(range(len(words)))
        encoding = ours.encode_words(WORDS[0], WORDS[2])
        assert_same(encoding, hf, WORDS[0], WORDS[2], is_split_into_words=True)


# ------------------------------------------------------------------ real text variety from the shared data
def _mrpc_pairs(limit: int) -> list[tuple[str, str]]:
    path = SHARED / "data" / "glue" / "MRPC" / "dev.tsv"
    if not path.is_file():
        pytest.skip(f"shared data not found at {path}")
    rows = path.read_text(encoding="utf-8-sig").splitlines()[1:]
    return [(cols[3], cols[4]) for cols in (row.split("\t") for row in rows[:limit])]


def test_mrpc_pairs_match_transformers(minilm: Path, trained) -> None:
    pairs = _mrpc_pairs(150)
    cases = [(load_tokenizer(minilm), hf_tokenizer(minilm))]
    cases += [(load_tokenizer(directory), hf_tokenizer(directory)) for _, directory in trained.values()]
    for ours, hf in cases:
        batch = ours.encode_batch([a for a, _ in pairs], [b for _, b in pairs])
        ref = hf([a for a, _ in pairs], [b for _, b in pairs], return_offsets_mapping=True,
                 return_token_type_ids=True)
        for i, encoding in enumerate(batch.encodings):
            assert encoding.ids == ref["input_ids"][i]
            assert encoding.type_ids == ref["token_type_ids"][i]
            assert encoding.offsets == [tuple(o) for o in ref["offset_mapping"][i]]
            assert encoding.word_ids == ref.word_ids(i)
