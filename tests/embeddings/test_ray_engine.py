"""The corpus run on Ray Data: the actor's shard encoder against the local engine, and a whole run on a local Ray
instance (two CPUs) whose shards equal the single-machine run's bit for bit."""

from __future__ import annotations

import io
import json
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest
import torch

from bertology.embeddings.corpus import CorpusSettings, embed_corpus, find_inputs, iter_shards, plan_shards
from bertology.errors import ConfigError

pytest.importorskip("ray.data", reason="Ray Data is not installed (pip install 'bertology[ray]')")

from bertology.embeddings.ray_engine import ShardEncoder, run_ray  # noqa: E402


@pytest.fixture()
def corpus(tmp_path) -> Path:
    root = tmp_path / "corpus"
    root.mkdir()
    for i in range(3):
        (root / f"part-{i}.jsonl").write_text("".join(
            json.dumps({"id": f"{i}-{j}", "text": f"Document {j} of part {i} says {'more ' * j}words."}) + "\n"
            for j in range(5)), encoding="utf-8")
    return root


@pytest.fixture()
def one_thread():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def test_shard_encoder_equals_the_local_engine(small_model, corpus, tmp_path, one_thread):
    settings = CorpusSettings(format="jsonl", shard_size=2, level="token")
    local = tmp_path / "local"
    embed_corpus(small_model, corpus, local, settings, threads=1)
    root, files = find_inputs(corpus)
    shards, _ = plan_shards(root, files, settings)
    encoder = ShardEncoder(str(small_model), str(root), settings.to_json(), threads=1)
    # What Ray Data hands the actor: one column per Shard field, numpy arrays.
    batch = {key: np.array([asdict(s)[key] for s in shards]) for key in asdict(shards[0])}
    out = encoder(batch)
    assert list(out["name"]) == [s.name for s in shards]
    for (name, vectors, index), packed, rows in zip(iter_shards(local), out["vectors"], out["index"], strict=True):
        np.testing.assert_array_equal(np.load(io.BytesIO(packed)), vectors)
        assert json.loads(rows) == index


def test_bad_pool_sizes(small_model, corpus):
    with pytest.raises(ConfigError, match="workers must be a positive integer, got 0"):
        run_ray(small_model, corpus, [], CorpusSettings(), lambda *a: None, workers=0)
    with pytest.raises(ConfigError, match="engine: unknown 'spark'"):
        embed_corpus(small_model, corpus, corpus.parent / "out", engine="spark")


@pytest.mark.slow  # starting a local Ray instance takes 20 to 60 s on a busy 2-core machine
def test_ray_run_equals_the_single_machine_run(small_model, corpus, tmp_path, one_thread):
    import ray

    settings = CorpusSettings(format="jsonl", shard_size=2)
    local, distributed = tmp_path / "local", tmp_path / "ray"
    embed_corpus(small_model, corpus, local, settings, threads=1)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        report = embed_corpus(small_model, corpus, distributed, settings, engine="ray", workers=2, threads=1)
        assert (report.written, report.shards) == (9, 9)
        # Resume on Ray: remove two shards, they alone are redone.
        for name in ("00001", "00007"):
            for f in (distributed / "shards" / name).iterdir():
                f.unlink()
            (distributed / "shards" / name).rmdir()
        again = embed_corpus(small_model, corpus, distributed, settings, resume=True, engine="ray", workers=2,
                             threads=1)
        assert (again.written, again.skipped) == (2, 7)
    finally:
        ray.shutdown()
    for (na, a, ia), (nb, b, ib) in zip(iter_shards(local), iter_shards(distributed), strict=True):
        assert na == nb and ia == ib
        np.testing.assert_array_equal(a, b)


def test_an_actors_bad_input_error_is_unwrapped():
    from bertology.embeddings.ray_engine import _bertology_cause
    from bertology.errors import DataError

    class TaskError(Exception):  # Ray's RayTaskError keeps the actor's exception in .cause
        def __init__(self, cause):
            super().__init__("task failed")
            self.cause = cause

    bad = DataError("x.jsonl: line 3: invalid JSON")
    wrapper = RuntimeError("user code failed")
    wrapper.__cause__ = TaskError(bad)
    assert _bertology_cause(wrapper) is bad
    assert _bertology_cause(RuntimeError("other")) is None
