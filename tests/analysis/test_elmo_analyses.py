"""`bertology wsd` and `bertology probe` end to end on a tiny random ELMo (its three layers as word vectors), on the
shared SemCor, WordNet, WSD framework and UD data (skipped when ../shared is absent)."""

from __future__ import annotations

import json

import pytest
import torch

import bertology
from bertology.cli.main import main
from bertology.model import fingerprint, save_model
from bertology.model.elmo import ElmoModel, tiny_config
from bertology.tokenization.words import SPECIALS, WordVocabulary


@pytest.fixture(scope="module")
def elmo_dir(tmp_path_factory):
    model = ElmoModel(tiny_config(projection_dim=8, cell_size=16))
    model.init_weights(torch.Generator().manual_seed(0))
    directory = tmp_path_factory.mktemp("elmo") / "elmo"
    save_model(model, directory)
    WordVocabulary([*SPECIALS, "the"]).save(directory)
    return directory


def _need(path):
    if not path.exists():
        pytest.skip(f"{path} not found (../shared is absent)")
    return path


def test_wsd_fit_predict_score_per_layer_on_elmo(elmo_dir, data_dir, tmp_path, capsys):
    semcor, wordnet = _need(data_dir / "semcor3.0-subset"), _need(data_dir / "wordnet-3.0")
    framework = _need(data_dir / "wsd-raganato2017" / "semeval2007")
    for layer in ("0", "2"):  # the token layer and the top biLSTM layer
        senses = tmp_path / f"senses{layer}.npz"
        assert main(["wsd", "fit", "--model", str(elmo_dir), "--semcor", str(semcor), "--wordnet", str(wordnet),
                     "--out", str(senses), "--layers", layer, "--max-sentences", "30", "--quiet"]) == 0
        fitted = json.loads(capsys.readouterr().out)
        assert fitted["stats"]["senses with a vector"] > 100 and fitted["stats"]["tokens the tokenizer drops"] == 0
        key = tmp_path / f"pred{layer}.key"
        assert main(["wsd", "predict", "--model", str(elmo_dir), "--senses", str(senses), "--wordnet",
                     str(wordnet), "--data", str(framework / "semeval2007.data.xml"), "--output", str(key),
                     "--quiet"]) == 0
        counts = json.loads(capsys.readouterr().out)["counts"]
        assert counts["answered by nearest sense"] > 0 and counts["instances the tokenizer drops"] == 0
        assert main(["wsd", "score", "--gold", str(framework / "semeval2007.gold.key.txt"), "--predictions",
                     str(key)]) == 0
        scored = json.loads(capsys.readouterr().out)
        assert scored["answered"] == scored["total"] == counts["instances"] and 0 < scored["F1"] < 100


def test_probe_reads_elmos_three_layers(elmo_dir, data_dir, tmp_path, capsys):
    ud = _need(data_dir / "ud-english-ewt")
    out = tmp_path / "probe"
    assert main(["probe", "--model", str(elmo_dir), "--ud", str(ud), "--out", str(out), "--limit", "20",
                 "--epochs", "1", "--tasks", "upos", "--quiet"]) == 0
    numbers = json.loads((out / "probing.json").read_text())
    rows = numbers["tasks"]["upos"]["layers"]
    assert [row["layer"] for row in rows] == [0, 1, 2]
    assert all(0 <= row["test_accuracy"] <= 1 for row in rows)


def test_an_elmo_fingerprint_is_its_bilm_and_its_splitting_rule(elmo_dir, tmp_path):
    pytest.importorskip("h5py")
    from bertology.model.elmo_format import write_elmo

    pretrained = bertology.load(elmo_dir)
    released = bertology.load(write_elmo(pretrained.model, tmp_path / "released"))
    # The same biLM in the released format: the same vectors (the vocabularies' lower-casing agrees: none).
    assert fingerprint(released.model) == fingerprint(pretrained.model)
    assert fingerprint(pretrained) != fingerprint(pretrained.model, WordVocabulary([*SPECIALS], lowercase=True))
    changed = bertology.load(elmo_dir).model
    with torch.no_grad():
        changed.forward_layers[1].weight_hr.add_(1e-3)
    assert fingerprint(changed) != fingerprint(pretrained.model)


def test_analyze_lists_the_attention_analyses_as_not_for_elmo(elmo_dir, tmp_path):
    from bertology.analysis.report import build_report

    result = build_report(elmo_dir, tmp_path / "report", only="attention,importance", data_dir=tmp_path)
    assert not result.sections
    assert {s.name: s.reason for s in result.skipped} == {
        name: "the model (ElmoModel, registered as 'elmo') has no attention heads (no transformer blocks)"
        for name in ("attention", "importance")}
    assert (tmp_path / "report" / "report.html").is_file()
