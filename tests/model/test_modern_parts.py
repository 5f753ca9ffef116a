"""The parts ModernBERT added to the shared stack, each on its own: rotary positions (against a float64 rotation,
and relative by construction), per-layer windows and rotary bases in a bidirectional `Stack` (against a float64
reference with explicit masks; packed == padded), norms without biases, no norm before layer 0's attention, the
heads' biases and the prediction heads' poolings, and the config's errors naming the key."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from bertology.errors import ConfigError
from bertology.model.heads import HeadInputs, HeadSpec, MaskedLMHead, build_head
from bertology.model.positions import apply_rotary, rotary_tables
from bertology.model.encoder import EncoderModel, TransformerConfig


def test_rotary_turns_each_pair_by_its_angle(one_thread):
    torch.manual_seed(0)
    d, theta = 8, 500.0
    x = torch.randn(5, d, dtype=torch.float64)
    positions = torch.tensor([0, 1, 3, 7, 30])
    cos, sin = rotary_tables(positions, d, theta)
    ours = apply_rotary(x.float(), cos, sin).double()
    expected = x.clone()
    for row, p in enumerate(positions.tolist()):
        for j in range(d // 2):  # the pair (j, j + d/2) as one complex number, turned by p theta^(-2j/d)
            angle = p * theta ** (-2 * j / d)
            a, b = x[row, j], x[row, j + d // 2]
            expected[row, j] = a * math.cos(angle) - b * math.sin(angle)
            expected[row, j + d // 2] = a * math.sin(angle) + b * math.cos(angle)
    torch.testing.assert_close(ours, expected, atol=1e-5, rtol=0)  # float32 angles up to 30 radians


def test_rotary_scores_depend_on_the_distance_only(one_thread):
    torch.manual_seed(0)
    q, k = torch.randn(16), torch.randn(16)

    def score(i: int, j: int) -> float:
        cos, sin = rotary_tables(torch.tensor([i, j]), 16, 10000.0)
        return float(apply_rotary(q, cos[0], sin[0]) @ apply_rotary(k, cos[1], sin[1]))

    assert score(3, 1) == pytest.approx(score(12, 10), abs=1e-4)
    assert score(0, 5) == pytest.approx(score(20, 25), abs=1e-4)


def config(**overrides) -> TransformerConfig:
    values = dict(family="transformer", vocab_size=40, hidden_size=16, num_layers=3, num_heads=2,
                  intermediate_size=24, hidden_act="gelu", positions="rotary", rotary_theta=1000.0,
                  rotary_theta_local=20.0, attention_window=[4, None, 2], norm_bias=False,
                  first_attention_norm=False, embedding_norm=True, gated_ffn=True, bias=False, hidden_dropout=0.0,
                  attention_dropout=0.0, layer_norm_eps=1e-5, head_bias=False, pre_norm=True, final_norm=True,
                  type_vocab_size=0, pooler=False, global_projections=False)
    values.update(overrides)
    return TransformerConfig(**values)


def reference_stack(model: EncoderModel, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The stack in float64 with explicit [L, L] masks: rotary on q and k by each layer's base, a window of w
    tokens = |i - j| <= w / 2, pre-norm blocks, GeGLU (act on ffn_gate), no norm before layer 0's attention."""
    c = model.config
    enc = model.encoder
    x = model.embeddings.weight.double()[ids]
    x = F.layer_norm(x, (c.hidden_size,), enc.embedding_norm.weight.double(), None, c.layer_norm_eps)
    length = ids.shape[1]
    positions = torch.arange(length)
    distance = (positions[:, None] - positions[None, :]).abs()
    for index, block in enumerate(enc.layers):
        w = lambda m: m.weight.double()  # noqa: E731
        z = x if index == 0 else F.layer_norm(x, (c.hidden_size,), w(block.attn_norm), None, c.layer_norm_eps)
        q, k, v = (F.linear(z, w(m)).unflatten(-1, (c.num_heads, c.head_dim)).transpose(1, 2)
                   for m in (block.query, block.key, block.value))
        theta = c.rotary_theta_local if c.attention_window[index] is not None else c.rotary_theta
        inverse = theta ** (-torch.arange(0, c.head_dim, 2, dtype=torch.float64) / c.head_dim)
        angles = positions.double()[:, None] * inverse
        cos, sin = torch.cat([angles, angles], -1).cos(), torch.cat([angles, angles], -1).sin()

        def turn(t):
            half = t.shape[-1] // 2
            return t * cos + torch.cat([-t[..., half:], t[..., :half]], -1) * sin

        q, k = turn(q), turn(k)
        allowed = mask.bool()[:, None, None, :].expand(-1, 1, length, -1)
        if c.attention_window[index] is not None:
            allowed = allowed & (distance <= c.attention_window[index] // 2)
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(c.head_dim)
        a = scores.masked_fill(~allowed, -1e300).softmax(-1) @ v  # a padded query that sees nothing: finite
        x = x + F.linear(a.transpose(1, 2).flatten(2), w(block.attn_out))
        h = F.layer_norm(x, (c.hidden_size,), w(block.ffn_norm), None, c.layer_norm_eps)
        x = x + F.linear(F.gelu(F.linear(h, w(block.ffn_gate))) * F.linear(h, w(block.ffn_in)), w(block.ffn_out))
    return F.layer_norm(x, (c.hidden_size,), enc.final_norm.weight.double(), None, c.layer_norm_eps)


@pytest.mark.parametrize("windows", [[4, None, 2], [None, None, None], [2, 2, 2]])
def test_windows_and_rotary_bases_per_layer_match_float64(one_thread, windows):
    torch.manual_seed(0)
    model = EncoderModel(config(attention_window=windows)).eval()
    model.init_weights(torch.Generator().manual_seed(1))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(torch.randn_like(p) * 0.1)
    ids = torch.randint(0, 40, (3, 11))
    mask = torch.ones_like(ids)
    mask[1, 6:] = 0
    mask[2, 2:] = 0
    expected = reference_stack(model, ids, mask)
    real = mask.bool()
    with torch.no_grad():
        packed = model(ids, mask).last_hidden_state
        padded = model(ids, mask, packed=False).last_hidden_state
    torch.testing.assert_close(packed[real].double(), expected[real], atol=1e-5, rtol=0)
    torch.testing.assert_close(padded[real].double(), expected[real], atol=1e-5, rtol=0)
    assert torch.all(packed[~real] == 0)


def test_no_biases_and_no_first_attention_norm():
    model = EncoderModel(config(), [HeadSpec("mlm", "masked_lm")])
    names = set(dict(model.named_parameters()))
    assert "encoder.layers.0.attn_norm.weight" not in names
    assert isinstance(model.encoder.layers[0].attn_norm, torch.nn.Identity)
    assert "encoder.layers.1.attn_norm.weight" in names
    assert not [n for n in names if n.endswith(".bias") and n != "heads.mlm.bias"]
    biased = EncoderModel(config(norm_bias=True, head_bias=True), [HeadSpec("mlm", "masked_lm")])
    assert "encoder.layers.1.attn_norm.bias" in dict(biased.named_parameters())
    assert "heads.mlm.dense.bias" in dict(biased.named_parameters())


def test_prediction_heads_pool_the_first_token_or_the_mean(one_thread):
    torch.manual_seed(0)
    hidden = torch.randn(2, 5, 16)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
    inputs = HeadInputs(hidden=hidden, attention_mask=mask, word_embeddings=torch.randn(40, 16))
    for pooling in ("cls", "mean"):
        head = build_head(config(classifier_pooling=pooling), HeadSpec("classifier", "prediction_pooled", 3))
        head.eval()
        pooled = hidden[:, 0] if pooling == "cls" else (hidden * mask[..., None]).sum(1) / mask.sum(1, keepdim=True)
        expected = head.out(F.layer_norm(F.gelu(head.dense(pooled)), (16,), head.norm.weight, None, 1e-5))
        torch.testing.assert_close(head(inputs), expected)
        assert head.dense.bias is None and head.norm.bias is None
    token = build_head(config(), HeadSpec("qa", "prediction_token", 2)).eval()
    assert token(inputs).shape == (2, 5, 2)
    mlm = MaskedLMHead(config(), HeadSpec("mlm", "masked_lm"))
    assert mlm.dense.bias is None and mlm.norm.bias is None


@pytest.mark.parametrize("windows, message", [
    ([3, None, 2], "layer 0 is 3"),
    ([0, None, 2], "layer 0 is 0"),
    ([4, None, -2], "layer 2 is -2"),
    ([4, None], "2 windows for 3 layers"),
    ("4", "expected a number or one number"),
])
def test_bad_windows_name_the_key(windows, message):
    with pytest.raises(ConfigError, match=f"attention_window: .*{message}"):
        config(attention_window=windows)


def test_bad_rotary_and_norm_settings_name_the_key():
    with pytest.raises(ConfigError, match="rotary_theta: .*positions are 'learned'"):
        config(positions="learned")
    with pytest.raises(ConfigError, match="rotary_theta: expected a positive number"):
        config(rotary_theta=-1.0)
    with pytest.raises(ConfigError, match="rotary positions need an even head size"):
        config(rotary_theta=None, rotary_theta_local=None, hidden_size=18, num_heads=2, attention_head_size=9)
    with pytest.raises(ConfigError, match="first_attention_norm"):
        config(pre_norm=False)
    with pytest.raises(ConfigError, match="classifier_pooling"):
        config(classifier_pooling="max")


def test_a_causal_stack_takes_no_windows():
    from bertology.model.transformer import DecoderModel

    with pytest.raises(ConfigError, match="attention_window: windows are for bidirectional stacks"):
        DecoderModel(config())
