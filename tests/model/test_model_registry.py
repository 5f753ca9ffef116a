"""The model registry and the native format's versions: version 2 records which registered class a model is and
rebuilds that class; version 1 files (an EncoderModel under "encoder") keep loading as before."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from bertology.errors import CheckpointError, ConfigError
from bertology.model import TransformerConfig, EncoderModel, HeadSpec, load_model, save_model
from bertology.model import registry
from bertology.model.registry import model_class, model_name, register_model


@pytest.fixture
def models(monkeypatch):
    monkeypatch.setattr(registry, "MODELS", dict(registry.MODELS))  # registrations of a test stay in the test


class TaggedEncoder(EncoderModel):
    """A model class of its own that the native format must rebuild as itself, not as its parent."""

    config_class = TransformerConfig


def native(tmp_path, cls=EncoderModel):
    config = TransformerConfig(vocab_size=50, hidden_size=16, num_layers=2, num_heads=2, intermediate_size=24,
                           max_position_embeddings=32)
    model = cls(config, [HeadSpec("mlm", "masked_lm"), HeadSpec("span", "token", num_labels=5)])
    model.init_weights(torch.Generator().manual_seed(0))
    save_model(model, tmp_path / "m", format="native")
    return model.eval(), tmp_path / "m"


def outputs(model):
    ids = torch.randint(1, 50, (2, 6), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        out = model(ids, torch.ones_like(ids))
    return out.last_hidden_state, out.head_logits["mlm"], out.head_logits["span"]


def test_the_encoder_is_registered():
    assert model_class("encoder") is EncoderModel
    assert registry.registered("encoder").config_class is TransformerConfig


def test_unknown_model_names_list_the_registered_ones():
    with pytest.raises(CheckpointError, match="unknown model 'mamba'; registered: encoder, decoder, seq2seq"):
        model_class("mamba")


def test_registration_errors(models):
    with pytest.raises(ConfigError, match="'encoder' is registered already for EncoderModel"):
        register_model("encoder", TaggedEncoder)
    with pytest.raises(ConfigError, match="EncoderModel is registered already as 'encoder'"):
        register_model("encoder-again", EncoderModel, TransformerConfig)
    with pytest.raises(ConfigError, match="needs a config class with to_dict"):
        register_model("plain", torch.nn.Linear)
    with pytest.raises(ConfigError, match="the name must be a non-empty string"):
        register_model("", TaggedEncoder)
    with pytest.raises(ConfigError, match="expected a class, got function"):
        register_model("fn", lambda config, heads: None)
    register_model("encoder", EncoderModel, TransformerConfig)  # the same registration again is harmless
    assert model_class("encoder") is EncoderModel


def test_version_2_records_the_model_and_its_config(tmp_path):
    model, directory = native(tmp_path)
    meta = json.loads((directory / "bertology.json").read_text())
    assert (meta["version"], meta["model"]) == (2, "encoder") and "encoder" not in meta
    assert meta["config"] == model.config.to_dict()
    loaded = load_model(directory)
    assert type(loaded) is EncoderModel
    assert all(torch.equal(a, b) for a, b in zip(outputs(model), outputs(loaded)))


def test_version_1_files_load_as_before(tmp_path):
    model, directory = native(tmp_path)
    meta = json.loads((directory / "bertology.json").read_text())
    version_1 = {"format": "bertology", "version": 1, "encoder": meta["config"], "heads": meta["heads"],
                 "extensions": meta["extensions"]}
    (directory / "bertology.json").write_text(json.dumps(version_1))
    loaded = load_model(directory)
    assert type(loaded) is EncoderModel and [s.name for s in loaded.head_specs] == ["mlm", "span"]
    assert all(torch.equal(a, b) for a, b in zip(outputs(model), outputs(loaded)))
    (directory / "bertology.json").write_text(json.dumps({k: v for k, v in version_1.items() if k != "encoder"}))
    with pytest.raises(CheckpointError, match=r"bertology\.json: cannot build the model it describes: missing key "
                                              r"'encoder'"):
        load_model(directory)


def test_a_registered_class_is_rebuilt_as_itself(tmp_path, models):
    register_model("tagged-encoder", TaggedEncoder)
    model, directory = native(tmp_path, TaggedEncoder)
    assert json.loads((directory / "bertology.json").read_text())["model"] == "tagged-encoder"
    loaded = load_model(directory)
    assert type(loaded) is TaggedEncoder
    assert set(load_file(directory / "model.safetensors")) == set(model.state_dict())
    assert all(torch.equal(a, b) for a, b in zip(outputs(model), outputs(loaded)))


def test_an_unregistered_class_cannot_be_saved_natively(tmp_path, models):
    with pytest.raises(CheckpointError, match=r"TaggedEncoder is not a registered model class \(registered: encoder "
                                              r"\(EncoderModel\), decoder \(DecoderModel\), seq2seq \(Seq2SeqModel\)"):  # then any registered in tests
        native(tmp_path, TaggedEncoder)
    assert not (tmp_path / "m").exists()
    assert model_name(EncoderModel(TransformerConfig(hidden_size=16, num_heads=2, num_layers=1))) == "encoder"


def test_an_unknown_model_in_a_version_2_file_names_the_file(tmp_path):
    _, directory = native(tmp_path)
    meta = json.loads((directory / "bertology.json").read_text())
    (directory / "bertology.json").write_text(json.dumps({**meta, "model": "mamba"}))
    with pytest.raises(CheckpointError, match=r"bertology\.json: cannot build the model it describes: unknown model "
                                              r"'mamba'; registered: encoder"):
        load_model(directory)
    (directory / "bertology.json").write_text(json.dumps({**meta, "version": 3}))
    with pytest.raises(CheckpointError, match=r"bertology\.json: expected format \"bertology\" version 1 or 2, got "
                                              r"'bertology' version 3"):
        load_model(directory)
