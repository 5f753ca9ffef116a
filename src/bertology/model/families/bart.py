"""BART: transformers' Bart* classes, an encoder-decoder (`Seq2SeqModel`) with post-norm blocks, learned positions
offset by 2 (a table per stack), a LayerNorm after the embeddings (`layernorm_embedding`), one word embedding shared
by both stacks and the language-model head, and biases everywhere. BartForConditionalGeneration adds a
`final_logits_bias` [1, vocab] to the tied logits; BartForSequenceClassification reads the decoder at the last EOS
of the input (dense -> tanh -> out_proj); BartForQuestionAnswering puts `qa_outputs` on every decoder token.

Positions count real tokens, so right-padded batches (BART's convention) give transformers' outputs; with left padding
transformers numbers the padding too and its real tokens' outputs differ from ours. LayerDrop (encoder_layerdrop,
decoder_layerdrop) is refused; decoder heads or feed-forward widths unlike the encoder's are refused."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from bertology.errors import ConfigError
from bertology.model.config import ACTIVATIONS, DECODER_DEFAULTS, TransformerConfig
from bertology.model.convert import CheckpointFamily, ConfigKey, Head, Reshape, Tie, WeightEntry, linear, \
    renamed_keys
from bertology.model.families.bert import QA


def same_as(other: str) -> Any:
    """Read a decoder key that bertology keeps once for both stacks: it must equal the encoder's `other`."""

    def read(value: Any, config_json: Mapping[str, Any]) -> Any:
        if config_json.get(other) is not None and value != config_json[other]:
            key = "decoder_" + other.removeprefix("encoder_")
            raise ConfigError(f"{key}: {value!r} differs from {other} {config_json[other]!r}; bertology's "
                              "encoder-decoders give both stacks the same heads and feed-forward width")
        return value

    return read


def without_layerdrop(key: str) -> Any:
    """Read a stack's depth, refusing LayerDrop (`key`), which skips whole layers at random in training and which
    bertology's stacks do not do: loading such a model would train it differently without a word."""

    def read(value: Any, config_json: Mapping[str, Any]) -> Any:
        if config_json.get(key):
            raise ConfigError(f"{key}: {config_json[key]!r}: bertology does not skip layers at random in training "
                              "(LayerDrop); set it to 0")
        return value

    return read


def read_activation(value: Any, config_json: Mapping[str, Any]) -> Any:
    if value not in ACTIVATIONS:
        raise ConfigError(f"activation_function: unknown activation {value!r}; expected one of "
                          f"{', '.join(ACTIVATIONS)}")
    return value


def read_scale(value: Any, config_json: Mapping[str, Any]) -> float:
    """scale_embedding: the token embeddings are multiplied by sqrt(d_model) when true."""
    if not isinstance(value, bool):
        raise ConfigError(f"scale_embedding: expected true or false, got {value!r}")
    width = config_json.get("d_model")
    if value and not isinstance(width, int):
        raise ConfigError(f"scale_embedding: true needs an integer d_model, got {width!r}")
    return math.sqrt(width) if value else 1.0


def write_scale(value: float, config: TransformerConfig) -> bool:
    if value == 1.0:
        return False
    if math.isclose(value, math.sqrt(config.hidden_size), rel_tol=1e-12):
        return True
    raise ConfigError(f"embedding_scale {value} is neither 1 nor sqrt(hidden_size): BART's scale_embedding cannot "
                      "say it")


def layers(stack: str, count: str, self_parts: Mapping[str, str], cross: bool) -> tuple[WeightEntry, ...]:
    """One stack's layers: our Block slots -> the names in transformers' Bart{Encoder,Decoder}Layer."""
    parts = dict(self_parts)
    if cross:
        parts.update({"cross_query": "encoder_attn.q_proj", "cross_key": "encoder_attn.k_proj",
                      "cross_value": "encoder_attn.v_proj", "cross_out": "encoder_attn.out_proj",
                      "cross_norm": "encoder_attn_layer_norm"})
    return tuple(entry for ours, theirs in parts.items()
                 for entry in linear(f"{stack}.layers.{count}.{ours}", f"{stack}.layers.{count}.{theirs}"))


LAYER_PARTS = {
    "query": "self_attn.q_proj",
    "key": "self_attn.k_proj",
    "value": "self_attn.v_proj",
    "attn_out": "self_attn.out_proj",
    "attn_norm": "self_attn_layer_norm",
    "ffn_in": "fc1",
    "ffn_out": "fc2",
    "ffn_norm": "final_layer_norm",
}


# transformers' BartClassificationHead and T5ClassificationHead, stored alike: dense -> tanh -> out_proj on the
# decoder's state at the input's last EOS (T5's table takes it from here).
EOS_CLASSIFIER = Head("eos_token", "tanh", {"dense": "classification_head.dense",
                                            "out": "classification_head.out_proj"})


def stack(name: str, count: str, cross: bool) -> tuple[WeightEntry, ...]:
    return (*linear(f"{name}.positions", f"{name}.embed_positions", ("weight",)),
            *linear(f"{name}.embedding_norm", f"{name}.layernorm_embedding"),
            WeightEntry(("embeddings.weight",), (f"{name}.embed_tokens.weight",), Tie(check=True)),
            *layers(name, count, LAYER_PARTS, cross))


FAMILY = CheckpointFamily(
    model_type="bart",
    class_stem="Bart",
    prefix="model",
    model="seq2seq",
    config_class=TransformerConfig,
    defaults=DECODER_DEFAULTS,
    config_keys=(
        *renamed_keys({
            "vocab_size": "vocab_size",
            "hidden_size": "d_model",
            "num_heads": "encoder_attention_heads",
            "intermediate_size": "encoder_ffn_dim",
            "max_position_embeddings": "max_position_embeddings",
            "hidden_dropout": "dropout",
            "attention_dropout": "attention_dropout",
            "activation_dropout": "activation_dropout",
            "classifier_dropout": "classifier_dropout",
            "initializer_range": "init_std",
            "pad_token_id": "pad_token_id",
            "bos_token_id": "bos_token_id",
            "eos_token_id": "eos_token_id",
            "decoder_start_token_id": "decoder_start_token_id",
        }),
        ConfigKey("hidden_act", "activation_function", read_activation),
        ConfigKey("num_layers", "encoder_layers", without_layerdrop("encoder_layerdrop")),
        ConfigKey("num_decoder_layers", "decoder_layers", without_layerdrop("decoder_layerdrop")),
        ConfigKey("num_heads", "decoder_attention_heads", same_as("encoder_attention_heads")),
        ConfigKey("intermediate_size", "decoder_ffn_dim", same_as("encoder_ffn_dim")),
        ConfigKey("embedding_scale", "scale_embedding", read_scale, write_scale),
    ),
    weights=(
        *linear("embeddings", "shared", ("weight",)),
        *stack("encoder", "{i}", cross=False),
        *stack("decoder", "{d}", cross=True),
    ),
    heads={
        "lm": Head("tied_lm_bias", weights=(
            WeightEntry(("heads.{name}.bias",), ("final_logits_bias",), Reshape((1, "vocab_size"))),
            WeightEntry(("embeddings.weight",), ("lm_head.weight",), Tie(check=True)),
        )),
        "classifier": EOS_CLASSIFIER,
        "qa": QA,
    },
    architectures={
        "Model": (),
        "ForConditionalGeneration": ("lm",),
        "ForSequenceClassification": ("classifier",),
        "ForQuestionAnswering": ("qa",),
    },
    fixed={"positions": "learned", "position_offset": 2, "norm": "layernorm", "layer_norm_eps": 1e-5,
           "pre_norm": False, "embedding_norm": True, "final_norm": False, "gated_ffn": False, "bias": True,
           "hidden_act": "gelu", "embedding_scale": 1.0, "classifier_dropout": 0.0,
           "shifted_decoder_inputs": True},
    run_defaults=lambda values, run: {"decoder_start_token_id": run.sep_id},  # BART's decoder starts from </s>
)
