"""`bertology analyze`: every analysis the data allows, collected into one self-contained report.html."""

from __future__ import annotations

import argparse
import sys

from bertology.device import add_device_arguments, placement_from_args


def register(subparsers: argparse._SubParsersAction) -> None:
    from bertology.analysis.report import ALIASES, ANALYSES

    parser = subparsers.add_parser(
        "analyze",
        help="run the analyses (word senses, geometry, probing, attention heads) and write one HTML report",
        description="Runs every analysis whose data is present under --data (each writes its JSON and PNG figures "
        "under --out) and writes OUT/report.html: one self-contained file with each analysis's numbers, figures "
        "and the command that redoes it; analyses whose data or module is absent are listed with the reason.",
    )
    parser.add_argument("--model", required=True, metavar="DIR", help="model directory")
    parser.add_argument("--out", required=True, metavar="DIR", help="output directory")
    parser.add_argument("--overwrite", action="store_true",
                        help="write into an --out folder that holds other files (kept; same-named ones replaced)")
    parser.add_argument("--only", metavar="NAMES",
                        help=f"comma-separated analyses: {', '.join(ANALYSES)} (also {', '.join(sorted(ALIASES))})")
    parser.add_argument("--data", default="../shared/data", metavar="DIR",
                        help="folder of the data sets (ud-english-ewt, semcor3.0-subset, wordnet-3.0, "
                        "wsd-raganato2017, glue, ...); default: ../shared/data")
    parser.add_argument("--task", help="the fine-tuning task of a fine-tuned model (head importance uses its loss)")
    parser.add_argument("--quick", action="store_true", help="smaller samples: a fast, rougher report")
    parser.add_argument("--threads", type=int, metavar="N", help="torch threads")
    add_device_arguments(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from bertology.analysis.report import build_report, chosen_analyses
    from bertology.cli._result import print_result

    where = placement_from_args(args)
    chosen_analyses(args.only)  # a bad --only fails before the model is loaded
    from bertology.io import check_output_directory

    # Before any work: a folder of other files is refused unless --overwrite.
    check_output_directory(args.out, "report.html", "a report of bertology analyze", args.overwrite)
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    result = build_report(args.model, args.out, args.only, args.data, quick=args.quick, task=args.task,
                          show_progress=sys.stderr.isatty(), device=where.device, dtype=where.dtype)
    for skipped in result.skipped:
        print(f"skipped {skipped.name}: {skipped.reason}", file=sys.stderr)
    print_result({"report": result.path, "analyses": [section.name for section in result.sections],
                  "skipped": {skipped.name: skipped.reason for skipped in result.skipped}, "seconds": result.seconds})
    print(f"wrote {result.path} ({len(result.sections)} analyses, {len(result.skipped)} skipped)", file=sys.stderr)
    return 0
