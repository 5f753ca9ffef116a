"""`bertology pretrain`: pretrain a model from a run config (YAML or JSON), with `--set` overrides."""

from __future__ import annotations

import argparse
import sys


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "pretrain",
        help="pretrain a model from a run config (MLM, NSP, SOP, SpanBERT, ELECTRA, distillation; GPT-2's causal "
        "LM, T5's span corruption)",
        description="Pretrain an encoder, a decoder or an encoder-decoder from a run config file (see configs/ for "
        "presets). Under torchrun every process runs this command; rank 0 writes the checkpoints and metrics.",
    )
    parser.add_argument("--config", metavar="FILE", help="run config (.yaml, .yml or .json); default: all defaults")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a config value, e.g. --set optim.lr=1e-4 (repeatable; values are YAML)")
    parser.add_argument("--resume", action="store_true",
                        help="continue from the latest checkpoint in run.output_dir (start fresh if there is none)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace an earlier run's metrics, checkpoints and model in run.output_dir (its "
                        "tokenizer and shards are kept and reused); without it such a directory is refused")
    parser.add_argument("--plot", action="store_true", help="write a PNG of the training curves at the end")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from bertology.cli._result import print_result
    from bertology.recipes.pretrain import pretrain
    from bertology.training.config import load_config

    config = load_config(args.config, args.overrides)
    result = pretrain(config, resume=args.resume, plot=True if args.plot else None, overwrite=args.overwrite)
    print_result({"output_dir": result.output_dir, "model": result.model_dir, "steps": result.steps,
                  "metrics": result.metrics})
    shown = ", ".join(f"{k} {v:.4g}" for k, v in result.metrics.items() if isinstance(v, float))
    print(f"trained {result.steps} steps; model at {result.model_dir}" + (f"; {shown}" if shown else ""),
          file=sys.stderr)
    return 0
