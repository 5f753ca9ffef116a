"""XLNet's packed path in buckets: rows padded to a few widths, both streams in one joint stream, the query stream at
each bucket's targets (the slots past them one shared row). Whatever the buckets (one per length, the default plan,
one for all), the outputs at every slot (empty ones included), the loss and every gradient equal the padded path's
(which tests/model/test_xlnet.py checks against transformers), in eval and in training mode, with segments and with
a prefix; with dropout drawn, padding changes nothing; `plan_buckets` finds the cheapest split."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from bertology.model import xlnet as X
from bertology.model.context import AttentionContext
from bertology.model.heads import HeadSpec
from bertology.peft.prefix import apply_prefix

pytestmark = pytest.mark.usefixtures("one_thread")

VOCAB, LENGTH, SLOTS = 40, 12, 4
PLANS = {"per-length": 0.0, "default": X.BUCKET_OVERHEAD_FLOPS, "one": math.inf}


def build(dropout: float = 0.0, prefix: bool = False) -> X.XLNetModel:
    config = X.XLNetConfig(vocab_size=VOCAB, hidden_size=16, num_layers=2, num_heads=2, intermediate_size=24,
                           hidden_dropout=dropout, pad_token_id=0, mem_len=None)
    model = X.XLNetModel(config, [HeadSpec("lm", "tied_lm_bias")])
    model.init_weights(torch.Generator().manual_seed(0))
    with torch.no_grad():  # relative terms large enough to matter
        for layer in model.layers:
            for p in (layer.content_bias, layer.position_bias, layer.segment_bias, layer.segment_embeddings):
                p.normal_(0.0, 0.5, generator=torch.Generator().manual_seed(1))
    if prefix:
        apply_prefix(model, length=3)
    return model


def batch(seed: int, rows: int = 9, one_segment: bool = False) -> dict[str, torch.Tensor]:
    """Left-padded rows of random lengths (1 to LENGTH), two segments, a random perm_mask (each row's first real
    token visible to all), up to SLOTS targets per row on real tokens in random slots, some slots empty."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, LENGTH + 1, (rows,), generator=g)
    lengths[0] = LENGTH
    ids = torch.randint(1, VOCAB, (rows, LENGTH), generator=g)
    mask = (torch.arange(LENGTH) >= LENGTH - lengths[:, None]).long()
    types = (torch.rand(rows, LENGTH, generator=g) < 0.3).long() * (not one_segment)
    perm = (torch.rand(rows, LENGTH, LENGTH, generator=g) < 0.5).float()
    mapping = torch.zeros(rows, SLOTS, LENGTH)
    for row, n in enumerate(lengths.tolist()):
        perm[row, :, LENGTH - n] = 0
        count = int(torch.randint(0, min(SLOTS, n) + 1, (1,), generator=g))
        positions = LENGTH - n + torch.randperm(n, generator=g)[:count]
        slots = torch.randperm(SLOTS, generator=g)[:count]
        mapping[row, slots, positions] = 1
    labels = (mapping @ ids[..., None].float()).squeeze(-1).long().masked_fill(mapping.sum(-1) == 0, -100)
    return dict(input_ids=ids.masked_fill(mask == 0, 0), attention_mask=mask, token_type_ids=types, perm_mask=perm,
                target_mapping=mapping, labels=labels)


def run(model: X.XLNetModel, inputs: dict[str, torch.Tensor], packed: bool) -> tuple[torch.Tensor, ...]:
    model.zero_grad()
    out = model(**inputs, use_mems=not packed)  # a memory kept: the padded path
    out.loss.backward()
    return (out.logits.detach(), out.loss.detach(), *(p.grad.clone() for p in model.parameters() if p.requires_grad))


@pytest.fixture
def no_noise(monkeypatch):
    """Training mode's code paths (each row's own distances, the explicit attention product) without random
    draws: every dropout is the identity."""
    import bertology.model.attention
    import bertology.model.blocks

    for module in (X, bertology.model.attention, bertology.model.blocks):
        monkeypatch.setattr(module, "fast_dropout", lambda x, p, training: x)


@pytest.mark.parametrize("plan", list(PLANS))
@pytest.mark.parametrize("mode", ["eval", "train", "prefix", "prefix, one segment"])
def test_every_bucket_plan_equals_the_padded_path(monkeypatch, no_noise, plan, mode):
    model = build(dropout=0.1 if mode == "train" else 0.0, prefix=mode.startswith("prefix"))
    model.train(mode == "train")
    monkeypatch.setattr(X, "BUCKET_OVERHEAD_FLOPS", PLANS[plan])
    for seed in range(3):
        inputs = batch(seed, one_segment=mode.endswith("one segment"))
        layout = model.layout(inputs["attention_mask"], 0, False, False)
        assert layout is not None
        buckets = model.packed(layout, inputs["perm_mask"], inputs["token_type_ids"], inputs["target_mapping"],
                               torch.float32).buckets
        if plan == "one":
            assert len(buckets) == 1
        elif plan == "per-length":
            assert len(buckets) == len(layout.groups)
        padded, packed = run(model, inputs, False), run(model, inputs, True)
        for theirs, ours in zip(padded, packed, strict=True):
            torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("prefix", [False, True])
def test_relative_attention_equals_its_definition(prefix):
    """Content rows and targets (distance columns), segments and masks, with and without a prefix (whose keys take
    no position or segment term), through the shared attention with the layer's mask and score provider (the
    second layer's parameters, looked up by the call):
    score(i, j) = [(q_i + u) k_j + (q_i + v) r_{i - j} + (q_i + s) e_{seg_ij}] / sqrt(d)."""
    model = build(prefix=prefix).eval()
    layer = model.layers[1]
    with torch.no_grad():  # the first layer's terms differ: the provider must read the call's own
        for p in (model.layers[0].content_bias, model.layers[0].position_bias, model.layers[0].segment_bias):
            p.add_(1.0)
    torch.manual_seed(3)
    batch_size, heads, keys, targets, dim = 2, 2, 5, 3, 8
    q = torch.randn(batch_size, heads, keys + targets, dim)
    k, v = torch.randn(batch_size, heads, keys, dim), torch.randn(batch_size, heads, keys, dim)
    encoded = torch.randn(batch_size, 2 * keys, 16)  # encoded distances keys .. -keys + 1
    segments = torch.rand(batch_size, keys + targets, keys) < 0.4
    allowed = torch.rand(batch_size, keys + targets, keys) < 0.7
    allowed[..., 0] = True
    at = torch.randint(0, keys, (batch_size, targets))  # the targets' positions
    position = torch.cat([torch.arange(keys).expand(batch_size, -1), at], 1)  # every row's position
    columns = keys - at[:, :, None] + torch.arange(keys)
    with torch.no_grad():
        scores = X.XLNetScores(model.layers, encoded, columns[:, None], segments)
        got = layer.streams_attention(q, k, v, allowed[:, None], None, scores, AttentionContext(call=1))[0]
        only_targets = layer.streams_attention(q[:, :, keys:], k, v, allowed[:, None], None, scores,
                                               AttentionContext(call=1))[0]
        r = layer.heads_first(layer.position(encoded))
        distance = position[:, :, None] - torch.arange(keys)  # [B, Q, K]
        r_at = r[torch.arange(batch_size)[:, None, None, None], torch.arange(heads)[None, :, None, None],
                 (keys - distance)[:, None]]  # [B, heads, Q, K, d]
        e = layer.segment_embeddings[segments.long()]  # [B, Q, K, heads, d]
        scores = ((q + layer.content_bias[:, None]) @ k.transpose(-1, -2)
                  + torch.einsum("bhqd,bhqkd->bhqk", q + layer.position_bias[:, None], r_at)
                  + torch.einsum("bhqd,bqkhd->bhqk", q + layer.segment_bias[:, None], e)) / math.sqrt(dim)
        scores = scores.masked_fill(~allowed[:, None], -math.inf)
        values = v
        if prefix:
            prefix_keys, prefix_values = layer.prefix_states()
            first = (q + layer.content_bias[:, None]) @ prefix_keys.transpose(-1, -2) / math.sqrt(dim)
            scores = torch.cat([first, scores], -1)
            values = torch.cat([prefix_values.expand(batch_size, -1, -1, -1), v], -2)
        expected = scores.softmax(-1) @ values
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(only_targets, expected[:, :, keys:], atol=1e-5, rtol=1e-5)


def test_with_dropout_padding_changes_nothing():
    """Dropout drawn (the same seed twice): other ids at the padding positions give the same loss and gradients,
    all finite."""
    model = build(dropout=0.1).train()
    inputs = batch(5)
    results = []
    for pad in (0, 7):
        torch.manual_seed(1)
        changed = dict(inputs, input_ids=inputs["input_ids"].masked_fill(inputs["attention_mask"] == 0, pad))
        results.append(run(model, changed, True))
    for first, second in zip(*results, strict=True):
        assert torch.isfinite(first).all()
        assert torch.equal(first, second)


def test_query_stream_alone_equals_the_content_stream_run_too():
    """The last layer's content stream is skipped when only the query stream is read: the same slots as when the
    hidden states ask for it."""
    model = build().eval()
    inputs = batch(7)
    with torch.no_grad():
        alone = model(**inputs, use_mems=False).last_hidden_state
        with_states = model(**inputs, use_mems=False, output_hidden_states=True)
    torch.testing.assert_close(alone, with_states.last_hidden_state, atol=1e-6, rtol=1e-6)
    assert len(with_states.hidden_states) == 3


@pytest.mark.parametrize("seed", range(5))
def test_plan_buckets_is_the_cheapest_split(seed):
    g = torch.Generator().manual_seed(seed)
    lengths = sorted(torch.randperm(60, generator=g)[:7].add(1).tolist())
    groups = [(int(c), n) for c, n in zip(torch.randint(1, 5, (7,), generator=g), lengths, strict=True)]

    def row_cost(n: int) -> float:
        return n * n + 30.0 * n

    def cost(runs):
        return sum(1000 + sum(c for c, _ in groups[i:j]) * row_cost(groups[j - 1][1]) for i, j in runs)

    best = math.inf
    for cuts in itertools.product([False, True], repeat=len(groups) - 1):
        edges = [0] + [i + 1 for i, cut in enumerate(cuts) if cut] + [len(groups)]
        best = min(best, cost(list(itertools.pairwise(edges))))
    runs = X.plan_buckets(groups, row_cost, overhead=1000)
    assert [i for i, _ in runs][0] == 0 and runs[-1][1] == len(groups)
    assert all(a[1] == b[0] for a, b in itertools.pairwise(runs))
    assert cost(runs) == pytest.approx(best)
