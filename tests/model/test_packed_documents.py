"""Packed documents: several documents in one row attend only within themselves and count their positions from 0,
so every document's outputs equal those of the document run alone."""

from __future__ import annotations

import pytest
import torch

from bertology.errors import InputError
from bertology.model import HeadSpec
from bertology.model.packing import Layout
from bertology.model.transformer import DecoderModel, TransformerConfig, position_ids_in_documents


@pytest.fixture(scope="module")
def decoder() -> DecoderModel:
    torch.manual_seed(0)
    config = TransformerConfig.decoder(family="gpt2", vocab_size=50, hidden_size=32, num_layers=2, num_heads=4,
                               intermediate_size=64, max_position_embeddings=32)
    model = DecoderModel(config, [HeadSpec("lm", "tied_lm")]).eval()
    model.init_weights(torch.Generator().manual_seed(0))
    return model


def test_each_run_of_a_row_is_a_sequence_of_the_layout():
    mask = torch.tensor([[1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 1, 1]])
    documents = torch.tensor([[0, 0, 1, 1, 1, 0], [4, 5, 5, 5, 7, 7]])
    layout = Layout(mask, documents)
    assert layout.num_tokens == 11 and not layout.full
    # lengths 2, 3 | 1, 3, 2 sorted: 1, 2, 2, 3, 3
    assert [(count, length) for _, count, length in layout.groups] == [(1, 1), (2, 2), (2, 3)]
    assert layout.cu_seqlens.tolist() == [0, 1, 3, 5, 8, 11]
    values = torch.randn(2, 6, 3)
    back = layout.unpack(layout.pack(values))
    assert torch.equal(back[mask.bool()], values[mask.bool()])
    # One document per row, no padding: the plain layout, a view.
    single = Layout(torch.ones(2, 4, dtype=torch.long), torch.zeros(2, 4, dtype=torch.long))
    assert single.full and single.groups == [(0, 2, 4)]


def test_positions_restart_at_every_document():
    documents = torch.tensor([[3, 3, 3, 8, 8, 9], [0, 0, 0, 0, 0, 0]])
    assert position_ids_in_documents(documents).tolist() == [[0, 1, 2, 0, 1, 0], [0, 1, 2, 3, 4, 5]]


def test_packed_documents_equal_each_document_alone(decoder):
    torch.manual_seed(1)
    lengths = [[5, 3, 4], [12], [2, 7]]
    width = 12
    ids = torch.zeros(3, width, dtype=torch.long)
    mask = torch.zeros(3, width, dtype=torch.long)
    documents = torch.zeros(3, width, dtype=torch.long)
    alone = []
    for row, parts in enumerate(lengths):
        column = 0
        for index, length in enumerate(parts):
            tokens = torch.randint(1, 50, (length,))
            ids[row, column:column + length] = tokens
            mask[row, column:column + length] = 1
            documents[row, column:column + length] = index
            alone.append((row, column, tokens))
            column += length
    with torch.no_grad():
        packed = decoder(ids, mask, documents=documents).logits
        for row, column, tokens in alone:
            expected = decoder(tokens[None]).logits[0]
            torch.testing.assert_close(packed[row, column:column + len(tokens)], expected, atol=1e-5, rtol=1e-5)
        # Without document ids the second document of row 0 sees the first: different outputs.
        crossing = decoder(ids, mask).logits
    assert not torch.allclose(crossing[0, 5:8], packed[0, 5:8], atol=1e-3)


def test_documents_need_the_packed_layout(decoder):
    ids = torch.ones(1, 4, dtype=torch.long)
    with pytest.raises(InputError, match="documents .* packed layout"):
        decoder(ids, documents=torch.zeros(1, 4, dtype=torch.long), packed=False)
    with pytest.raises(InputError, match="documents has shape"):
        Layout(torch.ones(1, 4), torch.zeros(1, 3, dtype=torch.long))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (the variable-length kernels)")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_packed_documents_on_the_gpu_kernels(decoder, dtype):
    """On CUDA the packed stream goes to the variable-length kernel (bf16) or the group loop (fp32, causal): each
    document's outputs still equal the document's alone."""
    from bertology.model.attention import CAUSAL, choose_kernel

    model = DecoderModel(decoder.config, decoder.head_specs).eval()
    model.load_state_dict(decoder.state_dict())
    model.cuda()
    torch.manual_seed(2)
    parts = [[5, 3, 4], [12], [2, 7, 1]]
    ids = torch.zeros(3, 12, dtype=torch.long)
    mask = torch.zeros_like(ids)
    documents = torch.zeros_like(ids)
    alone = []
    for row, lengths in enumerate(parts):
        column = 0
        for index, length in enumerate(lengths):
            tokens = torch.randint(1, 50, (length,))
            ids[row, column:column + length], mask[row, column:column + length] = tokens, 1
            documents[row, column:column + length] = index
            alone.append((row, column, tokens))
            column += length
    print("kernel:", choose_kernel(torch.device("cuda"), CAUSAL, 0.0, False, False, dtype))
    tolerance = 1e-4 if dtype == torch.float32 else 5e-2
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16, enabled=dtype == torch.bfloat16):
        packed = model(ids.cuda(), mask.cuda(), documents=documents.cuda()).logits.float()
        for row, column, tokens in alone:
            expected = model(tokens[None].cuda()).logits[0].float()
            torch.testing.assert_close(packed[row, column:column + len(tokens)], expected, atol=tolerance,
                                       rtol=tolerance)
