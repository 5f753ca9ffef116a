"""`bertology embed` files: texts survive the .npz exactly, bad paths fail before any work, as one line."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import bertology.cli.embed as embed_cli
import bertology.text.corpus as corpus_module
from bertology.cli.main import main
from bertology.embeddings import embed, load_vectors, read_texts, save_vectors
from bertology.errors import DataError
from bertology.model import load

# Trailing NULs (which numpy unicode arrays drop), NULs inside, non-BMP characters, a text of NULs only.
AWKWARD = ["bank\x00", "a\x00b river\x00bank", "😀 emoji 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 bank\x00\x00", "\x00", "plain text"]


def run(*argv) -> int:
    return main([str(a) for a in argv])


def one_line_error(capsys) -> str:
    err = capsys.readouterr().err
    assert err.startswith("bertology embed: error: ") and err.count("\n") == 1, err
    return err


@pytest.fixture(scope="module")
def minilm(minilm_path):
    return load(minilm_path)


@pytest.fixture
def source(tmp_path: Path) -> Path:
    path = tmp_path / "in.txt"
    path.write_text("\n".join(AWKWARD) + "\n", encoding="utf-8")
    return path


@pytest.mark.parametrize("level", ["sentence", "word", "token"])
def test_texts_and_strings_survive_exactly(minilm_path, minilm, tmp_path, source, level):
    out = tmp_path / f"{level}.npz"
    assert run("embed", "--model", minilm_path, "--input", source, "--output", out, "--level", level, "--quiet") == 0
    with np.load(out, allow_pickle=False) as raw:  # plain numeric arrays only
        assert all(raw[name].dtype != object for name in raw.files)
    saved = load_vectors(out)
    assert saved["texts"] == AWKWARD and saved["meta"]["format"] == 2
    if level != "sentence":
        pieces = getattr(embed(minilm, AWKWARD), f"{level}s")
        assert saved["strings"] == pieces.strings and len(saved["strings"]) == len(saved["vectors"])
        if level == "word":
            for text, start, end, string in zip(saved["text_index"], saved["start"], saved["end"], saved["strings"]):
                assert AWKWARD[text][start:end] == string
            assert "𝔘𝔫𝔦𝔠𝔬𝔡𝔢" in saved["strings"]


def test_api_round_trip_and_by_hand(minilm, tmp_path):
    result = embed(minilm, AWKWARD, levels=("word",))
    out = tmp_path / "words.npz"
    assert save_vectors(result, out, "word") == len(result.words)
    saved = load_vectors(out)
    assert saved["texts"] == AWKWARD and saved["strings"] == result.words.strings
    np.testing.assert_array_equal(saved["vectors"], result.words.vectors)
    raw = np.load(out)
    offsets = raw["texts_offsets"]
    assert [bytes(raw["texts_utf8"][a:b]).decode() for a, b in zip(offsets[:-1], offsets[1:])] == AWKWARD


def test_older_files_still_read(tmp_path):
    """Before format 2, texts and strings were numpy unicode arrays."""
    out = tmp_path / "old.npz"
    np.savez(out, vectors=np.ones((2, 3), np.float32), text_index=np.array([0, 1]), strings=np.array(["a", "b"]),
             texts=np.array(["a x", "b"]), meta=np.array(json.dumps({"level": "word"})))
    saved = load_vectors(out)
    assert saved["texts"] == ["a x", "b"] and saved["strings"] == ["a", "b"] and saved["meta"] == {"level": "word"}
    np.save(tmp_path / "s.npy", np.zeros((2, 3), np.float32))
    assert load_vectors(tmp_path / "s.npy")["vectors"].shape == (2, 3)


def test_load_vectors_errors(tmp_path):
    with pytest.raises(DataError, match="missing.npz: no such file"):
        load_vectors(tmp_path / "missing.npz")
    with pytest.raises(DataError, match="is a directory"):
        load_vectors(tmp_path)
    (tmp_path / "junk.npz").write_bytes(b"not numpy at all")
    with pytest.raises(DataError, match="junk.npz: not a .npy or .npz file"):
        load_vectors(tmp_path / "junk.npz")
    np.savez(tmp_path / "other.npz", weights=np.zeros(3))
    with pytest.raises(DataError, match="no 'vectors' array \\(found weights\\)"):
        load_vectors(tmp_path / "other.npz")
    np.savez(tmp_path / "cut.npz", vectors=np.zeros((1, 2)), texts_utf8=np.frombuffer(b"abc", np.uint8),
             texts_offsets=np.array([0, 5]))
    with pytest.raises(DataError, match="texts_offsets does not describe texts_utf8 \\(3 bytes\\)"):
        load_vectors(tmp_path / "cut.npz")


# ------------------------------------------------------------------ paths are checked before any work
@pytest.fixture
def no_model_loading(monkeypatch) -> list:
    calls: list = []

    def spy(*args, **kwargs):
        calls.append(args)
        raise AssertionError("the model was loaded before the paths were checked")

    monkeypatch.setattr(embed_cli, "load", spy)
    return calls


def test_output_is_a_directory(tmp_path, capsys, source, no_model_loading):
    for name in ("outdir", "outdir.npy", "outdir.npz"):
        (tmp_path / name).mkdir()
        assert run("embed", "--model", tmp_path / "any-model", "--input", source, "--output", tmp_path / name) == 2
        assert f"{tmp_path / name}: is a directory; the output is a file" in one_line_error(capsys)
    assert not no_model_loading


def test_output_below_a_file(tmp_path, capsys, source, no_model_loading):
    afile = tmp_path / "afile"
    afile.write_text("keep")
    for out in (afile / "x.npy", afile / "deeper" / "x.npz"):
        assert run("embed", "--model", tmp_path / "any-model", "--input", source, "--output", out) == 2
        assert f"{out}: cannot create it, {afile} is a file, not a directory" in one_line_error(capsys)
    assert afile.read_text() == "keep" and not no_model_loading


def test_bad_input_paths(tmp_path, capsys, no_model_loading, monkeypatch):
    out = tmp_path / "o.npy"
    assert run("embed", "--model", tmp_path / "any-model", "--input", tmp_path, "--output", out) == 2
    assert f"{tmp_path}: is a directory, not a text file" in one_line_error(capsys)
    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"")
    assert run("embed", "--model", tmp_path / "any-model", "--input", empty, "--output", out) == 2
    assert "empty.txt: no texts" in one_line_error(capsys)
    assert not no_model_loading

    def unreadable(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(corpus_module, "open", unreadable, raising=False)  # read_lines opens the file
    with pytest.raises(DataError, match="empty.txt: cannot read: Permission denied"):
        read_texts(empty)


def test_bad_format_is_a_usage_error(tmp_path, capsys, source):
    with pytest.raises(SystemExit) as exit_info:
        run("embed", "--model", tmp_path, "--input", source, "--output", tmp_path / "o.npy", "--format", "csv")
    assert exit_info.value.code == 2 and "invalid choice: 'csv'" in capsys.readouterr().err
