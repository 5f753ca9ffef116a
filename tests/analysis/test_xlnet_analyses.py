"""The analyses that apply to XLNet: attention-head statistics from its content stream (the same numbers whatever
the batching and padding), anisotropy from its layers, both in `bertology analyze`'s report; head importance (head
masks of BERT-family encoders) is skipped with its reason. On a tiny random XLNet built by transformers and UD
English-EWT dev from ../shared/data (skipped when absent)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from bertology.analysis.attention import head_statistics
from bertology.analysis.geometry import analyse
from bertology.analysis.ud import read_split
from bertology.cli.main import main
from bertology.model import load
from finetune_helpers import save_family_model

pytest.importorskip("transformers")

UD = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "ud-english-ewt"
pytestmark = [pytest.mark.skipif(not UD.is_dir(), reason=f"UD English-EWT not in {UD}"),
              pytest.mark.usefixtures("one_thread")]




@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    sentences = read_split(UD, "dev", 200)
    return save_family_model(tmp_path_factory.mktemp("xlnet"), "xlnet", [s.text for s in sentences])


def test_head_statistics_do_not_depend_on_the_batching(model_dir):
    pretrained = load(model_dir)
    sentences = read_split(UD, "dev", 24)
    alone = head_statistics(pretrained, sentences, batch_size=1, min_relation_count=1)
    padded = head_statistics(pretrained, sentences, batch_size=8, min_relation_count=1)
    assert alone["layers"] == 2 and alone["heads"] == 2 and alone["pruned_heads"] == {}
    assert alone["sentences"] == 24
    for name, grid in alone["per_head"].items():
        assert len(grid) == 2 and all(len(row) == 2 for row in grid)
        np.testing.assert_allclose(np.array(grid, dtype=float), np.array(padded["per_head"][name], dtype=float),
                                   atol=1e-5, err_msg=name)
    assert alone["mean"]["entropy"] < alone["mean"]["uniform_entropy"] + 1e-9
    assert 0 < alone["mean"]["cls"] < 1  # <cls> is the last token of every sentence, seen by every query


def test_anisotropy_of_xlnets_layers(model_dir, tmp_path):
    sentences = read_split(UD, "dev", 60)
    numbers, figures = analyse(load(model_dir), [s.text for s in sentences], tmp_path,
                               spans=[s.spans for s in sentences])
    assert [layer["layer"] for layer in numbers["layers"]] == [0, 1, 2]
    assert numbers["words"] == sum(len(s.words) for s in sentences)
    assert all(-1 <= layer["raw"]["anisotropy"]["mean"] <= 1 for layer in numbers["layers"])
    assert figures and all(path.is_file() for path in figures)


@pytest.mark.slow  # anisotropy over the whole dev set: about 50 s on one thread
def test_the_report_holds_attention_and_anisotropy_and_skips_importance(model_dir, tmp_path):
    out = tmp_path / "report"
    assert main(["analyze", "--model", str(model_dir), "--out", str(out), "--only", "attention,geometry,importance",
                 "--data", str(UD.parent), "--quick"]) == 0
    summary = json.loads((out / "report.json").read_text(encoding="utf-8"))
    page = (out / "report.html").read_text(encoding="utf-8")
    assert "Attention heads (Clark et al. 2019)" in page and "Anisotropy" in page
    assert "importance" in summary["skipped"] and "no loss to take the gradient of" in summary["skipped"]["importance"]
    layers = json.loads((out / "attention" / "attention.json").read_text(encoding="utf-8"))
    assert layers["layers"] == 2
