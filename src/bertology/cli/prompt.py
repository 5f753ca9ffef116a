"""`bertology prompt`: zero- and k-shot in-context classification by a decoder, or cloze prompting of an encoder,
with verbalisers and optional contextual calibration; the task's metrics as one JSON object on stdout."""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction) -> None:
    from bertology.device import add_device_arguments

    parser = subparsers.add_parser(
        "prompt",
        help="classify a GLUE task's dev set by prompting, with no training (zero- or k-shot, cloze)",
        description="Prompt a model on a GLUE classification task's dev set with no training: a decoder scores "
        "each label word as the next token after the prompt (K demonstrations from the train split before it, "
        "drawn per seed), an encoder with a masked-LM head scores it at the template's [MASK] (cloze). "
        "--calibrate corrects the label probabilities by those of the content-free input 'N/A' (contextual "
        "calibration). Prints the task's metrics (x100) per seed and their mean and standard deviation as one JSON "
        "object.",
    )
    parser.add_argument("--model", required=True, metavar="DIR", help="the model directory (or installed model)")
    parser.add_argument("--task", required=True, choices=("sst2", "cola", "mrpc", "rte"), help="the GLUE task")
    parser.add_argument("--data", required=True, metavar="GLUE_DIR",
                        help="the GLUE folder (holding SST-2/, CoLA/, ...: train.tsv for demonstrations, dev.tsv)")
    parser.add_argument("--shots", type=int, default=0, metavar="K",
                        help="demonstrations before each example (default: 0, zero-shot)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], metavar="SEED",
                        help="one set of demonstrations per seed (default: 0 1 2; zero-shot runs once)")
    parser.add_argument("--calibrate", action="store_true",
                        help="contextual calibration: divide the label probabilities by the content-free input's")
    parser.add_argument("--template", metavar="TEXT",
                        help="with {text} ({text_pair} for pairs) and one [MASK], where the label word goes; "
                        "default per task, e.g. SST-2's '{text} It was [MASK] .'")
    parser.add_argument("--verbalizer", metavar="WORD=LABEL,...",
                        help="one single-token word per label, e.g. good=1,bad=0 (SST-2's default)")
    parser.add_argument("--limit", type=int, metavar="N", help="the first N dev examples only")
    parser.add_argument("--batch-size", type=int, default=32, metavar="N", help="prompts per forward (default: 32)")
    add_device_arguments(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from bertology.cli._result import print_result
    from bertology.device import placement_from_args
    from bertology.tasks.prompting import parse_verbalizer, prompt_task

    where = placement_from_args(args)
    verbalizer = parse_verbalizer(args.verbalizer) if args.verbalizer is not None else None
    print_result(prompt_task(args.model, args.task, args.data, shots=args.shots, seeds=args.seeds,
                             calibrated=args.calibrate, template=args.template, verbalizer=verbalizer,
                             limit=args.limit, batch_size=args.batch_size, device=where.device, dtype=where.dtype))
    return 0
