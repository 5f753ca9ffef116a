"""`bertology tokenizer train` refuses corpora without text and outputs that would lose data, each as one line."""

from __future__ import annotations

from pathlib import Path

import pytest

import bertology.cli.tokenizer as tokenizer_cli
from bertology.cli.main import main
from bertology.data.corpus import CorpusSource
from bertology.errors import DataError, TokenizerError
from bertology.tokenization import load_tokenizer, train_tokenizer

from tok_data import CORPUS


def train(tmp_path: Path, *args: str, kind: str = "wordpiece", vocab_size: int = 300, out: Path | None = None) -> int:
    return main(["tokenizer", "train", "--kind", kind, "--vocab-size", str(vocab_size), "--min-frequency", "1",
                 "--quiet", "--out", str(out or tmp_path / "tok"), *args])


def one_line_error(capsys) -> str:
    err = capsys.readouterr().err
    assert err.startswith("bertology tokenizer: error: ") and err.count("\n") == 1, err
    return err


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    path = tmp_path / "corpus.txt"
    path.write_text(CORPUS, encoding="utf-8")
    return path


# ------------------------------------------------------------------ corpora without usable text
@pytest.mark.parametrize("kind", ["wordpiece", "bpe", "unigram"])
@pytest.mark.parametrize(("name", "content"), [
    ("nul.bin", b"\x00" * 102400),
    ("controls.txt", "\x07\x1b \t\u200b\ufeff\x0b\n".encode() * 50 + b"\x00\x01\x02\n"),
])
def test_no_usable_text(tmp_path: Path, capsys, kind: str, name: str, content: bytes) -> None:
    path = tmp_path / name
    path.write_bytes(content)
    assert train(tmp_path, str(path), kind=kind) == 2
    err = one_line_error(capsys)
    assert f"no usable text in {path} ({len(content)} bytes, " in err
    assert "only whitespace, control or format characters" in err
    assert not (tmp_path / "tok").exists()


def test_no_usable_text_names_every_file(tmp_path: Path, capsys) -> None:
    (tmp_path / "a.txt").write_bytes(b"\x00" * 10 + b"\n")
    (tmp_path / "b.txt").write_bytes(b"\x1b\x1b\n")
    assert train(tmp_path, str(tmp_path / "a.txt"), f"text:{tmp_path / 'b.txt'}") == 2
    assert f"no usable text in {tmp_path / 'a.txt'}, {tmp_path / 'b.txt'} (2 files, 14 bytes, 2 non-blank lines)" \
        in one_line_error(capsys)


def test_no_usable_text_api(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"no usable text in the training texts \(3 texts, 6 characters\)"):
        train_tokenizer(iter(["\x00\x00", "\u200b", "\x7f\x1b\x07"]), "bpe", 300, show_progress=False)
    nul = tmp_path / "nul.txt"
    nul.write_bytes(b"\x00" * 100)
    with pytest.raises(DataError, match=r"nul\.txt \(100 bytes, 1 non-blank line\)"):
        train_tokenizer(nul, "wordpiece", 300, show_progress=False)
    with pytest.raises(DataError, match=r"nul\.txt \(100 bytes"):
        train_tokenizer(CorpusSource(nul, "text"), "unigram", 300, show_progress=False)


def test_one_usable_word_is_enough_and_a_small_vocabulary_is_a_note(tmp_path: Path, capsys) -> None:
    path = tmp_path / "tiny.txt"
    path.write_text("\x00\x00\nhello\n", encoding="utf-8")
    assert train(tmp_path, str(path), vocab_size=30000) == 0
    err = capsys.readouterr().err
    size = load_tokenizer(tmp_path / "tok").vocab_size
    assert size < 30000 and f"note: the corpus gave {size} of the 30000 tokens asked for" in err
    # Punctuation and symbols are text too (code, formulas): only controls, format characters and spaces are not.
    assert train_tokenizer(iter(["=> ++ ∑ 😀"]), "bpe", 300, show_progress=False).vocab_size > 256


def test_corpus_source_api_matches_the_command(tmp_path: Path, corpus: Path) -> None:
    running = tmp_path / "running.txt"
    running.write_text("The bank was\nquiet. A heron\nstood there.\n", encoding="utf-8")
    assert train(tmp_path, str(corpus), f"text:{running}", kind="bpe") == 0
    api = train_tokenizer([corpus, CorpusSource(running, "text")], "bpe", 300, min_frequency=1, show_progress=False)
    assert load_tokenizer(tmp_path / "tok").backend.get_vocab() == api.backend.get_vocab()


# ------------------------------------------------------------------ bad options
@pytest.mark.parametrize(("args", "message"), [
    (["--vocab-size", "10000000000000"], "vocab_size 10000000000000 is larger than the 2097152 tokens"),
    (["--min-frequency", "-1"], "min_frequency must be a non-negative integer, got -1"),
    (["--model-max-length", "0"], "model_max_length must be a positive integer or None, got 0"),
    (["--vocab-size", "5"], "vocab_size 5 leaves no room beside the 5 special tokens"),
])
def test_bad_numbers(tmp_path: Path, capsys, corpus: Path, args: list[str], message: str) -> None:
    argv = ["tokenizer", "train", "--kind", "wordpiece", "--vocab-size", "300", "--quiet",
            "--out", str(tmp_path / "tok"), str(corpus)]
    assert main(argv + args) == 2  # the later --vocab-size wins
    assert message in one_line_error(capsys)
    assert not (tmp_path / "tok").exists()


# ------------------------------------------------------------------ output directory
@pytest.fixture
def no_training(monkeypatch) -> list:
    """Fails the test if training starts: the output checks come first."""
    calls: list = []

    def spy(*args, **kwargs):
        calls.append(args)
        raise AssertionError("training started before the output was checked")

    monkeypatch.setattr(tokenizer_cli, "train_tokenizer", spy)
    return calls


@pytest.mark.parametrize("model_file", ["config.json", "model.safetensors", "bertology.json"])
def test_model_directory_is_refused_without_overwrite(tmp_path: Path, capsys, corpus: Path, no_training,
                                                      model_file: str) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / model_file).write_text("{}")
    (model / "tokenizer.json").write_text("original")
    assert train(tmp_path, str(corpus), out=model) == 2
    err = one_line_error(capsys)
    assert f"--out {model}: holds a model ({model_file}) whose weights depend on the tokenizer there" in err
    assert "--overwrite" in err
    assert (model / "tokenizer.json").read_text() == "original" and not no_training


def test_overwrite_replaces_only_the_tokenizer_files(tmp_path: Path, corpus: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"model_type": "bert"}')
    (model / "model.safetensors").write_bytes(b"weights")
    (model / "tokenizer.json").write_text("original")
    assert train(tmp_path, str(corpus), "--overwrite", out=model) == 0
    assert (model / "model.safetensors").read_bytes() == b"weights"
    assert (model / "config.json").read_text() == '{"model_type": "bert"}'
    assert load_tokenizer(model).token_to_id("bank") is not None


def test_directory_without_a_model_is_filled(tmp_path: Path, corpus: Path) -> None:
    out = tmp_path / "tok"
    out.mkdir()
    (out / "notes.md").write_text("mine")
    assert train(tmp_path, str(corpus), out=out) == 0
    assert (out / "notes.md").read_text() == "mine" and (out / "vocab.txt").is_file()


def test_out_is_a_file_or_below_a_file(tmp_path: Path, capsys, corpus: Path, no_training) -> None:
    afile = tmp_path / "afile"
    afile.write_text("keep")
    assert train(tmp_path, str(corpus), out=afile) == 2
    assert f"--out {afile}: is a file, not a directory" in one_line_error(capsys)
    assert train(tmp_path, str(corpus), out=afile / "sub" / "tok") == 2
    assert f"--out {afile / 'sub' / 'tok'}: {afile} is a file, not a directory" in one_line_error(capsys)
    assert afile.read_text() == "keep" and not no_training


def test_new_directory_appears_complete(tmp_path: Path, corpus: Path) -> None:
    out = tmp_path / "deep" / "tok"
    assert train(tmp_path, str(corpus), out=out) == 0
    assert sorted(p.name for p in out.iterdir()) == ["special_tokens_map.json", "tokenizer.json",
                                                     "tokenizer_config.json", "vocab.txt"]
    assert [p.name for p in out.parent.iterdir()] == ["tok"]  # no temporary directory left behind


def test_save_to_a_file_is_an_error(tmp_path: Path) -> None:
    tokenizer = train_tokenizer(iter(CORPUS.splitlines()), "wordpiece", 200, show_progress=False)
    (tmp_path / "afile").write_text("x")
    with pytest.raises(TokenizerError, match="afile: it is a file, not a directory"):
        tokenizer.save(tmp_path / "afile")
    with pytest.raises(TokenizerError, match="afile is a file, not a directory"):
        tokenizer.save(tmp_path / "afile" / "tok")
