"""`bertology tokenizer train`: train a tokenizer on a corpus and write it in the Hugging Face layout."""

from __future__ import annotations

import argparse
import sys
from itertools import chain

from bertology.cli._corpus_args import PREFIX_HELP, add_corpus_arguments, sources_from_args
from bertology.data.corpus import read_sources
from bertology.tokenization import train_tokenizer


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("tokenizer", help="train tokenizers")
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    train = actions.add_parser(
        "train",
        help="train a WordPiece, byte-level BPE or Unigram tokenizer",
        description="Train a tokenizer on the sentences of a corpus (files, directories or globs, read as "
        "`data prepare` reads them) and write tokenizer.json, tokenizer_config.json, special_tokens_map.json and "
        f"the vocabulary files to --out. {PREFIX_HELP}",
    )
    train.add_argument("--kind", required=True, choices=("wordpiece", "bpe", "unigram"))
    train.add_argument("--vocab-size", required=True, type=int)
    train.add_argument("--out", required=True, help="output directory")
    add_corpus_arguments(train)
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
    # Every source is resolved (missing paths, unknown encodings) before training starts; the sentences then
    # stream from the readers, so the corpus never has to fit in memory.
    sentences = chain.from_iterable(read_sources(sources_from_args(args)))
    tokenizer = train_tokenizer(
        sentences,
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
