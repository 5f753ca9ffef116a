"""The `bertology` command. Each subcommand lives in its own module with `register(subparsers)`; this file only
collects them. Commands parse arguments and call the Python API, nothing more."""

from __future__ import annotations

import argparse
import importlib
import os
import sys

# Passive OpenMP waiting, set before torch loads: with spinning workers every parallel region waits for a
# descheduled partner whenever another process shares the cores (measured: 2-10x slower). Override by setting it.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from bertology import __version__  # noqa: E402  (after the environment is set)
from bertology.errors import BertologyError  # noqa: E402

# Modules under bertology.cli that each define `register(subparsers) -> None`.
COMMAND_MODULES: tuple[str, ...] = (
    "tokenizer", "data", "pretrain", "finetune", "predict", "evaluate", "fill_mask", "embed", "info", "demo",
    "quickstart",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="bertology",
        description="BERT-family encoders: Hugging Face checkpoints, pretraining, contextual embeddings.",
    )
    parser.add_argument("--version", action="version", version=f"bertology {__version__}")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(f"bertology.cli.{name}").register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except BertologyError as error:
        print(f"bertology {args.command}: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
