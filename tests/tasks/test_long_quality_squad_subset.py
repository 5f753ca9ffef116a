"""benchmarks/long_quality.py's SQuAD subset: whole articles of the task's own train/dev split of the shared part A,
each one context (its paragraphs joined as `squad-article` joins them), a few questions of each, answers intact."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from bertology.tasks.lookup import get_task
from bertology.tasks.qa import split_path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "long_quality.py"


def test_squad_subset_keeps_the_article_split_and_whole_articles(tmp_path, data_dir):
    source = data_dir / "squad" / "squad-v1.1-dev-part-a.json"
    if not source.is_file():
        pytest.skip(f"{source} not found")
    spec = importlib.util.spec_from_file_location("long_quality", SCRIPT)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    bench.squad_data(tmp_path, 4, 3, source)
    task = get_task("squad-article")
    for split, per_article, articles in (("train", 4, 18), ("dev", 3, 6)):
        full = task.read(split_path(source, split))
        subset = task.read(task.path(str(tmp_path / "squad"), split))
        assert len(subset) == per_article * articles and len({e.title for e in subset}) == articles
        whole = {e.id: e for e in full}
        for example in subset:  # the same question, the same whole article, the same answer offsets
            assert example == whole[example.id]
        by_title = {}
        for example in full:
            by_title.setdefault(example.title, []).append(example.id)
        picked = [e.id for e in subset if e.title == subset[0].title]
        assert picked[0] == by_title[subset[0].title][0] and picked != by_title[subset[0].title][:per_article]
