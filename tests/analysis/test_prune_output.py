"""`bertology heads prune --out`: a folder of other files or another model is refused without --overwrite, no file
bertology did not write is ever deleted, `--out .` works, an earlier pruned model is replaced, and a bad --heads is
an error before any work."""

from __future__ import annotations

import json
import os

import pytest
import torch

from bertology.cli.main import main
from bertology.model import EncoderModel, Pretrained, load, preset
from bertology.tokenization import train_tokenizer


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    tokenizer = train_tokenizer(iter(["the cat sat on the mat"] * 5), "wordpiece", 60, show_progress=False,
                                min_frequency=1)
    config = preset("tiny", vocab_size=tokenizer.vocab_size, num_layers=2, hidden_size=32, num_heads=4,
                    intermediate_size=64, max_position_embeddings=32)
    model = EncoderModel(config)
    model.init_weights(torch.Generator().manual_seed(0))
    directory = tmp_path_factory.mktemp("prune") / "model"
    Pretrained(model, tokenizer).save(directory)
    return directory


def prune(model_dir, out, *extra):
    return main(["heads", "prune", "--model", str(model_dir), "--out", str(out), "--heads", "0:1;1:0,2", *extra])


def test_a_folder_of_other_files_is_refused_and_kept(model_dir, tmp_path, capsys):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "thesis.tex").write_text("years of work")
    assert prune(model_dir, out) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "holds other files (thesis.tex)" in err and "--overwrite" in err
    assert sorted(os.listdir(out)) == ["thesis.tex"]


def test_another_model_is_refused_and_left_intact(model_dir, tmp_path, capsys):
    before = {p.name: p.read_bytes() for p in model_dir.iterdir()}
    assert prune(model_dir, model_dir) == 2
    assert "is not a pruned model" in capsys.readouterr().err
    assert {p.name: p.read_bytes() for p in model_dir.iterdir()} == before


def test_overwrite_writes_into_the_folder_and_keeps_its_files(model_dir, tmp_path):
    out = tmp_path / "mine"
    (out / "notes").mkdir(parents=True)
    (out / "thesis.tex").write_text("years of work")
    (out / "notes" / "a.txt").write_text("a")
    assert prune(model_dir, out, "--overwrite") == 0
    assert (out / "thesis.tex").read_text() == "years of work" and (out / "notes" / "a.txt").read_text() == "a"
    assert load(out).config.pruned_heads == {0: [1], 1: [0, 2]}
    assert not [p for p in os.listdir(out) if p.startswith(".")]  # no temporary left


def test_overwrite_refuses_to_mix_two_models(model_dir, tmp_path, capsys):
    out = tmp_path / "other"
    out.mkdir()
    (out / "bertology.json").write_text("{}")  # another model in the native layout
    assert prune(model_dir, out, "--overwrite") == 2
    assert "holds bertology.json of another model" in capsys.readouterr().err
    assert sorted(os.listdir(out)) == ["bertology.json"]


def test_out_dot_writes_into_the_working_directory(model_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert prune(model_dir, ".") == 0
    assert load(tmp_path).config.pruned_heads == {0: [1], 1: [0, 2]}
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".")]


def test_an_earlier_pruned_model_is_replaced_and_a_user_file_beside_it_kept(model_dir, tmp_path):
    out = tmp_path / "pruned"
    assert prune(model_dir, out) == 0
    record = json.loads((out / "pruning.json").read_text())
    assert "config.json" in record["files"] and "pruning.json" in record["files"]
    (out / "README.txt").write_text("mine")
    assert main(["heads", "prune", "--model", str(model_dir), "--out", str(out), "--heads", "0:0"]) == 0
    assert load(out).config.pruned_heads == {0: [0]}
    assert (out / "README.txt").read_text() == "mine"


@pytest.mark.parametrize("heads,message", [("", "--heads: '' names no head"), (";", "names no head"),
                                           ("0", "is not LAYER:HEAD"), ("x:1", "is not LAYER:HEAD")])
def test_bad_heads_fail_before_any_work(tmp_path, capsys, heads, message):
    missing_model = tmp_path / "no-model"  # never read: --heads is checked first
    assert main(["heads", "prune", "--model", str(missing_model), "--out", str(tmp_path / "o"), "--heads",
                 heads]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
    assert not (tmp_path / "o").exists()


def test_out_below_a_file_is_refused(model_dir, tmp_path, capsys):
    (tmp_path / "file").write_text("x")
    assert prune(model_dir, tmp_path / "file" / "out") == 2
    assert "is a file, not a directory" in capsys.readouterr().err
    assert prune(model_dir, tmp_path / "file") == 2
    assert "is a file; the output is a directory" in capsys.readouterr().err


def test_a_directory_where_a_model_file_goes_is_named_and_nothing_moved(model_dir, tmp_path, capsys):
    out = tmp_path / "out"
    (out / "config.json").mkdir(parents=True)
    (out / "other.txt").write_text("x")
    assert prune(model_dir, out, "--overwrite") == 2
    assert "config.json: is a directory where a file is to be written" in capsys.readouterr().err
    assert sorted(os.listdir(out)) == ["config.json", "other.txt"]


def test_prune_model_saves_by_the_same_rules(model_dir, tmp_path):
    from bertology.analysis.importance import prune_model
    from bertology.errors import ConfigError

    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "x.txt").write_text("x")
    pretrained = load(model_dir)
    with pytest.raises(ConfigError, match="holds other files"):
        prune_model(pretrained, {0: [1]}, tmp_path / "busy")
    assert pretrained.config.pruned_heads == {}  # refused before the model was changed
    prune_model(pretrained, {0: [1]}, tmp_path / "pruned")
    assert load(tmp_path / "pruned").config.pruned_heads == {0: [1]}
    assert json.loads((tmp_path / "pruned" / "pruning.json").read_text())["pruned_heads"] == {"0": [1]}
