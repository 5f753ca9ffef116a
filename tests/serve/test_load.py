"""A load test on a real uvicorn server: concurrent clients (64 in the slow test, 16 in the default one), each
sending a mix of requests back to back (streamed and whole completions, the library's generation with beams,
OpenAI embeddings, /v1/embed, health) within a time bound; no request is lost or fails, and every answer is the
library's own (completions equal `bertology.generate`'s greedy text, vectors equal `bertology.embed`'s)."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import numpy as np
import pytest
import torch
from finetune_helpers import save_family_model
from live_server import running

from bertology import embed, generate
from bertology.model import load
from bertology.serve import create_app

pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("one_thread")

TEXTS = ["the cat sat on the mat", "a dog ran in the park", "the old book by the window"] * 4
PROMPTS = ["the cat sat", "a dog ran in the", "the old book", "the mat", "a park by the window", "the dog"]


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory):
    return load(save_family_model(tmp_path_factory.mktemp("load") / "gpt2", "gpt2", TEXTS, positions=128))


def expected_text(pretrained, prompt, new):
    ids = torch.tensor([pretrained.tokenizer.encode(prompt).ids])
    out = generate(pretrained.model, ids, torch.ones_like(ids), max_new_tokens=new)[0, ids.shape[1]:].tolist()
    eos = pretrained.model.config.eos_token_id
    return pretrained.tokenizer.decode(out[:out.index(eos)] if eos in out else out)


async def stream_text(client, body):
    text, done = "", False
    async with client.stream("POST", "/v1/completions", json=body) as response:
        assert response.status_code == 200, await response.aread()
        async for line in response.aiter_lines():
            if line == "data: [DONE]":
                done = True
            elif line.startswith("data: "):
                text += "".join(c["text"] for c in json.loads(line[6:])["choices"])
    assert done
    return text


def load_test(pretrained, clients: int, rounds: int, seconds: float) -> None:
    texts = {p: expected_text(pretrained, p, 12) for p in PROMPTS}
    vectors = embed(pretrained, PROMPTS, levels=("sentence",), normalize=True).sentences
    plain = embed(pretrained, PROMPTS, levels=("sentence",)).sentences
    app = create_app(pretrained, model_name="tiny", max_wait_ms=2)
    answered = []

    async def client_loop(url, k):
        async with httpx.AsyncClient(base_url=url, timeout=seconds) as client:
            for r in range(rounds):
                i = (k + r) % len(PROMPTS)
                prompt = PROMPTS[i]
                kind = (k + r) % 6
                if kind == 0:
                    got = await stream_text(client, {"model": "tiny", "prompt": prompt, "max_tokens": 12,
                                                     "temperature": 0, "stream": True})
                    assert got == texts[prompt]
                elif kind == 1:
                    body = (await client.post("/v1/completions", json={
                        "model": "tiny", "prompt": prompt, "max_tokens": 12, "temperature": 0})).json()
                    assert body["choices"][0]["text"] == texts[prompt], body
                elif kind == 2:
                    body = (await client.post("/v1/embeddings", json={"model": "tiny", "input": prompt})).json()
                    np.testing.assert_allclose(body["data"][0]["embedding"], vectors[i], atol=1e-5)
                elif kind == 3:
                    body = (await client.post("/v1/embed", json={"texts": [prompt]})).json()
                    np.testing.assert_allclose(body["vectors"][0], plain[i], atol=1e-5)
                elif kind == 4:
                    response = await client.post("/v1/generate", json={"texts": [prompt], "max_new_tokens": 6,
                                                                       "num_beams": 2})
                    assert response.status_code == 200 and len(response.json()["results"][0]) == 1
                else:
                    assert (await client.get("/health")).json()["status"] == "ok"
                answered.append((k, r))

    async def main(url):
        await asyncio.wait_for(asyncio.gather(*(client_loop(url, k) for k in range(clients))), seconds)

    started = time.monotonic()
    with running(app) as url:
        asyncio.run(main(url))
        status = httpx.get(f"{url}/health").json()["generation"]
    assert sorted(answered) == [(k, r) for k in range(clients) for r in range(rounds)]  # none lost
    assert status == {"running": 0, "rows": 0, "waiting": 0}
    assert time.monotonic() - started < seconds + 60


def test_sixteen_clients_of_mixed_requests_lose_nothing(gpt2):
    load_test(gpt2, clients=16, rounds=2, seconds=120)


@pytest.mark.slow
def test_sixty_four_clients_of_mixed_requests_lose_nothing(gpt2):
    load_test(gpt2, clients=64, rounds=6, seconds=300)
