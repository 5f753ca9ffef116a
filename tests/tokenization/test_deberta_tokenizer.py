"""DeBERTa-v3's SentencePiece (Unigram) tokenizer through `tokenizers`: the `deberta` style trained by
`train_tokenizer` / `bertology tokenizer train` ([PAD] 0, [CLS] 1, [SEP] 2, [UNK] 3, [MASK] 4, DebertaV2Tokenizer's
normaliser and Metaspace) loads in transformers' DebertaV2Tokenizer with the same ids, framed [CLS] A [SEP] B [SEP]
with segments 0 and 1; and a DebertaV2Tokenizer saved by transformers (DeBERTa-v3's layout: the pieces, then
[MASK] added at the end) loads in bertology with transformers' ids."""

from __future__ import annotations

import json

import pytest

from bertology.cli.main import main
from bertology.tokenization import load_tokenizer, train_tokenizer

transformers = pytest.importorskip("transformers")

CORPUS = [
    "The cat sat on the mat and looked at the dog.",
    "A dog ran in the park with the cat, again and again.",
    "She read the old book by the window while it rained.",
    "We walked home after the rain stopped; the streets were wet.",
    "Hello world, this is a small corpus for a tokenizer test.",
] * 3
TEXTS = ["the cat sat on the mat", "Hello   World, again!", "an unseen word: zebra ζ", "  leading spaces", "",
         "tabs\tand\nnew lines  ", "The [MASK] sat on the mat."]


def same_ids(ours, hf):
    for text in TEXTS:
        assert ours.encode(text).ids == hf(text)["input_ids"], text
    pair = ours.encode("the cat", "sat on the mat")
    theirs = hf("the cat", "sat on the mat")
    assert pair.ids == theirs["input_ids"] and pair.type_ids == theirs["token_type_ids"]
    first_sep = pair.ids.index(hf.sep_token_id)  # [CLS] A [SEP] in segment 0, B [SEP] in segment 1
    assert pair.ids[0] == hf.cls_token_id and pair.ids[-1] == hf.sep_token_id
    assert pair.type_ids == [0] * (first_sep + 1) + [1] * (len(pair.ids) - first_sep - 1)


def test_a_trained_deberta_tokenizer_loads_in_debertav2tokenizer(tmp_path):
    tokenizer = train_tokenizer(iter(CORPUS), "unigram", 80, style="deberta", show_progress=False)
    tokenizer.save(tmp_path / "tok")
    config = json.loads((tmp_path / "tok" / "tokenizer_config.json").read_text())
    assert config["tokenizer_class"] == "DebertaV2Tokenizer" and config["do_lower_case"] is False
    ours = load_tokenizer(tmp_path / "tok")
    assert ours.style == "deberta"
    assert [ours.backend.id_to_token(i) for i in range(5)] == ["[PAD]", "[CLS]", "[SEP]", "[UNK]", "[MASK]"]
    assert (ours.pad_id, ours.framing.cls_id, ours.framing.sep_id, ours.framing.mask_id) == (0, 1, 2, 4)
    hf = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "tok"))
    assert type(hf).__name__ == "DebertaV2Tokenizer"
    same_ids(ours, hf)
    assert ours.decode(ours.encode("the cat sat").ids) == "the cat sat"


def test_a_debertav2tokenizer_saved_by_transformers_loads_with_its_ids(tmp_path):
    trained = train_tokenizer(iter(CORPUS), "unigram", 80, style="deberta", show_progress=False)
    state = json.loads(trained.backend.to_str())
    pieces = [(piece, score) for piece, score in state["model"]["vocab"] if piece != "[MASK]"]
    hf = transformers.DebertaV2Tokenizer(vocab=pieces, unk_id=3)  # [MASK] is added after the pieces, as in v3
    hf.save_pretrained(tmp_path / "hf")
    ours = load_tokenizer(tmp_path / "hf")
    assert ours.style == "deberta"
    assert ours.framing.mask_id == hf.mask_token_id == len(pieces)
    assert (ours.pad_id, ours.framing.cls_id, ours.framing.sep_id) == (0, 1, 2)
    same_ids(ours, hf)


def test_cli_trains_the_deberta_style(tmp_path, capsys):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(CORPUS) + "\n", encoding="utf-8")
    out = tmp_path / "tok"
    assert main(["tokenizer", "train", "--kind", "unigram", "--style", "deberta", "--vocab-size", "80", "--out",
                 str(out), "--quiet", str(corpus)]) == 0
    assert "deberta style" in capsys.readouterr().err
    same_ids(load_tokenizer(out), transformers.AutoTokenizer.from_pretrained(str(out)))


def test_the_deberta_style_is_for_unigram_only():
    from bertology.errors import TokenizerError

    with pytest.raises(TokenizerError, match="not 'deberta'"):
        train_tokenizer(iter(CORPUS), "wordpiece", 80, style="deberta", show_progress=False)
