"""`bertology evaluate`: the official metrics of a predictions file (SQuAD v1.1, conlleval, GLUE, span typing, a
user's task file)."""

from __future__ import annotations

import argparse
import json

# bertology.tasks.metrics.TASKS, spelled out so that building the parser imports nothing (a test checks)
TASKS = ("squad", "conll", "conll2003", "sst2", "cola", "mrpc", "rte", "stsb")


def register(subparsers: argparse._SubParsersAction) -> None:
    from bertology.device import add_device_arguments

    parser = subparsers.add_parser(
        "evaluate",
        help="score predictions with a task's official metrics",
        description="Print a task's metrics of a predictions file as one JSON object, every metric a percentage "
        "(x100, as the SQuAD script, conlleval and the GLUE leaderboard report them). squad: --gold is the SQuAD "
        "v1.1 JSON, --predictions a JSON object of question id to answer; prints exact_match, f1. conll, "
        "conll2003: --predictions alone, in conlleval's format (gold and predicted tag the last two columns); "
        "prints precision, recall, f1, accuracy, counts and per_type. sst2, rte (accuracy), cola (mcc), mrpc "
        "(accuracy, f1), stsb (pearson, spearman): --gold is the GLUE dev tsv, --predictions a tsv with the header "
        "'index<TAB>prediction' and a label for each gold row. conll2003-spans: --predictions alone (the span "
        "typing predictions tsv holds the gold type); prints accuracy and macro_f1. A task file (.yaml/.json): "
        "the metrics it names, of the predictions `bertology predict` wrote for it.",
    )
    parser.add_argument("--task", required=True, metavar="TASK",
                        help=f"{', '.join(TASKS)}, conll2003-spans, retrieval, open-qa, or a task file")
    parser.add_argument("--predictions", metavar="FILE", help="the predictions file (every task but retrieval and open-qa)")
    parser.add_argument("--gold", metavar="FILE", help="the gold file (not used by conll)")
    parser.add_argument("--allow-missing", action="store_true",
                        help="squad: score a question without a prediction 0, as the official script does, "
                        "and print their number as 'missing', instead of stopping with an error")
    parser.add_argument("--open-labels", action="store_true",
                        help="GLUE: a prediction that is none of the task's labels (a text-to-text model's "
                        "generated text, as T5's fine-tuning writes it) counts as wrong instead of being an error")
    parser.add_argument("--index", metavar="INDEX",
                        help="retrieval, open-qa: an index of any kind (`bertology index build --squad FILE`); with --squad FILE, "
                        "prints recall@1/5/20/100 and MRR@10 (percent) of every question against all the index's "
                        "passages")
    parser.add_argument("--kind", choices=("dense", "bm25", "hybrid"), default=None,
                        help="retrieval, open-qa: the kind the index must be (default: whatever it records)")
    parser.add_argument("--split", choices=("train", "dev"), default=None,
                        help="retrieval, open-qa: only that split's questions, as `finetune --task squad` splits --squad "
                        "(by article when it is one file)")
    parser.add_argument("--rerank", metavar="DIR", default=None,
                        help="retrieval, open-qa: a cross-encoder reranker (`finetune --task rerank`) re-scoring each "
                        "question's first --rerank-depth passages")
    parser.add_argument("--rerank-depth", type=int, default=100, help="retrieval, open-qa: see --rerank (default 100)")
    parser.add_argument("--squad", metavar="FILE",
                        help="retrieval, open-qa: the SQuAD v1.1 file the index was built from")
    parser.add_argument("--reader", metavar="DIR", default=None,
                        help="open-qa: an extractive reader (`finetune --task squad`: a model with the qa head) run "
                        "over each question's --k retrieved passages; prints the official SQuAD v1.1 exact_match, f1 "
                        "and recall@k of the retrieved passages")
    parser.add_argument("--generator", metavar="DIR", default=None,
                        help="open-qa: a RAG model (`finetune --task rag`) instead of --reader: its query encoder "
                        "retrieves --k passages (default: its k) from --index (default: the index it records), it "
                        "generates the answer by its marginalisation; the same JSON object")
    parser.add_argument("--k", type=int, default=None,
                        help="open-qa: passages retrieved per question (default 10, or all of a smaller index; at "
                        "most the index's size)")
    parser.add_argument("--selection", choices=("reader", "reranker"), default="reader",
                        help="open-qa: the passage selection score added to the span score (docs/RETRIEVAL.md): "
                        "reader (default: the span's start + end logit compared across passages) or reranker "
                        "(log P(relevant) of --rerank plus the span's log-probability within its passage)")
    parser.add_argument("--max-length", type=int, default=384,
                        help="open-qa: the reader's windows, question and specials included (default 384, at most "
                        "the reader's positions); a passage longer than that is read in windows 128 tokens apart")
    parser.add_argument("--out", metavar="DIR", default=None,
                        help="open-qa: write predictions.json (question id -> answer, the official format) and "
                        "metrics.json into DIR (created if missing); nothing is written without it")
    add_device_arguments(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from bertology.errors import ConfigError
    from bertology.tasks.metrics import evaluate_files

    name = args.task.lower() if args.task.lower() in TASKS else args.task
    if name.lower() == "retrieval":
        from bertology.device import placement_from_args
        from bertology.retrieval.evaluate import evaluate_retrieval

        where = placement_from_args(args)
        print(json.dumps(evaluate_retrieval(args.index, args.squad, device=where.device, dtype=where.dtype,
                                            kind=args.kind, split=args.split, rerank=args.rerank,
                                            rerank_depth=args.rerank_depth)))
        return 0
    if name.lower() == "open-qa":
        import sys

        from bertology.device import placement_from_args
        from bertology.retrieval.open_qa import open_qa

        where = placement_from_args(args)
        print(json.dumps(open_qa(args.index, args.squad, args.reader, k=args.k, device=where.device,
                                 dtype=where.dtype, kind=args.kind, split=args.split, rerank=args.rerank,
                                 rerank_depth=args.rerank_depth, selection=args.selection, out=args.out,
                                 max_length=args.max_length, show_progress=sys.stderr.isatty(),
                                 generator=args.generator)))
        return 0
    if args.device != "auto" or args.dtype != "float32":
        raise ConfigError(f"--device, --dtype: for --task retrieval and open-qa only (they embed the questions); "
                          f"{args.task} scores files")
    if args.predictions is None:
        raise ConfigError(f"evaluate --task {args.task}: --predictions FILE is required")
    if name in TASKS:
        metrics = evaluate_files(name, args.predictions, args.gold, allow_missing=args.allow_missing,
                                 open_labels=args.open_labels)
    else:  # any other registered task (span typing) or a user's task file scores with its own evaluate
        from bertology.tasks.lookup import get_task

        task = get_task(name)
        gold = Path(args.gold) if args.gold else None
        if gold is None and not _gold_in_predictions(task):
            raise ConfigError(f"evaluate --task {args.task}: --gold FILE is required")
        metrics = task.evaluate(Path(args.predictions), gold)  # type: ignore[arg-type]
    print(json.dumps(metrics))
    return 0


def _gold_in_predictions(task: object) -> bool:
    """Span typing and a tagging task file write the gold label beside each prediction."""
    return getattr(task, "kind", None) == "tagging" or getattr(task, "name", "") == "conll2003-spans"
