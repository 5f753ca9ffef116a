"""What config.json or bertology.json declares is checked against the weights before anything is built: a depth of
10**7 layers against the tensors the safetensors header holds, a hidden size of 2**20 against the stored shapes on
a meta-device skeleton. The refusals come without a model of the declared size ever being allocated."""

from __future__ import annotations

import json
import time

import pytest
import torch

from bertology.errors import CheckpointError
from bertology.model import TransformerConfig, EncoderModel, HeadSpec, load_model, save_model
from bertology.model.transformer import DecoderModel

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture
def real_builds(monkeypatch):
    """The models built off the meta device while loading (each as its config's hidden size)."""
    built = []
    for cls in (EncoderModel, DecoderModel):
        original = cls.__init__

        def init(self, config, *args, _original=original, **kwargs):
            if torch.get_default_device().type != "meta":
                built.append(config.hidden_size)
            _original(self, config, *args, **kwargs)

        monkeypatch.setattr(cls, "__init__", init)
    return built


def saved_bert(tmp_path, format="auto"):
    torch.manual_seed(0)
    config = TransformerConfig(vocab_size=40, hidden_size=16, num_layers=2, num_heads=2, intermediate_size=24,
                           max_position_embeddings=32)
    model = EncoderModel(config, [HeadSpec("mlm", "masked_lm")])
    save_model(model, tmp_path / "m", format=format)
    return tmp_path / "m"


def edit(path, change):
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def refused_fast(directory, match, real_builds):
    real_builds.clear()  # the model saved by the test itself
    start = time.perf_counter()
    with pytest.raises(CheckpointError, match=match):
        load_model(directory)
    assert real_builds == []  # nothing of the declared size was allocated
    assert time.perf_counter() - start < 20  # a generous bound: building 10**7 layers takes minutes and 100+ GB


def test_a_config_declaring_ten_million_layers_is_refused_from_the_header(tmp_path, real_builds):
    directory = saved_bert(tmp_path)
    edit(directory / "config.json", lambda c: c.update(num_hidden_layers=10**7))
    refused_fast(directory, r"config\.json: num_hidden_layers 10000000: .*model\.safetensors holds \d+ tensors, "
                            r"fewer than one a layer", real_builds)


def test_a_config_declaring_a_hidden_size_of_2_to_the_20_is_refused_before_it_is_built(tmp_path, real_builds):
    directory = saved_bert(tmp_path)
    edit(directory / "config.json", lambda c: c.update(hidden_size=2**20, intermediate_size=2**22))
    refused_fast(directory, r"weights do not fit a bert model: .*shape mismatches: "
                            r".*word_embeddings\.weight: checkpoint \(40, 16\), model \(40, 1048576\).* \(the "
                            r"model's shapes are those .*config\.json declares\)", real_builds)


def test_a_bertology_json_declaring_ten_million_layers_or_a_huge_width_is_refused(tmp_path, real_builds):
    directory = saved_bert(tmp_path, format="native")
    path = directory / "bertology.json"
    original = path.read_text()
    edit(path, lambda m: m["config"].update(num_layers=10**7))
    refused_fast(directory, r"bertology\.json: config\.num_layers 10000000: .*model\.safetensors holds \d+ "
                            r"tensors, fewer than one a layer", real_builds)
    path.write_text(original)
    edit(path, lambda m: m["config"].update(hidden_size=2**20, intermediate_size=2**22))
    refused_fast(directory, r"weights do not fit .*shape mismatches: .*checkpoint \(40, 16\), model "
                            r"\(40, 1048576\).* \(the model's shapes are those .*bertology\.json declares\)",
                 real_builds)


def test_declared_positions_whose_fixed_tables_outgrow_the_weights_are_refused(tmp_path, real_builds):
    torch.manual_seed(0)
    config = TransformerConfig.decoder(vocab_size=40, hidden_size=16, num_layers=1, num_heads=2, intermediate_size=24,
                               max_position_embeddings=64, positions="sinusoidal")
    save_model(DecoderModel(config, [HeadSpec("lm", "tied_lm")]), tmp_path / "m", format="native")
    real_builds.clear()
    edit(tmp_path / "m" / "bertology.json", lambda m: m["config"].update(max_position_embeddings=10**9))
    refused_fast(tmp_path / "m", r"bertology\.json: the model it declares builds 16000000000 values of fixed "
                                 r"tables", real_builds)


def test_a_model_within_its_weights_still_loads_and_is_built_once(tmp_path, real_builds):
    directory = saved_bert(tmp_path)
    real_builds.clear()
    model = load_model(directory)
    assert real_builds == [16]
    assert model.config.num_layers == 2


@pytest.mark.parametrize("family,key", [("gpt2", "n_layer"), ("t5", "num_decoder_layers"), ("t5", "num_layers")])
def test_every_familys_depth_key_is_checked_against_the_header(tmp_path, real_builds, family, key):
    from transformer_helpers import gpt2_pair, t5_pair

    torch.manual_seed(0)
    hf = gpt2_pair()[0] if family == "gpt2" else t5_pair()[0]
    hf.save_pretrained(tmp_path / family)
    edit(tmp_path / family / "config.json", lambda c: c.update({key: 10**7}))
    refused_fast(tmp_path / family, rf"config\.json: {key} 10000000: .*model\.safetensors holds \d+ tensors",
                 real_builds)


def test_a_pytorch_bin_is_checked_once_loaded_before_the_model_is_built(tmp_path, real_builds):
    directory = saved_bert(tmp_path)
    from safetensors.torch import load_file

    torch.save(load_file(directory / "model.safetensors"), directory / "pytorch_model.bin")
    (directory / "model.safetensors").unlink()
    edit(directory / "config.json", lambda c: c.update(num_hidden_layers=10**7))
    refused_fast(directory, r"config\.json: num_hidden_layers 10000000: .*pytorch_model\.bin holds \d+ tensors",
                 real_builds)
