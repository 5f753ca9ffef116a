"""LoRA in Hugging Face peft's files: an adapter bertology writes loads into transformers with
peft.PeftModel.from_pretrained and gives bertology's logits; one peft writes loads into bertology the same way."""

from __future__ import annotations

import json

import pytest
import torch

import bertology
from bertology.errors import CheckpointError, ConfigError
from bertology.peft import LoRALinear, apply_adapters, apply_lora, load_lora_peft, save_lora_peft
from peft_helpers import batch, train_steps, trainable_names

peft = pytest.importorskip("peft")
transformers = pytest.importorskip("transformers")
TOL = 1e-5


def hf_classifier(directory, seed=0):
    torch.manual_seed(seed)
    config = transformers.BertConfig(vocab_size=60, hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
                                     intermediate_size=40, max_position_embeddings=32, num_labels=3,
                                     hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    transformers.BertForSequenceClassification(config).save_pretrained(directory)
    return directory


def hf_logits(model):
    ids, mask, _ = batch()
    model.eval()
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=mask).logits


def our_logits(model):
    ids, mask, _ = batch()
    model.eval()
    with torch.no_grad():
        return model(ids, mask).logits


def fresh_hf(base_dir):
    return transformers.BertForSequenceClassification.from_pretrained(base_dir).eval()


@pytest.mark.parametrize("targets, layers", [
    (("query", "value"), None),
    (("key", "attn_out", "ffn_in", "ffn_out"), [0, 2]),  # "dense" alone would also match the pooler: full names
])
def test_peft_reads_what_bertology_writes(tmp_path, targets, layers):
    base_dir = hf_classifier(tmp_path / "base")
    model = bertology.load(base_dir).model
    torch.testing.assert_close(our_logits(model), hf_logits(fresh_hf(base_dir)), atol=TOL, rtol=0)
    apply_lora(model, rank=4, alpha=8, dropout=0.1, targets=targets, layers=layers)
    train_steps(model, steps=4)
    config = save_lora_peft(model, tmp_path / "adapter", base_model_name_or_path=str(base_dir))
    written = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert written == config
    assert (config["peft_type"], config["task_type"], config["r"], config["lora_alpha"], config["lora_dropout"],
            config["bias"], config["modules_to_save"]) == ("LORA", "SEQ_CLS", 4, 8.0, 0.1, "none", ["classifier"])
    if layers is None:
        assert config["target_modules"] == ["query", "value"]
    else:
        assert "bert.encoder.layer.0.attention.output.dense" in config["target_modules"]
        assert not any("layer.1." in name for name in config["target_modules"])

    loaded = peft.PeftModel.from_pretrained(fresh_hf(base_dir), tmp_path / "adapter")
    expected = our_logits(model)
    assert not torch.allclose(expected, hf_logits(fresh_hf(base_dir)), atol=1e-3)  # training changed something
    torch.testing.assert_close(hf_logits(loaded), expected, atol=TOL, rtol=0)

    # ... and bertology reads it back: the same model, the same parameters training.
    back = load_lora_peft(base_dir, tmp_path / "adapter")
    assert back.extensions == model.extensions
    assert trainable_names(back) == trainable_names(model)
    torch.testing.assert_close(our_logits(back), expected, atol=1e-6, rtol=0)


def test_bertology_reads_what_peft_writes(tmp_path):
    base_dir = hf_classifier(tmp_path / "base")
    hf = peft.get_peft_model(fresh_hf(base_dir), peft.LoraConfig(
        task_type="SEQ_CLS", r=2, lora_alpha=6, lora_dropout=0.0, target_modules=["query", "key", "intermediate.dense"]))
    torch.manual_seed(3)
    with torch.no_grad():
        for name, parameter in hf.named_parameters():
            if parameter.requires_grad:  # LoRA's A and B, and the classifier peft trains for SEQ_CLS
                parameter.normal_(0, 0.2)
    hf.save_pretrained(tmp_path / "adapter")
    model = load_lora_peft(bertology.load(base_dir), tmp_path / "adapter")
    assert set(model.extensions) == {f"encoder.layers.{i}.{p}" for i in range(3) for p in ("query", "key", "ffn_in")}
    assert all(entry == ("lora", {"rank": 2, "alpha": 6.0, "dropout": 0.0}) for entry in model.extensions.values())
    torch.testing.assert_close(our_logits(model), hf_logits(hf), atol=TOL, rtol=0)


def test_rslora_scaling(tmp_path):
    base_dir = hf_classifier(tmp_path / "base")
    hf = peft.get_peft_model(fresh_hf(base_dir), peft.LoraConfig(
        task_type="SEQ_CLS", r=4, lora_alpha=4, use_rslora=True, target_modules=["value"]))
    with torch.no_grad():
        for name, parameter in hf.named_parameters():
            if "lora_B" in name:
                parameter.normal_(0, 0.2)
    hf.save_pretrained(tmp_path / "adapter")
    model = load_lora_peft(base_dir, tmp_path / "adapter")
    assert model.encoder.layers[0].value.scaling == pytest.approx(4 / 4 ** 0.5)
    torch.testing.assert_close(our_logits(model), hf_logits(hf), atol=TOL, rtol=0)


def test_what_peft_files_cannot_hold(tmp_path):
    model = bertology.load(hf_classifier(tmp_path / "base")).model
    with pytest.raises(ConfigError, match="no LoRA layers"):
        save_lora_peft(model, tmp_path / "a")
    apply_lora(model, rank=2, alpha=2)
    apply_adapters(model, bottleneck=2, layers=[0], sublayers=("ffn",))
    with pytest.raises(ConfigError, match="LoRA layers only; the model also has encoder.layers.0.ffn_adapter"):
        save_lora_peft(model, tmp_path / "a")
    model = bertology.load(tmp_path / "base").model
    apply_lora(model, rank=2, alpha=2, targets=("query",))
    apply_lora(model, rank=4, alpha=2, targets=("value",))
    with pytest.raises(ConfigError, match="one rank, alpha and dropout"):
        save_lora_peft(model, tmp_path / "a")
    assert not (tmp_path / "a").exists()


def test_bad_adapter_directories(tmp_path):
    base_dir = hf_classifier(tmp_path / "base")
    model = bertology.load(base_dir).model
    apply_lora(model, rank=2, alpha=2)
    save_lora_peft(model, tmp_path / "a")
    config_path = tmp_path / "a" / "adapter_config.json"
    config = json.loads(config_path.read_text())
    for change, message in [({"peft_type": "IA3"}, "peft_type 'IA3' is not LORA"),
                            ({"use_dora": True}, "use_dora True is not supported"),
                            ({"bias": "all"}, "bias 'all' is not supported")]:
        config_path.write_text(json.dumps({**config, **change}))
        with pytest.raises(CheckpointError, match=message):
            load_lora_peft(base_dir, tmp_path / "a")
    config_path.unlink()
    with pytest.raises(CheckpointError, match="adapter_config.json: missing"):
        load_lora_peft(base_dir, tmp_path / "a")


def test_lora_weights_are_the_same_tensors_under_peft_names(tmp_path):
    from safetensors.torch import load_file

    base_dir = hf_classifier(tmp_path / "base")
    model = bertology.load(base_dir).model
    apply_lora(model, rank=2, alpha=2)
    save_lora_peft(model, tmp_path / "a")
    stored = load_file(tmp_path / "a" / "adapter_model.safetensors")
    layer: LoRALinear = model.encoder.layers[1].value
    assert torch.equal(stored["base_model.model.bert.encoder.layer.1.attention.self.value.lora_A.weight"], layer.lora_A)
    assert torch.equal(stored["base_model.model.bert.encoder.layer.1.attention.self.value.lora_B.weight"], layer.lora_B)
    assert torch.equal(stored["base_model.model.classifier.weight"], model.heads["classifier"].out.weight)
    assert len(stored) == 3 * 2 * 2 + 2


FAMILIES = {  # transformers classes, extra config, (task_type, target_modules, modules_to_save) bertology writes
    "bert-bare": ("BertConfig", "BertModel", {}, ("FEATURE_EXTRACTION", ["query", "value"], None)),
    "bert-mlm": ("BertConfig", "BertForMaskedLM", {}, (None, ["query", "value"], ["cls"])),
    "roberta-classifier": ("RobertaConfig", "RobertaForSequenceClassification", {"pad_token_id": 1, "num_labels": 3},
                           ("SEQ_CLS", ["query", "value"], ["classifier"])),
    "distilbert-classifier": ("DistilBertConfig", "DistilBertForSequenceClassification", {},
                              ("SEQ_CLS", ["q_lin", "v_lin"], ["classifier", "pre_classifier"])),
    "albert-classifier": ("AlbertConfig", "AlbertForSequenceClassification", {"embedding_size": 16},
                          ("SEQ_CLS", ["query", "value"], ["classifier"])),
    "electra-tokens": ("ElectraConfig", "ElectraForTokenClassification", {"embedding_size": 16, "num_labels": 4},
                       ("TOKEN_CLS", ["query", "value"], ["classifier"])),
    # the query and value updates of one fused Wqkv projection (a window of 4 tokens in layer 1)
    "modernbert-classifier": ("ModernBertConfig", "ModernBertForSequenceClassification",
                              {"local_attention": 4, "global_attn_every_n_layers": 2, "pad_token_id": 0,
                               "bos_token_id": 2, "cls_token_id": 2, "eos_token_id": 3, "sep_token_id": 3},
                              ("SEQ_CLS", ["Wqkv"], ["classifier", "head"])),
    # DeBERTa-v3's settings: LoRA on the shared query projection changes the position-to-content term too
    "deberta-v2-classifier": ("DebertaV2Config", "DebertaV2ForSequenceClassification",
                              {"relative_attention": True, "pos_att_type": ["p2c", "c2p"], "position_buckets": 4,
                               "max_relative_positions": 16, "share_att_key": True, "norm_rel_ebd": "layer_norm",
                               "position_biased_input": False, "type_vocab_size": 0, "num_labels": 3},
                              ("SEQ_CLS", ["query_proj", "value_proj"], ["classifier", "pooler"])),
}


@pytest.mark.parametrize("family", FAMILIES)
def test_families(tmp_path, family):
    config_class, model_class, extra, expected = FAMILIES[family]
    model_class = getattr(transformers, model_class)
    torch.manual_seed(0)
    no_dropout = {} if config_class == "ModernBertConfig" else dict(  # ModernBERT's dropouts default to 0
        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    config = getattr(transformers, config_class)(
        vocab_size=60, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=40,
        max_position_embeddings=40, **no_dropout, **extra)
    model_class(config).save_pretrained(tmp_path / "base")
    model = bertology.load(tmp_path / "base").model
    apply_lora(model, rank=2, alpha=4)
    with torch.no_grad():  # as after training: non-zero updates and changed heads
        for name, parameter in model.named_parameters():
            if parameter.requires_grad:
                parameter.add_(torch.randn_like(parameter) * 0.2)
    config = save_lora_peft(model, tmp_path / "adapter")
    assert (config["task_type"], config["target_modules"], config["modules_to_save"]) == expected
    ids, mask, _ = batch()
    ids[:, 0] = 2
    hf = peft.PeftModel.from_pretrained(model_class.from_pretrained(tmp_path / "base"), tmp_path / "adapter").eval()
    with torch.no_grad():
        ours = model.eval()(ids, mask)
        theirs = hf(input_ids=ids, attention_mask=mask)
        back = load_lora_peft(tmp_path / "base", tmp_path / "adapter")(ids, mask)
    if ours.logits is None:
        torch.testing.assert_close(ours.last_hidden_state * mask[..., None], theirs.last_hidden_state * mask[..., None],
                                   atol=TOL, rtol=0)
        assert torch.equal(back.last_hidden_state, ours.last_hidden_state)
    else:
        real = mask.bool() if ours.logits.dim() == 3 else slice(None)
        torch.testing.assert_close(ours.logits[real], theirs.logits[real], atol=TOL, rtol=0)
        assert torch.equal(back.logits, ours.logits)
