"""`/v1/fill-mask` on encoder-decoders: T5's sentinel spans and BART's <mask> texts, generated, equal to the library's
`fill_mask`; a decoder-only model is 501; bad fields are 422 naming the field, as on the other endpoints."""

from __future__ import annotations

import numpy as np
import pytest
from fastapi.testclient import TestClient

from bertology.model import load
from bertology.objectives.fill_mask import fill_mask
from bertology.serve import create_app
from finetune_helpers import save_family_model

pytest.importorskip("transformers")

TEXTS = ["the cat sat on the mat", "a dog ran in the park", "the old book by the window"] * 4


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """T5, BART and GPT-2 directories loaded, their tokenizers capped at 64 tokens (the service's window)."""
    out = {}
    for style in ("t5", "bart", "gpt2"):
        pretrained = load(save_family_model(tmp_path_factory.mktemp(style), style, TEXTS))
        pretrained.tokenizer.model_max_length = 64
        out[style] = pretrained
    return out


def candidates(groups):
    return [[(c["token"], c["sequence"]) for c in group] for group in groups]


@pytest.mark.parametrize("style, texts", [
    ("t5", ["the cat <extra_id_0> on the <extra_id_1>", "a <extra_id_0> ran"]),
    ("bart", ["the cat <mask> on the <mask>", "a dog <mask>"]),
])
def test_generated_fillings_equal_the_library_function(served, style, texts):
    pretrained = served[style]
    with TestClient(create_app(pretrained)) as client:
        body = client.post("/v1/fill-mask", json={"texts": texts, "top_k": 2, "max_new_tokens": 6}).json()
    for text, got in zip(texts, body["results"], strict=True):
        expected = fill_mask(pretrained.model, pretrained.tokenizer, text, top_k=2, max_new_tokens=6)
        assert candidates(got) == [[(p.token, p.sequence) for p in group] for group in expected]
        assert np.allclose([[c["probability"] for c in group] for group in got],
                           [[p.probability for p in group] for group in expected], atol=1e-6)
        assert all(c["token_id"] == -1 for group in got for c in group)  # a generated span has no one id
    # T5: a group per sentinel of the text; BART: one group, the whole generated text, however many masks.
    assert [len(groups) for groups in body["results"]] == ([2, 1] if style == "t5" else [1, 1])


def test_bad_requests_name_their_field(served):
    with TestClient(create_app(served["t5"], max_outputs=5)) as client:
        no_sentinel = client.post("/v1/fill-mask", json={"texts": ["the cat <extra_id_0>", "no sentinel here"]})
        zero = client.post("/v1/fill-mask", json={"texts": ["a <extra_id_0>"], "max_new_tokens": 0})
        text = client.post("/v1/fill-mask", json={"texts": ["a <extra_id_0>"], "max_new_tokens": "5"})
        too_many = client.post("/v1/fill-mask", json={"texts": ["a <extra_id_0> b <extra_id_1> c <extra_id_2>"],
                                                      "top_k": 2})
    assert no_sentinel.status_code == 422 and no_sentinel.json()["field"] == "texts[1]"
    assert "no sentinel token in the input" in no_sentinel.json()["detail"]
    for response in (zero, text):
        assert response.status_code == 422 and response.json()["field"] == "max_new_tokens", response.json()
    assert too_many.status_code == 413 and too_many.json()["field"] == "top_k"
    assert "3 masks x top_k 2" in too_many.json()["detail"]


def test_a_decoder_only_model_has_no_fill_mask(served):
    with TestClient(create_app(served["gpt2"])) as client:
        response = client.post("/v1/fill-mask", json={"texts": ["the cat"]})
        assert client.get("/health").json()["fill_mask"] is False
    assert response.status_code == 501 and "no masked-LM head" in response.json()["detail"]


def test_generation_work_per_request_is_bounded_as_embed_work_is(served, monkeypatch):
    import bertology.serve.app as app_module

    calls = []
    real = app_module.fill_mask
    monkeypatch.setattr(app_module, "fill_mask", lambda *a, **k: calls.append(a[2]) or real(*a, **k))
    with TestClient(create_app(served["t5"])) as client:  # the default bound: 4096 decoder steps a request
        huge = client.post("/v1/fill-mask", json={"texts": ["a <extra_id_0>"], "top_k": 100, "max_new_tokens": 512})
        assert huge.status_code == 413 and huge.json()["field"] == "max_new_tokens"
        assert huge.json()["detail"] == ("max_new_tokens: the generation asked for (1 texts x 700 beams (top_k 100: "
                                         "100 + 200 + 400, the searches for distinct fillings) x max_new_tokens "
                                         "512) is 358400; the limit is 4096 (--max-generated)")
        assert calls == []  # answered before any generation (it took 17 s to run)
        many = client.post("/v1/fill-mask", json={"texts": ["a <extra_id_0>"] * 6, "max_new_tokens": 20})
        assert many.status_code == 413 and "(6 texts x 35 beams" in many.json()["detail"]  # 6 x 35 x 20 = 4200
        within = client.post("/v1/fill-mask", json={"texts": ["a <extra_id_0>"] * 2, "top_k": 2,
                                                    "max_new_tokens": 4})  # 2 x 28 beams x 4 steps
        assert within.status_code == 200 and len(calls) == 2
    with TestClient(create_app(served["t5"], max_generated=223)) as client:
        assert client.post("/v1/fill-mask", json={"texts": ["a <extra_id_0>"] * 2, "top_k": 2,
                                                  "max_new_tokens": 4}).status_code == 413
    with TestClient(create_app(served["bart"], max_generated=31)) as client:  # BART's generated texts alike
        refused = client.post("/v1/fill-mask", json={"texts": ["a dog <mask>"], "top_k": 2, "max_new_tokens": 8})
        assert refused.status_code == 413 and refused.json()["field"] == "max_new_tokens"
