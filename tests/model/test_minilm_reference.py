"""all-MiniLM-L6-v2 against transformers' recorded outputs (../shared/reference): every hidden state, the pooler
output and the attention probabilities within 1e-5, padded and padding-free."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from bertology.model import load_model

TOL = 1e-5


@pytest.fixture(scope="module")
def reference(reference_dir):
    return dict(np.load(reference_dir / "reference_outputs.npz"))


@pytest.fixture(scope="module")
def model(minilm_path):
    return load_model(minilm_path)


@pytest.mark.parametrize("packed", [True, False], ids=["padding-free", "padded"])
def test_hidden_states_pooler_and_attentions(model, reference, packed):
    ids, mask, types = (torch.tensor(reference[k]) for k in ("input_ids", "attention_mask", "token_type_ids"))
    real = mask.bool().numpy()
    with torch.no_grad():
        out = model(ids, mask, types, output_hidden_states=True, output_attentions=True, packed=packed)
    assert len(out.hidden_states) == 7
    for layer, hidden in enumerate(out.hidden_states):
        assert np.abs(hidden.numpy()[real] - reference[f"hidden_state_{layer}"][real]).max() <= TOL, layer
    assert np.abs(out.last_hidden_state.numpy()[real] - reference["last_hidden_state"][real]).max() <= TOL
    assert np.abs(out.pooler_output.numpy() - reference["pooler_output"]).max() <= TOL
    for layer, probs in enumerate(out.attentions):
        for row in range(len(real)):
            keep = real[row]
            got = probs[row].numpy()[:, keep][:, :, keep]
            want = reference[f"attention_{layer}"][row][:, keep][:, :, keep]
            assert np.abs(got - want).max() <= TOL


def test_padded_and_padding_free_agree(model, reference):
    ids, mask, types = (torch.tensor(reference[k]) for k in ("input_ids", "attention_mask", "token_type_ids"))
    real = mask.bool()
    with torch.no_grad():
        a = model(ids, mask, types, output_hidden_states=True, packed=True)
        b = model(ids, mask, types, output_hidden_states=True, packed=False)
    for x, y in zip(a.hidden_states, b.hidden_states):
        assert (x[real] - y[real]).abs().max() <= TOL
    # padding-free outputs are exactly zero at padding
    assert a.last_hidden_state[~real].abs().max() == 0


def test_sentence_embedding(model, reference):
    ids, mask, types = (torch.tensor(reference[k]) for k in ("input_ids", "attention_mask", "token_type_ids"))
    with torch.no_grad():
        h = model(ids, mask, types).last_hidden_state
    mean = (h * mask[..., None]).sum(1) / mask.sum(1, keepdim=True)
    sentence = torch.nn.functional.normalize(mean, dim=-1).numpy()
    assert np.abs(sentence - reference["sentence_embedding"]).max() <= TOL


def test_load_gives_model_and_tokenizer_matching_reference(minilm_path, reference, reference_dir):
    import json

    from bertology import load

    texts = json.loads((reference_dir / "inputs.json").read_text(encoding="utf-8"))
    pretrained = load(minilm_path)
    assert not pretrained.model.training
    batch = pretrained.tokenizer.encode_batch(texts)
    width = reference["input_ids"].shape[1]
    assert batch.input_ids.shape[1] <= width
    ids = np.full_like(reference["input_ids"], pretrained.tokenizer.pad_id)
    ids[:, : batch.input_ids.shape[1]] = batch.input_ids.numpy()
    assert (ids == reference["input_ids"]).all()
    with torch.no_grad():
        out = pretrained.model(batch.input_ids, batch.attention_mask, batch.token_type_ids)
    real = batch.attention_mask.bool().numpy()
    want = reference["last_hidden_state"][:, : batch.input_ids.shape[1]]
    assert np.abs(out.last_hidden_state.numpy()[real] - want[real]).max() <= TOL
