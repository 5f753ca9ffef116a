"""What bounds each request's work and response: tokens, numbers returned (vectors x width), fill-mask candidates
(masks x top_k) and search hits (queries x k), each a 413 naming its option; an infinite or huge --max-wait-ms is
refused at startup; an empty computed level is an empty answer, not a 500; a small request is answered between the
texts of a large fill-mask request."""

from __future__ import annotations

import math
import threading

import numpy as np
import pytest
from fastapi.testclient import TestClient

from bertology import embed
from bertology.cli.main import main
from bertology.errors import ConfigError
from bertology.model import load
from bertology.serve import create_app


def test_token_level_response_is_bounded_by_max_values(tiny_dir):
    text = " ".join(["the cat sat on the mat"] * 20)  # 140 content tokens ("mat" is two pieces)
    with TestClient(create_app(tiny_dir, max_values=100 * 32)) as c:
        refused = c.post("/v1/embed", json={"texts": [text], "level": "token"})
        words = c.post("/v1/embed", json={"texts": [text], "level": "word"})
        sentence = c.post("/v1/embed", json={"texts": [text] * 4})
        concat = c.post("/v1/embed", json={"texts": ["a"] * 60, "layers": [0, 1, 2], "combine": "concat"})
    assert refused.status_code == 413 and refused.json()["field"] == "level"
    assert refused.json()["detail"] == ("level: the numbers in the response (140 content-token vectors of 32) is "
                                        "4480; the limit is 3200 (--max-values)")
    assert words.status_code == 413  # words are bounded by the tokens they are made of
    assert sentence.status_code == 200 and len(sentence.json()["vectors"]) == 4
    assert concat.status_code == 413 and "(60 vectors of 96) is 5760" in concat.json()["detail"]


def test_work_is_bounded_by_max_tokens(tiny_dir, mlm_dir):
    with TestClient(create_app(tiny_dir, max_tokens=50)) as c:
        refused = c.post("/v1/embed", json={"texts": ["the cat sat on the mat"] * 10})
        fine = c.post("/v1/embed", json={"texts": ["the cat sat on the mat"] * 5})
    assert refused.status_code == 413 and refused.json()["field"] == "texts"
    assert "the tokens the texts cost the encoder is 90; the limit is 50 (--max-tokens)" in refused.json()["detail"]
    assert fine.status_code == 200
    with TestClient(create_app(mlm_dir, max_tokens=20)) as c:
        refused = c.post("/v1/fill-mask", json={"texts": ["the [MASK] sat on the mat"] * 4})
    assert refused.status_code == 413 and "(--max-tokens)" in refused.json()["detail"]


def test_fill_mask_is_bounded_by_masks_times_top_k(mlm_dir):
    many = " ".join(["[MASK]"] * 30)
    with TestClient(create_app(mlm_dir, max_outputs=100)) as c:
        refused = c.post("/v1/fill-mask", json={"texts": [many], "top_k": 4})
        fine = c.post("/v1/fill-mask", json={"texts": [many], "top_k": 3})
        metrics = c.get("/metrics")
    assert refused.status_code == 413 and refused.json() == {
        "detail": "top_k: the candidates asked for (30 masks x top_k 4) is 120; the limit is 100 (--max-outputs)",
        "field": "top_k"}
    assert fine.status_code == 200 and len(fine.json()["results"][0]) == 30
    assert 'status="413"' in metrics.text


def test_search_is_bounded_by_queries_times_k(tiny_dir, tmp_path):
    pytest.importorskip("faiss")
    from bertology.retrieval import Index

    index_dir = Index.build(tiny_dir, [{"id": f"p{i}", "text": f"the cat {i}"} for i in range(5)]).save(
        tmp_path / "index")
    with TestClient(create_app(tiny_dir, index=index_dir, max_outputs=10)) as c:
        refused = c.post("/v1/search", json={"queries": ["cat"] * 3, "k": 4})
        fine = c.post("/v1/search", json={"queries": ["cat"] * 2, "k": 5})
    assert refused.status_code == 413 and refused.json()["field"] == "k" and "(--max-outputs)" in refused.json()[
        "detail"]
    assert fine.status_code == 200


@pytest.mark.parametrize("level", ["token", "word"])
@pytest.mark.parametrize("texts", [[""], ["\u200b\u200c\u200d"], ["", ""]])
def test_texts_without_words_or_tokens_give_empty_lists(tiny_dir, level, texts):
    with TestClient(create_app(tiny_dir)) as c:
        response = c.post("/v1/embed", json={"texts": texts, "level": level})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["vectors"] == [[] for _ in texts] and body["strings"] == [[] for _ in texts]
    assert body["dim"] == 32


def test_embed_command_writes_word_vectors_of_empty_lines(tiny_dir, tmp_path, capsys):
    from bertology.embeddings import load_vectors

    (tmp_path / "empty.txt").write_text("\n\n\n")
    assert main(["embed", "--model", str(tiny_dir), "--input", str(tmp_path / "empty.txt"), "--level", "word",
                 "--output", str(tmp_path / "w.npz"), "--quiet"]) == 0, capsys.readouterr().err
    assert "wrote 0 word vectors (32 dimensions) for 3 texts" in capsys.readouterr().err
    assert load_vectors(tmp_path / "w.npz")["vectors"].shape == (0, 32)
    assert embed(load(tiny_dir), ["", ""], levels=("token",)).dim == 32


@pytest.mark.parametrize("wait", [math.inf, -math.inf, math.nan, 10_001.0, -1.0])
def test_a_non_finite_or_huge_max_wait_is_refused(tiny_dir, wait, capsys):
    with pytest.raises(ConfigError, match="max_wait_ms must be a finite number of milliseconds from 0 to 10000"):
        create_app(tiny_dir, max_wait_ms=wait)
    assert main(["serve", "--model", str(tiny_dir), "--port", "0", f"--max-wait-ms={wait}"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "max-wait-ms" in err.replace("_", "-")


@pytest.mark.parametrize("option", ["max_tokens", "max_values", "max_outputs"])
@pytest.mark.parametrize("value", [0, -5, 1.5, True])
def test_limits_must_be_positive_integers(tiny_dir, option, value):
    with pytest.raises(ConfigError, match=f"{option} must be a positive integer"):
        create_app(tiny_dir, **{option: value})


def test_a_small_request_is_answered_between_the_texts_of_a_large_fill_mask(mlm_dir, monkeypatch):
    """The encoder thread takes one fill-mask text at a time, so an embedding request sent meanwhile waits for one
    text, not for all of them: its forward runs right after the first text, and it is answered while the fill-mask
    request still has texts to run. The first text runs only once the embedding is batched, and the others only
    once it is answered, so what is checked does not depend on the machine's speed or load (a 50 ms sleep per
    text and a 0.5 s bound did)."""
    import bertology.serve.app as app_module

    started, batched, answered = threading.Event(), threading.Event(), threading.Event()
    order: list[str] = []  # the work of the encoder's thread, in the order it ran
    real = app_module.fill_mask

    def gated_fill_mask(*args, **kwargs):
        first = not started.is_set()
        started.set()
        gate = batched if first else answered
        assert gate.wait(60), "the embedding request was never " + ("batched" if first else "answered")
        order.append("fill")
        return real(*args, **kwargs)

    monkeypatch.setattr(app_module, "fill_mask", gated_fill_mask)
    finished: dict[str, int] = {}
    with TestClient(create_app(mlm_dir, max_wait_ms=1)) as c:
        batcher = c.app.state.batcher
        take, forward = batcher._take, batcher._forward

        def taken():  # on the event loop: the batch is handed to the encoder's thread right after this
            batch = take()
            batched.set()
            return batch

        def forwarded(batch):
            order.append("embed")
            return forward(batch)

        monkeypatch.setattr(batcher, "_take", taken)
        monkeypatch.setattr(batcher, "_forward", forwarded)

        def large():
            response = c.post("/v1/fill-mask", json={"texts": ["the [MASK] sat"] * 20, "top_k": 1})
            finished["fill_status"] = response.status_code

        thread = threading.Thread(target=large)
        thread.start()
        assert started.wait(60)
        response = c.post("/v1/embed", json={"texts": ["a"]})
        finished["fills_before_the_answer"] = order.count("fill")
        answered.set()
        thread.join(120)
        assert not thread.is_alive(), "the fill-mask request was not answered"
    assert response.status_code == 200 and np.asarray(response.json()["vectors"]).shape == (1, 32)
    assert finished["fill_status"] == 200
    assert order == ["fill", "embed"] + ["fill"] * 19 and finished["fills_before_the_answer"] == 1


def test_json_nested_too_deeply_is_400_naming_it(tiny_dir):
    with TestClient(create_app(tiny_dir)) as c:
        response = c.post("/v1/embed", content="[" * 100_000 + "]" * 100_000,
                          headers={"content-type": "application/json"})
    assert response.status_code == 400 and response.json() == {
        "detail": "malformed JSON: arrays or objects nested too deeply"}
