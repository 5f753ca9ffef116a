"""The packed layout: sequences sorted by length so each group of equal-length sequences is one contiguous slice.
Packed and padded computations must agree on batches with many distinct lengths, empty rows and no padding."""

from __future__ import annotations

import pytest
import torch

from bertology.model import TransformerConfig, EncoderModel
from bertology.model.encoder import Layout

TOL = 1e-5


def right_padded_mask(lengths: list[int], width: int | None = None) -> torch.Tensor:
    width = width or max(lengths)
    return (torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]).long()


@pytest.fixture(scope="module")
def model() -> EncoderModel:
    torch.manual_seed(0)
    config = TransformerConfig(vocab_size=64, hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64)
    model = EncoderModel(config).eval()
    model.init_weights(torch.Generator().manual_seed(0))
    return model


def test_groups_are_contiguous_runs_of_equal_length():
    lengths = [3, 9, 0, 3, 5, 9, 9, 1]
    mask = right_padded_mask(lengths)
    layout = Layout(mask)
    assert layout.num_tokens == sum(lengths)
    assert [(count, length) for _, count, length in layout.groups] == [(1, 1), (2, 3), (1, 5), (3, 9)]
    starts = [start for start, _, _ in layout.groups]
    assert starts == [0, 1, 7, 12]
    # every group's slice holds whole sequences, in order, each of the group's length
    for start, count, length in layout.groups:
        flat = layout.flat_index[start:start + count * length].view(count, length)
        rows, cols = flat // layout.seq_len, flat % layout.seq_len
        assert (rows == rows[:, :1]).all()
        assert torch.equal(cols, torch.arange(length).expand(count, length))
        assert all(lengths[r] == length for r in rows[:, 0].tolist())
    # pack then unpack is the identity at real tokens and zero at padding
    values = torch.randn(len(lengths), mask.shape[1], 2)
    back = layout.unpack(layout.pack(values))
    assert torch.equal(back[mask.bool()], values[mask.bool()])
    assert back[~mask.bool()].abs().max() == 0


def test_unpadded_batch_packs_as_a_view():
    mask = torch.ones(3, 6, dtype=torch.long)
    layout = Layout(mask)
    assert layout.full and layout.groups == [(0, 3, 6)]
    values = torch.randn(3, 6, 4)
    packed = layout.pack(values)
    assert packed.data_ptr() == values.data_ptr()
    assert layout.unpack(packed).data_ptr() == values.data_ptr()


@pytest.mark.parametrize("lengths", [[17, 2, 9, 17, 0, 5, 9, 1, 30, 4], [6, 6, 6], [1], [12, 0, 0]])
def test_packed_matches_padded(model, lengths):
    torch.manual_seed(1)
    mask = right_padded_mask(lengths)
    ids = torch.randint(1, 64, mask.shape).masked_fill(mask == 0, 0)
    types = torch.randint(0, 2, mask.shape) * mask
    real = mask.bool()
    with torch.no_grad():
        a = model(ids, mask, types, output_hidden_states=True, output_attentions=True, packed=True)
        b = model(ids, mask, types, output_hidden_states=True, output_attentions=True, packed=False)
    for x, y in zip(a.hidden_states, b.hidden_states):
        assert (x[real] - y[real]).abs().max() <= TOL
        assert x[~real].abs().sum() == 0
    pair = real[:, None, :, None] & real[:, None, None, :]  # (query, key) both real
    for x, y in zip(a.attentions, b.attentions):
        assert (x - y).masked_fill(~pair, 0).abs().max() <= TOL
        assert x.masked_fill(pair, 0).abs().sum() == 0
    nonempty = real.any(1)
    assert (a.pooler_output[nonempty] - b.pooler_output[nonempty]).abs().max() <= TOL


def test_batch_without_real_tokens(model):
    mask = torch.zeros(2, 4, dtype=torch.long)
    with torch.no_grad():
        out = model(torch.zeros_like(mask), mask)
    assert out.last_hidden_state.shape == (2, 4, 32)
    assert out.last_hidden_state.abs().sum() == 0


def test_all_padding_rows_give_zeros_and_zero_attention():
    from bertology.model import TransformerConfig, EncoderModel

    model = EncoderModel(TransformerConfig(vocab_size=50, hidden_size=16, num_layers=2, num_heads=2,
                                       intermediate_size=20)).eval()
    ids, mask = torch.tensor([[2, 3, 4], [0, 0, 0]]), torch.tensor([[1, 1, 1], [0, 0, 0]])
    with torch.no_grad():
        out = model(ids, mask, output_attentions=True)
        empty = model(ids[1:], mask[1:], output_attentions=True)
    assert out.last_hidden_state[1].abs().max() == 0
    assert out.attentions[0][1].abs().max() == 0
    assert torch.allclose(out.attentions[0][0].sum(-1), torch.ones(2, 3))
    assert empty.attentions[0].abs().max() == 0 and empty.last_hidden_state.abs().max() == 0


def test_inputs_that_do_not_fit_the_model_are_named():
    from bertology.errors import InputError
    from bertology.model import TransformerConfig, EncoderModel

    model = EncoderModel(TransformerConfig(vocab_size=50, hidden_size=16, num_layers=1, num_heads=2,
                                       intermediate_size=20, max_position_embeddings=8)).eval()
    with pytest.raises(InputError, match="a sequence of 9 tokens is longer than the model's 8 positions"):
        model(torch.ones(1, 9, dtype=torch.long))
    with pytest.raises(InputError, match=r"token ids must lie in \[0, 50\), got \[1, 50\]"):
        model(torch.tensor([[1, 50]]))
    with pytest.raises(InputError, match=r"input_ids must be \[batch, length\]"):
        model(torch.tensor([1, 2]))
    roberta = EncoderModel(TransformerConfig(family="roberta", vocab_size=50, hidden_size=16, num_layers=1, num_heads=2,
                                         intermediate_size=20, max_position_embeddings=10, pad_token_id=1,
                                         positions_after_padding=True)).eval()
    assert roberta.encoder.max_length == 8
    roberta(torch.full((1, 8), 5))
    with pytest.raises(InputError, match="longer than the model's 8 positions"):
        roberta(torch.full((1, 9), 5))


@pytest.mark.parametrize("family", ["bert", "albert"])
def test_pruned_last_layer_gives_the_same_logits_and_gradients(family):
    from bertology.model import TransformerConfig, EncoderModel, HeadSpec

    extra = {"embedding_size": 8, "num_layer_groups": 1} if family == "albert" else {}
    config = TransformerConfig(family=family, vocab_size=60, hidden_size=32, num_layers=3, num_heads=4,
                           intermediate_size=40, hidden_dropout=0.0, attention_dropout=0.0, **extra)
    model = EncoderModel(config, [HeadSpec("mlm", "masked_lm"), HeadSpec("nsp", "pooled")])
    model.init_weights(torch.Generator().manual_seed(1))
    ids = torch.randint(5, 60, (4, 12), generator=torch.Generator().manual_seed(2))
    mask = torch.ones_like(ids)
    mask[1, 7:] = 0
    mask[3, 3:] = 0
    positions = torch.tensor([[0, 3], [1, 2], [1, 6], [2, 11], [3, 1], [0, 5], [0, 3]])  # repeats are allowed
    grads = []
    nothing_else = torch.empty(0, 2, dtype=torch.long)  # the caller reads only what the heads read
    for pruned in (False, True):
        model.zero_grad()
        out = model(ids, mask, masked_positions=positions, last_layer_at=nothing_else if pruned else None)
        (out.head_logits["mlm"].logsumexp(-1).sum() + out.head_logits["nsp"].square().sum()).backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
        if pruned:
            assert (out.head_logits["mlm"] - full["mlm"]).abs().max() <= 1e-5
            assert (out.head_logits["nsp"] - full["nsp"]).abs().max() <= 1e-5
            assert out.last_hidden_state[2, 5].abs().max() == 0  # not computed where no head reads
        else:
            full = {k: v.detach() for k, v in out.head_logits.items()}
    for name, grad in grads[0].items():
        assert (grads[1][name] - grad).abs().max() <= 1e-5, name


def test_last_layer_at_is_ignored_when_a_head_reads_every_token():
    from bertology.model import TransformerConfig, EncoderModel, HeadSpec

    model = EncoderModel(TransformerConfig(vocab_size=60, hidden_size=32, num_layers=2, num_heads=4,
                                       intermediate_size=40), [HeadSpec("mlm", "masked_lm"), HeadSpec("tags", "token")])
    model.eval()
    ids = torch.randint(5, 60, (2, 6), generator=torch.Generator().manual_seed(3))
    positions = torch.tensor([[0, 1], [1, 4]])
    with torch.no_grad():
        a = model(ids, masked_positions=positions)
        b = model(ids, masked_positions=positions, last_layer_at=torch.empty(0, 2, dtype=torch.long))
    assert torch.equal(a.head_logits["tags"], b.head_logits["tags"])
