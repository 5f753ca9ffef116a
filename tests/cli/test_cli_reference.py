"""docs/CLI.md is what the parsers say: regenerate it with `python -m bertology.cli._reference > docs/CLI.md`."""

from __future__ import annotations

from pathlib import Path

from bertology.cli._reference import render

ROOT = Path(__file__).resolve().parents[2]


def test_cli_reference_matches_the_parsers():
    written = (ROOT / "docs" / "CLI.md").read_text(encoding="utf-8")
    assert written == render(), "docs/CLI.md is stale: python -m bertology.cli._reference > docs/CLI.md"


def test_cli_reference_has_every_command_and_subcommand():
    text = render()
    for name in ("quickstart", "pretrain", "finetune", "predict", "embed", "serve", "tokenizer train",
                 "heads prune", "wsd score", "longformer convert"):
        assert f"## `bertology {name}`" in text
    assert "usage: bertology finetune" in text
