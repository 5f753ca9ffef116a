"""fill-mask on XLNet: every <mask> predicted by the query stream under a permutation mask that hides every mask from
every position, equal to transformers' XLNetLMHeadModel given the same perm_mask and target_mapping (1e-5); a mask's
prediction depends on the context and on no mask's token; the CLI and `/v1/fill-mask` give the library's answers; a
model without the language-model head is refused."""

from __future__ import annotations

import pytest
import torch
from fastapi.testclient import TestClient

from bertology.cli.main import main
from bertology.errors import CheckpointError
from bertology.model import load
from bertology.objectives.fill_mask import fill_mask, permutation_inputs
from bertology.serve import create_app
from finetune_helpers import save_family_model

transformers = pytest.importorskip("transformers")

TEXTS = ["the cat sat on the mat", "a dog ran in the park", "the old book by the window"] * 4
TEXT = "the cat <mask> on the <mask>"


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def xlnet(tmp_path_factory):
    directory = save_family_model(tmp_path_factory.mktemp("xlnet"), "xlnet", TEXTS)
    pretrained = load(directory)
    pretrained.tokenizer.model_max_length = 64
    return pretrained, directory


def test_each_mask_is_predicted_as_transformers_predicts_it(xlnet):
    pretrained, directory = xlnet
    tokenizer = pretrained.tokenizer
    results = fill_mask(pretrained.model, tokenizer, TEXT, top_k=3)
    ids = torch.tensor([tokenizer.encode(TEXT).ids])
    assert ids[0, -2:].tolist() == [tokenizer.framing.sep_id, tokenizer.framing.cls_id]  # text <sep> <cls>
    masks = (ids[0] == tokenizer.mask_id).nonzero().squeeze(1)
    perm_mask, target_mapping = permutation_inputs(ids.shape[1], masks)
    assert perm_mask[0, :, masks].eq(1).all() and perm_mask.sum() == ids.shape[1] * len(masks)
    hf = transformers.XLNetLMHeadModel.from_pretrained(directory).eval()
    with torch.no_grad():
        logits = hf(input_ids=ids, perm_mask=perm_mask, target_mapping=target_mapping, use_mems=False).logits[0]
    top = logits.softmax(-1).topk(3)
    assert len(results) == 2
    for row, predictions in enumerate(results):
        assert [p.token_id for p in predictions] == top.indices[row].tolist()
        torch.testing.assert_close(torch.tensor([p.probability for p in predictions]), top.values[row],
                                   atol=1e-5, rtol=1e-5)
        assert predictions[0].token == tokenizer.id_to_token(predictions[0].token_id)
        assert "<cls>" not in predictions[0].sequence and "<sep>" not in predictions[0].sequence
        assert predictions[0].sequence.count("<mask>") == 1  # the other mask stays as it is


def test_a_mask_sees_the_context_and_no_masks_token(xlnet):
    pretrained, _ = xlnet
    model, tokenizer = pretrained.model.eval(), pretrained.tokenizer
    ids = torch.tensor([tokenizer.encode(TEXT).ids])
    masks = (ids[0] == tokenizer.mask_id).nonzero().squeeze(1)
    perm_mask, target_mapping = permutation_inputs(ids.shape[1], masks)

    def logits(tokens):
        with torch.no_grad():
            return model(tokens, perm_mask=perm_mask, target_mapping=target_mapping, use_mems=False).logits[0]

    base = logits(ids)
    other = ids.clone()
    other[0, masks] = torch.tensor([7, 9])  # any tokens at the masks: hidden from every position
    torch.testing.assert_close(logits(other), base, atol=0, rtol=0)
    context = ids.clone()
    context[0, 1] = 9  # a context token: seen by both masks
    changed = logits(context)
    assert not torch.allclose(changed[0], base[0]) and not torch.allclose(changed[1], base[1])


def test_the_cli_and_the_service_give_the_librarys_predictions(xlnet, capsys):
    pretrained, directory = xlnet
    expected = fill_mask(pretrained.model, pretrained.tokenizer, TEXT, top_k=2)
    assert main(["fill-mask", TEXT, "--model", str(directory), "--top-k", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "mask 1:" and lines[1].split("\t")[1:] == [expected[0][0].token, expected[0][0].sequence]
    with TestClient(create_app(pretrained)) as client:
        assert client.get("/health").json()["fill_mask"] is True
        body = client.post("/v1/fill-mask", json={"texts": [TEXT, "a <mask> ran"], "top_k": 2}).json()
        embedded = client.post("/v1/embed", json={"texts": ["the cat sat", "a dog"]})
    assert [[c["token_id"] for c in group] for group in body["results"][0]] == \
        [[p.token_id for p in group] for group in expected]
    assert [len(groups) for groups in body["results"]] == [2, 1]
    assert embedded.status_code == 200, embedded.json()


def test_a_model_without_the_language_model_head_is_refused(xlnet, tmp_path):
    pretrained, _ = xlnet
    hf = transformers.XLNetForSequenceClassification(transformers.XLNetConfig(
        vocab_size=pretrained.tokenizer.vocab_size, d_model=16, n_layer=1, n_head=2, d_inner=16))
    hf.save_pretrained(tmp_path)
    classifier = load(tmp_path)
    with pytest.raises(CheckpointError, match="fill-mask needs a model with a language-model head; this one has "
                                              "classifier"):
        fill_mask(classifier.model, pretrained.tokenizer, TEXT)
