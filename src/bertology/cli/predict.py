"""`bertology predict`: a fine-tuned model's predictions for a task file, in the format `bertology evaluate` reads."""

from __future__ import annotations

import argparse
import sys

from bertology.device import add_device_arguments, placement_from_args


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "predict",
        help="predictions of a fine-tuned model for a task file (GLUE, CoNLL-2003 NER and span typing, SQuAD)",
        description="Predict every example of a task file (in the layout the task reads: a GLUE tsv, a CoNLL file, "
        "a SQuAD JSON) with a model fine-tuned by `bertology finetune`, writing the task's own predictions format "
        "(what `bertology evaluate` reads).",
    )
    parser.add_argument("--model", required=True, metavar="DIR", help="the fine-tuned model directory")
    parser.add_argument("--task", required=True,
                        help="sst2, cola, mrpc, rte, stsb (GLUE), conll2003 (NER), conll2003-spans, squad")
    parser.add_argument("--input", required=True, metavar="FILE", help="a file in the layout the task reads")
    parser.add_argument("--output", required=True, metavar="FILE", help="where the predictions go (tsv)")
    parser.add_argument("--max-length", type=int, metavar="N",
                        help="tokens per example; use the run's task.max_length (default: the task's, 128 or 384)")
    parser.add_argument("--batch-size", type=int, default=64, metavar="N", help="examples per batch (default 64)")
    add_device_arguments(parser, int8=True, int8_help="the encoder layers' linear maps in int8, faster on CPU")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from bertology.recipes.finetune import predict_file

    where = placement_from_args(args, int8=True)
    count = predict_file(args.model, args.task, args.input, args.output, args.max_length, args.batch_size,
                         dtype=where.dtype, device=where.device)
    print(f"{count} predictions written to {args.output}", file=sys.stderr)
    return 0
