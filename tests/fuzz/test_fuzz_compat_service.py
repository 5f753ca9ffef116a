"""The OpenAI- and TEI-compatible routes fed random JSON and random bytes: every answer is a success or a 4xx in
the route's own error shape (OpenAI's `{"error": {"message", ...}}`, TEI's `{"error", "error_type"}`), never a 5xx."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient
from hypothesis import given, settings
from hypothesis import strategies as st

from fuzz_helpers import TRIED

EXAMPLES = 60  # requests per endpoint
OPENAI = ("/v1/embeddings",)
TEI = ("/embed", "/tokenize", "/predict", "/rerank")

TEXT = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=30) | st.sampled_from(
    ["the cat sat", "", "\u200b", "a " * 300])
SCALAR = st.none() | st.booleans() | st.integers(-2 ** 70, 2 ** 70) | st.floats(allow_nan=False, allow_infinity=False) | TEXT
ANY_JSON = st.recursive(SCALAR, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TEXT, inner, max_size=4),
                        max_leaves=12)
IDS = st.lists(st.integers(-3, 60), max_size=8)
FIELDS = {
    "input": TEXT | st.lists(TEXT, max_size=5) | IDS | st.lists(IDS, max_size=4) | ANY_JSON,
    "model": st.sampled_from(["fuzz", "other"]) | ANY_JSON,
    "encoding_format": st.sampled_from(["float", "base64", "int8"]) | ANY_JSON,
    "dimensions": st.integers(-2, 40) | ANY_JSON, "user": TEXT | ANY_JSON,
    "inputs": TEXT | st.lists(TEXT, max_size=5) | st.lists(st.lists(TEXT, max_size=3), max_size=3) | ANY_JSON,
    "normalize": st.booleans() | ANY_JSON, "truncate": st.booleans() | st.none() | ANY_JSON,
    "truncation_direction": st.sampled_from(["Left", "Right", "left", "up"]) | ANY_JSON,
    "prompt_name": st.none() | TEXT | ANY_JSON, "add_special_tokens": st.booleans() | ANY_JSON,
    "raw_scores": st.booleans() | ANY_JSON, "return_text": st.booleans() | ANY_JSON,
    "query": TEXT | ANY_JSON, "texts": st.lists(TEXT, max_size=5) | ANY_JSON,
}
REQUEST = st.fixed_dictionaries({}, optional=FIELDS) | ANY_JSON


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    import torch

    from bertology.model import EncoderModel, HeadSpec, Pretrained, preset
    from bertology.serve import create_app
    from bertology.tokenization import train_tokenizer

    root = tmp_path_factory.mktemp("fuzz-compat")
    tokenizer = train_tokenizer(iter(["the cat sat on the mat"] * 4), "wordpiece", 40, show_progress=False,
                                min_frequency=1)
    model = EncoderModel(preset("tiny", vocab_size=tokenizer.vocab_size, num_layers=1, hidden_size=8, num_heads=2,
                                intermediate_size=16, max_position_embeddings=64),
                         [HeadSpec("classifier", "pooled", num_labels=2)])
    model.init_weights(torch.Generator().manual_seed(0))
    Pretrained(model, tokenizer).save(root / "model")
    with TestClient(create_app(root / "model", model_name="fuzz", max_body_bytes=64 * 1024, max_tokens=2000,
                               max_values=20_000)) as c:
        yield c


def check(response, endpoint: str, name: str) -> None:
    TRIED[name] += 1
    assert response.status_code < 500, (response.status_code, response.text[:300])
    body = response.json()
    if response.status_code < 400:
        return
    if endpoint in OPENAI:
        error = body["error"]
        assert isinstance(error["message"], str) and error["message"] and error["type"] == "invalid_request_error"
    else:
        assert isinstance(body["error"], str) and body["error"] and isinstance(body["error_type"], str)


@pytest.mark.parametrize("endpoint", OPENAI + TEI)
def test_random_json_is_answered_in_the_api_shape(client, endpoint):
    @settings(max_examples=EXAMPLES, deadline=None)
    @given(body=REQUEST)
    def run(body):
        check(client.post(endpoint, json=body), endpoint, f"compat {endpoint} JSON")

    run()


def test_random_bytes_are_answered_in_the_api_shape(client):
    @settings(max_examples=EXAMPLES, deadline=None)
    @given(body=st.binary(max_size=300), endpoint=st.sampled_from(OPENAI + TEI))
    def run(body, endpoint):
        check(client.post(endpoint, content=body, headers={"content-type": "application/json"}), endpoint,
              "compat bytes")

    run()
