"""embed frames windows with the tokenizer's framing: GPT-2's adds nothing, XLNet's puts ``<sep> <cls>`` last (the
cls token in segment 2) and its summary token is the last position; hand-made expected ids and direct forwards."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from bertology.embeddings import embed
from bertology.embeddings.backbone import EncoderBackbone, Framed
from bertology.errors import ConfigError
from bertology.model import TransformerConfig, EncoderModel

from framing_helpers import tokenizer

TEXTS = ["the cat sat on the mat", "a dog ran", "hello world , again and again and again"]


def model_for(tok) -> EncoderModel:
    config = TransformerConfig(vocab_size=tok.vocab_size, hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64,
                           max_position_embeddings=64, type_vocab_size=3, pad_token_id=tok.framing.fill_id)
    model = EncoderModel(config)
    model.init_weights(torch.Generator().manual_seed(0))
    return model.eval()


def last_layer(model: EncoderModel, ids: list[int], type_ids: list[int]) -> np.ndarray:
    with torch.no_grad():
        out = model.encoder(torch.tensor([ids]), torch.ones(1, len(ids), dtype=torch.long), torch.tensor([type_ids]),
                            output_hidden_states=True)
    return out.hidden_states[-1][0].numpy()


@pytest.fixture(scope="module")
def gpt2():
    tok = tokenizer("gpt2")
    return tok, model_for(tok)


@pytest.fixture(scope="module")
def xlnet():
    tok = tokenizer("xlnet")
    return tok, model_for(tok)


def test_frames(gpt2, xlnet) -> None:
    tok, model = gpt2
    assert EncoderBackbone(model, tok).frame([7, 8]) == Framed([7, 8], 0, 2, summary=None, type_ids=None)
    assert EncoderBackbone(model, tok).frame([]) == Framed([], 0, 0, summary=None, type_ids=None)
    tok, model = xlnet
    sep, cls = tok.token_to_id("<sep>"), tok.token_to_id("<cls>")
    assert EncoderBackbone(model, tok).frame([7, 8]) == Framed([7, 8, sep, cls], 0, 2, summary=3,
                                                               type_ids=[0, 0, 0, 2])
    assert EncoderBackbone(model, tok).pad_id == tok.pad_id


def test_embed_without_specials(gpt2) -> None:
    tok, model = gpt2
    result = embed(model, TEXTS, tokenizer=tok)
    assert result.window_length == 64  # no specials: every position holds text
    with pytest.raises(ConfigError, match='sentence="cls": EncoderBackbone has no summary token'):
        embed(model, TEXTS, tokenizer=tok, sentence="cls")
    for i, text in enumerate(TEXTS):
        ids = tok.encode(text, add_special_tokens=False).ids
        expected = last_layer(model, ids, [0] * len(ids))
        assert result.tokens.ids[result.tokens.rows(i)].tolist() == ids
        np.testing.assert_allclose(result.tokens.vectors[result.tokens.rows(i)], expected, atol=1e-5)
        np.testing.assert_allclose(result.sentences[i], expected.mean(0), atol=1e-5)


def test_embed_with_the_summary_token_last(xlnet) -> None:
    tok, model = xlnet
    sep, cls = tok.token_to_id("<sep>"), tok.token_to_id("<cls>")
    result = embed(model, TEXTS, tokenizer=tok, sentence="cls")
    means = embed(model, TEXTS, tokenizer=tok).sentences
    for i, text in enumerate(TEXTS):
        content = tok.encode(text, add_special_tokens=False).ids
        ids = [*content, sep, cls]
        assert tok.encode(text).ids == ids  # the tokenizer frames a text the same way
        expected = last_layer(model, ids, [0] * (len(content) + 1) + [2])
        np.testing.assert_allclose(result.tokens.vectors[result.tokens.rows(i)], expected[:len(content)], atol=1e-5)
        np.testing.assert_allclose(result.sentences[i], expected[-1], atol=1e-5)
        np.testing.assert_allclose(means[i], expected.mean(0), atol=1e-5)


def test_windows_keep_the_summary_token_of_the_last_window(xlnet) -> None:
    tok, model = xlnet
    sep, cls = tok.token_to_id("<sep>"), tok.token_to_id("<cls>")
    text = TEXTS[2]
    content = tok.encode(text, add_special_tokens=False).ids
    assert len(content) > 6
    result = embed(model, [text], tokenizer=tok, sentence="cls", max_length=6, stride=2)
    # Windows of 4 content tokens; the last one ends at the text's end and brings the trailing <sep> <cls>.
    start = (len(content) - 4 + 1) // 2 * 2
    last = [*content[start:], sep, cls]
    expected = last_layer(model, last, [0] * (len(last) - 1) + [2])
    np.testing.assert_allclose(result.sentences[0], expected[-1], atol=1e-5)
