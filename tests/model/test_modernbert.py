"""The `modernbert` checkpoint family: small random ModernBERT models of every supported architecture built by
transformers (eager attention: its reference maths; weights moved off their initial values), loaded by bertology
(outputs within 1e-5 on a right-padded batch longer than the window, on the packed and the padded path, for several
layer patterns and both poolings), saved back by bertology and loaded by transformers (the same keys, the same
outputs); config.json values bertology cannot represent are clear errors naming the file and the key."""

from __future__ import annotations

import json

import pytest
import torch

transformers = pytest.importorskip("transformers")

from bertology.errors import CheckpointError, ConfigError  # noqa: E402
from bertology.model import TransformerConfig, load_model, save_model  # noqa: E402
from bertology.model.encoder import EncoderModel  # noqa: E402

TOL = 1e-5
VOCAB, CLS, SEP, PAD = 97, 1, 2, 0
SUFFIXES = ["Model", "ForMaskedLM", "ForSequenceClassification", "ForTokenClassification", "ForQuestionAnswering"]


def modernbert_config(**overrides):
    values = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=40, num_hidden_layers=4, num_attention_heads=4,
                  local_attention=6, max_position_embeddings=64, num_labels=3, pad_token_id=PAD, bos_token_id=CLS,
                  cls_token_id=CLS, eos_token_id=SEP, sep_token_id=SEP, attn_implementation="eager")
    values.update(overrides)
    return transformers.ModernBertConfig(**values)


def reference(suffix: str, **overrides):
    torch.manual_seed(0)
    if suffix == "ForQuestionAnswering":  # start and end
        overrides.setdefault("num_labels", 2)
    model = getattr(transformers, "ModernBert" + suffix)(modernbert_config(**overrides)).eval()
    with torch.no_grad():  # every weight off its initial value (the norms' ones, the decoder's zero bias)
        for name, tensor in model.state_dict().items():
            if tensor.is_floating_point() and not name.endswith("inv_freq"):
                tensor.add_(torch.randn_like(tensor) * 0.1)
    return model


def padded_batch():
    """[CLS] tokens [SEP] then padding on the right; the longest rows (17) exceed the window (6) several times."""
    torch.manual_seed(1)
    lengths = [17, 9, 17, 3, 12]
    ids = torch.full((len(lengths), max(lengths)), PAD)
    mask = torch.zeros_like(ids)
    for row, n in enumerate(lengths):
        ids[row, :n] = torch.randint(3, VOCAB, (n,))
        ids[row, 0], ids[row, n - 1] = CLS, SEP
        mask[row, :n] = 1
    return ids, mask


def reference_output(model, suffix: str, ids, mask) -> torch.Tensor:
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask)
    if suffix == "Model":
        return out.last_hidden_state
    if suffix == "ForQuestionAnswering":
        return torch.stack([out.start_logits, out.end_logits], -1)
    return out.logits


def our_output(model, suffix: str, ids, mask, packed: bool = True) -> torch.Tensor:
    with torch.no_grad():
        out = model(ids, mask, packed=packed)
    return out.last_hidden_state if suffix == "Model" else out.logits


def real(t: torch.Tensor, mask: torch.Tensor, suffix: str) -> torch.Tensor:
    """The values at real tokens (a padded position's output is ours zeros, transformers' its own)."""
    if suffix == "ForSequenceClassification":
        return t
    return t[mask.bool()]


PATTERNS = {
    "every third global": {},
    "every second global, other thetas": dict(global_attn_every_n_layers=2, global_rope_theta=5000.0,
                                              local_rope_theta=300.0),
    "layer types given": dict(layer_types=["sliding_attention", "full_attention", "sliding_attention",
                                           "sliding_attention"]),
}


@pytest.mark.parametrize("suffix", SUFFIXES)
@pytest.mark.parametrize("pattern", list(PATTERNS))
def test_load_matches_transformers_and_saves_back(tmp_path, one_thread, suffix, pattern):
    overrides = dict(PATTERNS[pattern])
    if "global_rope_theta" in overrides:  # the old spelling, as configs on the hub still carry it
        overrides["rope_parameters"] = {"full_attention": {"rope_type": "default",
                                                           "rope_theta": overrides.pop("global_rope_theta")},
                                        "sliding_attention": {"rope_type": "default",
                                                              "rope_theta": overrides.pop("local_rope_theta")}}
    ref = reference(suffix, **overrides)
    ref.save_pretrained(tmp_path / "hf")
    ids, mask = padded_batch()
    expected = reference_output(ref, suffix, ids, mask)

    model = load_model(tmp_path / "hf")
    assert isinstance(model, EncoderModel)
    assert model.config.family == "modernbert"
    for packed in (True, False):
        ours = our_output(model, suffix, ids, mask, packed)
        assert ours.shape == expected.shape
        torch.testing.assert_close(real(ours, mask, suffix), real(expected, mask, suffix), atol=TOL, rtol=0)

    save_model(model, tmp_path / "ours", format="hf")
    saved = json.loads((tmp_path / "ours" / "config.json").read_text())
    assert saved["architectures"] == ["ModernBert" + suffix]
    back = getattr(transformers, "ModernBert" + suffix).from_pretrained(tmp_path / "ours",
                                                                       attn_implementation="eager").eval()
    assert back.config.layer_types == ref.config.layer_types
    assert back.config.rope_parameters == ref.config.rope_parameters
    assert back.config.local_attention == ref.config.local_attention
    ours_keys = set(back.state_dict())
    assert ours_keys == set(ref.state_dict())
    for name, tensor in ref.state_dict().items():
        torch.testing.assert_close(back.state_dict()[name], tensor, atol=0, rtol=0, msg=name)
    torch.testing.assert_close(reference_output(back, suffix, ids, mask), expected, atol=TOL, rtol=0)

    save_model(model, tmp_path / "native")  # bertology's own format round-trips too
    again = load_model(tmp_path / "native")
    torch.testing.assert_close(our_output(again, suffix, ids, mask), our_output(model, suffix, ids, mask),
                               atol=0, rtol=0)


def test_mean_pooling_matches_transformers(tmp_path, one_thread):
    ref = reference("ForSequenceClassification", classifier_pooling="mean")
    ref.save_pretrained(tmp_path / "hf")
    ids, mask = padded_batch()
    model = load_model(tmp_path / "hf")
    assert model.config.classifier_pooling == "mean"
    expected = reference_output(ref, "ForSequenceClassification", ids, mask)
    for packed in (True, False):
        torch.testing.assert_close(our_output(model, "ForSequenceClassification", ids, mask, packed), expected,
                                   atol=TOL, rtol=0)
    save_model(model, tmp_path / "ours", format="hf")
    back = transformers.ModernBertForSequenceClassification.from_pretrained(tmp_path / "ours",
                                                                           attn_implementation="eager").eval()
    assert back.config.classifier_pooling == "mean"
    torch.testing.assert_close(reference_output(back, "ForSequenceClassification", ids, mask), expected,
                               atol=TOL, rtol=0)


def test_masked_positions_give_the_full_logits_there(tmp_path, one_thread):
    ref = reference("ForMaskedLM")
    ref.save_pretrained(tmp_path / "hf")
    ids, mask = padded_batch()
    model = load_model(tmp_path / "hf")
    at = torch.tensor([[0, 3], [1, 8], [4, 11], [2, 16]])
    with torch.no_grad():
        some = model(ids, mask, masked_positions=at).logits
    expected = reference_output(ref, "ForMaskedLM", ids, mask)[at[:, 0], at[:, 1]]
    torch.testing.assert_close(some, expected, atol=TOL, rtol=0)


def write_config(tmp_path, **changes):
    """A saved ModernBertModel whose config.json is then edited (None deletes a key)."""
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


@pytest.mark.parametrize("width", [7, 0, -4])
def test_a_window_that_is_odd_or_not_positive_is_refused(tmp_path, width):
    with pytest.raises(ConfigError, match="local_attention"):
        load_model(write_config(tmp_path, local_attention=width))


def test_a_layer_pattern_unlike_the_depth_is_refused(tmp_path):
    with pytest.raises(ConfigError, match=r"layer_types: 3 entries for 4 layers"):
        load_model(write_config(tmp_path, layer_types=["full_attention", "sliding_attention", "full_attention"]))


def test_an_unknown_layer_type_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="layer_types"):
        load_model(write_config(tmp_path, layer_types=["full_attention", "chunked", "full_attention",
                                                       "full_attention"]))


def test_other_rotary_kinds_and_biases_are_refused(tmp_path):
    with pytest.raises(ConfigError, match="rope_parameters.*rope_type 'linear'"):
        load_model(write_config(tmp_path / "a", rope_parameters={
            "full_attention": {"rope_type": "linear", "rope_theta": 1e4, "factor": 2.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}))
    with pytest.raises(CheckpointError, match="norm_bias"):
        load_model(write_config(tmp_path / "b", norm_bias=True))


def test_old_configs_with_global_attn_every_n_layers_load(tmp_path, one_thread):
    """Configs written before `layer_types` say `global_attn_every_n_layers` and the two thetas by name."""
    directory = write_config(tmp_path, layer_types=None, rope_parameters=None, global_attn_every_n_layers=2,
                             global_rope_theta=2000.0, local_rope_theta=50.0)
    config = load_model(directory).config
    assert config.attention_window == [None, 6, None, 6]
    assert (config.rotary_theta, config.rotary_theta_local) == (2000.0, 50.0)


def test_rotary_settings_on_learned_positions_are_refused():
    with pytest.raises(ConfigError, match="rotary_theta: .*positions are 'learned'"):
        TransformerConfig(positions="learned", rotary_theta=10000.0)
    with pytest.raises(ConfigError, match="rotary_theta_local"):
        TransformerConfig(positions="relative", rotary_theta_local=10.0)
