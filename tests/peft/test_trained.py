"""save_trained writes only what trained (and the heads) plus the recipe; load_trained rebuilds the trained model on
its base checkpoint with identical outputs, and refuses a base it was not trained on."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from safetensors.torch import load_file

import bertology
from bertology.errors import CheckpointError
from bertology.model import EncoderModel, HeadSpec, save_model
from bertology.peft import apply_adapters, apply_lora, apply_prefix, load_trained, save_trained
from peft_helpers import LABELS, outputs, tiny_model, train_steps, trainable_names


@pytest.fixture
def base_dir(tmp_path):
    save_model(tiny_model(), tmp_path / "base")  # a classifier transformers has a class for: its layout
    assert (tmp_path / "base" / "config.json").is_file()
    return tmp_path / "base"


@pytest.mark.parametrize("apply", [
    lambda m: apply_lora(m, rank=4, alpha=8),
    lambda m: apply_adapters(m, bottleneck=4, train_layer_norms=True),
    lambda m: apply_prefix(m, length=3, reparameterize=True, mlp_hidden=8),
    lambda m: (apply_lora(m, rank=2, alpha=4, targets=("ffn_in",)), apply_adapters(m, 4, layers=[0]),
               apply_prefix(m, 2, layers=[2])),
], ids=["lora", "adapters-houlsby", "prefix-mlp", "combined"])
def test_round_trip_onto_the_base(base_dir, tmp_path, apply):
    model = bertology.load(base_dir).model
    apply(model)
    train_steps(model)
    written = save_trained(model, tmp_path / "trained", base=str(base_dir))
    stored = load_file(tmp_path / "trained" / "trained.safetensors")
    assert set(stored) == set(written) == trainable_names(model)  # the heads train here, so they are among them
    recipe = json.loads((tmp_path / "trained" / "trained.json").read_text())
    assert recipe["base"] == str(base_dir) and set(recipe["extensions"]) == set(model.extensions)
    for base in (base_dir, bertology.load(base_dir), bertology.load(base_dir).model):
        reloaded = load_trained(base, tmp_path / "trained")
        for packed in (True, False):
            expected, got = outputs(model, packed), outputs(reloaded, packed)
            assert torch.equal(expected[0], got[0]) and torch.equal(expected[1], got[1])
        assert trainable_names(reloaded) == trainable_names(model)


def test_frozen_new_head_is_saved(tmp_path):
    """A head added to a base without one and left frozen still travels: the base cannot supply it."""
    bare = tiny_model(heads=())
    save_model(bare, tmp_path / "base")
    model = EncoderModel(bare.config, [HeadSpec("sentiment", "pooled", num_labels=LABELS)])
    model.load_state_dict(bertology.load(tmp_path / "base").model.state_dict(), strict=False)
    apply_lora(model, rank=2, alpha=2, train_heads=False)
    train_steps(model)
    save_trained(model, tmp_path / "trained")
    assert {k for k in load_file(tmp_path / "trained" / "trained.safetensors") if k.startswith("heads.")} == \
        {"heads.sentiment.out.weight", "heads.sentiment.out.bias"}
    reloaded = load_trained(tmp_path / "base", tmp_path / "trained")
    assert torch.equal(outputs(reloaded)[1], outputs(model)[1])
    assert not any(p.requires_grad for n, p in reloaded.named_parameters() if n.startswith("heads."))


def test_the_wrong_base_is_refused(base_dir, tmp_path):
    model = bertology.load(base_dir).model
    apply_lora(model, rank=2, alpha=2)
    save_trained(model, tmp_path / "trained")
    other = tiny_model(seed=7)
    with pytest.raises(CheckpointError, match="base_fingerprint differs"):
        load_trained(other, tmp_path / "trained")
    load_trained(other, tmp_path / "trained", check_base=False)
    with pytest.raises(CheckpointError, match=r"differs from the one trained in hidden_size \(64 vs 32\)"):
        load_trained(tiny_model(hidden_size=64), tmp_path / "trained")


def test_bad_directories(base_dir, tmp_path):
    with pytest.raises(CheckpointError, match="trained.json: missing"):
        load_trained(base_dir, tmp_path)
    model = bertology.load(base_dir).model
    apply_lora(model, rank=2, alpha=2)
    save_trained(model, tmp_path / "t")
    (tmp_path / "t" / "trained.json").write_text(json.dumps({"format": "other", "version": 1}))
    with pytest.raises(CheckpointError, match="expected format 'bertology-trained' version 1"):
        load_trained(base_dir, tmp_path / "t")
    save_trained(model, tmp_path / "t")
    recipe = json.loads((tmp_path / "t" / "trained.json").read_text())
    recipe["extensions"]["encoder.layers.0.query"]["options"]["rank"] = 3
    (tmp_path / "t" / "trained.json").write_text(json.dumps(recipe))
    with pytest.raises(CheckpointError, match=r"shape mismatches: encoder.layers.0.query.lora_A: file \(2, 32\)"):
        load_trained(base_dir, tmp_path / "t")
    (tmp_path / "t" / "trained.safetensors").write_bytes(b"garbage")
    with pytest.raises(CheckpointError, match="not a readable safetensors file"):
        load_trained(base_dir, tmp_path / "t")


def test_given_model_is_not_changed(base_dir, tmp_path):
    model = bertology.load(base_dir).model
    apply_lora(model, rank=2, alpha=2)
    save_trained(model, tmp_path / "t")
    base = bertology.load(base_dir).model
    state = copy.deepcopy(base.state_dict())
    load_trained(base, tmp_path / "t")
    assert not base.extensions and all(torch.equal(v, state[k]) for k, v in base.state_dict().items())


def test_version_1_recipes_load_and_a_decoder_round_trips(base_dir, tmp_path):
    model = bertology.load(base_dir).model
    apply_lora(model, rank=2, alpha=4)
    save_trained(model, tmp_path / "v1", base=str(base_dir))
    recipe = json.loads((tmp_path / "v1" / "trained.json").read_text())
    assert recipe["version"] == 2 and recipe["model"] == "encoder"
    recipe["encoder"] = recipe.pop("config")  # the layout version 1 wrote: an EncoderModel's config, no model name
    del recipe["model"]
    (tmp_path / "v1" / "trained.json").write_text(json.dumps({**recipe, "version": 1}))
    again = load_trained(base_dir, tmp_path / "v1")
    batch = torch.randint(1, 50, (2, 5))
    with torch.no_grad():
        assert torch.equal(again(batch).logits, model.eval()(batch).logits)

    from bertology.model import DecoderModel, TransformerConfig

    torch.manual_seed(0)
    decoder = DecoderModel(TransformerConfig.decoder(vocab_size=40, hidden_size=16, num_layers=2, num_heads=2,
                                             intermediate_size=32, max_position_embeddings=16),
                           [HeadSpec("lm", "tied_lm")])
    decoder.init_weights(torch.Generator().manual_seed(1))
    save_model(decoder, tmp_path / "decoder")
    tuned = bertology.load(tmp_path / "decoder").model
    apply_lora(tuned, rank=2, alpha=4, targets=("query", "ffn_in"))
    with torch.no_grad():
        for name, parameter in tuned.named_parameters():
            if "lora_B" in name:
                parameter.normal_()  # as if trained
    save_trained(tuned, tmp_path / "decoder-lora")
    loaded = load_trained(tmp_path / "decoder", tmp_path / "decoder-lora")
    assert type(loaded) is DecoderModel
    ids = torch.randint(0, 40, (2, 6))
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, tuned.eval()(ids).logits)
