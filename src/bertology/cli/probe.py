"""`bertology probe`: per-layer linear probes (UPOS, dependency relation) on a UD treebank, with control tasks."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bertology.cli._types import seed
from bertology.cli._result import print_result
from bertology.device import add_device_arguments, placement_from_args


def _layers(text: str) -> list[int]:
    try:
        return [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--layers: {text!r} is not comma-separated integers") from None


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "probe",
        help="linear probes of every layer on UD (UPOS, relations) with control tasks",
        description="Embed a UD treebank's train, dev and test words at every layer and train softmax-regression "
        "probes: UPOS from the word vector, the universal relation from the [head; dependent] pair, and Hewitt & "
        "Liang's control tasks (a random label per word type) for selectivity. L2 and epochs are chosen on dev; "
        "test accuracy is reported. Writes probing.json and probing.png.",
    )
    parser.add_argument("--model", required=True, help="model directory")
    parser.add_argument("--ud", required=True, help="UD treebank folder holding *-ud-{train,dev,test}.conllu")
    parser.add_argument("--out", required=True, help="output directory")
    parser.add_argument("--overwrite", action="store_true",
                        help="write into an --out folder that holds other files (kept; same-named ones replaced)")
    parser.add_argument("--layers", type=_layers, default=None,
                        help="hidden-state indices to probe, e.g. 0,3,6 (default: all; 0 = embeddings; "
                        "write --layers=-1 for a list starting with a minus)")
    parser.add_argument("--limit", type=int, default=None, help="at most this many sentences per split")
    parser.add_argument("--tasks", default="upos,relation", help="comma-separated: upos, relation")
    parser.add_argument("--epochs", type=int, default=12, help="most epochs per probe (best dev epoch kept)")
    parser.add_argument("--learning-rate", type=float, default=1e-2, help="Adam learning rate (default 1e-2)")
    parser.add_argument("--l2", default="0,0.001", help="comma-separated L2 weights tried, chosen on dev "
                        "(default 0,0.001)")
    parser.add_argument("--seed", type=seed, default=0)
    parser.add_argument("--batch-size", type=int, default=32, help="sentences per forward pass")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    add_device_arguments(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from bertology.io import check_output_directory

    # Before any work: a folder of other files is refused unless --overwrite.
    check_output_directory(args.out, "probing.json", "the output of bertology probe", args.overwrite)
    from bertology.analysis.probing import ProbeOptions, probe
    from bertology.errors import ConfigError
    from bertology.model import load

    try:
        l2 = tuple(float(w) for w in args.l2.split(","))
    except ValueError:
        raise ConfigError(f"--l2: {args.l2!r} is not comma-separated numbers") from None
    options = ProbeOptions(epochs=args.epochs, learning_rate=args.learning_rate, l2=l2, seed=args.seed)
    where = placement_from_args(args)
    numbers, figures = probe(load(args.model), args.ud, args.out, layers=args.layers, limit=args.limit,
                             tasks=[t.strip() for t in args.tasks.split(",") if t.strip()], options=options,
                             batch_size=args.batch_size, show_progress=not args.quiet and sys.stderr.isatty(),
                             device=where.device, dtype=where.dtype)
    for task, result in numbers["tasks"].items():
        for row in result["layers"]:
            print(f"{task} layer {row['layer']}: test accuracy {row['test_accuracy']:.3f}, control "
                  f"{row['control_test_accuracy']:.3f}, selectivity {row['selectivity']:.3f}", file=sys.stderr)
    print_result({"out": args.out, "numbers": Path(args.out) / "probing.json", "figures": figures,
                  "test_accuracy": {task: {row["layer"]: row["test_accuracy"] for row in result["layers"]}
                                    for task, result in numbers["tasks"].items()}})
    print(f"wrote {args.out}/probing.json and {figures[0]}", file=sys.stderr)
    return 0
