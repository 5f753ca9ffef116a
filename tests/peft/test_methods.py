"""Every parameter-efficient method on the same invariants: the identity at initialisation (where the method is
one), only the method's parameters (and the heads) train, a few optimizer steps change only those, the native format
round-trips, and the trainable share is the method's arithmetic."""

from __future__ import annotations

import copy

import pytest
import torch

import bertology
from bertology.model import save_model
from bertology.peft import apply_adapters, apply_lora, apply_prefix, trainable_parameters
from peft_helpers import (HEADS, HIDDEN, INTERMEDIATE, LABELS, LAYERS, batch, changed, outputs, snapshot, tiny_model,
                          train_steps, trainable_names)

HEAD = HIDDEN * LABELS + LABELS  # the classifier's weight and bias
NORMS = 2 * HIDDEN * (1 + 2 * LAYERS)  # the embeddings' LayerNorm and two per layer


def lora_count(rank, targets, layers=LAYERS):
    width = {"query": (HIDDEN, HIDDEN), "value": (HIDDEN, HIDDEN), "key": (HIDDEN, HIDDEN),
             "attn_out": (HIDDEN, HIDDEN), "ffn_in": (HIDDEN, INTERMEDIATE), "ffn_out": (INTERMEDIATE, HIDDEN)}
    return layers * sum(rank * (width[t][0] + width[t][1]) for t in targets)


def adapter_count(bottleneck, per_layer=2, layers=LAYERS):
    return layers * per_layer * (2 * HIDDEN * bottleneck + bottleneck + HIDDEN)


def prefix_count(length, layers=LAYERS, mlp_hidden=None):
    if mlp_hidden is None:
        return layers * 2 * length * HIDDEN
    return layers * (length * HIDDEN + HIDDEN * mlp_hidden + mlp_hidden + mlp_hidden * 2 * HIDDEN + 2 * HIDDEN)


# (id, apply, added parameters, trained parameters, identity at initialisation, what trains: a name predicate)
METHODS = [
    ("lora-qv", lambda m: apply_lora(m, rank=4, alpha=8), lora_count(4, ("query", "value")),
     lora_count(4, ("query", "value")) + HEAD, True, lambda n: ".lora_" in n or n.startswith("heads.")),
    ("lora-all-layers-1", lambda m: apply_lora(m, rank=2, alpha=2, dropout=0.1, layers=[1],
                                               targets=("key", "attn_out", "ffn_in", "ffn_out")),
     lora_count(2, ("key", "attn_out", "ffn_in", "ffn_out"), layers=1),
     lora_count(2, ("key", "attn_out", "ffn_in", "ffn_out"), layers=1) + HEAD, True,
     lambda n: ".lora_" in n or n.startswith("heads.")),
    ("lora-no-heads", lambda m: apply_lora(m, rank=4, alpha=8, train_heads=False), lora_count(4, ("query", "value")),
     lora_count(4, ("query", "value")), True, lambda n: ".lora_" in n),
    ("adapters", lambda m: apply_adapters(m, bottleneck=8), adapter_count(8), adapter_count(8) + HEAD, True,
     lambda n: "_adapter." in n or n.startswith("heads.")),
    ("adapters-houlsby", lambda m: apply_adapters(m, bottleneck=8, sublayers=("ffn",), layers=[0, 2],
                                                  train_layer_norms=True),
     adapter_count(8, per_layer=1, layers=2), adapter_count(8, per_layer=1, layers=2) + NORMS + HEAD, True,
     lambda n: "_adapter." in n or "norm." in n or n.startswith("heads.")),
    ("prefix", lambda m: apply_prefix(m, length=5), prefix_count(5), prefix_count(5) + HEAD, False,
     lambda n: ".prefix." in n or n.startswith("heads.")),
    ("prefix-mlp", lambda m: apply_prefix(m, length=5, reparameterize=True, mlp_hidden=16, layers=[-1]),
     prefix_count(5, layers=1, mlp_hidden=16), prefix_count(5, layers=1, mlp_hidden=16) + HEAD, False,
     lambda n: ".prefix." in n or n.startswith("heads.")),
]
IDS = [m[0] for m in METHODS]


@pytest.fixture(params=METHODS, ids=IDS)
def method(request):
    return request.param


def applied(method, seed=0):
    base = tiny_model(seed)
    model = copy.deepcopy(base)
    torch.manual_seed(seed)
    share = method[1](model)
    return base, model, share


def test_identity_at_initialisation(method):
    base, model, _ = applied(method)
    (h0, logits0), (h1, logits1) = outputs(base), outputs(model)
    if method[4]:
        assert torch.equal(h0, h1) and torch.equal(logits0, logits1)
        assert torch.equal(outputs(base, packed=False)[0], outputs(model, packed=False)[0])
    else:  # a prefix takes part of every query's attention from the start
        assert not torch.allclose(h0, h1)


def test_only_the_method_trains(method):
    _, model, _ = applied(method)
    intended = {name for name, _ in model.named_parameters() if method[5](name)}
    assert trainable_names(model) == intended
    before = snapshot(model)
    train_steps(model)
    assert changed(before, model) == intended


def test_packed_padded_and_pruned_paths_agree_after_training(method):
    _, model, _ = applied(method)
    train_steps(model)
    packed, padded = outputs(model), outputs(model, packed=False)
    torch.testing.assert_close(packed[0], padded[0], atol=1e-5, rtol=0)
    torch.testing.assert_close(packed[1], padded[1], atol=1e-5, rtol=0)
    ids, mask, _ = batch()
    with torch.no_grad():  # the pooled head reads [CLS]: the last layer runs only there
        pruned = model(ids, mask, last_layer_at=torch.zeros(0, 2, dtype=torch.long)).logits
    torch.testing.assert_close(pruned, packed[1], atol=1e-5, rtol=0)


def test_native_round_trip(method, tmp_path):
    _, model, _ = applied(method)
    train_steps(model)
    save_model(model, tmp_path / "model")
    assert (tmp_path / "model" / "bertology.json").is_file()
    reloaded = bertology.load(tmp_path / "model").model
    assert reloaded.extensions == model.extensions
    for packed in (True, False):
        expected, got = outputs(model, packed), outputs(reloaded, packed)
        assert torch.equal(expected[0], got[0]) and torch.equal(expected[1], got[1])


def test_trainable_share_is_the_arithmetic(method):
    base, model, share = applied(method)
    total = trainable_parameters(base).total
    assert share == trainable_parameters(model) == (method[3], total + method[2])
    assert share.share == pytest.approx(method[3] / (total + method[2]))
    assert "trainable parameters" in str(share)


def test_methods_combine():
    """LoRA then adapters: each apply keeps every extension's parameters training."""
    model = tiny_model()
    apply_lora(model, rank=2, alpha=2)
    share = apply_adapters(model, bottleneck=4, train_heads=False)
    assert share.trainable == lora_count(2, ("query", "value")) + adapter_count(4)
    assert HEADS == 4  # the prefix arithmetic above assumes hidden // heads keys per head


def test_native_checkpoint_loads_without_importing_bertology_peft(tmp_path):
    import subprocess
    import sys

    model = tiny_model()
    apply_lora(model, rank=2, alpha=2)
    save_model(model, tmp_path / "model")
    code = f"import bertology; bertology.load({str(tmp_path / 'model')!r})"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr.strip().splitlines()[-1]
