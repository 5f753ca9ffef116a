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


@pytest.mark.parametrize("activation", ["gelu", "relu", "gelu_new"])
def test_unscaled_embeddings_and_final_logits_bias(tmp_path, activation):
    theirs = reference("ForConditionalGeneration", scale_embedding=False, activation_function=activation)
    theirs.save_pretrained(tmp_path / "hf")
    ours = load_model(tmp_path / "hf")
    assert ours.config.embedding_scale == 1.0 and ours.config.hidden_act == activation
    assert torch.equal(ours.heads["lm"].bias, theirs.final_logits_bias[0])
    assert ours.heads["lm"].bias.abs().max() > 0
    batch = padded_batch()
    assert_close_on_real_tokens(our_outputs(ours, "ForConditionalGeneration", batch),
                                reference_outputs(theirs, "ForConditionalGeneration", batch), batch[3])
    save_model(ours, tmp_path / "ours", format="hf")
    assert json.loads((tmp_path / "ours" / "config.json").read_text())["scale_embedding"] is False


def test_activation_dropout_is_read_applied_in_training_and_written(tmp_path):
    theirs = reference("Model", dropout=0.0, attention_dropout=0.0, activation_dropout=0.5)
    theirs.save_pretrained(tmp_path / "hf")
    ours = load_model(tmp_path / "hf")
    assert ours.config.activation_dropout == 0.5 and ours.config.hidden_dropout == 0.0
    batch = padded_batch()
    assert_close_on_real_tokens(our_outputs(ours, "Model", batch), reference_outputs(theirs, "Model", batch),
                                batch[3])
    evaluated = our_outputs(ours, "Model", batch)["encoder"]
    torch.manual_seed(0)
    trained = our_outputs(ours.train(), "Model", batch)["encoder"]
    assert not torch.allclose(trained, evaluated)  # the only dropout left is the one after the activation
    save_model(ours.eval(), tmp_path / "ours", format="hf")
    assert json.loads((tmp_path / "ours" / "config.json").read_text())["activation_dropout"] == 0.5


def test_native_format_rebuilds_a_bart_model(tmp_path):
    reference("ForSequenceClassification").save_pretrained(tmp_path / "hf")
    ours = load_model(tmp_path / "hf")
    save_model(ours, tmp_path / "native", format="native")
    again = load_model(tmp_path / "native")
    batch = padded_batch()
    assert type(again) is Seq2SeqModel and again.config == ours.config
    assert torch.equal(our_outputs(again, "ForSequenceClassification", batch)["logits"],
                       our_outputs(ours, "ForSequenceClassification", batch)["logits"])


def rewrite_config(tmp_path, **changes):
    reference("Model").save_pretrained(tmp_path)
    path = tmp_path / "config.json"
    data = json.loads(path.read_text())
    data.update(changes)
    path.write_text(json.dumps(data))
    return path


@pytest.mark.parametrize("key,value,encoder_key", [("decoder_attention_heads", 2, "encoder_attention_heads"),
                                                   ("decoder_ffn_dim", 64, "encoder_ffn_dim")])
def test_decoder_shape_unlike_the_encoders_names_the_file_and_key(tmp_path, key, value, encoder_key):
    path = rewrite_config(tmp_path, **{key: value})
    with pytest.raises(ConfigError, match=rf"{path}: {key}: {value} differs from {encoder_key}"):
        load_model(tmp_path)


@pytest.mark.parametrize("changes,match", [
    ({"scale_embedding": "yes"}, r"scale_embedding: expected true or false, got 'yes'"),
    ({"pruned_heads": {"0": [1]}}, r"pruned_heads: bart models cannot have pruned heads"),
    ({"decoder_layers": 0}, r"num_decoder_layers must be positive"),
    ({"activation_function": "quick_gelu"}, r"activation_function: unknown activation 'quick_gelu'"),
    ({"encoder_layerdrop": 0.1}, r"encoder_layerdrop: 0.1: bertology does not skip layers at random"),
    ({"decoder_layerdrop": 0.2}, r"decoder_layerdrop: 0.2: bertology does not skip layers at random"),
])
def test_config_values_bart_cannot_take_name_the_file_and_key(tmp_path, changes, match):
    path = rewrite_config(tmp_path, **changes)
    with pytest.raises(ConfigError, match=rf"{path}: {match}"):
        load_model(tmp_path)


def test_an_untied_language_model_head_is_refused(tmp_path):
    theirs = reference("ForConditionalGeneration", tie_word_embeddings=False)
    theirs.save_pretrained(tmp_path)
    with pytest.raises(CheckpointError, match=r"lm_head\.weight: differs from embeddings\.weight.*untied"):
        load_model(tmp_path)


def test_an_embedding_scale_bart_cannot_state_is_a_clear_error(tmp_path):
    reference("Model").save_pretrained(tmp_path / "hf")
    ours = load_model(tmp_path / "hf")
    ours.config.embedding_scale = 2.0
    with pytest.raises(ConfigError, match=r"embedding_scale 2.0 is neither 1 nor sqrt\(hidden_size\)"):
        save_model(ours, tmp_path / "ours", format="hf")


def eos_classifier(**config):
    values = dict(vocab_size=VOCAB, hidden_size=16, num_layers=1, num_heads=2, intermediate_size=24,
                  max_position_embeddings=24, pre_norm=False, final_norm=False, eos_token_id=EOS)
    values.update(config)
    model = Seq2SeqModel(TransformerConfig.decoder(**values), [HeadSpec("classifier", "eos_token", 3, "tanh")]).eval()
    model.init_weights(torch.Generator().manual_seed(0))
    return model


def test_eos_classifier_reads_the_last_eos_of_each_row():
    model = eos_classifier()
    ids, mask, decoder_ids, decoder_mask = padded_batch()
    ids[0, 4] = EOS  # an earlier EOS in the first row is not the one read
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask, decoder_input_ids=decoder_ids,
                    decoder_attention_mask=decoder_mask)
        head = model.heads["classifier"]
        last = torch.tensor([11, 6, 11, 2])
        expected = head.out(torch.tanh(head.dense(out.last_hidden_state[torch.arange(4), last])))
    assert out.logits.shape == (4, 3)
    assert torch.allclose(out.logits, expected)


def test_eos_classifier_bad_input_is_a_clear_error():
    model = eos_classifier()
    ids, mask, decoder_ids, decoder_mask = padded_batch()
    no_eos = ids.masked_fill(ids == EOS, 5)
    with pytest.raises(InputError, match=r"rows \[0, 1, 2, 3\] of input_ids have no EOS token \(id 2\)"):
        model(input_ids=no_eos, attention_mask=mask, decoder_input_ids=decoder_ids)
    with pytest.raises(InputError, match=r"input_ids \(4, 12\) and the decoder's \(4, 5\) must have the same shape"):
        model(input_ids=ids, attention_mask=mask, decoder_input_ids=decoder_ids[:, :5])
    memory = model.encode(ids, mask)
    with pytest.raises(InputError, match=r"give input_ids, not only encoder_outputs"):
        model(encoder_outputs=memory, attention_mask=mask, decoder_input_ids=decoder_ids)
    with pytest.raises(ConfigError, match=r"head 'classifier' \(kind eos_token\) .* no eos_token_id"):
        eos_classifier(eos_token_id=None)


@pytest.mark.parametrize("suffix", ["ForConditionalGeneration", "ForSequenceClassification"])
def test_without_decoder_inputs_the_decoder_reads_the_input_shifted_right(tmp_path, suffix):
    theirs = reference(suffix)
    theirs.save_pretrained(tmp_path)
    ours = load_model(tmp_path)
    ids, mask, _, _ = padded_batch()
    with torch.no_grad():
        expected, got = theirs(input_ids=ids, attention_mask=mask).logits, ours(ids, mask).logits
    assert got.shape == expected.shape
    assert (got - expected).abs().max().item() < TOL  # every decoder position: transformers masks none of them
    with pytest.raises(InputError, match="give decoder_input_ids or labels"):
        ours(encoder_outputs=ours.encode(ids, mask), attention_mask=mask)


def test_an_eos_classifier_with_another_activation_is_not_written_as_bart(tmp_path):
    reference("ForSequenceClassification").save_pretrained(tmp_path / "hf")
    ours = load_model(tmp_path / "hf")
    relu = Seq2SeqModel(ours.config, [HeadSpec("classifier", "eos_token", 3, "relu")])
    with pytest.raises(CheckpointError, match=r"head 'classifier' uses 'relu'; transformers' bart 'classifier' uses "
                                              r"'tanh'"):
        save_model(relu, tmp_path / "relu", format="hf")
    save_model(relu, tmp_path / "auto")  # written in bertology's own format instead
    assert (tmp_path / "auto" / "bertology.json").is_file()


def test_checkpoints_storing_the_tied_copies_load_when_they_are_equal(tmp_path):
    from safetensors.torch import load_file, save_file

    theirs = reference("ForConditionalGeneration")
    theirs.save_pretrained(tmp_path)
    path = tmp_path / "model.safetensors"
    weights = load_file(path)
    shared = weights["model.shared.weight"]
    for key in ("model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight", "lm_head.weight"):
        weights[key] = shared.clone()  # as older checkpoints store them
    save_file(weights, path, metadata={"format": "pt"})
    batch = padded_batch()
    assert_close_on_real_tokens(our_outputs(load_model(tmp_path), "ForConditionalGeneration", batch),
                                reference_outputs(theirs, "ForConditionalGeneration", batch), batch[3])
    weights["model.decoder.embed_tokens.weight"] = shared + 1
    save_file(weights, path, metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match=r"model\.decoder\.embed_tokens\.weight: differs from embeddings\.weight"):
        load_model(tmp_path)


def test_labels_give_transformers_loss(tmp_path):
    theirs = reference("ForConditionalGeneration")
    theirs.save_pretrained(tmp_path)
    ours = load_model(tmp_path)
    ids, mask, _, _ = padded_batch()
    labels = ids.masked_fill(mask == 0, -100)
    with torch.no_grad():
        expected = theirs(input_ids=ids, attention_mask=mask, labels=labels)
        got = ours(ids, mask, labels=labels)
    assert (got.logits - expected.logits).abs().max().item() < TOL
    assert got.loss.item() == pytest.approx(expected.loss.item(), abs=TOL)
