"""`bertology evaluate`: the official metrics of a predictions file (SQuAD v1.1, conlleval, GLUE)."""

from __future__ import annotations

import argparse
import json

# bertology.tasks.metrics.TASKS, spelled out so that building the parser imports nothing (a test checks)
TASKS = ("squad", "conll", "conll2003", "sst2", "cola", "mrpc", "rte", "stsb")


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "evaluate",
        help="score predictions with a task's official metrics",
        description="Print a task's metrics of a predictions file as one JSON object, every metric a percentage "
        "(x100, as the SQuAD script, conlleval and the GLUE leaderboard report them). squad: --gold is the SQuAD "
        "v1.1 JSON, --predictions a JSON object of question id to answer; prints exact_match, f1. conll, "
        "conll2003: --predictions alone, in conlleval's format (gold and predicted tag the last two columns); "
        "prints precision, recall, f1, accuracy, counts and per_type. sst2, rte (accuracy), cola (mcc), mrpc "
        "(accuracy, f1), stsb (pearson, spearman): --gold is the GLUE dev tsv, --predictions a tsv with the header "
        "'index<TAB>prediction' and a label for each gold row.",
    )
    parser.add_argument("--task", required=True, choices=TASKS, type=str.lower)
    parser.add_argument("--predictions", required=True, metavar="FILE")
    parser.add_argument("--gold", metavar="FILE", help="the gold file (not used by conll)")
    parser.add_argument("--allow-missing", action="store_true",
                        help="squad: score a question without a prediction 0, as the official script does, "
                        "and print their number as 'missing', instead of stopping with an error")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from bertology.tasks.metrics import evaluate_files

    metrics = evaluate_files(args.task, args.predictions, args.gold, allow_missing=args.allow_missing)
    print(json.dumps(metrics))
    return 0
