"""`bertology info`: architecture, parameter counts and tokenizer of a model directory."""

from __future__ import annotations

import argparse

from bertology.info import describe
from bertology.model.local import resolve_model_path


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "info",
        help="describe a model directory",
        description="Print a model's architecture, parameter counts (unique and as run, for shared ALBERT layers) "
        "and its tokenizer's kind, style, vocabulary, special tokens, lowercasing and maximum length.",
    )
    parser.add_argument("path", help="model directory (transformers layout), or an installed model's name (bertology models)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    print(describe(resolve_model_path(args.path)).format())
    return 0
