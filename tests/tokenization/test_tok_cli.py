"""`bertology tokenizer train` writes loadable HF files and reports bad input as an error, not a traceback."""

from __future__ import annotations

import json
from itertools import chain
from pathlib import Path

import pytest

from bertology.cli._corpus_args import corpus_sources
from bertology.cli.main import main
from bertology.data.corpus import CorpusSource, read_sources
from bertology.errors import ConfigError
from bertology.tokenization import load_tokenizer, train_tokenizer

from tok_data import CORPUS, CORPUS_LINES, SHARED

BROWN = SHARED / "data" / "brown-nltk"


@pytest.mark.parametrize(("kind", "files"), [("wordpiece", ["vocab.txt"]), ("bpe", ["vocab.json", "merges.txt"]),
                                             ("unigram", [])])
def test_train_command(tmp_path: Path, kind: str, files: list[str], capsys) -> None:
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "a.txt").write_text(CORPUS, encoding="utf-8")
    (tmp_path / "data" / "b.txt").write_text(CORPUS.upper(), encoding="utf-8")
    out = tmp_path / "tok"
    rc = main(["tokenizer", "train", "--kind", kind, "--vocab-size", "300", "--min-frequency", "1", "--quiet",
               "--out", str(out), str(tmp_path / "data" / "a.txt"), str(tmp_path / "data" / "b*.txt")])
    assert rc == 0
    for name in ["tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", *files]:
        assert (out / name).is_file()
    tokenizer = load_tokenizer(out)
    assert tokenizer.kind == kind and tokenizer.vocab_size <= 300
    assert f"wrote {kind} tokenizer" in capsys.readouterr().err


def _train(tmp_path: Path, *args: str, kind: str = "bpe", vocab_size: int = 400) -> int:
    return main(["tokenizer", "train", "--kind", kind, "--vocab-size", str(vocab_size), "--min-frequency", "1",
                 "--quiet", "--out", str(tmp_path / "tok"), *args])


def _api_vocab(sources: list[CorpusSource], vocab_size: int = 400) -> dict[str, int]:
    """The BPE vocabulary the Python API learns from the sentences of ``sources`` (BPE training is deterministic)."""
    sentences = chain.from_iterable(read_sources(sources))
    return train_tokenizer(sentences, "bpe", vocab_size, min_frequency=1, show_progress=False).backend.get_vocab()


def _tag_tokens(vocab: dict[str, int]) -> set[str]:
    """Learned tokens holding the "/" of Brown's word/tag pairs (the bare byte and "</s>" are always there)."""
    return {token for token in vocab if "/" in token} - {"/", "</s>"}


def test_train_command_bad_encoding(tmp_path: Path, capsys) -> None:
    bad = tmp_path / "bad.txt"
    bad.write_bytes("café ok\nsecond line\n".encode() + b"na\xefve\n")  # 9 + 12 bytes, then "na" and 0xef
    assert _train(tmp_path, str(bad)) == 2
    err = capsys.readouterr().err
    assert f"{bad}: line 3: cannot decode as utf-8 at byte offset 23 (byte 0xef)" in err
    assert not (tmp_path / "tok").exists()


def test_train_command_bad_arguments(tmp_path: Path, capsys) -> None:
    (tmp_path / "a.txt").write_text(CORPUS, encoding="utf-8")
    assert _train(tmp_path, str(tmp_path / "missing.txt")) == 2
    assert f"{tmp_path / 'missing.txt'}: no such file or directory" in capsys.readouterr().err
    assert _train(tmp_path, "--encoding", "no-such-codec", str(tmp_path / "a.txt")) == 2
    assert "unknown text encoding 'no-such-codec'" in capsys.readouterr().err
    assert _train(tmp_path, str(tmp_path / "a.txt"), "brown:") == 2
    assert "'brown:': no path after the format prefix" in capsys.readouterr().err
    assert not (tmp_path / "tok").exists()


def test_train_command_latin1(tmp_path: Path, capsys) -> None:
    lines = ["Café naïve résumé in Zürich.", "Über den Fluß fährt eine Fähre.", "À bientôt, garçon!"] * 10
    path = tmp_path / "latin1.txt"
    path.write_bytes("\n".join(lines).encode("latin-1") + b"\n")
    assert _train(tmp_path, str(path)) == 2
    assert f"{path}: line 1: cannot decode as utf-8 at byte offset 3" in capsys.readouterr().err
    assert _train(tmp_path, "--encoding", "latin-1", "--no-lowercase", str(path), kind="wordpiece",
                  vocab_size=200) == 0
    vocab = load_tokenizer(tmp_path / "tok").backend.get_vocab()
    assert {"é", "ï", "ü", "ß", "ä", "À", "ô", "ç"} <= vocab.keys()
    assert "Ã" not in vocab  # what the UTF-8 reading of Latin-1 bytes would have produced


def test_train_command_jsonl_text_field(tmp_path: Path) -> None:
    path = tmp_path / "docs.jsonl"
    path.write_text("".join(json.dumps({"id": i, "body": line}) + "\n" for i, line in enumerate(CORPUS_LINES)),
                    encoding="utf-8")
    assert _train(tmp_path, "--format", "jsonl", "--text-field", "body", str(path)) == 0
    vocab = load_tokenizer(tmp_path / "tok").backend.get_vocab()
    assert vocab == _api_vocab([CorpusSource(path, "jsonl", text_field="body")])
    assert not any("body" in token for token in vocab)
    # Read as lines instead, the JSON key is training text (it is on every line).
    assert "body" in _api_vocab([CorpusSource(path, "bert")])


@pytest.mark.skipif(not BROWN.is_dir(), reason=f"shared Brown corpus not found at {BROWN}")
def test_train_command_brown(tmp_path: Path) -> None:
    files = [BROWN / "ca01", BROWN / "ca02"]
    assert _train(tmp_path, "--format", "brown", *map(str, files), vocab_size=1000) == 0
    tokenizer = load_tokenizer(tmp_path / "tok")
    vocab = tokenizer.backend.get_vocab()
    assert vocab == _api_vocab([CorpusSource(files, "brown")], 1000)
    # The tags are dropped: read as plain lines, "the/at" would teach "/at" and friends.
    assert not _tag_tokens(vocab)
    assert tokenizer.encode("The jury said").tokens == ["<s>", "The", "Ġjury", "Ġsaid", "</s>"]


def test_train_command_mixed_formats(tmp_path: Path) -> None:
    lines = tmp_path / "lines.txt"  # bert format, the default
    lines.write_text(CORPUS, encoding="utf-8")
    running = tmp_path / "running.txt"  # text format: paragraphs over several lines, split into sentences
    running.write_text("The river bank was\nquiet. A heron stood\nthere.\n\nThen it flew away over the\n"
                       "water. Nobody saw it.\n", encoding="utf-8")
    tagged = tmp_path / "cz01"  # brown format
    tagged.write_text("\n\tThe/at heron/nn flew/vbd ./.\n\n\tIt/pps was/bedz gone/vbn ./.\n" * 3, encoding="utf-8")
    sources = corpus_sources([str(lines), f"text:{running}", f"brown:{tagged}"])
    assert [(source.format, source.paths) for source in sources] == [
        ("bert", [str(lines)]), ("text", [str(running)]), ("brown", [str(tagged)])]
    assert _train(tmp_path, str(lines), f"text:{running}", f"brown:{tagged}") == 0
    vocab = load_tokenizer(tmp_path / "tok").backend.get_vocab()
    assert vocab == _api_vocab(sources)
    assert not _tag_tokens(vocab)
    # Read in the default format instead, the Brown tags are training text and end up in the vocabulary.
    assert _tag_tokens(_api_vocab(corpus_sources([str(lines), f"text:{running}", str(tagged)])))


def test_corpus_sources_group_runs() -> None:
    sources = corpus_sources(["a", "b", "brown:c", "brown:d", "text:e", "f", "jsonl:g", "odd:name"],
                             format="text", text_field="body", encoding="latin-1")
    assert [(source.format, source.paths) for source in sources] == [
        ("text", ["a", "b"]), ("brown", ["c", "d"]), ("text", ["e", "f"]), ("jsonl", ["g"]), ("text", ["odd:name"])]
    assert {(source.text_field, source.encoding) for source in sources} == {("body", "latin-1")}
    with pytest.raises(ConfigError, match="'text:': no path after the format prefix"):
        corpus_sources(["text:"])
