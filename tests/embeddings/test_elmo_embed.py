"""embed on ELMo models: one vector per word from characters, the three layers mixed as asked, the model's word
vocabulary's splitting rule, and a saved model loaded by bertology.load."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import bertology
from bertology.embeddings import embed, word_vector
from bertology.embeddings.result import EmbeddingError
from bertology.model import HeadSpec, save_model
from bertology.model.elmo import ElmoModel, batch_to_ids, tiny_config
from bertology.tokenization.words import WordVocabulary

TEXTS = ["The cat sat on the mat.", "Zyxwv is not a word, but it has characters!", ""]


def elmo(vocab_size: int = 0) -> ElmoModel:
    torch.manual_seed(0)
    heads = [HeadSpec("lm", "tied_lm_bias")] if vocab_size else []
    model = ElmoModel(tiny_config(vocab_size=vocab_size, dropout=0.0, projection_dim=16, cell_size=32), heads)
    model.init_weights(torch.Generator().manual_seed(0))
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.normal_(0.0, 0.3, generator=torch.Generator().manual_seed(parameter.numel()))
    return model.eval()


def test_word_vectors_are_the_models_layers_at_each_word():
    model = elmo()
    result = embed(model, TEXTS, layers="mean", levels=("word", "token", "sentence"))
    words = [result.words.strings[a:b] for a, b in zip(result.words.bounds[:-1], result.words.bounds[1:])]
    assert words[0] == ["The", "cat", "sat", "on", "the", "mat", "."] and words[2] == []
    assert result.words.vectors.shape == (sum(map(len, words)), 32)
    for text, spelled in enumerate(words[:2]):
        chars, mask = batch_to_ids([spelled])  # <S> words </S>
        with torch.no_grad():
            states = model.layer_states(chars, mask)
        mean = torch.stack(states).mean(0)[0, 1:-1].numpy()
        rows = slice(result.words.bounds[text], result.words.bounds[text + 1])
        np.testing.assert_allclose(result.words.vectors[rows], mean, atol=1e-5)
    top = embed(model, TEXTS[:1], layers=-1, levels=("word",)).words.vectors
    first = embed(model, TEXTS[:1], layers=[1], levels=("word",)).words.vectors
    assert not np.allclose(top, first)
    cat = word_vector(model, TEXTS[0], "cat", layers=-1)
    np.testing.assert_allclose(cat, top[1], atol=1e-6)


def test_a_saved_model_embeds_with_its_vocabularys_rule(tmp_path):
    model = elmo(vocab_size=6)
    vocabulary = WordVocabulary(["<pad>", "<S>", "</S>", "<UNK>", "the", "cat"], lowercase=True)
    save_model(model, tmp_path / "elmo")
    vocabulary.save(tmp_path / "elmo")
    pretrained = bertology.load(tmp_path / "elmo")
    assert isinstance(pretrained.tokenizer, WordVocabulary) and pretrained.tokenizer.lowercase
    result = embed(pretrained, ["THE Cat"], layers="last", levels=("word",))
    assert result.words.strings == ["THE", "Cat"]  # spans of the text; the model read "the cat"
    lower = embed(model, ["the cat"], layers="last", levels=("word",))
    np.testing.assert_allclose(result.words.vectors, lower.words.vectors, atol=1e-6)
    with pytest.raises(EmbeddingError, match="splits its own words"):
        embed(bertology.model.checkpoint.Pretrained(model, object()), ["a"])


def test_the_analyses_layer_vectors_read_elmo_per_layer():
    from bertology.analysis.geometry import layer_vectors
    from bertology.model.checkpoint import Pretrained

    model = elmo()
    vectors = layer_vectors(Pretrained(model, None), ["The cat sat.", "Dogs run"], spans=[[(4, 7)], [(0, 4)]])
    assert vectors.layers == (0, 1, 2) and vectors.strings == ["cat", "Dogs"]
    chars, mask = batch_to_ids([["The", "cat", "sat", "."]])
    with torch.no_grad():
        states = model.layer_states(chars, mask)
    for layer in range(3):  # "cat" is word 2 after <S>
        np.testing.assert_allclose(vectors.vectors[layer][0], states[layer][0, 2].numpy(), atol=1e-5)


def test_a_word_without_utf8_bytes_is_named():
    from bertology.errors import InputError

    with pytest.raises(InputError, match=r"word '\\ud800'.* has no UTF-8 bytes"):
        embed(elmo(), ["fine \ud800 words"])


def test_layers_mix_is_the_models_scalar_mix():
    model = elmo()
    texts = ["The cat sat on the mat."]
    plain = embed(model, texts, layers="mix", levels=("word",)).words.vectors
    np.testing.assert_allclose(plain, embed(model, texts, layers="mean", levels=("word",)).words.vectors, atol=1e-6)
    mix = model.add_extension("mix", "scalar_mix")
    with torch.no_grad():
        mix.scalars.copy_(torch.tensor([1.0, -0.5, 0.25]))
        mix.gamma.fill_(2.0)
    mixed = embed(model, texts, layers="mix", levels=("word",)).words.vectors
    model_words = ["The", "cat", "sat", "on", "the", "mat", "."]
    chars, mask = batch_to_ids([model_words])
    with torch.no_grad():
        states = model.layer_states(chars, mask)
    weights = 2.0 * torch.tensor([1.0, -0.5, 0.25]).softmax(0)
    expected = sum(w * s for w, s in zip(weights, states))[0, 1:-1]
    assert len(model_words) == mixed.shape[0]
    np.testing.assert_allclose(mixed, expected.numpy(), atol=1e-5)
