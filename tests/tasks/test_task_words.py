"""ELMo's task inputs: one token per word between sentence markers, longest-first truncation, the vocabulary's
lower-casing, and batches of characters."""

from __future__ import annotations

import pytest
import torch

from bertology.errors import TokenizerError
from bertology.model.elmo import CharacterMapper
from bertology.tasks.sequence import EncodedExamples
from bertology.tasks.words import CharacterBatches, WordTokenizer
from bertology.tokenization.words import SPECIALS, WordVocabulary


def test_words_are_framed_one_token_each_and_pairs_truncated_longest_first():
    tokenizer = WordTokenizer(50)
    one = tokenizer.encode_words(["Paris", "is", "big"])
    assert one.tokens == ["<S>", "Paris", "is", "big", "</S>"] and one.word_ids == [None, 0, 1, 2, None]
    assert one.ids[0] == tokenizer.bos_id and one.ids[-1] == tokenizer.eos_id and len(set(one.ids)) == 5
    batch = tokenizer.encode_batch(["a b c d e", "x"], ["f g", "y z"], max_length=8)
    first, second = batch.encodings
    assert first.tokens == ["<S>", "a", "b", "</S>", "<S>", "f", "g", "</S>"]  # 5 + 2 words cut to 4
    assert first.type_ids == [0] * 4 + [1] * 4 and second.tokens == ["<S>", "x", "</S>", "<S>", "y", "z", "</S>"]
    with pytest.raises(TokenizerError, match="max_length 5 leaves no room for words after the 4 sentence markers"):
        tokenizer.encode_batch(["a"], ["b"], max_length=5)
    with pytest.raises(TokenizerError, match="encode_words: words must be a list of strings"):
        tokenizer.encode_words("Paris")


def test_a_lowercasing_vocabulary_lowercases_and_batches_carry_characters(tmp_path):
    vocabulary = WordVocabulary([*SPECIALS, "paris"], lowercase=True)
    tokenizer = WordTokenizer(12, vocabulary)
    encoding = tokenizer.encode_words(["PARIS", "Paris"])
    assert encoding.ids[1] == encoding.ids[2]  # one spelling once lower-cased
    examples = EncodedExamples([encoding.ids, tokenizer.encode_words(["x"]).ids], [[0] * 4, [0] * 3], None,
                               tokenizer.pad_id, shuffle=False)
    batch = next(CharacterBatches(examples, tokenizer.types).batches(0, 2, drop_last=False))
    mapper = CharacterMapper(12)
    assert batch.input_ids.shape == (2, 4, 12)
    rows = {int(i): row for i, row in zip(batch.example_ids, batch.input_ids)}
    assert rows[0][1].tolist() == mapper.word("paris") and rows[0][0].tolist() == mapper.word("<S>")
    assert rows[1][3].tolist() == [0] * 12  # padding: no characters
    assert torch.equal(rows[1][:3], torch.tensor([mapper.word(w) for w in ("<S>", "x", "</S>")]))
    tokenizer.save(tmp_path)
    assert WordVocabulary.load(tmp_path).words == vocabulary.words
