"""`bertology predict`: a fine-tuned model's predictions for a task file, in the format `bertology evaluate` reads."""

from __future__ import annotations

import argparse
import sys
import textwrap


# What each task's predictions file holds (the README's table says the same).
FORMATS = (
    ("sst2, cola, mrpc, rte, stsb, a task file's text task",
     "a tsv with a header line: index<TAB>prediction (the label name; a number for stsb)"),
    ("conll2003, a task file's tagging task",
     "conlleval's input: each token's columns, the gold tag and the predicted tag (6 columns for CoNLL-2003's "
     "4-column files), a blank line after each sentence; for a file of words only (conll2003), 'word tag' lines"),
    ("conll2003-spans", "a tsv with a header line: sentence_id<TAB>start<TAB>end<TAB>predicted<TAB>gold"),
    ("squad, squad-article", "the official SQuAD v1.1 predictions JSON: {question id: answer text}"),
)


def _formats() -> str:
    return "what --output holds, per task:\n" + "".join(
        f"  {tasks}:\n" + "".join(f"    {line}\n" for line in textwrap.wrap(text, 84)) for tasks, text in FORMATS)

from bertology.cli._result import print_result
from bertology.device import add_device_arguments, placement_from_args


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "predict",
        help="predictions of a fine-tuned model for a task file (GLUE, CoNLL-2003 NER and span typing, SQuAD)",
        description=textwrap.fill(
            "Predict every example of a task file (in the layout the task reads: a GLUE tsv, a CoNLL file, "
            "a SQuAD JSON) with a model fine-tuned by `bertology finetune` (its --out folder's model/), writing the "
            "task's own predictions format (what `bertology evaluate` reads). conll2003 also tags new text: a file "
            "of words only, one word a line, a blank line after each sentence.", 88),
        epilog=_formats(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--model", required=True, metavar="DIR", help="the fine-tuned model directory")
    parser.add_argument("--task", required=True,
                        help="sst2, cola, mrpc, rte, stsb (GLUE), conll2003 (NER), conll2003-spans, squad, squad-article "
                        "(SQuAD, each question reading its whole article)")
    parser.add_argument("--input", required=True, metavar="FILE",
                        help="a file in the layout the task reads (conll2003: or words only, one a line)")
    parser.add_argument("--output", required=True, metavar="FILE",
                        help="where the predictions go, in the task's format (below)")
    parser.add_argument("--max-length", type=int, metavar="N",
                        help="tokens per example; use the run's task.max_length (default: the task's: 128, 384, squad-article's 4096; at most the model's)")
    parser.add_argument("--batch-size", type=int, default=64, metavar="N", help="examples per batch (default 64)")
    add_device_arguments(parser, int8=True, int8_help="the encoder layers' linear maps in int8, faster on CPU")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from bertology.recipes.finetune import predict_file

    where = placement_from_args(args, int8=True)
    count = predict_file(args.model, args.task, args.input, args.output, args.max_length, args.batch_size,
                         dtype=where.dtype, device=where.device)
    print_result({"output": args.output, "task": args.task, "predictions": count})
    print(f"{count} predictions written to {args.output}", file=sys.stderr)
    return 0
