"""`bertology sense-map`: a 2-D map of one word's occurrences coloured by sense (UMAP, or PCA without it)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bertology.cli._result import print_result
from bertology.device import add_device_arguments, placement_from_args


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "sense-map",
        help="2-D map of a word's occurrences coloured by sense",
        description="Embed every sense-tagged occurrence of a lemma (SemCor, or a TSV of sentence<TAB>word<TAB>sense) "
        "and project the vectors to 2-D (UMAP with umap-learn installed, else PCA). Writes sense_map.json and "
        "sense_map.png.",
    )
    parser.add_argument("--model", required=True, help="model directory")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--semcor", help="SemCor folder (tag files)")
    source.add_argument("--labelled", help="TSV: sentence<TAB>word<TAB>sense per line")
    parser.add_argument("--lemma", help="the lemma to map (with --semcor)")
    parser.add_argument("--pos", default=None, help="SemCor POS prefix to keep (NN, VB, JJ, RB)")
    parser.add_argument("--out", required=True, help="output directory")
    parser.add_argument("--overwrite", action="store_true",
                        help="write into an --out folder that holds other files (kept; same-named ones replaced)")
    parser.add_argument("--layer", type=int, default=-1, help="hidden state (default -1, the last)")
    parser.add_argument("--method", choices=("auto", "umap", "pca"), default="auto")
    parser.add_argument("--min-count", type=int, default=1, help="leave out senses seen fewer times")
    add_device_arguments(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from bertology.io import check_output_directory

    # Before any work: a folder of other files is refused unless --overwrite.
    check_output_directory(args.out, "sense_map.json", "the output of bertology sense-map", args.overwrite)
    from bertology.analysis.sense_map import read_labelled, semcor_occurrences, sense_map
    from bertology.errors import ConfigError
    from bertology.model import load

    where = placement_from_args(args)
    if args.semcor:
        if not args.lemma:
            raise ConfigError("--semcor needs --lemma")
        occurrences = semcor_occurrences(args.semcor, args.lemma, pos=args.pos)
    else:
        occurrences = read_labelled(args.labelled)
    word = args.lemma or (occurrences[0].sentence[slice(*occurrences[0].span)] if occurrences else "")
    numbers, figures = sense_map(load(args.model), occurrences, args.out, word=word, layer=args.layer,
                                 method=args.method, min_count=args.min_count, device=where.device,
                                 dtype=where.dtype)
    print(f"{numbers['occurrences']} occurrences in {len(numbers['senses'])} senses ({numbers['method']}); "
          f"mean cosine within a sense {numbers['separation']['within_sense']:.3f}, between senses "
          f"{numbers['separation']['between_senses']:.3f}", file=sys.stderr)
    print_result({"out": args.out, "numbers": Path(args.out) / "sense_map.json", "figures": figures,
                  "occurrences": numbers["occurrences"], "senses": len(numbers["senses"]), "method": numbers["method"],
                  "separation": numbers["separation"]})
    print(f"wrote {args.out}/sense_map.json and {figures[0]}", file=sys.stderr)
    return 0
