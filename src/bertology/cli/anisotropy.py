"""`bertology anisotropy`: anisotropy, self-similarity, intra-sentence similarity and rogue dimensions by layer."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bertology.cli._result import print_result
from bertology.device import add_device_arguments, placement_from_args
from bertology.errors import ConfigError


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "anisotropy",
        help="anisotropy, self-similarity and rogue dimensions of word vectors by layer",
        description="Embed a corpus (text files, one sentence per line, or a UD treebank's dev sentences with "
        "--ud) at every layer and write anisotropy.json, anisotropy.png and rogue_dimensions.png: the expected "
        "cosine of words from different sentences with a 95 %% bootstrap interval, self-similarity and "
        "intra-sentence similarity (also minus the anisotropy), each dimension's contribution to the expected "
        "cosine, all before and after standardisation with the corpus's mean and deviation.",
    )
    parser.add_argument("--model", required=True, help="model directory")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--corpus", nargs="+", help="UTF-8 text files, one sentence per non-empty line")
    source.add_argument("--ud", help="a UD treebank folder: its dev sentences, words as the treebank splits them")
    parser.add_argument("--out", required=True, help="output directory")
    parser.add_argument("--overwrite", action="store_true",
                        help="write into an --out folder that holds other files (kept; same-named ones replaced)")
    parser.add_argument("--limit", type=int, default=None, help="at most this many sentences")
    parser.add_argument("--bootstrap", type=int, default=1000, help="bootstrap replicates (default 1000)")
    parser.add_argument("--min-occurrences", type=int, default=5,
                        help="occurrences a word type needs for self-similarity (default 5)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    add_device_arguments(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from bertology.io import check_output_directory

    # Before any work: a folder of other files is refused unless --overwrite.
    check_output_directory(args.out, "anisotropy.json", "the output of bertology anisotropy", args.overwrite)
    from bertology.analysis.geometry import GeometryOptions, analyse, read_corpus
    from bertology.model import load

    if args.limit is not None and args.limit < 2:
        raise ConfigError(f"--limit must be at least 2 sentences, got {args.limit}")
    where = placement_from_args(args)
    if args.ud:
        from bertology.analysis.ud import read_split

        sentences = read_split(args.ud, "dev", args.limit)
        texts, spans = [s.text for s in sentences], [s.spans for s in sentences]
        source = {"ud": args.ud, "split": "dev"}
    else:
        texts, spans = read_corpus(args.corpus, args.limit), None
        source = {"corpus": list(args.corpus)}
    options = GeometryOptions(bootstrap=args.bootstrap, min_occurrences=args.min_occurrences)
    numbers, figures = analyse(load(args.model), texts, args.out, spans=spans, options=options,
                               batch_size=args.batch_size, show_progress=not args.quiet and sys.stderr.isatty(),
                               source={**source, "model": args.model}, device=where.device, dtype=where.dtype)
    for row in numbers["layers"]:
        raw, std = row["raw"], row["standardised"]
        print(f"layer {row['layer']}: anisotropy {raw['anisotropy']['mean']:.3f} "
              f"[{raw['anisotropy']['low']:.3f}, {raw['anisotropy']['high']:.3f}], standardised "
              f"{std['anisotropy']['mean']:.3f}; self-similarity {raw['self_similarity']:.3f}; intra-sentence "
              f"{raw['intra_sentence_similarity']:.3f}; top-{len(raw['rogue']['top'])} dimensions' share "
              f"{raw['rogue']['top_share']:.2f}", file=sys.stderr)
    print_result({"out": args.out, "numbers": Path(args.out) / "anisotropy.json", "figures": figures,
                  "anisotropy": {row["layer"]: row["raw"]["anisotropy"]["mean"] for row in numbers["layers"]}})
    print(f"wrote {args.out}/anisotropy.json and {', '.join(str(f) for f in figures)}", file=sys.stderr)
    return 0
