"""The task readers on the real files of ../shared/data (counts as its README gives them) and the tag conversions
on hand-made cases."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from bertology.errors import DataError
from bertology.tasks.examples import Answer, LabelSet, QAExample, TaggedSentence, TextExample
from bertology.tasks.readers import (
    GLUE_TASKS,
    bio_to_iob1,
    check_glue_splits,
    iob1_to_bio,
    read_conll,
    read_glue,
    read_squad,
    split_squad_by_article,
)

# task -> split -> (rows, label counts or the score range)
GLUE_COUNTS = {
    "sst2": {"train": (67349, {"1": 37569, "0": 29780}), "dev": (872, {"1": 444, "0": 428})},
    "cola": {"train": (8551, {"1": 6023, "0": 2528}), "dev": (1043, {"1": 721, "0": 322})},
    "mrpc": {"train": (3668, {"1": 2474, "0": 1194}), "dev": (408, {"1": 279, "0": 129})},
    "rte": {"train": (2490, {"entailment": 1249, "not_entailment": 1241}),
            "dev": (277, {"entailment": 146, "not_entailment": 131})},
    "stsb": {"train": (5749, None), "dev": (1500, None)},
}


@pytest.mark.parametrize("task", sorted(GLUE_COUNTS))
@pytest.mark.parametrize("split", ["train", "dev"])
def test_glue_real_files(data_dir: Path, task: str, split: str) -> None:
    examples = list(read_glue(task, GLUE_TASKS[task].path(data_dir / "glue", split)))
    rows, label_counts = GLUE_COUNTS[task][split]
    assert len(examples) == rows
    assert [e.id for e in examples] == [str(i) for i in range(rows)]  # the data row number, header excluded
    assert all(isinstance(e, TextExample) and e.text for e in examples)
    pairs = task in ("mrpc", "rte", "stsb")
    assert all((e.text_pair is not None) == pairs for e in examples)
    if label_counts is None:
        scores = [e.label for e in examples]
        assert all(isinstance(s, float) and 0.0 <= s <= 5.0 for s in scores)
        assert min(scores) == 0.0 and max(scores) == 5.0
    else:
        assert Counter(e.label for e in examples) == label_counts


def test_glue_texts_kept_as_written(data_dir: Path) -> None:
    sst2 = next(read_glue("SST-2", data_dir / "glue/SST-2/dev.tsv"))
    assert sst2 == TextExample("0", "it 's a charming and often affecting journey . ", None, "1")
    mrpc = next(read_glue("mrpc", data_dir / "glue/MRPC/dev.tsv"))  # BOM dropped, `"` not quoting
    assert mrpc.label == "1" and mrpc.text_pair.startswith('"The foodservice pie business')
    cola = list(read_glue("cola", data_dir / "glue/CoLA/dev.tsv"))  # no header, no final newline
    assert cola[0].text == "The sailors rode the breeze clear of the rocks."
    assert cola[-1].text == "John talked to Bill about himself."
    stsb = next(read_glue("sts-b", data_dir / "glue/STS-B/train.tsv"))
    assert stsb == TextExample("0", "A plane is taking off.", "An air plane is taking off.", 5.0)
    # STS-B rows hold `"` that is not quoting (252 in train, 110 in dev; the README says 360 in all): with quoting
    # off each is its own row (csv's default quoting reads 5,711 rows of train and 1,470 of dev, merging rows)
    for split, count in (("train", 252), ("dev", 110)):
        quoted = [e for e in read_glue("stsb", data_dir / f"glue/STS-B/{split}.tsv") if '"' in e.text + e.text_pair]
        assert len(quoted) == count


@pytest.mark.parametrize("task", sorted(GLUE_COUNTS))
def test_glue_splits_agree(data_dir: Path, task: str) -> None:
    spec = GLUE_TASKS[task]
    labels = check_glue_splits(task, spec.path(data_dir / "glue", "train"), spec.path(data_dir / "glue", "dev"))
    assert labels == spec.labels


# ------------------------------------------------------------------------------------------------------- CoNLL
def iob1_chunks(tags: list[str]) -> set[tuple[str, int, int]]:
    """Entities of IOB1 tags: I-X continues an X entity, B-X always starts one."""
    chunks, start, kind = set(), None, None
    for i, tag in enumerate(tags + ["O"]):
        prefix, _, tag_kind = tag.partition("-")
        if kind is not None and (tag == "O" or prefix == "B" or tag_kind != kind):
            chunks.add((kind, start, i))
            kind = None
        if tag != "O" and kind is None:
            start, kind = i, tag_kind
    return chunks


def strict_bio_chunks(tags: list[str]) -> set[tuple[str, int, int]]:
    """Entities of BIO tags, asserting strict BIO: every entity starts with B-, an I-X only continues an X."""
    chunks, start, kind = set(), None, None
    for i, tag in enumerate(tags + ["O"]):
        prefix, _, tag_kind = tag.partition("-")
        if prefix == "I":
            assert kind == tag_kind, f"I-{tag_kind} at {i} does not continue an entity: {tags}"
            continue
        if kind is not None:
            chunks.add((kind, start, i))
            kind = None
        if prefix == "B":
            start, kind = i, tag_kind
    return chunks


@pytest.mark.parametrize("name, sentences, tokens, documents, b_tags, stray_b",
                         [("eng.train", 14041, 203621, 946, 72, 2), ("eng.testa", 3250, 51362, 216, 4, 0)])
def test_conll_real_files(data_dir: Path, name: str, sentences: int, tokens: int, documents: int,
                          b_tags: int, stray_b: int) -> None:
    read = list(read_conll(data_dir / "conll2003" / name))
    assert len(read) == sentences
    assert sum(len(s) for s in read) == tokens
    assert [s.id for s in read] == [str(i) for i in range(sentences)]
    docs = [s.document for s in read]
    assert docs == sorted(docs) and set(docs) == set(range(documents))
    assert all(len(s.columns) == len(s.words) == len(s.tags) and all(len(c) == 4 for c in s.columns)
               for s in read)
    original = [[c[-1] for c in s.columns] for s in read]
    assert sum(t.startswith("B-") for tags in original for t in tags) == b_tags  # IOB1: B- (almost) only when touching
    changed, not_undone = 0, 0
    for s, iob1 in zip(read, original):
        assert strict_bio_chunks(s.tags) == iob1_chunks(iob1)  # the conversion changes no entity
        changed += sum(a != b for a, b in zip(s.tags, iob1))
        back = bio_to_iob1(s.tags)  # undone exactly, except where the file has B-X not after an X (IOB1 allows
        if back != iob1:            # it, but canonical IOB1 writes I-X there): 2 in eng.train, e.g. "at the
            not_undone += 1         # B-MISC(Atlanta) I-MISC(Games)"
            assert iob1_chunks(back) == iob1_chunks(iob1)
    assert changed > 0
    assert not_undone == stray_b
    # the chunk column is IOB1 too
    for s in read_conll(data_dir / "conll2003" / name, tag_column=2):
        assert strict_bio_chunks(s.tags) == iob1_chunks([c[2] for c in s.columns])
    kept = next(read_conll(data_dir / "conll2003" / name, scheme_out=None))
    assert kept.tags == [c[-1] for c in kept.columns]


def test_conll_sentence_and_documents(tmp_path: Path) -> None:
    path = tmp_path / "small.conll"
    path.write_text("-DOCSTART- -X- O O\n\nEU NNP I-NP I-ORG\nrejects VBZ I-VP O\n\nPeter NNP I-NP I-PER\n"
                    "Blackburn NNP I-NP I-PER\n\n-DOCSTART- -X- O O\n\n\nBonn NNP I-NP I-LOC\n")  # no final blank
    read = list(read_conll(path))
    assert read == [
        TaggedSentence("0", ["EU", "rejects"], ["B-ORG", "O"], [["EU", "NNP", "I-NP", "I-ORG"],
                                                                 ["rejects", "VBZ", "I-VP", "O"]], 0),
        TaggedSentence("1", ["Peter", "Blackburn"], ["B-PER", "I-PER"],
                       [["Peter", "NNP", "I-NP", "I-PER"], ["Blackburn", "NNP", "I-NP", "I-PER"]], 0),
        TaggedSentence("2", ["Bonn"], ["B-LOC"], [["Bonn", "NNP", "I-NP", "I-LOC"]], 1),
    ]
    assert [s.tags for s in read_conll(path, scheme_out="IOB1")] == [["I-ORG", "O"], ["I-PER", "I-PER"], ["I-LOC"]]
    assert [s.tags for s in read_conll(path, tag_column=None)] == [None, None, None]
    no_documents = tmp_path / "plain.conll"
    no_documents.write_text("a B-X\nb I-X\n\nc O\n")
    assert [(s.words, s.tags, s.document) for s in read_conll(no_documents)] == [
        (["a", "b"], ["B-X", "I-X"], 0), (["c"], ["O"], 0)]


@pytest.mark.parametrize("iob1, bio", [
    ([], []),
    (["O", "O"], ["O", "O"]),
    (["I-PER"], ["B-PER"]),  # at the start of the sentence
    (["O", "I-LOC", "I-LOC", "O"], ["O", "B-LOC", "I-LOC", "O"]),  # after O
    (["I-PER", "I-ORG", "I-ORG"], ["B-PER", "B-ORG", "I-ORG"]),  # after another type
    (["I-PER", "B-PER", "I-PER"], ["B-PER", "B-PER", "I-PER"]),  # two entities of one type touching
    (["I-LOC", "B-LOC", "B-LOC"], ["B-LOC", "B-LOC", "B-LOC"]),  # three one-token entities touching
    (["I-MISC", "I-MISC", "B-MISC", "O", "I-MISC"], ["B-MISC", "I-MISC", "B-MISC", "O", "B-MISC"]),
    (["I-A", "B-A", "I-B", "B-B", "I-A"], ["B-A", "B-A", "B-B", "B-B", "B-A"]),
])
def test_iob1_bio_conversions(iob1: list[str], bio: list[str]) -> None:
    assert iob1_to_bio(iob1) == bio
    assert bio_to_iob1(bio) == iob1
    assert iob1_to_bio(bio) == bio  # BIO input comes back unchanged
    assert strict_bio_chunks(bio) == iob1_chunks(iob1)


def test_tag_conversion_refuses_invalid_tags() -> None:
    for tags in (["O", "PER"], ["E-PER"], ["B-"], ["o"]):
        with pytest.raises(DataError, match="invalid tag"):
            iob1_to_bio(tags)
        with pytest.raises(DataError, match="invalid tag"):
            bio_to_iob1(tags)


# ------------------------------------------------------------------------------------------------------- SQuAD
def test_squad_real_file(data_dir: Path) -> None:
    path = data_dir / "squad" / "squad-v1.1-dev-part-a.json"
    examples = read_squad(path)
    assert len(examples) == 5397
    assert sum(len(e.answers) for e in examples) == 18368
    titles = list(dict.fromkeys(e.title for e in examples))
    assert len(titles) == 24 and titles[0] == "Super_Bowl_50"
    assert len({e.id for e in examples}) == 5397
    first = examples[0]
    assert isinstance(first, QAExample) and first.id == "56be4db0acb8001400a502ec"
    assert first.question == "Which NFL team represented the AFC at Super Bowl 50?"
    assert first.answers == [Answer("Denver Broncos", 177)] * 3
    assert all(e.context[a.start:a.end] == a.text for e in examples for a in e.answers)

    train, dev = split_squad_by_article(path, dev_fraction=0.25, seed=0)
    train_titles, dev_titles = {e.title for e in train}, {e.title for e in dev}
    assert len(dev_titles) == 6 and len(train_titles) == 18 and not train_titles & dev_titles
    assert len(train) + len(dev) == 5397
    position = {e.id: i for i, e in enumerate(examples)}  # both splits keep the file's order
    assert all(position[a.id] < position[b.id] for part in (train, dev) for a, b in zip(part, part[1:]))
    # deterministic, and independent of the order of the input
    again = split_squad_by_article(list(reversed(examples)), dev_fraction=0.25, seed=0)
    assert {e.title for e in again[1]} == dev_titles
    other = split_squad_by_article(examples, dev_fraction=0.25, seed=1)
    assert {e.title for e in other[1]} != dev_titles
    by_count = split_squad_by_article(examples, dev_articles=6, seed=0)
    assert by_count == (train, dev)
    by_title = split_squad_by_article(examples, dev_articles=["Super_Bowl_50"])
    assert {e.title for e in by_title[1]} == {"Super_Bowl_50"} and len(by_title[0]) + len(by_title[1]) == 5397


def test_split_squad_small_and_bad_arguments() -> None:
    def qa(i: int, title: str) -> QAExample:
        return QAExample(str(i), "q?", "ctx", [Answer("c", 0)], title)

    examples = [qa(i, f"t{i % 5}") for i in range(20)]
    train, dev = split_squad_by_article(examples, dev_fraction=0.01)  # rounds to 0: at least one article
    assert len({e.title for e in dev}) == 1 and len(train) == 16
    train, dev = split_squad_by_article(examples, dev_fraction=0.99)  # at least one article left for train
    assert len({e.title for e in train}) == 1
    from bertology.errors import ConfigError
    for options in ({}, {"dev_fraction": 0.5, "dev_articles": 2}, {"dev_fraction": 1.0},
                    {"dev_articles": 5}, {"dev_articles": 0}, {"dev_articles": ["nope"]},
                    {"dev_articles": [f"t{i}" for i in range(5)]}):
        with pytest.raises(ConfigError):
            split_squad_by_article(examples, **options)
    with pytest.raises(DataError, match="1 article"):
        split_squad_by_article([qa(0, "a"), qa(1, "a")], dev_fraction=0.5)


# ----------------------------------------------------------------------------------------------------- labels
def test_label_set() -> None:
    labels = LabelSet(["entailment", "not_entailment"])
    assert len(labels) == 2 and list(labels) == ["entailment", "not_entailment"]
    assert labels.index("not_entailment") == 1 and labels.name(0) == "entailment"
    assert "entailment" in labels and "neutral" not in labels
    with pytest.raises(DataError, match=r"^dev.tsv: line 7: unknown label 'neutral' \(expected one of "
                                        r"'entailment', 'not_entailment'\)$"):
        labels.index("neutral", "dev.tsv: line 7")
    with pytest.raises(IndexError):
        labels.name(2)
    with pytest.raises(DataError, match="twice"):
        LabelSet(["a", "a"])
    with pytest.raises(DataError, match="at least one"):
        LabelSet([])
    assert LabelSet.from_labels(["10", "2", "1", "2"]).names == ("1", "2", "10")
    assert LabelSet.from_labels(["b", "a", "b"]).names == ("a", "b")
    assert LabelSet(["a", "b"]) == LabelSet(("a", "b")) and hash(LabelSet(["a"])) == hash(LabelSet(["a"]))
