"""Corpus mode of `bertology embed`: shards equal to embedding each file directly, the index, resume after a kill
at every phase of a shard's write, and every refusal (bad lines, another run's output, a non-model)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from bertology.cli.main import main
from bertology.embeddings import embed
from bertology.embeddings.corpus import CorpusSettings, embed_corpus, find_inputs, iter_shards, load_corpus
from bertology.errors import ConfigError, DataError
from bertology.model import load

FILE_A = ["The bank raised its rates.", "", "She sat on the river bank.", "An unaffable clerk stamped the form.",
          "Hi"]
FILE_B = ["one", "two words", "three little words"]


@pytest.fixture()
def corpus(tmp_path) -> Path:
    root = tmp_path / "corpus"
    (root / "sub").mkdir(parents=True)
    (root / "a.txt").write_text("\n".join(FILE_A) + "\n", encoding="utf-8")
    (root / "sub" / "b.txt").write_text("\n".join(FILE_B) + "\n", encoding="utf-8")
    (root / ".hidden").write_text("not an input\n", encoding="utf-8")
    return root


def run(*argv) -> int:
    return main([str(a) for a in argv])


def test_shards_equal_embedding_each_file(small_model, corpus, tmp_path, capsys):
    out = tmp_path / "out"
    assert run("embed", "--model", small_model, "--input", corpus, "--output", out, "--shard-size", 2, "--quiet") == 0
    assert "8 texts in 2 files: 5 shards written, 0 already done, 5 in all (32 dimensions)" in capsys.readouterr().err
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["complete"] and [s["file"] for s in manifest["shards"]] == ["a.txt"] * 3 + ["sub/b.txt"] * 2
    assert [(s["count"], s["line"]) for s in manifest["shards"]] == [(2, 1), (2, 3), (1, 5), (2, 1), (1, 3)]
    vectors, rows = load_corpus(out)
    model = load(small_model)
    expected = np.concatenate([embed(model, FILE_A[i:i + 2], levels=("sentence",)).sentences for i in (0, 2, 4)]
                              + [embed(model, FILE_B[i:i + 2], levels=("sentence",)).sentences for i in (0, 2)])
    np.testing.assert_array_equal(vectors, expected)  # the same calls as a shard makes: bitwise equal
    assert [(r["file"], r["line"], r["text"]) for r in rows] == [("a.txt", i + 1, i) for i in range(5)] + [
        ("sub/b.txt", i + 1, i) for i in range(3)]
    assert rows[2]["start"] == 0 and rows[2]["end"] == len(FILE_A[2]) and rows[0]["id"] is None
    assert sorted(p.name for p in (out / "shards").iterdir()) == ["00000", "00001", "00002", "00003", "00004"]


def test_jsonl_glob_word_level_with_ids(small_model, tmp_path):
    root = tmp_path / "docs"
    root.mkdir()
    (root / "x.jsonl").write_text(json.dumps({"id": "d1", "text": "Deep water runs."}) + "\n\n" +
                                  json.dumps({"id": 7, "text": "Hello"}) + "\n", encoding="utf-8")
    (root / "y.txt").write_text("ignored by the glob\n", encoding="utf-8")
    out = tmp_path / "out"
    report = embed_corpus(small_model, str(root / "*.jsonl"), out,
                          CorpusSettings(level="word", format="jsonl", shard_size=10))
    assert report.files == ["x.jsonl"] and report.texts == 2
    vectors, rows = load_corpus(out)
    words = embed(load(small_model), ["Deep water runs.", "Hello"], levels=("word",)).words
    np.testing.assert_array_equal(vectors, words.vectors)
    assert [(r["id"], r["line"], r["string"], r["start"], r["end"]) for r in rows] == [
        ("d1", 1, "Deep", 0, 4), ("d1", 1, "water", 5, 10), ("d1", 1, "runs", 11, 15), ("d1", 1, ".", 15, 16),
        (7, 3, "Hello", 0, 5)]


def test_resume_skips_finished_shards_and_completes(small_model, corpus, tmp_path):
    settings = CorpusSettings(shard_size=2)
    whole = tmp_path / "whole"
    embed_corpus(small_model, corpus, whole, settings)
    out = tmp_path / "out"
    embed_corpus(small_model, corpus, out, settings)
    # A run that stopped after two shards: the others are missing, the manifest not complete.
    for name in ("00002", "00003"):
        for f in (out / "shards" / name).iterdir():
            f.unlink()
        (out / "shards" / name).rmdir()
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["complete"] = False
    (out / "manifest.json").write_text(json.dumps(manifest))
    stamp = (out / "shards" / "00000" / "vectors.npy").stat().st_mtime_ns
    report = embed_corpus(small_model, corpus, out, settings, resume=True)
    assert (report.written, report.skipped, report.shards) == (2, 3, 5)
    assert (out / "shards" / "00000" / "vectors.npy").stat().st_mtime_ns == stamp  # not redone
    for (_, a, ia), (_, b, ib) in zip(iter_shards(whole), iter_shards(out)):
        np.testing.assert_array_equal(a, b)
        assert ia == ib
    again = embed_corpus(small_model, corpus, out, settings, resume=True)
    assert (again.written, again.skipped) == (0, 5)


# Phases of the third shard's atomic directory (bertology.io), and the manifest's final rewrite. Each case starts
# two processes (about 20 s on a busy machine): the kill in the middle of a shard's write runs by default.
KILL_POINTS = [pytest.param("dir-created:00002", marks=pytest.mark.slow),
               pytest.param("dir-written:00002", marks=pytest.mark.slow),
               "dir-synced:00002/vectors.npy",
               pytest.param("dir-before-rename:00002", marks=pytest.mark.slow),
               pytest.param("dir-renamed:00002", marks=pytest.mark.slow),
               pytest.param("write-written:manifest.json@2", marks=pytest.mark.slow)]


@pytest.mark.parametrize("fault", KILL_POINTS)
def test_killed_run_resumes_to_the_uninterrupted_output(small_model, corpus, tmp_path, fault):
    out, whole = tmp_path / "out", tmp_path / "whole"
    command = [sys.executable, "-m", "bertology.cli.main", "embed", "--model", str(small_model), "--input",
               str(corpus), "--output", str(out), "--shard-size", "2", "--quiet"]
    # The uninterrupted run is the same command (same process setup, same thread count): the comparison is bitwise,
    # and float sums split over another number of threads may differ in the last bit.
    uninterrupted = subprocess.run(command[:command.index("--output") + 1] + [str(whole), "--shard-size", "2",
                                   "--quiet"], capture_output=True, text=True, timeout=300)
    assert uninterrupted.returncode == 0, uninterrupted.stderr
    env = {**os.environ, "BERTOLOGY_FAULT": fault}
    killed = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert killed.returncode == -9, killed.stderr
    names = sorted(p.name for p in (out / "shards").iterdir() if not p.name.startswith("."))
    for name in names:  # whatever is there under a shard's own name is complete
        assert {p.name for p in (out / "shards" / name).iterdir()} == {"vectors.npy", "index.jsonl"}
    assert run("embed", "--model", small_model, "--input", corpus, "--output", out, "--shard-size", 2,
               "--quiet") == 2  # a fresh run refuses the directory
    resumed = subprocess.run(command + ["--resume"], capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    assert f"{len(names)} already done" in resumed.stderr
    for (na, a, ia), (nb, b, ib) in zip(iter_shards(whole), iter_shards(out), strict=True):
        assert na == nb and ia == ib
        np.testing.assert_array_equal(a, b)
    assert not [p for p in (out / "shards").iterdir() if p.name.startswith(".")]  # the killed writer's leftovers


def test_malformed_line_names_file_and_line(small_model, tmp_path, capsys):
    root = tmp_path / "in"
    root.mkdir()
    (root / "good.jsonl").write_text('{"text": "fine"}\n', encoding="utf-8")
    (root / "bad.jsonl").write_text('{"text": "fine"}\n{"text": "broken"\n', encoding="utf-8")
    out = tmp_path / "out"
    assert run("embed", "--model", small_model, "--input", root, "--output", out, "--format", "jsonl") == 2
    assert "bad.jsonl: line 2: invalid JSON" in capsys.readouterr().err
    assert not out.exists()  # nothing written before every line is checked
    (root / "bad.jsonl").write_bytes(b'{"text": "ok"}\n{"text": "caf\xe9"}\n')
    with pytest.raises(DataError, match=r"bad\.jsonl: line 2: cannot decode as utf-8 at byte offset 28"):
        embed_corpus(small_model, root, out, CorpusSettings(format="jsonl"))


def test_output_holding_another_run_is_refused_unless_resumed_with_the_same_settings(small_model, corpus, tmp_path,
                                                                                     capsys):
    out = tmp_path / "out"
    embed_corpus(small_model, corpus, out, CorpusSettings(shard_size=2))
    with pytest.raises(ConfigError, match=r"holds an embedding run \(5 of 5 shards done\); pass --resume"):
        embed_corpus(small_model, corpus, out, CorpusSettings(shard_size=2))
    with pytest.raises(ConfigError, match=r"other settings: pooling \(was 'mean', now 'first'\); shard_size "
                                          r"\(was 2, now 3\)"):
        embed_corpus(small_model, corpus, out, CorpusSettings(shard_size=3, pooling="first"), resume=True)
    (corpus / "a.txt").write_text("changed\n", encoding="utf-8")
    (corpus / "c.txt").write_text("new\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"other settings: inputs \(added: c\.txt; changed: a\.txt\)"):
        embed_corpus(small_model, corpus, out, CorpusSettings(shard_size=2), resume=True)
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine\n")
    assert run("embed", "--model", small_model, "--input", corpus, "--output", other, "--resume") == 2
    assert "not empty and holds no embedding run (manifest.json)" in capsys.readouterr().err


def test_other_model_is_refused_on_resume(small_model, minilm_path, corpus, tmp_path):
    out = tmp_path / "out"
    embed_corpus(small_model, corpus, out, CorpusSettings(shard_size=4))
    with pytest.raises(ConfigError, match=r"other settings: model \(other files\)"):
        embed_corpus(minilm_path, corpus, out, CorpusSettings(shard_size=4), resume=True)


def test_a_directory_that_is_not_a_model(corpus, tmp_path, capsys):
    not_model = tmp_path / "not-a-model"
    not_model.mkdir()
    (not_model / "weights.bin").write_bytes(b"\0" * 8)
    out = tmp_path / "out"
    assert run("embed", "--model", not_model, "--input", corpus, "--output", out) == 2
    assert "not-a-model: config.json is missing" in capsys.readouterr().err
    assert not out.exists()
    assert run("embed", "--model", tmp_path / "nowhere", "--input", corpus, "--output", out) == 2
    assert "nowhere: no such model directory" in capsys.readouterr().err


def test_inputs_that_match_nothing(small_model, tmp_path):
    with pytest.raises(DataError, match=r"\*\.jsonl: no files match"):
        find_inputs(str(tmp_path / "*.jsonl"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="empty: holds no files"):
        find_inputs(tmp_path / "empty")
    (tmp_path / "blank").mkdir()
    (tmp_path / "blank" / "x.jsonl").write_text("\n\n", encoding="utf-8")
    with pytest.raises(DataError, match="the input files hold no texts"):
        embed_corpus(small_model, tmp_path / "blank", tmp_path / "out", CorpusSettings(format="jsonl"))
    with pytest.raises(ConfigError, match="shard_size must be a positive integer"):
        CorpusSettings(shard_size=0)
    with pytest.raises(ConfigError, match="dtype: unknown 'int4'"):
        CorpusSettings(dtype="int4")


def test_a_file_name_as_corpus_output_is_refused(small_model, corpus, tmp_path, capsys):
    assert run("embed", "--model", small_model, "--input", corpus, "--output", tmp_path / "vectors.npy") == 2
    assert f"{corpus}: is a directory, not a text file: its files are embedded into a directory of shards " \
        "(corpus mode), so the output must be a directory, not vectors.npy" in capsys.readouterr().err
    assert run("embed", "--model", small_model, "--input", corpus / "*.txt", "--output", tmp_path / "v.npz") == 2
    assert "*.txt: is a glob pattern, not a text file" in capsys.readouterr().err


def test_a_bad_option_fails_before_anything_is_written(small_model, corpus, tmp_path, capsys):
    out = tmp_path / "out"
    assert run("embed", "--model", small_model, "--input", corpus, "--output", out, "--stride", 500) == 2
    assert "stride must be between 1 and" in capsys.readouterr().err
    assert not out.exists()  # so the same directory can be used with the option fixed
    assert run("embed", "--model", small_model, "--input", corpus, "--output", out, "--threads", 0) == 2
    assert "threads must be a positive integer, got 0" in capsys.readouterr().err


def test_corpus_options_on_a_single_file_are_refused(small_model, corpus, tmp_path, capsys):
    out = tmp_path / "v.npy"
    assert run("embed", "--model", small_model, "--input", corpus / "a.txt", "--output", out, "--resume",
               "--engine", "ray") == 2
    assert "--resume, --engine: for corpus mode only" in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.parametrize("field", ["text", "id"])
def test_a_lone_surrogate_is_named_before_any_shard_and_the_fixed_file_runs(small_model, tmp_path, capsys, field):
    root = tmp_path / "jsonl"
    root.mkdir()
    lines = [json.dumps({"id": f"d{i}", "text": f"text number {i}"}) for i in range(6)]
    bad = {"id": "d5", "text": "broken \\ud800 text"} if field == "text" else {"id": "\\ud800", "text": "ok"}
    lines[5] = json.dumps(bad).replace("\\\\ud800", "\\ud800")  # the escape itself, as a JSON writer leaves it
    (root / "c.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = tmp_path / "out"
    args = ["embed", "--model", small_model, "--input", root, "--output", out, "--format", "jsonl",
            "--shard-size", 1, "--quiet"]
    assert run(*args) == 2
    err = capsys.readouterr().err
    assert f"c.jsonl: line 6: field {field!r}: character" in err and "lone surrogate (U+D800" in err
    assert err.count("\n") == 1 and not out.exists()  # nothing written: not one shard, not the manifest
    lines[5] = json.dumps({"id": "d5", "text": "fixed text"})
    (root / "c.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    assert run(*args, "--resume") == 0  # nothing to resume: a fresh run
    assert "6 shards written" in capsys.readouterr().err
    assert run(*args, "--output", tmp_path / "fresh") == 0


def test_a_lone_surrogate_in_a_single_jsonl_file_is_named(small_model, tmp_path, capsys):
    path = tmp_path / "one.jsonl"
    path.write_text('{"text": "fine"}\n\n{"text": "x\\udc00"}\n', encoding="utf-8")
    assert run("embed", "--model", small_model, "--input", path, "--format", "jsonl", "--output",
               tmp_path / "v.npy") == 2
    assert "one.jsonl: line 3: field 'text': character 1 is a lone surrogate (U+DC00" in capsys.readouterr().err
    assert not (tmp_path / "v.npy").exists()
