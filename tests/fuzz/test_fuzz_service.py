"""The service fed random JSON (any shape, on every POST endpoint), random bytes, and oversized or deeply nested
bodies: every answer is a success or a 4xx with a JSON `detail`, never a 5xx."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient
from hypothesis import given, settings
from hypothesis import strategies as st

from fuzz_helpers import TRIED

EXAMPLES = 80  # requests per strategy and endpoint (the suite's time budget: about 30 seconds in all)
ENDPOINTS = ("/v1/embed", "/v1/fill-mask", "/v1/search")

TEXT = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=30) | st.sampled_from(
    ["the [MASK] sat", "[MASK] " * 40, "", "\u200b", "a " * 300])
SCALAR = st.none() | st.booleans() | st.integers(-2 ** 70, 2 ** 70) | st.floats(allow_nan=False, allow_infinity=False) | TEXT
ANY_JSON = st.recursive(SCALAR, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TEXT, inner, max_size=4),
                        max_leaves=12)
FIELDS = {"texts": st.lists(TEXT, max_size=6) | ANY_JSON, "queries": st.lists(TEXT, max_size=6) | ANY_JSON,
          "level": st.sampled_from(["sentence", "word", "token", "x"]) | ANY_JSON,
          "layers": st.sampled_from(["last", "mean", "concat", "-1,0", "9", [0, -1], [99], 3, -7]) | ANY_JSON,
          "combine": st.sampled_from(["sum", "mean", "concat", None]) | ANY_JSON,
          "pooling": st.sampled_from(["first", "mean", "last"]) | ANY_JSON,
          "sentence": st.sampled_from(["mean", "cls"]) | ANY_JSON, "normalize": st.booleans() | ANY_JSON,
          "top_k": st.integers(-3, 200) | ANY_JSON, "k": st.integers(-3, 2000) | ANY_JSON}
REQUEST = st.fixed_dictionaries({}, optional=FIELDS) | ANY_JSON


@pytest.fixture(scope="module")
def client(mlm_index):
    from bertology.serve import create_app

    model_dir, index_dir = mlm_index
    with TestClient(create_app(model_dir, index=index_dir, max_body_bytes=64 * 1024, max_tokens=2000,
                               max_values=20_000, max_outputs=500)) as c:
        yield c


@pytest.fixture(scope="module")
def mlm_index(tmp_path_factory):
    pytest.importorskip("faiss")
    import torch

    from bertology.model import EncoderModel, HeadSpec, Pretrained, preset
    from bertology.retrieval import Index
    from bertology.tokenization import train_tokenizer

    root = tmp_path_factory.mktemp("fuzz-service")
    tokenizer = train_tokenizer(iter(["the cat sat on the mat"] * 4), "wordpiece", 40, show_progress=False,
                                min_frequency=1)
    model = EncoderModel(preset("tiny", vocab_size=tokenizer.vocab_size, num_layers=1, hidden_size=8, num_heads=2,
                                intermediate_size=16, max_position_embeddings=64), [HeadSpec("mlm", "masked_lm")])
    model.init_weights(torch.Generator().manual_seed(0))
    Pretrained(model, tokenizer).save(root / "model")
    Index.build(root / "model", [{"id": f"p{i}", "text": "the cat sat"} for i in range(5)]).save(root / "index")
    return root / "model", root / "index"


def check(response, name: str) -> None:
    TRIED[name] += 1
    assert response.status_code < 500, (response.status_code, response.text[:300])
    body = response.json()
    if response.status_code >= 400:
        assert isinstance(body.get("detail"), str) and body["detail"]


@pytest.mark.parametrize("endpoint", ENDPOINTS)
def test_random_json_is_answered_without_a_server_error(client, endpoint):
    @settings(max_examples=EXAMPLES)
    @given(body=REQUEST)
    def run(body):
        check(client.post(endpoint, json=body), f"service {endpoint} JSON")

    run()


def test_random_bytes_are_answered_without_a_server_error(client):
    @settings(max_examples=EXAMPLES)
    @given(body=st.binary(max_size=300), endpoint=st.sampled_from(ENDPOINTS))
    def run(body, endpoint):
        check(client.post(endpoint, content=body, headers={"content-type": "application/json"}),
              "service bytes")

    run()


@pytest.mark.parametrize("body", [
    "[" * 100_000 + "]" * 100_000,  # nesting deeper than any parser's recursion
    '{"texts": ' + "[" * 5000 + "]" * 5000 + "}",
    json.dumps({"texts": ["a"] * 40_000}),  # over --max-body-bytes
    json.dumps({"texts": ["the cat " * 3000]}),  # over --max-chars
    json.dumps({"texts": ["the cat sat"] * 250, "level": "token"}),  # over --max-tokens
    json.dumps({"texts": ["[MASK] " * 60] * 4, "top_k": 100}),  # over --max-outputs on fill-mask
    json.dumps({"texts": ["a"], "top_k": 10 ** 30}),
    json.dumps({"texts": ["a"], "layers": [10 ** 30]}),
    json.dumps({"texts": ["\ud800"]}).replace("\\\\", "\\"),
])
@pytest.mark.parametrize("endpoint", ENDPOINTS)
def test_oversized_and_deep_bodies_are_4xx(client, body, endpoint):
    check(client.post(endpoint, content=body.encode("utf-8", "surrogatepass"),
                      headers={"content-type": "application/json"}), "service oversized")
