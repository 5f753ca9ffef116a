"""Text readers fed damaged copies of valid files (truncated, bit-flipped, bytes spliced in, random bytes) and JSON
holding lone surrogates: each returns or raises bertology's own error naming the file, never another exception."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fuzz_helpers import damaged, only_our_errors

EXAMPLES = 100  # inputs per reader (the suite's time budget: about 30 seconds in all)
WORK = Path(tempfile.mkdtemp(prefix="bertology-fuzz-"))


@pytest.fixture(scope="module", autouse=True)
def remove_work():
    yield
    shutil.rmtree(WORK, ignore_errors=True)


def _config_json(path):
    from bertology.config import decode_text, load_json

    return load_json(decode_text(path.read_bytes(), str(path)), str(path))


def _task_jsonl(path):
    from bertology.tasks.readers import TaskFileConfig, read_task_file

    config = TaskFileConfig(format="jsonl", kind="classification", text="q", label="y", train=str(path))
    return list(read_task_file(config, "train"))


def _documents(path):
    from bertology.data.corpus import read_documents

    return list(read_documents(path, "jsonl"))


def _raganato(path):
    from bertology.analysis.raganato import read_raganato

    return read_raganato(path)


def _semcor(path):
    from bertology.analysis.semcor import Semcor, read_tagfile

    corpus = Semcor([])
    read_tagfile(path, corpus)
    return corpus


READERS = {  # name: (reader, a valid file)
    "embed lines": (lambda p: __import__("bertology.embeddings", fromlist=["x"]).read_texts(p, "lines"),
                    "one text\nanother text\n\ncafé ☕\n"),
    "embed jsonl": (lambda p: __import__("bertology.embeddings", fromlist=["x"]).read_texts(p, "jsonl"),
                    '{"text": "a cat", "id": 1}\n\n{"text": "b\\u00e9", "id": "x"}\n'),
    "passages": (lambda p: __import__("bertology.retrieval", fromlist=["x"]).read_passages(p),
                 '{"id": "a", "text": "the cat"}\n{"id": 2, "text": "paris", "title": "P"}\n'),
    "wsd keys": (lambda p: __import__("bertology.analysis.raganato", fromlist=["x"]).read_keys(p),
                 "d0.t0 dog%1:05:00::\nd0.t1 cat%1:05:00:: cat%1:05:02::\n"),
    "squad": (lambda p: __import__("bertology.tasks.readers", fromlist=["x"]).read_squad(p), json.dumps(
        {"version": "1.1", "data": [{"title": "T", "paragraphs": [{"context": "paris is big", "qas": [
            {"id": "q1", "question": "what?", "answers": [{"text": "paris", "answer_start": 0}]}]}]}]})),
    "conll": (lambda p: list(__import__("bertology.tasks.readers", fromlist=["x"]).read_conll(p)),
              "-DOCSTART- -X- -X- O\n\nEU NNP B-NP B-ORG\nrejects VBZ B-VP O\n\nPeter NNP B-NP B-PER\n"),
    "glue sst2": (lambda p: list(__import__("bertology.tasks.readers", fromlist=["x"]).read_glue("sst2", p)),
                  "sentence\tlabel\na good film \t1\na bad one \t0\n"),
    "task jsonl": (_task_jsonl, '{"q": "a?", "y": 1}\n{"q": "b?", "y": "0"}\n'),
    "config json": (_config_json, '{"optim": {"lr": 0.001, "batch_size": 8}, "run": {"output_dir": "out"}}'),
    "corpus jsonl": (_documents, '{"text": "One sentence. Two sentences."}\n{"text": "Another document."}\n'),
    "conllu": (lambda p: __import__("bertology.analysis.ud", fromlist=["x"]).read_conllu(p),
               "# text = The cat sat.\n1\tThe\tthe\tDET\tDT\t_\t2\tdet\t_\t_\n2\tcat\tcat\tNOUN\tNN\t_\t3\tnsubj\t_\t_\n"
               "3\tsat\tsit\tVERB\tVBD\t_\t0\troot\t_\tSpaceAfter=No\n4\t.\t.\tPUNCT\t.\t_\t3\tpunct\t_\t_\n\n"),
    "raganato xml": (_raganato, '<?xml version="1.0"?>\n<corpus lang="en"><text id="d0"><sentence id="d0.s0">'
                                '<wf lemma="the" pos="DET">The</wf><instance id="d0.s0.t0" lemma="dog" pos="NOUN">'
                                'dog</instance></sentence></text></corpus>\n'),
    "semcor": (_semcor, "<contextfile concordance=brown>\n<context filename=br-a01 paras=yes>\n<p pnum=1>\n"
                        "<s snum=1>\n<wf cmd=done pos=NN lemma=dog wnsn=1 lexsn=1:05:00::>dog</wf>\n</s>\n</p>\n"
                        "</context>\n</contextfile>\n"),
}


def _file(name: str, data: bytes) -> Path:
    path = WORK / name.replace(" ", "-")
    path.write_bytes(data)
    return path


@pytest.mark.parametrize("name", READERS)
def test_the_valid_file_reads(name):
    reader, valid = READERS[name]
    result = reader(_file(name, valid.encode("utf-8")))
    assert result is not None


@pytest.mark.parametrize("name", READERS)
def test_damaged_files_give_only_named_errors(name):
    reader, valid = READERS[name]

    @settings(max_examples=EXAMPLES)
    @given(data=damaged(valid.encode("utf-8")))
    def run(data):
        path = _file(name, data)
        only_our_errors(name, lambda: reader(path), names=str(path))

    run()


JSON_READERS = ("embed jsonl", "passages", "squad", "task jsonl", "config json", "corpus jsonl")
SURROGATE = st.sampled_from(["\\ud800", "\\udfff", "\\ud83d", "\\udc00x"])


@pytest.mark.parametrize("name", JSON_READERS)
def test_lone_surrogates_anywhere_are_named(name):
    """A \\uD800-style escape put into any string of a valid JSON file: the reader accepts none of it silently
    (a reader that reads the field says which), and raises nothing but its own errors."""
    reader, valid = READERS[name]
    quotes = [i for i, c in enumerate(valid) if c == '"']

    @settings(max_examples=EXAMPLES // 2)
    @given(at=st.sampled_from(quotes), escape=SURROGATE)
    def run(at, escape):
        text = valid[:at + 1] + escape + valid[at + 1:]
        path = _file(name, text.encode("utf-8"))
        outcome = only_our_errors(f"{name} (surrogates)", lambda: reader(path), names=str(path))
        if not isinstance(outcome, Exception):  # read: no lone surrogate may have got through
            dumped = json.dumps(outcome, default=lambda o: getattr(o, "__dict__", str(o))).lower()
            assert not any(f"\\ud{c}" in dumped for c in "89abcdef"), dumped[:200]

    run()


def _wordnet(path):
    from bertology.analysis.wordnet import WordNet

    directory = path.parent / "wordnet"
    directory.mkdir(exist_ok=True)
    files = {"lexnames": "00\tadj.all\t3\n03\tnoun.Tops\t1\n05\tnoun.animal\t1\n",
             "data.noun": "00000001 03 n 01 entity 0 000 | that which exists\n"
                          "00000002 05 n 01 dog 0 001 @ 00000001 n 0000 | a domesticated canid\n",
             "data.verb": "", "data.adj": "", "data.adv": ""}
    for name, text in files.items():
        (directory / name).write_text(text)
    (directory / "index.sense").write_bytes(path.read_bytes())
    return WordNet(directory)


def _task_tsv(path):
    from bertology.tasks.readers import TaskFileConfig, read_task_file

    config = TaskFileConfig(format="tsv", kind="classification", header=True, text="sentence", label="label",
                            train=str(path))
    return list(read_task_file(config, "train"))


def _corpus(kind):
    def read(path):
        from bertology.data.corpus import read_documents

        return list(read_documents(path, kind))

    return read


MORE_READERS = {
    "task tsv": (_task_tsv, "sentence\tlabel\na good film\tpos\na bad one\tneg\n"),
    "corpus bert": (_corpus("bert"), "First sentence.\nSecond one.\n\nAnother document.\n"),
    "corpus text": (_corpus("text"), "A paragraph of text. It has two sentences.\n\nAnother paragraph.\n"),
    "corpus brown": (_corpus("brown"), "The/at dog/nn barked/vbd ./.\n\nIt/pps ran/vbd ./.\n"),
    "span predictions": (lambda p: __import__("bertology.tasks.spans", fromlist=["x"]).read_span_predictions(p),
                         "sentence_id\tstart\tend\tpredicted\tgold\n0\t0\t2\tPER\tPER\n"),
    "anisotropy corpus": (lambda p: __import__("bertology.analysis.geometry", fromlist=["x"]).read_corpus([p]),
                          "one sentence\n\nanother one\n"),
    "sense-map labelled": (lambda p: __import__("bertology.analysis.sense_map", fromlist=["x"]).read_labelled(p),
                           "the bank was open\tbank\tbank%1:14:00::\n# a comment\n"),
    "wordnet index.sense": (_wordnet, "entity%1:03:00:: 00000001 1 11\ndog%1:05:00:: 00000002 1 10\n"),
}


@pytest.mark.parametrize("name", MORE_READERS)
def test_more_damaged_files_give_only_named_errors(name):
    reader, valid = MORE_READERS[name]
    assert reader(_file(name, valid.encode("utf-8"))) is not None  # the valid file reads

    @settings(max_examples=EXAMPLES // 2)
    @given(data=damaged(valid.encode("utf-8")))
    def run(data):
        path = _file(name, data)
        only_our_errors(name, lambda: reader(path), names=(str(path), "wordnet"))

    run()


@pytest.mark.parametrize("name", JSON_READERS)
@pytest.mark.parametrize("depth", [900, 100_000])
def test_json_nested_beyond_the_parser_is_named(name, depth):
    reader, _ = READERS[name]
    path = _file(name, ("[" * depth + "]" * depth + "\n").encode())
    outcome = only_our_errors(f"{name} (nesting)", lambda: reader(path), names=str(path))
    assert isinstance(outcome, Exception)


def test_surrogates_are_found_at_any_depth():
    from bertology.inputs import check_unicode
    from bertology.errors import DataError

    deep = json.loads("[" * 900 + '"\\udfff"' + "]" * 900)
    with pytest.raises(DataError, match=r"f.json: field '(\[0\]){900}': character 0 is a lone surrogate"):
        check_unicode(deep, "f.json")
