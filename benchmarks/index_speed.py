"""Index speed: build throughput and search latency of the faiss structures `bertology index build` makes, and the
build throughput of real-ish passages.

- `structures`: N synthetic unit vectors (384 dimensions, all-MiniLM-L6-v2's width; Gaussian, normalised, seed 0)
  built into each structure exactly as `Index.build` builds them (`bertology.retrieval.index`: exact IndexFlatIP,
  HNSW M 32 / efConstruction 200 / efSearch 128, IVF with 4 sqrt(N) cells (at most N / 39) and nprobe 16), the
  structure build alone timed (vectors/s); then `--queries` other synthetic unit vectors searched one at a time for
  their 10 best (latency p50 and p99, milliseconds) and the recall@10 of the approximate structures against the
  exact one (the share of exact search's top 10 they return). Build and search are timed twice: wall clock and the
  thread's CPU time (`time.thread_time`; faiss runs on the calling thread at one OpenMP thread), which a loaded
  machine inflates far less than the wall clock (a query waiting for a core counts in the wall time only). Random vectors in 384 dimensions have no cluster
  structure, the hard case for HNSW and IVF; real sentence vectors are easier. `--data clustered`: synthetic vectors
  around N / 100 random centres instead (`clustered_vectors`), an easy case. `--hnsw-m`, `--ef-construction`,
  `--nlist` change the build parameters; `--ef-sweep` / `--nprobe-sweep` add a row per search setting of the built
  HNSW / IVF structure.
- `passages`: passages of `--words` words cut from the Gutenberg books of ../shared/data (real text) indexed as
  `index build` does: the bm25 kind (bm25s's tokenising and scoring matrix) over `--bm25-passages`, and the dense
  kind (all-MiniLM-L6-v2's embedding plus the exact structure) over `--dense-passages`; passages/s of each.

    python benchmarks/index_speed.py --quick               # 2,000 vectors, 20 queries, 50 passages: checks the script
    python benchmarks/index_speed.py --sizes 10000 100000 [--skip hnsw@1000000 ...] [--threads 1] [--json OUT.json]

faiss and torch run on `--threads` threads (one by default: the shared machine's rule).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import GUTENBERG, machine_facts, minilm_dir  # noqa: E402

from bertology.retrieval import Index, SparseIndex, Structure  # noqa: E402
from bertology.retrieval.index import _build_faiss, _faiss  # noqa: E402

DIM = 384
STRUCTURES = ("exact", "hnsw", "ivf")


def unit_vectors(n: int, seed: int) -> np.ndarray:
    vectors = np.random.default_rng(seed).standard_normal((n, DIM), dtype=np.float32)
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


def clustered_vectors(n: int, seed: int, clusters: int) -> np.ndarray:
    """Unit vectors around `clusters` random unit centres (seed 0, shared by passages and queries): each a centre
    plus Gaussian noise of the centre's norm (N(0, 1/DIM) per coordinate), normalised, so a vector's cosine with its
    centre is about 0.71 and with another of its cluster about 0.5."""
    centres = unit_vectors(clusters, 0)
    rng = np.random.default_rng(seed + 1000)
    vectors = np.empty((n, DIM), dtype=np.float32)
    for start in range(0, n, 100_000):  # in chunks: the noise of 1M vectors at once would double the memory
        stop = min(n, start + 100_000)
        noise = rng.standard_normal((stop - start, DIM), dtype=np.float32) / np.float32(DIM ** 0.5)
        chunk = centres[rng.integers(0, clusters, stop - start)] + noise
        vectors[start:stop] = chunk / np.linalg.norm(chunk, axis=1, keepdims=True)
    return vectors


def sample(data: str, n: int, seed: int, clusters: int) -> np.ndarray:
    return unit_vectors(n, seed) if data == "random" else clustered_vectors(n, seed, clusters)


def timed_search(index, asked: np.ndarray, exact_top: np.ndarray, params=None) -> dict:
    """Each query searched alone for its top 10: wall and thread-CPU p50/p99 (ms), recall@10 against exact."""
    latencies, cpu_latencies, found = [], [], []
    for q in range(len(asked)):
        start, cpu = time.perf_counter(), time.thread_time()
        if params is None:
            _, rows_found = index.search(asked[q:q + 1], 10)
        else:
            _, rows_found = index.search(asked[q:q + 1], 10, params=params)
        latencies.append(time.perf_counter() - start)
        cpu_latencies.append(time.thread_time() - cpu)
        found.append(rows_found[0])
    recall = float(np.mean([len(set(a.tolist()) & set(b.tolist())) / 10 for a, b in zip(found, exact_top)]))
    return {"p50_ms": round(1000 * float(np.percentile(latencies, 50)), 3),
            "p99_ms": round(1000 * float(np.percentile(latencies, 99)), 3),
            "cpu_p50_ms": round(1000 * float(np.percentile(cpu_latencies, 50)), 3),
            "cpu_p99_ms": round(1000 * float(np.percentile(cpu_latencies, 99)), 3),
            "recall@10": round(recall, 4), "queries": len(asked)}


def structures(sizes: list[int], queries: int, skip: set[str], data: str = "random",
               overrides: dict | None = None, sweep: dict | None = None) -> list[dict]:
    """Rows of every structure at every size; `overrides` (keyword arguments of `Structure`, per kind) change the
    build parameters, `sweep` ({"hnsw": efSearch values, "ivf": nprobe values}) adds a row per search setting of
    the built structure."""
    faiss = _faiss()
    rows = []
    for n in sizes:
        clusters = max(1, n // 100)
        vectors = sample(data, n, 0, clusters)
        asked = sample(data, queries, 1, clusters)
        # exact search's top 10 for the recall of the others (one batched flat search, also when exact is skipped)
        flat, _ = _build_faiss(vectors, Structure("flat"))
        exact_top = flat.search(asked, 10)[1]
        del flat
        for kind in STRUCTURES:
            if f"{kind}@{n}" in skip:
                rows.append({"structure": kind, "vectors": n, "skipped": True})
                print(json.dumps(rows[-1]), file=sys.stderr)
                continue
            structure = Structure("flat" if kind == "exact" else kind, **(overrides or {}).get(kind, {}))
            start, cpu = time.perf_counter(), time.thread_time()
            index, parameters = _build_faiss(vectors, structure)
            build_s, build_cpu = time.perf_counter() - start, time.thread_time() - cpu
            parameters = {k: v for k, v in parameters.items() if k != "kind"}
            rows.append({"structure": kind, "vectors": n, "data": data, "parameters": parameters,
                         "build_s": round(build_s, 2), "vectors_per_s": round(n / build_s),
                         "build_cpu_s": round(build_cpu, 2), "vectors_per_cpu_s": round(n / max(build_cpu, 1e-9)),
                         **timed_search(index, asked, exact_top)})
            print(json.dumps(rows[-1]), file=sys.stderr)
            for value in (sweep or {}).get(kind, []):
                if kind == "ivf" and value > parameters["nlist"]:
                    continue
                params = (faiss.SearchParametersHNSW(efSearch=value) if kind == "hnsw"
                          else faiss.SearchParametersIVF(nprobe=value))
                setting = {"ef_search" if kind == "hnsw" else "nprobe": value}
                rows.append({"structure": kind, "vectors": n, "data": data, "parameters": {**parameters, **setting},
                             "sweep": True, **timed_search(index, asked, exact_top, params)})
                print(json.dumps(rows[-1]), file=sys.stderr)
            del index
    return rows


def gutenberg_passages(n: int, words: int) -> list[dict]:
    passages: list[dict] = []
    for book in sorted(GUTENBERG.glob("*.txt")):
        tokens = book.read_text(encoding="latin-1").split()
        for start in range(0, len(tokens) - words + 1, words):
            passages.append({"id": f"{book.stem}-{start // words}", "text": " ".join(tokens[start:start + words])})
            if len(passages) == n:
                return passages
    if len(passages) < n:
        raise SystemExit(f"the Gutenberg books hold only {len(passages)} passages of {words} words")
    return passages


def passages_rows(bm25_n: int, dense_n: int, words: int) -> list[dict]:
    rows = []
    from bertology.model import load

    passages = gutenberg_passages(max(bm25_n, dense_n), words)
    SparseIndex.build(passages[:5])  # bm25s imported and warmed before the clock
    start, cpu = time.perf_counter(), time.thread_time()
    SparseIndex.build(passages[:bm25_n])
    seconds, cpu = time.perf_counter() - start, time.thread_time() - cpu
    rows.append({"index": "bm25 (tokenise + score matrix)", "passages": bm25_n, "words": words,
                 "build_s": round(seconds, 2), "passages_per_s": round(bm25_n / seconds, 1),
                 "build_cpu_s": round(cpu, 2), "passages_per_cpu_s": round(bm25_n / max(cpu, 1e-9), 1)})
    print(json.dumps(rows[-1]), file=sys.stderr)
    directory = str(minilm_dir())
    pretrained = load(directory)  # the model is loaded before the clock
    Index.build(pretrained, passages[:2], model_dir=directory)
    start, cpu = time.perf_counter(), time.thread_time()
    Index.build(pretrained, passages[:dense_n], model_dir=directory)
    seconds, cpu = time.perf_counter() - start, time.thread_time() - cpu
    rows.append({"index": "dense, all-MiniLM-L6-v2 (embedding + exact structure)", "passages": dense_n,
                 "words": words, "build_s": round(seconds, 2), "passages_per_s": round(dense_n / seconds, 2),
                 "build_cpu_s": round(cpu, 2), "passages_per_cpu_s": round(dense_n / max(cpu, 1e-9), 2)})
    print(json.dumps(rows[-1]), file=sys.stderr)
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--phases", nargs="+", choices=("structures", "passages"), default=["structures", "passages"])
    parser.add_argument("--sizes", nargs="+", type=int, default=[10_000, 100_000])
    parser.add_argument("--queries", type=int, default=1000)
    parser.add_argument("--skip", nargs="*", default=[], help="STRUCTURE@SIZE pairs not to build (e.g. hnsw@1000000)")
    parser.add_argument("--data", choices=("random", "clustered"), default="random",
                        help="synthetic vectors: Gaussian (no structure), or around N / 100 random centres")
    parser.add_argument("--hnsw-m", type=int, default=None)
    parser.add_argument("--ef-construction", type=int, default=None)
    parser.add_argument("--nlist", type=int, default=None)
    parser.add_argument("--ef-sweep", nargs="*", type=int, default=[], help="efSearch values to search HNSW with")
    parser.add_argument("--nprobe-sweep", nargs="*", type=int, default=[], help="nprobe values to search IVF with")
    parser.add_argument("--bm25-passages", type=int, default=10_000)
    parser.add_argument("--dense-passages", type=int, default=1_000)
    parser.add_argument("--words", type=int, default=100)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.quick:
        args.sizes, args.queries, args.bm25_passages, args.dense_passages = [2000], 20, 50, 10
        args.ef_sweep, args.nprobe_sweep = args.ef_sweep or [16], args.nprobe_sweep or [4]
    overrides = {"hnsw": {k: v for k, v in (("hnsw_m", args.hnsw_m), ("ef_construction", args.ef_construction))
                          if v is not None},
                 "ivf": {"nlist": args.nlist} if args.nlist is not None else {}}
    torch.set_num_threads(args.threads)
    _faiss().omp_set_num_threads(args.threads)
    facts = machine_facts(args.threads)
    print(f"{facts}", file=sys.stderr)
    result: dict = {"machine": facts}
    if "structures" in args.phases:
        result["structures"] = structures(args.sizes, args.queries, set(args.skip), args.data, overrides,
                                          {"hnsw": args.ef_sweep, "ivf": args.nprobe_sweep})
        print("| structure | vectors | data | parameters | recall@10 vs exact | build CPU s | vectors per CPU s "
              "| CPU p50 ms | CPU p99 ms | build wall s | wall p50 ms | wall p99 ms |")
        print("|---|---|---|---|---|---|---|---|---|---|---|---|")
        for r in result["structures"]:
            if r.get("skipped"):
                print(f"| {r['structure']} | {r['vectors']} | {args.data} | - | skipped | - | - | - | - | - | - | - |")
                continue
            built = ("(the build above)", "-", "-") if r.get("sweep") else (
                r["build_cpu_s"], r["vectors_per_cpu_s"], r["build_s"])
            setting = ", ".join(f"{k} {v}" for k, v in r["parameters"].items())
            print(f"| {r['structure']} | {r['vectors']} | {r['data']} | {setting or '-'} | {r['recall@10']} | "
                  f"{built[0]} | {built[1]} | {r['cpu_p50_ms']} | {r['cpu_p99_ms']} | {built[2]} | "
                  f"{r['p50_ms']} | {r['p99_ms']} |")
    if "passages" in args.phases:
        result["passages"] = passages_rows(args.bm25_passages, args.dense_passages, args.words)
        print()
        print("| index | passages | build CPU s | passages per CPU s | build wall s | passages/s (wall) |")
        print("|---|---|---|---|---|---|")
        for r in result["passages"]:
            print(f"| {r['index']} | {r['passages']} | {r['build_cpu_s']} | {r['passages_per_cpu_s']} | "
                  f"{r['build_s']} | {r['passages_per_s']} |")
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
