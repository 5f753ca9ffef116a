"""Checkpoints the engine refuses, each with the file and the key: an unregistered model_type or architecture, a
config.json mixing two families' fields, a head the family does not have, an MLM decoder not tied to the word
embeddings."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from bertology.errors import CheckpointError, ConfigError
from bertology.model import TransformerConfig, EncoderModel, HeadSpec, load_model, save_model


def saved(tmp_path, family="bert", heads=(("mlm", "masked_lm"), ("nsp", "pooled")), **kw):
    values = dict(vocab_size=50, hidden_size=16, num_layers=2, num_heads=2, intermediate_size=24,
                  max_position_embeddings=32)
    config = TransformerConfig(family=family, **{**values, **kw})
    model = EncoderModel(config, [HeadSpec(name, kind) for name, kind in heads])
    model.init_weights(torch.Generator().manual_seed(0))
    save_model(model, tmp_path / "m")
    return tmp_path / "m"


def edit_config(directory, **changes):
    path = directory / "config.json"
    config = {**json.loads(path.read_text()), **changes}
    path.write_text(json.dumps({k: v for k, v in config.items() if v is not ...}))


def test_unregistered_model_type_names_the_file_key_and_the_registered_ones(tmp_path):
    directory = saved(tmp_path)
    edit_config(directory, model_type="mamba")
    with pytest.raises(CheckpointError, match=r"config\.json: model_type: unknown model_type 'mamba'; registered: "
                                              r"bert, roberta, xlm-roberta, electra, albert, distilbert"):
        load_model(directory)
    edit_config(directory, model_type=...)
    with pytest.raises(CheckpointError, match=r"config\.json: model_type: unknown model_type None"):
        load_model(directory)


def test_unregistered_architecture_names_the_file_and_key(tmp_path):
    directory = saved(tmp_path)
    edit_config(directory, architectures=["BertForMultipleChoice"])
    with pytest.raises(CheckpointError, match=r"config\.json: architectures: unsupported architecture "
                                              r"'BertForMultipleChoice'; supported: BertModel, BertForMaskedLM"):
        load_model(directory)
    edit_config(directory, architectures=["RobertaForMaskedLM"])
    with pytest.raises(CheckpointError, match=r"config\.json: architectures: 'RobertaForMaskedLM' does not belong "
                                              r"to model type 'bert'"):
        load_model(directory)
    edit_config(directory, architectures="BertForMaskedLM")
    with pytest.raises(CheckpointError, match=r"config\.json: architectures: expected a list of class names"):
        load_model(directory)


@pytest.mark.parametrize("family,key,owner", [
    ("bert", "n_layers", "distilbert"),
    ("bert", "embedding_size", "electra"),
    ("roberta", "num_hidden_groups", "albert"),
    ("distilbert", "num_hidden_layers", "bert"),
])
def test_a_config_mixing_two_families_fields_names_the_file_and_key(tmp_path, family, key, owner):
    extra = {"type_vocab_size": 0, "pooler": False} if family == "distilbert" else {}
    if family == "roberta":
        extra = {"positions_after_padding": True, "pad_token_id": 1, "max_position_embeddings": 34}
    directory = saved(tmp_path, family, heads=(("mlm", "masked_lm"),), **extra)
    edit_config(directory, **{key: 3})
    with pytest.raises(ConfigError, match=rf"config\.json: key '{key}' is a {owner} config key, not a {family} one: "
                                          r"the file mixes two families' fields"):
        load_model(directory)


def test_a_null_foreign_key_is_not_a_mix(tmp_path):
    directory = saved(tmp_path)
    edit_config(directory, embedding_size=None)  # transformers writes absent options as null
    assert load_model(directory).config.embedding_size is None


def test_a_head_the_family_does_not_have_names_the_file(tmp_path):
    directory = saved(tmp_path, "electra", heads=(("rtd", "token_mlp"),), pooler=False)
    with pytest.raises(CheckpointError, match=r"config\.json: electra checkpoints have no head 'nsp' \(heads: mlm, "
                                              r"rtd, classifier, token_classifier, qa\)"):
        load_model(directory, heads=("nsp",))
    assert [s.name for s in load_model(directory, heads=("rtd",)).head_specs] == ["rtd"]


def test_the_cli_reports_a_mixed_config_in_one_line(tmp_path, capsys):
    from bertology.cli.main import main

    directory = saved(tmp_path)
    edit_config(directory, n_heads=2)
    assert main(["info", str(directory)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "key 'n_heads' is a distilbert config key" in err


def test_an_untied_decoder_is_named(tmp_path):
    directory = saved(tmp_path)
    weights = load_file(directory / "model.safetensors")
    weights["cls.predictions.decoder.weight"] = torch.zeros_like(weights["bert.embeddings.word_embeddings.weight"])
    weights["cls.predictions.decoder.bias"] = weights["cls.predictions.bias"].clone()
    save_file(weights, directory / "model.safetensors")
    with pytest.raises(CheckpointError, match=r"m: weights do not fit a bert model: shape mismatches: "
                                              r"cls\.predictions\.decoder\.weight: differs from "
                                              r"encoder\.embeddings\.word\.weight"):
        load_model(directory)
    weights["cls.predictions.decoder.weight"] = weights["bert.embeddings.word_embeddings.weight"].clone()
    save_file(weights, directory / "model.safetensors")
    assert [s.name for s in load_model(directory).head_specs] == ["mlm", "nsp"]  # a tied copy is accepted


def test_distilbert_tolerates_the_bert_keys_its_transformers_config_keeps_and_ignores(tmp_path):
    directory = saved(tmp_path, "distilbert", heads=(("mlm", "masked_lm"),), type_vocab_size=0, pooler=False)
    edit_config(directory, attention_probs_dropout_prob=0.0, hidden_dropout_prob=0.0, intermediate_size=99)
    config = load_model(directory).config
    assert (config.intermediate_size, config.attention_dropout) == (24, 0.1)  # hidden_dim and attention_dropout rule
    assert config.extra["intermediate_size"] == 99  # kept, so that saving writes it back
