"""bertology's native checkpoint format: models transformers has no class for (custom heads, extensions) save and
load with identical outputs; models it has a class for keep being written in its layout."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file
from torch import nn

from bertology.errors import CheckpointError
from bertology.model import TransformerConfig, EncoderModel, HeadSpec, load, load_model, register_extension, save_model


class ToyAdapter(nn.Module):
    def __init__(self, hidden: int, width: int) -> None:
        super().__init__()
        self.down, self.up = nn.Linear(hidden, width), nn.Linear(width, hidden)

    def forward(self, x):
        return x + self.up(torch.relu(self.down(x)))


register_extension("toy-adapter", lambda config, current, width: ToyAdapter(config.hidden_size, width))


def custom_model() -> EncoderModel:
    config = TransformerConfig(family="roberta", vocab_size=50, hidden_size=16, num_layers=2, num_heads=2,
                           intermediate_size=24, max_position_embeddings=34, pad_token_id=1,
                           positions_after_padding=True, type_vocab_size=1)
    model = EncoderModel(config, [HeadSpec("mlm", "masked_lm"), HeadSpec("sbo", "token", num_labels=7)])
    for i in range(2):
        model.add_extension(f"encoder.layers.{i}.ffn_adapter", "toy-adapter", width=4)
    model.init_weights(torch.Generator().manual_seed(0))
    return model.eval()


def forward(model):
    ids = torch.randint(3, 50, (3, 9), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[2, 5:] = 0
    with torch.no_grad():
        return model(ids.masked_fill(mask == 0, 1), mask)


def test_custom_heads_and_adapters_round_trip(tmp_path):
    model = custom_model()
    save_model(model, tmp_path / "m")
    assert sorted(p.name for p in (tmp_path / "m").iterdir()) == ["bertology.json", "model.safetensors"]
    meta = json.loads((tmp_path / "m" / "bertology.json").read_text())
    assert meta["format"] == "bertology" and meta["version"] == 2 and meta["model"] == "encoder"
    assert [h["name"] for h in meta["heads"]] == ["mlm", "sbo"]
    assert meta["extensions"]["encoder.layers.0.ffn_adapter"] == {"factory": "toy-adapter", "options": {"width": 4}}
    loaded = load(tmp_path / "m")
    assert loaded.tokenizer is None and loaded.model.extensions == model.extensions
    assert isinstance(loaded.model.encoder.layers[1].ffn_adapter, ToyAdapter)
    a, b = forward(model), forward(loaded.model)
    assert torch.equal(a.last_hidden_state, b.last_hidden_state)
    assert all(torch.equal(a.head_logits[k], b.head_logits[k]) for k in ("mlm", "sbo"))
    only_sbo = load_model(tmp_path / "m", heads=("sbo",))
    assert list(only_sbo.heads) == ["sbo"] and torch.equal(forward(only_sbo).logits, a.head_logits["sbo"])
    with pytest.raises(CheckpointError, match="has no head.* nsp"):
        load_model(tmp_path / "m", heads=("nsp",))


def test_auto_picks_hf_when_it_applies_and_native_on_request(tmp_path):
    config = TransformerConfig(vocab_size=50, hidden_size=16, num_layers=2, num_heads=2, intermediate_size=24,
                           max_position_embeddings=32)
    model = EncoderModel(config, [HeadSpec("mlm", "masked_lm"), HeadSpec("nsp", "pooled")])
    model.init_weights(torch.Generator().manual_seed(0))
    save_model(model, tmp_path / "hf")
    assert sorted(p.name for p in (tmp_path / "hf").iterdir()) == ["config.json", "model.safetensors"]
    save_model(model, tmp_path / "native", format="native")
    assert "config.json" not in {p.name for p in (tmp_path / "native").iterdir()}
    assert "encoder.layers.0.query.weight" in load_file(tmp_path / "native" / "model.safetensors")
    for directory in ("hf", "native"):
        loaded = load_model(tmp_path / directory)
        assert [s.name for s in loaded.head_specs] == ["mlm", "nsp"]
        for name, tensor in model.state_dict().items():
            assert torch.equal(loaded.state_dict()[name], tensor), (directory, name)


def test_hf_layout_refuses_what_it_cannot_hold(tmp_path):
    with pytest.raises(CheckpointError, match="transformers' layout: it has extensions .*format=\"native\""):
        save_model(custom_model(), tmp_path / "m", format="hf")
    model = custom_model()
    model.extensions.clear()
    for layer in model.encoder.layers:
        layer.ffn_adapter = None
    with pytest.raises(CheckpointError, match="no head named 'sbo'"):
        save_model(model, tmp_path / "m", format="hf")
    with pytest.raises(CheckpointError, match="unknown checkpoint format 'onnx'"):
        save_model(model, tmp_path / "m", format="onnx")  # type: ignore[arg-type]


def test_modules_set_by_hand_cannot_be_saved(tmp_path):
    model = custom_model()
    model.encoder.layers[0].attn_adapter = ToyAdapter(16, 2)  # not through add_extension: loading could not rebuild it
    with pytest.raises(CheckpointError, match=r"cannot save parameters encoder\.layers\.0\.attn_adapter\.down\.bias"):
        save_model(model, tmp_path / "m")
    assert not (tmp_path / "m").exists()


def _edit(directory, edit):
    weights = load_file(directory / "model.safetensors")
    edit(weights)
    save_file(weights, directory / "model.safetensors")


def test_native_load_errors_name_the_keys(tmp_path):
    save_model(custom_model(), tmp_path / "m")
    _edit(tmp_path / "m", lambda w: w.pop("encoder.layers.1.ffn_adapter.up.weight"))
    with pytest.raises(CheckpointError, match=r"missing keys: encoder\.layers\.1\.ffn_adapter\.up\.weight"):
        load_model(tmp_path / "m")
    save_model(custom_model(), tmp_path / "m")
    _edit(tmp_path / "m", lambda w: w.__setitem__("encoder.layers.0.extra.weight", torch.zeros(2)))
    with pytest.raises(CheckpointError, match=r"unexpected keys: encoder\.layers\.0\.extra\.weight"):
        load_model(tmp_path / "m")
    save_model(custom_model(), tmp_path / "m")
    _edit(tmp_path / "m", lambda w: w.__setitem__("heads.sbo.out.weight", torch.zeros(5, 16)))
    with pytest.raises(CheckpointError, match=r"heads\.sbo\.out\.weight: checkpoint \(5, 16\), model \(7, 16\)"):
        load_model(tmp_path / "m")


def test_native_metadata_errors_name_the_file(tmp_path):
    save_model(custom_model(), tmp_path / "m")
    path = tmp_path / "m" / "bertology.json"
    meta = json.loads(path.read_text())
    path.write_text(json.dumps({**meta, "version": 7}))
    with pytest.raises(CheckpointError, match=r"bertology\.json: expected format \"bertology\" version 1"):
        load_model(tmp_path / "m")
    path.write_text(json.dumps({**meta, "extensions": {"encoder.layers.0.prefix": {"factory": "gone",
                                                                                  "options": {}}}}))
    with pytest.raises(CheckpointError, match=r"bertology\.json: cannot build .*unknown extension 'gone'"):
        load_model(tmp_path / "m")
    path.write_text(json.dumps({**meta, "heads": [{"name": "x", "kind": "spans"}]}))
    with pytest.raises(CheckpointError, match=r"bertology\.json: cannot build .*unknown kind 'spans'"):
        load_model(tmp_path / "m")
    path.write_text(json.dumps({k: v for k, v in meta.items() if k != "config"}))
    with pytest.raises(CheckpointError, match=r"bertology\.json: cannot build .*missing key 'config'"):
        load_model(tmp_path / "m")


def test_read_state_dict_reads_either_format_into_a_built_model(tmp_path):
    from bertology.model.checkpoint import read_state_dict

    model = custom_model()
    save_model(model, tmp_path / "native")
    fresh = custom_model()
    fresh.load_state_dict(read_state_dict(tmp_path / "native", model))
    assert torch.equal(forward(fresh).last_hidden_state, forward(model).last_hidden_state)
    plain = EncoderModel(model.config, [HeadSpec("mlm", "masked_lm")])
    save_model(plain, tmp_path / "hf")
    assert set(read_state_dict(tmp_path / "hf", plain)) == set(plain.state_dict())
    with pytest.raises(CheckpointError, match="unexpected keys: encoder.layers.0.ffn_adapter"):
        read_state_dict(tmp_path / "native", plain)
