"""`bertology tokenizer train`: train a tokenizer from text files and write it in the Hugging Face layout."""

from __future__ import annotations

import argparse
import sys

from bertology.tokenization import train_tokenizer


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("tokenizer", help="train tokenizers")
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    train = actions.add_parser(
        "train",
        help="train a WordPiece, byte-level BPE or Unigram tokenizer",
        description="Train a tokenizer on UTF-8 text files (globs and directories are expanded) and write "
        "tokenizer.json, tokenizer_config.json, special_tokens_map.json and the vocabulary files to --out.",
    )
    train.add_argument("files", nargs="+", metavar="FILE", help="text files, directories or globs")
    train.add_argument("--kind", required=True, choices=("wordpiece", "bpe", "unigram"))
    train.add_argument("--vocab-size", required=True, type=int)
    train.add_argument("--out", required=True, help="output directory")
    train.add_argument("--style", choices=("bert", "roberta"), default=None,
                       help="special-token style (default: bert for wordpiece, roberta otherwise)")
    case = train.add_mutually_exclusive_group()
    case.add_argument("--lowercase", dest="lowercase", action="store_true", default=None)
    case.add_argument("--no-lowercase", dest="lowercase", action="store_false")
    train.add_argument("--min-frequency", type=int, default=2)
    train.add_argument("--model-max-length", type=int, default=512)
    train.add_argument("--quiet", action="store_true", help="no progress bar")
    train.set_defaults(func=run_train)


def run_train(args: argparse.Namespace) -> int:
    tokenizer = train_tokenizer(
        args.files,
        args.kind,
        args.vocab_size,
        style=args.style,
        lowercase=args.lowercase,
        min_frequency=args.min_frequency,
        show_progress=not args.quiet,
        model_max_length=args.model_max_length,
    )
    tokenizer.save(args.out)
    print(f"wrote {args.kind} tokenizer ({tokenizer.vocab_size} tokens, {tokenizer.style} style) to {args.out}",
          file=sys.stderr)
    return 0
