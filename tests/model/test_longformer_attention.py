"""Banded + global attention (Longformer's): the blocked kernel against attention by its definition, for random
shapes, windows, global tokens and padding, and its memory linear in the length."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from bertology.model import Layout, sliding_window
from bertology.model.attention import attention, packed_attention, windowed_attention
from bertology.model.context import AttentionContext


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(autouse=True)
def _seeded():
    torch.manual_seed(0)


def by_definition(q, k, v, left, right, real, flags, global_qkv=None, scale=None):
    """Query i of a local token sees the real keys i - left .. i + right and the real global keys; a global token's
    query (with global_qkv's projections when given) sees every real key. One query at a time, in float64 (returned
    in q's dtype): a bound then covers the rounding of the kernel under test alone, not that of two float32 paths."""
    dtype, (q, k, v) = q.dtype, (t.double() for t in (q, k, v))
    global_qkv = None if global_qkv is None else tuple(t.double() for t in global_qkv)
    batch, heads, length, d = q.shape
    scale = scale or d ** -0.5
    out = torch.zeros_like(q)
    for b in range(batch):
        for i in range(length):
            if flags[b, i]:
                qs, ks, vs = global_qkv or (q, k, v)
                keys = real[b].nonzero().flatten()
            else:
                qs, ks, vs = q, k, v
                j = torch.arange(length)
                keys = (real[b] & (((j >= i - left) & (j <= i + right)) | flags[b])).nonzero().flatten()
            if len(keys):
                scores = (qs[b, :, i, None] @ ks[b, :, keys].transpose(-1, -2)) * scale
                out[b, :, i] = (scores.softmax(-1) @ vs[b, :, keys]).squeeze(1)
    return out.to(dtype)


def random_case(generator: torch.Generator, length: int):
    batch = int(torch.randint(1, 4, (), generator=generator))
    real = torch.ones(batch, length, dtype=torch.bool)
    for b in range(batch):
        real[b, int(torch.randint(1, length + 1, (), generator=generator)):] = False
    flags = (torch.rand(batch, length, generator=generator) < 0.15) & real
    return real, flags


@pytest.mark.parametrize("seed", range(12))
def test_blocked_kernel_equals_the_definition(seed):
    generator = torch.Generator().manual_seed(seed)
    length = int(torch.randint(2, 40, (), generator=generator))
    left = int(torch.randint(0, 9, (), generator=generator))
    right = left if seed % 3 else int(torch.randint(0, 9, (), generator=generator))  # asymmetric too
    heads, d = 2, 4
    q, k, v = (torch.randn(3, heads, length, d, generator=generator) for _ in range(3))
    real, flags = random_case(generator, length)
    q, k, v = q[:len(real)], k[:len(real)], v[:len(real)]
    separate = tuple(torch.randn_like(q) for _ in range(3)) if seed % 2 else None
    block = [None, 1, 3, 16][seed % 4]
    got = windowed_attention(q, k, v, left, right, key_mask=real, global_tokens=flags, global_qkv=separate,
                             block=block)
    expected = by_definition(q, k, v, left, right, real, flags, separate)
    rows = real[:, None, :, None]
    torch.testing.assert_close(got * rows, expected * rows, atol=1e-6, rtol=1e-5)
    # the shared entry point: blocked for a window narrower than the sequence, the whole mask otherwise
    context = AttentionContext(policy=sliding_window(left, right), key_mask=real, global_tokens=flags)
    via, _ = attention(q, k, v, context, global_qkv=separate)
    torch.testing.assert_close(via * rows, expected * rows, atol=1e-6, rtol=1e-5)
    dense, probs = attention(q, k, v, AttentionContext(policy=sliding_window(left, right), key_mask=real,
                                                       global_tokens=flags, need_weights=True), global_qkv=separate)
    torch.testing.assert_close(dense * rows, expected * rows, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(probs.sum(-1) * real[:, None], real[:, None].expand_as(probs[..., 0]).float())


def test_no_global_tokens_and_no_padding():
    q, k, v = (torch.randn(2, 3, 50, 8) for _ in range(3))
    real, flags = torch.ones(2, 50, dtype=torch.bool), torch.zeros(2, 50, dtype=torch.bool)
    torch.testing.assert_close(windowed_attention(q, k, v, 4, 4), by_definition(q, k, v, 4, 4, real, flags),
                               atol=1e-6, rtol=1e-5)


def test_packed_groups_run_the_kernel_per_sequence():
    mask = torch.tensor([[1] * 30 + [0] * 10, [1] * 40, [1] * 30 + [0] * 10, [1] * 7 + [0] * 33])
    layout = Layout(mask)
    flags = torch.zeros(4, 40, dtype=torch.bool)
    flags[0, 0], flags[1, [3, 20]], flags[3, 6] = True, True, True
    q, k, v, gq, gk, gv = (torch.randn(4, 40, 2, 4) for _ in range(6))
    out, _ = packed_attention(*(layout.pack(t) for t in (q, k, v)),
                              AttentionContext(layout=layout, policy=sliding_window(3),
                                               global_tokens=layout.pack(flags)),
                              global_qkv=tuple(layout.pack(t) for t in (gq, gk, gv)))
    heads_first = [t.transpose(1, 2) for t in (q, k, v, gq, gk, gv)]
    expected = by_definition(*heads_first[:3], 3, 3, mask.bool(), flags, tuple(heads_first[3:]))
    torch.testing.assert_close(layout.unpack(out), expected.transpose(1, 2) * mask[:, :, None, None], atol=1e-6,
                               rtol=1e-5)


class LargestTensor(TorchDispatchMode):
    """Records the most elements of any tensor an operation returns."""

    def __init__(self) -> None:
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
        return out


@pytest.mark.parametrize("with_globals", [False, True])
def test_memory_grows_linearly_with_the_length(with_globals):
    largest = []
    for length in (1024, 4096):
        q, k, v = (torch.randn(1, 1, length, 8) for _ in range(3))
        flags = torch.zeros(1, length, dtype=torch.bool)
        if with_globals:
            flags[0, [0, 5, length // 2]] = True
        with LargestTensor() as mode:
            out, _ = attention(q, k, v, AttentionContext(policy=sliding_window(16), global_tokens=flags),
                               global_qkv=(q, k, v))
        assert out.shape == q.shape
        largest.append(mode.largest)
    assert largest[1] <= 4 * largest[0] + 64  # linear: 4x the length, 4x the largest tensor
    assert largest[1] < 4096 * 4096 / 20  # far from an [L, L] score matrix


@pytest.mark.parametrize("many", [False, True])
@pytest.mark.parametrize("dropout", [0.0, 0.3])
def test_global_projections_applied_where_needed_equal_the_projected_tensors(many, dropout):
    """GlobalProjections folds the key projection into the queries and the value projection after the
    probabilities when few tokens are global (heads x G < H), and projects every token otherwise: both give the
    attention of the projected tensors."""
    from bertology.model.attention import GlobalProjections, global_rows

    heads, d, hidden, length = 2, 4, 8, 30
    x = torch.randn(2, length, hidden)
    weights = tuple(torch.randn(heads * d, hidden) * 0.3 for _ in range(3))
    biases = tuple(torch.randn(heads * d) for _ in range(3))
    real = torch.ones(2, length, dtype=torch.bool)
    real[1, 20:] = False
    flags = torch.zeros(2, length, dtype=torch.bool)
    flags[0, [1, 7] + ([8, 9, 10, 11] if many else [])] = True  # 6 x 2 heads >= 8: projected; 2 x 2 < 8: folded
    flags[1, 3] = True
    projected = tuple(torch.nn.functional.linear(x, w, b).view(2, length, heads, d).transpose(1, 2)
                      for w, b in zip(weights, biases))
    out = torch.zeros(2, heads, length, d)
    torch.manual_seed(5)
    lazy, lazy_probs = global_rows(out, out.new_zeros(2, heads, length, length), GlobalProjections(x, heads, weights,
                                   biases), flags, real, None, dropout)
    torch.manual_seed(5)
    eager, eager_probs = global_rows(out, out.new_zeros(2, heads, length, length), projected, flags, real, None,
                                     dropout)
    torch.testing.assert_close(lazy, eager, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lazy_probs, eager_probs, atol=1e-6, rtol=1e-5)
    assert (lazy[:, :, flags[0]].abs().sum() > 0) and torch.equal(lazy[0, :, 0], out[0, :, 0])


def test_a_longformer_forward_makes_no_tensor_quadratic_in_the_length():
    from bertology.model import LongformerConfig, LongformerModel

    config = LongformerConfig(vocab_size=50, num_layers=2, hidden_size=8, num_heads=2, intermediate_size=16,
                              max_position_embeddings=4100, attention_window=32)
    model = LongformerModel(config, ()).eval()
    largest = []
    for length in (1024, 4096):
        ids = torch.randint(3, 50, (2, length))
        mask = torch.ones_like(ids)
        mask[1, length // 2:] = 0
        flags = torch.zeros_like(ids)
        flags[:, [0, 9]] = 1
        with torch.no_grad(), LargestTensor() as mode:
            model(ids, mask, global_attention_mask=flags)
        largest.append(mode.largest)
    assert largest[1] <= 4 * largest[0] + 64 and largest[1] < 4096 * 4096 / 20


def test_scatter_rows_leaves_the_rows_of_unused_slots():
    """Slots past a row's count hold index 0: they must not touch row 0, which may be a global token itself."""
    from bertology.model.attention import flagged_positions, scatter_rows

    t = torch.randn(2, 3, 6, 4)
    flags = torch.tensor([[1, 0, 1, 0, 1, 0], [1, 0, 0, 0, 0, 0]], dtype=torch.bool)
    index, valid = flagged_positions(flags)
    rows = torch.randn(2, 3, index.shape[1], 4)
    out = scatter_rows(t, index, valid, rows)
    expected = t.clone()
    expected[0, :, [0, 2, 4]] = rows[0]
    expected[1, :, 0] = rows[1, :, 0]
    assert torch.equal(out, expected)
