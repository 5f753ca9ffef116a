"""The service's ASGI app in-process (FastAPI's TestClient runs its lifespan, so the batcher runs as in a server):
outputs equal to `bertology.embed`, batching, metrics, authentication, limits and every bad-input case."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from fastapi.testclient import TestClient

from bertology import embed
from bertology.cli.main import main
from bertology.errors import CheckpointError, ConfigError
from bertology.model import load
from bertology.objectives.fill_mask import fill_mask
from bertology.serve import create_app
from bertology.serve.batcher import Batcher, EmbedOptions
from bertology.serve.metrics import ServiceMetrics, metric_value

LONG = " ".join(["the cat sat on the mat and a dog ran in the park"] * 12)  # ~150 tokens: 64-token windows
TEXTS = ["the cat sat on the mat .", "", "a dog ran in the park !", LONG, "good film"]


@pytest.fixture(scope="module")
def pretrained(tiny_dir):
    return load(tiny_dir)


@pytest.fixture(scope="module")
def client(tiny_dir):
    with TestClient(create_app(tiny_dir, max_wait_ms=2)) as c:
        yield c


def unit(rows: np.ndarray) -> np.ndarray:
    return rows / np.maximum(np.linalg.norm(rows.astype(np.float64), axis=1, keepdims=True), 1e-12)


@pytest.mark.parametrize("options", [
    {},
    {"layers": "mean"},
    {"layers": [0, -1], "combine": "concat", "sentence": "cls"},
    {"layers": "-2,-1", "combine": "sum", "normalize": True},
])
def test_sentence_vectors_equal_embed(client, pretrained, options):
    response = client.post("/v1/embed", json={"texts": TEXTS, **options})
    assert response.status_code == 200, response.text
    body = response.json()
    layers = options.get("layers", "last")
    layers = [-2, -1] if layers == "-2,-1" else layers
    expected = embed(pretrained, TEXTS, layers=layers, combine=options.get("combine"),
                     sentence=options.get("sentence", "mean"), levels=("sentence",)).sentences
    if options.get("normalize"):
        expected = unit(expected)
        assert np.allclose(np.linalg.norm(body["vectors"], axis=1), 1, atol=1e-6)
    assert body["level"] == "sentence" and body["dim"] == expected.shape[1] == len(body["vectors"][0])
    np.testing.assert_allclose(np.asarray(body["vectors"]), expected, atol=1e-5, rtol=0)


@pytest.mark.parametrize("level,pooling", [("word", "mean"), ("word", "first"), ("token", "last")])
def test_word_and_token_vectors_equal_embed(client, pretrained, level, pooling):
    body = client.post("/v1/embed", json={"texts": TEXTS, "level": level, "pooling": pooling}).json()
    result = embed(pretrained, TEXTS, pooling=pooling, levels=(level,))
    pieces = result.words if level == "word" else result.tokens
    assert len(body["vectors"]) == len(TEXTS)
    for i, text in enumerate(TEXTS):
        rows = pieces.rows(i)
        np.testing.assert_allclose(np.asarray(body["vectors"][i]).reshape(-1, 32), pieces.vectors[rows],
                                   atol=1e-5, rtol=0)
        assert body["strings"][i] == pieces.strings[rows]
        assert body["spans"][i] == np.stack([pieces.start[rows], pieces.end[rows]], 1).tolist()
        if level == "word":
            assert [text[a:b] for a, b in body["spans"][i]] == body["strings"][i]
        else:
            assert body["ids"][i] == pieces.ids[rows].tolist()
    assert body["vectors"][1] == [] and body["strings"][1] == []  # the empty text has no words or tokens


def test_control_zero_width_and_emoji_are_embedded_as_the_tokenizer_reads_them(client, pretrained):
    """Defined behaviour: texts go to embed as sent; spans index the text as sent (code points), so they hold
    around emoji, zero-width joiners and control characters; a text of nothing but such characters embeds like
    the empty text."""
    texts = ["the cat \u200bsat\u200d on 😀 the\x07 mat\u0000 .", "\u200b\u200c\ufeff", "🐈‍⬛ cat", "\x1b[31mdog"]
    body = client.post("/v1/embed", json={"texts": texts, "level": "word"}).json()
    result = embed(pretrained, texts, levels=("word",))
    for i, text in enumerate(texts):
        rows = result.words.rows(i)
        np.testing.assert_allclose(np.asarray(body["vectors"][i]).reshape(-1, 32), result.words.vectors[rows],
                                   atol=1e-5, rtol=0)
        assert [text[a:b] for a, b in body["spans"][i]] == body["strings"][i] == result.words.strings[rows]
    assert body["strings"][0][:3] == ["the", "cat", "sat"]  # the zero-width space is not part of a word
    sentences = client.post("/v1/embed", json={"texts": [texts[1], ""]}).json()["vectors"]
    np.testing.assert_allclose(sentences[0], sentences[1], atol=1e-6)


def test_requests_arriving_together_share_a_forward_and_get_their_own_vectors(pretrained):
    """Eight concurrent requests (two option sets) within max_wait: one batch, one embed call per option set,
    each request's vectors equal to embed on its texts alone. Their costs are counted beforehand, so that all
    eight are queued in one turn of the event loop (counted by embed, each on a thread of its own, they arrived
    as the threads were scheduled: on a loaded machine, later than max_wait)."""
    metrics = ServiceMetrics()
    batcher = Batcher(pretrained, max_batch_tokens=8192, max_wait_ms=300, observe=metrics)
    requests = [(TEXTS[i % 5: i % 5 + 2], EmbedOptions(level="word" if i % 2 else "sentence")) for i in range(8)]

    async def scenario():
        await batcher.start()
        try:
            return await asyncio.gather(*(batcher.embed(texts, options, batcher.cost(texts))
                                          for texts, options in requests))
        finally:
            await batcher.stop()

    results = asyncio.run(scenario())
    exposition = metrics.exposition()[0].decode()
    assert metric_value(exposition, "bertology_batch_requests_count") == 1
    assert metric_value(exposition, "bertology_batch_requests_sum") == 8
    assert metric_value(exposition, "bertology_queue_seconds_count") == 8
    for (texts, options), got in zip(requests, results):
        alone = embed(pretrained, texts, levels=(options.level,))
        if options.level == "sentence":
            np.testing.assert_allclose(got.sentences, alone.sentences, atol=1e-5, rtol=0)
        else:
            np.testing.assert_allclose(got.words.vectors, alone.words.vectors, atol=1e-5, rtol=0)
            assert got.words.strings == alone.words.strings
            assert got.words.bounds.tolist() == alone.words.bounds.tolist()


def test_token_budget_splits_batches_and_bounds_each_forward(pretrained):
    """With a budget of one 64-token window, waiting requests are packed up to the budget: several batches, none
    over it except a lone request larger than the budget, which runs alone in forwards within it. The costs are
    counted beforehand, so that the four are queued at once whatever the machine's load."""
    metrics = ServiceMetrics()
    batcher = Batcher(pretrained, max_batch_tokens=64, max_wait_ms=200, observe=metrics)
    short = ["the cat sat on the mat ."] * 3
    per_text = len(pretrained.tokenizer.encode(short[0]).ids)  # specials included
    costs = [batcher.cost(short).tokens, batcher.cost([LONG]).tokens]
    assert costs[0] == 3 * per_text and 2 * costs[0] <= 64 < 3 * costs[0] and costs[1] > 64

    async def scenario():
        await batcher.start()
        try:
            return await asyncio.gather(*(batcher.embed(t, EmbedOptions(), batcher.cost(t))
                                          for t in [short, short, short, [LONG]]))
        finally:
            await batcher.stop()

    results = asyncio.run(scenario())
    exposition = metrics.exposition()[0].decode()
    assert metric_value(exposition, "bertology_batch_requests_count") == 3  # [short, short], [short], [LONG]
    assert metric_value(exposition, "bertology_batch_tokens_sum") == 3 * costs[0] + costs[1]
    np.testing.assert_allclose(results[3].sentences, embed(pretrained, [LONG]).sentences, atol=1e-5, rtol=0)
    with pytest.raises(ConfigError, match="at least the model's window of 64"):
        Batcher(pretrained, max_batch_tokens=63)


def test_metrics_count_requests_batches_and_latency(tiny_dir):
    with TestClient(create_app(tiny_dir)) as c:
        for _ in range(3):
            assert c.post("/v1/embed", json={"texts": ["a cat"]}).status_code == 200
        assert c.post("/v1/embed", json={"texts": [3]}).status_code == 422
        response = c.get("/metrics")
    assert response.headers["content-type"].startswith("text/plain")
    text = response.text
    assert metric_value(text, "bertology_requests_total", {"endpoint": "/v1/embed", "status": 200}) == 3
    assert metric_value(text, "bertology_requests_total", {"endpoint": "/v1/embed", "status": 422}) == 1
    assert metric_value(text, "bertology_request_duration_seconds_count", {"endpoint": "/v1/embed"}) == 4
    assert metric_value(text, "bertology_queue_seconds_count") == 3
    assert metric_value(text, "bertology_batch_texts_sum") == 3
    assert metric_value(text, "bertology_batch_tokens_sum") == 3 * 4  # [CLS] a cat [SEP]


def test_health_and_openapi_schema(client):
    health = client.get("/health").json()
    assert health["status"] == "ok" and health["dim"] == 32 and health["window"] == 64
    schema = client.get("/openapi.json").json()
    request = schema["components"]["schemas"]["EmbedRequest"]
    assert set(request["properties"]) == {"texts", "level", "layers", "combine", "pooling", "sentence", "normalize"}
    assert "/v1/fill-mask" in schema["paths"] and "413" in schema["paths"]["/v1/embed"]["post"]["responses"]


def test_fill_mask_equals_the_library_function(mlm_dir):
    pretrained = load(mlm_dir)
    texts = ["the cat [MASK] on the mat .", "a [MASK] ran in the [MASK] !"]
    with TestClient(create_app(mlm_dir)) as c:
        body = c.post("/v1/fill-mask", json={"texts": texts, "top_k": 3}).json()
        missing = c.post("/v1/fill-mask", json={"texts": ["a cat", "no mask here"]})
    for text, got in zip(texts, body["results"]):
        expected = fill_mask(pretrained.model, pretrained.tokenizer, text, top_k=3)
        assert [[c["token"] for c in mask] for mask in got] == [[p.token for p in mask] for mask in expected]
        assert np.allclose([[c["probability"] for c in mask] for mask in got],
                           [[p.probability for p in mask] for mask in expected], atol=1e-6)
    assert missing.status_code == 422 and missing.json()["field"] == "texts[0]"
    assert "no mask token" in missing.json()["detail"]


def test_fill_mask_without_a_masked_lm_head_is_501(client):
    response = client.post("/v1/fill-mask", json={"texts": ["a [MASK]"]})
    assert response.status_code == 501 and "no masked-LM head" in response.json()["detail"]


# ------------------------------------------------------------------------------------------------ authentication


def test_api_key_is_required_when_configured(tiny_dir, tmp_path):
    key_file = tmp_path / "key"
    key_file.write_text("s3cret-key\n")
    with TestClient(create_app(tiny_dir, api_key_file=key_file)) as c:
        payload = {"texts": ["a cat"]}
        missing = c.post("/v1/embed", json=payload)
        wrong = c.post("/v1/embed", json=payload, headers={"Authorization": "Bearer s3cret-kez"})
        basic = c.post("/v1/embed", json=payload, headers={"Authorization": "Basic s3cret-key"})
        right = c.post("/v1/embed", json=payload, headers={"Authorization": "Bearer s3cret-key"})
        metrics = c.get("/metrics")
        health = c.get("/health")
    for response in (missing, wrong, basic, metrics):
        assert response.status_code == 401, response.text
        assert response.headers["www-authenticate"] == "Bearer"
    assert "no Authorization: Bearer header" in missing.json()["detail"]
    assert "wrong API key" in wrong.json()["detail"]
    assert right.status_code == 200 and health.status_code == 200


@pytest.mark.parametrize("content,message", [(None, "cannot read it"), ("\n", "the file is empty"),
                                             ("two words", "whitespace")])
def test_bad_api_key_file_is_refused_at_startup(tiny_dir, tmp_path, content, message):
    key_file = tmp_path / "key"
    if content is not None:
        key_file.write_text(content)
    with pytest.raises(ConfigError, match=message) as error:
        create_app(tiny_dir, api_key_file=key_file)
    assert str(key_file) in str(error.value)


# ------------------------------------------------------------------------------------------------ bad input


def post_raw(client, body: bytes):
    return client.post("/v1/embed", content=body, headers={"content-type": "application/json"})


def test_malformed_json_is_400_with_its_position(client):
    response = post_raw(client, b'{"texts": ["a",\n  ]}')
    assert response.status_code == 400
    assert response.json()["detail"].startswith("malformed JSON: Expecting value at line 2, column 3")


def test_non_utf8_body_is_400_with_the_byte_offset(client):
    response = post_raw(client, '{"texts": ["café"]}'.encode("latin-1"))
    assert response.status_code == 400
    assert response.json()["detail"] == "the request body is not UTF-8: byte 0xe9 at byte offset 15 " \
                                        "(invalid continuation byte)"
    utf16 = post_raw(client, '{"texts": ["a"]}'.encode("utf-16"))  # json.loads would guess this; we do not
    assert utf16.status_code == 400 and "not UTF-8" in utf16.json()["detail"]


def test_lone_surrogate_is_422_naming_the_text(client):
    response = post_raw(client, b'{"texts": ["ok", "ab\\udc80"]}')
    assert response.status_code == 422
    assert response.json() == {"detail": "texts[1]: character 2 is a lone surrogate (U+DC80), which is not "
                                         "Unicode text", "field": "texts[1]"}


@pytest.mark.parametrize("payload,field", [
    ({"texts": ["a", 3]}, "texts[1]"),
    ({"texts": "a cat"}, "texts"),
    ({"texts": ["a"], "level": "paragraph"}, "level"),
    ({"texts": ["a"], "pooling": "max"}, "pooling"),
    ({"texts": ["a"], "normalize": "yes"}, "normalize"),
    ({"texts": ["a"], "layers": 9}, "layers"),
    ({"texts": ["a"], "layers": [1, True]}, "layers[1]"),
    ({"texts": ["a"], "layers": "last", "combine": "sum"}, "combine"),
    ({"texts": ["a"], "layer": "last"}, "layer"),
    ({"text": ["a"]}, "texts"),
])
def test_wrong_types_and_values_are_422_naming_the_field(client, payload, field):
    response = client.post("/v1/embed", json=payload)
    assert response.status_code == 422, response.text
    assert response.json()["field"] == field, response.json()
    assert field in response.json()["detail"]


def test_empty_body_and_empty_text_list_are_422(client):
    empty = post_raw(client, b"")
    assert empty.status_code == 422 and "expected a JSON object" in empty.json()["detail"]
    no_texts = client.post("/v1/embed", json={"texts": []})
    assert no_texts.status_code == 422 and no_texts.json()["field"] == "texts"


def test_limits_answer_413_naming_the_limit(tiny_dir):
    with TestClient(create_app(tiny_dir, max_texts=4, max_chars=50, max_body_bytes=2000)) as c:
        too_many = c.post("/v1/embed", json={"texts": ["a"] * 5})
        too_long = c.post("/v1/embed", json={"texts": ["a", "b" * 51]})
        too_big = c.post("/v1/embed", json={"texts": ["a" * 40] * 60})
        fine = c.post("/v1/embed", json={"texts": ["a" * 50] * 4})
        metrics = c.get("/metrics")
    assert too_many.status_code == 413 and too_many.json() == {
        "detail": "texts: 5 texts in one request; the limit is 4 (--max-texts)", "field": "texts"}
    assert too_long.status_code == 413 and too_long.json()["field"] == "texts[1]"
    assert "51 characters; the limit is 50" in too_long.json()["detail"]
    assert too_big.status_code == 413 and "the limit is 2000 (--max-body-bytes)" in too_big.json()["detail"]
    assert fine.status_code == 200
    assert metric_value(metrics.text, "bertology_requests_total", {"endpoint": "/v1/embed", "status": 413}) == 3


def test_a_directory_that_is_not_a_model_is_refused_at_startup(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("not a model")
    with pytest.raises(CheckpointError, match=f"--model {tmp_path} is not a model directory"):
        create_app(tmp_path)
    with pytest.raises(CheckpointError, match="no such directory"):
        create_app(tmp_path / "missing")
    assert main(["serve", "--model", str(tmp_path), "--port", "0"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(tmp_path) in err and "not a model directory" in err


def test_serve_binds_loopback_by_default():
    import argparse

    from bertology.cli import serve as serve_cli

    parser = argparse.ArgumentParser()
    serve_cli.register(parser.add_subparsers())
    args = parser.parse_args(["serve", "--model", "m"])
    assert args.host == "127.0.0.1" and args.port == 8080


def test_minilm_sentence_and_word_vectors_equal_embed(minilm_path):
    """The real all-MiniLM-L6-v2 behind the service: its vectors equal embed's on the same texts."""
    pretrained = load(minilm_path)
    texts = ["it 's a charming and often affecting journey .", "unflinchingly bleak and desperate",
             "the movie is a mess 😕 \u200b", "x " * 400]  # the last needs windows of MiniLM's 512 positions
    with TestClient(create_app(pretrained, model_name="all-MiniLM-L6-v2")) as c:
        sentences = c.post("/v1/embed", json={"texts": texts, "normalize": True}).json()
        words = c.post("/v1/embed", json={"texts": texts, "level": "word", "layers": "sum-last-four"}).json()
    # The service embeds as bertology does (windows of 512 positions), not with the directory's own settings.
    expected = embed(pretrained, texts, model_settings=False).sentences
    np.testing.assert_allclose(sentences["vectors"], unit(expected), atol=1e-5, rtol=0)
    expected = embed(pretrained, texts, layers="sum-last-four", levels=("word",), model_settings=False).words
    for i in range(len(texts)):
        np.testing.assert_allclose(np.asarray(words["vectors"][i]).reshape(-1, 384),
                                   expected.vectors[expected.rows(i)], atol=1e-5, rtol=0)


# ------------------------------------------------------------------------------------------------ int8 and search


def test_int8_service_equals_embed_on_the_quantized_model(tiny_dir, pretrained):
    """--dtype int8: the vectors are embed's on bertology.model.quantize's int8 model (its per-token activation
    scales make them independent of what else is in the batch)."""
    from bertology.model.quantize import quantize

    quantized = quantize(pretrained)
    with TestClient(create_app(tiny_dir, dtype="int8")) as c:
        assert c.get("/health").json()["dtype"] == "int8"
        body = c.post("/v1/embed", json={"texts": TEXTS}).json()
    np.testing.assert_allclose(body["vectors"], embed(quantized, TEXTS).sentences, atol=1e-5, rtol=0)
    with pytest.raises(ConfigError, match="dtype: unknown 'int4'"):
        create_app(tiny_dir, dtype="int4")


PASSAGES = [{"id": "p1", "text": "the cat sat on the mat ."}, {"id": "p2", "text": "a dog ran in the park !"},
            {"id": "p3", "text": "good film"}, {"id": "p4", "text": "bad film twice"}]


@pytest.fixture(scope="module")
def index_dir(tiny_dir, tmp_path_factory):
    pytest.importorskip("faiss")
    from bertology.retrieval import Index

    return Index.build(tiny_dir, PASSAGES).save(tmp_path_factory.mktemp("serve-index") / "films")


def test_search_equals_the_index_api(tiny_dir, index_dir):
    from bertology.retrieval import Index

    queries = ["a cat on a mat", "film"]
    expected = Index.load(index_dir, model=tiny_dir).search(queries, k=3)
    with TestClient(create_app(tiny_dir, index=index_dir)) as c:
        body = c.post("/v1/search", json={"queries": queries, "k": 3}).json()
        bad_k = c.post("/v1/search", json={"queries": queries, "k": 0})
        empty = c.post("/v1/search", json={"queries": []})
    assert body["index"] == "films"
    for got, hits in zip(body["results"], expected):
        assert [h["id"] for h in got] == [h.id for h in hits]
        assert np.allclose([h["score"] for h in got], [h.score for h in hits], atol=1e-5)
        assert [h["text"] for h in got] == [h.text for h in hits]
    assert bad_k.status_code == 422 and bad_k.json()["field"] == "k"
    assert empty.status_code == 422 and empty.json()["field"] == "queries"


def test_search_needs_an_index_and_an_index_of_another_model_is_refused(client, mlm_dir, index_dir):
    from bertology.retrieval import IndexMismatchError

    assert client.post("/v1/search", json={"queries": ["a"]}).status_code == 404  # started without --index
    with pytest.raises(IndexMismatchError, match="the index was built with another model"):
        create_app(mlm_dir, index=index_dir)
