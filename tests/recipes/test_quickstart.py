"""The quickstart end to end in --quick mode (bundled text -> tokenizer -> shards -> pretraining -> fill-mask ->
sense demo), its config file, and its errors."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import re
from pathlib import Path

import pytest

from bertology.cli.main import main
from bertology.data import builtin
from bertology.data.builtin import GENSIM_INSTALL
from bertology.errors import ConfigError, DataError
from bertology.recipes.quickstart import (
    _OUTPUTS,
    CLOZE_ANSWERS,
    CLOZE_SENTENCES,
    CONFIG_FILE,
    QuickstartOptions,
    _clear_previous_run,
    cloze_rank,
    quickstart,
    quickstart_config,
)
from bertology.objectives.fill_mask import Prediction
from bertology.recipes.pretrain import build_tokenizer
from bertology.training import load_config, read_metrics

ROOT = Path(__file__).resolve().parents[2]
QUICK_STEPS = 12


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory) -> tuple[Path, str, str, int]:
    """One `bertology quickstart --quick` run: (output directory, stdout, stderr, exit code)."""
    if importlib.util.find_spec("gensim") is None:
        pytest.skip(f"gensim's test data (the quickstart corpus) is not installed: {GENSIM_INSTALL}")
    out = tmp_path_factory.mktemp("quickstart") / "run"
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        # One thread: the suite may run beside other work, and two contended threads are slower than one.
        code = main(["quickstart", "--quick", "--out", str(out), "--steps", str(QUICK_STEPS), "--no-progress",
                     "--threads", "1"])
    return out, stdout.getvalue(), stderr.getvalue(), code


def test_quickstart_writes_every_artefact(quick_run):
    out, _, stderr, code = quick_run
    assert code == 0, stderr
    for relative in ("corpus/news.txt", "corpus/wikipedia.txt", "tokenizer/tokenizer.json", "shards/metadata.json",
                     "shards/heldout/metadata.json", "model/config.json", "model/tokenizer.json", "metrics.jsonl",
                     "curves.png", CONFIG_FILE):
        assert (out / relative).is_file(), relative
    assert (out / "model" / "model.safetensors").is_file() or (out / "model" / "pytorch_model.bin").is_file()
    assert (out / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    config = json.loads((out / "model" / "config.json").read_text(encoding="utf-8"))
    assert config["num_hidden_layers"] == 2 and config["hidden_size"] == 128
    assert re.search(r"done in \d+s", stderr)


def test_heldout_loss_falls_between_first_and_last_evaluation(quick_run):
    out, stdout, _, _ = quick_run
    evals = [r for r in read_metrics(out / "metrics.jsonl") if r["kind"] == "eval"]
    assert [evals[0]["step"], evals[-1]["step"]] == [0, QUICK_STEPS]
    assert evals[-1]["mlm_loss"] < evals[0]["mlm_loss"] - 0.1
    assert evals[-1]["loss"] < evals[0]["loss"]
    assert 0.0 <= evals[-1]["mlm_accuracy"] <= 1.0
    assert "nsp_accuracy" not in evals[-1]  # the recipe is MLM only (docs/PRETRAINING.md)
    train = [r for r in read_metrics(out / "metrics.jsonl") if r["kind"] == "train"]
    assert train and train[-1]["step"] == QUICK_STEPS
    assert "held-out before training: MLM loss" in stdout
    assert f"held-out after {QUICK_STEPS} steps: MLM loss" in stdout


def test_fill_mask_and_sense_demo_are_printed(quick_run):
    _, stdout, _, _ = quick_run
    hits = 0
    for sentence, answer in zip(CLOZE_SENTENCES, CLOZE_ANSWERS, strict=True):
        block = stdout.split(sentence, 1)[1].split("\n")[1]
        shown, verdict = re.fullmatch(r"\s*-> (.*)   \((.*)\)", block).groups()
        predictions = re.findall(r"(\S+) (\d\.\d\d)(?:,|$)", shown)
        assert len(predictions) == 5, block
        probabilities = [float(p) for _, p in predictions]
        assert probabilities == sorted(probabilities, reverse=True)
        # Each sentence says whether its expected word made the top five, and where.
        tokens = [token for token, _ in predictions]
        if answer in tokens:
            assert verdict == f"expected {answer!r}: rank {tokens.index(answer) + 1}"
            hits += 1
        else:
            assert verdict == f"expected {answer!r}: not in the top five"
    assert f"the expected word is in the top five for {hits} of 5 sentences" in stdout
    for word in ("bank", "bat", "play", "record"):
        assert re.search(rf"{word}: same-sense [-\d.]+ vs cross-sense [-\d.]+", stdout)


def test_config_file_reproduces_the_run(quick_run):
    out, stdout, _, _ = quick_run
    config = load_config(out / CONFIG_FILE)
    assert config.optim.total_steps == QUICK_STEPS
    assert config.run.output_dir == str(out)
    assert config.data.corpus == [str(out / "corpus" / "news.txt"), str(out / "corpus" / "wikipedia.txt")]
    # The scale-up commands are printed and name this very config.
    assert f"bertology pretrain --config {out / CONFIG_FILE}" in stdout
    assert "bertology tokenizer train --kind wordpiece" in stdout and "bertology data prepare" in stdout


def test_cloze_rank_is_one_based_case_insensitive_and_none_when_absent():
    predictions = [Prediction(token, i, 0.5 - 0.1 * i, "") for i, token in enumerate(["the", "Sydney", "##s"])]
    assert cloze_rank(predictions, "the") == 1
    assert cloze_rank(predictions, "sydney") == 2
    assert cloze_rank(predictions, "s") is None  # a word piece is not the word
    assert cloze_rank(predictions, "bank") is None
    assert cloze_rank([], "bank") is None


def test_cloze_answers_are_single_tokens_of_the_quickstart_vocabulary(tmp_path):
    """fill-mask predicts one token per mask: an answer the default vocabulary splits into pieces could never be in
    the top five."""
    if importlib.util.find_spec("gensim") is None:
        pytest.skip(f"gensim's test data (the quickstart corpus) is not installed: {GENSIM_INSTALL}")
    corpus = builtin.write_builtin_corpus(tmp_path / "corpus", ["news", "wikipedia"])
    config = quickstart_config(QuickstartOptions(out=str(tmp_path / "run")), [file.path for file in corpus])
    tokenizer = build_tokenizer(config)
    for answer in CLOZE_ANSWERS:
        assert tokenizer.encode(answer).tokens[1:-1] == [answer]


def test_refuses_a_directory_it_did_not_write(tmp_path):
    other = tmp_path / "mine"
    other.mkdir()
    (other / "notes.txt").write_text("keep me", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"mine: the directory is not empty and holds no earlier quickstart"):
        quickstart(QuickstartOptions(out=str(other), quick=True), echo=lambda line: None)
    assert (other / "notes.txt").read_text(encoding="utf-8") == "keep me"
    (other / CONFIG_FILE).write_text("{}", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"holds files the quickstart did not write \(notes\.txt\)"):
        quickstart(QuickstartOptions(out=str(other), quick=True), echo=lambda line: None)


def test_a_previous_quickstart_is_cleared(tmp_path):
    out = tmp_path / "run"
    for name in _OUTPUTS:
        if "." in name:
            (out / name).parent.mkdir(parents=True, exist_ok=True)
            (out / name).write_text("old", encoding="utf-8")
        else:
            (out / name / "inner").mkdir(parents=True)
    _clear_previous_run(out)
    assert list(out.iterdir()) == []


def test_repository_config_matches_the_default_run():
    """configs/quickstart.yaml is the default quickstart's pretraining, as a file (another output directory)."""
    shipped = load_config(ROOT / "configs" / "quickstart.yaml").to_dict()
    corpus = [f"runs/quickstart/corpus/{name}.txt" for name in ("news", "wikipedia")]
    expected = quickstart_config(QuickstartOptions(), corpus).to_dict()
    assert shipped["run"].pop("output_dir") != expected["run"].pop("output_dir")
    assert shipped == expected


@pytest.mark.parametrize("options, message", [
    ({"steps": 0}, "steps: must be >= 1"),
    ({"preset": "huge"}, "preset: unknown 'huge'"),
    ({"seed": -1}, "seed: must be >= 0"),
    ({"texts": ("news", "poems")}, "texts: expected some of news, wikipedia"),
    ({"texts": ()}, "texts: expected some of news, wikipedia"),
])
def test_bad_options(options, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        QuickstartOptions(**options)


def test_missing_corpus_package_says_which_pip_command(monkeypatch, tmp_path, capsys):
    real = importlib.util.find_spec
    monkeypatch.setattr(builtin.importlib.util, "find_spec",
                        lambda name, *a: None if name == "gensim" else real(name, *a))
    with pytest.raises(DataError, match=re.escape(GENSIM_INSTALL)):
        quickstart(QuickstartOptions(out=str(tmp_path / "a"), quick=True), echo=lambda line: None)
    assert main(["quickstart", "--quick", "--out", str(tmp_path / "b")]) == 2
    assert GENSIM_INSTALL in capsys.readouterr().err
