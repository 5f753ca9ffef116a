"""`bertology heads`: what attention heads do (stats), how much each matters (importance), and removing them
(prune)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from bertology.cli._result import print_result
from bertology.device import add_device_arguments, placement_from_args


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "heads",
        help="attention heads: statistics on UD, importance and pruning",
        description="stats: per-head entropy, attention to [CLS]/[SEP]/punctuation, positional and syntactic heads "
        "on a UD treebank (Clark et al. 2019). importance: each head's importance and the metric as heads are "
        "pruned iteratively (Michel et al. 2019). prune: remove heads for good and save the smaller model.",
    )
    commands = parser.add_subparsers(dest="heads_command", metavar="{stats,importance,prune}", required=True)

    stats = commands.add_parser("stats", help="per-head attention statistics on a UD treebank",
                                description="Writes OUT/attention.json, OUT/attention-heads.png (a layer x head heat "
                                "map per statistic) and OUT/attention-syntactic.png (best head per relation vs the "
                                "best fixed offset).")
    stats.add_argument("--model", required=True, metavar="DIR", help="model directory")
    stats.add_argument("--ud", required=True, metavar="DIR", help="UD treebank folder (*-ud-{train,dev,test}.conllu)")
    stats.add_argument("--out", required=True, metavar="DIR", help="output directory")
    stats.add_argument("--overwrite", action="store_true",
                       help="write into an --out folder that holds other files (kept; same-named ones replaced)")
    stats.add_argument("--split", default="dev", choices=("train", "dev", "test"), help="default: dev")
    stats.add_argument("--limit", type=int, metavar="N", help="the first N sentences only")
    stats.add_argument("--min-count", type=int, default=100, metavar="N",
                       help="report relations with at least N arcs (default: 100)")
    stats.add_argument("--batch-size", type=int, default=16)
    stats.add_argument("--quiet", action="store_true", help="no progress bar")
    add_device_arguments(stats)
    stats.set_defaults(func=run_stats)

    importance = commands.add_parser(
        "importance", help="head importance and the pruning curve",
        description="The loss is a fine-tuned classifier's on its task (--task, --data: importances on the first "
        "--examples of train, accuracy on dev) or, without --task, the masked-LM head's on the texts of a UD split "
        "(--ud) or a text file (--text, one text per line). Writes OUT/importance.json and OUT/importance.png.")
    _loss_arguments(importance)
    importance.add_argument("--out", required=True, metavar="DIR", help="output directory")
    importance.add_argument("--overwrite", action="store_true",
                            help="write into an --out folder that holds other files (kept; same-named ones replaced)")
    importance.add_argument("--step", type=float, default=0.1, help="share of heads removed per step (default 0.1)")
    importance.add_argument("--max-share", type=float, default=0.9, help="stop after removing this share (0.9)")
    importance.add_argument("--keep", type=float, default=0.99,
                            help="prunable share: metric at least KEEP x the unpruned one (default 0.99)")
    importance.set_defaults(func=run_importance)

    prune = commands.add_parser(
        "prune", help="remove heads for good and save the smaller model",
        description="Remove the heads named by --heads, or the least important --share of them (pruned iteratively "
        "as in `heads importance`, which then needs the loss arguments), and save the model (transformers' layout "
        "with pruned_heads in config.json, plus pruning.json).")
    _loss_arguments(prune, required=False)
    prune.add_argument("--out", required=True, metavar="DIR", help="directory of the pruned model")
    which = prune.add_mutually_exclusive_group(required=True)
    which.add_argument("--heads", help="LAYER:HEAD,HEAD;LAYER:HEAD (0-based), e.g. '0:1,3;5:0'")
    which.add_argument("--share", type=float, help="remove this share of the heads, least important first")
    prune.add_argument("--step", type=float, default=0.1, help="share removed per pruning step (default 0.1)")
    prune.add_argument("--overwrite", action="store_true",
                       help="write into an --out folder that holds other files (kept; same-named files replaced)")
    prune.set_defaults(func=run_prune)


def _loss_arguments(parser: argparse.ArgumentParser, required: bool = True) -> None:
    parser.add_argument("--model", required=True, metavar="DIR", help="model directory")
    parser.add_argument("--task", help="the fine-tuning task of a fine-tuned classifier (sst2, cola, mrpc, rte)")
    parser.add_argument("--data", metavar="DIR", help="the task's data folder (the GLUE folder)")
    parser.add_argument("--ud", metavar="DIR", help="without --task: masked-LM loss on this UD treebank's dev texts")
    parser.add_argument("--text", metavar="FILE", help="without --task: masked-LM loss on these texts, one a line")
    parser.add_argument("--examples", type=int, default=256, metavar="N",
                        help="examples the importances average over (default 256)")
    parser.add_argument("--eval-examples", type=int, metavar="N", help="evaluate the metric on the first N only")
    parser.add_argument("--threads", type=int, metavar="N", help="torch threads")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    add_device_arguments(parser)


def _load(args: argparse.Namespace):
    """The model, on --device (the commands then run it in --dtype)."""
    import torch

    from bertology.model import load

    where = placement_from_args(args)
    if getattr(args, "threads", None):
        torch.set_num_threads(args.threads)
    return where.move(load(args.model))


def _data(args: argparse.Namespace, pretrained):
    from bertology.analysis.importance import MaskedLMData, TaskData
    from bertology.errors import ConfigError

    if args.task:
        if not args.data:
            raise ConfigError("--task needs --data (the task's data folder)")
        return TaskData(pretrained, args.task, args.data, importance_examples=args.examples,
                        eval_examples=args.eval_examples)
    if args.ud:
        from bertology.analysis.ud import read_split

        limit = args.examples + (args.eval_examples or args.examples)
        return MaskedLMData(pretrained, [s.text for s in read_split(args.ud, "dev", limit)],
                            importance_examples=args.examples)
    if args.text:
        from bertology.embeddings import read_texts

        texts = read_texts(args.text, "lines", "text")
        if args.eval_examples is not None:
            texts = texts[: args.examples + args.eval_examples]
        return MaskedLMData(pretrained, texts, importance_examples=args.examples)
    raise ConfigError("give the loss: --task NAME --data DIR (a fine-tuned classifier), or --ud DIR or --text FILE "
                      "(the masked-LM head)")


def run_stats(args: argparse.Namespace) -> int:
    from bertology.io import check_output_directory

    # Before any work: a folder of other files is refused unless --overwrite.
    check_output_directory(args.out, "attention.json", "the output of bertology heads stats", args.overwrite)
    from bertology.analysis.attention import analyze_heads, summary_table

    pretrained = _load(args)
    numbers = analyze_heads(pretrained, args.ud, args.out, split=args.split, limit=args.limit,
                            batch_size=args.batch_size, min_relation_count=args.min_count,
                            show_progress=not args.quiet and sys.stderr.isatty(), dtype=args.dtype)
    print(json.dumps(summary_table(numbers), indent=2))
    print(f"wrote {Path(args.out) / 'attention.json'} and its figures", file=sys.stderr)
    return 0


def run_importance(args: argparse.Namespace) -> int:
    from bertology.io import check_output_directory

    # Before any work: a folder of other files is refused unless --overwrite.
    check_output_directory(args.out, "importance.json", "the output of bertology heads importance", args.overwrite)
    from bertology.analysis.importance import analyze_importance

    pretrained = _load(args)
    numbers = analyze_importance(pretrained, _data(args, pretrained), args.out, step=args.step,
                                 max_share=args.max_share, keep=args.keep,
                                 show_progress=not args.quiet and sys.stderr.isatty(), dtype=args.dtype)
    curve = ", ".join(f"{c['share_removed']:.0%}: {c['metric']:.2f}" for c in numbers["curve"])
    print_result({"out": args.out, "numbers": Path(args.out) / "importance.json", "metric": numbers["metric"],
                  "curve": numbers["curve"], "prunable_share": numbers["prunable_share"]})
    print(f"{numbers['metric']} by share of heads removed: {curve}; prunable share {numbers['prunable_share']:.0%}",
          file=sys.stderr)
    return 0


def run_prune(args: argparse.Namespace) -> int:
    from bertology.analysis.importance import (
        check_pruned_output,
        existing_heads,
        heads_removed_at,
        parameter_count,
        parse_heads,
        prune_model,
        pruning_curve,
        save_pruned,
    )

    from bertology.errors import ConfigError

    heads = parse_heads(args.heads) if args.heads is not None else None  # checked before any work, as --out is
    if heads is None and not 0 < args.share < 1:
        raise ConfigError(f"--share must lie in (0, 1), got {args.share}")
    check_pruned_output(args.out, args.overwrite)
    pretrained = _load(args)
    before = parameter_count(pretrained.model)
    record: dict = {"model": str(args.model)}
    if heads is None:
        data = _data(args, pretrained)
        steps = pruning_curve(pretrained.model, data, step=args.step, max_share=args.share,
                              show_progress=not args.quiet and sys.stderr.isatty(), dtype=args.dtype)
        heads = heads_removed_at(steps, args.share)
        record.update(metric=data.metric_name, curve=[{"share_removed": s.share, "metric": s.metric} for s in steps])
    total = int(existing_heads(pretrained.model).sum())
    prune_model(pretrained, heads)
    record.update(pruned_heads={str(k): v for k, v in heads.items()}, heads_before=total,
                  heads_after=int(existing_heads(pretrained.model).sum()), parameters_before=before,
                  parameters_after=parameter_count(pretrained.model))
    if args.heads is None:  # the pruned model itself, measured: it must match the curve's last masked step
        with placement_from_args(args).autocast():
            record["metric_of_pruned_model"] = data.metric(pretrained.model,
                                                           existing_heads(pretrained.model).float())
    save_pruned(pretrained, args.out, record, overwrite=args.overwrite)
    print_result({"out": args.out, **record})
    print(f"removed {total - record['heads_after']} of {total} heads; parameters {before:,} -> "
          f"{record['parameters_after']:,}; saved to {args.out}", file=sys.stderr)
    return 0
