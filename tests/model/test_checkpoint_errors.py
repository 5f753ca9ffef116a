"""A broken model directory gets an error that names what is wrong; a save killed half way loses nothing."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from bertology.errors import CheckpointError, ConfigError
from bertology.model import TransformerConfig, EncoderModel, HeadSpec, load, load_model, preset, save_model
from bertology.model import checkpoint as checkpoint_module


def tiny(family="bert", **kw) -> EncoderModel:
    config = TransformerConfig(family=family, vocab_size=50, hidden_size=16, num_layers=2, num_heads=2,
                           intermediate_size=24, max_position_embeddings=32, **kw)
    model = EncoderModel(config, [HeadSpec("mlm", "masked_lm"), HeadSpec("nsp", "pooled")])
    model.init_weights(torch.Generator().manual_seed(0))
    return model


def test_missing_directory(tmp_path):
    with pytest.raises(CheckpointError, match="no such model directory"):
        load_model(tmp_path / "nope")


def test_missing_config(tmp_path):
    with pytest.raises(CheckpointError, match="config.json is missing"):
        load_model(tmp_path)


def test_unknown_model_type(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "mamba"}))
    with pytest.raises(CheckpointError, match="unknown model_type 'mamba'"):
        load_model(tmp_path)


def test_invalid_json_config(tmp_path):
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="config.json: not valid JSON"):
        load_model(tmp_path)


def test_missing_weights_names_what_is_there(tmp_path):
    save_model(tiny(), tmp_path / "m")
    (tmp_path / "m" / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match="no weights found .* holds config.json"):
        load_model(tmp_path / "m")


def _edit_weights(directory, edit):
    path = directory / "model.safetensors"
    weights = load_file(path)
    edit(weights)
    save_file(weights, path)


def test_missing_key_is_named(tmp_path):
    save_model(tiny(), tmp_path / "m")
    _edit_weights(tmp_path / "m", lambda w: w.pop("bert.encoder.layer.1.output.dense.weight"))
    with pytest.raises(CheckpointError, match=r"missing keys: bert\.encoder\.layer\.1\.output\.dense\.weight"):
        load_model(tmp_path / "m")


def test_unexpected_key_is_named(tmp_path):
    save_model(tiny(), tmp_path / "m")
    _edit_weights(tmp_path / "m", lambda w: w.__setitem__("bert.encoder.layer.7.extra.weight", torch.zeros(2)))
    with pytest.raises(CheckpointError, match=r"unexpected keys: bert\.encoder\.layer\.7\.extra\.weight"):
        load_model(tmp_path / "m")


def test_shape_mismatch_is_named(tmp_path):
    save_model(tiny(), tmp_path / "m")
    _edit_weights(tmp_path / "m", lambda w: w.__setitem__("bert.pooler.dense.weight", torch.zeros(16, 8)))
    with pytest.raises(CheckpointError, match=r"bert\.pooler\.dense\.weight: checkpoint \(16, 8\), model \(16, 16\)"):
        load_model(tmp_path / "m")


def test_unsupported_architecture(tmp_path):
    save_model(tiny(), tmp_path / "m")
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    config["architectures"] = ["BertForMultipleChoice"]
    (tmp_path / "m" / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="unsupported architecture 'BertForMultipleChoice'"):
        load_model(tmp_path / "m")


def test_relative_positions_are_refused(tmp_path):
    save_model(tiny(), tmp_path / "m")
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    config["position_embedding_type"] = "relative_key"
    (tmp_path / "m" / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="position_embedding_type 'relative_key'"):
        load_model(tmp_path / "m")


def test_pytorch_bin_weights(tmp_path):
    model = tiny()
    save_model(model, tmp_path / "m")
    weights = load_file(tmp_path / "m" / "model.safetensors")
    (tmp_path / "m" / "model.safetensors").unlink()
    torch.save(weights, tmp_path / "m" / "pytorch_model.bin")
    loaded = load_model(tmp_path / "m")
    for name, tensor in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor), name


def test_killed_save_keeps_previous_checkpoint(tmp_path, monkeypatch):
    first = tiny()
    save_model(first, tmp_path / "m")
    before = {p.name: p.read_bytes() for p in (tmp_path / "m").iterdir()}

    def fail(*args, **kwargs):
        raise KeyboardInterrupt("killed while writing")

    monkeypatch.setattr(checkpoint_module, "save_file", fail)
    with pytest.raises(KeyboardInterrupt):
        save_model(tiny(), tmp_path / "m")
    after = {p.name: p.read_bytes() for p in (tmp_path / "m").iterdir()}
    assert after == before
    assert [p.name for p in tmp_path.iterdir()] == ["m"]  # no temporary directory left behind


def test_round_trip_every_family_without_transformers(tmp_path):
    for family, extra in [("bert", {}), ("roberta", {"positions_after_padding": True, "pad_token_id": 1}),
                          ("electra", {"embedding_size": 8, "pooler": False}),
                          ("albert", {"embedding_size": 8, "num_layer_groups": 1}),
                          ("distilbert", {"type_vocab_size": 0, "pooler": False})]:
        config = TransformerConfig(family=family, vocab_size=50, hidden_size=16, num_layers=2, num_heads=2,
                               intermediate_size=24, max_position_embeddings=32, **extra)
        model = EncoderModel(config, [HeadSpec("mlm", "masked_lm")])
        model.init_weights(torch.Generator().manual_seed(0))
        save_model(model, tmp_path / family)
        loaded = load(tmp_path / family)
        assert loaded.tokenizer is None
        assert loaded.config.family == family
        for name, tensor in model.state_dict().items():
            assert torch.equal(loaded.model.state_dict()[name], tensor), (family, name)


def test_presets_and_config_validation():
    assert (preset("mini").num_layers, preset("mini").hidden_size, preset("mini").num_heads) == (4, 256, 4)
    assert preset("base").intermediate_size == 3072
    with pytest.raises(ConfigError, match="unknown preset 'huge'"):
        preset("huge")
    with pytest.raises(ConfigError, match="not divisible"):
        TransformerConfig(hidden_size=30, num_heads=4)
    with pytest.raises(ConfigError, match="unknown encoder config key"):
        TransformerConfig.from_dict({"hiden_size": 3})


def _one_line_checkpoint_error(path, match):
    from bertology import load as top_level_load

    with pytest.raises(CheckpointError, match=match) as caught:
        top_level_load(path)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize("damage", ["truncated", "garbage", "empty"])
def test_corrupt_safetensors_names_the_file(tmp_path, damage):
    save_model(tiny(), tmp_path / "m")
    path = tmp_path / "m" / "model.safetensors"
    data = path.read_bytes()
    path.write_bytes({"truncated": data[: len(data) // 2], "garbage": bytes(range(256)) * 8, "empty": b""}[damage])
    _one_line_checkpoint_error(tmp_path / "m", r"model\.safetensors: not a readable safetensors file")


def test_corrupt_shard_names_the_shard(tmp_path):
    save_model(tiny(), tmp_path / "m")
    weights = load_file(tmp_path / "m" / "model.safetensors")
    (tmp_path / "m" / "model.safetensors").unlink()
    names = sorted(weights)
    half = len(names) // 2
    shards = {"model-00001-of-00002.safetensors": names[:half], "model-00002-of-00002.safetensors": names[half:]}
    for shard, keys in shards.items():
        save_file({k: weights[k] for k in keys}, tmp_path / "m" / shard)
    index = {"weight_map": {k: shard for shard, keys in shards.items() for k in keys}}
    (tmp_path / "m" / "model.safetensors.index.json").write_text(json.dumps(index))
    assert load_model(tmp_path / "m").config.num_layers == 2  # sharded weights load
    second = tmp_path / "m" / "model-00002-of-00002.safetensors"
    second.write_bytes(second.read_bytes()[:100])
    _one_line_checkpoint_error(tmp_path / "m", r"model-00002-of-00002\.safetensors: not a readable safetensors")
    (tmp_path / "m" / "model.safetensors.index.json").write_text("[1, 2]")
    _one_line_checkpoint_error(tmp_path / "m", r"model\.safetensors\.index\.json: expected a JSON object, got a list")


def test_config_that_is_not_an_object_names_the_file(tmp_path):
    save_model(tiny(), tmp_path / "m")
    (tmp_path / "m" / "config.json").write_text('["bert"]')
    _one_line_checkpoint_error(tmp_path / "m", r"config\.json: expected a JSON object, got a list")


def test_config_that_is_not_utf8_names_the_file(tmp_path):
    save_model(tiny(), tmp_path / "m")
    (tmp_path / "m" / "config.json").write_bytes(b'{"model_type": "b\xe9rt"}')
    _one_line_checkpoint_error(tmp_path / "m", r"config\.json: not UTF-8 text")


def test_cli_info_reports_a_corrupt_checkpoint_in_one_line(tmp_path, capsys):
    from bertology.cli.main import main

    save_model(tiny(), tmp_path / "m")
    path = tmp_path / "m" / "model.safetensors"
    path.write_bytes(path.read_bytes()[:1000])
    assert main(["info", str(tmp_path / "m")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "model.safetensors: not a readable safetensors file" in err
