"""Open retrieval on SQuAD v1.1 dev part A: every question against all 1,023 paragraphs of the file.

Dense: all-MiniLM-L6-v2 through `bertology.retrieval.Index` (exact faiss IndexFlatIP, then the same vectors in HNSW and
IVF structures). Sparse baseline: BM25 from bm25s (Lucene's BM25 variant; English stop words and the Snowball
English stemmer, nltk's, which is the algorithm of PyStemmer's "english" that bm25s recommends), at bm25s's defaults
(k1 1.5, b 0.75) and at Pyserini's (k1 0.9, b 0.4). Every ranking is scored by `bertology.retrieval.recall_at_k`:
a hit is a paragraph holding a gold answer string (DPR's token match) or the question's own paragraph; the table
also gives the own paragraph alone.

    python benchmarks/retrieval.py [--threads 1] [--windows] [--json OUT.json]
    python benchmarks/retrieval.py --quick    # 10 paragraphs, 40 of their questions, the exact index: checks the script

BM25 rows need bm25s (the `bench` extra); without it they are left out with a note.

--windows also embeds the paragraphs and questions with long texts in windows instead of sentence-transformers'
truncation at 256 tokens (78 of the 1,023 paragraphs are longer).
"""

from __future__ import annotations

import argparse
import dataclasses
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
    Index,
    Structure,
    model_options,
    recall_at_k,
    squad_passages,
    squad_questions,
)

SQUAD = DATA / "squad" / "squad-v1.1-dev-part-a.json"
KS = (1, 5, 20, 100)


def row(name: str, scores, seconds: dict[str, float]) -> dict:
    return {"system": name, **{f"recall@{k}": round(scores.recall[k], 2) for k in KS},
            **{f"paragraph@{k}": round(scores.paragraph_recall[k], 2) for k in KS},
            **{key: round(value, 2) for key, value in seconds.items()}}


def dense(index: Index, questions, name: str, query_vectors: np.ndarray, encode_s: float, build_s: float) -> dict:
    start = time.perf_counter()
    _, rows = index.search_vectors(query_vectors, max(KS))
    search_s = time.perf_counter() - start
    scores = recall_at_k(questions, index.passages, [[r for r in rw if r >= 0] for rw in rows], KS)
    return row(name, scores, {"index_s": build_s, "queries_s": encode_s, "search_s": search_s})


def bm25(passages, questions, k1: float, b: float) -> dict:
    import bm25s
    from nltk.stem.snowball import SnowballStemmer

    snowball = SnowballStemmer("english")

    def stem(words: list[str]) -> list[str]:
        return [snowball.stem(w) for w in words]

    start = time.perf_counter()
    retriever = bm25s.BM25(k1=k1, b=b, method="lucene")
    retriever.index(bm25s.tokenize([p.text for p in passages], stopwords="en", stemmer=stem, show_progress=False),
                    show_progress=False)
    build_s = time.perf_counter() - start
    start = time.perf_counter()
    tokens = bm25s.tokenize([q.question for q in questions], stopwords="en", stemmer=stem, return_ids=False,
                            show_progress=False)
    rows, _ = retriever.retrieve(tokens, k=max(KS), show_progress=False, n_threads=1)
    search_s = time.perf_counter() - start
    scores = recall_at_k(questions, passages, rows.tolist(), KS)
    return row(f"BM25 bm25s k1={k1} b={b}", scores, {"index_s": build_s, "queries_s": 0.0, "search_s": search_s})


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--windows", action="store_true", help="also embed long texts in windows")
    parser.add_argument("--json", type=Path, default=None, help="write the rows here too")
    parser.add_argument("--quick", action="store_true",
                        help="the first 10 paragraphs and 40 of their questions, the exact index only: seconds")
    args = parser.parse_args(argv)
    if not SQUAD.is_file():
        raise SystemExit(f"{SQUAD} not found (../shared/data is absent)")
    torch.set_num_threads(args.threads)
    passages = squad_passages(SQUAD)
    questions = squad_questions(SQUAD)
    if args.quick:
        passages = passages[:10]
        kept = {p.text for p in passages}
        questions = [q for q in questions if q.context in kept][:40]
    print(f"{len(questions)} questions, {len(passages)} paragraphs; {machine_facts(args.threads)}", file=sys.stderr)
    notes = []
    try:
        rows = [bm25(passages, questions, 1.5, 0.75), bm25(passages, questions, 0.9, 0.4)]
    except ImportError as error:
        rows = []
        notes.append(f"BM25 not run: {error.name} is not installed here (the bench extra).")
    pretrained = load(minilm_dir())
    variants = [("", model_options(minilm_dir()))]
    if args.windows:
        variants.append((", windows", dataclasses.replace(variants[0][1], long_texts="windows", max_length=None,
                                                          source="windows")))
    for suffix, options in variants:
        start = time.perf_counter()
        exact = Index.build(pretrained, passages, options=options)
        build_s = time.perf_counter() - start
        start = time.perf_counter()
        query_vectors = exact.encode([q.question for q in questions])
        encode_s = time.perf_counter() - start
        rows.append(dense(exact, questions, f"all-MiniLM-L6-v2 exact{suffix}", query_vectors, encode_s, build_s))
        if suffix or args.quick:
            continue
        for structure in (Structure("hnsw"), Structure("ivf")):
            start = time.perf_counter()
            approximate = exact.restructured(structure)
            seconds = time.perf_counter() - start
            label = ", ".join(f"{k}={v}" for k, v in approximate.meta["structure_parameters"].items() if k != "kind")
            rows.append(dense(approximate, questions, f"all-MiniLM-L6-v2 {structure.kind} ({label})", query_vectors,
                              encode_s, build_s + seconds))
    columns = list(rows[0])
    print("| " + " | ".join(columns) + " |")
    print("|" + "---|" * len(columns))
    for r in rows:
        print("| " + " | ".join(str(r[c]) for c in columns) + " |")
    for note in notes:
        print(note)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
