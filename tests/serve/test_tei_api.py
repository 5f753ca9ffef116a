"""The text-embeddings-inference-compatible routes (`/embed`, `/tokenize`, `/info`, `/predict`, `/rerank`) through
FastAPI's TestClient: vectors equal `bertology.embed`'s, predictions and rerank scores equal the text-classification
pipeline's logits turned into scores, every bad field answered in TEI's error shape, 501 without the head."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from fastapi.testclient import TestClient

from bertology import embed
from bertology.model import EncoderModel, HeadSpec, Pretrained, load
from bertology.pipelines import pipeline
from bertology.serve import create_app

pytestmark = pytest.mark.usefixtures("one_thread")

KEY = "tei-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
LONG = " ".join(["the cat sat on the mat and a dog ran in the park"] * 12)  # ~150 tokens, over the 64 positions
TEXTS = ["the cat sat on the mat .", "a dog ran in the park !", "good film"]


def classifier_dir(tiny_dir, directory, labels: int, id2label: dict | None = None):
    base = load(tiny_dir)
    config = base.model.config
    if id2label is not None:
        config.extra = {**(config.extra or {}), "id2label": id2label}
    model = EncoderModel(config, [HeadSpec("classifier", "pooled", num_labels=labels)])
    model.init_weights(torch.Generator().manual_seed(3))
    Pretrained(model, base.tokenizer).save(directory)
    return directory


@pytest.fixture(scope="module")
def pretrained(tiny_dir):
    return load(tiny_dir)


@pytest.fixture(scope="module")
def client(tiny_dir):
    with TestClient(create_app(tiny_dir, model_name="tiny", max_wait_ms=2, api_key=KEY, max_texts=16)) as c:
        yield c


@pytest.fixture(scope="module")
def sentiment(tiny_dir, tmp_path_factory):
    directory = classifier_dir(tiny_dir, tmp_path_factory.mktemp("cls") / "sentiment", 3,
                               {"0": "negative", "1": "neutral", "2": "positive"})
    with TestClient(create_app(directory, model_name="sentiment", max_wait_ms=2)) as c:
        yield c, load(directory)


@pytest.fixture(scope="module", params=[1, 2])
def reranker(request, tiny_dir, tmp_path_factory):
    directory = classifier_dir(tiny_dir, tmp_path_factory.mktemp("rerank") / f"cross-{request.param}",
                               request.param)
    with TestClient(create_app(directory, model_name="cross", max_wait_ms=2)) as c:
        yield c, load(directory)


def tei_error(response, status: int, words: str) -> dict:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error", "error_type"} and words in body["error"], body
    return body


def test_embed_equals_embed_normalised_or_not(client, pretrained):
    vectors = client.post("/embed", json={"inputs": TEXTS}, headers=AUTH).json()
    expected = embed(pretrained, TEXTS, levels=("sentence",), normalize=True).sentences
    np.testing.assert_allclose(vectors, expected, atol=1e-6, rtol=0)
    raw = client.post("/embed", json={"inputs": TEXTS[0], "normalize": False}, headers=AUTH).json()
    np.testing.assert_allclose(raw, embed(pretrained, TEXTS[:1], levels=("sentence",)).sentences, atol=1e-5,
                               rtol=0)


def test_embed_long_text_is_413_unless_truncated(client, pretrained):
    body = tei_error(client.post("/embed", json={"inputs": ["good film", LONG]}, headers=AUTH), 413, "inputs[1]")
    assert body["error_type"] == "Validation" and "truncate" in body["error"] and "64" in body["error"]
    vectors = client.post("/embed", json={"inputs": ["good film", LONG], "truncate": True}, headers=AUTH).json()
    expected = embed(pretrained, ["good film", LONG], levels=("sentence",), normalize=True,
                     long_texts="truncate").sentences
    np.testing.assert_allclose(vectors, expected, atol=1e-6, rtol=0)
    left = client.post("/embed", json={"inputs": ["good film", LONG], "truncate": True,
                                       "truncation_direction": "Left"}, headers=AUTH).json()
    expected = embed(pretrained, ["good film", LONG], levels=("sentence",), normalize=True, long_texts="truncate",
                     truncation_side="left").sentences
    np.testing.assert_allclose(left, expected, atol=1e-6, rtol=0)
    np.testing.assert_allclose(left[0], vectors[0], atol=1e-6, rtol=0)  # a short text is not cut either way
    assert not np.allclose(left[1], vectors[1], atol=1e-3)


@pytest.mark.parametrize("body,status,words", [
    ({"inputs": []}, 400, "inputs"),
    ({"inputs": 5}, 422, "inputs"),
    ({"inputs": ["a", 5]}, 422, "inputs[1]"),
    ({"inputs": "a", "normalize": "yes"}, 422, "normalize"),
    ({"inputs": "a", "truncate": 1}, 422, "truncate"),
    ({"inputs": "a", "truncation_direction": "Middle"}, 422, "truncation_direction"),
    ({"inputs": "a", "prompt_name": "query"}, 422, "prompt_name"),
    ({"inputs": "a", "pooling": "cls"}, 422, "pooling"),
    ({"inputs": ["a"] * 17}, 413, "--max-texts"),
])
def test_embed_bad_fields(client, body, status, words):
    error = tei_error(client.post("/embed", json=body, headers=AUTH), status, words)
    assert error["error_type"] == ("Empty" if status == 400 else "Validation")


def test_tokenize_gives_ids_texts_and_offsets(client, pretrained):
    text = "The cat sat, naive."
    tokens = client.post("/tokenize", json={"inputs": [text, "good"]}, headers=AUTH).json()
    encoding = pretrained.tokenizer.encode(text)
    assert [t["id"] for t in tokens[0]] == encoding.ids
    assert tokens[0][0]["special"] and tokens[0][0]["start"] is None and tokens[0][-1]["special"]
    for token in tokens[0][1:-1]:
        assert not token["special"] and token["text"] == text[token["start"]:token["stop"]]
    bare = client.post("/tokenize", json={"inputs": text, "add_special_tokens": False}, headers=AUTH).json()
    assert [t["id"] for t in bare[0]] == pretrained.tokenizer.encode(text, add_special_tokens=False).ids
    tei_error(client.post("/tokenize", json={"inputs": text, "add_special_tokens": "no"}, headers=AUTH), 422,
              "add_special_tokens")


def test_info_describes_the_embedding_model(client):
    info = client.get("/info", headers=AUTH).json()
    assert info["model_id"] == "tiny" and info["model_dtype"] == "float32"
    assert info["model_type"] == {"embedding": {"pooling": "mean"}}
    assert info["max_input_length"] == 64 and info["max_client_batch_size"] == 16
    assert info["max_batch_tokens"] == 8192 and isinstance(info["version"], str)


def test_api_key_and_shape_of_401(client):
    for path, body in (("/embed", {"inputs": "a"}), ("/tokenize", {"inputs": "a"}), ("/info", None)):
        response = client.post(path, json=body) if body is not None else client.get(path)
        assert tei_error(response, 401, "Bearer")["error_type"] == "Unauthorized"


def test_predict_and_rerank_need_a_classifier(client):
    for path, body in (("/predict", {"inputs": "a"}), ("/rerank", {"query": "a", "texts": ["b"]})):
        error = tei_error(client.post(path, json=body, headers=AUTH), 501, "sequence-classification head")
        assert "tiny" in error["error"]


def test_predict_equals_the_pipeline(sentiment):
    client, model = sentiment
    reference = pipeline("text-classification", model)
    logits = reference.logits([{"text": "good film", "text_pair": None},
                               {"text": "the cat", "text_pair": "a dog"}]).astype(np.float64)
    single = client.post("/predict", json={"inputs": "good film"}).json()
    probabilities = np.exp(logits[0] - logits[0].max()) / np.exp(logits[0] - logits[0].max()).sum()
    assert [p["label"] for p in single] == [["negative", "neutral", "positive"][k]
                                            for k in np.argsort(-probabilities, kind="stable")]
    np.testing.assert_allclose([p["score"] for p in single], np.sort(probabilities)[::-1], atol=1e-6)
    assert single == reference("good film", top_k=None)  # the pipeline's own scores, best first
    pair = client.post("/predict", json={"inputs": ["the cat", "a dog"], "raw_scores": True}).json()
    np.testing.assert_allclose([p["score"] for p in pair], np.sort(logits[1])[::-1], atol=1e-5)
    batch = client.post("/predict", json={"inputs": [["good film"], ["the cat", "a dog"]]}).json()
    assert len(batch) == 2 and batch[0] == single
    info = client.get("/info").json()
    assert info["model_type"] == {"classifier": {"id2label": {"0": "negative", "1": "neutral", "2": "positive"}}}


@pytest.mark.parametrize("body,status,words", [
    ({"inputs": ["a", "b", "c"]}, 422, "inputs"),
    ({"inputs": [["a", "b", "c"]]}, 422, "inputs[0]"),
    ({"inputs": [5]}, 422, "inputs[0]"),
    ({"inputs": []}, 400, "inputs"),
    ({"inputs": LONG}, 413, "inputs"),
    ({"inputs": "a", "raw_scores": "yes"}, 422, "raw_scores"),
    ({"inputs": "a", "truncation_direction": "Left"}, 422, "truncation_direction"),
])
def test_predict_bad_fields(sentiment, body, status, words):
    client, _ = sentiment
    tei_error(client.post("/predict", json=body), status, words)


def test_predict_truncates_when_asked(sentiment):
    client, model = sentiment
    truncated = client.post("/predict", json={"inputs": LONG, "truncate": True}).json()
    assert truncated == pipeline("text-classification", model)(LONG, top_k=None)


def test_rerank_scores_equal_the_classifier_and_sort(reranker):
    client, model = reranker
    texts = ["the cat sat on the mat", "a dog ran", "good film", "bad film"]
    ranks = client.post("/rerank", json={"query": "the cat", "texts": texts, "return_text": True}).json()
    logits = pipeline("text-classification", model).logits(
        [{"text": "the cat", "text_pair": t} for t in texts]).astype(np.float64)
    raw = logits[:, 0] if logits.shape[1] == 1 else logits[:, 1] - logits[:, 0]
    expected = 1 / (1 + np.exp(-raw))
    if logits.shape[1] == 2:  # the softmax's positive class
        np.testing.assert_allclose(expected, np.exp(logits[:, 1]) / np.exp(logits).sum(1), atol=1e-12)
    order = np.argsort(-expected, kind="stable")
    assert [r["index"] for r in ranks] == order.tolist()
    np.testing.assert_allclose([r["score"] for r in ranks], expected[order], atol=1e-6)
    assert [r["text"] for r in ranks] == [texts[k] for k in order]
    raw_ranks = client.post("/rerank", json={"query": "the cat", "texts": texts, "raw_scores": True}).json()
    np.testing.assert_allclose([r["score"] for r in raw_ranks], raw[order], atol=1e-5)
    assert all("text" not in r for r in raw_ranks)
    assert client.get("/info").json()["model_type"].keys() == {"reranker" if logits.shape[1] == 1
                                                               else "classifier"}


@pytest.mark.parametrize("body,status,words", [
    ({"query": "a", "texts": []}, 422, "texts"),
    ({"query": "a"}, 422, "texts"),
    ({"query": 1, "texts": ["b"]}, 422, "query"),
    ({"query": "a", "texts": ["b", LONG]}, 413, "texts[1]"),
    ({"query": "a", "texts": ["b"], "return_text": 1}, 422, "return_text"),
])
def test_rerank_bad_fields(reranker, body, status, words):
    client, _ = reranker
    tei_error(client.post("/rerank", json=body), status, words)


def test_rerank_refuses_a_classifier_of_three_labels(sentiment):
    client, _ = sentiment
    tei_error(client.post("/rerank", json={"query": "a", "texts": ["b"]}), 501, "3 outputs")


def test_openapi_schema_lists_the_routes(client):
    paths = client.get("/openapi.json").json()["paths"]
    assert {"/embed", "/tokenize", "/info", "/predict", "/rerank"} <= set(paths)


def test_sentence_transformers_prompt_pooling_and_length(st_dir):
    st = load(st_dir)
    texts = ["good film", "a cat"]
    with TestClient(create_app(st_dir, model_name="st", max_wait_ms=2)) as c:
        vectors = c.post("/embed", json={"inputs": texts, "prompt_name": "query"}).json()
        plain = c.post("/embed", json={"inputs": texts}).json()
        tokens = c.post("/tokenize", json={"inputs": "good film", "prompt_name": "query"}).json()[0]
        unknown = c.post("/embed", json={"inputs": texts, "prompt_name": "passage"})
        long = c.post("/embed", json={"inputs": ["good film", "the cat sat on the mat . a dog ran in the park !"]})
        info = c.get("/info").json()
    # the directory's own settings: CLS pooling, Normalize, max_seq_length 12, the prompt prepended
    expected = embed(st, texts, levels=("sentence",), prompt_name="query").sentences
    np.testing.assert_allclose(vectors, expected, atol=1e-6, rtol=0)
    np.testing.assert_allclose(plain, embed(st, texts, levels=("sentence",)).sentences, atol=1e-6, rtol=0)
    assert not np.allclose(vectors, plain, atol=1e-3)
    assert [t["id"] for t in tokens] == st.tokenizer.encode("query: good film").ids
    content = [t for t in tokens if t["start"] is not None]
    assert content and all(t["text"] == "good film"[t["start"]:t["stop"]] for t in content)
    assert "".join(t["text"] for t in content) == "goodfilm"
    assert "passage" in tei_error(unknown, 422, "prompt_name")["error"]
    assert "12" in tei_error(long, 413, "inputs[1]")["error"]
    assert info["model_type"] == {"embedding": {"pooling": "cls"}} and info["max_input_length"] == 12
    assert info["prompts"] == {"query": "query: "}


def test_predict_names_the_text_over_the_character_limit(tiny_dir, tmp_path):
    directory = classifier_dir(tiny_dir, tmp_path / "cls", 2)
    with TestClient(create_app(directory, max_chars=20)) as c:
        response = c.post("/predict", json={"inputs": [["good film"], ["good", "x" * 21]]})
    tei_error(response, 413, "inputs[1][1]")
