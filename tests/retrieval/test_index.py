"""Index.build / save / load / search: exact inner products, approximate structures against exact search, the model
fingerprint, atomic writes, the embedding options recorded, and every bad input."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from bertology.embeddings import embed
from bertology.errors import ConfigError, DataError
from bertology.retrieval import (
    EmbeddingOptions,
    Index,
    IndexMismatchError,
    Passage,
    Structure,
    model_fingerprint,
    model_options,
    normalize,
)
from bertology.retrieval.index import _build_faiss

faiss = pytest.importorskip("faiss", reason="faiss-cpu is not installed (pip install 'bertology[index]')")

PASSAGES = [
    {"id": "cat", "text": "the cat sat on the mat ."},
    {"id": "paris", "text": "paris is the capital of france ."},
    {"id": 7, "text": "python is a programming language ."},
    {"id": "dogs", "text": "dogs chase cats in the park ."},
    {"id": "rain", "text": "rain fell over london all day ."},
    {"id": "bread", "text": "bread is baked from flour and water ."},
]
QUERIES = ["the capital of france", "cats and dogs", "flour", ""]


def test_exact_search_returns_the_largest_inner_products(tiny):
    index = Index.build(tiny, PASSAGES)
    options = index.options
    assert (options.sentence, options.layers, options.long_texts, options.source) == \
        ("mean", "last", "windows", "bertology defaults")
    passages = normalize(embed(tiny, [p["text"] for p in PASSAGES]).sentences)
    queries = normalize(embed(tiny, QUERIES).sentences)
    np.testing.assert_allclose(np.linalg.norm(passages, axis=1), 1.0, atol=1e-6)
    expected = queries @ passages.T
    ids = [str(p["id"]) for p in PASSAGES]
    results = index.search(QUERIES, k=4)
    assert len(results) == len(QUERIES)
    for q, hits in enumerate(results):
        order = np.argsort(-expected[q], kind="stable")[:4]
        assert [h.row for h in hits] == order.tolist()
        assert [h.id for h in hits] == [ids[r] for r in order]
        assert [h.text for h in hits] == [PASSAGES[r]["text"] for r in order]
        np.testing.assert_allclose([h.score for h in hits], expected[q, order], atol=1e-5)


def test_a_passage_vector_finds_itself_and_k_beyond_the_index_is_cut(tiny):
    index = Index.build(tiny, PASSAGES)
    vectors = index.encode([p["text"] for p in PASSAGES])
    for row, hits in enumerate(index.search(vectors * 3.0, k=1)):  # query vectors are normalised here
        assert hits[0].row == row and hits[0].score == pytest.approx(1.0, abs=1e-5)
    assert len(index.search(vectors[0], k=50)[0]) == len(PASSAGES)  # a [D] vector is one query
    assert index.search("paris", k=2)[0][0].id  # a string is one query
    assert index.search([], k=3) == []


MINILM_PASSAGES = [Passage("fr", "Paris is the capital and largest city of France."),
                   Passage("cat", "The cat is sleeping on the sofa."),
                   Passage("py", "Python is a popular programming language.")]


def test_minilm_finds_the_obvious_passage(minilm, minilm_path):
    index = Index.build(minilm, MINILM_PASSAGES, model_dir=minilm_path)  # the directory gives the options
    assert (index.options.sentence, index.options.max_length, index.options.long_texts) == ("mean", 256, "truncate")
    hits = index.search(["Which city is France's capital?", "my kitten naps", "writing code"], k=1)
    assert [h[0].id for h in hits] == ["fr", "cat", "py"]


@pytest.mark.slow
def test_minilm_vectors_match_sentence_transformers(minilm_path):
    index = Index.build(minilm_path, MINILM_PASSAGES)
    passages = MINILM_PASSAGES
    sentence_transformers = pytest.importorskip("sentence_transformers")
    reference = sentence_transformers.SentenceTransformer(str(minilm_path), device="cpu")
    texts = [p.text for p in passages] + ["a long text " * 150]  # 450 tokens: truncated at 256 as the reference
    np.testing.assert_allclose(index.encode(texts), reference.encode(texts), atol=1e-5)


def test_approximate_structures_agree_with_exact_search(tiny):
    passages = [{"id": f"p{i}", "text": " ".join(np.random.default_rng(i).choice(
        ["cat", "mat", "paris", "france", "python", "rain", "bread", "dogs", "park", "flour"], 6))}
        for i in range(80)]
    queries = ["cat on a mat", "bread and flour", "rain over paris", "python dogs"]
    exact = Index.build(tiny, passages)
    hnsw = Index.build(tiny, passages, structure=Structure("hnsw", hnsw_m=8, ef_construction=64, ef_search=64))
    ivf = exact.restructured(Structure("ivf", nlist=8, nprobe=8))  # every cell visited: exact
    expected = [[h.row for h in hits] for hits in exact.search(queries, k=5)]
    for approximate in (hnsw, ivf):
        found = approximate.search(queries, k=5)
        assert [[h.row for h in hits] for hits in found] == expected
    assert hnsw.meta["structure_parameters"] == {"kind": "hnsw", "hnsw_m": 8, "ef_construction": 64,
                                                 "ef_search": 64}
    assert ivf.meta["structure_parameters"] == {"kind": "ivf", "nlist": 8, "nprobe": 8}
    np.testing.assert_allclose(ivf.vectors(), exact.vectors(), atol=1e-6)
    assert [[h.row for h in hits] for hits in exact.restructured(Structure("hnsw")).search(queries, k=5)] == expected
    default_ivf = hnsw.restructured(Structure("ivf"))
    assert default_ivf.meta["structure_parameters"]["nlist"] == 2  # 4 sqrt(80) = 36, but 39 passages a cell


def test_hnsw_and_ivf_recall_on_random_unit_vectors():
    rng = np.random.default_rng(0)
    vectors = normalize(rng.standard_normal((2000, 32)))
    queries = normalize(rng.standard_normal((100, 32)))
    exact, _ = _build_faiss(vectors, Structure())
    _, truth = exact.search(queries, 10)
    hnsw, _ = _build_faiss(vectors, Structure("hnsw"))
    _, found = hnsw.search(queries, 10)
    recall = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(truth, found)])
    assert recall >= 0.97, recall
    ivf, parameters = _build_faiss(vectors, Structure("ivf", nprobe=32))
    assert parameters["nlist"] == 51  # 4 sqrt(2000) = 179 cells would get 11 passages each; 2000 // 39
    _, found = ivf.search(queries, 10)
    assert np.mean([len(set(a) & set(b)) / 10 for a, b in zip(truth, found)]) >= 0.6


def test_round_trip_keeps_results_options_and_fingerprint(tiny, tiny_dir, tmp_path):
    options = EmbeddingOptions(layers=[-2, -1], combine="mean", sentence="cls")
    odd = {"id": "odd", "text": "line\u2028separator\u0085next\r\n🙂 \x00 end"}  # kept whole by the JSON lines
    index = Index.build(tiny_dir, PASSAGES + [odd], options=options, structure=Structure("hnsw", ef_search=40))
    before = index.search(QUERIES, k=3)
    index.save(tmp_path / "index")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["index"]  # no temporary left beside it
    meta = json.loads((tmp_path / "index" / "index.json").read_text())
    assert meta["embedding"]["layers"] == [-2, -1] and meta["embedding"]["sentence"] == "cls"
    assert meta["model"]["fingerprint"] == model_fingerprint(tiny)
    assert meta["model"]["path"] == str(tiny_dir.resolve())
    loaded = Index.load(tmp_path / "index", model=tiny)
    assert loaded.passages == index.passages and loaded.passages[-1].text == odd["text"]
    assert loaded.options == index.options and loaded.structure == index.structure
    assert loaded.search(QUERIES, k=3) == before
    assert loaded.search(QUERIES, k=3, ef_search=8)[0][0].id == before[0][0].id
    vector_only = Index.load(tmp_path / "index")
    with pytest.raises(ConfigError, match="no model attached"):
        vector_only.search("paris")
    vector_only.attach(vector_only.model_path)
    assert vector_only.search(QUERIES, k=3) == before


def test_another_model_is_refused(tiny_dir, other_dir, tmp_path):
    Index.build(tiny_dir, PASSAGES).save(tmp_path / "index")
    with pytest.raises(IndexMismatchError, match="built with another model"):
        Index.load(tmp_path / "index", model=other_dir)
    copy = tmp_path / "copy"
    shutil.copytree(tiny_dir, copy)  # the same weights elsewhere are the same model
    assert Index.load(tmp_path / "index", model=copy).search("paris", k=1)


def test_the_same_weights_in_the_native_format_are_the_same_model(tiny, tiny_dir, tmp_path):
    from bertology.model import load

    tiny.save(tmp_path / "native", format="native")
    assert (tmp_path / "native" / "bertology.json").is_file() and not (tmp_path / "native" / "config.json").exists()
    index = Index.build(tiny_dir, PASSAGES[:2])
    index.attach(tmp_path / "native")
    assert model_fingerprint(load(tmp_path / "native")) == model_fingerprint(tiny)


def test_fingerprint_ignores_heads_and_dropout_but_not_weights(tiny):
    import copy

    import torch

    from bertology.model import EncoderModel, Pretrained
    from bertology.model.encoder import HeadSpec

    import dataclasses

    config = dataclasses.replace(tiny.model.config, hidden_dropout=0.3, attention_dropout=0.2)
    with_head = EncoderModel(config, (HeadSpec("label", "pooled", num_labels=2),))
    with_head.encoder.load_state_dict(tiny.model.encoder.state_dict())
    assert model_fingerprint(Pretrained(with_head, tiny.tokenizer)) == model_fingerprint(tiny)
    changed = copy.deepcopy(tiny.model)
    with torch.no_grad():
        next(changed.encoder.parameters())[0, 0] += 1e-3
    assert model_fingerprint(Pretrained(changed, tiny.tokenizer)) != model_fingerprint(tiny)


def test_a_failed_save_leaves_the_previous_index(tiny, tmp_path, monkeypatch):
    target = tmp_path / "index"
    Index.build(tiny, PASSAGES[:2]).save(target)
    bigger = Index.build(tiny, PASSAGES)

    def broken(*args):
        raise OSError("disk full")

    monkeypatch.setattr(faiss, "write_index", broken)
    with pytest.raises(OSError, match="disk full"):
        bigger.save(target)
    monkeypatch.undo()
    assert len(Index.load(target)) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["index"]
    bigger.save(target)  # replaces an index
    assert len(Index.load(target)) == len(PASSAGES)


def test_save_refuses_a_directory_that_is_not_an_index(tiny, tmp_path):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    with pytest.raises(ConfigError, match="is not an index"):
        Index.build(tiny, PASSAGES[:2]).save(tmp_path / "mine")
    (tmp_path / "file").write_text("")
    with pytest.raises(ConfigError, match="is a file"):
        Index.build(tiny, PASSAGES[:2]).save(tmp_path / "file")


def test_load_errors_name_the_file(tiny, tmp_path):
    with pytest.raises(DataError, match="no such index directory"):
        Index.load(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="index.json is missing"):
        Index.load(tmp_path / "empty")
    Index.build(tiny, PASSAGES[:2]).save(tmp_path / "index")
    meta_file = tmp_path / "index" / "index.json"
    meta = json.loads(meta_file.read_text())
    meta_file.write_text(json.dumps({**meta, "version": 99}))
    with pytest.raises(DataError, match="index.json: index format version 99"):
        Index.load(tmp_path / "index")
    meta_file.write_text(json.dumps({**meta, "embedding": {**meta["embedding"], "sentence": "median"}}))
    with pytest.raises(DataError, match=r"index.json: embedding.sentence: expected one of 'mean', 'cls', 'max'"):
        Index.load(tmp_path / "index")
    meta_file.write_text(json.dumps(meta))
    (tmp_path / "index" / "vectors.faiss").write_bytes(b"not a faiss index")
    with pytest.raises(DataError, match="vectors.faiss: the flat index header needs 37 bytes; 17 are left"):
        Index.load(tmp_path / "index")


def test_search_argument_errors(tiny):
    index = Index.build(tiny, PASSAGES[:2])
    with pytest.raises(ConfigError, match="k must be a positive integer"):
        index.search("paris", k=0)
    with pytest.raises(ConfigError, match=r"shape \[N, 32\]"):
        index.search(np.zeros((2, 5), dtype=np.float32))
    with pytest.raises(ConfigError, match="ef_search must be a positive integer"):
        index.search(np.ones((1, 32), dtype=np.float32), ef_search=0)
    with pytest.raises(ConfigError, match="NaN"):
        index.search(np.full((1, 32), np.nan, dtype=np.float32))


def test_options_follow_the_model_directory(minilm_path, tiny_dir, tmp_path):
    minilm = model_options(minilm_path)
    assert (minilm.sentence, minilm.layers, minilm.max_length, minilm.long_texts, minilm.source) == \
        ("mean", "last", 256, "truncate", "sentence-transformers config")
    assert model_options(tiny_dir) == EmbeddingOptions(source="bertology defaults")
    directory = tmp_path / "st"
    shutil.copytree(minilm_path, directory, ignore=shutil.ignore_patterns("*.safetensors"))
    pooling = directory / "1_Pooling" / "config.json"
    config = json.loads(pooling.read_text())
    pooling.write_text(json.dumps({**config, "pooling_mode_mean_tokens": False, "pooling_mode_cls_token": True}))
    assert model_options(directory).sentence == "cls"
    pooling.write_text(json.dumps({**config, "pooling_mode_mean_tokens": False, "pooling_mode_max_tokens": True}))
    assert model_options(directory).sentence == "max"
    pooling.write_text(json.dumps({**config, "pooling_mode_mean_tokens": False, "pooling_mode_lasttoken": True}))
    with pytest.raises(ConfigError, match=r"1_Pooling/config.json: pooling lasttoken is not supported"):
        model_options(directory)
    pooling.write_text("{")
    with pytest.raises(ConfigError, match=r"1_Pooling/config\.json: not valid JSON at line 1, column 2"):
        model_options(directory)


def test_option_errors():
    with pytest.raises(ConfigError, match="embedding.sentence"):
        EmbeddingOptions(sentence="median")
    with pytest.raises(ConfigError, match="needs embedding.max_length"):
        EmbeddingOptions(long_texts="truncate")
    with pytest.raises(ConfigError, match="structure.kind"):
        Structure("lsh")
    with pytest.raises(ConfigError, match="structure.nprobe must be at least 1"):
        Structure("ivf", nprobe=0)


def test_ivf_needs_a_passage_per_cell(tiny):
    with pytest.raises(ConfigError, match="nlist 10 exceeds the 6 passages"):
        Index.build(tiny, PASSAGES, structure=Structure("ivf", nlist=10))


def test_missing_faiss_names_the_extra(tiny, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "faiss", None)  # import faiss now raises ImportError
    with pytest.raises(ConfigError, match=r"pip install 'bertology\[index\]'"):
        Index.build(tiny, PASSAGES[:2])


def test_from_vectors_of_a_corpus_run_equals_build(tiny, tiny_dir, tmp_path):
    from bertology.embeddings.corpus import CorpusSettings, embed_corpus, load_corpus

    inputs = tmp_path / "inputs"
    inputs.mkdir()
    (inputs / "a.jsonl").write_text("".join(json.dumps(p) + "\n" for p in PASSAGES), encoding="utf-8")
    embed_corpus(tiny_dir, inputs, tmp_path / "vectors", CorpusSettings(format="jsonl", shard_size=4))
    vectors, rows = load_corpus(tmp_path / "vectors")
    passages = [Passage(str(row["id"]), PASSAGES[row["text"]]["text"]) for row in rows]
    index = Index.from_vectors(tiny, passages, vectors, model_dir=tiny_dir)
    built = Index.build(tiny, PASSAGES)
    found, expected = index.search(QUERIES, k=3), built.search(QUERIES, k=3)
    assert [[h.id for h in hits] for hits in found] == [[h.id for h in hits] for hits in expected]
    np.testing.assert_allclose([[h.score for h in hits] for hits in found],
                               [[h.score for h in hits] for hits in expected], atol=1e-5)
    assert index.meta["model"]["path"] == str(tiny_dir.resolve())


def test_from_vectors_refuses_vectors_of_another_model(tiny, other_dir, tmp_path):
    from bertology.model import load

    other = load(other_dir)
    vectors = embed(other, [p["text"] for p in PASSAGES]).sentences
    with pytest.raises(DataError, match=r"vectors\[\d\] \(passage '\w+'\) differs from this model's embedding"):
        Index.from_vectors(tiny, PASSAGES, vectors)
    with pytest.raises(ConfigError, match=r"vectors must have shape \[6, D\]"):
        Index.from_vectors(tiny, PASSAGES, vectors[:5])
    vectors[3, 2] = np.nan
    with pytest.raises(DataError, match=r"vectors\[3\] \(passage 'dogs'\) holds NaN"):
        Index.from_vectors(tiny, PASSAGES, vectors)
