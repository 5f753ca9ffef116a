"""A tampered index directory is refused before faiss reads it: the faiss file's kind, metric, width, count and
every length field are checked against index.json and the file's size (no allocation of what a field claims)."""

from __future__ import annotations

import json
import struct

import pytest

from bertology.cli.main import main
from bertology.errors import ConfigError, DataError
from bertology.retrieval import Index, Structure

faiss = pytest.importorskip("faiss", reason="faiss-cpu is not installed (pip install 'bertology[index]')")

PASSAGES = [{"id": f"p{i}", "text": text} for i, text in enumerate(
    ["the cat sat on the mat .", "paris is the capital of france .", "python is a programming language .",
     "dogs chase cats in the park .", "rain fell over london all day .", "bread is baked from flour and water ."]
    * 7)]  # 42 passages: enough for an IVF of one cell


@pytest.fixture(scope="module")
def saved(tiny, tmp_path_factory):
    """An index directory of each structure."""
    root = tmp_path_factory.mktemp("indexes")
    flat = Index.build(tiny, PASSAGES)
    out = {}
    for kind in ("flat", "hnsw", "ivf"):
        index = flat if kind == "flat" else flat.restructured(Structure(kind, nlist=1 if kind == "ivf" else None))
        out[kind] = index.save(root / kind)
    return out


def copy(source, tmp_path):
    import shutil

    target = tmp_path / source.name
    shutil.copytree(source, target)
    return target


@pytest.mark.parametrize("kind", ["flat", "hnsw", "ivf"])
def test_every_structure_loads_and_searches_after_the_checks(saved, tiny, kind):
    index = Index.load(saved[kind], model=tiny)
    assert len(index) == len(PASSAGES) and index.structure.kind == kind
    assert index.search("the capital of france", k=1)[0][0].text == "paris is the capital of france ."


def test_an_inflated_length_field_is_refused_before_allocating(saved, tmp_path):
    directory = copy(saved["flat"], tmp_path)
    faiss_file = directory / "vectors.faiss"
    data = bytearray(faiss_file.read_bytes())
    data[37:45] = struct.pack("<q", 3_200_000_000)  # the vectors' length field: 12.8 GB of floats
    faiss_file.write_bytes(bytes(data))
    with pytest.raises(DataError, match=r"vectors.faiss: the flat index's vectors claims 3200000000 items of 4 "
                                        r"bytes; only \d+ bytes are left \(byte offset 45\)"):
        Index.load(directory)


@pytest.mark.parametrize("kind", ["hnsw", "ivf"])
def test_an_inflated_length_inside_hnsw_and_ivf_is_refused(saved, tmp_path, kind):
    directory = copy(saved[kind], tmp_path)
    faiss_file = directory / "vectors.faiss"
    data = bytearray(faiss_file.read_bytes())
    offset = 37 if kind == "hnsw" else 37 + 16 + 37  # hnsw.assign_probas; the IVF quantizer's vectors
    data[offset:offset + 8] = struct.pack("<q", 1 << 38)
    faiss_file.write_bytes(bytes(data))
    with pytest.raises(DataError, match=r"vectors.faiss: .* claims 274877906944 items"):
        Index.load(directory)


def test_a_metric_changed_to_l2_is_refused(saved, tmp_path):
    directory = copy(saved["flat"], tmp_path)
    faiss_file = directory / "vectors.faiss"
    data = bytearray(faiss_file.read_bytes())
    data[33:37] = struct.pack("<i", 1)  # METRIC_L2
    faiss_file.write_bytes(bytes(data))
    with pytest.raises(DataError, match="its metric is L2, not inner product"):
        Index.load(directory)


@pytest.mark.parametrize("claimed,actual", [("hnsw", "flat"), ("flat", "hnsw"), ("ivf", "flat")])
def test_index_json_naming_another_structure_is_refused(saved, tmp_path, claimed, actual):
    directory = copy(saved[actual], tmp_path)
    meta_file = directory / "index.json"
    meta = json.loads(meta_file.read_text())
    meta["structure"] = {**meta["structure"], "kind": claimed}
    meta_file.write_text(json.dumps(meta))
    with pytest.raises(DataError, match=f"holds a {actual} index; {claimed} expected"):
        Index.load(directory)


@pytest.mark.parametrize("cut", [0, 10, 44, -4])
def test_a_truncated_faiss_file_is_refused(saved, tmp_path, cut):
    directory = copy(saved["flat"], tmp_path)
    faiss_file = directory / "vectors.faiss"
    faiss_file.write_bytes(faiss_file.read_bytes()[:cut])
    with pytest.raises(DataError, match=r"vectors.faiss: .*(needs \d+ bytes|only \d+ bytes are left)"):
        Index.load(directory)


def test_trailing_bytes_and_a_bad_count_in_index_json_are_refused(saved, tmp_path):
    directory = copy(saved["flat"], tmp_path)
    (directory / "vectors.faiss").write_bytes((directory / "vectors.faiss").read_bytes() + b"\0" * 8)
    with pytest.raises(DataError, match="8 bytes follow the index"):
        Index.load(directory)
    directory = copy(saved["hnsw"], tmp_path / "b")
    meta = json.loads((directory / "index.json").read_text())
    (directory / "index.json").write_text(json.dumps({**meta, "passages": "42"}))
    with pytest.raises(DataError, match="passages must be a non-negative integer, got '42'"):
        Index.load(directory)


def test_search_command_names_the_file_in_one_line(saved, tmp_path, capsys):
    directory = copy(saved["flat"], tmp_path)
    data = bytearray((directory / "vectors.faiss").read_bytes())
    data[33:37] = struct.pack("<i", 1)
    (directory / "vectors.faiss").write_bytes(bytes(data))
    assert main(["search", "--index", str(directory), "cats"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "vectors.faiss" in err and "metric is L2" in err


def test_rebuilding_an_index_that_holds_a_user_file_is_refused(saved, tiny, tmp_path):
    directory = copy(saved["flat"], tmp_path)
    (directory / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match=r"an index, but it also holds notes.txt, which replacing it would remove"):
        Index.build(tiny, PASSAGES[:3]).save(directory)
    assert (directory / "notes.txt").read_text() == "mine" and len(Index.load(directory)) == len(PASSAGES)
