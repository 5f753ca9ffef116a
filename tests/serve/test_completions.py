"""`POST /v1/completions` on a real uvicorn server (a thread of this process) through the real `openai` client and
httpx: greedy completions equal `bertology.generate`'s tokens, the same seed gives its draws, streaming gives the
same text in OpenAI's chunks ending `data: [DONE]`, stop strings, log-probabilities, usage; continuous batching (two
requests sent at different times share decoding steps and each equals its solo result; a client that disconnects
frees its row); every bad field answered in OpenAI's error shape naming it, 413 over --max-tokens, 501 for a model
that cannot generate."""

from __future__ import annotations

import json
import math
import socket
import threading
import time

import httpx
import pytest
import torch
from finetune_helpers import save_family_model
from live_server import running

from bertology import generate
from bertology.model import load
from bertology.serve import create_app
from bertology.serve.metrics import metric_value

openai = pytest.importorskip("openai")
pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("one_thread")

KEY = "sk-test"
TEXTS = ["the cat sat on the mat", "a dog ran in the park", "the old book by the window"] * 4
PROMPTS = ["the cat sat", "a dog ran in the", "the old book"]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """A GPT-2 with 256 positions (long generations) and a T5, random, with tokenizers trained on TEXTS."""
    root = tmp_path_factory.mktemp("completions")
    return {"gpt2": load(save_family_model(root / "gpt2", "gpt2", TEXTS, positions=256)),
            "t5": load(save_family_model(root / "t5", "t5", TEXTS))}


@pytest.fixture(scope="module", params=["gpt2", "t5"])
def served(request, models):
    pretrained = models[request.param]
    app = create_app(pretrained, model_name="tiny", api_key=KEY, max_tokens=4000)
    with running(app) as url:
        yield request.param, pretrained, url


def client(url):
    return openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0, timeout=60)


def expected(pretrained, prompt, rows=1, **options):
    """generate's new tokens for `prompt` (repeated `rows` times) decoded as text up to EOS, and their counts."""
    model, tokenizer = pretrained.model, pretrained.tokenizer
    ids = torch.tensor([tokenizer.encode(prompt).ids] * rows)
    out = generate(model, ids, torch.ones_like(ids), **options)
    eos = model.config.eos_token_id
    texts, counts = [], []
    for row in out.tolist():
        new = row[ids.shape[1]:] if model.config.is_decoder_only else row[1:]
        new = new[:options["max_new_tokens"]]
        cut = new.index(eos) if eos in new else len(new)
        texts.append(tokenizer.decode(new[:cut]))
        counts.append(min(cut + 1, len(new)))
    return texts, counts


@pytest.fixture(autouse=True)
def _decoder_only_flag(models):
    from bertology.model import DECODER_ONLY, capabilities

    for pretrained in models.values():
        pretrained.model.config.is_decoder_only = DECODER_ONLY in capabilities(pretrained.model)


def test_greedy_completions_equal_generate_with_usage_and_logprobs(served):
    style, pretrained, url = served
    result = client(url).completions.create(model="tiny", prompt=PROMPTS, max_tokens=12, temperature=0, logprobs=2)
    assert result.object == "text_completion" and result.model == "tiny"
    assert [c.index for c in result.choices] == [0, 1, 2]
    made = 0
    for prompt, choice in zip(PROMPTS, result.choices):
        (text,), (count,) = expected(pretrained, prompt, max_new_tokens=12)
        assert choice.text == text
        assert choice.finish_reason == ("length" if count == 12 and len(choice.logprobs.tokens) == 12 else "stop")
        assert len(choice.logprobs.tokens) == len(choice.logprobs.token_logprobs) == count
        # greedy: each token chosen is the most probable, its log-probability the best of the top ones
        for lp, top in zip(choice.logprobs.token_logprobs, choice.logprobs.top_logprobs):
            assert lp <= 0 and math.isclose(lp, max(top.values()), abs_tol=1e-6)
        made += count
    prompt_tokens = sum(len(pretrained.tokenizer.encode(p).ids) for p in PROMPTS)
    assert result.usage.prompt_tokens == prompt_tokens
    assert result.usage.completion_tokens == made and result.usage.total_tokens == prompt_tokens + made


def test_the_same_seed_gives_generates_draws(served):
    style, pretrained, url = served
    options = {"max_tokens": 10, "temperature": 0.7, "top_p": 0.9, "n": 3, "seed": 1234}
    first = client(url).completions.create(model="tiny", prompt=PROMPTS[0], **options)
    texts, _ = expected(pretrained, PROMPTS[0], rows=3, max_new_tokens=10, do_sample=True, temperature=0.7,
                        top_p=0.9, seed=1234)
    assert [c.text for c in first.choices] == texts
    again = client(url).completions.create(model="tiny", prompt=PROMPTS[0], **options)
    assert [c.text for c in again.choices] == texts


def test_streaming_gives_the_same_text_in_openais_chunks(served):
    style, pretrained, url = served
    whole = client(url).completions.create(model="tiny", prompt=PROMPTS, max_tokens=12, temperature=0, n=2)
    stream = client(url).completions.create(model="tiny", prompt=PROMPTS, max_tokens=12, temperature=0, n=2,
                                            stream=True, stream_options={"include_usage": True})
    texts, reasons, usage = {}, {}, None
    for chunk in stream:
        assert chunk.object == "text_completion" and chunk.id.startswith("cmpl-")
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            assert choice.index not in reasons  # nothing after a choice's finish_reason
            texts[choice.index] = texts.get(choice.index, "") + choice.text
            if choice.finish_reason is not None:
                reasons[choice.index] = choice.finish_reason
    assert texts == {c.index: c.text for c in whole.choices}
    assert reasons == {c.index: c.finish_reason for c in whole.choices}
    assert usage is not None and usage.total_tokens == whole.usage.total_tokens
    with httpx.stream("POST", f"{url}/v1/completions", headers={"Authorization": f"Bearer {KEY}"},
                      json={"model": "tiny", "prompt": "the cat", "max_tokens": 3, "stream": True}) as raw:
        assert raw.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in raw.iter_lines() if line]
    assert lines[-1] == "data: [DONE]" and all(line.startswith("data: {") for line in lines[:-1])


def test_stop_strings_end_a_choice_before_them(served):
    style, pretrained, url = served
    (text,), _ = expected(pretrained, PROMPTS[1], max_new_tokens=16)
    if len(text) < 4:
        pytest.skip("the random model's text is too short to cut")
    stop = text[len(text) // 2:len(text) // 2 + 2]
    cut = text[:text.index(stop)]
    for stream in (False, True):
        result = client(url).completions.create(model="tiny", prompt=PROMPTS[1], max_tokens=16, temperature=0,
                                                stop=[stop, "\u2603never"], stream=stream)
        if stream:
            chunks = [c.choices[0] for c in result if c.choices]
            assert "".join(c.text for c in chunks) == cut and chunks[-1].finish_reason == "stop"
        else:
            assert result.choices[0].text == cut and result.choices[0].finish_reason == "stop"


def wait_for(condition, seconds=30.0):
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


class Gated:
    """`app`'s decoding steps run only when the test lets them: `let(k)` lets k more steps run, `free()` lets every
    step run from then on. So what a test's client sees between two steps does not depend on the machine's speed
    or load (a fixed sleep per step did: a loaded machine ran out a 240-step request before the client asked)."""

    def __init__(self, app):
        self.app = app
        self.decoder = app.state.decoder
        self._permits = threading.Semaphore(0)
        self._free = threading.Event()
        step = self.decoder.batch.step

        def gated_step():
            while not self._free.is_set() and not self._permits.acquire(timeout=0.01):
                pass
            return step()

        self.decoder.batch.step = gated_step

    def let(self, steps: int) -> None:
        self._permits.release(steps)

    def free(self) -> None:
        self._free.set()

    def jobs(self) -> list:
        return list(self.decoder.running.values())

    def decoding(self) -> bool:
        """A job runs and has made a token."""
        return any(job.group.made for job in self.jobs())

    def cancelled(self) -> bool:
        """Every running job has been cancelled (its client went away) or has left already."""
        return all(job.group.cancelled for job in self.jobs())


def test_requests_sent_at_different_times_share_steps_and_equal_their_solo_results(models):
    pretrained = models["gpt2"]
    gate = Gated(create_app(pretrained, model_name="tiny"))
    try:
        with running(gate.app) as url:
            body = {"model": "tiny", "prompt": "the cat sat on the mat", "max_tokens": 200, "temperature": 0,
                    "stream": True}
            late = {}
            with httpx.Client(base_url=url, timeout=60) as http:
                with http.stream("POST", "/v1/completions", json=body) as first:
                    gate.let(2)
                    wait_for(gate.decoding)  # the first request has decoded 1 or 2 of its 200 steps
                    late_thread = threading.Thread(target=lambda: late.update(http.post("/v1/completions", json={
                        "model": "tiny", "prompt": ["a dog ran", "the old book by"], "max_tokens": 20,
                        "temperature": 0}).json()))
                    late_thread.start()
                    # its two prompts have been submitted (they join the running batch at the next step)
                    wait_for(lambda: len(gate.decoder.waiting) + len(gate.jobs()) == 3)
                    gate.free()
                    lines = list(first.iter_lines())
                    late_thread.join(60)
                metrics = http.get("/metrics").text
    finally:
        gate.free()
    events = [json.loads(line[6:]) for line in lines if line.startswith("data: {")]
    text = "".join(c["text"] for e in events for c in e["choices"])
    assert text == expected(pretrained, body["prompt"], max_new_tokens=200)[0][0]
    assert [c["text"] for c in late["choices"]] == [expected(pretrained, p, max_new_tokens=20)[0][0]
                                                     for p in ("a dog ran", "the old book by")]
    # some steps decoded the first request's row with the late request's two rows
    steps = metric_value(metrics, "bertology_decode_rows_count")
    at_most_two = metric_value(metrics, "bertology_decode_rows_bucket", {"le": "2.0"})
    assert steps > at_most_two


def test_a_client_that_disconnects_frees_its_row(models):
    pretrained = models["gpt2"]
    endless = load(pretrained.directory)
    endless.model.config.eos_token_id = None  # no EOS: a request runs its max_tokens unless it leaves
    gate = Gated(create_app(endless, model_name="tiny"))
    try:
        with running(gate.app) as url:
            body = {"model": "tiny", "prompt": "the cat", "max_tokens": 240, "temperature": 0.9, "seed": 1,
                    "stream": True}
            with httpx.Client(base_url=url, timeout=60) as http:
                with http.stream("POST", "/v1/completions", json=body) as response:
                    assert response.status_code == 200
                    gate.let(3)  # at most 3 of its 240 steps
                    wait_for(gate.decoding)
                    assert http.get("/health").json()["generation"]["rows"] == 1
                # the connection is closed: the request is cancelled, and its row leaves at the next step
                wait_for(gate.cancelled)
                gate.let(1)
                wait_for(lambda: http.get("/health").json()["generation"] == {"running": 0, "rows": 0, "waiting": 0})
                made = metric_value(http.get("/metrics").text, "bertology_generated_tokens_total")
                assert 1 <= made <= 3
                # a non-streamed request whose client goes away leaves too
                payload = json.dumps({**body, "stream": False}).encode()
                port = int(url.rsplit(":", 1)[1])
                with socket.create_connection(("127.0.0.1", port)) as raw:
                    raw.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                                b"Content-Length: %d\r\n\r\n%s" % (len(payload), payload))
                    gate.let(2)
                    wait_for(gate.decoding)
                wait_for(gate.cancelled)
                gate.let(1)
                wait_for(lambda: http.get("/health").json()["generation"]["rows"] == 0)
                # at most the 7 steps let run so far made tokens, of the 480 asked for
                assert metric_value(http.get("/metrics").text, "bertology_generated_tokens_total") <= 7
                # the service goes on: a whole request is answered in full
                gate.free()
                whole = http.post("/v1/completions", json={**body, "stream": False, "max_tokens": 30}).json()
                assert whole["usage"]["completion_tokens"] == 30 and whole["choices"][0]["finish_reason"] == "length"
    finally:
        gate.free()


BAD = [
    ({"n": 0}, "n"), ({"n": 129}, "n"), ({"max_tokens": 0}, "max_tokens"), ({"max_tokens": 300}, "max_tokens"),
    ({"temperature": 2.5}, "temperature"), ({"temperature": -1}, "temperature"), ({"top_p": 0}, "top_p"),
    ({"top_p": 1.5}, "top_p"), ({"stop": ["a", "b", "c", "d", "e"]}, "stop"), ({"stop": ""}, "stop"),
    ({"stop": ["x", ""]}, "stop[1]"), ({"logprobs": 6}, "logprobs"), ({"seed": -1}, "seed"),
    ({"echo": True}, "echo"), ({"best_of": 3}, "best_of"), ({"presence_penalty": 0.5}, "presence_penalty"),
    ({"prompt": []}, "prompt"), ({"prompt": ""}, "prompt"), ({"prompt": ["a", ""]}, "prompt[1]"),
    ({"prompt": [[1, 2], []]}, "prompt[1]"), ({"prompt": [5, 10**6]}, "prompt[0][1]"),
    ({"prompt": {"text": "a"}}, "prompt"), ({"n": "2"}, "n"), ({"stream": "yes"}, "stream"),
    ({"colour": "red"}, "colour"),
]


@pytest.mark.parametrize("change, param", BAD, ids=[p for _, p in BAD])
def test_bad_fields_are_400_in_openais_shape_naming_them(models, change, param):
    app = create_app(models["gpt2"], model_name="tiny", max_tokens=4000)
    from fastapi.testclient import TestClient

    with TestClient(app) as http:
        response = http.post("/v1/completions", json={"model": "tiny", "prompt": "the cat", **change})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error"
    assert param.split("[")[0] in error["message"]


def test_non_finite_sampling_settings_are_refused(models):
    from fastapi.testclient import TestClient

    with TestClient(create_app(models["gpt2"], model_name="tiny")) as http:
        for field in ("temperature", "top_p"):
            raw = '{{"model": "tiny", "prompt": "a", "{}": NaN}}'.format(field)
            response = http.post("/v1/completions", content=raw, headers={"Content-Type": "application/json"})
            assert response.status_code == 400 and response.json()["error"]["param"] == field, response.text


def test_the_work_is_bounded_by_max_tokens_and_the_model_must_generate(models, tiny_dir):
    from fastapi.testclient import TestClient

    with TestClient(create_app(models["gpt2"], model_name="tiny", max_tokens=100)) as http:
        over = http.post("/v1/completions", json={"model": "tiny", "prompt": "the cat", "max_tokens": 30, "n": 4})
        wrong = http.post("/v1/completions", json={"model": "other", "prompt": "the cat"})
    assert over.status_code == 413
    assert over.json()["error"]["param"] == "max_tokens" and "--max-tokens" in over.json()["error"]["message"]
    assert wrong.status_code == 404 and wrong.json()["error"]["code"] == "model_not_found"
    app = create_app(tiny_dir, model_name="bert")
    with running(app) as url:
        with pytest.raises(openai.APIStatusError) as caught:
            client(url).completions.create(model="bert", prompt="the cat")
    assert caught.value.status_code == 501 and "generates" in caught.value.message
