"""Retrieval on the held-out articles of SQuAD v1.1 dev part A: the dev questions of the split by article that
`finetune --task squad` and `finetune --task retrieval` take (6 of the 24 articles), each searched against all
1,023 paragraphs of the file.

For each model given (all-MiniLM-L6-v2 by default, and any `--model DIR`, e.g. a `finetune --task retrieval` run's
model): the dense index as `bertology index build` makes it (the model's own embedding options), BM25 (the `bm25`
index kind: bm25s, k1 1.5, b 0.75, English stop words), and the two hybrids of the dense index with BM25
(reciprocal rank fusion, k 60; min-max interpolation, weight 0.5; each over the first 100 of both). Every ranking
is scored by `bertology.retrieval.recall_at_k` (DPR's answer match or the own paragraph; MRR@10).

    python benchmarks/retrieval_split.py --quick     # 20 questions, a few paragraphs: checks the script
    python benchmarks/retrieval_split.py [--model DIR ...] [--no-minilm] [--rerank DIR --rerank-depth 5]
                                         [--threads 1] [--json OUT.json]

--rerank re-scores the best first stage's (by MRR@10) top --rerank-depth with a `finetune --task rerank` model: by
its score alone (monoBERT), and by its score interpolated with the first stage's (each min-max normalised over the
reranked passages, weight 0.5, the interpolated hybrid's rule; not tuned).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import bertology as _openmp_policy  # noqa: F401  (before torch: it sets OpenMP's passive waiting, read when torch loads)

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import DATA, machine_facts, minilm_dir  # noqa: E402

from bertology.model import load  # noqa: E402
from bertology.retrieval import (  # noqa: E402
    Fusion,
    Index,
    SparseIndex,
    fuse,
    recall_at_k,
    squad_passages,
    squad_questions,
)

SQUAD = DATA / "squad" / "squad-v1.1-dev-part-a.json"
KS = (1, 5, 20, 100)
FUSIONS = {"hybrid RRF (k 60)": Fusion("rrf", rrf_k=60), "hybrid interpolated (weight 0.5)": Fusion("interpolate")}


def row(name: str, questions, passages, rows: np.ndarray, seconds: dict[str, float]) -> dict:
    scores = recall_at_k(questions, passages, [[r for r in rw if r >= 0] for rw in rows.tolist()], KS)
    return {"system": name, **{f"recall@{k}": round(scores.recall[k], 2) for k in KS},
            "mrr@10": round(scores.mrr, 2), **{f"paragraph@{k}": round(scores.paragraph_recall[k], 2) for k in KS},
            **{key: round(value, 1) for key, value in seconds.items()}}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", action="append", default=[], help="a model directory to measure (repeatable)")
    parser.add_argument("--no-minilm", action="store_true", help="leave untrained all-MiniLM-L6-v2 out")
    parser.add_argument("--rerank", default=None, help="a reranker directory (finetune --task rerank)")
    parser.add_argument("--rerank-depth", type=int, default=5)
    parser.add_argument("--save-rankings", type=Path, default=None,
                        help="write every system's first 100 rows and its row here (.npz + .json), for --rankings")
    parser.add_argument("--rankings", type=Path, default=None,
                        help="rerank only: the first stages saved by --save-rankings instead of computing them")
    parser.add_argument("--quick", action="store_true",
                        help="the first 20 dev questions against their paragraphs and the file's first 10: seconds")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", type=Path, default=None, help="write the rows here too")
    args = parser.parse_args(argv)
    if not SQUAD.is_file():
        raise SystemExit(f"{SQUAD} not found (../shared/data is absent)")
    torch.set_num_threads(args.threads)
    passages = squad_passages(SQUAD)
    questions = squad_questions(SQUAD, "dev")
    if args.quick:
        questions = questions[:20]
        kept = {q.context for q in questions} | {p.text for p in passages[:10]}
        passages = [p for p in passages if p.text in kept]
    texts = [q.question for q in questions]
    print(f"{len(questions)} dev questions, {len(passages)} paragraphs; {machine_facts(args.threads)}",
          file=sys.stderr)
    if args.rankings is not None:
        saved = json.loads(args.rankings.with_suffix(".json").read_text())
        arrays = np.load(args.rankings.with_suffix(".npz"))
        rows = saved["rows"]
        rankings = {r["system"]: (None, arrays[f"system_{i}"]) for i, r in enumerate(rows)}
        return finish(args, questions, passages, texts, rows, rankings)
    start = time.perf_counter()
    sparse = SparseIndex.build(passages)
    build_s = time.perf_counter() - start
    start = time.perf_counter()
    bm25 = sparse.rank(texts, max(KS))
    rows = [row("BM25 (bm25 index kind)", questions, passages, bm25[1], {"index_s": build_s,
                                                                          "search_s": time.perf_counter() - start})]
    rankings = {rows[-1]["system"]: bm25}
    print(json.dumps(rows[-1]), file=sys.stderr)
    models = ([("all-MiniLM-L6-v2, untrained", str(minilm_dir()))] if not args.no_minilm else []) + \
        [(f"trained: {directory}", directory) for directory in args.model]
    for name, directory in models:
        pretrained = load(directory)
        start = time.perf_counter()
        dense = Index.build(pretrained, passages, model_dir=directory)
        build_s = time.perf_counter() - start
        start = time.perf_counter()
        vectors = dense.encode(texts)
        queries_s = time.perf_counter() - start
        first = dense.search_vectors(vectors, max(KS))
        rows.append(row(name, questions, passages, first[1], {"index_s": build_s, "queries_s": queries_s}))
        rankings[rows[-1]["system"]] = first
        print(json.dumps(rows[-1]), file=sys.stderr)
        for label, fusion in FUSIONS.items():
            scores, fused = fuse(first, bm25, fusion, max(KS))
            rows.append(row(f"{name} + BM25, {label}", questions, passages, fused, {}))
            rankings[rows[-1]["system"]] = (scores, fused)
            print(json.dumps(rows[-1]), file=sys.stderr)
    if args.save_rankings is not None:
        np.savez(args.save_rankings.with_suffix(".npz"),
                 **{f"system_{i}": np.asarray(rankings[r["system"]][1]) for i, r in enumerate(rows)})
        args.save_rankings.with_suffix(".json").write_text(json.dumps({"rows": rows}, indent=2) + "\n")
    finish(args, questions, passages, texts, rows, rankings)


def finish(args, questions, passages, texts, rows, rankings) -> None:
    if args.rerank is not None:
        from bertology.retrieval.hybrid import _normalised as minmax  # the interpolated hybrid's own rule
        from bertology.retrieval.rerank import Reranker

        best = max(rows, key=lambda r: r["mrr@10"])["system"]
        reranker = Reranker.load(args.rerank)
        start = time.perf_counter()
        first_scores, first_rows = rankings[best]
        ranked, mixed = first_rows.copy(), first_rows.copy()
        for i, question in enumerate(texts):
            head = [int(r) for r in first_rows[i, :args.rerank_depth]]
            scores = reranker.score(question, [passages[r].text for r in head])
            order = np.argsort(-scores, kind="stable")
            ranked[i, :len(head)] = [head[j] for j in order.tolist()]
            if first_scores is not None:  # the reranker's and the first stage's scores, each min-max normalised
                both = 0.5 * minmax(scores) + 0.5 * minmax(np.asarray(first_scores[i, :len(head)], dtype=np.float64))
                mixed[i, :len(head)] = [head[j] for j in np.argsort(-both, kind="stable").tolist()]
        seconds = {"rerank_s": time.perf_counter() - start}
        rows.append(row(f"{best}, reranked (top {args.rerank_depth}) by {args.rerank}", questions, passages, ranked,
                        seconds))
        print(json.dumps(rows[-1]), file=sys.stderr)
        if first_scores is not None:
            rows.append(row(f"{best}, reranked (top {args.rerank_depth}) by {args.rerank}, interpolated with the "
                            f"first stage (weight 0.5)", questions, passages, mixed, {}))
            print(json.dumps(rows[-1]), file=sys.stderr)
    keys = ["system", *(f"recall@{k}" for k in KS), "mrr@10", *(f"paragraph@{k}" for k in KS)]
    print("| " + " | ".join(keys) + " |")
    print("|" + "---|" * len(keys))
    for r in rows:
        print("| " + " | ".join(str(r.get(k, "-")) for k in keys) + " |")
    if args.json is not None:
        args.json.write_text(json.dumps({"machine": machine_facts(args.threads), "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
