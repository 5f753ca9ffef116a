"""WordPiece training gives the same tokenizer on every run, in every process: the tokenizers library's trainer
numbers continuation pieces in the order of a hash map seeded afresh per call and breaks merge ties by those
numbers, so a retrained vocabulary (and every seeded run built on it) used to move from one process to the next."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import tokenizers

from bertology.data.corpus import CorpusSource
from bertology.tokenization import train_tokenizer
from bertology.tokenization.training import _pipeline

from tok_data import CORPUS, CORPUS_LINES

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
ROOT = Path(__file__).resolve().parents[2]


def train(source, size: int = 120, **kwargs) -> str:
    return train_tokenizer(source, "wordpiece", size, min_frequency=1, show_progress=False, **kwargs).backend.to_str()


def test_the_same_vocabulary_from_every_call_and_every_input_form(tmp_path: Path) -> None:
    (tmp_path / "corpus.txt").write_text(CORPUS, encoding="utf-8")
    runs = {train(iter(CORPUS.splitlines())) for _ in range(4)}
    runs.add(train([tmp_path / "corpus.txt"]))
    runs.add(train(CorpusSource(str(tmp_path / "corpus.txt"))))
    assert len(runs) == 1  # the library's trainer alone gives a different numbering on nearly every call


def test_the_same_vocabulary_in_another_process(tmp_path: Path) -> None:
    (tmp_path / "corpus.txt").write_text(CORPUS, encoding="utf-8")
    script = ("import sys; from bertology.tokenization import train_tokenizer; "
              "sys.stdout.write(train_tokenizer([sys.argv[1]], 'wordpiece', 120, min_frequency=1, "
              "show_progress=False).backend.to_str())")
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), PYTHONHASHSEED="123")
    other = subprocess.run([sys.executable, "-c", script, str(tmp_path / "corpus.txt")], env=env, check=True,
                           capture_output=True, text=True).stdout
    assert other == train([tmp_path / "corpus.txt"])


def test_layout_is_specials_alphabet_continuations_then_merges_as_the_library_finds_them() -> None:
    state = json.loads(train(iter(CORPUS_LINES), size=200))
    vocab = state["model"]["vocab"]
    tokens = sorted(vocab, key=vocab.get)
    assert sorted(vocab.values()) == list(range(len(vocab)))
    assert tokens[:5] == SPECIALS
    alphabet = [t for t in tokens if len(t) == 1]
    pieces = [t for t in tokens if t.startswith("##") and len(t) == 3]
    merges = tokens[5 + len(alphabet) + len(pieces):]
    assert tokens[5:5 + len(alphabet)] == sorted(alphabet)
    assert tokens[5 + len(alphabet):5 + len(alphabet) + len(pieces)] == sorted(pieces)
    assert merges and all(len(t) > 1 and not (t.startswith("##") and len(t) == 3) for t in merges)
    # The continuation pieces are plain vocabulary, not special tokens: "##a" in a text is split as any text is.
    assert [t["content"] for t in state["added_tokens"]] == SPECIALS
    tokenizer = tokenizers.Tokenizer.from_str(json.dumps(state))
    assert tokenizer.encode("##a", add_special_tokens=False).tokens == ["#", "#", "a"]
    # The same alphabet and continuation pieces as the tokenizers library's own trainer finds.
    backend, trainer = _pipeline("wordpiece", "bert", True, 200, 1, False, SPECIALS, 1000)
    backend.train_from_iterator(CORPUS_LINES, trainer)
    theirs = backend.get_vocab()
    assert sorted(t for t in theirs if len(t) == 1) == sorted(alphabet)
    assert sorted(t for t in theirs if t.startswith("##") and len(t) == 3) == sorted(pieces)


def test_limit_alphabet_keeps_the_most_frequent_characters_ties_by_code_point() -> None:
    # 26 distinct letters: a-j three times each, k-t twice, u-z once; the cut at 15 falls inside k-t.
    texts = ["abcdefghij"] * 3 + ["klmnopqrst"] * 2 + ["uvwxyz"]
    runs = {train(iter(texts), size=80, limit_alphabet=15) for _ in range(3)}
    assert len(runs) == 1
    vocab = json.loads(runs.pop())["model"]["vocab"]
    assert sorted(t for t in vocab if len(t) == 1) == list("abcdefghijklmno")
    counts = Counter("".join(texts))
    assert counts["o"] == counts["p"]  # a tie at the cut, broken by code point


def test_unigram_scores_do_not_depend_on_the_order_the_trainer_lists_its_pieces() -> None:
    """The Unigram trainer lists its pieces in an order that changes between processes; scored in that order, pieces
    of equal counts (here letters and word starts that occur equally often) came out a unit in the last place apart
    and so in another order in one process of five, and with them the ids of every model built on the vocabulary.
    The pieces are scored in sorted order, so any listing gives the same tokenizer."""
    import random

    from bertology.tokenization.training import _batches, _rescore_unigram

    words = ["good", "great", "fine", "bad", "awful", "poor", "the", "a", "movie", "was", "john", "mary", "paris",
             "london", "met", "went", "to", "in"]
    texts = [" ".join(words)] * 5 + [" ".join(words[i:] + words[:i]) for i in range(len(words))]
    specials = ["<pad>", "</s>", "<unk>"]
    backend, trainer = _pipeline("unigram", "t5", False, 200, 2, False, specials, None)
    counts: Counter[str] = Counter()
    backend.train_from_iterator(_batches(iter(texts), backend.normalizer, lambda *_: "texts", words=counts,
                                         pre_tokenizer=backend.pre_tokenizer), trainer)
    state = json.loads(backend.to_str())
    listed = state["model"]["vocab"]
    saved = set()
    for seed in range(6):
        pieces = listed[len(specials):]
        random.Random(seed).shuffle(pieces)
        state["model"]["vocab"] = listed[:len(specials)] + pieces
        shuffled = tokenizers.Tokenizer.from_str(json.dumps(state))
        saved.add(_rescore_unigram(shuffled, specials, counts).to_str())
    assert len(saved) == 1
    vocab = json.loads(saved.pop())["model"]["vocab"][len(specials):]
    assert vocab == sorted(vocab, key=lambda item: (-item[1], item[0]))  # by score, ties by piece
    assert len({score for _, score in vocab}) < len(vocab)  # the corpus has ties, so the test can see them
