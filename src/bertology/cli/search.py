"""`bertology search`: the nearest passages of a dense index for each query."""

from __future__ import annotations

import argparse
import json

from bertology.device import add_device_arguments, placement_from_args


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "search",
        help="search an index built by `bertology index build` (dense, bm25 or hybrid)",
        description="Print each query's k best passages: one JSON line per query, {\"query\", \"hits\": "
        "[{\"id\", \"score\", \"text\"}]}, best first. A dense index embeds the query with its model and options "
        "(scores: cosine), a bm25 index scores it with BM25, a hybrid one fuses both rankings (scores: the fused "
        "score). The model is the one recorded in the index unless --model is given; a model other than the one "
        "that built the index is refused, and so is a query longer than the model's positions.",
    )
    parser.add_argument("--index", required=True, metavar="INDEX", help="index directory")
    parser.add_argument("--k", type=int, default=None,
                        help="passages per query (default 10, or all when the index holds fewer; more than the index "
                        "holds is an error)")
    parser.add_argument("--kind", choices=("dense", "bm25", "hybrid"), default=None,
                        help="the kind the index must be (default: whatever it records); another kind is an error")
    parser.add_argument("--rerank", metavar="DIR", default=None,
                        help="a cross-encoder reranker (`bertology finetune --task rerank`) re-scoring the first "
                        "stage's top --rerank-depth passages; scores are then its log-odds of relevance")
    parser.add_argument("--rerank-depth", type=int, default=100,
                        help="first-stage passages the reranker re-scores (default 100, at least --k; at most the "
                        "index's size)")
    parser.add_argument("--model", default=None, help="model directory (default: the one recorded in the index)")
    parser.add_argument("--ef-search", type=int, default=None, help="hnsw: search-time beam (default: recorded)")
    parser.add_argument("--nprobe", type=int, default=None, help="ivf: cells visited (default: recorded)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's own setting)")
    add_device_arguments(parser)
    parser.add_argument("queries", nargs="+", metavar="QUERY")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from bertology.errors import ConfigError
    from bertology.retrieval.index import set_threads
    from bertology.retrieval.kinds import open_index

    where = placement_from_args(args)
    set_threads(args.threads)
    index = open_index(args.index, kind=args.kind, model=args.model, device=where.device, dtype=where.dtype)
    if args.k is None:
        args.k = min(10, len(index))
    if args.k < 1:
        raise ConfigError(f"--k must be a positive integer, got {args.k}")
    if args.k > len(index):
        raise ConfigError(f"--k {args.k}: the index {args.index} holds only {len(index)} passages; ask for at most "
                          f"{len(index)}")
    search = {"ef_search": args.ef_search, "nprobe": args.nprobe} if index.kind == "dense" else {}
    if index.kind != "dense" and (args.ef_search is not None or args.nprobe is not None):
        raise ConfigError(f"--ef-search, --nprobe: for a dense index; {args.index} is a {index.kind} one")
    if args.rerank is not None:
        from bertology.retrieval.rerank import Reranker, rerank_hits

        if args.rerank_depth < args.k:
            raise ConfigError(f"--rerank-depth {args.rerank_depth}: at least --k ({args.k})")
        reranker = Reranker.load(args.rerank, device=where.device, dtype=where.dtype)
        first = index.search(args.queries, k=min(args.rerank_depth, len(index)), **search)
        results = rerank_hits(reranker, args.queries, first, args.k)
    else:
        results = index.search(args.queries, k=args.k, **search)
    for query, hits in zip(args.queries, results):
        print(json.dumps({"query": query, "hits": [{"id": h.id, "score": round(h.score, 6), "text": h.text}
                                                   for h in hits]}, ensure_ascii=False))
    return 0
