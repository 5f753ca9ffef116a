"""Shared fixtures: the real MiniLM tokenizer files, and small tokenizers of each kind trained on a corpus written
here, saved by bertology into temporary directories."""

from __future__ import annotations

from pathlib import Path

import pytest

from bertology.tokenization import Tokenizer, train_tokenizer

from tok_data import CORPUS, KINDS


@pytest.fixture(scope="session")
def minilm(minilm_path: Path) -> Path:
    """The MiniLM model directory (tests/conftest.py finds it, or skips)."""
    return minilm_path


@pytest.fixture(scope="session")
def corpus_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("corpus") / "corpus.txt"
    path.write_text(CORPUS, encoding="utf-8")
    return path


@pytest.fixture(scope="session")
def trained(corpus_file: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], tuple[Tokenizer, Path]]:
    """One tokenizer per (kind, style), trained from the corpus file and saved by bertology."""
    result = {}
    for (kind, style), size in KINDS.items():
        tokenizer = train_tokenizer(corpus_file, kind, size, style=style, min_frequency=1, show_progress=False)
        directory = tmp_path_factory.mktemp(f"{kind}-{style}")
        tokenizer.save(directory)
        result[(kind, style)] = (tokenizer, directory)
    return result
