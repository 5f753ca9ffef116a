"""Tokenised shards: round trip against direct tokenisation, memory mapping, shard boundaries, held-out split,
tokenizer checks, corrupted directories, and the `bertology data prepare` command."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import numpy as np
import pytest
import tokenizers

from bertology.cli.main import main
from bertology.data.corpus import CorpusSource, read_documents
from bertology.data.shards import (
    TokenizedCorpus,
    prepare_corpus,
    select_heldout,
    tokenizer_fingerprint,
)
from bertology.errors import ConfigError, DataError, TokenizerError
from bertology.tokenization import Tokenizer, load_tokenizer, train_tokenizer

SHARED = Path(__file__).resolve().parents[2] / ".." / "shared" / "data"
BROWN = SHARED / "brown-nltk"

TRAINING_TEXT = [
    "The quick brown fox jumps over the lazy dog while the dogs were sleeping.",
    "Unbelievable things happen when jumping foxes meet sleeping dogs in the forest.",
    "Mr. Smith quickly wrote seventeen letters, then he slept until the morning.",
    "Forests, rivers and mountains: the travellers walked slowly towards the northern lights!",
]


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return train_tokenizer(iter(TRAINING_TEXT * 20), kind="wordpiece", vocab_size=200, show_progress=False)


@pytest.fixture(scope="module")
def other_tokenizer() -> Tokenizer:
    return train_tokenizer(iter(TRAINING_TEXT[:2] * 20), kind="wordpiece", vocab_size=120, show_progress=False)


def corpus_documents(n: int) -> list[list[str]]:
    """``n`` documents of varying length built from the training sentences (and a few unseen words)."""
    rng = np.random.default_rng(n)
    words = " ".join(TRAINING_TEXT).replace(",", "").replace(".", "").split() + ["zebra", "quixotic"]
    docs = []
    for _ in range(n):
        sentences = []
        for _ in range(int(rng.integers(1, 6))):
            picked = rng.choice(words, size=int(rng.integers(2, 12)))
            sentences.append(" ".join(picked).capitalize() + ".")
        docs.append(sentences)
    return docs


def write_bert(path: Path, docs: list[list[str]]) -> Path:
    path.write_text("\n\n".join("\n".join(doc) for doc in docs) + "\n", encoding="utf-8")
    return path


def expected_word_starts(encoding: tokenizers.Encoding) -> np.ndarray:
    words = encoding.word_ids
    return np.array([i == 0 or words[i] != words[i - 1] for i in range(len(words))], dtype=bool)


# -------------------------------------------------------------------------------------------------- round trip


def test_round_trip_equals_direct_tokenisation(tmp_path: Path, tokenizer: Tokenizer) -> None:
    docs = corpus_documents(30)
    source = write_bert(tmp_path / "corpus.txt", docs)
    corpus = prepare_corpus(source, tokenizer, tmp_path / "shards", show_progress=False)
    assert len(corpus) == 30
    total = 0
    for i, doc in enumerate(docs):
        got_ids, got_starts = corpus.document(i), corpus.word_starts(i)
        assert len(got_ids) == len(got_starts) == len(doc)
        for sentence, ids, starts in zip(doc, got_ids, got_starts):
            direct = tokenizer.backend.encode(sentence, add_special_tokens=False)
            assert ids.dtype == np.int64 and starts.dtype == np.bool_
            np.testing.assert_array_equal(ids, direct.ids)
            np.testing.assert_array_equal(starts, expected_word_starts(direct))
            # For WordPiece a word continues exactly at the "##" pieces.
            np.testing.assert_array_equal(starts, [not t.startswith("##") for t in direct.tokens])
            total += len(ids)
    assert corpus.num_tokens == total
    assert corpus.num_sentences == sum(map(len, docs))
    assert corpus.document_lengths().sum() == total
    assert [len(d) for d in corpus] == [len(d) for d in docs]
    assert corpus.document(-1)[0].tolist() == corpus.document(29)[0].tolist()
    with pytest.raises(IndexError):
        corpus.document(30)


def test_memmap_layout_and_metadata(tmp_path: Path, tokenizer: Tokenizer) -> None:
    source = write_bert(tmp_path / "corpus.txt", corpus_documents(12))
    corpus = prepare_corpus(source, tokenizer, tmp_path / "shards", show_progress=False)
    meta = json.loads((tmp_path / "shards" / "metadata.json").read_text())
    assert meta["format_version"] == 1 and meta["dtype"] == "uint16"
    assert meta["vocab_size"] == tokenizer.vocab_size
    assert meta["tokenizer_sha256"] == tokenizer_fingerprint(tokenizer)
    assert meta["sources"][0]["format"] == "bert" and meta["sources"][0]["files"] == [str(source)]
    ids = np.load(tmp_path / "shards" / "shard-00000.ids.npy", mmap_mode="r")
    starts = np.load(tmp_path / "shards" / "shard-00000.word_start.npy", mmap_mode="r")
    sentences = np.load(tmp_path / "shards" / "shard-00000.sentences.npy", mmap_mode="r")
    documents = np.load(tmp_path / "shards" / "shard-00000.documents.npy", mmap_mode="r")
    assert isinstance(ids, np.memmap) and ids.dtype == np.uint16 and starts.dtype == np.bool_
    assert len(ids) == len(starts) == sentences[-1] == meta["num_tokens"] == corpus.num_tokens
    assert documents[-1] == len(sentences) - 1 == meta["num_sentences"]
    np.testing.assert_array_equal(corpus.unigram_counts, np.bincount(ids, minlength=tokenizer.vocab_size))
    pickled = pickle.dumps(corpus)
    assert len(pickled) < 1000  # the directory travels, not the arrays
    assert [s.tolist() for s in pickle.loads(pickled).document(3)] == [s.tolist() for s in corpus.document(3)]
    assert corpus.unigram_counts.shape == (tokenizer.vocab_size,) and corpus.unigram_counts.dtype == np.int64
    assert not set(np.flatnonzero(corpus.unigram_counts)) & (set(tokenizer.special_ids) - {tokenizer.unk_id})


def test_shards_split_at_document_boundaries(tmp_path: Path, tokenizer: Tokenizer) -> None:
    source = write_bert(tmp_path / "corpus.txt", corpus_documents(40))
    one = prepare_corpus(source, tokenizer, tmp_path / "one", show_progress=False)
    many = prepare_corpus(source, tokenizer, tmp_path / "many", shard_size_tokens=50, show_progress=False)
    shards = many.metadata["shards"]
    assert len(shards) > 5
    # Every shard but the last reaches the size; no document is cut.
    assert all(shard["num_tokens"] >= 50 for shard in shards[:-1])
    assert sum(shard["num_documents"] for shard in shards) == len(many) == len(one) == 40
    for i in range(40):
        assert [s.tolist() for s in many.document(i)] == [s.tolist() for s in one.document(i)]
        assert [s.tolist() for s in many.word_starts(i)] == [s.tolist() for s in one.word_starts(i)]
    np.testing.assert_array_equal(many.unigram_counts, one.unigram_counts)


def test_empty_sentences_and_documents_are_dropped(tmp_path: Path, tokenizer: Tokenizer) -> None:
    # Control characters normalise away: that sentence, and the document holding only it, have no tokens.
    source = write_bert(tmp_path / "c.txt", [["The fox.", "\x07\x07", "The dog."], ["\x07"], ["Sleeping."]])
    corpus = prepare_corpus(source, tokenizer, tmp_path / "shards", show_progress=False)
    assert len(corpus) == 2 and corpus.num_sentences == 3
    assert [len(d) for d in corpus] == [2, 1]


def test_special_token_strings_in_text_stay_text(tmp_path: Path, tokenizer: Tokenizer) -> None:
    source = write_bert(tmp_path / "c.txt", [["The [MASK] fox [SEP] [CLS] jumps."]])
    corpus = prepare_corpus(source, tokenizer, tmp_path / "shards", show_progress=False)
    ids = corpus.document(0)[0]
    structural = {tokenizer.mask_id, tokenizer.sep_id, tokenizer.cls_id, tokenizer.pad_id}
    assert len(ids) > 5 and not set(ids.tolist()) & structural
    assert tokenizer.backend.encode_special_tokens is False  # the setting is restored
    assert tokenizer.backend.encode("[MASK]", add_special_tokens=False).ids == [tokenizer.mask_id]


def test_large_vocabulary_uses_uint32(tmp_path: Path) -> None:
    vocab = {"[UNK]": 0, **{f"w{i}": i for i in range(1, 70_000)}}
    backend = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    source = write_bert(tmp_path / "c.txt", [["w1 w69999 w65536", "w70000 w3"]])
    corpus = prepare_corpus(source, backend, tmp_path / "shards", show_progress=False)
    assert corpus.metadata["dtype"] == "uint32"
    assert [s.tolist() for s in corpus.document(0)] == [[1, 69_999, 65_536], [0, 3]]


def test_mixed_sources(tmp_path: Path, tokenizer: Tokenizer) -> None:
    write_bert(tmp_path / "a.txt", [["The fox."], ["The dog."]])
    (tmp_path / "b.jsonl").write_text(json.dumps({"text": "Mr. Smith slept. Then he wrote."}) + "\n")
    sources = [CorpusSource(tmp_path / "a.txt", "bert"), CorpusSource(tmp_path / "b.jsonl", "jsonl")]
    corpus = prepare_corpus(sources, tokenizer, tmp_path / "shards", show_progress=False)
    assert len(corpus) == 3
    assert [m["format"] for m in corpus.metadata["sources"]] == ["bert", "jsonl"]
    expected = tokenizer.backend.encode("Then he wrote.", add_special_tokens=False).ids
    assert corpus.document(2)[1].tolist() == expected


# ------------------------------------------------------------------------------------------------------ held out


def test_heldout_split_is_deterministic_and_disjoint(tmp_path: Path, tokenizer: Tokenizer) -> None:
    docs = corpus_documents(50)
    source = write_bert(tmp_path / "corpus.txt", docs)
    runs = {}
    for name, seed in (("a", 7), ("b", 7), ("c", 8)):
        train = prepare_corpus(source, tokenizer, tmp_path / name, heldout_documents=6, seed=seed, show_progress=False)
        heldout = TokenizedCorpus(tmp_path / name / "heldout")
        runs[name] = (
            [tuple(np.concatenate(d).tolist()) for d in train],
            [tuple(np.concatenate(d).tolist()) for d in heldout],
        )
        assert len(train) == 44 and len(heldout) == 6
        assert heldout.metadata["split"] == "heldout" and train.metadata["heldout"]["seed"] == seed
    assert runs["a"] == runs["b"]
    assert runs["a"][1] != runs["c"][1]
    every = [tuple(np.concatenate([tokenizer.backend.encode(s, add_special_tokens=False).ids for s in d]).tolist())
             for d in docs]
    train_a, heldout_a = runs["a"]
    assert sorted(train_a + heldout_a) == sorted(every)
    # Documents keep their corpus order within each split.
    mask = select_heldout(50, 6, seed=7)
    assert heldout_a == [doc for doc, held in zip(every, mask) if held]


def test_heldout_fraction_and_errors(tmp_path: Path, tokenizer: Tokenizer) -> None:
    source = write_bert(tmp_path / "corpus.txt", corpus_documents(20))
    prepare_corpus(source, tokenizer, tmp_path / "s", heldout_documents=0.1, show_progress=False)
    assert len(TokenizedCorpus(tmp_path / "s" / "heldout")) == 2
    assert select_heldout(20, 0.01, seed=0).sum() == 1  # a positive fraction holds out at least one
    with pytest.raises(DataError, match="cannot hold out 20 of 20 documents"):
        prepare_corpus(source, tokenizer, tmp_path / "t", heldout_documents=20, show_progress=False)
    assert not (tmp_path / "t").exists()  # nothing half-written
    with pytest.raises(ConfigError, match=r"fraction must be in \[0, 1\)"):
        select_heldout(20, 1.5, seed=0)
    with pytest.raises(ConfigError, match="must be >= 0"):
        select_heldout(20, -1, seed=0)
    with pytest.raises(ConfigError, match="int count or a float fraction"):
        select_heldout(20, True, seed=0)


# ---------------------------------------------------------------------------------------------------- tokenizer


def test_tokenizer_check(tmp_path: Path, tokenizer: Tokenizer, other_tokenizer: Tokenizer) -> None:
    source = write_bert(tmp_path / "corpus.txt", corpus_documents(5))
    prepare_corpus(source, tokenizer, tmp_path / "shards", show_progress=False)
    tokenizer.save(tmp_path / "tok")
    reloaded = load_tokenizer(tmp_path / "tok")
    reloaded.encode("The fox.", max_length=4)  # runtime truncation settings are not part of the identity
    corpus = TokenizedCorpus(tmp_path / "shards", tokenizer=reloaded)
    corpus.check_tokenizer(tokenizer.backend)
    with pytest.raises(TokenizerError, match="shards were made with a different tokenizer"):
        TokenizedCorpus(tmp_path / "shards", tokenizer=other_tokenizer)
    with pytest.raises(TokenizerError, match="different tokenizer"):
        corpus.check_tokenizer(other_tokenizer)
    with pytest.raises(TokenizerError, match="expected a bertology Tokenizer"):
        prepare_corpus(source, "not a tokenizer", tmp_path / "x", show_progress=False)


# ------------------------------------------------------------------------------------------- bad directories


def test_output_directory_protection(tmp_path: Path, tokenizer: Tokenizer) -> None:
    source = write_bert(tmp_path / "corpus.txt", corpus_documents(3))
    (tmp_path / "precious").mkdir()
    (tmp_path / "precious" / "notes.txt").write_text("keep me")
    with pytest.raises(DataError, match="not a tokenized corpus; refusing to replace it"):
        prepare_corpus(source, tokenizer, tmp_path / "precious", show_progress=False)
    assert (tmp_path / "precious" / "notes.txt").read_text() == "keep me"
    prepare_corpus(source, tokenizer, tmp_path / "shards", show_progress=False)
    with pytest.raises(DataError, match="already exists there"):
        prepare_corpus(source, tokenizer, tmp_path / "shards", show_progress=False)
    again = prepare_corpus(source, tokenizer, tmp_path / "shards", overwrite=True, show_progress=False)
    assert len(again) == 3
    with pytest.raises(ConfigError, match="shard_size_tokens"):
        prepare_corpus(source, tokenizer, tmp_path / "z", shard_size_tokens=0, show_progress=False)
    with pytest.raises(ConfigError, match="unknown corpus format"):
        prepare_corpus(source, tokenizer, tmp_path / "z", format="xml", show_progress=False)  # type: ignore[arg-type]


def test_corrupted_directories(tmp_path: Path, tokenizer: Tokenizer) -> None:
    with pytest.raises(DataError, match="not a tokenized corpus"):
        TokenizedCorpus(tmp_path)
    source = write_bert(tmp_path / "corpus.txt", corpus_documents(5))
    directory = tmp_path / "shards"
    prepare_corpus(source, tokenizer, directory, show_progress=False)
    meta_path = directory / "metadata.json"
    good = meta_path.read_text()

    meta_path.write_text(good.replace('"format_version": 1', '"format_version": 99'))
    with pytest.raises(DataError, match="format_version 99 is not supported"):
        TokenizedCorpus(directory)
    meta_path.write_text("{not json")
    with pytest.raises(DataError, match="metadata.json: invalid metadata"):
        TokenizedCorpus(directory)
    meta_path.write_text(good)

    ids = np.load(directory / "shard-00000.ids.npy")
    np.save(directory / "shard-00000.ids.npy", ids[:-3])
    with pytest.raises(DataError, match=r"shard-00000\.\*\.npy: array sizes disagree"):
        TokenizedCorpus(directory)
    (directory / "shard-00000.ids.npy").unlink()
    with pytest.raises(DataError, match="missing shard file shard-00000.ids.npy"):
        TokenizedCorpus(directory)


def test_prepare_errors_from_the_reader(tmp_path: Path, tokenizer: Tokenizer) -> None:
    (tmp_path / "bad.jsonl").write_text('{"text": "ok"}\n{"txt": "no"}\n')
    with pytest.raises(DataError, match=r"bad\.jsonl: line 2: missing field 'text'"):
        prepare_corpus(tmp_path / "bad.jsonl", tokenizer, tmp_path / "out", format="jsonl", show_progress=False)
    assert not (tmp_path / "out").exists()
    (tmp_path / "blank.txt").write_text("\n\n")
    with pytest.raises(DataError, match="empty corpus"):
        prepare_corpus(tmp_path / "blank.txt", tokenizer, tmp_path / "out", show_progress=False)


# ----------------------------------------------------------------------------------------------------------- CLI


def test_cli_prepare_end_to_end(tmp_path: Path, tokenizer: Tokenizer, capsys: pytest.CaptureFixture) -> None:
    tokenizer.save(tmp_path / "tok")
    docs = corpus_documents(25)
    write_bert(tmp_path / "a.txt", docs)
    (tmp_path / "b.jsonl").write_text(json.dumps({"text": "The fox slept. The dog jumps."}) + "\n")
    argv = ["data", "prepare", "--tokenizer", str(tmp_path / "tok"), "--out", str(tmp_path / "shards"),
            "--heldout-documents", "0.2", "--seed", "3", "--shard-size-tokens", "100", "--quiet",
            str(tmp_path / "a.txt"), f"jsonl:{tmp_path / 'b.jsonl'}"]  # fmt: skip
    assert main(argv) == 0
    err = capsys.readouterr().err
    train = TokenizedCorpus(tmp_path / "shards", tokenizer=load_tokenizer(tmp_path / "tok"))
    heldout = TokenizedCorpus(tmp_path / "shards" / "heldout")
    assert len(train) + len(heldout) == 26 and len(heldout) == 5
    assert f"wrote {len(train)} documents" in err and "held out 5 documents" in err
    assert [m["format"] for m in train.metadata["sources"]] == ["bert", "jsonl"]
    assert len(train.metadata["shards"]) > 1
    # Run again without --overwrite: a clear error and exit status 2.
    assert main(argv) == 2
    assert "already exists there" in capsys.readouterr().err
    bad = ["data", "prepare", "--tokenizer", str(tmp_path / "tok"), "--out", str(tmp_path / "o2"), "--quiet",
           str(tmp_path / "nothing-*.txt")]  # fmt: skip
    assert main(bad) == 2
    assert "matched no files" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------------------ real data


@pytest.mark.skipif(not BROWN.is_dir(), reason=f"shared data not found at {BROWN}")
def test_brown_shards(tmp_path: Path, tokenizer: Tokenizer) -> None:
    files = sorted(BROWN.glob("ca0*"))
    corpus = prepare_corpus(files, tokenizer, tmp_path / "brown", format="brown", show_progress=False)
    docs = list(read_documents(files, format="brown"))
    assert len(corpus) == len(docs) == 9
    for i in (0, 8):
        for sentence, ids in zip(docs[i], corpus.document(i)):
            assert ids.tolist() == tokenizer.backend.encode(sentence, add_special_tokens=False).ids
    assert corpus.num_tokens == int(corpus.unigram_counts.sum()) > 20_000
