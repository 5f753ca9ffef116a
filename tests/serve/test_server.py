"""`bertology serve` as a real uvicorn process on 127.0.0.1 (a free port): concurrent requests, a streamed body
over the limit, and graceful shutdown (SIGTERM while requests are in flight: all are answered, then it exits)."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time

import httpx
import numpy as np
import pytest

from bertology import embed
from bertology.model import load
from bertology.serve.metrics import metric_value

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="SIGTERM semantics are POSIX")
START_TIMEOUT = 90.0  # seconds for the process to import torch and load the model on a busy machine


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def refused_when_closed(url: str, seconds: float = 30.0) -> None:
    """Wait until the server's listening socket is closed: a new connection is refused (a generous deadline that
    fails loudly, not a fixed sleep that a loaded server might not have closed it within)."""
    deadline = time.monotonic() + seconds
    async with httpx.AsyncClient(timeout=5.0) as fresh:
        while True:
            try:
                await fresh.get(f"{url}/health")
            except httpx.ConnectError:
                return
            assert time.monotonic() < deadline, f"the server still took new connections {seconds} s after SIGTERM"
            await asyncio.sleep(0.02)


def start_server(model_dir, port: int, *extra: str) -> subprocess.Popen:
    process = subprocess.Popen(
        [sys.executable, "-m", "bertology.cli.main", "serve", "--model", str(model_dir), "--port", str(port),
         "--threads", "1", "--log-level", "warning", *extra],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"the server exited with {process.returncode}: {process.stdout.read().decode()}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1.0).status_code == 200:
                return process
        except httpx.TransportError:
            time.sleep(0.1)
    process.kill()
    raise AssertionError(f"the server did not answer /health within {START_TIMEOUT} s")


def serving(tiny_dir, max_wait_ms: int = 3000):
    port = free_port()
    process = start_server(tiny_dir, port, "--max-wait-ms", str(max_wait_ms), "--max-body-bytes", "4096")
    yield process, f"http://127.0.0.1:{port}"
    if process.poll() is None:
        process.kill()
        process.wait(timeout=10)


@pytest.fixture(scope="module")
def server(tiny_dir):
    """One server for the module's tests that leave it running (starting one costs seconds)."""
    yield from serving(tiny_dir)


@pytest.fixture
def own_server(tiny_dir):
    """A server of its own for the test that ends it, so that the others pass in any order; its requests wait the
    longest a batch may wait for them, so that SIGTERM comes while they do on any machine."""
    yield from serving(tiny_dir, max_wait_ms=10_000)


def test_streamed_body_over_the_limit_is_413(server):
    _, url = server

    def chunks():
        yield b'{"texts": ["'
        for _ in range(10):
            yield b"a" * 1000  # 10 kB in chunks, no Content-Length
        yield b'"]}'

    response = httpx.post(f"{url}/v1/embed", content=chunks(), headers={"content-type": "application/json"},
                          timeout=30)
    assert response.status_code == 413
    assert response.json() == {"detail": "the request body passed 4096 bytes (--max-body-bytes)"}
    declared = httpx.post(f"{url}/v1/embed", content=b"x" * 5000, headers={"content-type": "application/json"},
                          timeout=30)
    assert declared.status_code == 413
    assert declared.json() == {"detail": "the request body is 5000 bytes; the limit is 4096 (--max-body-bytes)"}
    assert httpx.get(f"{url}/health", timeout=10).status_code == 200  # the server carries on


def non_loopback_address() -> str | None:
    """An IPv4 address of this machine other than loopback (the route a datagram would take; none is sent)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("10.255.255.255", 1))
            address = s.getsockname()[0]
    except OSError:
        return None
    return None if address.startswith("127.") or address == "0.0.0.0" else address


def test_it_listens_on_loopback_only_by_default(server):
    _, url = server
    address = non_loopback_address()
    if address is None:
        pytest.skip("this machine has no non-loopback IPv4 address to try")
    port = url.rsplit(":", 1)[1]
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"http://{address}:{port}/health", timeout=5)
    assert httpx.get(f"{url}/health", timeout=10).status_code == 200


def test_sigterm_answers_every_request_in_flight_then_exits(own_server, tiny_dir):
    """Requests wait up to 10 s (the longest --max-wait-ms) for a batch; SIGTERM arrives while all of them wait:
    the listening socket closes (a new connection is refused), every waiting request is answered with its correct
    vectors, then the process exits. The requests still waiting are counted when the signal is sent (not 0.5 s
    after it), and the window is the longest allowed, so that a loaded machine does not batch them first."""
    process, url = own_server
    texts = [[f"the cat sat on the mat {'.' * (i % 3)}", "a dog ran"] for i in range(12)]

    async def scenario():
        limits = httpx.Limits(max_connections=32)
        async with httpx.AsyncClient(base_url=url, timeout=60.0, limits=limits) as client:
            tasks = [asyncio.create_task(client.post("/v1/embed", json={"texts": t})) for t in texts]
            deadline = time.monotonic() + 30
            while True:  # until all 12 are being served (the /metrics request itself is the 13th)
                exposition = (await client.get("/metrics")).text
                if metric_value(exposition, "bertology_requests_in_flight") >= len(texts) + 1:
                    break
                assert time.monotonic() < deadline, "the requests never got in flight"
                await asyncio.sleep(0.02)
            pending = sum(not task.done() for task in tasks)
            process.send_signal(signal.SIGTERM)
            await refused_when_closed(url)
            return pending, await asyncio.gather(*tasks)

    pending, responses = asyncio.run(scenario())
    assert pending == len(texts), "the requests should still have been waiting for their batch"
    pretrained = load(tiny_dir)
    for request_texts, response in zip(texts, responses):
        assert response.status_code == 200, response.text
        np.testing.assert_allclose(response.json()["vectors"], embed(pretrained, request_texts).sentences,
                                   atol=1e-5, rtol=0)
    # uvicorn (0.29 and later) re-raises the signal it handled once it has drained, so the exit status is
    # SIGTERM's (systemd and Kubernetes count that as a clean stop); earlier versions exit 0.
    assert process.wait(timeout=30) in (-signal.SIGTERM, 0)
    log = process.stdout.read().decode()
    assert "Traceback" not in log, log


def test_sigterm_drains_streamed_completions(tmp_path):
    """Eight streamed completions are running when SIGTERM arrives: new connections are refused, each stream runs
    to its end (generate's greedy text, then data: [DONE]), then the process exits."""
    pytest.importorskip("transformers")
    import json

    import torch

    from bertology import generate
    from finetune_helpers import save_family_model

    texts = ["the cat sat on the mat", "a dog ran in the park", "the old book by the window"] * 4
    model_dir = save_family_model(tmp_path / "gpt2", "gpt2", texts, positions=256)
    port = free_port()
    process = start_server(model_dir, port)
    url = f"http://127.0.0.1:{port}"
    prompts = [f"the cat sat {'on the mat ' * (i % 3)}" for i in range(8)]
    name = httpx.get(f"{url}/v1/models", timeout=10).json()["data"][0]["id"]

    async def one(client, prompt, started):
        text, done = "", False
        async with client.stream("POST", "/v1/completions", json={
                "model": name, "prompt": prompt, "max_tokens": 200, "temperature": 0,
                "stream": True}) as response:
            assert response.status_code == 200, await response.aread()
            async for line in response.aiter_lines():
                started.set()
                if line == "data: [DONE]":
                    done = True
                elif line.startswith("data: "):
                    text += "".join(c["text"] for c in json.loads(line[6:])["choices"])
        return text, done

    async def scenario():
        async with httpx.AsyncClient(base_url=url, timeout=120.0, limits=httpx.Limits(max_connections=16)) as client:
            events = [asyncio.Event() for _ in prompts]
            tasks = [asyncio.create_task(one(client, p, e)) for p, e in zip(prompts, events)]
            await asyncio.wait_for(asyncio.gather(*(e.wait() for e in events)), 60)
            assert not any(task.done() and task.exception() for task in tasks)
            running = sum(not task.done() for task in tasks)
            process.send_signal(signal.SIGTERM)
            await refused_when_closed(url)
            return running, await asyncio.gather(*tasks)

    try:
        running, results = asyncio.run(scenario())
    except BaseException:
        process.kill()
        raise
    pretrained = load(model_dir)
    eos = pretrained.model.config.eos_token_id
    for prompt, (text, done) in zip(prompts, results):
        ids = torch.tensor([pretrained.tokenizer.encode(prompt).ids])
        new = generate(pretrained.model, ids, torch.ones_like(ids), max_new_tokens=200)[0, ids.shape[1]:].tolist()
        assert done and text == pretrained.tokenizer.decode(new[:new.index(eos)] if eos in new else new)
    assert running > 0, "the streams should still have been running when SIGTERM came"
    assert process.wait(timeout=60) in (-signal.SIGTERM, 0)
    log = process.stdout.read().decode()
    assert "Traceback" not in log, log
