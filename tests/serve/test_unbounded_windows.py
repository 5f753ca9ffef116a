"""Serving models without a position limit: ELMo (an LSTM over words, read by its own word splitter) and T5
(relative positions). The default --max-batch-tokens is accepted, the service's windows are the budget's, and
/v1/embed gives what `bertology.embed` gives with that window; a budget that cannot hold a word is refused."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/framing_helpers.py, transformer_helpers.py

from framing_helpers import tokenizer  # noqa: E402
from transformer_helpers import tiny_config as transformer_config  # noqa: E402

from bertology import embed  # noqa: E402
from bertology.errors import ConfigError  # noqa: E402
from bertology.model import HeadSpec, Pretrained, load, save_model  # noqa: E402
from bertology.model.elmo import ElmoModel, tiny_config  # noqa: E402
from bertology.model.transformer import Seq2SeqModel  # noqa: E402
from bertology.tokenization.words import SPECIALS, WordVocabulary  # noqa: E402

fastapi = pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

from bertology.serve import create_app  # noqa: E402

TEXTS = ["the cat sat on the mat", "a dog ran in the park with the cat", "hello"]
LONG = " ".join(["the cat sat on the mat"] * 5)  # 30 words


@pytest.fixture(scope="module")
def elmo_dir(tmp_path_factory) -> Path:
    model = ElmoModel(tiny_config(projection_dim=8, cell_size=16))
    model.init_weights(torch.Generator().manual_seed(0))
    directory = tmp_path_factory.mktemp("elmo") / "elmo"
    save_model(model, directory)
    WordVocabulary([*SPECIALS, "the", "cat", "sat"]).save(directory)
    return directory


@pytest.fixture(scope="module")
def t5_dir(tmp_path_factory) -> Path:
    tok = tokenizer("t5")
    model = Seq2SeqModel(transformer_config(vocab_size=tok.vocab_size, positions="relative", norm="rmsnorm",
                                            bias=False, pad_token_id=tok.pad_id, eos_token_id=tok.token_to_id("</s>"),
                                            decoder_start_token_id=tok.pad_id), [HeadSpec("lm", "tied_lm")])
    model.init_weights(torch.Generator().manual_seed(1))
    directory = tmp_path_factory.mktemp("t5") / "t5"
    Pretrained(model.eval(), tok).save(directory)
    return directory


def assert_same(served: list, expected: np.ndarray) -> None:
    got = np.asarray(served, dtype=np.float64)
    # The same forward in float32; ELMo's random outputs are small (~1e-6), so the bound follows their scale.
    scale = float(np.abs(expected).max())
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5 * scale)


@pytest.mark.parametrize("which", ["elmo", "t5"])
def test_the_default_budget_is_the_window_and_embed_equals_the_api(which, elmo_dir, t5_dir):
    directory = elmo_dir if which == "elmo" else t5_dir
    pretrained = load(directory)
    with TestClient(create_app(directory, max_wait_ms=1)) as client:
        health = client.get("/health").json()
        assert health["window"] == 8192  # the default --max-batch-tokens, not 65,536 words or 2**30 positions
        response = client.post("/v1/embed", json={"texts": TEXTS, "level": "word"})
        assert response.status_code == 200, response.text
        words = response.json()["vectors"]
        sentences = client.post("/v1/embed", json={"texts": TEXTS}).json()["vectors"]
    expected = embed(pretrained, TEXTS, levels=("word", "sentence"), max_length=8192)
    for i, text in enumerate(TEXTS):
        assert_same(words[i], expected.words.vectors[expected.words.rows(i)])
    assert_same(sentences, expected.sentences)
    if which == "elmo":
        assert [len(w) for w in words] == [len(t.split()) for t in TEXTS]  # one vector a word


@pytest.mark.parametrize("which", ["elmo", "t5"])
def test_a_small_budget_windows_long_texts_as_embed_does(which, elmo_dir, t5_dir):
    directory = elmo_dir if which == "elmo" else t5_dir
    pretrained = load(directory)
    with TestClient(create_app(directory, max_wait_ms=1, max_batch_tokens=16)) as client:
        assert client.get("/health").json()["window"] == 16
        response = client.post("/v1/embed", json={"texts": [LONG], "level": "word"})
        assert response.status_code == 200, response.text
        body = response.json()
    expected = embed(pretrained, [LONG], levels=("word",), max_length=16)
    assert_same(body["vectors"][0], expected.words.vectors[expected.words.rows(0)])
    if which == "elmo":  # 30 words in windows of 14 (<S> and </S> around each) overlapping by half
        assert body["tokens"] > 30 + 2


def test_a_budget_without_room_for_a_word_is_refused(elmo_dir):
    with pytest.raises(ConfigError, match="max_batch_tokens must be an integer of at least"):
        create_app(elmo_dir, max_batch_tokens=2)  # <S> and </S> alone
    with pytest.raises(ConfigError, match="max_batch_tokens must be an integer, got 'x'"):
        create_app(elmo_dir, max_batch_tokens="x")


def test_elmo_fill_mask_is_a_clear_501(elmo_dir):
    with TestClient(create_app(elmo_dir, max_wait_ms=1)) as client:
        response = client.post("/v1/fill-mask", json={"texts": ["the <mask> sat"]})
    assert response.status_code == 501 and "has no masked-LM head" in response.json()["detail"]
