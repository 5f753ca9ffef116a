"""One framing of special tokens: the tokenizer frames texts and pairs as transformers' fast tokenizer of each family
does (ids, segment ids, padding side), and a tokenizer without a token its family needs is a clear error."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import tokenizers
import transformers
from tokenizers import processors

from bertology.data import InMemoryDocuments, InstanceConfig, Masker, MaskingConfig, create_instances
from bertology.errors import ConfigError, TokenizerError
from bertology.tokenization import load_tokenizer
from bertology.tokenization.framing import FRAMINGS, Framing, Layout, register_framing

from framing_helpers import SENTINELS, backend, saved, tokenizer

STYLES = ("bert", "roberta", "bart", "gpt2", "t5", "xlnet")

REFERENCE = {
    "bert": (transformers.BertTokenizerFast, {}),
    "roberta": (transformers.RobertaTokenizerFast, {}),
    "bart": (transformers.BartTokenizerFast, {}),
    "gpt2": (transformers.GPT2TokenizerFast, {"pad_token": "<|endoftext|>"}),
    "t5": (transformers.T5TokenizerFast, {"extra_ids": SENTINELS}),
    "xlnet": (transformers.XLNetTokenizerFast, {}),
}

FIRSTS = ["the cat sat", "a dog ran in the park with the cat", "hello"]
SECONDS = ["on the mat", "again", "she read the old book by the window"]


@pytest.fixture(scope="module", params=STYLES)
def pair(request) -> tuple:
    """(bertology's Tokenizer, transformers' fast tokenizer) over copies of one backend."""
    style = request.param
    made = backend(style)
    cls, options = REFERENCE[style]
    reference = cls(tokenizer_object=tokenizers.Tokenizer.from_str(made.to_str()), **options)
    return style, tokenizer(style, made), reference


def test_single_texts_and_pairs_match_transformers(pair) -> None:
    style, ours, reference = pair
    for text in FIRSTS:
        expected = reference(text, return_token_type_ids=True)
        got = ours.encode(text)
        assert got.ids == expected["input_ids"], (style, text)
        assert got.type_ids == expected["token_type_ids"], (style, text)
    for a, b in zip(FIRSTS, SECONDS):
        expected = reference(a, b, return_token_type_ids=True)
        got = ours.encode(a, b)
        assert got.ids == expected["input_ids"], (style, a, b)
        assert got.type_ids == expected["token_type_ids"], (style, a, b)


def test_padded_batches_match_transformers(pair) -> None:
    style, ours, reference = pair
    for pairs in (None, SECONDS):
        expected = reference(FIRSTS, pairs, padding=True, return_token_type_ids=True)
        got = ours.encode_batch(FIRSTS, pairs)
        for key in ("input_ids", "token_type_ids", "attention_mask"):
            assert getattr(got, key).tolist() == expected[key], (style, key, pairs is not None)
    assert reference.padding_side == ours.framing.padding_side == ("left" if style == "xlnet" else "right")


def test_framing_ids_and_layout_of_each_family() -> None:
    gpt2 = tokenizer("gpt2").framing
    assert (gpt2.cls_id, gpt2.sep_id, gpt2.mask_id) == (None, None, None)
    assert gpt2.overhead(False) == gpt2.overhead(True) == 0 and gpt2.document_break == ()
    assert gpt2.frame([7, 8], [9]).ids == [7, 8, 9] and gpt2.frame([7, 8], [9]).type_ids == [0, 0, 1]

    xlnet = tokenizer("xlnet")
    f = xlnet.framing
    framed = f.frame([7, 8], [9])
    assert framed.ids == [7, 8, f.sep_id, 9, f.sep_id, f.cls_id] and framed.type_ids == [0, 0, 0, 1, 1, 2]
    assert framed.spans == ((0, 2), (3, 4)) and framed.summary == 5
    assert f.frame([7]).summary == 2 and f.overhead(False) == 2 and f.overhead(True) == 3
    assert (f.cls_id, f.sep_id) == (xlnet.token_to_id("<cls>"), xlnet.token_to_id("<sep>"))

    t5 = tokenizer("t5")
    f = t5.framing
    vocab = t5.vocab_size
    assert f.sentinels == tuple(range(vocab - 1, vocab - 1 - SENTINELS, -1))  # numbered down from the end
    assert f.cls_id is None and f.mask_id is None and f.sep_id == t5.token_to_id("</s>")
    assert f.frame([7], [8]).ids == [7, f.sep_id, 8, f.sep_id]
    assert set(f.sentinels) <= t5.special_ids

    roberta = tokenizer("roberta").framing
    assert roberta.frame([7], [8]).ids == [roberta.cls_id, 7, roberta.sep_id, roberta.sep_id, 8, roberta.sep_id]
    assert roberta.overhead(True) == 4 and roberta.frame([7]).summary == 0


@pytest.mark.parametrize("style", STYLES)
def test_saved_tokenizers_load_back_with_their_framing(style: str, tmp_path: Path) -> None:
    ours = tokenizer(style)
    ours.save(tmp_path / style)
    loaded = load_tokenizer(tmp_path / style)
    assert loaded.style == style  # saved with the family's class (BartTokenizer, T5Tokenizer, ...) where it fits
    assert loaded.framing == Framing(ours.cls_id, ours.sep_id, ours.pad_id, ours.mask_id, loaded.style,
                                     ours.framing.sentinels)
    assert loaded.encode("the cat", "a dog").ids == ours.encode("the cat", "a dog").ids
    assert loaded.framing.source == str(tmp_path / style / "tokenizer.json")


@pytest.mark.parametrize("style", STYLES)
def test_family_class_names_the_framing(style: str, tmp_path: Path) -> None:
    loaded = load_tokenizer(saved(style, tmp_path / style))
    assert loaded.style == style
    reference, options = REFERENCE[style]
    expected = reference(tokenizer_object=tokenizers.Tokenizer.from_file(str(tmp_path / style / "tokenizer.json")),
                         **options)
    assert loaded.encode("the cat", "a dog").ids == expected("the cat", "a dog")["input_ids"]


@pytest.mark.parametrize(("style", "token"), [("t5", "</s>"), ("xlnet", "<cls>"), ("bert", "[SEP]"),
                                              ("roberta", "<mask>")])
def test_a_token_the_family_needs_missing_from_the_vocabulary(style: str, token: str, tmp_path: Path) -> None:
    directory = saved(style, tmp_path / style)
    state = json.loads((directory / "tokenizer.json").read_text(encoding="utf-8"))
    vocab = state["model"]["vocab"]
    if isinstance(vocab, dict):
        vocab[f"{token}-gone"] = vocab.pop(token)
    else:  # Unigram: [token, score] pairs
        state["model"]["vocab"] = [[f"{t}-gone" if t == token else t, s] for t, s in vocab]
    state["added_tokens"] = [t for t in state["added_tokens"] if t["content"] != token]
    (directory / "tokenizer.json").write_text(json.dumps(state), encoding="utf-8")
    where = re.escape(str(directory / "tokenizer.json"))
    with pytest.raises(TokenizerError, match=f"^{where}: the {style} framing's .* token '{re.escape(token)}' not in the "):
        load_tokenizer(directory)


def test_a_token_named_in_the_files_must_be_in_the_vocabulary(tmp_path: Path) -> None:
    directory = saved("gpt2", tmp_path / "gpt2")
    (directory / "special_tokens_map.json").write_text('{"pad_token": "<pad>"}', encoding="utf-8")
    where = re.escape(str(directory / "tokenizer.json"))
    with pytest.raises(TokenizerError, match=f"^{where}: the gpt2 framing's pad token '<pad>' not in the vocab"):
        load_tokenizer(directory)


def test_features_that_need_a_token_the_framing_lacks(tmp_path: Path) -> None:
    directory = saved("gpt2", tmp_path / "gpt2")
    gpt2 = load_tokenizer(directory).framing
    where = re.escape(str(directory / "tokenizer.json"))
    with pytest.raises(TokenizerError, match=f"^{where}: no mask token \\(gpt2 framing\\); masked-LM needs one"):
        Masker(MaskingConfig(), gpt2, 300)
    documents = InMemoryDocuments([[[5, 6], [7, 8]], [[9, 10], [11]]])
    with pytest.raises(TokenizerError, match=f"^{where}: no sep token \\(gpt2 framing\\); next-sentence prediction"):
        create_instances(documents, InstanceConfig(kind="nsp"), gpt2)
    with pytest.raises(TokenizerError, match=f"^{where}: no sep token \\(gpt2 framing\\); sentence order"):
        create_instances(documents, InstanceConfig(kind="sop"), gpt2)
    t5 = load_tokenizer(saved("t5", tmp_path / "t5")).framing
    with pytest.raises(TokenizerError, match="tokenizer.json: no mask token \\(t5 framing\\); masked-LM needs one"):
        Masker(MaskingConfig(), t5, 300)


def test_bad_framings() -> None:
    with pytest.raises(ConfigError, match="Framing.style: expected one of 'bert', .*'xlnet', 'deberta', got 'elmo'"):
        Framing(1, 2, 0, 3, style="elmo")
    with pytest.raises(ConfigError, match="Framing.cls_id: the xlnet framing places a cls token, got None"):
        Framing(None, 2, 0, 3, style="xlnet")
    with pytest.raises(ConfigError, match="Framing.pad_id: expected an integer or None, got '0'"):
        Framing(1, 2, "0", 3)
    with pytest.raises(ConfigError, match=r"Framing.sentinels: expected integers >= 0, got \[-1\]"):
        Framing(None, 2, 0, None, style="t5", sentinels=(-1,))
    with pytest.raises(ConfigError, match="the pair template must hold A then B once each"):
        Layout("odd", single=(("A", 0),), pair=(("B", 0), ("A", 1)), tokens={})
    with pytest.raises(ConfigError, match="unknown part 'eod' in the single template"):
        Layout("odd", single=(("A", 0), ("eod", 0)), pair=(("A", 0), ("B", 1)), tokens={})
    with pytest.raises(ConfigError, match="needs sep but names no default token for it"):
        Layout("odd", single=(("A", 0), ("sep", 0)), pair=(("A", 0), ("B", 1)), tokens={})
    with pytest.raises(ConfigError, match="framing 'bert' is already registered"):
        register_framing(Layout("bert", single=(("A", 0),), pair=(("A", 0), ("B", 1)), tokens={}))
    assert set(STYLES) <= set(FRAMINGS)


def test_a_registered_framing_frames_tokenizers(tmp_path: Path) -> None:
    """A family added through the registry only: ``<s> A`` and ``<s> A </s> B`` with B in segment 1."""
    layout = Layout("prefixed-test", single=(("cls", 0), ("A", 0)), pair=(("cls", 0), ("A", 0), ("sep", 0), ("B", 1)),
                    tokens={"cls": "<s>", "sep": "</s>", "pad": "<pad>", "mask": "<mask>", "unk": "<unk>"})
    register_framing(layout)
    try:
        made = tokenizer("prefixed-test", backend("roberta"))
        s, e = made.cls_id, made.sep_id
        assert made.encode("the cat").ids == [s, *made.encode("the cat", add_special_tokens=False).ids]
        a, b = (made.encode(t, add_special_tokens=False).ids for t in ("the cat", "a dog"))
        assert made.encode("the cat", "a dog").ids == [s, *a, e, *b]
        assert made.encode("the cat", "a dog").type_ids == [0] * (len(a) + 2) + [1] * len(b)
    finally:
        del FRAMINGS["prefixed-test"]



def test_bert_and_roberta_post_processors_are_the_ones_transformers_builds() -> None:
    """The framing rebuilds the very processors BERT and RoBERTa use, so tokenizer.json (and the fingerprint of
    corpora prepared with it) does not change."""
    bert = tokenizer("bert")
    cls, sep = bert.cls_token, bert.sep_token
    expected = processors.TemplateProcessing(single=f"{cls}:0 $A:0 {sep}:0", pair=f"{cls}:0 $A:0 {sep}:0 $B:1 {sep}:1",
                                             special_tokens=[(cls, bert.cls_id), (sep, bert.sep_id)])
    assert json.loads(bert.backend.to_str())["post_processor"] == json.loads(expected.__getstate__())
    roberta = tokenizer("roberta")
    expected = processors.RobertaProcessing((roberta.sep_token, roberta.sep_id), (roberta.cls_token, roberta.cls_id),
                                            True, False)
    assert json.loads(roberta.backend.to_str())["post_processor"] == json.loads(expected.__getstate__())
