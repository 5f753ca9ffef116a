"""Open-domain extractive QA on the held-out articles of SQuAD v1.1 dev part A: the dev questions of the split by
article (`finetune --task squad`'s), each question's k passages retrieved from all 1,023 paragraphs of the file, the
SQuAD reader (`finetune --task squad`) over each, the answer chosen as `evaluate --task open-qa` chooses it
(`bertology.retrieval.open_qa`: the same `Reader` and `choose`), scored by the official SQuAD v1.1 EM/F1.

Systems: BM25 (the `bm25` index kind), the dense index of untrained all-MiniLM-L6-v2 (its own embedding options) and
of each `--model DIR` (a `finetune --task retrieval` run's model: bertology's defaults), each dense index's hybrid with
BM25 by interpolation (weight 0.5, over the first 100 of both; the better fusion in docs/RETRIEVAL.md) and by RRF
with `--rrf`, and with `--rerank DIR` the first hybrid of the last model re-scored by the cross-encoder over its top
`--rerank-depth` (recall@1/k before and after; EM/F1 with the reader's selection and with the reranker's). The
reader on each question's own paragraph (k = 1, the gold passage) is the ceiling. A (question, passage) pair read for
one system is not read again for another (the reader is deterministic), so the systems share the reader's work.

    python benchmarks/open_qa.py --quick                         # 10 questions, an untrained qa head: checks the script
    python benchmarks/open_qa.py --reader runs/reader/model [--model runs/dpr/model ...] [--rerank runs/rerank/model]
        [--k 3] [--questions 200 | --sample 300 --seed 0] [--shard 0/2] [--index-cache runs/] [--threads 1]
        [--json OUT.json]
    python benchmarks/open_qa.py --combine OUT-0.json OUT-1.json     # the table of several shards' questions

`--questions N` keeps the first N held-out questions (file order), `--sample N --seed S` a random N of them (Python's
`random.Random(S).sample`, kept in file order); `--shard I/N` then keeps every N-th of those from the I-th, so N
one-thread processes can share a run, and `--combine` merges their `--json` files into the table of all their
questions (EM/F1 and hits summed over the shards before the percentages are taken; each system over the shards
that ran it, with its number of questions). Recall is given at 1, k and 5
(the reader reads the first k; the reranked rows' first 5 are the reranker's order of its depth); `--index-cache DIR` saves each dense index there
and loads it on the next run (the paragraphs are embedded once per model); `--recall-only` measures the retrieval
(recall@1 and recall@k, the reranker's included) without a reader.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

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
from bertology.retrieval.open_qa import Reader, choose  # noqa: E402
from bertology.tasks.metrics import squad_v1  # noqa: E402

SQUAD = DATA / "squad" / "squad-v1.1-dev-part-a.json"
FIRST = 100  # each retriever's depth under fusion
RECALL_DEPTH = 5  # recall is reported at 1, k and 5


class Cached:
    """The reader's candidate for each (question, passage row), read once."""

    def __init__(self, reader: Reader, texts: list[str], passages) -> None:
        self.reader, self.texts, self.passages = reader, texts, passages
        self.done: dict[tuple[int, int], object] = {}
        self.read_s = 0.0
        self.pairs = 0

    def candidates(self, rows: list[list[int]]) -> list[list[object]]:
        missing = [[r for r in row if (q, r) not in self.done] for q, row in enumerate(rows)]
        if any(missing):
            start = time.perf_counter()
            read = self.reader.read(self.texts, [[self.passages[r].text for r in row] for row in missing])
            self.read_s += time.perf_counter() - start
            for q, (row, found) in enumerate(zip(missing, read)):
                for r, candidate in zip(row, found):
                    self.done[(q, r)] = candidate
                self.pairs += len(row)
        return [[self.done[(q, r)] for r in row] for q, row in enumerate(rows)]


def answers(cache: Cached, rows: list[list[int]], selection: str = "reader", scores=None) -> list[str]:
    out = []
    for q, candidates in enumerate(cache.candidates(rows)):
        # the candidates of one pair were read at another rank: choose by this system's order
        candidates = [type(c)(c.text, c.span, c.span_log_prob, rank) for rank, c in enumerate(candidates)]
        best = choose(candidates, selection, None if scores is None else scores[q])
        out.append("" if best is None else best.text)
    return out


def recall_ks(k: int) -> list[int]:
    return sorted({1, k, RECALL_DEPTH})


def score_row(name: str, questions, passages, rows: list[list[int]], predicted: list[str], k: int) -> dict:
    official = squad_v1([(q.id, [a.text for a in q.answers]) for q in questions],
                        {q.id: p for q, p in zip(questions, predicted)})
    ks = [j for j in recall_ks(k) if j <= max(len(row) for row in rows)]
    recall = recall_at_k(questions, passages, rows, ks)
    n = len(questions)
    # the sums behind the percentages, for --combine
    sums = {"questions": n, "em_sum": official.exact_match * n / 100, "f1_sum": official.f1 * n / 100,
            "hits": {str(j): round(recall.recall[j] * n / 100) for j in ks}}
    return {"system": name, **{f"recall@{j}": round(recall.recall[j], 2) for j in ks},
            "exact_match": round(official.exact_match, 2), "f1": round(official.f1, 2), "sums": sums}


def combine(files: list[Path]) -> None:
    runs = [json.loads(f.read_text()) for f in files]
    ks = {r["k"] for r in runs}
    if len(ks) != 1:
        raise SystemExit("--combine: the files differ in k")
    k = ks.pop()
    merged: dict[str, list[dict]] = {}  # a system's rows over the shards that ran it (a run with --rerank has more)
    for run in runs:
        for row in run["rows"]:
            merged.setdefault(row["system"], []).append(row)
    table = []
    for system, rows in merged.items():
        n = sum(row["sums"]["questions"] for row in rows)
        out = {"system": system}
        for j in rows[0]["sums"]["hits"]:
            out[f"recall@{j}"] = round(100 * sum(row["sums"]["hits"][j] for row in rows) / n, 2)
        if all(row["exact_match"] != "-" for row in rows):
            out["exact_match"] = round(100 * sum(row["sums"]["em_sum"] for row in rows) / n, 2)
            out["f1"] = round(100 * sum(row["sums"]["f1_sum"] for row in rows) / n, 2)
        out["questions"] = n
        out["shards"] = len(rows)
        table.append(out)
    print(f"{len(files)} shards, k {k}", file=sys.stderr)
    print_table(table, k, extra=("questions", "shards"))


def print_table(table: list[dict], k: int, extra: tuple[str, ...] = ()) -> None:
    keys = ["system", *(f"recall@{j}" for j in recall_ks(k)), "exact_match", "f1", *extra]
    print("| " + " | ".join(keys) + " |")
    print("|" + "---|" * len(keys))
    for r in table:
        print("| " + " | ".join(str(r.get(key, "-")) for key in keys) + " |")


def dense_index(name: str, directory: str, passages, cache: Path | None) -> Index:
    if cache is not None and (cache / name / "index.json").is_file():
        return Index.load(cache / name, model=directory)
    index = Index.build(load(directory), passages, model_dir=directory)
    if cache is not None:
        index.save(cache / name)
    return index


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reader", default=None, help="the reader (finetune --task squad's model directory)")
    parser.add_argument("--model", action="append", default=[], help="a trained retriever's model (repeatable)")
    parser.add_argument("--rerank", default=None, help="a reranker directory (finetune --task rerank)")
    parser.add_argument("--rerank-depth", type=int, default=10)
    parser.add_argument("--rrf", action="store_true", help="the RRF hybrids too")
    parser.add_argument("--k", type=int, default=3, help="passages read per question")
    parser.add_argument("--questions", type=int, default=None, help="the first N held-out questions only")
    parser.add_argument("--sample", type=int, default=None, help="a random N of the held-out questions")
    parser.add_argument("--seed", type=int, default=0, help="--sample's seed")
    parser.add_argument("--shard", default=None, help="I/N: every N-th question of the run from the I-th")
    parser.add_argument("--combine", type=Path, nargs="+", default=None,
                        help="merge these --json files (shards of one run) into one table; nothing is run")
    parser.add_argument("--max-length", type=int, default=256, help="the reader's windows")
    parser.add_argument("--index-cache", type=Path, default=None)
    parser.add_argument("--quick", action="store_true",
                        help="10 questions against their paragraphs and the file's first 10, an untrained qa head")
    parser.add_argument("--recall-only", action="store_true",
                        help="retrieval only (recall@1 and @k of each system, the reranker's included): no reader")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", type=Path, default=None, help="write the rows here too")
    args = parser.parse_args(argv)
    if args.combine is not None:
        combine(args.combine)
        return
    if args.questions is not None and args.sample is not None:
        parser.error("--questions and --sample exclude each other")
    if not SQUAD.is_file():
        raise SystemExit(f"{SQUAD} not found (../shared/data is absent)")
    torch.set_num_threads(args.threads)
    passages = squad_passages(SQUAD)
    questions = squad_questions(SQUAD, "dev")
    if args.questions is not None:
        questions = questions[:args.questions]
    if args.sample is not None:
        if not 0 < args.sample <= len(questions):
            parser.error(f"--sample {args.sample}: there are {len(questions)} held-out questions")
        kept = sorted(random.Random(args.seed).sample(range(len(questions)), args.sample))
        questions = [questions[i] for i in kept]
    if args.shard is not None:
        try:
            shard, shards = (int(x) for x in args.shard.split("/"))
        except ValueError:
            parser.error(f"--shard {args.shard!r}: give I/N")
        if not 0 <= shard < shards:
            parser.error(f"--shard {args.shard}: I must be in 0..N-1")
        questions = questions[shard::shards]
    if args.quick:
        questions = questions[:10]
        kept = {q.context for q in questions} | {p.text for p in passages[:10]}
        passages = [p for p in passages if p.text in kept]
    if args.recall_only:
        reader = None
    elif args.reader is not None:
        reader = Reader.load(args.reader, max_length=args.max_length)
    elif args.quick:
        from bertology.tasks.qa import qa_head

        torch.manual_seed(0)
        pretrained = load(minilm_dir())
        pretrained.model.init_heads([qa_head(pretrained.model.config)])
        reader = Reader(pretrained, "all-MiniLM-L6-v2 with an untrained qa head", max_length=args.max_length)
    else:
        raise SystemExit("--reader DIR is required (or --quick, or --recall-only)")
    texts = [q.question for q in questions]
    print(f"{len(questions)} held-out questions, {len(passages)} paragraphs, k {args.k}; "
          f"{machine_facts(args.threads)}", file=sys.stderr)
    cache = Cached(reader, texts, passages)
    k = args.k
    table: list[dict] = []

    def add(name, rows, selection="reader", scores=None, **extra):
        # rows: each question's first max(k, 5) passages (for recall); the reader reads the first k
        rows = [[int(r) for r in row if r >= 0] for row in rows]
        if args.recall_only:
            if selection != "reader":
                return
            row = score_row(name, questions, passages, rows, [""] * len(rows), k)
            row.update(exact_match="-", f1="-")
        else:
            read = [row[:k] for row in rows]
            row = score_row(name, questions, passages, rows,
                            answers(cache, read, selection, None if scores is None else [s[:k] for s in scores]), k)
        table.append({**row, **extra, "pairs_read": cache.pairs, "read_s": round(cache.read_s, 1)})
        print(json.dumps(table[-1]), file=sys.stderr)

    own = {p.text: i for i, p in enumerate(passages)}
    if not args.recall_only:
        add("reader on the gold paragraph (the ceiling)", [[own[q.context]] for q in questions])
    sparse = SparseIndex.build(passages)
    bm25 = sparse.rank(texts, FIRST)
    depth = max(k, RECALL_DEPTH)
    add("BM25", bm25[1][:, :depth])
    models = [("all-MiniLM-L6-v2, untrained", str(minilm_dir()))] + \
        [(f"trained: {directory}", directory) for directory in args.model]
    hybrid = None
    for n, (name, directory) in enumerate(models):
        index = dense_index(f"openqa-dense-{n}" if not args.quick else f"openqa-quick-{n}", directory, passages,
                            args.index_cache)
        first = index.rank(texts, FIRST)
        add(name, first[1][:, :depth])
        fusions = [("interpolated (weight 0.5)", Fusion("interpolate"))] + \
            ([("RRF (k 60)", Fusion("rrf", rrf_k=60))] if args.rrf else [])
        for label, fusion in fusions:
            fused = fuse(first, bm25, fusion, FIRST)
            add(f"{name} + BM25, {label}", fused[1][:, :depth])
            if label.startswith("interpolated"):
                hybrid = (f"{name} + BM25, {label}", fused)
    if args.rerank is not None and hybrid is not None:
        from bertology.retrieval.rerank import Reranker

        name, (_, ranked) = hybrid
        reranker = Reranker.load(args.rerank)
        rerank_depth = max(args.rerank_depth, depth)
        start = time.perf_counter()
        rows, scores = [], []
        for question, ranking in zip(texts, ranked):
            head = [int(r) for r in ranking[:rerank_depth]]
            relevance = reranker.score(question, [passages[r].text for r in head])
            order = np.argsort(-relevance, kind="stable")[:depth]
            rows.append([head[j] for j in order.tolist()])
            scores.append([float(relevance[j]) for j in order.tolist()])
        rerank_s = round(time.perf_counter() - start, 1)
        label = f"{name}, reranked (top {rerank_depth})"
        add(f"{label}, reader's selection", rows, rerank_s=rerank_s)
        add(f"{label}, reranker's selection", rows, "reranker", scores)
    print_table(table, k)
    if args.json is not None:
        args.json.write_text(json.dumps({"machine": machine_facts(args.threads), "k": k,
                                         "questions": len(questions), "rows": table}, indent=2) + "\n")


if __name__ == "__main__":
    main()
