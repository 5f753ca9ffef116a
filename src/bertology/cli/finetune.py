"""`bertology finetune`: fine-tune a model on a registered task with the shared training loop."""

from __future__ import annotations

import argparse
import json
import sys


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "finetune",
        help="fine-tune a model on a task (GLUE, CoNLL-2003 NER and span typing, SQuAD)",
        description="Fine-tune a model directory on a task: the task's head, its dev metrics at every "
        "evaluation, the best model kept (in the transformers layout, with its label names) in OUT/model, "
        "dev predictions and their official metrics in OUT. Settings: --config FILE (YAML or JSON: model, task, "
        "select, optim, run, speed sections) and --set key=value.",
    )
    parser.add_argument("--task", required=True,
                        help="sst2, cola, mrpc, rte, stsb (GLUE), conll2003 (NER), conll2003-spans, squad, or the path of a "
                        "task file or an instructions file (several tasks as instructions: docs/INSTRUCTIONS.md)")
    parser.add_argument("--model", required=True, metavar="DIR", help="the model directory to fine-tune")
    parser.add_argument("--out", required=True, metavar="DIR", help="the run's output directory")
    parser.add_argument("--data", metavar="DIR", help="the task's data: the GLUE folder (holding SST-2/, CoLA/, ...), "
                        "the CoNLL-2003 folder (eng.train, eng.testa) or the SQuAD folder")
    parser.add_argument("--config", metavar="FILE", help="run config (.yaml, .yml or .json)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a config value, e.g. --set optim.lr=3e-5 (repeatable; values are YAML)")
    parser.add_argument("--max-steps", type=int, metavar="N", help="at most N optimizer steps")
    parser.add_argument("--limit-train", type=int, metavar="N", help="train on the first N examples only")
    parser.add_argument("--tagger", choices=("linear", "bilstm-crf"),
                        help="a tagging task's head: a linear layer on every token (default), or a BiLSTM and a "
                        "linear-chain CRF decoded by Viterbi (task.tagger)")
    parser.add_argument("--retriever", metavar="DIR", help="--task rag: the query encoder (an encoder whose vectors "
                        "have the index's width; task.retriever)")
    parser.add_argument("--index", metavar="DIR", help="--task rag: the dense passage index (task.index)")
    parser.add_argument("--resume", action="store_true", help="continue from the latest checkpoint in --out")
    parser.add_argument("--overwrite", action="store_true", help="replace an earlier run's outputs in --out")
    parser.add_argument("--keep-checkpoint", action="store_true",
                        help="keep the last checkpoint (with the optimizer state) when the run ends; by default a "
                        "finished run keeps only OUT/model (run.keep_checkpoint)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from bertology.cli._result import print_result
    from bertology.recipes.finetune import FinetuneConfig, finetune
    from bertology.training.config import apply_overrides, read_config_file

    data = read_config_file(args.config) if args.config else {}
    settings = [f"model={json.dumps(args.model)}", f"task.name={args.task}", f"run.output_dir={json.dumps(args.out)}"]
    if args.data:
        settings.append(f"task.data={json.dumps(args.data)}")
    if args.max_steps is not None:
        settings.append(f"task.max_steps={args.max_steps}")
    if args.limit_train is not None:
        settings.append(f"task.limit_train={args.limit_train}")
    if args.tagger is not None:
        settings.append(f"task.tagger={args.tagger}")
    if args.retriever is not None:
        settings.append(f"task.retriever={json.dumps(args.retriever)}")
    if args.index is not None:
        settings.append(f"task.index={json.dumps(args.index)}")
    if args.keep_checkpoint:
        settings.append("run.keep_checkpoint=true")
    config = FinetuneConfig.from_dict(apply_overrides(data, [*settings, *args.overrides]))
    result = finetune(config, resume=args.resume, overwrite=args.overwrite)
    best = result.best
    print_result({"output_dir": result.output_dir, "model": result.model_dir, "steps": result.steps,
                  "trainable": result.trainable.trainable, "parameters": result.trainable.total, "best": best,
                  "dev_metrics": result.dev_metrics})
    print(f"fine-tuned {result.steps} steps ({result.trainable}); best dev {best['metric']} {best['value']:.2f} at step {best['step']}; "
          f"model at {result.model_dir}; dev metrics {json.dumps(result.dev_metrics)}", file=sys.stderr)
    return 0
