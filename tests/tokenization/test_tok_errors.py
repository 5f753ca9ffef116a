"""Bad training input and bad tokenizer directories raise bertology errors that say what and where."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from bertology.errors import BertologyError, DataError, TokenizerError
from bertology.tokenization import load_tokenizer, train_tokenizer

from tok_data import CORPUS


def train(source, kind: str = "wordpiece", size: int = 200, **kwargs):
    return train_tokenizer(source, kind, size, min_frequency=1, show_progress=False, **kwargs)


# ------------------------------------------------------------------ training input
def test_non_utf8_training_file(tmp_path: Path) -> None:
    bad = tmp_path / "latin1.txt"
    bad.write_bytes("first line ok\n".encode() + "caf\xe9 au lait\n".encode("latin-1"))
    with pytest.raises(DataError) as error:
        train(bad)
    message = str(error.value)
    assert str(bad) in message and "byte offset 17" in message and "line 2" in message and "0xe9" in message


def test_utf8_bom_and_crlf_are_fine(tmp_path: Path) -> None:
    path = tmp_path / "bom.txt"
    path.write_bytes(b"\xef\xbb\xbf" + CORPUS.replace("\n", "\r\n").encode())
    tokenizer = train(path)
    assert tokenizer.token_to_id("\ufeff") is None and tokenizer.token_to_id("\r") is None


def test_missing_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope.txt"
    with pytest.raises(DataError, match="nope.txt: no such file or directory"):
        train([missing])


def test_list_of_texts_where_paths_are_expected(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"iter\(texts\)"):
        train(["this is a sentence, not a file"])


def test_directory_with_an_unreadable_file(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text(CORPUS, encoding="utf-8")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "weights.bin").write_bytes(bytes(range(256)))
    with pytest.raises(DataError, match=r"weights\.bin: line 2: cannot decode as utf-8 at byte offset 128 \(byte 0x80\)"):
        train(tmp_path)


def test_directory_skips_hidden_files_and_reads_subdirectories(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "a.txt").write_text(CORPUS, encoding="utf-8")
    (tmp_path / ".hidden").write_bytes(b"\xff\xfe binary")
    assert train(tmp_path).token_to_id("bank") is not None


def test_empty_directory_and_unmatched_glob(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="empty: matched no files"):
        train(tmp_path / "empty")
    with pytest.raises(DataError, match=r"\*\.txt: matched no files"):
        train(str(tmp_path / "*.txt"))


def test_glob_and_iterator_inputs_agree(tmp_path: Path) -> None:
    (tmp_path / "part1.txt").write_text(CORPUS, encoding="utf-8")
    # All three train deterministically (WordPiece: test_tok_determinism.py, Unigram: test_unigram_determinism.py).
    for kind in ("bpe", "wordpiece", "unigram"):
        from_glob = train(str(tmp_path / "part*.txt"), kind=kind)
        from_texts = train(iter(CORPUS.splitlines()), kind=kind)
        assert from_glob.backend.get_vocab() == from_texts.backend.get_vocab()


def test_empty_corpus(tmp_path: Path) -> None:
    path = tmp_path / "blank.txt"
    path.write_text("\n   \n\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"empty corpus: no sentences in 1 file\(s\) \(.*blank\.txt\)"):
        train(path)
    with pytest.raises(DataError, match=r"no usable text in the training texts \(0 texts, 0 characters\)"):
        train(iter([]))
    with pytest.raises(DataError, match="no usable text in the training texts \\(2 texts"):
        train(iter(["", "   "]))


def test_bad_training_options() -> None:
    texts = CORPUS.splitlines()
    with pytest.raises(TokenizerError, match="unknown tokenizer kind 'sentencepiece'"):
        train(iter(texts), kind="sentencepiece")
    with pytest.raises(TokenizerError, match="wordpiece tokenizer is trained in bert style only"):
        train(iter(texts), style="roberta")
    with pytest.raises(TokenizerError, match="unknown tokenizer style"):
        train(iter(texts), kind="unigram", style="electra")
    with pytest.raises(TokenizerError, match="leaves no room"):
        train(iter(texts), size=5)
    with pytest.raises(TokenizerError, match="must be strings"):
        train(iter([b"bytes are not text"]))


# ------------------------------------------------------------------ tokenizer directories
def test_missing_directory(tmp_path: Path) -> None:
    with pytest.raises(TokenizerError, match="does not exist"):
        load_tokenizer(tmp_path / "absent")


def test_directory_with_unknown_files_only(tmp_path: Path) -> None:
    (tmp_path / "model.safetensors").write_bytes(b"\x00")
    (tmp_path / "notes.md").write_text("hi")
    with pytest.raises(TokenizerError, match=r"no tokenizer files.*found model\.safetensors, notes\.md"):
        load_tokenizer(tmp_path)


def test_sentencepiece_model_only(tmp_path: Path) -> None:
    (tmp_path / "spiece.model").write_bytes(b"\x0a\x00")
    with pytest.raises(TokenizerError, match=r"spiece\.model.*tokenizer\.json.*save_pretrained"):
        load_tokenizer(tmp_path)


def test_bpe_with_a_missing_or_bad_file(trained, tmp_path: Path) -> None:
    _, directory = trained[("bpe", "roberta")]
    shutil.copy(directory / "vocab.json", tmp_path / "vocab.json")
    with pytest.raises(TokenizerError, match="no merges.txt"):
        load_tokenizer(tmp_path)
    (tmp_path / "merges.txt").write_text("#version: 0.2\nĠ t\nthree parts here\n", encoding="utf-8")
    with pytest.raises(TokenizerError, match=r"merges\.txt: line 3: expected two tokens"):
        load_tokenizer(tmp_path)
    (tmp_path / "merges.txt").write_text("#version: 0.2\nnot_in_vocab zzz\n", encoding="utf-8")
    with pytest.raises(TokenizerError, match="merges do not fit"):
        load_tokenizer(tmp_path)


def test_bad_json_files(trained, tmp_path: Path) -> None:
    _, directory = trained[("wordpiece", "bert")]
    shutil.copy(directory / "vocab.txt", tmp_path / "vocab.txt")
    (tmp_path / "tokenizer_config.json").write_text('{"do_lower_case": true,\n "oops"}', encoding="utf-8")
    with pytest.raises(TokenizerError, match=r"tokenizer_config\.json: not valid JSON at line 2, column 8"):
        load_tokenizer(tmp_path)
    (tmp_path / "tokenizer_config.json").write_text("[1, 2]", encoding="utf-8")
    with pytest.raises(TokenizerError, match="expected a JSON object"):
        load_tokenizer(tmp_path)
    (tmp_path / "tokenizer_config.json").unlink()
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "mamba"}), encoding="utf-8")
    with pytest.raises(TokenizerError, match=r"config\.json: key 'model_type': unknown model type 'mamba'"):
        load_tokenizer(tmp_path)
    with pytest.raises(TokenizerError, match="model_type argument: unknown model type 'mamba'"):
        load_tokenizer(directory, model_type="mamba")


def test_bad_vocab_files(tmp_path: Path) -> None:
    (tmp_path / "vocab.txt").write_bytes(b"[PAD]\n[UNK]\n\xff\n")
    with pytest.raises(TokenizerError, match=r"vocab\.txt: not UTF-8 at byte offset 12"):
        load_tokenizer(tmp_path)
    (tmp_path / "vocab.txt").write_text("[PAD]\n[CLS]\n[SEP]\n[MASK]\nhello\n", encoding="utf-8")
    with pytest.raises(TokenizerError, match=r"'\[UNK\]' is not in the vocabulary"):
        load_tokenizer(tmp_path)
    (tmp_path / "vocab.txt").write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\nhello\n", encoding="utf-8")
    with pytest.raises(TokenizerError, match=r"'\[MASK\]' not in the vocabulary"):
        load_tokenizer(tmp_path)


def test_broken_tokenizer_json(tmp_path: Path) -> None:
    (tmp_path / "tokenizer.json").write_text('{"model": {"type": "Nope"}}', encoding="utf-8")
    with pytest.raises(TokenizerError, match=r"tokenizer\.json: cannot read tokenizer"):
        load_tokenizer(tmp_path)


def test_errors_are_bertology_errors() -> None:
    assert issubclass(TokenizerError, BertologyError) and issubclass(DataError, BertologyError)
