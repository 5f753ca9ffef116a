"""The attention context and its score providers: a provider that reads the queries (a content-to-position term,
as DeBERTa's) gives the same attention as its definition in float64 on the padded path and on every packed
kernel that carries a bias; `at` hands each layer call its own policy, cache, head scale, rotary tables and call
index."""

import pytest
import torch

from bertology.model import BIDIRECTIONAL, CAUSAL, Block, BlockSpec, KVCache, Layout, sliding_window
from bertology.model.attention import attention, packed_attention
from bertology.model.context import AttentionContext, RelativeScores
from bertology.model.positions import RelativePositionBias


@pytest.fixture(autouse=True)
def _seeded(one_thread):
    torch.manual_seed(0)


class ContentToPosition:
    """A toy content-to-position term: bias[n, h, i, j] = q[n, h, i] . P[h, clip(j - (offset + i), -K, K) + K] * s,
    one table P [heads, 2K + 1, d] a layer call."""

    def __init__(self, tables, reach, factor):
        self.tables, self.reach, self.factor = tables, reach, factor
        self.seen = []

    def bias(self, call, q, k, query_offset):
        self.seen.append((call, tuple(q.shape), tuple(k.shape), query_offset))
        table = self.tables[call].to(q.dtype)
        distance = (torch.arange(k.shape[-2])[None, :] - torch.arange(q.shape[-2])[:, None] - query_offset)
        index = distance.clamp(-self.reach, self.reach) + self.reach  # [L_q, L_k]
        by_bucket = q @ table.transpose(-1, -2)  # [N, heads, L_q, 2K + 1]
        return by_bucket.gather(-1, index.expand(*by_bucket.shape[:-2], -1, -1)) * self.factor


def definition(q, k, v, lengths, table, reach, factor, causal, offset=0):
    """Each sequence alone, in float64, by the formula: softmax(q k^T / sqrt(d) + c2p + mask) v."""
    outs = []
    for n, length in enumerate(lengths):
        qn, kn, vn = (t[n, :, :length].double() for t in (q, k, v))
        num_q = qn.shape[1] if offset else length
        qn = qn[:, :num_q]
        scores = qn @ kn.transpose(-1, -2) / qn.shape[-1] ** 0.5
        for i in range(num_q):
            for j in range(length):
                delta = max(-reach, min(reach, j - (offset + i)))
                scores[:, i, j] += (qn[:, i] * table.double()[:, delta + reach]).sum(-1) * factor
        if causal:
            allowed = torch.arange(length)[None, :] <= torch.arange(num_q)[:, None] + offset
            scores = scores.masked_fill(~allowed, float("-inf"))
        outs.append(scores.softmax(-1) @ vn)
    return outs


@pytest.mark.parametrize("policy", [BIDIRECTIONAL, CAUSAL])
def test_a_provider_of_the_queries_equals_its_definition_padded_and_packed(policy, monkeypatch):
    heads, dim, reach, factor = 2, 4, 3, 0.7
    lengths = [7, 3, 7, 1, 5, 0, 6]
    width = max(lengths)
    mask = (torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]).long()
    q, k, v = (torch.randn(len(lengths), heads, width, dim) for _ in range(3))
    table = torch.randn(heads, 2 * reach + 1, dim)
    expected = definition(q, k, v, lengths, table, reach, factor, policy.causal)

    def check(out_padded):  # [B, heads, L, d] against the definition at real tokens
        for n, length in enumerate(lengths):
            torch.testing.assert_close(out_padded[n, :, :length].double(), expected[n], atol=1e-5, rtol=1e-4)

    provider = ContentToPosition([table], reach, factor)
    out, _ = attention(q, k, v, AttentionContext(policy=policy, key_mask=mask.bool(), scores=provider))
    check(out)
    assert provider.seen == [(0, tuple(q.shape), tuple(k.shape), 0)]
    layout = Layout(mask)
    packed = [layout.pack(t.transpose(1, 2)) for t in (q, k, v)]
    for kernel, overhead in (("groups", 0), ("padded", 0), ("buckets", 0), ("buckets", 1e9)):
        monkeypatch.setattr("bertology.model.attention.BUCKET_OVERHEAD", overhead * heads)
        provider = ContentToPosition([table], reach, factor)
        out, _ = packed_attention(*packed, AttentionContext(layout=layout, policy=policy, scores=provider),
                                  kernel=kernel)
        check(layout.unpack(out).transpose(1, 2))
        assert provider.seen and all(offset == 0 for *_, offset in provider.seen)
    # in float64 the provider's path is the definition itself, to rounding
    provider = ContentToPosition([table.double()], reach, factor)
    out, _ = attention(*(t.double() for t in (q, k, v)),
                       AttentionContext(policy=policy, key_mask=mask.bool(), scores=provider))
    for n, length in enumerate(lengths):
        torch.testing.assert_close(out[n, :, :length], expected[n], atol=1e-12, rtol=1e-10)


def test_a_provider_sees_the_queries_at_the_end_of_a_cache():
    heads, dim, reach = 2, 4, 2
    q_all, k, v = (torch.randn(1, heads, 6, dim) for _ in range(3))
    table = torch.randn(heads, 2 * reach + 1, dim)
    provider = ContentToPosition([table], reach, 1.0)
    out, _ = attention(q_all[:, :, 4:], k, v, AttentionContext(policy=CAUSAL, scores=provider))
    assert provider.seen == [(0, (1, heads, 2, dim), (1, heads, 6, dim), 4)]
    expected = definition(q_all[:, :, 4:], k, v, [6], table, reach, 1.0, True, offset=4)[0]
    torch.testing.assert_close(out[0].double(), expected, atol=1e-5, rtol=1e-4)


def test_the_context_of_a_layer_call_holds_its_policy_cache_head_scale_and_call():
    spec = BlockSpec(hidden_size=8, num_heads=2, head_dim=4, intermediate_size=16, pre_norm=True)
    blocks = [Block(spec).eval() for _ in range(2)]
    x = torch.randn(2, 5, 8)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1] * 5])
    tables = [torch.randn(2, 5, 4), torch.randn(2, 5, 4)]
    provider = ContentToPosition(tables, 2, 0.5)
    policies = [CAUSAL, sliding_window(1)]
    caches = [KVCache(), KVCache()]
    scales = [None, torch.tensor([1.0, 0.0])]
    context = AttentionContext(key_mask=mask.bool(), scores=provider, policies=policies, caches=caches,
                               head_scales=scales, need_weights=True)
    views = [context.at(call) for call in range(2)]
    assert [v.call for v in views] == [0, 1] and [v.policy for v in views] == policies
    assert all(v.rotary is None for v in views)
    cos_sin = [(torch.ones(2, 5, 4), torch.zeros(2, 5, 4)), (torch.zeros(2, 5, 4), torch.ones(2, 5, 4))]
    rotated = AttentionContext(rotaries=[cos_sin[1], cos_sin[0]])
    assert rotated.at(0).rotary is cos_sin[1] and rotated.at(1).rotary is cos_sin[0]
    assert views[0].cache is caches[0] and views[1].cache is caches[1] and views[1].head_scale is scales[1]
    assert context.policy == BIDIRECTIONAL and context.cache is None  # the forward's context is not changed
    h = x
    for block, view in zip(blocks, views):
        h, probs = block(h, view)
        assert probs.shape == (2, 2, 5, 5)
    assert [call for call, *_ in provider.seen] == [0, 1]
    assert caches[0].length == 5 and caches[1].length == 5
    assert torch.all(probs[:, 1] == 0)  # the second call's head scale zeroes its second head
    # each call by hand: the same attention under that call's policy, bias and head scale alone
    h = x
    for call, block in enumerate(blocks):
        alone = AttentionContext(key_mask=mask.bool(), policy=policies[call], head_scale=scales[call],
                                 scores=ContentToPosition([tables[call]], 2, 0.5), call=0, need_weights=True)
        h, last = block(h, alone)
    torch.testing.assert_close(last, probs)


def test_packed_attention_needs_a_layout_and_relative_scores_cut_one_table():
    q = torch.randn(4, 2, 3)
    with pytest.raises(ValueError, match="layout"):
        packed_attention(q, q, q, AttentionContext())
    relative = RelativePositionBias(2, num_buckets=8, max_distance=16, bidirectional=True)
    scores = RelativeScores(relative, 6, 6)
    full = relative(6, 6)[None]
    corner = scores.bias(0, torch.zeros(1, 2, 4, 3), torch.zeros(1, 2, 4, 3), 0)
    assert torch.equal(corner, full[..., :4, :4])
    assert scores.bias(1, torch.zeros(1, 2, 4, 3), torch.zeros(1, 2, 4, 3), 0) is corner  # cut once a forward
    # outside the table (a longer request): computed afresh, the same function of the distance
    longer = scores.bias(0, torch.zeros(1, 2, 2, 3), torch.zeros(1, 2, 9, 3), 7)
    torch.testing.assert_close(longer, relative(2, 9, 7)[None])
