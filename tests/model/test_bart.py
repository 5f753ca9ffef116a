"""The `bart` checkpoint family: small random BART models of every supported architecture built by transformers,
loaded by bertology (logits within 1e-5 on a padded batch), saved back by bertology and loaded by transformers
(same keys, same outputs); config.json values bertology cannot represent are clear errors naming the file and key."""

from __future__ import annotations

import json

import pytest
import torch

transformers = pytest.importorskip("transformers")

from bertology.errors import CheckpointError, ConfigError, InputError  # noqa: E402
from bertology.model import Seq2SeqModel, TransformerConfig, load_model, save_model  # noqa: E402
from bertology.model.heads import HeadSpec  # noqa: E402

TOL = 1e-5
BOS, PAD, EOS = 0, 1, 2
VOCAB = 99
SUFFIXES = ["Model", "ForConditionalGeneration", "ForSequenceClassification", "ForQuestionAnswering"]


def bart_config(**overrides):
    values = dict(vocab_size=VOCAB, d_model=32, encoder_layers=3, decoder_layers=2, encoder_attention_heads=4,
                  decoder_attention_heads=4, encoder_ffn_dim=37, decoder_ffn_dim=37, max_position_embeddings=24,
                  scale_embedding=True, num_labels=3, pad_token_id=PAD, bos_token_id=BOS, eos_token_id=EOS,
                  decoder_start_token_id=EOS)
    values.update(overrides)
    return transformers.BartConfig(**values)


def reference(suffix: str, **overrides):
    torch.manual_seed(0)
    model = getattr(transformers, "Bart" + suffix)(bart_config(**overrides)).eval()
    with torch.no_grad():  # move every weight off its initial value: norms, biases and final_logits_bias included
        for tensor in model.state_dict().values():
            if tensor.is_floating_point():
                tensor.add_(torch.randn_like(tensor) * 0.1)
    return model


def padded_batch():
    """<s> tokens </s> then padding, right-padded as BART is; the decoder reads the input shifted right."""
    torch.manual_seed(1)
    lengths = [12, 7, 12, 3]
    ids = torch.full((len(lengths), max(lengths)), PAD)
    mask = torch.zeros_like(ids)
    for row, n in enumerate(lengths):
        ids[row, :n] = torch.randint(3, VOCAB, (n,))
        ids[row, 0], ids[row, n - 1] = BOS, EOS
        mask[row, :n] = 1
    decoder_ids = transformers.models.bart.modeling_bart.shift_tokens_right(ids, PAD, EOS)
    return ids, mask, decoder_ids, mask.clone()


def reference_outputs(model, suffix: str, batch) -> dict[str, torch.Tensor]:
    ids, mask, decoder_ids, decoder_mask = batch
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask, decoder_input_ids=decoder_ids,
                    decoder_attention_mask=decoder_mask)
    if suffix == "Model":
        return {"decoder": out.last_hidden_state, "encoder": out.encoder_last_hidden_state}
    if suffix == "ForQuestionAnswering":
        return {"qa": torch.stack([out.start_logits, out.end_logits], -1)}
    return {"logits": out.logits}


def our_outputs(model, suffix: str, batch) -> dict[str, torch.Tensor]:
    ids, mask, decoder_ids, decoder_mask = batch
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask, decoder_input_ids=decoder_ids,
                    decoder_attention_mask=decoder_mask)
    if suffix == "Model":
        return {"decoder": out.last_hidden_state, "encoder": out.encoder_last_hidden_state}
    if suffix == "ForQuestionAnswering":
        return {"qa": out.logits}
    return {"logits": out.logits}


def assert_close_on_real_tokens(ours: dict, theirs: dict, mask: torch.Tensor) -> None:
    assert ours.keys() == theirs.keys()
    for name, expected in theirs.items():
        got = ours[name]
        assert got.shape == expected.shape, name
        if expected.dim() >= 2 and expected.shape[:2] == mask.shape:  # per token: padding positions are not compared
            got, expected = got[mask.bool()], expected[mask.bool()]
        assert (got - expected).abs().max().item() < TOL, name


@pytest.mark.parametrize("suffix", SUFFIXES)
def test_transformers_bart_loads_and_saves_back_exactly(tmp_path, suffix):
    theirs = reference(suffix)
    theirs.save_pretrained(tmp_path / "hf")
    batch = padded_batch()
    expected = reference_outputs(theirs, suffix, batch)

    ours = load_model(tmp_path / "hf")
    assert isinstance(ours, Seq2SeqModel)
    assert ours.config.position_offset == 2 and ours.config.embedding_norm and not ours.config.pre_norm
    assert ours.config.embedding_scale == pytest.approx(32 ** 0.5)
    assert_close_on_real_tokens(our_outputs(ours, suffix, batch), expected, batch[3])

    save_model(ours, tmp_path / "ours", format="hf")
    written = json.loads((tmp_path / "ours" / "config.json").read_text())
    assert written["architectures"] == ["Bart" + suffix] and written["model_type"] == "bart"
    assert written["scale_embedding"] is True and written["decoder_layers"] == 2
    from safetensors.torch import load_file

    assert set(load_file(tmp_path / "ours" / "model.safetensors")) == set(load_file(tmp_path / "hf" /
                                                                                   "model.safetensors"))
    back = getattr(transformers, "Bart" + suffix).from_pretrained(tmp_path / "ours").eval()
    again = reference_outputs(back, suffix, batch)
    for name in expected:
        assert torch.equal(again[name], expected[name]), name
