"""XLNet's tokenizer files through the one framing: an XLNetTokenizerFast built here over a SentencePiece-style
Unigram vocabulary, saved beside a random XLNet checkpoint, loads with the model (`bertology.load`) and encodes texts
and pairs to transformers' ids, segment ids (2 for <cls>) and left padding; the model reads them as transformers'
does. The same tokenizer beside a BERT checkpoint is refused, naming the key."""

from __future__ import annotations

import pytest
import tokenizers
import torch

transformers = pytest.importorskip("transformers")

import bertology  # noqa: E402
from bertology.errors import TokenizerError  # noqa: E402

from framing_helpers import backend  # noqa: E402

FIRSTS = ["the cat sat", "a dog ran in the park with the cat", "hello"]
SECONDS = ["on the mat", "again", "she read the old book by the window"]


@pytest.fixture(scope="module")
def reference():
    return transformers.XLNetTokenizerFast(tokenizer_object=tokenizers.Tokenizer.from_str(backend("xlnet").to_str()))


def test_xlnet_checkpoint_with_its_tokenizer_matches_transformers(tmp_path, reference) -> None:
    torch.manual_seed(0)
    hf = transformers.XLNetForSequenceClassification(transformers.XLNetConfig(
        vocab_size=reference.vocab_size, d_model=16, n_layer=2, n_head=2, d_inner=24, dropout=0.0,
        summary_last_dropout=0.0, num_labels=2, pad_token_id=reference.pad_token_id)).eval()
    hf.save_pretrained(tmp_path)
    reference.save_pretrained(tmp_path)
    loaded = bertology.load(tmp_path)
    tok = loaded.tokenizer
    assert tok.style == "xlnet" and tok.framing.padding_side == "left"
    assert (tok.framing.cls_id, tok.framing.sep_id, tok.pad_id) == (
        reference.cls_token_id, reference.sep_token_id, reference.pad_token_id)
    for pairs in (None, SECONDS):
        expected = reference(FIRSTS, pairs, padding=True, return_token_type_ids=True, return_tensors="pt")
        got = tok.encode_batch(FIRSTS, pairs)
        for key in ("input_ids", "token_type_ids", "attention_mask"):
            assert torch.equal(torch.as_tensor(getattr(got, key)), expected[key]), (key, pairs is not None)
        assert (got.input_ids[:, -1] == reference.cls_token_id).all()  # the summary token is last in every row
        assert got.token_type_ids[0, -1] == 2
        with torch.no_grad():
            theirs = hf(**expected).logits
            ours = loaded.model.eval()(got.input_ids, got.attention_mask, token_type_ids=got.token_type_ids).logits
        torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-5)


def test_xlnet_tokenizer_beside_a_bert_model_is_refused(tmp_path, reference) -> None:
    transformers.BertModel(transformers.BertConfig(
        vocab_size=reference.vocab_size, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=16)).save_pretrained(tmp_path)
    reference.save_pretrained(tmp_path)
    with pytest.raises(TokenizerError, match=r"tokenizer_config.json: key 'tokenizer_class': XLNetTokenizer frames "
                                             r"texts as xlnet does \(A <sep> B <sep> <cls>, padded on the left\), "
                                             r"but model_type argument is 'bert'"):
        bertology.load(tmp_path)


def test_embed_reads_xlnet_summary_token_last(tmp_path, reference) -> None:
    """`embed` over an XLNet checkpoint: the sentence vector with sentence="cls" is transformers' last hidden state
    at <cls>, the last position of each left-padded row; token vectors are the content positions'."""
    from bertology.embeddings import embed

    torch.manual_seed(0)
    hf = transformers.XLNetModel(transformers.XLNetConfig(
        vocab_size=len(reference), d_model=16, n_layer=2, n_head=2, d_inner=24,
        pad_token_id=reference.pad_token_id)).eval()
    hf.save_pretrained(tmp_path)
    reference.save_pretrained(tmp_path)
    out = embed(bertology.load(tmp_path), FIRSTS, sentence="cls")
    batch = reference(FIRSTS, padding=True, return_tensors="pt")
    with torch.no_grad():
        expected = hf(**batch).last_hidden_state
    torch.testing.assert_close(torch.as_tensor(out.sentences), expected[:, -1], atol=1e-5, rtol=1e-5)
    first = out.tokens.vectors[out.tokens.rows(0)]  # "the cat sat": the content tokens before <sep> <cls>
    row = batch["attention_mask"][0].bool()
    torch.testing.assert_close(torch.as_tensor(first), expected[0][row][:-2], atol=1e-5, rtol=1e-5)
