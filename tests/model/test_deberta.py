"""The `deberta-v2` checkpoint family (DeBERTa-v2 and v3): small random models of every supported architecture built
by transformers (weights moved off their initial values), loaded by bertology (outputs within 1e-5 on a right-padded
batch whose rows are longer than the buckets' exact range, packed and padded), saved back by bertology and loaded by
transformers (the same keys, weights and outputs), for the settings real checkpoints use: both terms or one, shared
or separate position projections, log buckets or exact clamped distances, normed relative embeddings, absolute
positions or none, token types or none, the convolution beside layer 0; both masked-LM layouts. Settings that
disagree are clear errors naming the file and the key."""

from __future__ import annotations

import json

import pytest
import torch

transformers = pytest.importorskip("transformers")

from bertology.errors import ConfigError  # noqa: E402
from bertology.model import EncoderModel, TransformerConfig, load_model, save_model  # noqa: E402
from bertology.model.disentangled import relative_buckets  # noqa: E402

TOL = 1e-5
VOCAB, CLS, SEP, PAD = 97, 1, 2, 0
SUFFIXES = ["Model", "ForMaskedLM", "ForSequenceClassification", "ForTokenClassification", "ForQuestionAnswering"]

# DeBERTa-v3's settings (shared keys, 8 log buckets a side up to distance 32, normed relative embeddings, no
# absolute positions, no token types), and variants of v2's.
V3 = dict(relative_attention=True, pos_att_type=["p2c", "c2p"], position_buckets=8, max_relative_positions=32,
          share_att_key=True, norm_rel_ebd="layer_norm", position_biased_input=False, type_vocab_size=0)
SETTINGS = {
    "v3": V3,
    "v2 separate projections, exact distances clamped at 6, absolute positions, token types": dict(
        relative_attention=True, pos_att_type="c2p|p2c", position_buckets=-1, max_relative_positions=6,
        share_att_key=False, norm_rel_ebd="none", position_biased_input=True, type_vocab_size=2),
    "v2 with the convolution": dict(V3, conv_kernel_size=3, conv_act="gelu", position_biased_input=True),
    "content-to-position only, own projection": dict(V3, pos_att_type=["c2p"], share_att_key=False),
    "position-to-content only, distances from max_position_embeddings": dict(
        V3, pos_att_type=["p2c"], max_relative_positions=-1),
}


def deberta_config(**overrides):
    values = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=37, num_hidden_layers=3, num_attention_heads=4,
                  max_position_embeddings=64, num_labels=3, pad_token_id=PAD, hidden_act="gelu")
    values.update(V3)
    values.update(overrides)
    return transformers.DebertaV2Config(**values)


def reference(suffix: str, **overrides):
    torch.manual_seed(0)
    if suffix == "ForQuestionAnswering":
        overrides.setdefault("num_labels", 2)
    model = getattr(transformers, "DebertaV2" + suffix)(deberta_config(**overrides)).eval()
    with torch.no_grad():  # every weight off its initial value (the norms' ones, the zero biases)
        for tensor in model.state_dict().values():
            if tensor.is_floating_point():
                tensor.add_(torch.randn_like(tensor) * 0.1)
    return model


def padded_batch(token_types: bool = False):
    """[CLS] A [SEP] padded on the right; the longest rows (17) reach distances beyond the exact buckets (+-4) and
    the table (+-8)."""
    generator = torch.Generator().manual_seed(1)
    lengths = [17, 9, 17, 3, 12]
    ids = torch.full((len(lengths), max(lengths)), PAD)
    mask = torch.zeros_like(ids)
    for row, n in enumerate(lengths):
        ids[row, :n] = torch.randint(3, VOCAB, (n,), generator=generator)
        ids[row, 0], ids[row, n - 1] = CLS, SEP
        mask[row, :n] = 1
    types = ((torch.arange(ids.shape[1]) >= 5).long() * mask) if token_types else None
    return ids, mask, types


def reference_output(model, suffix: str, ids, mask, types=None) -> torch.Tensor:
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask, token_type_ids=types)
    if suffix == "Model":
        return out.last_hidden_state
    if suffix == "ForQuestionAnswering":
        return torch.stack([out.start_logits, out.end_logits], -1)
    return out.logits


def our_output(model, suffix: str, ids, mask, types=None, packed: bool = True) -> torch.Tensor:
    with torch.no_grad():
        out = model(ids, mask, types, packed=packed)
    return out.last_hidden_state if suffix == "Model" else out.logits


def real(t: torch.Tensor, mask: torch.Tensor, suffix: str) -> torch.Tensor:
    return t if suffix == "ForSequenceClassification" else t[mask.bool()]


def check_round_trip(tmp_path, model, ref, suffix, ids, mask, types, expected):
    save_model(model, tmp_path / "ours", format="hf")
    saved = json.loads((tmp_path / "ours" / "config.json").read_text())
    assert saved["architectures"] == ["DebertaV2" + suffix]
    back = getattr(transformers, "DebertaV2" + suffix).from_pretrained(tmp_path / "ours").eval()
    for key in ("relative_attention", "pos_att_type", "position_buckets", "max_relative_positions", "share_att_key",
                "norm_rel_ebd", "position_biased_input", "type_vocab_size", "legacy"):
        assert getattr(back.config, key, None) == getattr(ref.config, key, None), key
    assert set(back.state_dict()) == set(ref.state_dict())
    for name, tensor in ref.state_dict().items():
        torch.testing.assert_close(back.state_dict()[name], tensor, atol=0, rtol=0, msg=name)
    torch.testing.assert_close(reference_output(back, suffix, ids, mask, types), expected, atol=TOL, rtol=0)

    save_model(model, tmp_path / "native")  # bertology's own format round-trips too
    again = load_model(tmp_path / "native")
    torch.testing.assert_close(our_output(again, suffix, ids, mask, types), our_output(model, suffix, ids, mask, types),
                               atol=0, rtol=0)


@pytest.mark.parametrize("suffix", SUFFIXES)
@pytest.mark.parametrize("setting", list(SETTINGS))
def test_load_matches_transformers_and_saves_back(tmp_path, one_thread, suffix, setting):
    overrides = SETTINGS[setting]
    ref = reference(suffix, **overrides)
    ref.save_pretrained(tmp_path / "hf")
    ids, mask, types = padded_batch(token_types=overrides["type_vocab_size"] > 0)
    expected = reference_output(ref, suffix, ids, mask, types)

    model = load_model(tmp_path / "hf")
    assert isinstance(model, EncoderModel)
    assert model.config.family == "deberta-v2"
    for packed in (True, False):
        ours = our_output(model, suffix, ids, mask, types, packed)
        assert ours.shape == expected.shape
        torch.testing.assert_close(real(ours, mask, suffix), real(expected, mask, suffix), atol=TOL, rtol=0)
    check_round_trip(tmp_path, model, ref, suffix, ids, mask, types, expected)


def test_the_newer_masked_lm_layout_loads_and_saves(tmp_path, one_thread):
    """legacy false: transformers' `lm_predictions.lm_head` over the word embeddings, no decoder of its own."""
    ref = reference("ForMaskedLM", legacy=False)
    assert any(k.startswith("lm_predictions.lm_head.") for k in ref.state_dict())
    ref.save_pretrained(tmp_path / "hf")
    ids, mask, types = padded_batch()
    expected = reference_output(ref, "ForMaskedLM", ids, mask)
    model = load_model(tmp_path / "hf")
    for packed in (True, False):
        torch.testing.assert_close(real(our_output(model, "ForMaskedLM", ids, mask, packed=packed), mask, ""),
                                   real(expected, mask, ""), atol=TOL, rtol=0)
    check_round_trip(tmp_path, model, ref, "ForMaskedLM", ids, mask, None, expected)


def test_the_poolers_own_activation(tmp_path, one_thread):
    ref = reference("ForSequenceClassification", pooler_hidden_act="tanh")
    ref.save_pretrained(tmp_path / "hf")
    ids, mask, _ = padded_batch()
    expected = reference_output(ref, "ForSequenceClassification", ids, mask)
    model = load_model(tmp_path / "hf")
    assert model.head_specs[0].activation == "tanh"
    torch.testing.assert_close(our_output(model, "ForSequenceClassification", ids, mask), expected, atol=TOL, rtol=0)
    check_round_trip(tmp_path, model, ref, "ForSequenceClassification", ids, mask, None, expected)
    assert json.loads((tmp_path / "ours" / "config.json").read_text())["pooler_hidden_act"] == "tanh"


def test_masked_positions_and_attentions_match_transformers(tmp_path, one_thread):
    ref = reference("ForMaskedLM")
    ref.save_pretrained(tmp_path / "hf")
    ids, mask, _ = padded_batch()
    model = load_model(tmp_path / "hf")
    at = torch.tensor([[0, 3], [1, 8], [4, 11], [2, 16]])
    with torch.no_grad():
        some = model(ids, mask, masked_positions=at).logits
        ours = model(ids, mask, output_attentions=True, output_hidden_states=True)
        theirs = ref(input_ids=ids, attention_mask=mask, output_attentions=True, output_hidden_states=True)
    torch.testing.assert_close(some, theirs.logits[at[:, 0], at[:, 1]], atol=TOL, rtol=0)
    real_keys = mask.bool()[:, None, :, None] & mask.bool()[:, None, None, :]
    for a, b in zip(ours.attentions, theirs.attentions, strict=True):
        torch.testing.assert_close(a[real_keys.expand_as(a)], b[real_keys.expand_as(b)], atol=TOL, rtol=0)
    for a, b in zip(ours.hidden_states, theirs.hidden_states, strict=True):
        torch.testing.assert_close(a[mask.bool()], b[mask.bool()], atol=TOL, rtol=0)


def test_head_mask_and_pruning_match_transformers_masking(tmp_path, one_thread):
    """A head mask multiplies each head's output; pruning heads (their relative projections too) computes what the
    mask computed with those heads at zero."""
    ref = reference("Model", **SETTINGS["content-to-position only, own projection"])
    ref.save_pretrained(tmp_path / "hf")
    ids, mask, _ = padded_batch()
    model = load_model(tmp_path / "hf")
    head_mask = torch.ones(3, 4)
    head_mask[0, 1] = head_mask[2, 0] = head_mask[2, 3] = 0
    with torch.no_grad():
        masked = model(ids, mask, head_mask=head_mask).last_hidden_state
        model.prune_heads({0: [1], 2: [0, 3]})
        pruned = model(ids, mask).last_hidden_state
    assert model.encoder.layers[2].pos_key.out_features == 2 * 8
    torch.testing.assert_close(pruned[mask.bool()], masked[mask.bool()], atol=TOL, rtol=0)


def test_log_buckets_equal_transformers():
    from transformers.models.deberta_v2.modeling_deberta_v2 import make_log_bucket_position

    distance = torch.arange(-600, 601)
    for buckets, largest in ((256, 512), (8, 32), (8, 9), (64, 1024)):
        expected = make_log_bucket_position(distance, buckets, largest).long()
        assert torch.equal(relative_buckets(distance, buckets, largest), expected), (buckets, largest)


def test_training_through_the_packed_path_matches_the_padded_one(one_thread):
    """The MLM loss and its gradients: packed == padded (dropout off), the relative table's gradient included."""
    torch.manual_seed(0)
    config = TransformerConfig(family="deberta-v2", vocab_size=VOCAB, hidden_size=32, num_layers=2, num_heads=4,
                               intermediate_size=37, positions="none", type_vocab_size=0, relative_attention=True,
                               pos_att_type=("c2p", "p2c"), position_buckets=8, max_relative_positions=32,
                               share_att_key=True, relative_norm=True, pooler=False, hidden_dropout=0.0,
                               attention_dropout=0.0, layer_norm_eps=1e-7)
    from bertology.model import HeadSpec

    model = EncoderModel(config, [HeadSpec("mlm", "masked_lm")])
    model.init_weights(torch.Generator().manual_seed(0))
    ids, mask, _ = padded_batch()
    at = torch.tensor([[0, 3], [1, 8], [4, 11], [2, 16]])
    labels = ids[at[:, 0], at[:, 1]]
    grads = []
    for packed in (True, False):
        model.zero_grad()
        logits = model(ids, mask, masked_positions=at, packed=packed).logits
        torch.nn.functional.cross_entropy(logits, labels).backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    assert "encoder.disentangled.table.weight" in grads[0]
    assert set(grads[0]) == set(grads[1])
    for name in grads[0]:
        torch.testing.assert_close(grads[0][name], grads[1][name], atol=1e-5, rtol=1e-4, msg=name)


def write_config(tmp_path, **changes):
    """A saved DebertaV2Model whose config.json is then edited (None deletes a key)."""
    ref = reference("Model")
    ref.save_pretrained(tmp_path)
    path = tmp_path / "config.json"
    data = json.loads(path.read_text())
    for key, value in changes.items():
        if value is None:
            data.pop(key, None)
        else:
            data[key] = value
    path.write_text(json.dumps(data))
    return tmp_path


def test_buckets_beyond_the_largest_distance_are_refused(tmp_path):
    with pytest.raises(ConfigError, match=r"config\.json: position_buckets: 40 buckets .* distances up to 32"):
        load_model(write_config(tmp_path, position_buckets=40))


def test_an_unknown_relative_term_is_refused(tmp_path):
    with pytest.raises(ConfigError, match=r"config\.json: pos_att_type: unknown entry 'p2p'"):
        load_model(write_config(tmp_path, pos_att_type=["c2p", "p2p"]))


def test_a_relative_table_of_the_wrong_size_is_refused(tmp_path):
    """config.json's buckets (here 12 a side: 24 rows) against the stored table (16 rows)."""
    with pytest.raises(ConfigError, match=r"config\.json: position_buckets: .* table of 24 rows; the weights "
                                          r"store encoder\.rel_embeddings\.weight with 16"):
        load_model(write_config(tmp_path, position_buckets=12))


def test_unsupported_settings_are_refused_by_key(tmp_path):
    with pytest.raises(ConfigError, match="config.json: norm_rel_ebd"):
        load_model(write_config(tmp_path / "a", norm_rel_ebd="batch_norm"))
    with pytest.raises(ConfigError, match="config.json: embedding_size: 16 differs from hidden_size 32"):
        load_model(write_config(tmp_path / "b", embedding_size=16))
    with pytest.raises(ConfigError, match="config.json: pooler_hidden_act: unknown activation 'swiglu'"):
        load_model(write_config(tmp_path / "c", pooler_hidden_act="swiglu"))
    with pytest.raises(ConfigError, match="conv_kernel_size"):
        TransformerConfig(family="deberta-v2", conv_kernel_size=4)
