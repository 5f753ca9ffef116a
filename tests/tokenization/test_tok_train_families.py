"""`bertology tokenizer train` for the generative families: a T5-style Unigram (SentencePiece's Metaspace, </s> and
<pad>, numbered sentinels at the end of the vocabulary) and GPT-2- and BART-style byte-level BPE, trained on a tiny
corpus and saved in the Hugging Face files: transformers' T5TokenizerFast, GPT2TokenizerFast and BartTokenizerFast
load them and give the same ids; bad options are named."""

from __future__ import annotations

import json

import pytest

from bertology.cli.main import main
from bertology.errors import TokenizerError
from bertology.tokenization import load_tokenizer, train_tokenizer

transformers = pytest.importorskip("transformers")

CORPUS = [
    "The cat sat on the mat and looked at the dog.",
    "A dog ran in the park with the cat, again and again.",
    "She read the old book by the window while it rained.",
    "We walked home after the rain stopped; the streets were wet.",
    "Hello world, this is a small corpus for a tokenizer test.",
] * 3
TEXTS = ["the cat sat on the mat", "Hello   World, again!", "an unseen word: zebra ζ", "  leading spaces", ""]


def check_same_ids(directory, hf_class, texts):
    ours = load_tokenizer(directory)
    hf = hf_class.from_pretrained(str(directory))
    for text in texts:
        assert ours.encode(text).ids == hf(text)["input_ids"], text
    return ours, hf


def test_t5_unigram_with_sentinels_loads_in_t5tokenizerfast(tmp_path):
    tokenizer = train_tokenizer(iter(CORPUS), "unigram", 60, style="t5", sentinels=4, show_progress=False)
    tokenizer.save(tmp_path / "t5")
    config = json.loads((tmp_path / "t5" / "tokenizer_config.json").read_text())
    assert config["tokenizer_class"] == "T5Tokenizer" and config["extra_ids"] == 4
    texts = [*TEXTS, "the cat <extra_id_0> on the <extra_id_1> .", "<extra_id_3>"]
    ours, hf = check_same_ids(tmp_path / "t5", transformers.T5TokenizerFast, texts)
    vocab = ours.vocab_size
    assert [ours.backend.id_to_token(i) for i in range(3)] == ["<pad>", "</s>", "<unk>"]
    assert ours.framing.sentinels == tuple(range(vocab - 1, vocab - 5, -1)) == \
        tuple(hf.convert_tokens_to_ids([f"<extra_id_{i}>" for i in range(4)]))
    assert ours.encode("the cat").ids[-1] == ours.framing.sep_id == hf.eos_token_id == 1
    assert ours.pad_id == hf.pad_token_id == 0
    assert ours.encode("the cat", "sat on").ids == hf("the cat", "sat on")["input_ids"]
    assert ours.decode(ours.encode("the cat sat").ids) == hf.decode(hf("the cat sat")["input_ids"],
                                                                     skip_special_tokens=True) == "the cat sat"


@pytest.mark.parametrize("style, hf_class", [("gpt2", "GPT2TokenizerFast"), ("bart", "BartTokenizerFast")])
def test_byte_level_bpe_of_gpt2_and_bart_loads_in_their_classes(tmp_path, style, hf_class):
    tokenizer = train_tokenizer(iter(CORPUS), "bytelevel-bpe", 300, style=style, min_frequency=1,
                                show_progress=False)
    tokenizer.save(tmp_path / style)
    config = json.loads((tmp_path / style / "tokenizer_config.json").read_text())
    assert config["tokenizer_class"] == {"gpt2": "GPT2Tokenizer", "bart": "BartTokenizer"}[style]
    texts = [*TEXTS] + (["the <mask> sat"] if style == "bart" else ["the cat<|endoftext|>"])
    ours, hf = check_same_ids(tmp_path / style, getattr(transformers, hf_class), texts)
    assert ours.style == style
    if style == "gpt2":  # nothing added around a text; <|endoftext|> is its one special token
        assert ours.encode("the cat").ids == ours.backend.encode("the cat").ids
        assert hf.eos_token == hf.bos_token == "<|endoftext|>" == ours.backend.id_to_token(0)
        assert hf.pad_token == "<|endoftext|>" and ours.pad_id == 0  # a task's batches need a padding id
    else:
        assert ours.encode("the cat").ids[0] == hf.bos_token_id == 0


def test_cli_trains_each_kind_and_names_bad_options(tmp_path, capsys):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(CORPUS) + "\n", encoding="utf-8")
    out = tmp_path / "t5"
    assert main(["tokenizer", "train", "--kind", "unigram", "--style", "t5", "--sentinels", "3", "--vocab-size",
                 "60", "--out", str(out), "--quiet", str(corpus)]) == 0
    assert "t5 style" in capsys.readouterr().err
    check_same_ids(out, transformers.T5TokenizerFast, ["the <extra_id_2> cat"])
    assert main(["tokenizer", "train", "--kind", "bytelevel-bpe", "--style", "gpt2", "--vocab-size", "300",
                 "--out", str(tmp_path / "gpt2"), "--quiet", str(corpus)]) == 0
    check_same_ids(tmp_path / "gpt2", transformers.GPT2TokenizerFast, ["the cat sat"])
    assert main(["tokenizer", "train", "--kind", "bpe", "--style", "t5", "--vocab-size", "300", "--out",
                 str(tmp_path / "x"), str(corpus)]) == 2
    assert "a bpe tokenizer is trained in roberta or gpt2 or bart style, not 't5'" in capsys.readouterr().err
    assert main(["tokenizer", "train", "--kind", "unigram", "--sentinels", "3", "--vocab-size", "60", "--out",
                 str(tmp_path / "y"), str(corpus)]) == 2
    assert "sentinels: T5's sentinel tokens are for a t5-style unigram tokenizer, not roberta" in \
        capsys.readouterr().err
    with pytest.raises(TokenizerError, match="sentinels must be a non-negative integer, got -1"):
        train_tokenizer(iter(CORPUS), "unigram", 60, style="t5", sentinels=-1, show_progress=False)
