"""Encoding behaviour on awkward input: empty and whitespace-only text, control and zero-width characters, emoji,
very long words and very long texts; word alignment; padding and decoding."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from bertology.errors import TokenizerError
from bertology.tokenization import Tokenizer, load_tokenizer


@pytest.fixture(scope="module")
def bert(minilm: Path) -> Tokenizer:
    return load_tokenizer(minilm)


def all_tokenizers(bert: Tokenizer, trained) -> list[Tokenizer]:
    return [bert] + [tokenizer for tokenizer, _ in trained.values()]


@pytest.mark.parametrize("text", ["", " ", "   \t\n  "])
def test_empty_and_whitespace_only(bert, trained, text: str) -> None:
    for tokenizer in all_tokenizers(bert, trained):
        encoding = tokenizer.encode(text)
        if tokenizer.kind == "bpe":
            # Byte-level BPE treats whitespace as content (like RoBERTa): tokens that decode back to the text.
            assert len(encoding) == 2 + (len(text) > 0) * len(tokenizer.encode(text, add_special_tokens=False))
            assert tokenizer.decode(encoding.ids) == text
            continue
        assert encoding.ids == [tokenizer.cls_id, tokenizer.sep_id]
        assert encoding.word_ids == [None, None] and encoding.special_tokens_mask == [1, 1]
        assert tokenizer.encode(text, add_special_tokens=False).ids == []
        assert tokenizer.decode(encoding.ids) == ""
    assert trained[("bpe", "roberta")][0].encode("").ids == [0, 2]


def test_empty_pair_keeps_layout(bert, trained) -> None:
    encoding = bert.encode("empty second", "")
    assert encoding.tokens == ["[CLS]", "empty", "second", "[SEP]", "[SEP]"]
    assert encoding.type_ids == [0, 0, 0, 0, 1]
    roberta = trained[("bpe", "roberta")][0]
    assert roberta.encode("", "").tokens == ["<s>", "</s>", "</s>", "</s>"]


def test_empty_text_in_a_batch(bert) -> None:
    batch = bert.encode_batch(["", "hello world"])
    assert batch.input_ids.tolist() == [[101, 102, 0, 0], [101, 7592, 2088, 102]]
    assert batch.attention_mask.tolist() == [[1, 1, 0, 0], [1, 1, 1, 1]]


def test_control_and_zero_width_characters(bert, trained) -> None:
    # BERT's normaliser drops control characters and zero-width format characters, joining what they split.
    assert bert.encode("\u200b\x00").ids == [bert.cls_id, bert.sep_id]
    assert bert.encode("co\u200boperate").ids == bert.encode("cooperate").ids
    assert bert.encode("a\x00b\x07c").ids == bert.encode("abc").ids
    encoding = bert.encode("zero\u200dwidth")
    assert encoding.offsets[1][0] == 0 and encoding.offsets[-2][1] == len("zero\u200dwidth")
    # Byte-level BPE keeps every character as bytes and gives it back on decoding.
    roberta = trained[("bpe", "roberta")][0]
    text = "a\x00b co\u200boperate"
    assert roberta.unk_id not in roberta.encode(text).ids
    assert roberta.decode(roberta.encode(text).ids) == text


def test_emoji(bert, trained) -> None:
    encoding = bert.encode("I love 😀 so much")
    assert encoding.tokens[3] == "[UNK]" and encoding.offsets[3] == (7, 8)  # one character, one unknown token
    roberta = trained[("bpe", "roberta")][0]
    ids = roberta.encode("party 🎉😀").ids
    assert roberta.unk_id not in ids and roberta.decode(ids) == "party 🎉😀"
    unigram = trained[("unigram", "roberta")][0]
    assert "🎉" in unigram.encode("party 🎉").tokens  # seen in training: kept whole
    encoding = unigram.encode("party 🦀")  # never seen: the unknown token, still aligned to its word
    assert encoding.ids[-2] == unigram.unk_id and encoding.word_ids[-2] == 1 and encoding.offsets[-2] == (6, 7)


def test_hundred_character_word(bert) -> None:
    # WordPiece splits words up to 100 characters and maps longer ones to a single [UNK] (like BERT).
    word = "ab" * 50
    encoding = bert.encode(word)
    assert bert.unk_id not in encoding.ids and len(encoding) > 3
    assert set(encoding.word_ids[1:-1]) == {0}
    assert "".join(t.removeprefix("##") for t in encoding.tokens[1:-1]) == word
    too_long = bert.encode(word + "a")
    assert too_long.tokens == ["[CLS]", "[UNK]", "[SEP]"] and too_long.offsets[1] == (0, 101)


def test_hundred_character_word_other_kinds(trained) -> None:
    word = "ab" * 50
    for tokenizer, _ in trained.values():
        encoding = tokenizer.encode(word)
        pieces = [t for t, w in zip(encoding.tokens, encoding.word_ids) if w is not None]
        assert len(pieces) > 1 and set(w for w in encoding.word_ids if w is not None) == {0}
        assert tokenizer.decode(encoding.ids).strip() == word


def test_ten_thousand_tokens(bert, trained) -> None:
    text = " ".join(["word", "piece", "test", "."] * 2500)
    for tokenizer in all_tokenizers(bert, trained):
        full = tokenizer.encode(text)
        assert len(full) >= 10_002  # no max_length: nothing is cut, even past model_max_length
        cut = tokenizer.encode(text, max_length=512)
        assert len(cut) == 512 and cut.ids[0] == tokenizer.cls_id and cut.ids[-1] == tokenizer.sep_id
        assert cut.ids[:511] == full.ids[:511]
        batch = tokenizer.encode_batch([text, "short"], max_length=512)
        assert tuple(batch.input_ids.shape) == (2, 512)
        assert batch.attention_mask.sum(dim=1).tolist() == [512, len(tokenizer.encode("short"))]
    # Truncation state never leaks into the next call.
    assert len(bert.encode(text)) == len(bert.encode(text, max_length=None))


def test_word_ids_align_subwords_to_words(bert, trained) -> None:
    text = "Tokenizers split unbelievably long words, don't they?"
    words = ["Tokenizers", "split", "unbelievably", "long", "words", ",", "don", "'", "t", "they", "?"]
    encoding = bert.encode(text)
    assert max(w for w in encoding.word_ids if w is not None) == len(words) - 1
    for index, word in enumerate(words):
        pieces = [t.removeprefix("##") for t, w in zip(encoding.tokens, encoding.word_ids) if w == index]
        assert "".join(pieces) == word.lower()
        spans = [o for o, w in zip(encoding.offsets, encoding.word_ids) if w == index]
        assert text[spans[0][0]:spans[-1][1]] == word
    for tokenizer in all_tokenizers(bert, trained):
        encoding = tokenizer.encode(text, "second text here")
        for sequence, source in ((0, text), (1, "second text here")):
            ids = [w for w, s in zip(encoding.word_ids, encoding.sequence_ids) if s == sequence]
            assert ids[0] == 0 and ids == sorted(ids)  # word ids restart for the second text
            spans: dict[int, list[tuple[int, int]]] = {}
            for w, s, o in zip(encoding.word_ids, encoding.sequence_ids, encoding.offsets):
                if s == sequence:
                    spans.setdefault(w, []).append(o)
            # The words' character spans are disjoint and in order, and each covers a non-space piece of text.
            ranges = [(min(a for a, _ in v), max(b for _, b in v)) for _, v in sorted(spans.items())]
            assert all(ranges[i][1] <= ranges[i + 1][0] for i in range(len(ranges) - 1))
            assert all(source[a:b].strip() for a, b in ranges)


def test_encode_words_indexes_given_words(bert, trained) -> None:
    words = ["New", "York-based", "company", "😀", ""]
    for tokenizer in all_tokenizers(bert, trained):
        encoding = tokenizer.encode_words(words)
        # An empty word yields no token; every other word has at least one.
        assert {w for w in encoding.word_ids if w is not None} == {0, 1, 2, 3}
        truncated = tokenizer.encode_words(words, max_length=4)
        assert len(truncated) == 4 and truncated.word_ids[1] == 0
    with pytest.raises(TokenizerError, match="list of strings"):
        bert.encode_words("not a list")


def test_batch_padding_options(bert) -> None:
    batch = bert.encode_batch(["a b c", "a"], pad_to_multiple_of=8)
    assert tuple(batch.input_ids.shape) == (2, 8)
    assert batch.input_ids.dtype == torch.long and batch.input_ids[1, 3:].eq(bert.pad_id).all()
    assert bert.encode_batch(["a"], padding="max_length", max_length=16).input_ids.shape == (1, 16)
    pairs = bert.encode_batch(["a", "b"], ["c d", "e"])
    assert pairs.token_type_ids.tolist() == [[0, 0, 0, 1, 1, 1], [0, 0, 0, 1, 1, 0]]


def test_bad_arguments(bert) -> None:
    with pytest.raises(TokenizerError, match="one string"):
        bert.encode_batch("a text")
    with pytest.raises(TokenizerError, match="no texts"):
        bert.encode_batch([])
    with pytest.raises(TokenizerError, match="2 texts but 1 pairs"):
        bert.encode_batch(["a", "b"], ["c"])
    with pytest.raises(TokenizerError, match="needs max_length"):
        bert.encode_batch(["a"], padding="max_length")
    with pytest.raises(TokenizerError, match="unknown padding"):
        bert.encode_batch(["a"], padding="left")
    with pytest.raises(TokenizerError, match="unknown truncation"):
        bert.encode("a", truncation="middle")
    with pytest.raises(TokenizerError, match="needs a text pair"):
        bert.encode("a", max_length=4, truncation="only_second")
    with pytest.raises(TokenizerError, match="positive integer"):
        bert.encode("a", max_length=0)
    with pytest.raises(TokenizerError, match="too short"):
        bert.encode("a b c", "d e f g h", max_length=5, truncation="only_first")
    with pytest.raises(TokenizerError, match="must be a string"):
        bert.encode(None)  # type: ignore[arg-type]
    with pytest.raises(TokenizerError, match="outside the vocabulary"):
        bert.decode([101, 40000])


def test_vocabulary_helpers_and_decode(bert) -> None:
    assert bert.token_to_id("hello") == 7592 and bert.id_to_token(7592) == "hello"
    assert bert.token_to_id("notatoken!!") is None and bert.id_to_token(10**6) is None
    assert bert.special_ids == frozenset({0, 100, 101, 102, 103})
    ids = bert.encode("Hello, [MASK] world!").ids
    assert bert.mask_id in ids  # specials in raw text are matched whole
    assert bert.decode(ids) == "hello, world!"
    assert bert.decode(torch.tensor(ids), skip_special_tokens=False) == "[CLS] hello, [MASK] world! [SEP]"
