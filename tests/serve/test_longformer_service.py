"""The service over a Longformer made from the tiny masked-LM model: a text longer than the short model's 64
positions is embedded in one window (its [CLS] global) with `bertology.embed`'s vectors, and fill-mask predicts
masks far apart in it as the library function does."""

from __future__ import annotations

import numpy as np
import pytest
from fastapi.testclient import TestClient

from bertology import embed
from bertology.cli.main import main
from bertology.model import LongformerModel, load
from bertology.objectives.fill_mask import fill_mask
from bertology.serve import create_app

LONG = " ".join(["the cat sat on the mat and a dog ran in the park"] * 12)  # ~150 tokens


@pytest.fixture(scope="module")
def long_dir(mlm_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("serve-longformer") / "long"
    assert main(["longformer", "convert", "--model", str(mlm_dir), "--max-length", "256", "--window", "8",
                 "--out", str(out)]) == 0
    return out


def test_a_longformer_embeds_a_long_text_in_one_window_and_fills_masks(long_dir):
    pretrained = load(long_dir)
    assert isinstance(pretrained.model, LongformerModel) and "mlm" in pretrained.model.heads
    count = len(pretrained.tokenizer.encode(LONG).ids)
    assert 64 < count <= 256
    words = LONG.split()
    words[3], words[-4] = "[MASK]", "[MASK]"  # more than the short model's 64 positions apart
    masked = " ".join(words)
    with TestClient(create_app(long_dir, max_wait_ms=2)) as c:
        health = c.get("/health").json()
        sentence = c.post("/v1/embed", json={"texts": [LONG, "a cat"]})
        tokens = c.post("/v1/embed", json={"texts": [LONG], "level": "token", "layers": [0, -1]})
        filled = c.post("/v1/fill-mask", json={"texts": [masked], "top_k": 3})
    assert health["window"] == 256 and health["fill_mask"] is True
    assert sentence.status_code == 200, sentence.text
    assert sentence.json()["tokens"] == count + 4  # one window of the long text, one of the short one
    expected = embed(pretrained, [LONG, "a cat"], levels=("sentence",))
    assert expected.window_length == 256
    np.testing.assert_allclose(np.asarray(sentence.json()["vectors"]), expected.sentences, atol=1e-5, rtol=0)
    assert tokens.status_code == 200, tokens.text
    vectors = embed(pretrained, [LONG], layers=[0, -1], levels=("token",)).tokens.vectors
    assert len(vectors) == count - 2
    np.testing.assert_allclose(np.asarray(tokens.json()["vectors"][0]), vectors, atol=1e-5, rtol=0)
    assert filled.status_code == 200, filled.text
    expected_fill = fill_mask(pretrained.model, pretrained.tokenizer, masked, top_k=3)
    got = filled.json()["results"][0]
    assert len(got) == 2
    assert [[x["token"] for x in mask] for mask in got] == [[p.token for p in mask] for mask in expected_fill]
    assert np.allclose([[x["probability"] for x in mask] for mask in got],
                       [[p.probability for p in mask] for mask in expected_fill], atol=1e-6)
