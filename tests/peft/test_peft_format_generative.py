"""LoRA on GPT-2, T5 and BART in Hugging Face peft's files: an adapter bertology writes loads into transformers' model
with peft.PeftModel.from_pretrained and gives bertology's logits (1e-5); bertology reads it back as it was. GPT-2's
fused, transposed `c_attn` holds LoRA on any of our query/key/value as one block-structured pair; an adapter peft
trained on `c_attn` reads into bertology exactly too."""

from __future__ import annotations

import json

import pytest
import torch

import bertology
from bertology.errors import CheckpointError, ConfigError
from bertology.peft import apply_lora, load_lora_peft, save_lora_peft
from peft_helpers import trainable_names

peft = pytest.importorskip("peft")
transformers = pytest.importorskip("transformers")
TOL = 1e-5
VOCAB, PAD = 50, 1


pytestmark = pytest.mark.usefixtures("one_thread")


def hf_config(family: str, **extra):
    if family == "gpt2":
        return transformers.GPT2Config(vocab_size=VOCAB, n_positions=32, n_embd=16, n_layer=2, n_head=2, resid_pdrop=0,
                                       embd_pdrop=0, attn_pdrop=0, pad_token_id=PAD, num_labels=3, **extra)
    if family == "t5":
        return transformers.T5Config(vocab_size=VOCAB, d_model=16, d_kv=4, d_ff=24, num_layers=2, num_decoder_layers=2,
                                     num_heads=2, relative_attention_num_buckets=8, dropout_rate=0.0,
                                     decoder_start_token_id=0, pad_token_id=0, **extra)
    return transformers.BartConfig(vocab_size=VOCAB, d_model=16, encoder_layers=2, decoder_layers=2,
                                   encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=24,
                                   decoder_ffn_dim=24, max_position_embeddings=32, dropout=0.0, attention_dropout=0.0,
                                   pad_token_id=PAD, bos_token_id=0, eos_token_id=2, decoder_start_token_id=2,
                                   num_labels=3, **extra)


def saved_base(directory, family: str, architecture: str, **extra):
    torch.manual_seed(0)
    getattr(transformers, architecture)(hf_config(family, **extra)).save_pretrained(directory)
    return directory


def inputs(family: str):
    """A right-padded batch (every row ends with BART's EOS, which its classifier reads)."""
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, VOCAB, (3, 9), generator=g)
    mask = torch.ones_like(ids)
    for row, n in enumerate((9, 6, 4)):
        ids[row, n - 1] = 2
        ids[row, n:] = PAD
        mask[row, n:] = 0
    decoder = torch.randint(3, VOCAB, (3, 5), generator=g)
    return ids, mask, decoder


def logits(model, family: str, decoder_inputs: bool = False):
    """The model's logits on `inputs` (at real tokens); an encoder-decoder's language model reads its own decoder
    inputs, a classifier the input shifted right."""
    ids, mask, decoder = inputs(family)
    args = dict(input_ids=ids, attention_mask=mask)
    if decoder_inputs:
        args["decoder_input_ids"] = decoder
    with torch.no_grad():
        out = model.eval()(**args).logits
    return out * mask[..., None] if out.dim() == 3 and out.shape[1] == ids.shape[1] else out


def perturb_trainable(model, seed: int = 3) -> None:
    """As after training: non-zero LoRA updates and changed heads."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.requires_grad:
                parameter.add_(torch.randn(parameter.shape, generator=g) * 0.3)


CASES = {  # family, transformers class, targets, layers, train_heads, (task_type, target_modules, modules_to_save, r)
    "gpt2-lm-qv": ("gpt2", "GPT2LMHeadModel", ("query", "value"), None, True,
                   ("CAUSAL_LM", ["c_attn"], None, 4)),
    "gpt2-lm-mixed": ("gpt2", "GPT2LMHeadModel", ("query", "key", "value", "ffn_out"), [1], True,
                      ("CAUSAL_LM", ["transformer.h.1.attn.c_attn", "transformer.h.1.mlp.c_proj"], None, 2)),
    "gpt2-classifier": ("gpt2", "GPT2ForSequenceClassification", ("key", "attn_out"), None, True,
                        ("SEQ_CLS", None, ["score"], 2)),
    "t5-lm-cross": ("t5", "T5ForConditionalGeneration", ("query", "value", "cross_key", "ffn_out"), None, True,
                    ("SEQ_2_SEQ_LM", None, None, 2)),
    "t5-gated-lm": ("t5", "T5ForConditionalGeneration", ("ffn_gate", "cross_out"), [1, 2], True,
                    ("SEQ_2_SEQ_LM", ["decoder.block.0.layer.1.EncDecAttention.o",  # the encoder has no cross
                                      "decoder.block.0.layer.2.DenseReluDense.wi_0",
                                      "encoder.block.1.layer.1.DenseReluDense.wi_0"], None, 2)),
    "bart-lm": ("bart", "BartForConditionalGeneration", ("query", "value", "cross_query"), None, False,
                ("SEQ_2_SEQ_LM", None, None, 2)),
    "bart-classifier": ("bart", "BartForSequenceClassification", ("value", "ffn_in"), [0, 3], True,
                        ("SEQ_CLS", None, ["classification_head"], 2)),
}


@pytest.mark.parametrize("case", CASES)
def test_peft_reads_what_bertology_writes(tmp_path, case):
    family, architecture, targets, layers, train_heads, expected = CASES[case]
    extra = {"feed_forward_proj": "gated-gelu"} if "gated" in case else {}
    base_dir = saved_base(tmp_path / "base", family, architecture, **extra)
    model = bertology.load(base_dir).model
    fresh = getattr(transformers, architecture).from_pretrained(base_dir)
    lm = "Conditional" in architecture
    torch.testing.assert_close(logits(model, family, lm), logits(fresh, family, lm), atol=TOL, rtol=0)
    apply_lora(model, rank=2, alpha=5, dropout=0.1, targets=targets, layers=layers, train_heads=train_heads)
    perturb_trainable(model)
    config = save_lora_peft(model, tmp_path / "adapter", base_model_name_or_path=str(base_dir))
    assert json.loads((tmp_path / "adapter" / "adapter_config.json").read_text()) == config
    task_type, target_modules, to_save, r = expected
    assert (config["task_type"], config["modules_to_save"], config["r"]) == (task_type, to_save, r)
    assert config["lora_alpha"] / config["r"] == 2.5  # alpha / r as ours, fused modules included
    assert config["fan_in_fan_out"] == (family == "gpt2")
    if target_modules is not None:
        assert config["target_modules"] == target_modules

    expected_logits = logits(model, family, lm)
    assert not torch.allclose(expected_logits, logits(fresh, family, lm), atol=1e-3)  # the update changed something
    loaded = peft.PeftModel.from_pretrained(getattr(transformers, architecture).from_pretrained(base_dir),
                                            tmp_path / "adapter")
    torch.testing.assert_close(logits(loaded, family, lm), expected_logits, atol=TOL, rtol=0)

    back = load_lora_peft(base_dir, tmp_path / "adapter", train_heads=train_heads)
    assert back.extensions == model.extensions
    assert trainable_names(back) == trainable_names(model)
    torch.testing.assert_close(logits(back, family, lm), expected_logits, atol=1e-6, rtol=0)


def test_the_fused_pair_is_block_structured(tmp_path):
    from safetensors.torch import load_file

    model = bertology.load(saved_base(tmp_path / "base", "gpt2", "GPT2LMHeadModel")).model
    apply_lora(model, rank=3, alpha=3, targets=("query", "value"), layers=[0])
    perturb_trainable(model)
    config = save_lora_peft(model, tmp_path / "a")
    stored = load_file(tmp_path / "a" / "adapter_model.safetensors")
    a = stored["base_model.model.transformer.h.0.attn.c_attn.lora_A.weight"]
    b = stored["base_model.model.transformer.h.0.attn.c_attn.lora_B.weight"]
    query, value = model.decoder.layers[0].query, model.decoder.layers[0].value
    assert (a.shape, b.shape, config["r"], config["lora_alpha"]) == ((6, 16), (48, 6), 6, 6.0)
    assert torch.equal(a, torch.cat([query.lora_A, value.lora_A]))
    assert torch.equal(b[:16, :3], query.lora_B) and torch.equal(b[32:, 3:], value.lora_B)
    assert not b[:16, 3:].any() and not b[16:32].any() and not b[32:, :3].any()  # key's rows and the off blocks
    x = torch.randn(5, 16)  # the fused update is [delta_q; 0; delta_v] exactly
    fused = (x @ a.T @ b.T) * config["lora_alpha"] / config["r"]
    torch.testing.assert_close(fused, torch.cat([x @ query.delta().T, torch.zeros(5, 16), x @ value.delta().T], 1),
                               atol=1e-6, rtol=0)


def test_bertology_reads_an_adapter_peft_trained_on_c_attn(tmp_path):
    base_dir = saved_base(tmp_path / "base", "gpt2", "GPT2LMHeadModel")
    hf = peft.get_peft_model(transformers.GPT2LMHeadModel.from_pretrained(base_dir), peft.LoraConfig(
        task_type="CAUSAL_LM", r=2, lora_alpha=6, target_modules=["c_attn", "c_fc"], fan_in_fan_out=True,
        rank_pattern={"h.1.mlp.c_fc": 3}))
    torch.manual_seed(4)
    with torch.no_grad():
        for parameter in hf.parameters():
            if parameter.requires_grad:
                parameter.normal_(0, 0.3)
    hf.save_pretrained(tmp_path / "adapter")
    model = load_lora_peft(base_dir, tmp_path / "adapter")
    parts = ("query", "key", "value", "ffn_in")
    assert set(model.extensions) == {f"decoder.layers.{i}.{p}" for i in range(2) for p in parts}
    # Each of query/key/value gets peft's whole A and its rows of B: the same update, rank 2 each.
    assert model.extensions["decoder.layers.0.key"] == ("lora", {"rank": 2, "alpha": 6.0, "dropout": 0.0})
    assert model.extensions["decoder.layers.1.ffn_in"] == ("lora", {"rank": 3, "alpha": 6.0, "dropout": 0.0})
    torch.testing.assert_close(logits(model, "gpt2"), logits(hf, "gpt2"), atol=TOL, rtol=0)


def test_what_peft_files_cannot_hold_is_named(tmp_path):
    base_dir = saved_base(tmp_path / "base", "bart", "BartForConditionalGeneration")
    model = bertology.load(base_dir).model
    apply_lora(model, rank=2, alpha=2, targets=("query",))  # the language-model head trains: its final_logits_bias
    with pytest.raises(ConfigError, match="heads.lm.bias is transformers' 'final_logits_bias', which is not a "
                                          "module's parameter.*train_heads=False"):
        save_lora_peft(model, tmp_path / "a")
    model = bertology.load(saved_base(tmp_path / "gpt2", "gpt2", "GPT2LMHeadModel")).model
    apply_lora(model, rank=2, alpha=2, targets=("query",), also_train=("decoder.layers.0.key.",))
    with pytest.raises(ConfigError, match="decoder.layers.0.key.bias is transformers' 'transformer.h.0.attn.c_attn"
                                          ".bias', which is not a module's parameter"):
        save_lora_peft(model, tmp_path / "a")
    assert not (tmp_path / "a").exists()
    with pytest.raises(ConfigError, match="this model's \\(chosen\\) blocks have no projection 'cross_query'"):
        apply_lora(bertology.load(tmp_path / "gpt2").model, targets=("cross_query",))


def test_a_bad_record_of_a_fused_pair_is_named(tmp_path):
    from safetensors.torch import load_file, save_file

    base_dir = saved_base(tmp_path / "base", "gpt2", "GPT2LMHeadModel")
    model = bertology.load(base_dir).model
    apply_lora(model, rank=2, alpha=2, targets=("query", "value"), layers=[0])
    save_lora_peft(model, tmp_path / "a")
    weights = tmp_path / "a" / "adapter_model.safetensors"
    record = {"transformer.h.0.attn.c_attn": [["decoder.layers.0.query", 3]]}
    save_file(load_file(weights), weights, metadata={"format": "pt", "bertology.fused_lora": json.dumps(record)})
    with pytest.raises(CheckpointError, match="the record of fused module transformer.h.0.attn.c_attn"):
        load_lora_peft(base_dir, tmp_path / "a")


def test_folded_lora_saves_in_transformers_layout(tmp_path):
    from bertology.model import save_model
    from bertology.peft import fold_lora

    base_dir = saved_base(tmp_path / "base", "gpt2", "GPT2LMHeadModel")
    model = bertology.load(base_dir).model
    apply_lora(model, rank=2, alpha=4, targets=("query", "value", "ffn_out"))
    perturb_trainable(model)
    expected = logits(model, "gpt2")
    save_model(fold_lora(model), tmp_path / "folded")  # c_attn holds the folded query and value again
    hf = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "folded")
    torch.testing.assert_close(logits(hf, "gpt2"), expected, atol=TOL, rtol=0)


def test_a_model_transformers_has_no_class_for_is_named(tmp_path):
    from bertology.model import HeadSpec
    from bertology.model.encoder import EncoderModel
    from bertology.peft import peft_architecture

    seq2seq = bertology.load(saved_base(tmp_path / "base", "bart", "BartModel")).model
    assert peft_architecture(seq2seq) == "BartModel"
    encoder = EncoderModel(seq2seq.config, [HeadSpec("token_classifier", "token", num_labels=3)])
    assert peft_architecture(encoder) is None  # BART's encoder with a token classifier: no transformers class
    apply_lora(encoder, rank=2, alpha=2, targets=("query",))
    with pytest.raises(ConfigError, match="transformers has no class for this EncoderModel with heads "
                                          "\\['token_classifier'\\]"):
        save_lora_peft(encoder, tmp_path / "a")
