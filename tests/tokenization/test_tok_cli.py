"""`bertology tokenizer train` writes loadable HF files and reports bad input as an error, not a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from bertology.cli.main import main
from bertology.tokenization import load_tokenizer

from tok_data import CORPUS


@pytest.mark.parametrize(("kind", "files"), [("wordpiece", ["vocab.txt"]), ("bpe", ["vocab.json", "merges.txt"]),
                                             ("unigram", [])])
def test_train_command(tmp_path: Path, kind: str, files: list[str], capsys) -> None:
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "a.txt").write_text(CORPUS, encoding="utf-8")
    (tmp_path / "data" / "b.txt").write_text(CORPUS.upper(), encoding="utf-8")
    out = tmp_path / "tok"
    rc = main(["tokenizer", "train", "--kind", kind, "--vocab-size", "300", "--min-frequency", "1", "--quiet",
               "--out", str(out), str(tmp_path / "data" / "a.txt"), str(tmp_path / "data" / "b*.txt")])
    assert rc == 0
    for name in ["tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", *files]:
        assert (out / name).is_file()
    tokenizer = load_tokenizer(out)
    assert tokenizer.kind == kind and tokenizer.vocab_size <= 300
    assert f"wrote {kind} tokenizer" in capsys.readouterr().err


def test_train_command_bad_input(tmp_path: Path, capsys) -> None:
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"ok\n\xff\n")
    rc = main(["tokenizer", "train", "--kind", "bpe", "--vocab-size", "300", "--quiet", "--out",
               str(tmp_path / "tok"), str(bad)])
    assert rc == 2
    assert "bad.txt: not valid UTF-8 at byte offset 3" in capsys.readouterr().err
    assert not (tmp_path / "tok").exists()
    rc = main(["tokenizer", "train", "--kind", "bpe", "--vocab-size", "300", "--out", str(tmp_path / "tok"),
               str(tmp_path / "missing.txt")])
    assert rc == 2 and "does not exist" in capsys.readouterr().err
