"""`bertology search`: the nearest passages of a dense index for each query."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from bertology.device import add_device_arguments, placement_from_args


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "search",
        help="search a dense index built by `bertology index build`",
        description="Embed each query with the index's model and options and print its k nearest passages by "
        "inner product (cosine): one JSON line per query, {\"query\", \"hits\": [{\"id\", \"score\", \"text\"}]}, "
        "best first. The model is the one recorded in the index unless --model is given; a model other than "
        "the one that built the index is refused.",
    )
    parser.add_argument("--index", required=True, metavar="INDEX", help="index directory")
    parser.add_argument("--k", type=int, default=10, help="passages per query (default 10)")
    parser.add_argument("--model", default=None, help="model directory (default: the one recorded in the index)")
    parser.add_argument("--ef-search", type=int, default=None, help="hnsw: search-time beam (default: recorded)")
    parser.add_argument("--nprobe", type=int, default=None, help="ivf: cells visited (default: recorded)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's own setting)")
    add_device_arguments(parser)
    parser.add_argument("queries", nargs="+", metavar="QUERY")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from bertology.errors import ConfigError
    from bertology.retrieval import Index
    from bertology.retrieval.index import set_threads

    where = placement_from_args(args)
    set_threads(args.threads)
    index = Index.load(args.index)
    model = args.model or index.model_path
    if model is None:
        raise ConfigError(f"{args.index}: the index was built from a loaded model and records no directory; "
                          f"pass --model")
    if args.model is None and not Path(model).is_dir():
        raise ConfigError(f"{args.index}: the model directory recorded in the index, {model}, does not exist any "
                          f"more; pass --model DIR (it must be the same model)")
    index.attach(model, device=where.device, dtype=where.dtype)
    results = index.search(args.queries, k=args.k, ef_search=args.ef_search, nprobe=args.nprobe)
    for query, hits in zip(args.queries, results):
        print(json.dumps({"query": query, "hits": [{"id": h.id, "score": round(h.score, 6), "text": h.text}
                                                   for h in hits]}, ensure_ascii=False))
    return 0
