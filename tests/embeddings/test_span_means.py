"""`Embeddings.span_means`: many character spans of a text at once, each the mean of its overlapping tokens."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from bertology.embeddings import EmbeddingError, embed
from bertology.model import EncoderModel, Pretrained, preset
from bertology.tokenization import train_tokenizer

TEXT = "the cats sat  on the mat"


@pytest.fixture(scope="module")
def result():
    words = "the cat cats sat on mat dog".split()
    tokenizer = train_tokenizer(iter([" ".join(words)] * 4), "wordpiece", 40, show_progress=False, min_frequency=1)
    config = preset("tiny", vocab_size=tokenizer.vocab_size, num_layers=2, hidden_size=32, num_heads=2,
                    intermediate_size=64, max_position_embeddings=64)
    model = EncoderModel(config)
    model.init_weights(torch.Generator().manual_seed(0))
    return embed(Pretrained(model.eval(), tokenizer), [TEXT], levels=("token",))


def test_each_span_is_the_mean_of_the_tokens_that_span_would_pool(result):
    spans = [(4, 8), (0, 8), (9, 12), (5, 6), (12, 14), (21, 24)]  # a word, two words, a piece of a word, spaces
    means, covered = result.span_means(0, np.array(spans))
    assert means.dtype == np.float32 and means.shape == (len(spans), result.dim)
    assert covered.tolist() == [True, True, True, True, False, True]
    for (start, end), vector, ok in zip(spans, means, covered):
        if ok:
            np.testing.assert_allclose(vector, result.span(0, start, end, pooling="mean"), rtol=0, atol=1e-6)
        else:  # only whitespace: no token, a zero row (span() refuses it)
            assert not vector.any()
            with pytest.raises(EmbeddingError, match="no token overlaps characters 12:14"):
                result.span(0, start, end)
    # by hand: "cats" is the mean of the tokens whose characters overlap 4:8
    rows = result.tokens.rows(0)
    hit = (result.tokens.start[rows] < 8) & (result.tokens.end[rows] > 4)
    expected = result.tokens.vectors[rows][hit].astype(np.float64).mean(0)
    np.testing.assert_allclose(means[0], expected, rtol=0, atol=1e-6)


def test_no_spans_and_a_bad_text_index(result):
    means, covered = result.span_means(0, np.zeros((0, 2), np.int64))
    assert means.shape == (0, result.dim) and covered.shape == (0,)
    with pytest.raises(EmbeddingError, match="text index 3 is out of range for 1 texts"):
        result.span_means(3, [(0, 3)])
