"""`bertology demo`: cosine tables showing that one word in different senses gets different vectors."""

from __future__ import annotations

import argparse

from bertology.demo import format_report, sense_tables
from bertology.cli.embed import layers_argument
from bertology.device import add_device_arguments, placement_from_args
from bertology.model import load


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "demo",
        help="same word, different senses: cosine tables of contextual vectors",
        description="Embed a handful of sentences each for bank, bat, play and record (two senses each) and print "
        "the cosine similarity of every pair of occurrences, with the mean over same-sense and cross-sense pairs.",
    )
    parser.add_argument("--model", required=True, help="model directory (transformers layout)")
    parser.add_argument("--layers", type=layers_argument, default="sum-last-four",
                        help="last, sum-last-four, mean, concat or comma-separated indices (write --layers=-2,-1 when "
                        "the list starts with a minus; default: sum-last-four)")
    parser.add_argument("--combine", choices=("sum", "mean", "concat"), default=None,
                        help="how explicit layer indices are combined (default: mean)")
    parser.add_argument("--pooling", choices=("first", "mean", "last"), default="mean",
                        help="subword pooling when a word is split into pieces (default: mean)")
    add_device_arguments(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    where = placement_from_args(args)
    tables = sense_tables(load(args.model), layers=args.layers, combine=args.combine, pooling=args.pooling,
                          device=where.device, dtype=where.dtype)
    layers = args.layers if isinstance(args.layers, str) else ",".join(map(str, args.layers))
    header = (f"Contextual vectors of ambiguous words\nmodel: {args.model}\nlayers: {layers}, "
              f"subword pooling: {args.pooling}\ncells: cosine similarity of two occurrences; * = same sense")
    print(format_report(tables, header))
    return 0
