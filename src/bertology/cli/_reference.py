"""docs/CLI.md, generated from the parsers themselves: every command's and subcommand's `--help`, in the order
`bertology --help` lists them. `python -m bertology.cli._reference > docs/CLI.md` rewrites it; a test keeps the
file equal to what the parsers say, so the options are documented in one place (the parsers) and never drift."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterator

HEADER = (
    "# Command-line reference\n\n"
    "Generated from the argument parsers (`python -m bertology.cli._reference > docs/CLI.md`; "
    "`tests/cli/test_cli_reference.py` keeps it in sync). Each section is that command's `--help`.\n"
)

# argparse wraps help text to the terminal's width: fixed here so the file is the same on every machine.
WIDTH = "100"


def _subcommands(parser: argparse.ArgumentParser) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            yield from action.choices.items()


def _walk(parser: argparse.ArgumentParser) -> Iterator[argparse.ArgumentParser]:
    yield parser
    for _, child in _subcommands(parser):
        yield from _walk(child)


def render() -> str:
    """The whole reference as Markdown: one section a (sub)command, its help text in a code block."""
    previous = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = WIDTH
    try:
        from bertology.cli.main import build_parser

        parts = [HEADER]
        for parser in _walk(build_parser()):
            parts.append(f"\n## `{parser.prog}`\n\n```text\n{parser.format_help().rstrip()}\n```\n")
        return "".join(parts)
    finally:
        if previous is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = previous


if __name__ == "__main__":
    sys.stdout.write(render())
