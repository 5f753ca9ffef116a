"""XLNet: transformers' XLNetModel, XLNetLMHeadModel, XLNetForSequenceClassification, XLNetForTokenClassification
and XLNetForQuestionAnsweringSimple as a `bertology.model.xlnet.XLNetModel`.

Each layer's attention projections are stored as [d_model, heads, head_dim] tensors (`rel_attn.q`, `k`, `v`, `r`
for the relative positions): our nn.Linear weights transposed and reshaped; the output projection `o` is the
attention output's weight reshaped. The language-model head `lm_loss` is tied to the word embeddings with a bias of
its own. Sequence classification reads the last position (`sequence_summary.summary`, tanh, `logits_proj`); only
that summary (summary_type "last" with a projection and tanh) is built."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from bertology.errors import ConfigError
from bertology.model.convert import CheckpointFamily, ConfigKey, Head, Reshape, WeightEntry, linear
from bertology.model.families.bert import QA, TOKEN_CLASSIFIER
from bertology.model.config import ACTIVATIONS
from bertology.model.families.gpt2 import dropout_rate, positive_int, positive_number, token_id
from bertology.model.xlnet import XLNetConfig


def length_or_null(key: str):
    """mem_len and reuse_len: a length >= 0, or null (all positions)."""

    def read(value: Any, config_json: Mapping[str, Any]) -> Any:
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ConfigError(f"{key}: expected a length >= 0 or null, got {value!r}")
        return value

    return read


def known_activation(value: Any, config_json: Mapping[str, Any]) -> Any:
    if value not in ACTIVATIONS:
        raise ConfigError(f"ff_activation: {value!r} is not supported; expected one of {', '.join(ACTIVATIONS)}")
    return value


def one_of(key: str, values: tuple[Any, ...]):
    def read(value: Any, config_json: Mapping[str, Any]) -> Any:
        if value not in values:
            raise ConfigError(f"{key}: expected one of {', '.join(map(repr, values))}, got {value!r}")
        return value

    return read


def an_int(key: str):
    def read(value: Any, config_json: Mapping[str, Any]) -> Any:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{key}: expected an integer, got {value!r}")
        return value

    return read


def head_size(value: Any, config_json: Mapping[str, Any]) -> Any:
    """d_head must be d_model / n_head, as transformers checks."""
    value = positive_int("d_head")(value, config_json)
    width, heads = config_json.get("d_model", 1024), config_json.get("n_head", 16)
    if isinstance(width, int) and isinstance(heads, int) and heads > 0 and value * heads != width:
        raise ConfigError(f"d_head {value} is not d_model / n_head = {width} / {heads}")
    return value


def bool_of(key: str):
    def read(value: Any, config_json: Mapping[str, Any]) -> Any:
        if not isinstance(value, bool):
            raise ConfigError(f"{key}: expected true or false, got {value!r}")
        return value

    return read


CONFIG_KEYS = (
    ConfigKey("vocab_size", "vocab_size", positive_int("vocab_size")),
    ConfigKey("hidden_size", "d_model", positive_int("d_model")),
    ConfigKey("num_layers", "n_layer", positive_int("n_layer")),
    ConfigKey("num_heads", "n_head", positive_int("n_head")),
    ConfigKey("attention_head_size", "d_head", head_size),
    ConfigKey("intermediate_size", "d_inner", positive_int("d_inner")),
    ConfigKey("hidden_act", "ff_activation", known_activation),
    ConfigKey("attn_type", "attn_type", one_of("attn_type", ("bi", "uni"))),
    ConfigKey("bi_data", "bi_data", bool_of("bi_data")),
    ConfigKey("clamp_len", "clamp_len", an_int("clamp_len")),
    ConfigKey("same_length", "same_length", bool_of("same_length")),
    # Absent: transformers' default 512; null: every position (as transformers reads it).
    ConfigKey("mem_len", "mem_len", length_or_null("mem_len"),
              default=lambda config_json: None if "mem_len" in config_json else 512),
    ConfigKey("reuse_len", "reuse_len", length_or_null("reuse_len")),
    ConfigKey("use_mems_eval", "use_mems_eval", bool_of("use_mems_eval")),
    ConfigKey("use_mems_train", "use_mems_train", bool_of("use_mems_train")),
    ConfigKey("layer_norm_eps", "layer_norm_eps", positive_number("layer_norm_eps")),
    ConfigKey("hidden_dropout", "dropout", dropout_rate("dropout")),
    ConfigKey("summary_last_dropout", "summary_last_dropout", dropout_rate("summary_last_dropout")),
    ConfigKey("initializer_range", "initializer_range", positive_number("initializer_range")),
    ConfigKey("pad_token_id", "pad_token_id", token_id("pad_token_id")),
    ConfigKey("bos_token_id", "bos_token_id", token_id("bos_token_id")),
    ConfigKey("eos_token_id", "eos_token_id", token_id("eos_token_id")),
)

LAYER = "layer.{i}"
BLOCK = "layers.{i}"
PROJECTION = Reshape(("hidden_size", "num_heads", "head_dim"), transpose=True)  # [d_model, heads, head_dim]
WEIGHTS = (
    *linear("embeddings", "word_embedding", ("weight",)),
    WeightEntry(("mask_embedding",), ("mask_emb",), Reshape((1, 1, "hidden_size"))),
    *(WeightEntry((f"{BLOCK}.{ours}.weight",), (f"{LAYER}.rel_attn.{theirs}",), PROJECTION)
      for ours, theirs in (("query", "q"), ("key", "k"), ("value", "v"), ("position", "r"))),
    WeightEntry((f"{BLOCK}.attn_out.weight",), (f"{LAYER}.rel_attn.o",),
                Reshape(("hidden_size", "num_heads", "head_dim"))),
    *(WeightEntry((f"{BLOCK}.{ours}",), (f"{LAYER}.rel_attn.{theirs}",))
      for ours, theirs in (("content_bias", "r_w_bias"), ("position_bias", "r_r_bias"),
                           ("segment_bias", "r_s_bias"), ("segment_embeddings", "seg_embed"))),
    *linear(f"{BLOCK}.attn_norm", f"{LAYER}.rel_attn.layer_norm"),
    *linear(f"{BLOCK}.ffn_in", f"{LAYER}.ff.layer_1"),
    *linear(f"{BLOCK}.ffn_out", f"{LAYER}.ff.layer_2"),
    *linear(f"{BLOCK}.ffn_norm", f"{LAYER}.ff.layer_norm"),
)

FAMILY = CheckpointFamily(
    model_type="xlnet",
    class_stem="XLNet",
    prefix="transformer",
    config_keys=CONFIG_KEYS,
    weights=WEIGHTS,
    heads={
        "lm": Head("tied_lm_bias", None, {"tied": "lm_loss"},
                   weights=(WeightEntry(("heads.{name}.bias",), ("lm_loss.bias",)),)),
        "classifier": Head("summary_last", "tanh", {"dense": "sequence_summary.summary", "out": "logits_proj"}),
        "token_classifier": TOKEN_CLASSIFIER,
        "qa": QA,
    },
    architectures={
        "Model": (),
        "LMHeadModel": ("lm",),
        "ForSequenceClassification": ("classifier",),
        "ForTokenClassification": ("token_classifier",),
        "ForQuestionAnsweringSimple": ("qa",),
    },
    model="xlnet",
    config_class=XLNetConfig,
    word_embeddings="embeddings.weight",
    required={"summary_type": "last", "summary_use_proj": True, "summary_activation": "tanh",
              "summary_proj_to_labels": False},
)
