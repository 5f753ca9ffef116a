"""Continued MLM pretraining of a Longformer made from a short model, on sequences longer than the short model's."""

from __future__ import annotations

from bertology.cli.main import main
from bertology.model import LongformerModel, load_model
from bertology.recipes.pretrain import pretrain
from pretrain_helpers import build, tiny_config


def test_a_converted_longformer_continues_pretraining_on_longer_sequences(assets, tmp_path):
    short = tiny_config(assets, tmp_path / "short", optim={"total_steps": 1})
    pretrain(build(short))
    assert main(["longformer", "convert", "--model", str(tmp_path / "short" / "model"), "--max-length", "128",
                 "--window", "8", "--out", str(tmp_path / "long")]) == 0
    long = tiny_config(assets, tmp_path / "run", model={"init_from": str(tmp_path / "long")},
                       data={"instances": {"kind": "full-sentences", "max_seq_length": 120}},
                       optim={"total_steps": 2})
    # The continued model's own shape: the section's settings would change its config (a 64-row position table).
    long["model"] = {"init_from": str(tmp_path / "long")}
    assert pretrain(build(long)).steps == 2
    model = load_model(tmp_path / "run" / "model")
    assert isinstance(model, LongformerModel) and model.config.attention_window == [8, 8]
    assert model.config.max_length == 128
