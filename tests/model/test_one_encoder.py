"""The one bidirectional model: the BERT family, ModernBERT and an encoder-decoder's encoder alone (T5EncoderModel)
are one class, `EncoderModel`, whose config says where the embeddings are (`stack_embeddings`), whether it has a
pooler and token types; native directories saved under the former second class's name (`encoder-stack`) load."""

from __future__ import annotations

import json

import pytest
import torch

from bertology.errors import CheckpointError, ConfigError, InputError
from bertology.model import EncoderModel, HeadSpec, Seq2SeqModel, TransformerConfig, load_model, preset, save_model
from bertology.model import protocol as P
from bertology.model.checkpoint import registry as checkpoint_families
from bertology.model.convert import config_from_hf
from bertology.model.longformer import LongformerConfig
from bertology.model.quantize import quantize
from bertology.model.registry import ALIASES, MODELS, model_name, register_model, registered

pytestmark = pytest.mark.usefixtures("one_thread")

TINY = dict(vocab_size=40, hidden_size=16, num_layers=3, num_heads=2, intermediate_size=24, hidden_dropout=0.0,
            attention_dropout=0.0, max_position_embeddings=32)


def modernbert(**overrides) -> TransformerConfig:
    """A tiny ModernBERT: the family's fixed facts (its checkpoint table), windows of 4 in layers 1 and 2."""
    values = {**checkpoint_families()["modernbert"].fixed, "family": "modernbert", **TINY,
              "attention_window": [None, 4, 4],
              "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}
    values.update(overrides)
    return TransformerConfig(**values)


def t5(**overrides) -> TransformerConfig:
    return TransformerConfig.decoder(family="t5", positions="relative", norm="rmsnorm", bias=False,
                                     decoder_start_token_id=0, **{**TINY, **overrides})


def batch():
    generator = torch.Generator().manual_seed(3)
    ids = torch.randint(3, 40, (3, 9), generator=generator)
    mask = torch.ones_like(ids)
    mask[1, 6:] = 0
    mask[2, 3:] = 0
    return ids.masked_fill(mask == 0, 0), mask


def test_bert_modernbert_and_t5s_encoder_are_one_class_with_two_layouts():
    torch.manual_seed(0)
    bert, modern, alone = (EncoderModel(preset("tiny", vocab_size=40)), EncoderModel(modernbert()),
                           Seq2SeqModel.encoder_alone(t5()))
    assert type(bert) is type(modern) is type(alone) is EncoderModel
    assert bert.config.stack_embeddings and not modern.config.stack_embeddings and not alone.config.stack_embeddings
    # BERT's layout: the embeddings in the stack; the other: the model's token table, the stack's positions and norm.
    assert "encoder.embeddings.word.weight" in bert.state_dict() and "embeddings.weight" not in bert.state_dict()
    assert {"embeddings.weight", "encoder.embedding_norm.weight"} <= set(modern.state_dict())
    assert not any(k.startswith("encoder.embeddings.") for k in modern.state_dict())
    assert bert.word_embeddings is bert.encoder.embeddings.word and modern.word_embeddings is modern.embeddings
    assert model_name(bert) == model_name(modern) == model_name(alone) == "encoder"
    # What each declares follows from its config.
    assert {P.ENCODER, P.HEAD_MASK, P.PRUNES_HEADS, P.POOLER, P.TOKEN_TYPES} <= bert.capabilities
    assert not {P.ENCODER, P.HEAD_MASK, P.PRUNES_HEADS, P.POOLER, P.TOKEN_TYPES, P.GLOBAL_TOKENS} & modern.capabilities


def test_the_layout_is_the_familys_unless_the_config_says_otherwise():
    assert TransformerConfig().stack_embeddings is True  # BERT's
    assert TransformerConfig(family="roberta").stack_embeddings is True
    assert TransformerConfig.decoder(family="bart").stack_embeddings is False
    assert TransformerConfig(family="modernbert").stack_embeddings is False
    assert TransformerConfig(stack_embeddings=False).stack_embeddings is False
    assert TransformerConfig.from_dict({**TransformerConfig(family="t5").to_dict(), "stack_embeddings": None}) \
        .stack_embeddings is False  # a dict written before the field: the family's
    with pytest.raises(ConfigError, match=r"stack_embeddings: expected true, false or null, got 'yes'"):
        TransformerConfig(stack_embeddings="yes")
    with pytest.raises(ConfigError, match=r"stack_embeddings: a Longformer's embeddings are its stack's"):
        LongformerConfig(vocab_size=50, num_layers=1, hidden_size=8, num_heads=2, intermediate_size=8,
                         max_position_embeddings=20, attention_window=4, stack_embeddings=False)


def test_a_bert_of_the_other_layout_computes_what_bert_computes():
    """The same BERT shape either way (no token types, positions from 0, no embedding padding row): the two layouts
    give the same outputs from the same weights, packed and padded."""
    torch.manual_seed(0)
    config = preset("tiny", vocab_size=40, type_vocab_size=0, hidden_dropout=0.0, attention_dropout=0.0,
                    pooler=False)
    stacked = EncoderModel(config).eval()
    other = EncoderModel(TransformerConfig(**{**config.to_dict(), "stack_embeddings": False})).eval()
    state = stacked.state_dict()
    renamed = {"encoder.embeddings.word.weight": "embeddings.weight",
               "encoder.embeddings.position.weight": "encoder.positions.weight",
               "encoder.embeddings.norm.weight": "encoder.embedding_norm.weight",
               "encoder.embeddings.norm.bias": "encoder.embedding_norm.bias"}
    other.load_state_dict({renamed.get(k, k): v for k, v in state.items()})
    ids, mask = batch()
    with torch.no_grad():
        for packed in (True, False):
            a = stacked(ids, mask, packed=packed).last_hidden_state
            b = other(ids, mask, packed=packed).last_hidden_state
            torch.testing.assert_close(b[mask.bool()], a[mask.bool()], atol=1e-6, rtol=0)


def test_a_native_directory_of_the_former_encoder_stack_class_loads(tmp_path):
    """bertology.json files written when the second bidirectional class was registered as `encoder-stack` (their
    configs without `stack_embeddings`) load into the one class with the same outputs."""
    torch.manual_seed(0)
    for name, config in (("modernbert", modernbert()), ("t5", t5())):
        model = EncoderModel(config, [HeadSpec("mlm", "masked_lm")]).eval()
        model.init_weights(torch.Generator().manual_seed(1))
        save_model(model, tmp_path / name, format="native")
        metadata = json.loads((tmp_path / name / "bertology.json").read_text())
        assert metadata["model"] == "encoder" and metadata["config"]["stack_embeddings"] is False
        metadata["model"] = "encoder-stack"
        del metadata["config"]["stack_embeddings"]
        (tmp_path / name / "bertology.json").write_text(json.dumps(metadata))
        again = load_model(tmp_path / name)
        assert type(again) is EncoderModel and again.config.stack_embeddings is False
        ids, mask = batch()
        with torch.no_grad():
            torch.testing.assert_close(again(ids, mask).logits, model(ids, mask).logits, atol=0, rtol=0)
    assert registered("encoder-stack") is MODELS["encoder"] and "encoder-stack" not in MODELS


def test_an_alias_is_a_new_name():
    with pytest.raises(ConfigError, match=r"register_model\('encoder'\): alias 'decoder' must be a new name"):
        register_model("encoder", EncoderModel, aliases={"decoder": {}})
    register_model("encoder", EncoderModel, aliases={"encoder-stack": {"family": "modernbert"}})  # again: harmless
    assert ALIASES["encoder-stack"] == ("encoder", {"family": "modernbert"})
    with pytest.raises(CheckpointError, match=r"unknown model 'encoder-stacks'"):
        registered("encoder-stacks")


def test_what_the_model_holding_its_table_refuses_is_named():
    torch.manual_seed(0)
    model = EncoderModel(modernbert()).eval()
    ids, mask = batch()
    with pytest.raises(InputError, match=r"token_type_ids: this model has no token type embeddings"):
        model(ids, mask, torch.ones_like(ids))
    with pytest.raises(InputError, match=r"global_attention_mask: this model's windows have no global tokens"):
        model(ids, mask, global_attention_mask=torch.zeros_like(ids).index_fill_(1, torch.tensor([0]), 1))
    with pytest.raises(InputError, match=r"a sequence of 40 tokens is longer than the model's 32 positions"):
        model(torch.ones(1, 40, dtype=torch.long))
    with pytest.raises(ConfigError, match=r"prune_heads: the heads of a t5 model cannot be pruned"):
        EncoderModel(t5()).prune_heads({0: [1]})
    with pytest.raises(ConfigError, match=r"quantize needs a BERT-family encoder .*; this is a modernbert model"):
        quantize(model)
    assert model.forward_inputs(type("Batch", (), {"input_ids": ids, "attention_mask": mask,
                                                   "token_type_ids": torch.ones_like(ids)})())["token_type_ids"] \
        is None  # a training batch's segments are not its to read


def test_pruned_heads_in_a_config_json_are_read_where_the_familys_model_prunes_them():
    hf = {"model_type": "modernbert", "vocab_size": 40, "hidden_size": 16, "num_hidden_layers": 3,
          "num_attention_heads": 2, "intermediate_size": 24, "layer_types": ["full_attention"] * 3,
          "pruned_heads": {"0": [1]}}
    with pytest.raises(ConfigError, match=r"config.json: attention_window: windows are not supported with .* pruned "
                                          r"heads"):  # ModernBERT's layers all have a window entry (null: global)
        config_from_hf(hf, "config.json")
    assert config_from_hf({**hf, "pruned_heads": {}}, "config.json").pruned_heads == {}
    bert = {"model_type": "bert", "vocab_size": 40, "hidden_size": 16, "num_hidden_layers": 2,
            "num_attention_heads": 2, "intermediate_size": 24, "pruned_heads": {"1": [0]}}
    assert config_from_hf(bert, "config.json").pruned_heads == {1: [0]}


def test_the_last_layer_runs_where_it_is_read_in_either_layout():
    """A BART-like encoder alone (learned positions: the stack may prune its last layer) gives the full forward's
    values where the caller and the masked-LM head read."""
    torch.manual_seed(0)
    config = TransformerConfig.decoder(family="bart", **TINY)
    model = EncoderModel(config, [HeadSpec("mlm", "masked_lm")]).eval()
    ids, mask = batch()
    at = torch.tensor([[0, 4], [1, 2]])
    masked = torch.tensor([[2, 1], [0, 7]])
    with torch.no_grad():
        full = model(ids, mask, masked_positions=masked)
        pruned = model(ids, mask, masked_positions=masked, last_layer_at=at)
    torch.testing.assert_close(pruned.logits, full.logits, atol=1e-6, rtol=0)
    rows, columns = at[:, 0], at[:, 1]
    torch.testing.assert_close(pruned.last_hidden_state[rows, columns], full.last_hidden_state[rows, columns],
                               atol=1e-6, rtol=0)
    assert pruned.last_hidden_state[2, 0].abs().sum() == 0  # not read: not computed
