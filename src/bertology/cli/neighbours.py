"""`bertology neighbours`: a word's nearest occurrences in a corpus, beside its static type-averaged neighbours."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bertology.cli._result import print_result
from bertology.device import add_device_arguments, placement_from_args


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "neighbours",
        help="nearest occurrences of a word in context, and its type-averaged neighbours",
        description="Index a corpus's word vectors (faiss, exact cosine) and, for each --query WORD SENTENCE, "
        "list the nearest occurrences with their sentences beside the nearest word types of the static "
        "(type-averaged) vector. Writes neighbours.json.",
    )
    parser.add_argument("--model", required=True, help="model directory")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--corpus", nargs="+", help="UTF-8 text files, one sentence per non-empty line")
    source.add_argument("--ud", help="a UD treebank folder: its train sentences")
    parser.add_argument("--query", nargs=2, action="append", required=True, metavar=("WORD", "SENTENCE"),
                        help="a word and the sentence it occurs in (repeatable)")
    parser.add_argument("--out", required=True, help="output directory")
    parser.add_argument("--overwrite", action="store_true",
                        help="write into an --out folder that holds other files (kept; same-named ones replaced)")
    parser.add_argument("--limit", type=int, default=None, help="at most this many corpus sentences")
    parser.add_argument("--layer", type=int, default=-1, help="hidden state (default -1, the last)")
    parser.add_argument("-k", type=int, default=10, help="neighbours per query (default 10)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    add_device_arguments(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from bertology.io import check_output_directory

    # Before any work: a folder of other files is refused unless --overwrite.
    check_output_directory(args.out, "neighbours.json", "the output of bertology neighbours", args.overwrite)
    from bertology.analysis.geometry import read_corpus
    from bertology.analysis.neighbours import neighbours
    from bertology.model import load

    where = placement_from_args(args)
    if args.ud:
        from bertology.analysis.ud import read_split

        corpus = [s.text for s in read_split(args.ud, "train", args.limit)]
    else:
        corpus = read_corpus(args.corpus, args.limit)
    numbers, _ = neighbours(load(args.model), corpus, [(sentence, word) for word, sentence in args.query], args.out,
                            layer=args.layer, k=args.k, batch_size=args.batch_size,
                            show_progress=not args.quiet and sys.stderr.isatty(), device=where.device,
                            dtype=where.dtype)
    for query in numbers["queries"]:
        print(f"{query['word']!r} in {query['sentence']!r}", file=sys.stderr)
        for n in query["contextual"]:
            print(f"  {n['cosine']:.3f}  {n['word']:<15} {n['sentence'][:100]}", file=sys.stderr)
        print("  static: " + ", ".join(f"{n['type']} ({n['cosine']:.2f})" for n in query["static"]), file=sys.stderr)
    print_result({"out": args.out, "numbers": Path(args.out) / "neighbours.json", "queries": numbers["queries"]})
    print(f"wrote {args.out}/neighbours.json", file=sys.stderr)
    return 0
