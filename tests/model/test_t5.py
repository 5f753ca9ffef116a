"""The t5 checkpoint family: random small T5 models built by transformers (v1.0 ReLU and v1.1 gated-GELU, tied and
untied heads, the encoder alone) load with equal logits and loss on padded batches, save back in transformers'
layout with equal outputs there, and bad configs are clear errors naming the file and the key."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from bertology.errors import CheckpointError, ConfigError
from bertology.model import HeadSpec, Model, Seq2SeqModel, load_model, save_model
from bertology.model.heads import HeadInputs
from bertology.model.encoder import EncoderModel

transformers = pytest.importorskip("transformers")

VOCAB = 40


@pytest.fixture(autouse=True)
def _seeded():
    torch.manual_seed(0)
    torch.set_num_threads(1)


def t5_config(projection: str = "relu", **overrides):
    values = dict(vocab_size=VOCAB, d_model=16, d_kv=4, d_ff=24, num_layers=2, num_decoder_layers=3, num_heads=3,
                  relative_attention_num_buckets=8, relative_attention_max_distance=20, dropout_rate=0.0,
                  feed_forward_proj=projection, decoder_start_token_id=0)
    return transformers.T5Config(**{**values, **overrides})


def batch():
    src = torch.randint(2, VOCAB, (3, 7))
    src_mask = torch.tensor([[1] * 5 + [0, 0], [1] * 7, [1] * 3 + [0] * 4])
    labels = torch.randint(2, VOCAB, (3, 5))
    labels[0, 3:] = -100  # a padded target
    return src, src_mask, labels


def untie(hf) -> None:
    """Give the LM head weights of its own, as v1.1 checkpoints have."""
    hf.lm_head.weight = torch.nn.Parameter(torch.randn_like(hf.shared.weight) * 0.3)


def check_generation_model(hf, ours) -> None:
    src, src_mask, labels = batch()
    with torch.no_grad():
        expected = hf(input_ids=src, attention_mask=src_mask, labels=labels)
        got = ours(src, src_mask, labels=labels)
    torch.testing.assert_close(got.logits, expected.logits, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got.loss, expected.loss, atol=1e-5, rtol=1e-5)
    real = src_mask[..., None].bool()  # padding positions are zeros in ours
    torch.testing.assert_close(got.encoder_last_hidden_state * real, expected.encoder_last_hidden_state * real,
                               atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(("projection", "untied", "scaled"), [
    ("relu", False, True),  # v1.0
    ("gated-gelu", False, True),
    ("relu", True, False),
    ("gated-gelu", True, False),  # v1.1: tie_word_embeddings false, no scaling of the decoder output
    ("gated-gelu", True, True),  # an own lm_head and the scaling
    ("relu", False, False),  # tied without scaling (transformers' T5 with tie_word_embeddings false now)
])
def test_conditional_generation_loads_and_saves_both_ways(tmp_path, projection, untied, scaled):
    hf = transformers.T5ForConditionalGeneration(t5_config(projection, tie_word_embeddings=scaled)).eval()
    if untied:
        untie(hf)
    hf.save_pretrained(tmp_path / "hf")
    ours = load_model(tmp_path / "hf")
    assert isinstance(ours, Seq2SeqModel)
    assert ours.head_specs[0].kind == ("lm" if untied else "tied_lm")
    assert ours.config.gated_ffn is (projection == "gated-gelu")
    assert ours.config.decoder_depth == 3 and len(ours.decoder.layers) == 3 and len(ours.encoder.layers) == 2
    assert ours.config.logit_scale == (16 ** -0.5 if scaled else 1.0)
    assert isinstance(ours, Model)
    check_generation_model(hf, ours)

    save_model(ours, tmp_path / "ours")
    written = load_file(tmp_path / "ours" / "model.safetensors")
    assert ("lm_head.weight" in written) is untied
    assert not any("embed_tokens" in key for key in written)
    assert not any("block.1.layer.0.SelfAttention.relative_attention_bias" in key for key in written)
    config = json.loads((tmp_path / "ours" / "config.json").read_text())
    assert config["architectures"] == ["T5ForConditionalGeneration"]
    assert config["feed_forward_proj"] == projection
    assert config["scale_decoder_outputs"] is scaled and config["tie_word_embeddings"] is scaled
    back = transformers.T5ForConditionalGeneration.from_pretrained(tmp_path / "ours").eval()
    check_generation_model(back, ours)
    assert set(back.state_dict()) == set(hf.state_dict())


def test_base_model_gives_the_decoder_states(tmp_path):
    hf = transformers.T5Model(t5_config("gated-gelu")).eval()
    hf.save_pretrained(tmp_path / "hf")
    ours = load_model(tmp_path / "hf")
    assert isinstance(ours, Seq2SeqModel) and not ours.head_specs
    src, src_mask, labels = batch()
    decoder_ids = labels.clamp(min=0)
    decoder_mask = torch.ones_like(decoder_ids)
    decoder_mask[0, 3:] = 0
    with torch.no_grad():
        expected = hf(input_ids=src, attention_mask=src_mask, decoder_input_ids=decoder_ids,
                      decoder_attention_mask=decoder_mask)
        got = ours(src, src_mask, decoder_ids, decoder_mask)
    real = decoder_mask[..., None].bool()
    torch.testing.assert_close(got.last_hidden_state * real, expected.last_hidden_state * real, atol=1e-5, rtol=1e-5)
    save_model(ours, tmp_path / "ours")
    assert json.loads((tmp_path / "ours" / "config.json").read_text())["architectures"] == ["T5Model"]
    back = transformers.T5Model.from_pretrained(tmp_path / "ours").eval()
    with torch.no_grad():
        again = back(input_ids=src, attention_mask=src_mask, decoder_input_ids=decoder_ids,
                     decoder_attention_mask=decoder_mask)
    torch.testing.assert_close(again.last_hidden_state, expected.last_hidden_state, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("projection", ["relu", "gated-gelu"])
def test_encoder_model_is_an_encoder_stack(tmp_path, projection):
    hf = transformers.T5EncoderModel(t5_config(projection)).eval()
    hf.save_pretrained(tmp_path / "hf")
    ours = load_model(tmp_path / "hf")
    assert isinstance(ours, EncoderModel)
    assert not any(name.startswith("decoder.") for name in ours.state_dict())
    src, src_mask, _ = batch()
    real = src_mask[..., None].bool()
    with torch.no_grad():
        expected = hf(input_ids=src, attention_mask=src_mask).last_hidden_state
        got = ours(src, src_mask).last_hidden_state
        states = ours.layer_states(src, src_mask)
    torch.testing.assert_close(got * real, expected * real, atol=1e-5, rtol=1e-5)
    assert len(states) == 3
    torch.testing.assert_close(states[-1], got)
    assert isinstance(load_model(tmp_path / "hf", heads=()), EncoderModel)  # heads chosen: the class stays
    save_model(ours, tmp_path / "ours")
    config = json.loads((tmp_path / "ours" / "config.json").read_text())
    assert config["architectures"] == ["T5EncoderModel"]
    back = transformers.T5EncoderModel.from_pretrained(tmp_path / "ours").eval()
    with torch.no_grad():
        torch.testing.assert_close(back(input_ids=src, attention_mask=src_mask).last_hidden_state, expected,
                                   atol=1e-5, rtol=1e-5)


def test_native_format_rebuilds_an_encoder_stack(tmp_path):
    hf = transformers.T5EncoderModel(t5_config()).eval()
    hf.save_pretrained(tmp_path / "hf")
    ours = load_model(tmp_path / "hf")
    save_model(ours, tmp_path / "native", format="native")
    again = load_model(tmp_path / "native")
    assert isinstance(again, EncoderModel)
    src, src_mask, _ = batch()
    with torch.no_grad():
        torch.testing.assert_close(again(src, src_mask).last_hidden_state, ours(src, src_mask).last_hidden_state)


def test_tied_copies_of_shared_are_accepted_and_checked(tmp_path):
    hf = transformers.T5ForConditionalGeneration(t5_config()).eval()
    hf.save_pretrained(tmp_path / "hf")
    weights = load_file(tmp_path / "hf" / "model.safetensors")
    # Older checkpoints store every tied copy of shared.weight.
    for key in ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight", "lm_head.weight"):
        weights[key] = weights["shared.weight"].clone()
    save_file(weights, tmp_path / "hf" / "model.safetensors", metadata={"format": "pt"})
    ours = load_model(tmp_path / "hf")
    assert ours.head_specs[0].kind == "tied_lm"
    check_generation_model(hf, ours)

    weights["encoder.embed_tokens.weight"] = weights["shared.weight"] + 1.0
    save_file(weights, tmp_path / "hf" / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match=r"encoder\.embed_tokens\.weight: differs from embeddings\.weight"):
        load_model(tmp_path / "hf")


def test_a_missing_relative_table_is_named(tmp_path):
    transformers.T5ForConditionalGeneration(t5_config()).save_pretrained(tmp_path / "hf")
    weights = load_file(tmp_path / "hf" / "model.safetensors")
    del weights["decoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight"]
    save_file(weights, tmp_path / "hf" / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match=r"missing keys: decoder\.block\.0\.layer\.0\.SelfAttention\."
                                              r"relative_attention_bias\.weight"):
        load_model(tmp_path / "hf")


@pytest.mark.parametrize("projection", ["swiglu-gated", "gated-swiglu", "gated-gelu-new", ""])
def test_an_unknown_feed_forward_projection_names_the_file_and_key(tmp_path, projection):
    transformers.T5ForConditionalGeneration(t5_config()).save_pretrained(tmp_path / "hf")
    path = tmp_path / "hf" / "config.json"
    config = json.loads(path.read_text())
    config["feed_forward_proj"] = projection
    path.write_text(json.dumps(config))
    with pytest.raises(ConfigError, match=r"config\.json: feed_forward_proj: unsupported feed-forward projection"):
        load_model(tmp_path / "hf")


def test_config_keys_and_scaling_are_read_as_transformers_reads_them(tmp_path):
    from bertology.model.convert import config_from_hf

    base = {"model_type": "t5", "d_model": 64, "d_kv": 8, "num_heads": 8, "feed_forward_proj": "gated-gelu"}
    config = config_from_hf(base)
    assert config.logit_scale == 64 ** -0.5 and config.hidden_act == "gelu_new" and config.gated_ffn
    assert (config.norm, config.pre_norm, config.bias, config.attention_scale, config.positions) == \
        ("rmsnorm", True, False, 1.0, "relative")
    assert config.head_dim == 8 and config.decoder_depth == 6 and config.intermediate_size == 2048
    assert config_from_hf({**base, "tie_word_embeddings": False}).logit_scale == 1.0
    assert config_from_hf({**base, "tie_word_embeddings": True, "scale_decoder_outputs": False}).logit_scale == 1.0
    assert config_from_hf({**base, "tie_word_embeddings": False, "scale_decoder_outputs": True}).logit_scale \
        == 64 ** -0.5
    dense = config_from_hf({**base, "feed_forward_proj": "gelu", "dropout_rate": 0.2})
    assert (dense.hidden_act, dense.gated_ffn, dense.hidden_dropout, dense.attention_dropout) == \
        ("gelu", False, 0.2, 0.2)
    with pytest.raises(ConfigError, match=r"cfg\.json: num_heads must be positive"):
        config_from_hf({**base, "num_heads": 0}, "cfg.json")


def test_an_encoder_checkpoint_is_not_a_seq2seq_one_and_back(tmp_path):
    transformers.T5EncoderModel(t5_config()).save_pretrained(tmp_path / "encoder")
    path = tmp_path / "encoder" / "config.json"
    config = json.loads(path.read_text())
    path.write_text(json.dumps({**config, "architectures": ["T5Model"]}))
    with pytest.raises(CheckpointError, match=r"missing keys: decoder\.block\.0\.layer\.0\.SelfAttention\.q\.weight"):
        load_model(tmp_path / "encoder")
    transformers.T5Model(t5_config()).save_pretrained(tmp_path / "full")
    path = tmp_path / "full" / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "architectures": ["T5EncoderModel"]}))
    with pytest.raises(CheckpointError, match=r"unexpected keys: decoder\."):
        load_model(tmp_path / "full")


def test_an_unsupported_architecture_is_named(tmp_path):
    transformers.T5Model(t5_config()).save_pretrained(tmp_path / "hf")
    path = tmp_path / "hf" / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "architectures": ["T5ForTokenClassification"]}))
    with pytest.raises(CheckpointError, match=r"config\.json: architectures: unsupported architecture "
                                              r"'T5ForTokenClassification'; supported: T5Model, "
                                              r"T5ForConditionalGeneration, T5EncoderModel, "
                                              r"T5ForSequenceClassification, T5ForQuestionAnswering"):
        load_model(tmp_path / "hf")


def test_an_encoder_stack_with_a_head_transformers_lacks_is_saved_natively(tmp_path):
    transformers.T5EncoderModel(t5_config()).save_pretrained(tmp_path / "hf")
    ours = load_model(tmp_path / "hf")
    with_head = EncoderModel(ours.config, [HeadSpec("lm", "tied_lm")])
    with_head.load_state_dict(ours.state_dict())
    with pytest.raises(CheckpointError, match=r"no transformers architecture of 't5' has exactly the heads "
                                              r"\('lm',\) on a 'encoder' model"):
        save_model(with_head, tmp_path / "hf-only", format="hf")
    save_model(with_head, tmp_path / "auto")
    assert (tmp_path / "auto" / "bertology.json").is_file()
    assert load_model(tmp_path / "auto").head_specs == with_head.head_specs


def test_a_t5_config_carrying_another_familys_key_is_refused(tmp_path):
    transformers.T5Model(t5_config()).save_pretrained(tmp_path / "hf")
    path = tmp_path / "hf" / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "num_hidden_layers": 2}))
    with pytest.raises(ConfigError, match=r"config\.json: key 'num_hidden_layers' is a bert config key, not a t5 one"):
        load_model(tmp_path / "hf")


def test_generic_transformers_keys_are_no_family_s_own(tmp_path):
    # A BERT config.json carrying PretrainedConfig's generic keys, which the t5 table maps, is no mix of families.
    hf = transformers.BertConfig(vocab_size=VOCAB, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                 intermediate_size=24, eos_token_id=2, decoder_start_token_id=1)
    transformers.BertModel(hf).save_pretrained(tmp_path / "bert")
    path = tmp_path / "bert" / "config.json"
    config = json.loads(path.read_text())
    path.write_text(json.dumps({**config, "eos_token_id": 2, "decoder_start_token_id": 1,
                                "tie_word_embeddings": True}))
    assert load_model(tmp_path / "bert").config.family == "bert"


def test_the_lm_head_kind_has_its_own_weight_and_scales_like_a_tied_one():
    config = load_config()
    config.logit_scale = 0.5
    model = Seq2SeqModel(config, [HeadSpec("lm", "lm")])
    head = model.heads["lm"]
    assert [name for name, _ in head.named_parameters()] == ["weight"] and head.bias is None
    hidden = torch.randn(2, 3, 16)
    inputs = HeadInputs(hidden=hidden, attention_mask=torch.ones(2, 3), word_embeddings=model.embeddings.weight,
                        masked_positions=torch.tensor([[0, 1], [1, 2]]))
    expected = torch.stack([hidden[0, 1], hidden[1, 2]]) @ head.weight.T * 0.5
    torch.testing.assert_close(head(inputs), expected)


def load_config():
    from bertology.model.convert import config_from_hf

    return config_from_hf({"model_type": "t5", "vocab_size": VOCAB, "d_model": 16, "d_kv": 4, "num_heads": 4,
                           "d_ff": 24, "num_layers": 1})


def test_a_table_whose_models_name_an_unknown_architecture_is_refused():
    import dataclasses

    from bertology.model.families.t5 import FAMILY

    with pytest.raises(ConfigError, match=r"checkpoint family 't5': models names architecture suffix "
                                          r"'ForEncoding', which architectures lacks"):
        dataclasses.replace(FAMILY, models={"ForEncoding": "encoder"})
    assert FAMILY.model_for("EncoderModel") == "encoder" and FAMILY.model_for("Model") == "seq2seq"


def test_decoding_step_by_step_with_the_cache_gives_transformers_logits(tmp_path):
    hf = transformers.T5ForConditionalGeneration(t5_config("gated-gelu", tie_word_embeddings=False)).eval()
    untie(hf)
    hf.save_pretrained(tmp_path / "hf")
    ours = load_model(tmp_path / "hf")
    src, src_mask, labels = batch()
    decoder_ids = torch.cat([torch.zeros(3, 1, dtype=torch.long), labels[:, :-1].clamp(min=0)], 1)
    with torch.no_grad():
        expected = hf(input_ids=src, attention_mask=src_mask, decoder_input_ids=decoder_ids).logits
        memory = ours.encode(src, src_mask)
        cache, steps = None, []
        for t in range(decoder_ids.shape[1]):
            step = ours(attention_mask=src_mask, decoder_input_ids=decoder_ids[:, t:t + 1], encoder_outputs=memory,
                        past_key_values=cache, use_cache=True)
            cache = step.past_key_values
            steps.append(step.logits)
    torch.testing.assert_close(torch.cat(steps, 1), expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(("architecture", "projection", "untied"), [
    ("T5ForConditionalGeneration", "relu", False),  # v1.0: the head tied to N(0, 1) embeddings, scaled at its output
    ("T5ForConditionalGeneration", "gated-gelu", True),  # v1.1: the gate's weights, an lm_head of its own
    ("T5EncoderModel", "relu", False),
])
def test_a_fresh_t5_is_initialised_as_transformers_initialises_t5(tmp_path, architecture, projection, untied):
    """Every tensor's standard deviation and mean after init_weights equal those of transformers' own T5 init
    within sampling error: the two sample stds of n values differ by about std / sqrt(n) (each is off by
    std / sqrt(2n)), so 6 / sqrt(n) relative is six standard errors. At this width BERT's N(0, 0.02) is off by
    10 to 50 standard errors in every weight (the query's (d_model * d_kv) ** -0.5 = 0.011, the others'
    fan_in ** -0.5 = 0.044 to 0.0625, the embeddings' 1). An untied lm_head is N(0, 1) in transformers' init, as
    `shared` is (this transformers ties the two whatever the config says, so the checkpoint unties it by hand)."""
    from bertology.model.convert import from_state_dict

    config = t5_config(projection, vocab_size=600, d_model=256, d_kv=32, num_heads=8, d_ff=512, num_layers=1,
                       num_decoder_layers=1, relative_attention_num_buckets=32)
    hf = getattr(transformers, architecture)(config)
    theirs = {key: value.clone() for key, value in hf.state_dict().items()  # less the copies of `shared`
              if "embed_tokens" not in key and key != "lm_head.weight"}
    if untied:
        untie(hf)
        theirs["lm_head.weight"] = theirs["shared.weight"]
    hf.save_pretrained(tmp_path / "hf")
    ours = load_model(tmp_path / "hf")
    assert [spec.kind for spec in ours.head_specs] == (["lm"] if untied else ["tied_lm"] if ours.head_specs else [])
    ours.init_weights(torch.Generator().manual_seed(1))
    mine = from_state_dict(ours)
    assert set(mine) == set(theirs)
    for key, expected in theirs.items():
        got, n = mine[key].double(), expected.numel()
        if key.endswith("layer_norm.weight"):
            assert torch.equal(got, torch.ones_like(got)), key
            continue
        std = expected.double().std().item()
        assert got.std().item() == pytest.approx(std, rel=6 / n ** 0.5), key
        assert abs(got.mean().item()) < 6 * std / n ** 0.5, key
        assert abs(expected.double().mean().item()) < 6 * std / n ** 0.5, key


def test_the_t5_init_draws_from_the_generator_alone_and_other_families_keep_bert_s(tmp_path):
    """The same seed gives the same T5 weights, whatever torch's global generator holds; a BART-shaped
    encoder-decoder (no family init of its own) is still BERT's N(0, initializer_range)."""
    from bertology.model import TransformerConfig

    hf = transformers.T5ForConditionalGeneration(t5_config())
    hf.save_pretrained(tmp_path / "hf")
    first, second = load_model(tmp_path / "hf"), load_model(tmp_path / "hf")
    first.init_weights(torch.Generator().manual_seed(3))
    torch.manual_seed(123)
    second.init_weights(torch.Generator().manual_seed(3))
    for (name, a), b in zip(first.state_dict().items(), second.state_dict().values()):
        assert torch.equal(a, b), name
    assert first.embeddings.weight.std().item() == pytest.approx(1.0, rel=0.2)
    bart = Seq2SeqModel(TransformerConfig.decoder(family="bart", vocab_size=600, hidden_size=64, num_heads=4,
                                                  intermediate_size=128, num_layers=1, initializer_range=0.02),
                        [HeadSpec("lm", "tied_lm")])
    bart.init_weights(torch.Generator().manual_seed(3))
    assert bart.embeddings.weight.std().item() == pytest.approx(0.02, rel=0.05)
    assert bart.encoder.layers[0].query.weight.std().item() == pytest.approx(0.02, rel=0.05)


def _fixed_dropout(x, p=0.5, training=False, inplace=False):
    """A dropout that drops nothing at random: each feature j scaled by 1 + p cos(j), in training mode only, so that
    two models agree in training mode exactly where their dropouts sit at the same places with the same p."""
    if not training or p == 0.0:
        return x
    return x * (1.0 + p * torch.cos(torch.arange(x.shape[-1], dtype=x.dtype)))


@pytest.mark.parametrize("projection", ["relu", "gated-gelu"])
def test_training_mode_dropouts_sit_where_transformers_puts_them(tmp_path, monkeypatch, projection):
    """T5 drops out the embeddings, every sublayer's output, the feed-forward's activation (wi -> act -> dropout
    -> wo; gated: act(wi_0) * wi_1, then dropout) and each stack's output after its final norm, all at
    dropout_rate. Every dropout but the attention probabilities' (off on both sides: their layouts differ) is made
    a fixed feature-wise scaling on both sides; training-mode logits, loss and gradients then equal transformers'."""
    import bertology.model.blocks as blocks
    import bertology.model.stack as stack

    hf = transformers.T5ForConditionalGeneration(t5_config(projection, dropout_rate=0.3))
    hf.save_pretrained(tmp_path / "hf")
    ours = load_model(tmp_path / "hf")
    assert ours.config.activation_dropout == 0.3 and ours.config.hidden_dropout == 0.3
    ours.config.attention_dropout = 0.0
    for module in ours.modules():
        if isinstance(module, blocks.Block):
            module.attention_dropout = 0.0
    for module in hf.modules():
        if isinstance(module, transformers.models.t5.modeling_t5.T5Attention):
            module.dropout = 0.0
    monkeypatch.setattr(torch.nn.functional, "dropout", _fixed_dropout)
    monkeypatch.setattr(blocks, "fast_dropout", _fixed_dropout)
    monkeypatch.setattr(stack, "fast_dropout", _fixed_dropout)
    src, src_mask, labels = batch()
    expected = hf.train()(input_ids=src, attention_mask=src_mask, labels=labels)
    got = ours.train()(src, src_mask, labels=labels)
    torch.testing.assert_close(got.logits, expected.logits, atol=1e-5, rtol=1e-5)
    expected.loss.backward()
    got.loss.backward()
    assert got.loss.item() == pytest.approx(expected.loss.item(), rel=1e-6)
    theirs = dict(hf.named_parameters())
    for ours_name, their_name in (("decoder.layers.0.ffn_out.weight", "decoder.block.0.layer.2.DenseReluDense.wo"),
                                  ("encoder.layers.1.ffn_in.weight", "encoder.block.1.layer.1.DenseReluDense.wi" +
                                   ("_1" if projection == "gated-gelu" else ""))):
        grad = dict(ours.named_parameters())[ours_name].grad
        torch.testing.assert_close(grad, theirs[their_name + ".weight"].grad, atol=1e-6, rtol=1e-5)
    # Without the fixed scaling the dropouts are random: training mode differs from evaluation mode.
    monkeypatch.undo()
    with torch.no_grad():
        assert not torch.allclose(ours.train()(src, src_mask, labels=labels).logits,
                                  ours.eval()(src, src_mask, labels=labels).logits)
    save_model(ours.eval(), tmp_path / "ours")
    assert json.loads((tmp_path / "ours" / "config.json").read_text())["dropout_rate"] == 0.3
    assert set(load_file(tmp_path / "ours" / "model.safetensors")) == set(load_file(tmp_path / "hf" /
                                                                                    "model.safetensors"))
