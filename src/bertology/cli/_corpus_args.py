"""Corpus arguments shared by the commands that read a corpus (`data prepare`, `tokenizer train`): FILE entries,
each optionally prefixed with FORMAT: to mix formats in one run, and --format, --text-field, --encoding, --task."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from bertology.text.corpus import CORPUS_FORMATS, CorpusSource
from bertology.errors import ConfigError

PREFIX_HELP = ("A FILE may start with FORMAT: (e.g. brown:../shared/data/brown-nltk) to read it in another format "
               "than --format, so one run can mix corpora.")


def add_corpus_arguments(parser: argparse.ArgumentParser) -> None:
    """The FILE positionals and the --format, --text-field, --encoding and --task options."""
    parser.add_argument("files", nargs="+", metavar="FILE", help="[FORMAT:]file, directory or glob")
    parser.add_argument("--format", choices=CORPUS_FORMATS, default="bert",
                        help="corpus format (default: bert, one sentence per line, blank lines between documents)")
    parser.add_argument("--text-field", default="text", help="JSON field holding the text (jsonl format)")
    parser.add_argument("--encoding", default="utf-8", help="text encoding of the files (default: utf-8)")
    parser.add_argument("--task", default=None,
                        help="GLUE task whose train.tsv texts the glue format reads (sst2, cola, mrpc, rte, stsb)")


def corpus_sources(
    entries: Sequence[str], format: str = "bert", text_field: str = "text", encoding: str = "utf-8",
    task: str | None = None,
) -> list[CorpusSource]:
    """Sources in command-line order, one per run of consecutive entries in the same format; a FORMAT: prefix
    overrides ``format`` for its entry. An entry whose prefix is not a format name is a path as written. ``task``
    is the glue format's GLUE task."""
    runs: list[tuple[str, list[str]]] = []
    for entry in entries:
        prefix, colon, rest = entry.partition(":")
        fmt, path = (prefix, rest) if colon and prefix in CORPUS_FORMATS else (format, entry)
        if not path:
            raise ConfigError(f"{entry!r}: no path after the format prefix")
        if runs and runs[-1][0] == fmt:
            runs[-1][1].append(path)
        else:
            runs.append((fmt, [path]))
    if task is not None and all(fmt != "glue" for fmt, _ in runs):
        raise ConfigError(f"--task {task}: read by the glue format only (--format glue or a glue: prefix)")
    return [CorpusSource(paths, fmt, text_field, encoding, task if fmt == "glue" else None) for fmt, paths in runs]


def sources_from_args(args: argparse.Namespace) -> list[CorpusSource]:
    """:func:`corpus_sources` of the arguments added by :func:`add_corpus_arguments`."""
    return corpus_sources(args.files, args.format, args.text_field, args.encoding, args.task)
