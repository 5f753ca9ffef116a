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
        [--k 3] [--questions 200] [--index-cache runs/] [--threads 1] [--json OUT.json]

`--questions N` keeps the first N held-out questions (file order); `--index-cache DIR` saves each dense index there
and loads it on the next run (the paragraphs are embedded once per model); `--recall-only` measures the retrieval
(recall@1 and recall@k, the reranker's included) without a reader.
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


def score_row(name: str, questions, passages, rows: list[list[int]], predicted: list[str], k: int) -> dict:
    official = squad_v1([(q.id, [a.text for a in q.answers]) for q in questions],
                        {q.id: p for q, p in zip(questions, predicted)})
    ks = sorted({1, k})
    recall = recall_at_k(questions, passages, rows, ks)
    return {"system": name, **{f"recall@{j}": round(recall.recall[j], 2) for j in ks},
            "exact_match": round(official.exact_match, 2), "f1": round(official.f1, 2)}


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
    parser.add_argument("--max-length", type=int, default=256, help="the reader's windows")
    parser.add_argument("--index-cache", type=Path, default=None)
    parser.add_argument("--quick", action="store_true",
                        help="10 questions against their paragraphs and the file's first 10, an untrained qa head")
    parser.add_argument("--recall-only", action="store_true",
                        help="retrieval only (recall@1 and @k of each system, the reranker's included): no reader")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", type=Path, default=None, help="write the rows here too")
    args = parser.parse_args(argv)
    if not SQUAD.is_file():
        raise SystemExit(f"{SQUAD} not found (../shared/data is absent)")
    torch.set_num_threads(args.threads)
    passages = squad_passages(SQUAD)
    questions = squad_questions(SQUAD, "dev")
    if args.questions is not None:
        questions = questions[:args.questions]
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
        rows = [[int(r) for r in row if r >= 0] for row in rows]
        if args.recall_only:
            if selection != "reader":
                return
            row = score_row(name, questions, passages, rows, [""] * len(rows), k)
            row.update(exact_match="-", f1="-")
        else:
            row = score_row(name, questions, passages, rows, answers(cache, rows, selection, scores), k)
        table.append({**row, **extra, "pairs_read": cache.pairs, "read_s": round(cache.read_s, 1)})
        print(json.dumps(table[-1]), file=sys.stderr)

    own = {p.text: i for i, p in enumerate(passages)}
    if not args.recall_only:
        add("reader on the gold paragraph (the ceiling)", [[own[q.context]] for q in questions])
    sparse = SparseIndex.build(passages)
    bm25 = sparse.rank(texts, FIRST)
    add("BM25", bm25[1][:, :k])
    models = [("all-MiniLM-L6-v2, untrained", str(minilm_dir()))] + \
        [(f"trained: {directory}", directory) for directory in args.model]
    hybrid = None
    for n, (name, directory) in enumerate(models):
        index = dense_index(f"openqa-dense-{n}" if not args.quick else f"openqa-quick-{n}", directory, passages,
                            args.index_cache)
        first = index.rank(texts, FIRST)
        add(name, first[1][:, :k])
        fusions = [("interpolated (weight 0.5)", Fusion("interpolate"))] + \
            ([("RRF (k 60)", Fusion("rrf", rrf_k=60))] if args.rrf else [])
        for label, fusion in fusions:
            fused = fuse(first, bm25, fusion, FIRST)
            add(f"{name} + BM25, {label}", fused[1][:, :k])
            if label.startswith("interpolated"):
                hybrid = (f"{name} + BM25, {label}", fused)
    if args.rerank is not None and hybrid is not None:
        from bertology.retrieval.rerank import Reranker

        name, (_, ranked) = hybrid
        reranker = Reranker.load(args.rerank)
        depth = max(args.rerank_depth, k)
        start = time.perf_counter()
        rows, scores = [], []
        for question, ranking in zip(texts, ranked):
            head = [int(r) for r in ranking[:depth]]
            relevance = reranker.score(question, [passages[r].text for r in head])
            order = np.argsort(-relevance, kind="stable")[:k]
            rows.append([head[j] for j in order.tolist()])
            scores.append([float(relevance[j]) for j in order.tolist()])
        rerank_s = round(time.perf_counter() - start, 1)
        label = f"{name}, reranked (top {depth})"
        add(f"{label}, reader's selection", rows, rerank_s=rerank_s)
        add(f"{label}, reranker's selection", rows, "reranker", scores)
    keys = ["system", *sorted({f"recall@{j}" for j in (1, k)}, key=lambda s: int(s.split("@")[1])),
            "exact_match", "f1"]
    print("| " + " | ".join(keys) + " |")
    print("|" + "---|" * len(keys))
    for r in table:
        print("| " + " | ".join(str(r.get(key, "-")) for key in keys) + " |")
    if args.json is not None:
        args.json.write_text(json.dumps({"machine": machine_facts(args.threads), "k": k,
                                         "questions": len(questions), "rows": table}, indent=2) + "\n")


if __name__ == "__main__":
    main()
