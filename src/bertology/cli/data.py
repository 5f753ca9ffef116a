"""`bertology data prepare`: read a corpus, tokenise it once and write memory-mapped shards for pretraining."""

from __future__ import annotations

import argparse
import sys

from bertology.cli._types import seed
from bertology.cli._corpus_args import PREFIX_HELP, add_corpus_arguments, sources_from_args
from bertology.cli._result import print_result
from bertology.data.shards import HELDOUT_DIR, TokenizedCorpus, prepare_corpus
from bertology.tokenization import load_tokenizer


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("data", help="prepare pretraining corpora")
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    prepare = actions.add_parser(
        "prepare",
        help="tokenise a corpus into memory-mapped shards",
        description="Read a corpus (files, directories or globs), tokenise every sentence once and write shards "
        f"to --out. {PREFIX_HELP}",
    )
    prepare.add_argument("--tokenizer", required=True, metavar="DIR", help="tokenizer directory")
    prepare.add_argument("--out", required=True, metavar="DIR", help="output shards directory")
    add_corpus_arguments(prepare)
    prepare.add_argument("--shard-size-tokens", type=int, default=1 << 24, help="tokens per shard (default: 2^24)")
    prepare.add_argument(
        "--heldout-documents",
        type=_count_or_fraction,
        default=0,
        metavar="N",
        help=f"hold out N documents (or a fraction such as 0.01) into DIR/{HELDOUT_DIR}",
    )
    prepare.add_argument("--seed", type=seed, default=0, help="seed for choosing held-out documents")
    prepare.add_argument("--overwrite", action="store_true", help="replace an existing shards directory")
    prepare.add_argument("--quiet", action="store_true", help="no progress bar")
    prepare.set_defaults(func=run_prepare)


def _count_or_fraction(text: str) -> int | float:
    try:
        return float(text) if any(c in text for c in ".eE") else int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a document count or a fraction, got {text!r}") from None


def run_prepare(args: argparse.Namespace) -> int:
    tokenizer = load_tokenizer(args.tokenizer)
    corpus = prepare_corpus(
        sources_from_args(args),
        tokenizer,
        args.out,
        shard_size_tokens=args.shard_size_tokens,
        heldout_documents=args.heldout_documents,
        seed=args.seed,
        overwrite=args.overwrite,
        show_progress=not args.quiet,
    )
    print(
        f"wrote {len(corpus)} documents, {corpus.num_sentences} sentences, {corpus.num_tokens} tokens in "
        f"{len(corpus.metadata['shards'])} shard(s) to {args.out}",
        file=sys.stderr,
    )
    heldout = corpus.directory / HELDOUT_DIR
    result = {"out": args.out, "documents": len(corpus), "sentences": corpus.num_sentences,
              "tokens": corpus.num_tokens, "shards": len(corpus.metadata["shards"])}
    if heldout.is_dir():
        held = TokenizedCorpus(heldout)
        result["heldout"] = {"out": heldout, "documents": len(held), "tokens": held.num_tokens}
        print(f"held out {len(held)} documents, {held.num_tokens} tokens in {heldout}", file=sys.stderr)
    print_result(result)
    return 0
