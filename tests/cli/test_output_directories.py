"""Every command that writes a directory of outputs refuses, before any work, an existing folder holding other
files unless --overwrite (its own earlier output is fine), and a file where the folder should be."""

from __future__ import annotations

import pytest

from bertology.cli.main import main

COMMANDS = {  # the command's words and its other required arguments; the marker of its own output
    "analyze": (["analyze"], [], "report.html"),
    "anisotropy": (["anisotropy"], ["--ud", "UD"], "anisotropy.json"),
    "neighbours": (["neighbours"], ["--ud", "UD", "--query", "bank", "the bank"], "neighbours.json"),
    "probe": (["probe"], ["--ud", "UD"], "probing.json"),
    "sense-map": (["sense-map"], ["--labelled", "L.tsv"], "sense_map.json"),
    "heads stats": (["heads", "stats"], ["--ud", "UD"], "attention.json"),
    "heads importance": (["heads", "importance"], [], "importance.json"),
    "heads prune": (["heads", "prune"], ["--heads", "0:0"], "pruning.json"),
    "longformer convert": (["longformer", "convert"], [], "longformer.json"),
}


@pytest.mark.parametrize("name", COMMANDS)
def test_a_folder_of_other_files_is_refused_before_any_work(name, tmp_path, capsys):
    words, extra, _ = COMMANDS[name]
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    missing_model = tmp_path / "no-model"  # never read: the folder is checked first
    assert main([*words, "--model", str(missing_model), *extra, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"--out {out}: holds other files (keep.txt)" in err and "--overwrite" in err
    assert [p.name for p in out.iterdir()] == ["keep.txt"]


@pytest.mark.parametrize("name", COMMANDS)
def test_its_own_output_an_empty_folder_or_overwrite_get_past_the_check(name, tmp_path, capsys):
    words, extra, marker = COMMANDS[name]
    missing_model = tmp_path / "no-model"
    for i, (setup, flags) in enumerate([(marker, []), (None, []), ("keep.txt", ["--overwrite"])]):
        out = tmp_path / f"out{i}"
        out.mkdir()
        if setup:
            (out / setup).write_text("{}")
        main([*words, "--model", str(missing_model), *extra, "--out", str(out), *flags])
        err = capsys.readouterr().err
        assert "holds other files" not in err, (setup, err)
        if setup == "keep.txt":
            assert (out / "keep.txt").read_text() == "{}"


@pytest.mark.parametrize("name", COMMANDS)
def test_a_file_as_out_is_refused(name, tmp_path, capsys):
    words, extra, _ = COMMANDS[name]
    (tmp_path / "file").write_text("x")
    assert main([*words, "--model", str(tmp_path / "m"), *extra, "--out", str(tmp_path / "file")]) == 2
    assert "is a file; the output is a directory" in capsys.readouterr().err
    assert main([*words, "--model", str(tmp_path / "m"), *extra, "--out", str(tmp_path / "file" / "sub")]) == 2
    assert "is a file, not a directory" in capsys.readouterr().err
