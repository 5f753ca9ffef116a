"""The CoNLL-U reader: words, multiword tokens, empty nodes, spans, and malformed lines named by file and line."""

from __future__ import annotations

from pathlib import Path

import pytest

from bertology.analysis.ud import UDFormatError, read_conllu, read_split, stats

UD = Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "ud-english-ewt"

GOOD = """# sent_id = s1
# text = We won't go del Rio.
1\tWe\twe\tPRON\tPRP\t_\t3\tnsubj\t_\t_
2-3\twon't\t_\t_\t_\t_\t_\t_\t_\t_
2\two\twill\tAUX\tMD\t_\t4\taux\t_\t_
3\tn't\tnot\tPART\tRB\t_\t4\tadvmod\t_\t_
3.1\tgo\tgo\tVERB\tVB\t_\t_\t_\t2:conj\t_
4\tgo\tgo\tVERB\tVB\t_\t0\troot\t_\t_
5-6\tdel\t_\t_\t_\t_\t_\t_\t_\t_
5\tde\tde\tADP\tIN\t_\t7\tcase\t_\t_
6\tel\tel\tDET\tDT\t_\t7\tdet\t_\t_
7\tRio\tRio\tPROPN\tNNP\t_\t4\tobl:to\t_\tSpaceAfter=No
8\t.\t.\tPUNCT\t.\t_\t4\tpunct\t_\t_

# sent_id = s2
1\tHi\thi\tINTJ\tUH\t_\t0\troot\t_\t_
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "x-ud-train.conllu"
    path.write_text(text, encoding="utf-8")
    return path


def test_words_multiword_tokens_and_empty_nodes(tmp_path):
    first, second = read_conllu(write(tmp_path, GOOD))
    assert first.sent_id == "s1" and second.sent_id == "s2"
    assert first.words == ["We", "wo", "n't", "go", "de", "el", "Rio", "."]
    assert first.heads == [3, 4, 4, 0, 7, 7, 4, 4]  # the empty node 3.1 is no word
    assert first.deprels[6] == "obl:to" and first.relations[6] == "obl"
    assert first.upos[2] == "PART"
    assert first.text == "We won't go del Rio."  # surface forms, SpaceAfter=No honoured
    pieces = [first.text[a:b] for a, b in first.spans]
    # "wo" + "n't" spell "won't": split by character; "de" + "el" do not spell "del": both get the whole token.
    assert pieces == ["We", "wo", "n't", "go", "del", "del", "Rio", "."]
    assert (first.num_multiword, first.num_empty, first.num_shared_spans) == (2, 1, 2)
    assert first.source.endswith("x-ud-train.conllu:1")
    counts = stats([first, second]).as_dict()
    assert counts["sentences"] == 2 and counts["words"] == 9 and counts["empty_nodes_skipped"] == 1


def test_limit_and_split(tmp_path):
    write(tmp_path, GOOD)
    assert len(read_conllu(tmp_path / "x-ud-train.conllu", limit=1)) == 1
    assert [s.sent_id for s in read_split(tmp_path, "train")] == ["s1", "s2"]


@pytest.mark.parametrize("bad, line, message", [
    ("1\tWe\twe\tPRON\tPRP\t_\t0\troot\t_\n", 3, "10 tab-separated columns"),
    ("x\tWe\twe\tPRON\tPRP\t_\t0\troot\t_\t_\n", 3, "bad ID"),
    ("2\tWe\twe\tPRON\tPRP\t_\t0\troot\t_\t_\n", 3, "out of sequence"),
    ("1\tWe\twe\tPRONOUN\tPRP\t_\t0\troot\t_\t_\n", 3, "unknown UPOS"),
    ("1\tWe\twe\tPRON\tPRP\t_\t5\troot\t_\t_\n", 3, "points past"),
    ("1\tWe\twe\tPRON\tPRP\t_\t-1\troot\t_\t_\n", 3, "HEAD"),
    ("1\tWe\twe\tPRON\tPRP\t_\t0\t_\t_\t_\n", 3, "no DEPREL"),
    ("2-1\tab\t_\t_\t_\t_\t_\t_\t_\t_\n1\tWe\twe\tPRON\tPRP\t_\t0\troot\t_\t_\n", 3, "empty"),
])
def test_malformed_lines_name_file_and_line(tmp_path, bad, line, message):
    path = write(tmp_path, "# sent_id = a\n# text = We\n" + bad)
    with pytest.raises(UDFormatError, match=message) as caught:
        read_conllu(path)
    assert f"x-ud-train.conllu:{line}:" in str(caught.value)


def test_not_utf8_and_missing(tmp_path):
    path = tmp_path / "bad.conllu"
    path.write_bytes(b"1\t\xff\t_\tX\t_\t_\t0\troot\t_\t_\n")
    with pytest.raises(UDFormatError, match=r"bad.conllu: line 1: cannot decode as utf-8 at byte offset 2 \(byte 0xff\)"):
        read_conllu(path)
    with pytest.raises(UDFormatError, match="no such CoNLL-U file"):
        read_conllu(tmp_path / "none.conllu")


def test_english_ewt_dev():
    if not UD.is_dir():
        pytest.skip(f"UD English-EWT not found at {UD}")
    sentences = read_split(UD, "dev")
    counts = stats(sentences).as_dict()
    assert counts["sentences"] == 2001 and counts["words"] == 25147  # the published dev counts
    assert counts["empty_nodes_skipped"] > 0 and counts["multiword_tokens"] > 0
    # Rebuilt text equals the treebank's own `# text` wherever it has one (dev has no non-breaking spaces).
    assert all(s.text == s.comment_text for s in sentences if s.comment_text is not None)
    for s in sentences:
        assert all(s.text[a:b] == w for (a, b), w in zip(s.spans, s.words))
