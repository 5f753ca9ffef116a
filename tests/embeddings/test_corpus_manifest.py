"""Reading a corpus run's manifest: a missing, broken or foreign one is an error naming the file."""

from __future__ import annotations

import pytest

from bertology.embeddings import iter_shards, load_corpus
from bertology.embeddings.corpus import read_manifest
from bertology.errors import ConfigError, DataError


def test_missing_broken_and_foreign_manifests_name_the_file(tmp_path):
    with pytest.raises(DataError, match=r"out: no manifest\.json: not the output of a corpus embedding run"):
        read_manifest(tmp_path / "out")
    (tmp_path / "manifest.json").write_text('{"format": 1, "shards": [', encoding="utf-8")
    with pytest.raises(DataError, match=r"manifest\.json: not a manifest written by bertology embed \(Expecting"):
        list(iter_shards(tmp_path))
    (tmp_path / "manifest.json").write_bytes(b'{"caf\xe9": 1}')
    with pytest.raises(DataError, match=r"manifest\.json: not a manifest written by bertology embed \('utf-8'"):
        load_corpus(tmp_path)
    (tmp_path / "manifest.json").write_text('[{"fingerprint": {}}]', encoding="utf-8")
    with pytest.raises(ConfigError, match=r"manifest\.json: not a manifest written by bertology embed \(no fing"):
        read_manifest(tmp_path, ConfigError)


def test_a_manifest_is_read_as_written(tmp_path):
    (tmp_path / "manifest.json").write_text('{"fingerprint": {"level": "sentence"}, "complete": false}',
                                            encoding="utf-8")
    assert read_manifest(tmp_path) == {"fingerprint": {"level": "sentence"}, "complete": False}
    with pytest.raises(DataError, match="the run is not complete; finish it with --resume"):
        list(iter_shards(tmp_path))
