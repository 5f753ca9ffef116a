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
        help="answers for raw text (pipelines: classification, NER, QA, fill-mask, generation, features), or a "
        "fine-tuned model's predictions for a task file (GLUE, CoNLL-2003, SQuAD)",
        description=textwrap.fill(
            "Pipelines: --text TEXT (repeatable) or --input FILE (plain text, one item a line; or, for a .jsonl "
            "file or --format jsonl, one JSON object a line with the task's fields: text and text_pair, question "
            "and context) in, one JSON line per item out (on stdout, or written atomically to --output). The task "
            "is the model's own (its heads: a sequence classifier, a token classifier, a QA head; a decoder or an "
            "encoder-decoder generates, a masked-LM fills masks) unless --task names one of: "
            "text-classification, token-classification (ner), question-answering, fill-mask, text-generation, "
            "feature-extraction (docs/PIPELINES.md).", 88)
        + "\n\n" + textwrap.fill(
            "Task files: --task naming a fine-tuning task predicts every example of a file in the layout the task "
            "reads (a GLUE tsv, a CoNLL file, a SQuAD JSON) with a model fine-tuned by `bertology finetune`, "
            "writing the task's own predictions format to --output (what `bertology evaluate` reads). conll2003 "
            "also tags a file of words only, one word a line, a blank line after each sentence.", 88),
        epilog=_formats(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--model", required=True, metavar="DIR", help="the model directory")
    parser.add_argument("--task", default=None,
                        help="a pipeline task (default: the model's own), or a fine-tuning task: sst2, cola, mrpc, "
                        "rte, stsb (GLUE), conll2003 (NER), conll2003-spans, squad, squad-article (SQuAD, each "
                        "question reading its whole article), or a task file")
    parser.add_argument("--text", action="append", default=None, metavar="TEXT",
                        help="an input text (repeat for more); question-answering: a question about --context")
    parser.add_argument("--text-pair", default=None, metavar="TEXT",
                        help="text-classification: the second text of a pair, for every --text")
    parser.add_argument("--context", default=None, metavar="TEXT",
                        help="question-answering: the context the --text questions are asked about")
    parser.add_argument("--input", default=None, metavar="FILE",
                        help="pipelines: the inputs (see above); a fine-tuning task: a file in the layout it reads "
                        "(conll2003: or words only, one a line)")
    parser.add_argument("--format", choices=("auto", "lines", "jsonl"), default="auto",
                        help="pipelines: how --input is read (auto: jsonl for a .jsonl file, else lines)")
    parser.add_argument("--output", default=None, metavar="FILE",
                        help="pipelines: the JSON lines (default: stdout); a fine-tuning task: its predictions "
                        "file, in the task's format (below)")
    parser.add_argument("--max-length", type=int, metavar="N",
                        help="tokens per example; for a task file use the run's task.max_length (default: the "
                        "task's: 128, 384, squad-article's 4096; at most the model's)")
    parser.add_argument("--batch-size", type=int, default=64, metavar="N", help="examples per batch (default 64)")
    options = parser.add_argument_group("pipeline options")
    options.add_argument("--top-k", type=int, default=None, metavar="K",
                         help="text-classification: the K best labels (default 1; 0: all); fill-mask: K fillings "
                         "a mask (default 5)")
    options.add_argument("--aggregation", choices=("none", "simple", "first", "average", "max"), default=None,
                         help="token-classification: how tokens become entities (default: simple)")
    options.add_argument("--doc-stride", type=int, default=None, metavar="N",
                         help="question-answering: context tokens between window starts (default 128)")
    options.add_argument("--max-answer-length", type=int, default=None, metavar="N",
                         help="question-answering: the longest answer in tokens (default 15)")
    options.add_argument("--max-new-tokens", type=int, default=None, metavar="N",
                         help="text-generation, an encoder-decoder's fill-mask: at most N new tokens (default 20)")
    add_device_arguments(parser, int8=True, int8_help="the encoder layers' linear maps in int8, faster on CPU")
    parser.set_defaults(func=run)


def _pipeline_task(task: str | None) -> str | None:
    """The pipeline task `task` names, None for a fine-tuning task (or a task file)."""
    from bertology.errors import ConfigError
    from bertology.pipelines import task_name

    if task is None:
        return None
    try:
        return task_name(task)
    except ConfigError:
        return None


def run(args: argparse.Namespace) -> int:
    if args.task is not None and _pipeline_task(args.task) is None:
        return run_task_file(args)
    return run_pipeline(args)


def run_task_file(args: argparse.Namespace) -> int:
    from bertology.errors import ConfigError, DataError
    from bertology.recipes.finetune import predict_file

    given = [flag for flag, value in (("--text", args.text), ("--text-pair", args.text_pair),
                                      ("--context", args.context), ("--top-k", args.top_k),
                                      ("--aggregation", args.aggregation), ("--doc-stride", args.doc_stride),
                                      ("--max-answer-length", args.max_answer_length),
                                      ("--max-new-tokens", args.max_new_tokens)) if value is not None]
    if args.format != "auto":
        given.append("--format")
    if given:
        raise ConfigError(f"{', '.join(given)}: pipeline options; --task {args.task} predicts a task file (--input "
                          f"and --output in the task's formats)")
    missing = [flag for flag, value in (("--input", args.input), ("--output", args.output)) if value is None]
    if missing:
        raise ConfigError(f"--task {args.task}: predicting a task file needs {' and '.join(missing)} (for raw text, "
                          f"leave --task out or name a pipeline task such as text-classification)")
    where = placement_from_args(args, int8=True)
    try:
        count = predict_file(args.model, args.task, args.input, args.output, args.max_length, args.batch_size,
                             dtype=where.dtype, device=where.device)
    except DataError as error:
        if not str(error).startswith(str(args.input)):
            raise
        # The file is not in the task's layout: raw text is what a pipeline reads.
        raise DataError(f"{error} (--task {args.task} reads the task's own file layout; for raw text, one item a "
                        f"line, leave --task out: bertology predict --model {args.model} --input {args.input})") \
            from None
    print_result({"output": args.output, "task": args.task, "predictions": count})
    print(f"{count} predictions written to {args.output}", file=sys.stderr)
    return 0


def run_pipeline(args: argparse.Namespace) -> int:
    import json

    from bertology.errors import ConfigError
    from bertology.io import atomic_write, check_output_file
    from bertology.model import load
    from bertology.model.quantize import with_dtype
    from bertology.pipelines import pipeline

    if (args.text is None) == (args.input is None):
        raise ConfigError("give the inputs as --text TEXT (repeatable) or as --input FILE, one of them")
    if args.text is None and (args.text_pair is not None or args.context is not None):
        raise ConfigError("--text-pair and --context go with --text (in an --input file, give them as fields)")
    where = placement_from_args(args, int8=True)  # before the model is loaded
    if args.output is not None:
        check_output_file(args.output)  # and the output: not a directory, not below a file
    source = None if args.input is None else _check_input(args.input)
    pretrained = with_dtype(load(args.model), args.dtype)
    options = {}
    task = _pipeline_task(args.task)
    pipe = pipeline(task, pretrained, device=where.device, dtype=where.float_dtype, batch_size=args.batch_size)
    task = pipe.task
    if args.top_k is not None:
        if task not in ("text-classification", "fill-mask"):
            raise ConfigError(f"--top-k: for text-classification and fill-mask; this is {task}")
        options["top_k"] = None if args.top_k == 0 and task == "text-classification" else args.top_k
    for flag, key, value, tasks in (("--aggregation", "aggregation", args.aggregation, ("token-classification",)),
                                    ("--doc-stride", "doc_stride", args.doc_stride, ("question-answering",)),
                                    ("--max-answer-length", "max_answer_length", args.max_answer_length,
                                     ("question-answering",)),
                                    ("--max-new-tokens", "max_new_tokens", args.max_new_tokens,
                                     ("text-generation", "fill-mask")),
                                    ("--max-length", "max_length", args.max_length,
                                     ("text-classification", "question-answering"))):
        if value is None:
            continue
        if task not in tasks:
            raise ConfigError(f"{flag}: for {' and '.join(tasks)}; this is {task}")
        options[key] = value
    if args.text is not None:
        records = _text_records(args, task)
    else:
        records = _file_records(source, args.format, task)
    items = [pipe.item(record, where) for where, record in records]
    results = pipe.run(items, **options)
    lines = [json.dumps(_output(task, record, result), ensure_ascii=False) + "\n"
             for (_, record), result in zip(records, results)]
    if args.output is None:
        sys.stdout.writelines(lines)
        sys.stdout.flush()
    else:
        with atomic_write(args.output, "w", encoding="utf-8") as handle:
            handle.writelines(lines)
        print_result({"output": args.output, "task": task, "predictions": len(lines)})
        print(f"{len(lines)} {task} results written to {args.output}", file=sys.stderr)
    return 0


def _check_input(path: str):
    from pathlib import Path

    from bertology.errors import DataError

    source = Path(path)
    if source.is_dir():
        raise DataError(f"{source}: is a directory, not an input file")
    if not source.is_file():
        raise DataError(f"{source}: no such file")
    return source


def _text_records(args: argparse.Namespace, task: str) -> list[tuple[str, dict]]:
    from bertology.errors import ConfigError

    if args.text_pair is not None and task != "text-classification":
        raise ConfigError(f"--text-pair: for text-classification; this is {task}")
    if task == "question-answering":
        if args.context is None:
            raise ConfigError("question-answering: give the --context the --text questions are about (or an --input "
                              "JSONL file of {\"question\": ..., \"context\": ...} lines)")
        return [(f"--text {n}", {"question": text, "context": args.context})
                for n, text in enumerate(args.text, start=1)]
    if args.context is not None:
        raise ConfigError(f"--context: for question-answering; this is {task}")
    return [(f"--text {n}", {"text": text} if args.text_pair is None else {"text": text, "text_pair": args.text_pair})
            for n, text in enumerate(args.text, start=1)]


def _file_records(path, format: str, task: str) -> list[tuple[str, dict]]:
    from bertology.errors import DataError
    from bertology.inputs import check_unicode, json_object, text_lines

    jsonl = format == "jsonl" or (format == "auto" and path.suffix.lower() == ".jsonl")
    records: list[tuple[str, dict]] = []
    if not jsonl:
        if task == "question-answering":
            raise DataError(f"{path}: question-answering reads JSON lines with a question and a context "
                            f"(a .jsonl file, or --format jsonl), not plain text")
        records = [(f"{path}: line {number}", {"text": line}) for number, line in text_lines(path)]
    else:
        for number, line in text_lines(path):
            if not line.strip():
                continue
            where = f"{path}: line {number}"
            record = json_object(line, where)
            check_unicode(record, where)
            records.append((where, record))
    if not records:
        raise DataError(f"{path}: no inputs")
    return records


RESULT_KEY = {"text-classification": "labels", "token-classification": "entities", "fill-mask": "fillings",
              "feature-extraction": "vector"}


def _output(task: str, record: dict, result) -> dict:
    """One output line: the input's fields, then the result (under the task's key; QA's and generation's fields
    merged in)."""
    line = {key: value for key, value in record.items() if value is not None}
    if isinstance(result, dict):
        line.update(result)
    else:
        line[RESULT_KEY[task]] = result
    return line
