"""The layer's extension points: projections replaced by wrappers, adapters and prefix keys/values. Unset, nothing
changes; set, packed, padded and pruned computations agree, and every path calls the modules."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from bertology.errors import ConfigError, InputError
from bertology.model import TransformerConfig, EncoderModel, HeadSpec
from bertology.model import encoder as encoder_module

TOL = 1e-5


class LoRA(nn.Module):
    """x W^T + b + scale * x A^T B^T around a base projection."""

    def __init__(self, base: nn.Linear, rank: int = 2) -> None:
        super().__init__()
        self.base = base
        self.a = nn.Parameter(torch.randn(rank, base.in_features) * 0.1)
        self.b = nn.Parameter(torch.zeros(base.out_features, rank))
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        return self.base(x) + x @ self.a.T @ self.b.T


class Bottleneck(nn.Module):
    def __init__(self, hidden: int, width: int = 4) -> None:
        super().__init__()
        self.down, self.up = nn.Linear(hidden, width), nn.Linear(width, hidden)
        nn.init.normal_(self.up.weight, std=0.5)

    def forward(self, x):
        return x + self.up(torch.relu(self.down(x)))


class Prefix(nn.Module):
    def __init__(self, length: int, heads: int, head_dim: int) -> None:
        super().__init__()
        self.keys = nn.Parameter(torch.randn(length, heads, head_dim))
        self.values = nn.Parameter(torch.randn(length, heads, head_dim))

    def forward(self):
        return self.keys, self.values


def make_model(heads=(HeadSpec("mlm", "masked_lm"), HeadSpec("nsp", "pooled"))) -> EncoderModel:
    config = TransformerConfig(vocab_size=60, hidden_size=32, num_layers=3, num_heads=4, intermediate_size=40,
                           hidden_dropout=0.0, attention_dropout=0.0)
    model = EncoderModel(config, list(heads))
    model.init_weights(torch.Generator().manual_seed(0))
    return model.eval()


def batch():
    ids = torch.randint(5, 60, (4, 10), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[1, 6:] = 0
    mask[3, 2:] = 0
    return ids, mask


POSITIONS = torch.tensor([[0, 3], [1, 2], [1, 5], [2, 9], [3, 1]])


def outputs(model, **kw):
    ids, mask = batch()
    with torch.no_grad():
        return model(ids, mask, masked_positions=POSITIONS, **kw)


def assert_paths_agree(model):
    """Packed, padded and pruned-last-layer forwards agree at every position each computes."""
    ids, mask = batch()
    real = mask.bool()
    packed, padded = outputs(model), outputs(model, packed=False)
    pruned = outputs(model, last_layer_at=torch.tensor([[2, 4]]))
    assert (packed.last_hidden_state - padded.last_hidden_state)[real].abs().max() <= TOL
    for name in ("mlm", "nsp"):
        assert (packed.head_logits[name] - padded.head_logits[name]).abs().max() <= TOL
        assert (packed.head_logits[name] - pruned.head_logits[name]).abs().max() <= TOL
    assert (pruned.last_hidden_state[2, 4] - packed.last_hidden_state[2, 4]).abs().max() <= TOL
    return packed


def test_the_three_projections_are_modules_in_the_state_dict():
    names = set(make_model().state_dict())
    assert {f"encoder.layers.0.{p}.weight" for p in ("query", "key", "value")} <= names
    assert not any(".qkv." in name for name in names)


def test_wrapped_projections_are_called_on_every_path():
    model = make_model()
    plain = outputs(model)
    for layer in model.encoder.layers:
        layer.query, layer.value = LoRA(layer.query), LoRA(layer.value)
    same = outputs(model)  # B = 0: the wrappers add nothing; only the matmul grouping differs
    assert (same.head_logits["mlm"] - plain.head_logits["mlm"]).abs().max() <= TOL
    for layer in model.encoder.layers:
        nn.init.normal_(layer.query.b, std=0.5)
        nn.init.normal_(layer.value.b, std=0.5)
    last = model.encoder.layers[-1]
    before = last.query.calls
    changed = assert_paths_agree(model)
    assert last.query.calls == before + 3  # packed, padded and pruned forwards all called the last layer's wrapper
    assert (changed.head_logits["mlm"] - plain.head_logits["mlm"]).abs().max() > 1e-2


def test_fused_projection_equals_three_module_calls(monkeypatch):
    model = make_model()
    fused = outputs(model, output_attentions=True)
    monkeypatch.setattr(encoder_module, "plain_linear", lambda module: False)
    separate = outputs(model, output_attentions=True)
    assert (fused.last_hidden_state - separate.last_hidden_state).abs().max() <= TOL
    assert (fused.head_logits["mlm"] - separate.head_logits["mlm"]).abs().max() <= TOL


def test_adapters_act_before_the_residual_on_every_path():
    model = make_model()
    plain = outputs(model)
    for layer in model.encoder.layers:
        layer.attn_adapter, layer.ffn_adapter = nn.Identity(), nn.Identity()
    identity = outputs(model)
    assert torch.equal(identity.last_hidden_state, plain.last_hidden_state)
    torch.manual_seed(2)
    for layer in model.encoder.layers:
        layer.attn_adapter, layer.ffn_adapter = Bottleneck(32), Bottleneck(32)
    adapted = assert_paths_agree(model)
    assert (adapted.head_logits["mlm"] - plain.head_logits["mlm"]).abs().max() > 1e-2


def test_prefix_keys_are_attended_on_every_path():
    model = make_model()
    plain = outputs(model, output_attentions=True)
    for layer in model.encoder.layers:
        layer.prefix = Prefix(0, 4, 8)
    empty = outputs(model, output_attentions=True)
    assert torch.equal(empty.last_hidden_state, plain.last_hidden_state)
    assert all(torch.equal(a, b) for a, b in zip(empty.attentions, plain.attentions))
    torch.manual_seed(3)
    for layer in model.encoder.layers:
        layer.prefix = Prefix(3, 4, 8)
    prefixed = assert_paths_agree(model)
    assert (prefixed.head_logits["mlm"] - plain.head_logits["mlm"]).abs().max() > 1e-2
    # Attention probabilities cover the sequence's own keys: a row sums to less than 1, the rest went to the prefix.
    ids, mask = batch()
    with torch.no_grad():
        a = model(ids, mask, output_attentions=True)
        b = model(ids, mask, output_attentions=True, packed=False)
    real = mask.bool()
    pair = real[:, None, :, None] & real[:, None, None, :]
    for x, y in zip(a.attentions, b.attentions):
        assert x.shape == (4, 4, 10, 10)
        assert (x - y).masked_fill(~pair, 0).abs().max() <= TOL
        sums = x.sum(-1)[real[:, None, :].expand(-1, 4, -1)]
        assert (sums < 1).all() and (sums > 0).all()


def test_last_layer_at_computes_the_named_positions_and_what_the_heads_read():
    model = make_model()
    full = outputs(model)
    at = torch.tensor([[0, 7], [2, 2]])
    pruned = outputs(model, last_layer_at=at)
    for row, col in at.tolist() + POSITIONS.tolist() + [[r, 0] for r in range(4)]:
        assert (pruned.last_hidden_state[row, col] - full.last_hidden_state[row, col]).abs().max() <= TOL
    assert pruned.last_hidden_state[0, 8].abs().max() == 0  # neither asked for nor read by a head
    assert (pruned.pooler_output - full.pooler_output).abs().max() <= TOL
    # Hidden states requested, or a masked-LM head without masked positions: nothing is pruned.
    ids, mask = batch()
    with torch.no_grad():
        states = model(ids, mask, masked_positions=POSITIONS, last_layer_at=at, output_hidden_states=True)
        every = model(ids, mask, last_layer_at=at)
    assert torch.equal(states.last_hidden_state[0, 8], full.last_hidden_state[0, 8])
    assert torch.equal(every.last_hidden_state[0, 8], full.last_hidden_state[0, 8])


def test_bare_encoder_prunes_to_the_asked_positions_and_the_pooler_row():
    model = make_model(heads=())
    ids, mask = batch()
    with torch.no_grad():
        full = model(ids, mask)
        pruned = model(ids, mask, last_layer_at=torch.tensor([[1, 4]]))
    assert (pruned.last_hidden_state[1, 4] - full.last_hidden_state[1, 4]).abs().max() <= TOL
    assert (pruned.pooler_output - full.pooler_output).abs().max() <= TOL
    assert pruned.last_hidden_state[1, 3].abs().max() == 0


def test_last_layer_at_must_be_row_column_pairs_inside_the_batch():
    model = make_model()
    ids, mask = batch()
    with pytest.raises(InputError, match=r"last_layer_at must be integer \(row, column\) pairs"):
        model(ids, mask, last_layer_at=torch.tensor([1, 2]))
    with pytest.raises(InputError, match=r"outside the \[4, 10\] batch"):
        model(ids, mask, last_layer_at=torch.tensor([[4, 0]]))


def test_add_extension_plugs_in_and_records():
    encoder_module.register_extension("test-lora", lambda config, current, rank: LoRA(current, rank))
    model = make_model()
    module = model.add_extension("encoder.layers.1.query", "test-lora", rank=3)
    assert model.encoder.layers[1].query is module and module.a.shape == (3, 32)
    assert model.extensions == {"encoder.layers.1.query": ("test-lora", {"rank": 3})}
    with pytest.raises(ConfigError, match="unknown extension 'nope'"):
        model.add_extension("encoder.layers.1.key", "nope")
    with pytest.raises(ConfigError, match="has no module 'encoder.layers.9'"):
        model.add_extension("encoder.layers.9.key", "test-lora", rank=1)
    with pytest.raises(ConfigError, match="EncoderLayer has no attribute 'keys'"):
        model.add_extension("encoder.layers.1.keys", "test-lora", rank=1)
    with pytest.raises(ConfigError, match="options must be JSON values"):
        model.add_extension("encoder.layers.1.key", "test-lora", rank=torch.ones(1))


def test_builtin_factories_are_found_without_importing_their_module():
    import subprocess
    import sys

    code = ("import torch; from bertology.model import TransformerConfig, EncoderModel; "
            "m = EncoderModel(TransformerConfig(vocab_size=20, hidden_size=8, num_layers=1, num_heads=2, "
            "intermediate_size=8)); from bertology.model.encoder import BUILTIN_EXTENSIONS, EXTENSIONS; "
            "assert not set(BUILTIN_EXTENSIONS) & set(EXTENSIONS); "
            "m.add_extension('encoder.layers.0.query', 'lora', rank=2, alpha=2, dropout=0.0); print('ok')")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr.strip().splitlines()[-1:]
