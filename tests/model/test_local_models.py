"""Models installed as Python packages are found by name, a hub id is refused saying bertology never downloads, and
the service and `bertology models` name models as people do."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

import bertology
from bertology.cli.main import main
from bertology.errors import CheckpointError
from bertology.model.local import card_title, display_name, find_installed, installed_models, resolve_model_path
from finetune_helpers import save_tiny_model

CARD = "---\nlicense: apache-2.0\ntags:\n- x\n---\n\n# tiny-test-bert\n\nA model card.\n# a later heading\n"


@pytest.fixture
def packaged(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A package `bertology_test_pkg` on sys.path that carries a tiny model in `model/`, with a model card."""
    root = tmp_path / "site"
    package = root / "bertology_test_pkg"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    model = save_tiny_model(package / "model", ["the film was good", "the plot was bad"] * 3)
    (model / "README.md").write_text(CARD)
    monkeypatch.syspath_prepend(str(root))
    return model


def test_a_packaged_model_is_found_by_its_card_title_or_package_name(packaged: Path):
    names = {model.name: model for model in installed_models()}
    assert names["tiny-test-bert"].path == packaged
    assert names["tiny-test-bert"].package == "bertology_test_pkg"
    for spec in ("tiny-test-bert", "TINY-TEST-BERT", "bertology_test_pkg", "bertology-test-pkg"):
        assert resolve_model_path(spec) == packaged
    assert "bertology_test_pkg" not in sys.modules  # found without importing the package


def test_load_and_every_model_option_take_the_short_name(packaged: Path, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture):
    text, out = tmp_path / "texts.txt", tmp_path / "vectors.npz"
    text.write_text("the film was good\n")
    by_name, by_path = bertology.load("tiny-test-bert"), bertology.load(packaged)
    assert by_name.model.config == by_path.model.config
    assert main(["info", "tiny-test-bert"]) == 0
    assert "bert" in capsys.readouterr().out
    assert main(["embed", "--model", "tiny-test-bert", "--input", str(text), "--output", str(out)]) == 0
    assert out.is_file()


def test_models_lists_installed_models(packaged: Path, capsys: pytest.CaptureFixture):
    assert main(["models", "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert {"name": "tiny-test-bert", "package": "bertology_test_pkg", "path": str(packaged)} in rows
    assert main(["models"]) == 0
    listed = [line.split() for line in capsys.readouterr().out.splitlines()]
    assert ["tiny-test-bert", str(packaged)] in listed


def test_a_hub_id_is_refused_saying_bertology_reads_local_directories(packaged: Path,
                                                                       capsys: pytest.CaptureFixture):
    with pytest.raises(CheckpointError, match="local model directories only and never downloads.*tiny-test-bert"):
        bertology.load("sentence-transformers/all-mpnet-base-v2")
    assert main(["embed", "--model", "bert-org/bert-base", "--input", "x.txt", "--output", "y.npz"]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "never downloads" in error and "Traceback" not in error


def test_a_missing_directory_keeps_its_own_error(tmp_path: Path):
    with pytest.raises(CheckpointError, match="no such model directory"):
        bertology.load(tmp_path / "absent")
    assert find_installed("no-such-model-name") is None


def test_display_names(packaged: Path, tmp_path: Path):
    assert display_name(packaged) == "tiny-test-bert"
    run = save_tiny_model(tmp_path / "runs" / "sst2" / "model", ["a b c"] * 3)
    assert display_name(run) == "sst2/model"  # a run's model/ folder is named by its run
    assert display_name(tmp_path / "runs" / "sst2") == "sst2"
    assert card_title(tmp_path) is None


def test_the_installed_minilm_is_found_by_name(minilm_path: Path):
    assert resolve_model_path("all-MiniLM-L6-v2") == minilm_path
    assert display_name(minilm_path) == "all-MiniLM-L6-v2"
