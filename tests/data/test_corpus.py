"""Corpus readers and the sentence splitter: formats, path expansion, streaming, every bad-input case, real data."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bertology.data.corpus import CorpusSource, list_corpus_files, read_documents, read_sources
from bertology.data.sentences import split_sentences
from bertology.errors import DataError

SHARED = Path(__file__).resolve().parents[2] / ".." / "shared" / "data"
GUTENBERG = SHARED / "gutenberg-nltk"
BROWN = SHARED / "brown-nltk"


def write(path: Path, text: str | bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


# ------------------------------------------------------------------------------------------------ sentence splitter


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("One. Two! Three? Four", ["One.", "Two!", "Three?", "Four"]),
        ("Mr. Smith met Dr. Jones. They talked.", ["Mr. Smith met Dr. Jones.", "They talked."]),
        ("Mrs. Weston and St. Paul agreed.", ["Mrs. Weston and St. Paul agreed."]),
        ("It costs $3.50 or 2.5% more. Fine.", ["It costs $3.50 or 2.5% more.", "Fine."]),
        ("Use tools, e.g. Hammers and i.e. Nails. Done.", ["Use tools, e.g. Hammers and i.e. Nails.", "Done."]),
        ("J. R. R. Tolkien wrote it. So did I. Go.", ["J. R. R. Tolkien wrote it.", "So did I.", "Go."]),
        ("The U.S. Army left. He was in the U.S. The end.", ["The U.S. Army left.", "He was in the U.S.", "The end."]),
        ("We met at 5 p.m. The talk began.", ["We met at 5 p.m.", "The talk began."]),
        ('"Stop!" he cried. "Now!" She ran.', ['"Stop!" he cried.', '"Now!"', "She ran."]),
        ('He said "it is late." Then he left.', ['He said "it is late."', "Then he left."]),
        ("It ended (as planned.) Next came more.", ["It ended (as planned.)", "Next came more."]),
        ("See No. 5 and Fig. 3 here. Good.", ["See No. 5 and Fig. 3 here.", "Good."]),
        ("Wait... What was that? Nothing... nothing.", ["Wait...", "What was that?", "Nothing... nothing."]),
        ("Wait\u2026 Then go.", ["Wait\u2026", "Then go."]),
        ("Oh! said he. Where? asked she", ["Oh! said he.", "Where? asked she"]),
        ("It was 1999. 2000 came next.", ["It was 1999.", "2000 came next."]),
        ("Lines are\njoined   here. And\n  split.", ["Lines are joined here.", "And split."]),
        ("   ", []),
        ("no terminal punctuation", ["no terminal punctuation"]),
    ],
)
def test_split_sentences(text: str, expected: list[str]) -> None:
    assert split_sentences(text) == expected


# ------------------------------------------------------------------------------------------------------- formats


def test_bert_format_documents_and_line_endings(tmp_path: Path) -> None:
    path = write(tmp_path / "a.txt", b"\xef\xbb\xbfFirst one.\r\nSecond one.\r\n\r\n\r\n  \nThird doc.\n\n")
    write(tmp_path / "b.txt", "Fourth, other file.\nStill fourth.")
    docs = list(read_documents([path, tmp_path / "b.txt"], format="bert"))
    assert docs == [["First one.", "Second one."], ["Third doc."], ["Fourth, other file.", "Still fourth."]]


def test_text_format_one_document_per_file(tmp_path: Path) -> None:
    write(tmp_path / "book.txt", "Title\n\nMr. Darcy came in. He sat\ndown.\n\n\nShe left! Good.\n")
    docs = list(read_documents(tmp_path / "book.txt", format="text"))
    assert docs == [["Title", "Mr. Darcy came in.", "He sat down.", "She left!", "Good."]]


def test_jsonl_format(tmp_path: Path) -> None:
    lines = [
        json.dumps({"body": "A first text. It has two sentences.", "id": 1}),
        "",
        json.dumps({"body": "Para one.\n\nPara two has\nno end"}),
        json.dumps({"body": "   "}),
    ]
    write(tmp_path / "c.jsonl", "\n".join(lines) + "\n")
    docs = list(read_documents(tmp_path / "c.jsonl", format="jsonl", text_field="body"))
    assert docs == [["A first text.", "It has two sentences."], ["Para one.", "Para two has no end"]]


def test_brown_format_strips_tags_and_detokenises(tmp_path: Path) -> None:
    write(
        tmp_path / "corpus" / "ca01",
        "\n\n\tThe/at jury/nn said/vbd ``/`` no/at ''/'' ,/, Allen/np Jr./np ./.\n"
        "\n\n\tWon/vbd (/( 1-1/2/cd )/) points/nns ?/.\n\tSecond/od line/nn ./.\n",
    )
    write(tmp_path / "corpus" / "README", "This is not a tagged file.\n")
    write(tmp_path / "corpus" / "cats.txt", "ca01 news\n")
    docs = list(read_documents(tmp_path / "corpus", format="brown"))
    assert docs == [['The jury said "no", Allen Jr.', "Won (1-1/2) points?", "Second line."]]


def test_read_sources_mixes_formats(tmp_path: Path) -> None:
    write(tmp_path / "a.txt", "One sentence.\n\nAnother doc.\n")
    write(tmp_path / "b.jsonl", json.dumps({"text": "Hi there. Bye."}) + "\n")
    sources = [CorpusSource(tmp_path / "a.txt", "bert"), CorpusSource(tmp_path / "b.jsonl", "jsonl")]
    assert list(read_sources(sources)) == [["One sentence."], ["Another doc."], ["Hi there.", "Bye."]]


def test_latin1_encoding(tmp_path: Path) -> None:
    write(tmp_path / "l.txt", "Caf\u00e9 au lait.\n".encode("latin-1"))
    assert list(read_documents(tmp_path / "l.txt", encoding="latin-1")) == [["Caf\u00e9 au lait."]]


# -------------------------------------------------------------------------------------------------- path expansion


def test_directory_glob_and_list(tmp_path: Path) -> None:
    write(tmp_path / "d" / "b.txt", "b\n")
    write(tmp_path / "d" / "a.txt", "a\n")
    write(tmp_path / "d" / "sub" / "c.txt", "c\n")
    write(tmp_path / "d" / ".hidden", "h\n")
    write(tmp_path / "d" / ".git" / "x.txt", "x\n")
    names = [p.name for p in list_corpus_files(tmp_path / "d")]
    assert names == ["a.txt", "b.txt", "c.txt"]
    assert [p.name for p in list_corpus_files(str(tmp_path / "d" / "*.txt"))] == ["a.txt", "b.txt"]
    assert [p.name for p in list_corpus_files(str(tmp_path / "d" / "**" / "*.txt"))] == ["a.txt", "b.txt", "c.txt"]
    # A file named twice is read once; list order is kept.
    both = list_corpus_files([tmp_path / "d" / "b.txt", tmp_path / "d", tmp_path / "d" / "a.txt"])
    assert [p.name for p in both] == ["b.txt", "a.txt", "c.txt"]
    assert list(read_documents(tmp_path / "d")) == [["a"], ["b"], ["c"]]


def test_reading_is_lazy(tmp_path: Path) -> None:
    # The first document comes out before the bad line far below is read: files are streamed, not slurped.
    write(tmp_path / "big.jsonl", json.dumps({"text": "First."}) + "\n" + '{"text": "ok"}\n' * 1000 + "{bad\n")
    reader = read_documents(tmp_path / "big.jsonl", format="jsonl")
    assert next(reader) == ["First."]
    with pytest.raises(DataError, match="line 1002"):
        list(reader)


# ------------------------------------------------------------------------------------------------------ bad input


def test_non_utf8_names_file_line_and_byte_offset(tmp_path: Path) -> None:
    path = write(tmp_path / "bad.txt", b"good line\nsecond \xc3\xa9 ok\nthird \xff here\n")
    with pytest.raises(DataError) as info:
        list(read_documents(path))
    message = str(info.value)
    assert str(path) in message and "line 3" in message
    assert f"byte offset {path.read_bytes().index(0xFF)}" in message and "0xff" in message


def test_invalid_json_line(tmp_path: Path) -> None:
    path = write(tmp_path / "x.jsonl", '{"text": "fine"}\n{"text": oops}\n')
    with pytest.raises(DataError, match=r"x\.jsonl: line 2: invalid JSON"):
        list(read_documents(path, format="jsonl"))


def test_json_line_not_an_object(tmp_path: Path) -> None:
    path = write(tmp_path / "x.jsonl", '["text"]\n')
    with pytest.raises(DataError, match=r"line 1: expected a JSON object, got a list"):
        list(read_documents(path, format="jsonl"))


def test_missing_json_field(tmp_path: Path) -> None:
    path = write(tmp_path / "x.jsonl", '{"text": "a."}\n{"body": "b."}\n')
    with pytest.raises(DataError, match=r"x\.jsonl: line 2: missing field 'text'"):
        list(read_documents(path, format="jsonl"))


def test_json_field_not_a_string(tmp_path: Path) -> None:
    path = write(tmp_path / "x.jsonl", '{"text": 3}\n')
    with pytest.raises(DataError, match=r"line 1: field 'text' is int, not a string"):
        list(read_documents(path, format="jsonl"))


def test_brown_token_without_tag(tmp_path: Path) -> None:
    path = write(tmp_path / "cb01", "\tThe/at jury/nn\n\n\tno_tag here/rb\n")
    with pytest.raises(DataError, match=r"cb01: line 3: token 'no_tag' is not in word/tag form"):
        list(read_documents(path, format="brown"))


def test_no_files_matched(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"\*\.nothing: matched no files"):
        read_documents(str(tmp_path / "*.nothing"))
    (tmp_path / "empty_dir").mkdir()
    with pytest.raises(DataError, match="empty_dir: matched no files"):
        read_documents(tmp_path / "empty_dir")
    with pytest.raises(DataError, match="missing.txt: no such file or directory"):
        read_documents(tmp_path / "missing.txt")
    with pytest.raises(DataError, match="no corpus paths given"):
        read_documents([])


def test_empty_corpus(tmp_path: Path) -> None:
    write(tmp_path / "a.txt", "\n  \n\n")
    write(tmp_path / "b.txt", "")
    with pytest.raises(DataError, match=r"empty corpus: no sentences in 2 file\(s\)"):
        list(read_documents(tmp_path))


def test_bad_format_and_encoding(tmp_path: Path) -> None:
    path = write(tmp_path / "a.txt", "x\n")
    with pytest.raises(DataError, match="unknown corpus format 'csv'"):
        read_documents(path, format="csv")  # type: ignore[arg-type]
    with pytest.raises(DataError, match="unknown text encoding"):
        read_documents(path, encoding="no-such-codec")
    with pytest.raises(DataError, match="not ASCII-compatible"):
        read_documents(path, encoding="utf-16")


# ------------------------------------------------------------------------------------------------------ real data


@pytest.mark.skipif(not GUTENBERG.is_dir(), reason=f"shared data not found at {GUTENBERG}")
def test_gutenberg_text() -> None:
    files = sorted(GUTENBERG.glob("*.txt"))
    docs = list(read_documents([str(GUTENBERG / "*.txt")], format="text", encoding="latin-1"))
    assert len(docs) == len(files) == 13
    emma = docs[0]
    assert emma[:3] == ["[Emma by Jane Austen 1816]", "VOLUME I", "CHAPTER I"]
    assert emma[3].startswith("Emma Woodhouse, handsome, clever, and rich,")
    assert emma[3].endswith("with very little to distress or vex her.")
    # Titles never end a sentence; Emma has hundreds of them before names.
    assert not any(s.endswith((" Mr.", " Mrs.", " Dr.")) for doc in docs for s in doc)
    assert sum(" Mr. " in s for s in emma) > 500
    assert 40_000 < sum(map(len, docs)) < 60_000


@pytest.mark.skipif(not GUTENBERG.is_dir(), reason=f"shared data not found at {GUTENBERG}")
def test_gutenberg_is_not_utf8() -> None:
    path = GUTENBERG / "chesterton-ball.txt"
    with pytest.raises(DataError) as info:
        list(read_documents(path, format="text"))
    offset = int(str(info.value).split("byte offset ")[1].split()[0])
    data = path.read_bytes()
    assert str(path) in str(info.value)
    assert data[offset] >= 0x80 and data[:offset].isascii()


@pytest.mark.skipif(not BROWN.is_dir(), reason=f"shared data not found at {BROWN}")
def test_brown_corpus() -> None:
    docs = list(read_documents(BROWN, format="brown"))
    assert len(docs) == 500  # README, CONTENTS and cats.txt are not corpus files
    assert sum(map(len, docs)) == 57_340  # NLTK's count of Brown sentences
    assert docs[0][0] == (
        "The Fulton County Grand Jury said Friday an investigation of Atlanta's recent primary election "
        'produced "no evidence" that any irregularities took place.'
    )
    assert not any("/at " in s or "/nn " in s for s in docs[0])
