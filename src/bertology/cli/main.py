"""The `bertology` command. Each subcommand lives in its own module with `register(subparsers)`; this file only
collects them. Commands parse arguments and call the Python API, nothing more."""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys

# `import bertology` (the package, imported before this module runs) sets passive OpenMP waiting before torch loads.
from bertology import __version__
from bertology.errors import BertologyError

# The commands in the order `--help` lists them; any other module under bertology.cli that defines
# `register(subparsers) -> None` follows in alphabetical order, so a new command is one new file.
FIRST_COMMANDS: tuple[str, ...] = (
    "quickstart", "tokenizer", "data", "pretrain", "finetune", "predict", "evaluate", "fill_mask", "embed", "info",
    "demo", "generate",
)


def command_modules() -> list[str]:
    import bertology.cli as package

    found = sorted(m.name for m in pkgutil.iter_modules(package.__path__) if not m.name.startswith("_")
                   and m.name != "main")
    return [name for name in FIRST_COMMANDS if name in found] + [n for n in found if n not in FIRST_COMMANDS]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="bertology",
        description="BERT-family encoders: Hugging Face checkpoints, pretraining, contextual embeddings.",
    )
    parser.add_argument("--version", action="version", version=f"bertology {__version__}")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in command_modules():
        module = importlib.import_module(f"bertology.cli.{name}")
        if hasattr(module, "register"):
            module.register(subparsers)
    return parser


def resolve_models(args: argparse.Namespace) -> None:
    """Every command's `--model` (one or several) may name an installed model instead of its directory."""
    from bertology.model.local import resolve_model_path

    value = getattr(args, "model", None)
    if isinstance(value, str):
        args.model = str(resolve_model_path(value))
    elif isinstance(value, list) and all(isinstance(item, str) for item in value):
        args.model = [str(resolve_model_path(item)) for item in value]


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        resolve_models(args)
        return int(args.func(args) or 0)
    except BertologyError as error:
        print(f"bertology {args.command}: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
