"""The library's own task routes: `/v1/generate` (beam search equal to `bertology.generate`, greedy and seeded
sampling through the running batch), `/v1/token-classification` and `/v1/question-answering` equal to the
pipelines' answers; 501 naming what a model lacks; every bad field 422 naming it; the API key and the limits."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from fastapi.testclient import TestClient
from finetune_helpers import save_family_model

from bertology import generate, pipeline
from bertology.model import load
from bertology.serve import create_app

pytest.importorskip("transformers")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from test_pipelines import NER_LABELS, NER_TEXT, save_hf

pytestmark = pytest.mark.usefixtures("one_thread")
TEXTS = ["the cat sat on the mat", "a dog ran in the park", "the old book by the window"] * 4
KEY = "k"
AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("tasks")
    return {"gpt2": load(save_family_model(root / "gpt2", "gpt2", TEXTS)),
            "t5": load(save_family_model(root / "t5", "t5", TEXTS)),
            "ner": save_hf("BertForTokenClassification", root / "ner", NER_LABELS, seed=3),
            "qa": save_hf("BertForQuestionAnswering", root / "qa")}


def new_tokens(pretrained, text, **options):
    ids = torch.tensor([pretrained.tokenizer.encode(text).ids])
    out = generate(pretrained.model, ids, torch.ones_like(ids), **options)
    decoder = pretrained.model.heads is not None and type(pretrained.model).__name__ == "DecoderModel"
    return [row[ids.shape[1]:] if decoder else row[1:] for row in out.tolist()]


def until_eos(row, eos):
    return row[:row.index(eos) + 1] if eos in row else row


@pytest.mark.parametrize("style", ["gpt2", "t5"])
def test_generation_equals_generate_with_beams_greedy_and_seeds(models, style):
    pretrained = models[style]
    eos = pretrained.model.config.eos_token_id
    prompts = ["the cat sat", "a dog"]
    with TestClient(create_app(pretrained, model_name="m", api_key=KEY)) as http:
        for options in ({"num_beams": 3, "num_return_sequences": 2}, {}, {"do_sample": True, "seed": 5,
                                                                          "top_k": 8, "temperature": 0.8}):
            response = http.post("/v1/generate", headers=AUTH, json={"texts": prompts, "max_new_tokens": 7,
                                                                     **options})
            assert response.status_code == 200, response.text
            body = response.json()
            assert body["model"] == "m" and len(body["results"]) == 2
            for text, outputs in zip(prompts, body["results"]):
                expected = [until_eos(row, eos) for row in new_tokens(pretrained, text, max_new_tokens=7,
                                                                      pad_token_id=pretrained.model.config.pad_token_id,
                                                                      **options)]
                assert [o["token_ids"] for o in outputs] == expected
                for output in outputs:
                    reason = "eos" if output["token_ids"][-1] == eos else "length"
                    assert output["finish_reason"] == reason
                    assert isinstance(output["generated_text"], str)
            assert body["generated_tokens"] == sum(len(o["token_ids"]) for r in body["results"] for o in r)
        assert http.post("/v1/generate", json={"texts": ["a"]}).status_code == 401


GENERATE_BAD = [
    ({"texts": []}, "texts"), ({"max_new_tokens": 0}, "max_new_tokens"), ({"max_new_tokens": 100}, "max_new_tokens"),
    ({"num_beams": 17}, "num_beams"), ({"num_beams": 2, "num_return_sequences": 3}, "num_return_sequences"),
    ({"do_sample": True, "temperature": 0}, "temperature"), ({"do_sample": True, "top_p": 1.5}, "top_p"),
    ({"temperature": 0.5}, "temperature"), ({"do_sample": True, "num_beams": 2}, "do_sample"),
    ({"texts": [""]}, "texts[0]"), ({"seed": -3, "do_sample": True}, "seed"), ({"beams": 2}, "beams"),
]


@pytest.mark.parametrize("change, field", GENERATE_BAD, ids=[f for _, f in GENERATE_BAD])
def test_bad_generation_fields_are_422_naming_them(models, change, field):
    with TestClient(create_app(models["gpt2"])) as http:
        response = http.post("/v1/generate", json={"texts": ["the cat"], **change})
    assert response.status_code == 422, response.text
    assert response.json()["field"] == field, response.text


def test_non_finite_generation_settings_are_refused(models):
    with TestClient(create_app(models["gpt2"])) as http:
        for field in ("temperature", "top_p", "length_penalty"):
            raw = '{{"texts": ["a"], "do_sample": {}, "{}": NaN}}'.format("false" if field == "length_penalty" else
                                                                   "true", field)
            response = http.post("/v1/generate", content=raw, headers={"Content-Type": "application/json"})
            assert response.status_code == 422 and response.json()["field"] == field, response.text


def test_the_work_is_bounded_and_a_model_that_cannot_generate_is_501(models, tiny_dir):
    with TestClient(create_app(models["gpt2"], max_tokens=60)) as http:
        over = http.post("/v1/generate", json={"texts": ["the cat"], "max_new_tokens": 20, "num_beams": 4})
    assert over.status_code == 413 and over.json()["field"] == "max_new_tokens"
    assert "--max-tokens" in over.json()["detail"]
    with TestClient(create_app(tiny_dir)) as http:
        for path, body in (("/v1/generate", {"texts": ["a"]}), ("/v1/token-classification", {"texts": ["a"]}),
                           ("/v1/question-answering", {"inputs": [{"question": "a", "context": "b"}]})):
            response = http.post(path, json=body)
            assert response.status_code == 501, (path, response.text)
        assert "generates" in http.post("/v1/generate", json={"texts": ["a"]}).json()["detail"]
        assert "token_classifier" in http.post("/v1/token-classification", json={"texts": ["a"]}).json()["detail"]


def test_entities_equal_the_pipelines(models):
    texts = [NER_TEXT, "paris is a city in france"]
    tagger = pipeline("token-classification", models["ner"])
    with TestClient(create_app(models["ner"], max_tokens=500)) as http:
        for aggregation in ("simple", "first", "none"):
            response = http.post("/v1/token-classification", json={"texts": texts, "aggregation": aggregation})
            assert response.status_code == 200, response.text
            got = response.json()["results"]
            want = tagger(texts, aggregation=aggregation)
            assert len(got) == len(want)
            for g, w in zip(got, want):
                assert [(e["start"], e["end"], e["word"], e.get("entity_group") or e.get("entity")) for e in g] == \
                    [(e["start"], e["end"], e["word"], e.get("entity_group") or e.get("entity")) for e in w]
                assert [e["score"] for e in g] == pytest.approx([e["score"] for e in w], abs=1e-6)
                for e in g:
                    text = texts[got.index(g)]
                    assert text[e["start"]:e["end"]] == e["word"]
        bad = http.post("/v1/token-classification", json={"texts": ["a"], "aggregation": "mean"})
        empty = http.post("/v1/token-classification", json={"texts": []})
        over = http.post("/v1/token-classification", json={"texts": [NER_TEXT * 20]})
    assert bad.status_code == 422 and bad.json()["field"] == "aggregation"
    assert empty.status_code == 422 and empty.json()["field"] == "texts"
    assert over.status_code == 413 and over.json()["field"] == "texts"


def test_answers_equal_the_pipelines(models):
    inputs = [{"question": "who lives in paris ?", "context": NER_TEXT},
              {"question": "where is the bank ?", "context": "the river bank was muddy"}]
    reader = pipeline("question-answering", models["qa"])
    with TestClient(create_app(models["qa"])) as http:
        response = http.post("/v1/question-answering", json={"inputs": inputs, "max_answer_length": 5})
        assert response.status_code == 200, response.text
        got = response.json()["results"]
        want = reader(inputs, max_answer_length=5)
        for g, w, item in zip(got, want, inputs):
            assert (g["answer"], g["start"], g["end"]) == (w["answer"], w["start"], w["end"])
            assert g["score"] == pytest.approx(w["score"], abs=1e-6)
            assert item["context"][g["start"]:g["end"]] == g["answer"]
        cases = [({"inputs": []}, "inputs"), ({"inputs": [{"question": "", "context": "a"}]}, "inputs[0].question"),
                 ({"inputs": [{"question": "a", "context": "b"}], "max_answer_length": 0}, "max_answer_length"),
                 ({"inputs": [{"question": "a"}]}, "inputs[0].context")]
        for body, field in cases:
            response = http.post("/v1/question-answering", json=body)
            assert response.status_code == 422 and response.json()["field"] == field, response.text


def test_the_routes_are_in_the_openapi_schema(models):
    with TestClient(create_app(models["gpt2"])) as http:
        paths = http.get("/openapi.json").json()["paths"]
    for path in ("/v1/completions", "/v1/generate", "/v1/token-classification", "/v1/question-answering"):
        assert "post" in paths[path], path
