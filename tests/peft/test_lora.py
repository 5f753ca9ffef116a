"""LoRALinear: the wrapped layer's parameter names survive, the update is (alpha / r) B A on dropout(x), merging is
exact to 1e-6 and checkpoints always hold the unmerged weight; bad options are one-line ConfigErrors."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import bertology
from bertology.errors import ConfigError
from bertology.model import save_model
from bertology.model.dropout import fast_dropout
from bertology.peft import LoRALinear, apply_lora, fold_lora, merge_lora, unmerge_lora
from peft_helpers import outputs, tiny_model, train_steps


def randomised(model):
    """Non-zero LoRA updates, as after training."""
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, LoRALinear):
                module.lora_B.normal_(0, 0.3, generator=g)
    return model


def test_wrapping_keeps_names_and_parameters():
    base = tiny_model()
    names = set(base.state_dict())
    query = base.encoder.layers[0].query
    model = base
    apply_lora(model, rank=4, alpha=8)
    wrapped = model.encoder.layers[0].query
    assert isinstance(wrapped, LoRALinear) and isinstance(wrapped, nn.Linear)
    assert wrapped.weight is query.weight and wrapped.bias is query.bias  # the same parameters, not copies
    assert set(model.state_dict()) == names | {f"encoder.layers.{i}.{p}.lora_{x}" for i in range(3)
                                               for p in ("query", "value") for x in "AB"}
    assert wrapped.lora_A.shape == (4, 32) and wrapped.lora_B.shape == (32, 4) and wrapped.scaling == 2.0
    assert not wrapped.lora_B.any()


def test_forward_is_the_definition():
    layer = LoRALinear(nn.Linear(6, 5), rank=3, alpha=6)
    with torch.no_grad():
        layer.lora_B.normal_()
    x = torch.randn(7, 6)
    expected = x @ layer.weight.T + layer.bias + 2.0 * (x @ layer.lora_A.T @ layer.lora_B.T)
    torch.testing.assert_close(layer(x), expected, atol=1e-6, rtol=0)


def test_dropout_acts_on_the_lora_input_only():
    layer = LoRALinear(nn.Linear(6, 5), rank=3, alpha=3, dropout=0.5).train()
    x = torch.randn(64, 6)
    plain = x @ layer.weight.T + layer.bias
    assert torch.equal(layer(x), plain)  # B = 0: dropout or not, the update is zero
    with torch.no_grad():
        layer.lora_B.normal_()
    torch.manual_seed(0)
    noisy = layer(x)
    torch.manual_seed(0)
    mask = fast_dropout(torch.ones_like(x), 0.5, True)  # the model's dropout, drawing the same mask
    torch.testing.assert_close(noisy, plain + (x * mask) @ layer.lora_A.T @ layer.lora_B.T, atol=1e-5, rtol=0)
    layer.eval()
    torch.testing.assert_close(layer(x), plain + x @ layer.lora_A.T @ layer.lora_B.T, atol=1e-5, rtol=0)


def test_merge_of_one_layer_is_exact_to_1e_6():
    layer = LoRALinear(nn.Linear(32, 40), rank=4, alpha=8)
    with torch.no_grad():
        layer.lora_B.normal_(0, 0.1)
    x = torch.randn(50, 32)
    before = layer(x)
    weight = layer.weight.detach().clone()
    layer.merge()
    torch.testing.assert_close(layer(x), before, atol=1e-6, rtol=0)
    torch.testing.assert_close(layer.weight.detach(), weight + layer.delta().detach(), atol=0, rtol=0)
    layer.unmerge()
    torch.testing.assert_close(layer.weight.detach(), weight, atol=1e-7, rtol=0)
    torch.testing.assert_close(layer(x), before, atol=1e-6, rtol=0)


@pytest.mark.parametrize("dtype, tolerance", [(torch.float64, 1e-12), (torch.float32, 1e-5)])
def test_merge_and_unmerge(dtype, tolerance):
    model = tiny_model().to(dtype)
    apply_lora(model, rank=4, alpha=8, targets=("query", "key", "value", "attn_out", "ffn_in", "ffn_out"))
    randomised(model)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    before = outputs(model)
    merge_lora(model)
    after = outputs(model)
    torch.testing.assert_close(after[0], before[0], atol=tolerance, rtol=0)
    torch.testing.assert_close(after[1], before[1], atol=tolerance, rtol=0)
    assert model.encoder.layers[0].query.merged
    # A checkpoint of a merged model holds the unmerged weights: it loads as an ordinary LoRA model.
    for key, value in model.state_dict().items():
        torch.testing.assert_close(value, state[key], atol=tolerance, rtol=0)
    merge_lora(model)  # a second merge does nothing
    torch.testing.assert_close(outputs(model)[0], before[0], atol=tolerance, rtol=0)
    unmerge_lora(model)
    assert not model.encoder.layers[0].query.merged
    torch.testing.assert_close(outputs(model)[0], before[0], atol=tolerance, rtol=0)


def test_merged_model_saves_and_loads(tmp_path):
    model = tiny_model()
    apply_lora(model, rank=4, alpha=8)
    randomised(model)
    before = outputs(model)
    merge_lora(model)
    save_model(model, tmp_path / "m")
    reloaded = bertology.load(tmp_path / "m").model
    assert not reloaded.encoder.layers[0].query.merged
    torch.testing.assert_close(outputs(reloaded)[1], before[1], atol=1e-5, rtol=0)
    model.load_state_dict(reloaded.state_dict())  # loading into a merged model unmerges it first
    assert not model.encoder.layers[0].query.merged
    torch.testing.assert_close(outputs(model)[1], before[1], atol=1e-5, rtol=0)


def test_fold_gives_a_plain_model_in_transformers_layout(tmp_path):
    model = tiny_model()
    apply_lora(model, rank=4, alpha=8)
    train_steps(model)
    before = outputs(model)
    fold_lora(model)
    assert not model.extensions
    assert not any(isinstance(m, LoRALinear) for m in model.modules())
    torch.testing.assert_close(outputs(model)[1], before[1], atol=1e-5, rtol=0)
    save_model(model, tmp_path / "m")
    assert (tmp_path / "m" / "config.json").is_file()  # no extensions left: transformers' layout
    assert torch.equal(outputs(bertology.load(tmp_path / "m").model)[1], outputs(model)[1])


@pytest.mark.parametrize("options, message", [
    (dict(rank=0), "lora rank must be a positive integer, got 0"),
    (dict(rank=2.5), "lora rank must be a positive integer"),
    (dict(alpha=-1), "lora alpha must be a positive number"),
    (dict(dropout=1.0), "lora dropout must be a number in [0, 1)"),
    (dict(targets=("query", "pooler")), "unknown projection(s) 'pooler'"),
    (dict(targets=()), "(none given)"),
    (dict(targets=("query", "query")), "names a projection twice"),
    (dict(layers=[3]), "lora layers: layer 3 is not one of the model's 3 layers"),
    (dict(layers=[0, -3]), "name a layer twice"),
])
def test_bad_options(options, message):
    model = tiny_model()
    names = set(model.state_dict())
    with pytest.raises(ConfigError) as error:
        apply_lora(model, **{"rank": 4, "alpha": 8, **options})
    assert message in str(error.value) and "\n" not in str(error.value)
    assert set(model.state_dict()) == names  # nothing was wrapped


def test_wrapping_twice_is_refused():
    model = tiny_model()
    apply_lora(model, rank=2, alpha=2)
    with pytest.raises(ConfigError, match="already has LoRA"):
        apply_lora(copy.deepcopy(model), rank=2, alpha=2, targets=("value",))
