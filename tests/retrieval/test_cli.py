"""`bertology index build`, `bertology search` and `bertology evaluate --task retrieval` end to end, and their errors
(exit status 2 with one line naming what and where)."""

from __future__ import annotations

import json

import pytest

from bertology.cli.main import main
from bertology.retrieval import Index

pytest.importorskip("faiss", reason="faiss-cpu is not installed (pip install 'bertology[index]')")


def run(*argv) -> int:
    return main([str(a) for a in argv])


@pytest.fixture
def passages_file(tmp_path):
    path = tmp_path / "passages.jsonl"
    rows = [{"id": "cat", "text": "the cat sat on the mat .", "title": "ignored"},
            {"id": 2, "text": "paris is the capital of france ."},
            {"id": "bread", "text": "bread is baked from flour and water ."}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + "\n", encoding="utf-8")  # a final blank line
    return path


def test_build_and_search(tiny_dir, passages_file, tmp_path, capsys):
    out = tmp_path / "index"
    assert run("index", "build", "--model", tiny_dir, "--input", passages_file, "--out", out,
               "--approximate", "hnsw", "--ef-search", "16", "--threads", "1", "--quiet") == 0
    assert "indexed 3 passages (32 dimensions, hnsw)" in capsys.readouterr().err
    meta = json.loads((out / "index.json").read_text())
    assert meta["structure_parameters"] == {"kind": "hnsw", "hnsw_m": 32, "ef_construction": 200, "ef_search": 16}
    assert run("search", "--index", out, "--k", "2", "--threads", "1", "capital of france", "flour") == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    expected = Index.load(out, model=tiny_dir).search(["capital of france", "flour"], k=2)
    assert [line["query"] for line in lines] == ["capital of france", "flour"]
    assert [[h["id"] for h in line["hits"]] for line in lines] == [[h.id for h in hits] for hits in expected]
    assert [[h["score"] for h in line["hits"]] for line in lines] == \
        [[round(h.score, 6) for h in hits] for hits in expected]


def test_build_options_are_recorded(tiny_dir, passages_file, tmp_path):
    out = tmp_path / "index"
    assert run("index", "build", "--model", tiny_dir, "--input", passages_file, "--out", out, "--sentence", "cls",
               "--layers=-2,-1", "--max-length", "8", "--long-texts", "truncate", "--quiet") == 0
    embedding = json.loads((out / "index.json").read_text())["embedding"]
    assert embedding == {"layers": [-2, -1], "combine": None, "sentence": "cls", "max_length": 8, "stride": None,
                         "long_texts": "truncate",
                         "source": "bertology defaults, changed: sentence, layers, max_length, long_texts"}


def test_search_with_another_model_is_refused(tiny_dir, other_dir, passages_file, tmp_path, capsys):
    out = tmp_path / "index"
    assert run("index", "build", "--model", tiny_dir, "--input", passages_file, "--out", out, "--quiet") == 0
    assert run("search", "--index", out, "--model", other_dir, "paris") == 2
    assert "the index was built with another model" in capsys.readouterr().err


@pytest.mark.parametrize("content, message", [
    (b'{"id": "a", "text": "x"}\n{"id": "b", "text": "y"\n', "passages.jsonl: line 2: invalid JSON"),
    (b'{"id": "a", "text": "x"}\n{"id": "a", "text": "y"}\n', "passages.jsonl: line 2: id 'a' repeats the one on line 1"),
    (b'{"text": "x"}\n', "passages.jsonl: line 1: missing field 'id' (fields: 'text')"),
    (b'{"id": "a"}\n', "passages.jsonl: line 1: missing field 'text'"),
    (b'{"id": 1.5, "text": "x"}\n', "passages.jsonl: line 1: field 'id' is a number"),
    (b'{"id": "", "text": "x"}\n', "passages.jsonl: line 1: field 'id' is an empty string"),
    (b'{"id": "a", "text": null}\n', "passages.jsonl: line 1: field 'text' is null"),
    (b'["a", "x"]\n', "passages.jsonl: line 1: expected a JSON object"),
    (b'{"id": "a", "text": "x"}\n{"id": "b", "text": "caf\xe9"}\n',
     "passages.jsonl: line 2: cannot decode as utf-8 at byte offset 49 (byte 0xe9)"),
    (b"\n\n", "passages.jsonl: no passages"),
    (b'{"id": "a", "text": "x"}\n{"id": "b", "text": "ab\\ud800"}\n',
     "passages.jsonl: line 2: field 'text': character 2 is a lone surrogate (U+D800"),
    (b'{"id": "\\udfff", "text": "x"}\n', "passages.jsonl: line 1: field 'id': character 0 is a lone surrogate"),
])
def test_malformed_passages_name_file_and_line(tiny_dir, tmp_path, capsys, content, message):
    path = tmp_path / "passages.jsonl"
    path.write_bytes(content)
    assert run("index", "build", "--model", tiny_dir, "--input", path, "--out", tmp_path / "index") == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "index").exists()


def test_evaluate_retrieval_prints_recall(tiny_dir, mini_squad, tmp_path, capsys):
    squad = mini_squad
    out = tmp_path / "index"
    assert run("index", "build", "--model", tiny_dir, "--squad", squad, "--out", out, "--quiet") == 0
    capsys.readouterr()
    assert run("evaluate", "--task", "retrieval", "--index", out, "--squad", squad) == 0
    printed = json.loads(capsys.readouterr().out)
    assert list(printed) == ["recall@1", "recall@5", "recall@20", "recall@100", "mrr@10", "questions", "kind"]
    assert printed["kind"] == "dense" and printed["recall@100"] == 100.0
    assert printed["questions"] == 4 and printed["recall@5"] == 100.0  # 4 paragraphs: every one is retrieved
    assert run("evaluate", "--task", "retrieval", "--squad", squad) == 2
    assert "--index INDEX and --squad FILE are required" in capsys.readouterr().err


def test_a_directory_that_is_not_a_model_is_refused(passages_file, tmp_path, capsys):
    (tmp_path / "not-a-model").mkdir()
    (tmp_path / "not-a-model" / "notes.txt").write_text("hello")
    assert run("index", "build", "--model", tmp_path / "not-a-model", "--input", passages_file,
               "--out", tmp_path / "index") == 2
    assert "not-a-model" in capsys.readouterr().err
    assert not (tmp_path / "index").exists()


def test_search_names_a_recorded_model_that_moved(tiny_dir, passages_file, tmp_path, capsys):
    import shutil

    model = tmp_path / "model"
    shutil.copytree(tiny_dir, model)
    assert run("index", "build", "--model", model, "--input", passages_file, "--out", tmp_path / "index",
               "--quiet") == 0
    shutil.rmtree(model)
    assert run("search", "--index", tmp_path / "index", "paris") == 2
    assert f"the model directory recorded in the index, {model.resolve()}, does not exist" in capsys.readouterr().err
    assert run("search", "--index", tmp_path / "index", "--model", tiny_dir, "paris") == 0
    assert run("search", "--index", tmp_path / "index", "--model", tiny_dir, "--threads", "0", "paris") == 2
    assert "threads must be a positive integer, got 0" in capsys.readouterr().err


def test_queries_with_emoji_control_and_zero_width_characters(tiny_dir, passages_file, tmp_path, capsys):
    assert run("index", "build", "--model", tiny_dir, "--input", passages_file, "--out", tmp_path / "index",
               "--quiet") == 0
    capsys.readouterr()
    queries = ["paris 🙂", "ca\u200bt\x07", "", "\u202enaïve"]
    assert run("search", "--index", tmp_path / "index", "--k", "3", *queries) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [line["query"] for line in lines] == queries
    assert all(len(line["hits"]) == 3 for line in lines)


def test_an_output_that_is_not_an_index_is_refused_before_embedding(tiny_dir, passages_file, tmp_path, capsys,
                                                                      monkeypatch):
    import bertology.retrieval.index as index_module

    def never(*args, **kwargs):
        raise AssertionError("embedded before checking --out")

    monkeypatch.setattr(index_module, "encode", never)
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "keep.txt").write_text("mine")
    assert run("index", "build", "--model", tiny_dir, "--input", passages_file, "--out", tmp_path / "results") == 2
    assert "results: exists and is not an index; refusing to replace it" in capsys.readouterr().err
    (tmp_path / "file").write_text("")
    assert run("index", "build", "--model", tiny_dir, "--input", passages_file, "--out", tmp_path / "file" / "x") == 2
    assert "file is a file, not a directory" in capsys.readouterr().err


def test_build_from_the_vectors_of_a_corpus_run(tiny_dir, passages_file, tmp_path, capsys):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "passages.jsonl").write_bytes(passages_file.read_bytes())
    assert run("embed", "--model", tiny_dir, "--input", corpus, "--format", "jsonl", "--output", tmp_path / "vectors",
               "--quiet") == 0
    assert run("index", "build", "--model", tiny_dir, "--input", passages_file, "--vectors", tmp_path / "vectors",
               "--out", tmp_path / "from-vectors", "--quiet") == 0
    assert run("index", "build", "--model", tiny_dir, "--input", passages_file, "--out", tmp_path / "embedded",
               "--quiet") == 0
    capsys.readouterr()
    queries = ["capital of france", "flour"]
    for name in ("from-vectors", "embedded"):
        assert run("search", "--index", tmp_path / name, "--k", "3", *queries) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [[h["id"] for h in json.loads(line)["hits"]] for line in lines[:2]] == \
        [[h["id"] for h in json.loads(line)["hits"]] for line in lines[2:]]
    assert json.loads((tmp_path / "from-vectors" / "index.json").read_text())["embedding"]["source"] == \
        f"corpus run {tmp_path / 'vectors'}"
    assert run("index", "build", "--model", tiny_dir, "--input", passages_file, "--vectors", tmp_path / "vectors",
               "--sentence", "cls", "--out", tmp_path / "x") == 2
    assert "the corpus run's embedding options are used; drop --sentence" in capsys.readouterr().err


def test_corpus_vectors_need_ids_and_the_same_passages(tiny_dir, passages_file, tmp_path, capsys):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "texts.txt").write_text("the cat sat on the mat .\nparis is the capital of france .\n")
    assert run("embed", "--model", tiny_dir, "--input", corpus, "--output", tmp_path / "lines", "--quiet") == 0
    assert run("index", "build", "--model", tiny_dir, "--input", passages_file, "--vectors", tmp_path / "lines",
               "--out", tmp_path / "x") == 2
    assert "row 0 (texts.txt: line 1) has no id" in capsys.readouterr().err
    other = tmp_path / "other"
    other.mkdir()
    (other / "p.jsonl").write_text('{"id": "cat", "text": "the cat sat on the mat ."}\n')
    assert run("embed", "--model", tiny_dir, "--input", other, "--format", "jsonl", "--output", tmp_path / "one",
               "--quiet") == 0
    assert run("index", "build", "--model", tiny_dir, "--input", passages_file, "--vectors", tmp_path / "one",
               "--out", tmp_path / "x") == 2
    assert "no vector for passage '2' (and 1 more)" in capsys.readouterr().err
    (tmp_path / "jsonl").mkdir()
    (tmp_path / "jsonl" / "passages.jsonl").write_bytes(passages_file.read_bytes())
    assert run("embed", "--model", tiny_dir, "--input", tmp_path / "jsonl", "--format", "jsonl", "--level", "token",
               "--output", tmp_path / "tokens", "--quiet") == 0
    assert run("index", "build", "--model", tiny_dir, "--input", passages_file, "--vectors", tmp_path / "tokens",
               "--out", tmp_path / "x") == 2
    assert "holds token vectors; an index needs sentence vectors" in capsys.readouterr().err
