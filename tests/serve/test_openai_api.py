"""The OpenAI-compatible routes (`POST /v1/embeddings`, `GET /v1/models`) through FastAPI's TestClient and through
the real `openai` client (over an httpx transport into the same app): vectors equal `bertology.embed`'s, base64,
dimensions, usage, every bad field answered in OpenAI's error shape, the API key."""

from __future__ import annotations

import base64
import json
import shutil
import numpy as np
import pytest
from fastapi.testclient import TestClient

from bertology import embed
from bertology.model import load
from bertology.serve import create_app
from bertology.serve.metrics import metric_value

pytestmark = pytest.mark.usefixtures("one_thread")

KEY = "sk-test-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
LONG = " ".join(["the cat sat on the mat and a dog ran in the park"] * 12)  # ~150 tokens: 64-token windows
TEXTS = ["the cat sat on the mat .", "a dog ran in the park !", LONG, "good film"]


@pytest.fixture(scope="module")
def pretrained(tiny_dir):
    return load(tiny_dir)


@pytest.fixture(scope="module")
def client(tiny_dir):
    with TestClient(create_app(tiny_dir, model_name="tiny", max_wait_ms=2, api_key=KEY, max_texts=16,
                               max_tokens=2000)) as c:
        yield c


def post(client, body, **headers):
    return client.post("/v1/embeddings", json=body, headers={**AUTH, **headers})


def unit(rows) -> np.ndarray:
    rows = np.asarray(rows, dtype=np.float64)
    return rows / np.linalg.norm(rows, axis=1, keepdims=True)


def test_vectors_equal_embed_normalised_with_usage(client, pretrained):
    response = post(client, {"input": TEXTS, "model": "tiny"})
    assert response.status_code == 200, response.text
    body = response.json()
    expected = embed(pretrained, TEXTS, levels=("sentence",), normalize=True).sentences
    assert body["object"] == "list" and body["model"] == "tiny"
    assert [d["object"] for d in body["data"]] == ["embedding"] * len(TEXTS)
    assert [d["index"] for d in body["data"]] == list(range(len(TEXTS)))
    got = np.asarray([d["embedding"] for d in body["data"]])
    np.testing.assert_allclose(got, expected, atol=1e-6, rtol=0)
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1, atol=1e-6)
    # usage: the real tokens the texts cost, specials included
    one = post(client, {"input": "good film", "model": "tiny"}).json()
    assert one["usage"] == {"prompt_tokens": 2 + len(pretrained.tokenizer.encode("good film",
                                                                                 add_special_tokens=False).ids),
                            "total_tokens": one["usage"]["prompt_tokens"]}
    short = post(client, {"input": TEXTS[:2], "model": "tiny"}).json()
    assert short["usage"]["prompt_tokens"] == sum(
        len(pretrained.tokenizer.encode(t).ids) for t in TEXTS[:2])
    assert body["usage"]["prompt_tokens"] > short["usage"]["prompt_tokens"] + len(
        pretrained.tokenizer.encode(LONG).ids)  # the windows overlap: the long text costs more than its tokens


def test_base64_decodes_to_the_same_float32s(client):
    floats = post(client, {"input": TEXTS[:2], "model": "tiny"}).json()["data"]
    packed = post(client, {"input": TEXTS[:2], "model": "tiny", "encoding_format": "base64"}).json()["data"]
    for a, b in zip(floats, packed):
        decoded = np.frombuffer(base64.b64decode(b["embedding"]), dtype="<f4")
        assert decoded.tolist() == np.asarray(a["embedding"], dtype=np.float32).tolist()


def test_dimensions_truncate_then_renormalise(client, pretrained):
    full = np.asarray(post(client, {"input": TEXTS[:2], "model": "tiny"}).json()["data"][0]["embedding"])
    cut = post(client, {"input": TEXTS[:2], "model": "tiny", "dimensions": 8, "user": "someone"}).json()
    vector = np.asarray(cut["data"][0]["embedding"])
    assert vector.shape == (8,)
    np.testing.assert_allclose(vector, unit(full[None, :8])[0], atol=1e-6)
    assert post(client, {"input": "a", "model": "tiny", "dimensions": 32}).status_code == 200
    for bad in (33, 0, -1):
        response = post(client, {"input": "a", "model": "tiny", "dimensions": bad})
        assert response.status_code == 400
        error = response.json()["error"]
        assert error["param"] == "dimensions" and "dimensions" in error["message"]
        assert error["type"] == "invalid_request_error"


def test_token_id_inputs_equal_their_texts(client, pretrained):
    ids = [pretrained.tokenizer.encode(t, add_special_tokens=False).ids for t in TEXTS[:2]]
    by_ids = post(client, {"input": ids, "model": "tiny"}).json()
    by_text = post(client, {"input": TEXTS[:2], "model": "tiny"}).json()
    for a, b in zip(by_ids["data"], by_text["data"]):
        np.testing.assert_allclose(a["embedding"], b["embedding"], atol=1e-6, rtol=0)
    assert by_ids["usage"] == by_text["usage"]
    single = post(client, {"input": ids[0], "model": "tiny"}).json()  # one list of ids: one input
    assert len(single["data"]) == 1
    np.testing.assert_allclose(single["data"][0]["embedding"], by_text["data"][0]["embedding"], atol=1e-6)


@pytest.mark.parametrize("body,param,status,words", [
    ({"input": [], "model": "tiny"}, "input", 400, "empty"),
    ({"input": "", "model": "tiny"}, "input", 400, "empty"),
    ({"input": ["a", ""], "model": "tiny"}, "input[1]", 400, "empty"),
    ({"input": ["a", 3.5], "model": "tiny"}, "input[1]", 400, "expected"),
    ({"input": {"text": "a"}, "model": "tiny"}, "input", 400, "expected"),
    ({"input": [[1, 2], [10 ** 6]], "model": "tiny"}, "input[1][0]", 400, "token id"),
    ({"input": [[1, True]], "model": "tiny"}, "input[0][1]", 400, "token id"),
    ({"input": [[]], "model": "tiny"}, "input[0]", 400, "empty"),
    ({"input": "a"}, "model", 400, "model"),
    ({"input": "a", "model": "gpt-4"}, "model", 404, "gpt-4"),
    ({"input": "a", "model": "tiny", "encoding_format": "int8"}, "encoding_format", 400, "encoding_format"),
    ({"input": "a", "model": "tiny", "dimensions": "8"}, "dimensions", 400, "dimensions"),
    ({"input": "a", "model": "tiny", "user": 5}, "user", 400, "user"),
    ({"input": "a", "model": "tiny", "temperature": 1}, "temperature", 400, "unknown field"),
    ({"input": ["a"] * 17, "model": "tiny"}, "input", 413, "--max-texts"),
    ({"input": [LONG] * 10, "model": "tiny"}, "input", 413, "--max-tokens"),
    ({"input": "x" * 20_001, "model": "tiny"}, "input[0]", 413, "--max-chars"),
])
def test_bad_fields_are_answered_in_openai_shape(client, body, param, status, words):
    response = post(client, body)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["param"] == param and words in error["message"] and param.split("[")[0] in error["message"]
    assert error["type"] == "invalid_request_error"
    if status == 404:
        assert error["code"] == "model_not_found"


def test_token_ids_that_do_not_round_trip_are_refused(client, pretrained):
    tokenizer = pretrained.tokenizer
    # A word's continuation piece alone decodes to a text that encodes otherwise (as a word of its own).
    piece = next(i for i in range(tokenizer.vocab_size) if (tokenizer.id_to_token(i) or "").startswith("##")
                 and tokenizer.encode(tokenizer.decode([i]), add_special_tokens=False).ids != [i])
    ids = tokenizer.encode("good film", add_special_tokens=False).ids
    response = post(client, {"input": [ids, [piece]], "model": "tiny"})
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "input[1]" and "do not come back" in response.json()["error"][
        "message"]


def test_malformed_json_and_body_limit_in_openai_shape(tiny_dir):
    with TestClient(create_app(tiny_dir, model_name="tiny", max_body_bytes=200)) as c:
        response = c.post("/v1/embeddings", content=b'{"input": ', headers={"Content-Type": "application/json"})
        assert response.status_code == 400 and "malformed JSON" in response.json()["error"]["message"]
        response = c.post("/v1/embeddings", json={"input": "x" * 300, "model": "tiny"})
        assert response.status_code == 413 and "--max-body-bytes" in response.json()["error"]["message"]


def test_api_key_and_models(client):
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        for response in (client.post("/v1/embeddings", json={"input": "a", "model": "tiny"}, headers=headers),
                         client.get("/v1/models", headers=headers)):
            assert response.status_code == 401
            assert response.json()["error"]["code"] == "invalid_api_key"
    models = client.get("/v1/models", headers=AUTH).json()
    assert models["object"] == "list" and len(models["data"]) == 1
    card = models["data"][0]
    assert card["id"] == "tiny" and card["object"] == "model" and card["owned_by"] == "bertology"
    assert isinstance(card["created"], int) and card["created"] > 1_600_000_000
    assert client.get("/v1/models/tiny", headers=AUTH).json() == card
    assert client.get("/v1/models/other", headers=AUTH).status_code == 404


def test_openapi_schema_lists_the_routes(client):
    paths = client.get("/openapi.json").json()["paths"]
    assert {"/v1/embeddings", "/v1/models", "/v1/completions"} <= set(paths)


def test_sentence_transformers_directory_pools_and_truncates_as_embed(st_dir):
    st = load(st_dir)
    texts = ["the cat sat on the mat and a dog ran in the park", "good film"]  # the first over 12 tokens
    with TestClient(create_app(st_dir, model_name="st", max_wait_ms=2)) as c:
        body = c.post("/v1/embeddings", json={"input": texts, "model": "st"}).json()
    expected = embed(st, texts, levels=("sentence",)).sentences  # its CLS pooling, Normalize, 12 tokens
    np.testing.assert_allclose([d["embedding"] for d in body["data"]], expected, atol=1e-6, rtol=0)
    assert body["usage"]["prompt_tokens"] == 12 + len(st.tokenizer.encode(texts[1]).ids)
    windows = embed(st, texts, levels=("sentence",), long_texts="windows").sentences
    assert not np.allclose(windows[0], expected[0], atol=1e-3)  # the truncation is what made the difference


def test_the_openai_client_gets_the_same_vectors(client, pretrained):
    openai = pytest.importorskip("openai")
    transport = client  # TestClient is an httpx.Client into the app (its lifespan, batcher and all)
    api = openai.OpenAI(base_url="http://testserver/v1", api_key=KEY, http_client=transport, max_retries=0)
    expected = embed(pretrained, TEXTS, levels=("sentence",), normalize=True).sentences
    # The client asks for base64 unless told otherwise, and decodes it itself.
    result = api.embeddings.create(model="tiny", input=TEXTS)
    np.testing.assert_allclose([d.embedding for d in result.data], expected, atol=1e-6, rtol=0)
    assert result.usage.prompt_tokens == result.usage.total_tokens > 0
    floats = api.embeddings.create(model="tiny", input="good film", encoding_format="float", dimensions=4)
    np.testing.assert_allclose(floats.data[0].embedding, unit(expected[3:4, :4])[0], atol=1e-6)
    assert [m.id for m in api.models.list()] == ["tiny"]
    with pytest.raises(openai.NotFoundError) as error:
        api.embeddings.create(model="text-embedding-3-small", input="a")
    assert error.value.body["code"] == "model_not_found"
    with pytest.raises(openai.BadRequestError) as error:
        api.embeddings.create(model="tiny", input="a", dimensions=1000)
    assert error.value.body["param"] == "dimensions"
    bad_key = openai.OpenAI(base_url="http://testserver/v1", api_key="nope", http_client=transport, max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad_key.embeddings.create(model="tiny", input="a")


def test_metrics_count_the_compatible_routes_and_their_batches(tiny_dir):
    with TestClient(create_app(tiny_dir, model_name="tiny")) as c:
        assert c.post("/v1/embeddings", json={"input": "a cat", "model": "tiny"}).status_code == 200
        assert c.post("/v1/embeddings", json={"input": "a cat", "model": "x"}).status_code == 404
        assert c.post("/embed", json={"inputs": ["a cat", "a cat"]}).status_code == 200
        text = c.get("/metrics").text
    assert metric_value(text, "bertology_requests_total", {"endpoint": "/v1/embeddings", "status": 200}) == 1
    assert metric_value(text, "bertology_requests_total", {"endpoint": "/v1/embeddings", "status": 404}) == 1
    assert metric_value(text, "bertology_requests_total", {"endpoint": "/embed", "status": 200}) == 1
    assert metric_value(text, "bertology_batch_texts_sum") == 3  # both went through the batcher
    assert metric_value(text, "bertology_batch_tokens_sum") == 3 * 4  # [CLS] a cat [SEP]


def test_unsupported_sentence_transformers_modules_are_501_on_the_sentence_routes(st_dir, tmp_path):
    directory = tmp_path / "dense"
    shutil.copytree(st_dir, directory)
    modules = json.loads((directory / "modules.json").read_text())
    modules.append({"idx": 3, "name": "3", "path": "3_Dense", "type": "sentence_transformers.models.Dense"})
    (directory / "modules.json").write_text(json.dumps(modules))
    with TestClient(create_app(directory, model_name="dense")) as c:
        assert c.post("/v1/embed", json={"texts": ["a cat"]}).status_code == 200  # its own route still serves
        response = c.post("/v1/embeddings", json={"input": "a cat", "model": "dense"})
        assert response.status_code == 501 and "Dense" in response.json()["error"]["message"]
        assert response.json()["error"]["type"] == "server_error"
        response = c.post("/embed", json={"inputs": "a cat"})
        assert response.status_code == 501 and "Dense" in response.json()["error"]


@pytest.mark.slow
def test_the_openai_client_against_a_real_server(tiny_dir, pretrained, tmp_path):
    """The `openai` client over the network to a `bertology serve` process (uvicorn on a free loopback port)."""
    openai = pytest.importorskip("openai")
    from test_server import free_port, start_server

    key_file = tmp_path / "key.txt"
    key_file.write_text(KEY + "\n")
    port = free_port()
    process = start_server(tiny_dir, port, "--max-wait-ms", "2", "--api-key-file", str(key_file))
    try:
        api = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=KEY, max_retries=0, timeout=60)
        name = api.models.list().data[0].id
        result = api.embeddings.create(model=name, input=TEXTS)
        expected = embed(pretrained, TEXTS, levels=("sentence",), normalize=True).sentences
        np.testing.assert_allclose([d.embedding for d in result.data], expected, atol=1e-6, rtol=0)
        with pytest.raises(openai.NotFoundError):
            api.embeddings.create(model=name + "-other", input="a")
    finally:
        process.terminate()
        process.wait(timeout=60)
