"""The word vocabulary of ELMo's softmax: one splitting rule, a deterministic order, its file, and bad files."""

from __future__ import annotations

import pytest

from bertology.errors import TokenizerError
from bertology.tokenization.words import SPECIALS, WordVocabulary


def test_build_split_encode_and_round_trip(tmp_path):
    texts = ["The cat's well-known toy, 1.5 m long.", "the cat sat", "The end!"]
    vocab = WordVocabulary.build(texts, vocab_size=8)
    assert vocab.split(texts[0]) == ["The", "cat's", "well-known", "toy", ",", "1.5", "m", "long", "."]
    # The specials, then by count (The: 2), ties in order of first occurrence.
    assert vocab.words == [*SPECIALS, "The", "cat's", "well-known", "toy"]
    assert vocab.vocab_size == 8 and vocab.encode(["zebra"]) == [vocab.unk_id]
    lower = WordVocabulary.build(texts, vocab_size=100, lowercase=True)
    assert "The" not in lower.words and lower.id("the") > 3
    lower.save(tmp_path)
    again = WordVocabulary.load(tmp_path)
    assert again.words == lower.words and again.lowercase
    assert WordVocabulary.build(texts, 100).words == WordVocabulary.build(texts, 100).words  # same order every run


def test_bad_vocabulary_files_name_the_file_and_line(tmp_path):
    with pytest.raises(TokenizerError, match="no word vocabulary"):
        WordVocabulary.load(tmp_path)
    (tmp_path / "words.txt").write_text("<pad>\n<S>\n</S>\n<UNK>\nfine\ntwo words\n")
    with pytest.raises(TokenizerError, match=r"words.txt, line 6: 'two words' is not a word"):
        WordVocabulary.load(tmp_path)
    (tmp_path / "words.txt").write_text("the\ncat\n")
    with pytest.raises(TokenizerError, match=r"words.txt: a word vocabulary starts with <pad>"):
        WordVocabulary.load(tmp_path)
    (tmp_path / "words.txt").write_text("<pad>\n<S>\n</S>\n<UNK>\ncat\ncat\n")
    with pytest.raises(TokenizerError, match="'cat' appears twice"):
        WordVocabulary.load(tmp_path)
    (tmp_path / "words.txt").write_bytes(b"<pad>\n\xff\n")
    with pytest.raises(TokenizerError, match="not UTF-8"):
        WordVocabulary.load(tmp_path)
    with pytest.raises(TokenizerError, match="vocab_size must be > 4"):
        WordVocabulary.build(["a"], vocab_size=4)
