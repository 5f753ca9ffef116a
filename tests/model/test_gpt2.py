"""The gpt2 checkpoint family: small random GPT-2 models of every supported architecture, built and saved by
transformers, load into a DecoderModel whose hidden states and logits equal transformers' within 1e-5 on padded
batches (right and left padding); saved back by bertology, transformers loads them with the same weights and
outputs. Bad config.json values and odd checkpoints are clear errors naming the file and the key."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

transformers = pytest.importorskip("transformers")

from bertology.errors import CheckpointError, ConfigError  # noqa: E402
from bertology.model import HeadSpec, load_model, save_model  # noqa: E402
from bertology.model.heads import HeadInputs, build_head  # noqa: E402
from bertology.model.transformer import DecoderModel, TransformerConfig  # noqa: E402

TOL = 1e-5
VOCAB, PAD = 61, 1
ARCHITECTURES = ["Model", "LMHeadModel", "ForSequenceClassification", "ForTokenClassification",
                 "ForQuestionAnswering"]
HEADS = {"Model": (), "LMHeadModel": ("lm",), "ForSequenceClassification": ("classifier",),
         "ForTokenClassification": ("token_classifier",), "ForQuestionAnswering": ("qa",)}


@pytest.fixture(autouse=True)
def _seeded():
    torch.manual_seed(0)


def gpt2_config(**overrides):
    values = dict(vocab_size=VOCAB, n_positions=32, n_embd=24, n_layer=2, n_head=3, bos_token_id=0, eos_token_id=0,
                  pad_token_id=PAD, num_labels=3)
    values.update(overrides)
    return transformers.GPT2Config(**values)


def hf_model(suffix: str, **overrides):
    cls = getattr(transformers, f"GPT2{suffix}")
    return cls(gpt2_config(**overrides)).eval()


def saved(tmp_path, suffix: str, **overrides):
    hf = hf_model(suffix, **overrides)
    hf.save_pretrained(tmp_path / "hf")
    return hf, tmp_path / "hf"


def padded_batch(side: str):
    """Four rows of lengths 9, 5, 9, 2, padded with PAD on `side`; the real tokens are never PAD."""
    lengths = [9, 5, 9, 2]
    ids = torch.randint(2, VOCAB, (len(lengths), max(lengths)))
    mask = torch.zeros_like(ids)
    for row, n in enumerate(lengths):
        if side == "right":
            mask[row, :n] = 1
        else:
            mask[row, mask.shape[1] - n:] = 1
    return ids.masked_fill(mask == 0, PAD), mask


def positions(mask):
    """bertology's position ids: real tokens counted from 0 (left padding then starts at 0)."""
    return (mask.cumsum(1) - 1).clamp(min=0)


def hf_outputs(hf, ids, mask):
    """transformers' outputs for the batch, with bertology's positions (equal to its own on right padding)."""
    with torch.no_grad():
        return hf(input_ids=ids, attention_mask=mask, position_ids=positions(mask), output_hidden_states=True)


def assert_real_close(got, expected, mask):
    """Equal at the real tokens (padding positions are not compared)."""
    real = mask.bool()
    torch.testing.assert_close(got[real], expected[real], atol=TOL, rtol=TOL)


@pytest.mark.parametrize("side", ["right", "left"])
@pytest.mark.parametrize("suffix", ARCHITECTURES)
def test_every_architecture_loads_with_transformers_outputs(tmp_path, suffix, side):
    hf, directory = saved(tmp_path, suffix)
    model = load_model(directory)
    assert isinstance(model, DecoderModel)
    assert tuple(spec.name for spec in model.head_specs) == HEADS[suffix]
    assert model.config.family == "gpt2" and model.config.pre_norm and model.config.final_norm
    ids, mask = padded_batch(side)
    expected = hf_outputs(hf, ids, mask)
    with torch.no_grad():
        out = model(ids, mask, output_hidden_states=True)
    if suffix == "Model":
        assert_real_close(out.last_hidden_state, expected.last_hidden_state, mask)
        assert len(out.hidden_states) == len(expected.hidden_states) == 3
        for ours, theirs in zip(out.hidden_states, expected.hidden_states):
            assert_real_close(ours, theirs, mask)
    elif suffix == "ForSequenceClassification":
        assert out.logits.shape == (4, 3)
        torch.testing.assert_close(out.logits, expected.logits, atol=TOL, rtol=TOL)
    elif suffix == "ForQuestionAnswering":  # one [B, L, 2] head: start and end
        assert_real_close(out.logits[..., 0], expected.start_logits, mask)
        assert_real_close(out.logits[..., 1], expected.end_logits, mask)
    else:
        assert_real_close(out.logits, expected.logits, mask)


@pytest.mark.parametrize("suffix", ARCHITECTURES)
def test_saved_back_transformers_loads_the_same_model(tmp_path, suffix):
    hf, directory = saved(tmp_path, suffix)
    save_model(load_model(directory), tmp_path / "back")
    config = json.loads((tmp_path / "back" / "config.json").read_text())
    assert config["model_type"] == "gpt2" and config["architectures"] == [f"GPT2{suffix}"]
    back = getattr(transformers, f"GPT2{suffix}").from_pretrained(tmp_path / "back").eval()
    theirs, ours = hf.state_dict(), back.state_dict()
    assert set(ours) == set(theirs)
    for key, value in theirs.items():
        assert torch.equal(ours[key], value), key
    assert back.config.n_inner is None and back.config.pad_token_id == PAD and back.config.n_head == 3
    ids, mask = padded_batch("right")
    expected, got = hf_outputs(hf, ids, mask), hf_outputs(back, ids, mask)
    key = {"Model": "last_hidden_state", "ForQuestionAnswering": "start_logits"}.get(suffix, "logits")
    assert torch.equal(getattr(got, key), getattr(expected, key))


def test_sequence_classification_reads_the_last_real_token_on_either_side(tmp_path):
    hf, directory = saved(tmp_path, "ForSequenceClassification")
    model = load_model(directory)
    ids, mask = padded_batch("right")
    left = torch.zeros_like(mask)
    for row, n in enumerate(mask.sum(1).tolist()):
        left[row, mask.shape[1] - n:] = 1
    ids[1], mask[1] = ids[1].roll(int(mask.shape[1] - mask[1].sum())), left[1]  # row 1 padded on the left
    ids[3], mask[3] = ids[3].roll(int(mask.shape[1] - mask[3].sum())), left[3]
    ids[0, 6:], mask[0, 6:] = PAD, 0  # row 0: 6 tokens, right padding; row 2: full
    last = [5, 8, 8, 8]  # each row's last real token, by hand
    with torch.no_grad():
        hidden = hf.transformer(input_ids=ids, attention_mask=mask, position_ids=positions(mask)).last_hidden_state
        expected = torch.stack([hidden[row, at] for row, at in enumerate(last)]) @ hf.score.weight.T
        got = model(ids, mask).logits
    torch.testing.assert_close(got, expected, atol=TOL, rtol=TOL)


def test_the_last_token_head_picks_the_last_position_whose_mask_is_one():
    config = TransformerConfig.decoder(vocab_size=10, hidden_size=4, num_layers=1, num_heads=1, intermediate_size=8)
    head = build_head(config, HeadSpec("classifier", "last_token", num_labels=2))
    assert head.out.bias is None
    hidden = torch.randn(4, 5, 4)
    mask = torch.tensor([[1, 1, 1, 0, 0], [0, 0, 1, 1, 1], [1, 1, 1, 1, 1], [0, 0, 0, 0, 0]])
    got = head(HeadInputs(hidden=hidden, attention_mask=mask, word_embeddings=torch.zeros(10, 4)))
    picked = torch.stack([hidden[0, 2], hidden[1, 4], hidden[2, 4], hidden[3, 0]])  # an empty row reads position 0
    torch.testing.assert_close(got, picked @ head.out.weight.T)


def rewrite_config(directory, **changes):
    path = directory / "config.json"
    config = json.loads(path.read_text())
    config.update(changes)
    path.write_text(json.dumps(config))
    return path


def test_config_keys_are_read_and_written_back(tmp_path):
    hf, directory = saved(tmp_path, "LMHeadModel", n_inner=40, embd_pdrop=0.2, resid_pdrop=0.05, attn_pdrop=0.15,
                          activation_function="relu", layer_norm_epsilon=1e-6, initializer_range=0.03,
                          bos_token_id=5, eos_token_id=6, pad_token_id=None)
    config = load_model(directory).config
    assert (config.intermediate_size, config.embedding_dropout, config.hidden_dropout, config.attention_dropout) == \
        (40, 0.2, 0.05, 0.15)
    assert (config.hidden_act, config.layer_norm_eps, config.initializer_range) == ("relu", 1e-6, 0.03)
    assert (config.bos_token_id, config.eos_token_id, config.max_position_embeddings) == (5, 6, 32)
    save_model(load_model(directory), tmp_path / "back")
    written = json.loads((tmp_path / "back" / "config.json").read_text())
    original = json.loads((directory / "config.json").read_text())
    for key in ("n_inner", "embd_pdrop", "resid_pdrop", "attn_pdrop", "activation_function", "layer_norm_epsilon",
                "initializer_range", "bos_token_id", "eos_token_id", "n_embd", "n_layer", "n_head", "n_positions",
                "vocab_size"):
        assert written[key] == original[key], key
    assert written["pad_token_id"] is None  # read without a padding id, written without one


def test_n_inner_null_or_absent_is_four_times_the_width(tmp_path):
    _, directory = saved(tmp_path, "Model")
    assert json.loads((directory / "config.json").read_text())["n_inner"] is None
    assert load_model(directory).config.intermediate_size == 4 * 24
    config = json.loads((directory / "config.json").read_text())
    del config["n_inner"]
    (directory / "config.json").write_text(json.dumps(config))
    assert load_model(directory).config.intermediate_size == 4 * 24


def test_causal_mask_buffers_of_older_checkpoints_are_ignored(tmp_path):
    hf, directory = saved(tmp_path, "LMHeadModel")
    weights = load_file(directory / "model.safetensors")
    for layer in range(2):
        weights[f"transformer.h.{layer}.attn.bias"] = torch.tril(torch.ones(1, 1, 32, 32))
        weights[f"transformer.h.{layer}.attn.masked_bias"] = torch.tensor(-1e4)
    weights["lm_head.weight"] = weights["transformer.wte.weight"].clone()  # a stored copy of the tied weights
    save_file(weights, directory / "model.safetensors", metadata={"format": "pt"})
    model = load_model(directory)
    ids, mask = padded_batch("right")
    assert_real_close(model(ids, mask).logits, hf_outputs(hf, ids, mask).logits, mask)


def test_an_untied_language_model_head_is_refused(tmp_path):
    _, directory = saved(tmp_path, "LMHeadModel")
    weights = load_file(directory / "model.safetensors")
    weights["lm_head.weight"] = torch.randn_like(weights["transformer.wte.weight"])
    save_file(weights, directory / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match=r"lm_head.weight: differs from embeddings.weight"):
        load_model(directory)


def test_missing_and_misshaped_weights_are_named(tmp_path):
    _, directory = saved(tmp_path, "Model")
    weights = load_file(directory / "model.safetensors")
    del weights["h.1.ln_2.weight"]
    weights["h.0.attn.c_attn.weight"] = torch.zeros(24, 60)
    save_file(weights, directory / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(CheckpointError) as error:
        load_model(directory)
    message = str(error.value)
    assert message.startswith(f"{directory}: weights do not fit a gpt2 model")
    assert "missing keys: h.1.ln_2.weight" in message
    assert "h.0.attn.c_attn.weight (split to decoder.layers.0.query.weight" in message and "(24, 60)" in message


@pytest.mark.parametrize("changes, error, message", [
    ({"n_embd": 25}, ConfigError, r"config.json: n_head: n_embd 25 is not divisible by n_head 3"),
    ({"n_layer": "two"}, ConfigError, r"config.json: n_layer: expected a positive integer, got 'two'"),
    ({"n_head": 0}, ConfigError, r"config.json: n_head: expected a positive integer, got 0"),
    ({"n_inner": -4}, ConfigError, r"config.json: n_inner: expected a positive integer, got -4"),
    ({"activation_function": "quick_gelu"}, ConfigError,
     r"config.json: activation_function: 'quick_gelu' is not supported"),
    ({"resid_pdrop": 1.5}, ConfigError, r"config.json: resid_pdrop: expected a dropout rate in \[0, 1\), got 1.5"),
    ({"embd_pdrop": "0.1"}, ConfigError, r"config.json: embd_pdrop: expected a dropout rate in \[0, 1\), got '0.1'"),
    ({"layer_norm_epsilon": 0}, ConfigError, r"config.json: layer_norm_epsilon: expected a positive number, got 0"),
    ({"initializer_range": "x"}, ConfigError, r"config.json: initializer_range: expected a positive number, got 'x'"),
    ({"eos_token_id": -1}, ConfigError, r"config.json: eos_token_id: expected a token id \(an integer >= 0\) or null"),
    ({"pad_token_id": 1.5}, ConfigError, r"config.json: pad_token_id: expected a token id"),
    ({"scale_attn_by_inverse_layer_idx": True}, CheckpointError,
     r"config.json: scale_attn_by_inverse_layer_idx True is not supported"),
    ({"scale_attn_weights": False}, CheckpointError, r"config.json: scale_attn_weights False is not supported"),
    ({"add_cross_attention": True}, CheckpointError, r"config.json: add_cross_attention True is not supported"),
    ({"architectures": ["GPT2DoubleHeadsModel"]}, CheckpointError,
     r"config.json: architectures: unsupported architecture 'GPT2DoubleHeadsModel'"),
    ({"hidden_size": 24}, ConfigError, r"config.json: key 'hidden_size' is a bert config key, not a gpt2 one"),
])
def test_bad_config_is_an_error_naming_the_file_and_key(tmp_path, changes, error, message):
    _, directory = saved(tmp_path, "Model")
    rewrite_config(directory, **changes)
    with pytest.raises(error, match=message):
        load_model(directory)


def test_generic_token_ids_do_not_make_other_families_look_mixed(tmp_path):
    """bos/eos/pad ids are every config's keys: a RoBERTa config.json carrying them still loads beside gpt2."""
    roberta = transformers.RobertaConfig(vocab_size=40, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                         intermediate_size=20, max_position_embeddings=40, pad_token_id=1,
                                         bos_token_id=0, eos_token_id=2)
    transformers.RobertaModel(roberta).save_pretrained(tmp_path / "roberta")
    assert json.loads((tmp_path / "roberta" / "config.json").read_text())["eos_token_id"] == 2
    assert load_model(tmp_path / "roberta").config.family == "roberta"


def test_a_decoder_built_by_bertology_saves_in_transformers_layout(tmp_path):
    """A gpt2-family DecoderModel made from scratch (not read from a checkpoint) is written as GPT-2."""
    config = TransformerConfig.decoder(family="gpt2", vocab_size=VOCAB, hidden_size=24, num_layers=2, num_heads=3,
                               intermediate_size=96, max_position_embeddings=32)
    model = DecoderModel(config, [HeadSpec("lm", "tied_lm")]).eval()
    model.init_weights()
    save_model(model, tmp_path / "ours")
    hf = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "ours").eval()
    ids, mask = padded_batch("right")
    with torch.no_grad():
        assert_real_close(model(ids, mask).logits, hf(input_ids=ids, attention_mask=mask).logits, mask)


def test_load_reads_a_gpt2_directory_with_its_byte_level_tokenizer(tmp_path):
    """bertology.load of a GPT-2 directory (model + transformers' tokenizer files) gives transformers' ids, and the
    model reads them as transformers' model does."""
    from framing_helpers import TEXTS, backend

    import bertology

    fast = transformers.GPT2TokenizerFast(tokenizer_object=backend("gpt2"), bos_token="<|endoftext|>",
                                          eos_token="<|endoftext|>", unk_token="<|endoftext|>")
    fast.save_pretrained(tmp_path / "hf")
    hf, directory = saved(tmp_path, "LMHeadModel", vocab_size=len(fast), bos_token_id=fast.eos_token_id,
                          eos_token_id=fast.eos_token_id, pad_token_id=None)
    pretrained = bertology.load(directory)
    assert pretrained.tokenizer is not None and pretrained.tokenizer.kind == "bpe"
    texts = [*TEXTS[:5], "  Unseen wörds, émoji 🙂 and tabs\tstay byte-level!", "<|endoftext|>the cat"]
    for text in texts:
        assert pretrained.tokenizer.encode(text).ids == fast(text)["input_ids"], text
    ids = torch.tensor([fast(TEXTS[1])["input_ids"]])
    with torch.no_grad():
        torch.testing.assert_close(pretrained.model(ids).logits, hf(input_ids=ids).logits, atol=TOL, rtol=TOL)


@pytest.mark.parametrize("change", [dict(pre_norm=False), dict(embedding_scale=2.0), dict(position_offset=2),
                                    dict(attention_scale=1.0), dict(norm="rmsnorm"), dict(gated_ffn=True)])
def test_a_decoder_gpt2_cannot_express_is_saved_natively(tmp_path, change):
    """A gpt2-family config that differs from GPT-2's fixed facts is not written as a GPT-2 checkpoint (transformers
    would build another model from it): the native format keeps it, and format="hf" says why not."""
    config = TransformerConfig.decoder(family="gpt2", vocab_size=VOCAB, hidden_size=24, num_layers=1, num_heads=3,
                               intermediate_size=48, max_position_embeddings=32, **change)
    model = DecoderModel(config, [HeadSpec("lm", "tied_lm")]).eval()
    save_model(model, tmp_path / "auto")
    assert (tmp_path / "auto" / "bertology.json").is_file() and not (tmp_path / "auto" / "config.json").exists()
    back = load_model(tmp_path / "auto")
    ids, mask = padded_batch("right")
    with torch.no_grad():
        torch.testing.assert_close(back(ids, mask).logits, model(ids, mask).logits, atol=0, rtol=0)
    name = next(iter(change))
    with pytest.raises(CheckpointError, match=rf"cannot be saved in transformers' layout: its {name} is "):
        save_model(model, tmp_path / "hf", format="hf")


def test_decoding_a_loaded_gpt2_with_the_cache_gives_transformers_logits(tmp_path):
    hf, directory = saved(tmp_path, "LMHeadModel")
    model = load_model(directory)
    ids = torch.randint(2, VOCAB, (2, 10))
    with torch.no_grad():
        expected = hf(input_ids=ids).logits
        step = model(ids[:, :4], use_cache=True)
        logits = [step.logits]
        for t in range(4, 10):
            step = model(ids[:, t:t + 1], torch.ones(2, t + 1, dtype=torch.long), past_key_values=step.past_key_values,
                         use_cache=True)
            logits.append(step.logits)
    torch.testing.assert_close(torch.cat(logits, 1), expected, atol=TOL, rtol=TOL)


def test_a_legacy_pytorch_model_bin_with_mask_buffers_loads(tmp_path):
    """Older GPT-2 checkpoints are pytorch_model.bin files of the base model's keys, buffers included."""
    hf, directory = saved(tmp_path, "Model")
    weights = load_file(directory / "model.safetensors")
    weights.update({f"h.{layer}.attn.bias": torch.tril(torch.ones(1, 1, 32, 32)) for layer in range(2)})
    weights.update({f"h.{layer}.attn.masked_bias": torch.tensor(-1e4) for layer in range(2)})
    (directory / "model.safetensors").unlink()
    torch.save(weights, directory / "pytorch_model.bin")
    model = load_model(directory)
    ids, mask = padded_batch("left")
    with torch.no_grad():
        got = model(ids, mask).last_hidden_state
    assert_real_close(got, hf_outputs(hf, ids, mask).last_hidden_state, mask)
