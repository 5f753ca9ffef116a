"""The shared transformer parts: attention's mask policies, packed kernels, positions, blocks, the key/value cache, and
decoders / encoder-decoders assembled from them, checked against hand-built masks and against transformers."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from transformer_helpers import gpt2_pair, t5_pair, tiny_config

from bertology.errors import ConfigError, InputError
from bertology.model import (
    BIDIRECTIONAL,
    CAUSAL,
    HeadSpec,
    Layout,
    MaskPolicy,
    register_head,
    sliding_window,
)
from bertology.model.attention import attention, choose_kernel, combined_mask, packed_attention
from bertology.model.context import AttentionContext, RelativeScores
from bertology.model.blocks import Block, BlockSpec
from bertology.model.positions import LearnedPositions, RelativePositionBias, SinusoidalPositions, relative_buckets
from bertology.model.transformer import DecoderModel, Seq2SeqModel


@pytest.fixture(autouse=True)
def _seeded():
    torch.manual_seed(0)
    torch.set_num_threads(1)


class Table:
    """A score provider from a fixed bias, whatever the queries and keys (the tests' tensor or function)."""

    def __init__(self, table):
        self.table = table

    def bias(self, call, q, k, query_offset):
        return self.table(q.shape[-2], k.shape[-2]) if callable(self.table) else self.table


def reference_attention(q, k, v, allowed, bias=None, scale=None):
    """Attention by the definition, one query at a time, with an explicit [B, Lq, Lk] mask; in float64, returned in
    q's dtype (a bound then covers the rounding of the kernel under test alone, not that of two float32 paths)."""
    dtype, (q, k, v) = q.dtype, (t.double() for t in (q, k, v))
    bias = None if bias is None else bias.double()
    batch, heads, num_q, d = q.shape
    out = torch.zeros_like(q)
    for b in range(batch):
        for i in range(num_q):
            keys = allowed[b, i].nonzero().flatten()
            if not len(keys):
                continue
            scores = (q[b, :, i, None] @ k[b, :, keys].transpose(-1, -2)).squeeze(1) * (scale or d ** -0.5)
            if bias is not None:
                scores = scores + bias[:, i, keys]
            out[b, :, i] = (scores.softmax(-1)[:, None] @ v[b, :, keys]).squeeze(1)
    return out.to(dtype)


def qkv(batch=2, heads=2, num_q=6, num_k=6, d=4):
    return torch.randn(batch, heads, num_q, d), torch.randn(batch, heads, num_k, d), torch.randn(batch, heads, num_k, d)


def test_policies_mask_the_positions_they_say():
    i, j = torch.arange(6)[:, None], torch.arange(6)[None, :]
    assert combined_mask(BIDIRECTIONAL, 6, 6, torch.device("cpu")) is None
    assert torch.equal(CAUSAL.allowed(6, 6, 0, torch.device("cpu")), j <= i)
    assert torch.equal(sliding_window(1).allowed(6, 6, 0, torch.device("cpu")), (j - i).abs() <= 1)
    assert torch.equal(MaskPolicy(causal=True, window=(2, 5)).allowed(6, 6, 0, torch.device("cpu")),
                       (j <= i) & (j >= i - 2))
    # queries at the end of longer keys (a cache of 3 positions): query 0 is position 3
    assert torch.equal(CAUSAL.allowed(2, 5, 3, torch.device("cpu")), torch.tensor([[1, 1, 1, 1, 0], [1] * 5]).bool())
    assert MaskPolicy(causal=True).bounds == (-1, 0) and sliding_window(3, 0).bounds == (3, 0)


@pytest.mark.parametrize("case", ["causal", "window", "documents", "global", "boolean", "key_mask", "bias"])
def test_attention_equals_the_definition(case):
    q, k, v = qkv()
    i, j = torch.arange(6)[:, None], torch.arange(6)[None, :]
    allowed = torch.ones(2, 6, 6, dtype=torch.bool)
    kwargs = {}
    bias = None
    if case == "causal":
        kwargs["policy"], allowed = CAUSAL, allowed & (j <= i)
    if case == "window":
        kwargs["policy"], allowed = sliding_window(1, 2), allowed & (j >= i - 1) & (j <= i + 2)
    if case == "documents":
        docs = torch.tensor([[0, 0, 0, 1, 1, 2], [0, 1, 1, 1, 1, 1]])
        kwargs["documents"], allowed = docs, docs[:, :, None] == docs[:, None, :]
    if case == "global":
        g = torch.tensor([[1, 0, 0, 0, 0, 0], [0, 0, 0, 1, 0, 0]]).bool()
        kwargs.update(policy=sliding_window(1), global_tokens=g)
        allowed = ((j - i).abs() <= 1) | g[:, :, None] | g[:, None, :]
    if case == "boolean":
        m = torch.rand(2, 6, 6) > 0.4
        m[:, :, 0] = True
        kwargs["mask"], allowed = m[:, None], m
    if case == "key_mask":
        km = torch.tensor([[1, 1, 1, 1, 0, 0], [1] * 6])
        kwargs.update(policy=CAUSAL, key_mask=km)
        allowed = (j <= i) & km[:, None, :].bool()
    if case == "bias":
        bias = torch.randn(2, 6, 6)
        kwargs.update(scores=Table(bias[None]))
    scale = 1.0 if case == "bias" else None
    out, probs = attention(q, k, v, AttentionContext(need_weights=True, **kwargs), scale=scale)
    expected = reference_attention(q, k, v, allowed, bias, scale)
    fast, _ = attention(q, k, v, AttentionContext(**kwargs), scale=scale)
    real = allowed.any(-1)[:, None, :, None]  # rows that see something (all here but for padding)
    torch.testing.assert_close(out * real, expected, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(fast * real, expected, atol=1e-6, rtol=1e-5)
    assert torch.all(probs.masked_fill(allowed[:, None], 0) == 0)


def test_a_query_that_sees_nothing_gives_no_nan():
    q, k, v = qkv(num_q=3, num_k=3)
    out, _ = attention(q, k, v, AttentionContext(policy=CAUSAL, key_mask=torch.tensor([[0, 1, 1], [1, 1, 1]])))
    assert torch.isfinite(out).all()


def test_keys_longer_than_queries_are_the_last_positions():
    q, k, v = qkv(num_q=2, num_k=5)
    full_q = torch.cat([torch.randn(2, 2, 3, 4), q], 2)
    out, _ = attention(q, k, v, AttentionContext(policy=CAUSAL))
    full, _ = attention(full_q, k, v, AttentionContext(policy=CAUSAL))
    torch.testing.assert_close(out, full[:, :, 3:])


@pytest.mark.parametrize("policy", [BIDIRECTIONAL, CAUSAL, sliding_window(2)])
def test_packed_groups_equal_padded_attention(policy):
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 0, 0, 0, 0]])
    layout = Layout(mask)
    q, k, v = (torch.randn(4, 5, 2, 3) for _ in range(3))
    relative = RelativePositionBias(2, num_buckets=8, max_distance=16, bidirectional=not policy.causal)
    out, _ = packed_attention(*(layout.pack(t) for t in (q, k, v)),
                              AttentionContext(layout=layout, policy=policy, scores=RelativeScores(relative, 5, 5)))
    padded, _ = attention(*(t.transpose(1, 2) for t in (q, k, v)),
                          AttentionContext(policy=policy, key_mask=mask, scores=Table(relative(5, 5)[None])))
    torch.testing.assert_close(layout.unpack(out), padded.transpose(1, 2) * mask[:, :, None, None], atol=1e-6,
                               rtol=1e-5)


def test_the_nested_kernel_equals_the_group_loop():
    mask = torch.tensor([[1, 1, 1, 0, 0, 0, 0, 0], [1] * 8, [1, 1, 1, 1, 1, 0, 0, 0]])
    layout = Layout(mask)
    q, k, v = (layout.pack(torch.randn(3, 8, 2, 8)) for _ in range(3))
    context = AttentionContext(layout=layout)
    groups, _ = packed_attention(q, k, v, context, kernel="groups")
    nested, _ = packed_attention(q, k, v, context, kernel="nested")
    torch.testing.assert_close(nested, groups, atol=1e-6, rtol=1e-5)
    with pytest.raises(ValueError, match="bidirectionally"):
        packed_attention(q, k, v, AttentionContext(layout=layout, policy=CAUSAL), kernel="nested")
    with pytest.raises(ValueError, match="unknown attention kernel"):
        packed_attention(q, k, v, context, kernel="flash9")


def test_flash_kernel_keeps_the_packed_shape_and_is_differentiable():
    """The CUDA flash kernel through its shape function (meta tensors): [T, heads, d] in and out, with a backward.
    Its numbers are checked on a GPU by benchmarks/gpu.py (``check_flash``)."""
    layout = Layout(torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]])).to(torch.device("meta"))
    q = torch.randn(7, 2, 8, device="meta", dtype=torch.bfloat16, requires_grad=True)
    for policy in (BIDIRECTIONAL, CAUSAL, sliding_window(2)):
        out, probs = packed_attention(q, q, q, AttentionContext(layout=layout, policy=policy), dropout=0.1,
                                      kernel="flash")
        assert out.shape == q.shape and out.dtype == q.dtype and probs == []
        assert out.grad_fn is not None


def test_kernel_choice_on_each_device(monkeypatch):
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    monkeypatch.setattr("bertology.model.attention.varlen_available", lambda: True)
    monkeypatch.setattr("bertology.model.attention.varlen_takes_windows", lambda: True)
    monkeypatch.setattr("bertology.model.attention.flash_available", lambda device: True)
    assert choose_kernel(cpu, BIDIRECTIONAL, 0.0, False, False) == "groups"
    assert choose_kernel(cuda, BIDIRECTIONAL, 0.0, False, False) == "varlen"
    assert choose_kernel(cuda, CAUSAL, 0.0, False, False) == "varlen"
    assert choose_kernel(cuda, BIDIRECTIONAL, 0.1, False, False) == "flash"  # dropout: the kernel that has it
    assert choose_kernel(cuda, CAUSAL, 0.1, False, False) == "flash"
    assert choose_kernel(cuda, BIDIRECTIONAL, 0.1, False, False, head_dim=72) == "flash"
    assert choose_kernel(cuda, BIDIRECTIONAL, 0.1, False, False, head_dim=60) == "nested"  # not a multiple of 8
    assert choose_kernel(cuda, BIDIRECTIONAL, 0.0, True, False) == "groups"  # probabilities asked for
    assert choose_kernel(cuda, BIDIRECTIONAL, 0.0, False, True) == "groups"  # a bias, prefix or head mask
    assert choose_kernel(cuda, CAUSAL, 0.1, False, True, bias_only=True) == "padded"  # T5's relative positions
    assert choose_kernel(cpu, CAUSAL, 0.1, False, True, bias_only=True) == "buckets"  # a few calls, not one per length
    assert choose_kernel(cpu, CAUSAL, 0.1, True, True, bias_only=True) == "groups"  # probabilities asked for
    assert choose_kernel(cuda, CAUSAL, 0.1, True, True, bias_only=True) == "groups"  # probabilities asked for
    assert choose_kernel(cuda, BIDIRECTIONAL, 0.0, False, False, torch.float32) == "nested"  # flash is half only
    assert choose_kernel(cuda, CAUSAL, 0.0, False, False, torch.float32) == "groups"
    monkeypatch.setattr("bertology.model.attention.varlen_takes_windows", lambda: False)  # the first varlen API
    assert choose_kernel(cuda, CAUSAL, 0.0, False, False) == "varlen"
    assert choose_kernel(cuda, sliding_window(4), 0.0, False, False) == "flash"
    assert choose_kernel(cuda, BIDIRECTIONAL, 0.0, False, False, torch.bfloat16, 1.0) == "flash"  # T5's scale
    monkeypatch.setattr("bertology.model.attention.flash_available", lambda device: False)  # before Ampere
    assert choose_kernel(cuda, BIDIRECTIONAL, 0.1, False, False) == "nested"
    assert choose_kernel(cuda, CAUSAL, 0.1, False, False) == "groups"
    assert choose_kernel(cuda, sliding_window(4), 0.0, False, False) == "groups"
    assert choose_kernel(cuda, BIDIRECTIONAL, 0.0, False, False, torch.bfloat16, 1.0) == "nested"
    monkeypatch.setattr("bertology.model.attention.varlen_available", lambda: False)
    assert choose_kernel(cuda, BIDIRECTIONAL, 0.0, False, False) == "nested"


def test_layout_keeps_sequence_boundaries_for_variable_length_kernels():
    mask = torch.tensor([[1, 1, 0], [0, 0, 0], [1, 1, 1], [0, 1, 1]])  # an empty row; left padding in the last
    layout = Layout(mask)
    assert layout.cu_seqlens.tolist() == [0, 2, 4, 7] and layout.max_seqlen == 3
    assert layout.cu_seqlens.dtype == torch.int32
    x = torch.arange(12).view(4, 3)
    assert layout.pack(x).tolist() == [0, 1, 10, 11, 6, 7, 8]
    assert torch.equal(layout.unpack(layout.pack(x)), x * mask)
    moved = layout.to("cpu")
    assert moved.groups == layout.groups and torch.equal(moved.flat_index, layout.flat_index)


def test_relative_buckets_equal_t5s():
    from transformers.models.t5.modeling_t5 import T5Attention

    relative = torch.arange(-300, 300)[None, :]
    for bidirectional in (True, False):
        for buckets, distance in ((32, 128), (8, 20)):
            expected = T5Attention._relative_position_bucket(relative, bidirectional, buckets, distance)
            assert torch.equal(relative_buckets(relative, bidirectional, buckets, distance), expected)


def test_absolute_positions():
    learned = LearnedPositions(10, 4, offset=2)
    assert learned.weight.shape == (12, 4)
    assert torch.equal(learned(torch.tensor([0, 3])), learned.weight[[2, 5]])
    table = SinusoidalPositions(50, 6)(torch.arange(50))
    assert torch.equal(table[0], torch.tensor([0.0, 0, 0, 1, 1, 1]))
    assert torch.allclose(table.norm(dim=1) ** 2, torch.full((50,), 3.0))


@pytest.mark.parametrize("pre_norm,norm,gated,bias", [(False, "layernorm", False, True), (True, "rmsnorm", True, False)])
def test_block_packed_equals_padded(pre_norm, norm, gated, bias):
    spec = BlockSpec(hidden_size=8, num_heads=2, head_dim=4, intermediate_size=16, norm=norm, pre_norm=pre_norm,
                     gated=gated, bias=bias, cross_attention=True)
    block = Block(spec).eval()
    assert (block.ffn_gate is not None) == gated and (block.query.bias is not None) == bias
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]])
    x, memory = torch.randn(2, 4, 8), torch.randn(2, 3, 8)
    memory_mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    layout = Layout(mask)
    padded, _ = block(x, AttentionContext(key_mask=mask.bool(), policy=CAUSAL, memory=memory,
                                          memory_mask=memory_mask))
    packed, _ = block(layout.pack(x), AttentionContext(layout=layout, policy=CAUSAL, memory=memory,
                                                       memory_mask=memory_mask))
    torch.testing.assert_close(layout.unpack(packed), padded * mask[..., None], atol=1e-6, rtol=1e-5)
    with pytest.raises(InputError, match="memory"):
        block(x, AttentionContext(key_mask=mask.bool()))


@pytest.mark.parametrize("overrides", [{}, dict(positions="relative", norm="rmsnorm", gated_ffn=True, bias=False,
                                                 attention_scale=1.0, final_norm=True, logit_scale=0.25)])
def test_decoder_cache_and_packing_give_the_full_forward(overrides):
    model = DecoderModel(tiny_config(**overrides), [HeadSpec("lm", "tied_lm")])
    model.init_weights(torch.Generator().manual_seed(1))
    model.eval()
    ids = torch.randint(1, 50, (2, 7))
    mask = torch.tensor([[0, 0, 1, 1, 1, 1, 1], [1] * 7])  # left padding, as for generation
    with torch.no_grad():
        full = model(ids, mask).logits
        padded = model(ids, mask, packed=False).logits
        torch.testing.assert_close(full, padded * mask[..., None], atol=1e-5, rtol=1e-5)
        step = model(ids[:, :4], mask[:, :4], use_cache=True)
        logits = [step.logits]
        for t in range(4, 7):
            step = model(ids[:, t:t + 1], mask[:, :t + 1], past_key_values=step.past_key_values, use_cache=True)
            logits.append(step.logits)
    incremental = torch.cat(logits, 1)
    torch.testing.assert_close(incremental * mask[..., None], full, atol=1e-5, rtol=1e-5)


def test_decoder_loss_and_logits_only_where_read():
    model = DecoderModel(tiny_config(), [HeadSpec("lm", "tied_lm")])
    ids = torch.randint(1, 50, (2, 6))
    out = model(ids, labels=ids)
    expected = F.cross_entropy(out.logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten())
    torch.testing.assert_close(out.loss, expected)
    at = torch.tensor([[0, 2], [1, 5]])
    picked = model(ids, masked_positions=at).logits
    torch.testing.assert_close(picked, out.logits[at[:, 0], at[:, 1]])
    with pytest.raises(InputError, match="must lie in"):
        model(torch.tensor([[1, 50]]))


def test_seq2seq_cache_equals_full_forward_and_labels_shift():
    config = tiny_config(num_decoder_layers=3, positions="relative", norm="rmsnorm", bias=False)
    model = Seq2SeqModel(config, [HeadSpec("lm", "tied_lm")])
    model.init_weights(torch.Generator().manual_seed(2))
    model.eval()
    assert len(model.decoder.layers) == 3 and len(model.blocks()) == 5
    src = torch.randint(1, 50, (2, 5))
    src_mask = torch.tensor([[1, 1, 1, 0, 0], [1] * 5])
    labels = torch.randint(1, 50, (2, 4))
    with torch.no_grad():
        out = model(src, src_mask, labels=labels)
        dec_in = torch.cat([torch.zeros(2, 1, dtype=torch.long), labels[:, :-1]], 1)
        same = model(src, src_mask, dec_in)
        torch.testing.assert_close(out.logits, same.logits)
        torch.testing.assert_close(out.loss, F.cross_entropy(out.logits.flatten(0, 1), labels.flatten()))
        memory = model.encode(src, src_mask)
        step = model(attention_mask=src_mask, decoder_input_ids=dec_in[:, :1], encoder_outputs=memory, use_cache=True)
        logits = [step.logits]
        for t in range(1, 4):
            step = model(attention_mask=src_mask, decoder_input_ids=dec_in[:, t:t + 1], encoder_outputs=memory,
                         past_key_values=step.past_key_values, use_cache=True)
            logits.append(step.logits)
    torch.testing.assert_close(torch.cat(logits, 1), out.logits, atol=1e-5, rtol=1e-5)


def test_gpt2_assembled_from_the_parts_equals_transformers():
    hf, ours = gpt2_pair()
    ids = torch.randint(0, 60, (3, 9))
    mask = torch.ones_like(ids)
    mask[0, 6:] = 0
    with torch.no_grad():
        expected = hf(ids, attention_mask=mask).logits
        got = ours(ids, mask).logits
    torch.testing.assert_close(got * mask[..., None], expected * mask[..., None], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("gated", [False, True])
def test_t5_assembled_from_the_parts_equals_transformers(gated):
    hf, ours = t5_pair(gated)
    src = torch.randint(1, 40, (2, 7))
    src_mask = torch.tensor([[1] * 5 + [0, 0], [1] * 7])
    labels = torch.randint(1, 40, (2, 5))
    with torch.no_grad():
        expected = hf(input_ids=src, attention_mask=src_mask, labels=labels)
        got = ours(src, src_mask, labels=labels)
    torch.testing.assert_close(got.logits, expected.logits, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got.loss, expected.loss, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("gated", [False, True])
def test_t5_training_gradients_on_padded_rows_equal_transformers(gated):
    """Rows of many lengths on both sides, in training mode (dropout 0): the packed path (the encoder's and
    decoder's attention per group or bucket of lengths, cross-attention projecting the memory's real tokens alone)
    gives transformers' loss and the gradient of every weight."""
    from transformer_helpers import t5_state_dict

    hf, ours = t5_pair(gated)
    hf.train(), ours.train()
    src_lengths, tgt_lengths = [9, 3, 9, 6, 1, 4, 6, 9], [2, 5, 1, 5, 3, 5, 4, 2]
    src = torch.randint(1, 40, (8, 9))
    src_mask = (torch.arange(9)[None, :] < torch.tensor(src_lengths)[:, None]).long()
    tgt_mask = (torch.arange(5)[None, :] < torch.tensor(tgt_lengths)[:, None]).long()
    labels = torch.randint(1, 40, (8, 5)).masked_fill(tgt_mask == 0, -100)
    decoder_ids = hf._shift_right(labels)
    expected = hf(input_ids=src, attention_mask=src_mask, decoder_input_ids=decoder_ids,
                  decoder_attention_mask=tgt_mask, labels=labels).loss
    got = ours(src, src_mask, decoder_ids, tgt_mask, labels=labels).loss
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    expected.backward(), got.backward()
    theirs = {p.data_ptr(): p for p in hf.parameters()}  # state_dict's tensors share their parameters' memory
    same = {name: theirs[tensor.data_ptr()] for name, tensor in t5_state_dict(hf).items()}
    for name, parameter in ours.named_parameters():
        torch.testing.assert_close(parameter.grad, same[name].grad, atol=1e-5, rtol=1e-4, msg=name)


@pytest.mark.parametrize("wrapped", [False, True])
def test_cross_attention_over_the_packed_memory_equals_the_padded_path(wrapped):
    """The packed path projects the memory's keys and values at its real tokens alone (one product on the fused
    weights, or each module when a wrapper replaced one): the same loss and gradients as the padded path."""
    _, ours = t5_pair(gated=False)
    if wrapped:
        for block in ours.decoder.layers:
            block.cross_key = torch.nn.Sequential(block.cross_key)  # no longer a plain nn.Linear
    src = torch.randint(1, 40, (4, 7))
    src_mask = (torch.arange(7)[None, :] < torch.tensor([7, 2, 5, 1])[:, None]).long()
    labels = torch.randint(1, 40, (4, 3))
    results = []
    for packed in (True, False):
        ours.zero_grad()
        loss = ours(src, src_mask, labels=labels, packed=packed).loss
        loss.backward()
        results.append((loss, *(p.grad.clone() for p in ours.parameters())))
    for got, want in zip(*results):
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)


def test_head_kinds_are_registered_not_hard_wired():
    with pytest.raises(ConfigError, match="unknown kind 'nope'.*register_head"):
        HeadSpec("x", "nope")

    class MaxPooled(torch.nn.Module):
        def __init__(self, config, spec):
            super().__init__()
            self.out = torch.nn.Linear(config.hidden_size, spec.num_labels)

        def forward(self, inputs):
            return self.out(inputs.hidden.masked_fill(~inputs.attention_mask.bool()[..., None], -1e4).max(1).values)

    register_head("test_max_pooled", MaxPooled)
    model = DecoderModel(tiny_config(), [HeadSpec("cls", "test_max_pooled", num_labels=3)])
    assert model(torch.randint(0, 50, (2, 4))).logits.shape == (2, 3)
    with pytest.raises(ConfigError, match="reads must be one of"):
        register_head("test_bad", MaxPooled, reads="sometimes")


def test_compiled_blocks_do_not_recompile_for_new_length_mixes():
    import torch._dynamo
    from torch._dynamo.utils import counters

    from bertology.model import EncoderModel, preset
    from bertology.model.blocks import compile_blocks

    torch._dynamo.reset()
    counters.clear()
    model = EncoderModel(preset("tiny", vocab_size=100, hidden_dropout=0.0, attention_dropout=0.0)).eval()
    batches = []
    for lengths in ([5, 9, 3], [7, 7], [12, 2, 4, 6], [1, 30], [16] * 4, [2, 3], [40, 1, 1]):
        width = max(lengths)
        ids = torch.randint(1, 100, (len(lengths), width))
        batches.append((ids, (torch.arange(width) < torch.tensor(lengths)[:, None]).long()))
    with torch.no_grad():
        expected = [model(ids, mask).last_hidden_state for ids, mask in batches]
        compile_blocks(model.blocks(), backend="eager")  # the backend does not matter to dynamo's guards
        for (ids, mask), want in zip(batches[:2], expected):
            torch.testing.assert_close(model(ids, mask).last_hidden_state, want)
        warm = counters["frames"]["total"]
        for (ids, mask), want in zip(batches[2:], expected[2:]):
            torch.testing.assert_close(model(ids, mask).last_hidden_state, want)
    assert counters["frames"]["total"] == warm  # five new mixes of lengths, no new compilation
    torch._dynamo.reset()


def test_embed_reads_a_decoder_and_an_encoder_decoder_through_the_protocol():
    from framing_helpers import tokenizer

    from bertology import embed

    gpt2 = tokenizer("gpt2")
    texts = ["the cat sat on the mat", "she read the old book"]
    for model in (DecoderModel(tiny_config(vocab_size=gpt2.vocab_size)),
                  Seq2SeqModel(tiny_config(vocab_size=gpt2.vocab_size, positions="relative"))):
        model.init_weights(torch.Generator().manual_seed(3))
        model.eval()
        vectors = embed(model, texts, tokenizer=gpt2, layers=[0, 1, 2], combine="concat")
        for row, text in enumerate(texts):
            ids = torch.tensor([gpt2.encode(text, add_special_tokens=False).ids])
            with torch.no_grad():
                states = model.layer_states(ids, torch.ones_like(ids))
            assert len(states) == model.config.num_layers + 1
            # a sentence vector is the mean of its tokens' vectors
            expected = torch.cat(states, -1)[0].mean(0)  # every hidden state side by side
            torch.testing.assert_close(torch.as_tensor(vectors.sentences[row]), expected, atol=1e-5, rtol=1e-5)


def test_encoder_only_features_say_so_for_other_models():
    from bertology.analysis.importance import existing_heads
    from bertology.objectives.distill import init_student
    from bertology.objectives.electra import Electra

    decoder = DecoderModel(tiny_config(), [HeadSpec("lm", "tied_lm")])
    with pytest.raises(ConfigError, match="head importance and pruning .* needs a model that takes a head mask "
                                          "\\(capability 'head-mask'\\); the model \\(DecoderModel"):
        existing_heads(decoder)
    with pytest.raises(ConfigError, match="ELECTRA .* needs a model that is a bidirectional encoder of the BERT "
                                          "family \\(capability 'encoder'\\); the model \\(DecoderModel, registered as "
                                          "'decoder'\\) does not declare it"):
        Electra().attach(decoder)
    with pytest.raises(ConfigError, match="distillation .* needs a model that is a bidirectional encoder of the "
                                          "BERT family \\(capability 'encoder'\\)"):
        init_student(decoder, [])


@pytest.mark.parametrize("style", ["gpt2", "t5"])
def test_a_native_decoder_and_encoder_decoder_load_with_their_tokenizers(tmp_path, style):
    import bertology
    from framing_helpers import tokenizer
    from bertology.model import Pretrained

    tok = tokenizer(style)
    model = (DecoderModel if style == "gpt2" else Seq2SeqModel)(tiny_config(vocab_size=tok.vocab_size),
                                                                [HeadSpec("lm", "tied_lm")])
    Pretrained(model, tok).save(tmp_path / "m")
    loaded = bertology.load(tmp_path / "m")
    assert type(loaded.model) is type(model) and loaded.tokenizer.style == style
    assert loaded.tokenizer.encode("the cat sat").ids == tok.encode("the cat sat").ids


def test_cache_grows_past_its_buffers_and_keeps_reordered_rows():
    """The cache writes each position into buffers doubled when full: decoding far past the first capacity, and
    reordering rows between steps (beam search), gives the full forward's logits."""
    model = DecoderModel(tiny_config(max_position_embeddings=200), [HeadSpec("lm", "tied_lm")])
    model.init_weights(torch.Generator().manual_seed(2))
    model.eval()
    ids = torch.randint(1, 50, (3, 150))
    with torch.no_grad():
        full = model(ids).logits
        step = model(ids[:, :5], use_cache=True)
        logits = [step.logits]
        for t in range(5, 150):  # 5 -> 74 -> 148 -> 300 positions of room: two regrowths
            step = model(ids[:, t:t + 1], past_key_values=step.past_key_values, use_cache=True)
            logits.append(step.logits)
        torch.testing.assert_close(torch.cat(logits, 1), full, atol=1e-5, rtol=1e-5)
        rows = torch.tensor([2, 0, 0])
        for cache in step.past_key_values:
            cache.reorder(rows)
        extra = torch.full((3, 1), 7)
        last = model(extra, past_key_values=step.past_key_values, use_cache=True).logits
        again = model(torch.cat([ids[rows], extra], 1)).logits[:, -1:]
        torch.testing.assert_close(last, again, atol=1e-5, rtol=1e-5)


def test_fused_projections_follow_weight_changes_in_inference():
    """Without gradients the concatenated q/k/v weights are reused; a changed weight, in place or swapped, and
    training mode are seen at once."""
    block = Block(BlockSpec(hidden_size=16, num_heads=2, head_dim=8, intermediate_size=32))
    block.eval()
    x = torch.randn(2, 5, 16)

    def separate() -> tuple[torch.Tensor, ...]:
        return block.query(x), block.key(x), block.value(x)

    with torch.no_grad():
        for got, want in zip(block.project(x), separate()):
            torch.testing.assert_close(got, want)
        block.key.weight.mul_(2.0)  # in place: the version changes
        for got, want in zip(block.project(x), separate()):
            torch.testing.assert_close(got, want)
        block.value.weight = torch.nn.Parameter(torch.randn_like(block.value.weight))  # swapped
        for got, want in zip(block.project(x), separate()):
            torch.testing.assert_close(got, want)
    block.train()
    assert "_fused_qkv" not in block.__dict__  # no stale copy while training


@pytest.mark.parametrize("policy", [BIDIRECTIONAL, CAUSAL])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_padded_and_bucket_kernels_with_a_bias_equal_the_group_loop(policy, seed, monkeypatch):
    """T5's relative-position bias: one dense call over the padded rows (GPU), or one per bucket of nearby lengths
    (CPU), the same outputs and gradients (bias included) as one call per group of lengths, on random lengths (some
    equal, some rows empty) and bucket sizes from one group a bucket to one bucket."""
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, 12, (9,), generator=generator)
    lengths[0] = 11  # a column of padding past the longest row too
    mask = (torch.arange(12)[None, :] < lengths[:, None]).long()
    layout = Layout(mask)
    relative = RelativePositionBias(2, 8, 16, bidirectional=not policy.causal)
    q, k, v = (torch.randn(int(lengths.sum()), 2, 4, requires_grad=True) for _ in range(3))
    results = {}
    for kernel, overhead in (("groups", 0), ("padded", 0), ("buckets", 0), ("buckets", 60), ("buckets", 300),
                             ("buckets", 1e9)):
        monkeypatch.setattr("bertology.model.attention.BUCKET_OVERHEAD", overhead * 2)  # per head: 2 heads
        context = AttentionContext(layout=layout, policy=policy, scores=RelativeScores(relative, 12, 12))
        out, _ = packed_attention(q, k, v, context, scale=1.0, kernel=kernel)
        grads = torch.autograd.grad((out * torch.linspace(-1, 1, out.numel()).view_as(out)).sum(),
                                    (q, k, v, relative.embedding.weight))
        results[kernel, overhead] = (out, *grads)
    assert len(layout.buckets(60)) < len(layout.groups) and len(layout.buckets(1e9)) == 1
    for kernel in ("padded", "buckets"):  # the policy alone, or packed documents: the kernels have no bias to carry
        with pytest.raises(ValueError, match=f"the {kernel} kernel is for a score bias"):
            packed_attention(q, k, v, AttentionContext(layout=layout, policy=policy), kernel=kernel)
    for key, got in results.items():
        for g, want in zip(got, results["groups", 0]):
            torch.testing.assert_close(g, want, atol=1e-5, rtol=1e-5, msg=str(key))


def test_buckets_merge_groups_while_widening_costs_less_than_a_call():
    lengths = torch.tensor([5, 2, 7, 5, 1, 9, 9, 3, 12])
    layout = Layout((torch.arange(13)[None, :] < lengths[:, None]).long())
    assert [(b.count, b.width) for b in layout.buckets(0)] == [(1, 1), (1, 2), (1, 3), (2, 5), (1, 7), (2, 9), (1, 12)]
    # 1 row widened 1 -> 2 costs 3 entries, 2 rows 2 -> 3 cost 10, 3 rows 3 -> 5 cost 48 > 30: a new bucket
    assert [(b.count, b.width) for b in layout.buckets(30)] == [(3, 3), (2, 5), (1, 7), (2, 9), (1, 12)]
    assert [(b.count, b.width) for b in layout.buckets(math.inf)] == [(9, 12)]
    merged = layout.buckets(30)[0]
    assert merged.real.tolist() == [[True, False, False], [True, True, False], [True, True, True]]
    assert merged.index.tolist() == [0, 3, 4, 6, 7, 8]
    assert layout.buckets(30) is layout.buckets(30)  # worked out once for every layer
