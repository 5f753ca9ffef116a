"""`bertology quickstart`: pretrain a tiny BERT on bundled English text, then fill masks and compare embeddings."""

from __future__ import annotations

import argparse
import sys

from bertology.cli._types import seed


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "quickstart",
        help="pretrain a tiny BERT on bundled news and Wikipedia text in minutes, then try it",
        description="Write a corpus from the English text in gensim's test data (Lee news articles, a shortened "
        "Wikipedia dump), train a WordPiece tokenizer, prepare shards with held-out documents, pretrain a tiny BERT "
        "(MLM, with the recipe measured in docs/PRETRAINING.md) with held-out evaluations before, during and after, "
        "save it in the transformers layout, run fill-mask on five cloze sentences (saying for each whether the "
        "expected word is in the top five) and the sense demo on it, and print the commands that redo each step at "
        "a larger scale.",
    )
    parser.add_argument("--out", default="runs/quickstart", metavar="DIR",
                        help="output directory (default: runs/quickstart; a previous quickstart there is replaced)")
    parser.add_argument("--steps", type=int, default=None,
                        help="optimizer steps of 64 x 32 tokens (default: 3000, 4 to 7 minutes on two idle cores; "
                        "20 with --quick)")
    parser.add_argument("--preset", default="tiny", help="model size: tiny, mini, small, medium, base, large "
                        "(default: tiny, 2 layers of 128)")
    parser.add_argument("--seed", type=seed, default=0, help="seed for data order, masking and initialisation")
    parser.add_argument("--quick", action="store_true",
                        help="a smoke run in seconds: the first documents of each text, a small vocabulary, few steps")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: every core)")
    parser.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bars")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import time

    from bertology.recipes.quickstart import QuickstartOptions, quickstart

    start = time.perf_counter()
    options = QuickstartOptions(out=args.out, steps=args.steps, preset=args.preset, seed=args.seed, quick=args.quick,
                                threads=args.threads, progress=args.progress)
    result = quickstart(options, echo=lambda line: print(line, flush=True))
    stages = ", ".join(f"{name} {seconds:.0f}s" for name, seconds in result.seconds.items())
    print(f"done in {time.perf_counter() - start:.0f}s ({stages})", file=sys.stderr)
    return 0
