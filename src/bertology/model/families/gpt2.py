"""GPT-2: transformers' GPT2* classes as a `DecoderModel` (pre-norm blocks, learned positions, a final norm, biases
everywhere, the language-model head tied to the token embeddings).

Its Conv1D layers store weights as [in, out], the transpose of nn.Linear's, and the attention's query, key and value
are one fused `attn.c_attn` ([hidden, 3 x hidden]): read with a transposing Split. Sequence classification reads the
last real token through a `score` linear without bias (kind "last_token"); token classification is the shared
`classifier` on every token. The causal-mask buffers older checkpoints carry (`attn.bias`, `attn.masked_bias`) are
not weights and are dropped."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from bertology.errors import ConfigError
from bertology.model.convert import CheckpointFamily, ConfigKey, Head, Split, Transpose, WeightEntry, linear
from bertology.model.config import DECODER_DEFAULTS, TransformerConfig

TRANSPOSE = Transpose()
# transformers' activation names that bertology.model.heads.activation builds.
ACTIVATIONS = ("gelu_new", "gelu", "gelu_pytorch_tanh", "gelu_fast", "relu", "silu", "swish", "tanh")


def positive_int(key: str) -> Callable[[Any, Mapping[str, Any]], Any]:
    """A read that accepts a positive integer only, naming the config.json key otherwise."""

    def read(value: Any, config_json: Mapping[str, Any]) -> Any:
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ConfigError(f"{key}: expected a positive integer, got {value!r}")
        return value

    return read


def heads_dividing_width(value: Any, config_json: Mapping[str, Any]) -> Any:
    """n_head must divide n_embd: every head is n_embd / n_head wide."""
    value = positive_int("n_head")(value, config_json)
    width = config_json.get("n_embd", 768)
    if isinstance(width, int) and width % value:
        raise ConfigError(f"n_embd {width} is not divisible by n_head {value}")
    return value


def known_activation(value: Any, config_json: Mapping[str, Any]) -> Any:
    if value not in ACTIVATIONS:
        raise ConfigError(f"activation_function: {value!r} is not supported; expected one of {', '.join(ACTIVATIONS)}")
    return value


def four_times_width(config_json: Mapping[str, Any]) -> int:
    """GPT2Config's n_inner None: a feed-forward 4 x n_embd wide."""
    width = config_json.get("n_embd", 768)
    return 4 * width if isinstance(width, int) else width


def none_when_four_times(value: Any, config: TransformerConfig) -> Any:
    return None if value == 4 * config.hidden_size else value


def no_pad_when_read_without(value: Any, config: TransformerConfig) -> Any:
    """A config read with `pad_token_id: null` (GPT-2 has no padding token) is written back with null."""
    return None if value == 0 and "pad_token_id" in config.extra and config.extra["pad_token_id"] is None else value


def dropout_rate(key: str) -> Callable[[Any, Mapping[str, Any]], Any]:
    def read(value: Any, config_json: Mapping[str, Any]) -> Any:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
            raise ConfigError(f"{key}: expected a dropout rate in [0, 1), got {value!r}")
        return float(value)

    return read


def positive_number(key: str) -> Callable[[Any, Mapping[str, Any]], Any]:
    def read(value: Any, config_json: Mapping[str, Any]) -> Any:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise ConfigError(f"{key}: expected a positive number, got {value!r}")
        return float(value)

    return read


def token_id(key: str) -> Callable[[Any, Mapping[str, Any]], Any]:
    def read(value: Any, config_json: Mapping[str, Any]) -> Any:
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ConfigError(f"{key}: expected a token id (an integer >= 0) or null, got {value!r}")
        return value

    return read


def hidden_dropout_when_none(value: Any, config: TransformerConfig) -> Any:
    """embd_pdrop is a number in transformers' config; bertology's None means the hidden dropout."""
    return config.hidden_dropout if value is None else value


CONFIG_KEYS = (
    ConfigKey("vocab_size", "vocab_size", positive_int("vocab_size")),
    ConfigKey("hidden_size", "n_embd", positive_int("n_embd")),
    ConfigKey("num_layers", "n_layer", positive_int("n_layer")),
    ConfigKey("num_heads", "n_head", heads_dividing_width),
    ConfigKey("intermediate_size", "n_inner", positive_int("n_inner"), none_when_four_times, four_times_width),
    ConfigKey("max_position_embeddings", "n_positions", positive_int("n_positions")),
    ConfigKey("hidden_act", "activation_function", known_activation),
    ConfigKey("layer_norm_eps", "layer_norm_epsilon", positive_number("layer_norm_epsilon")),
    ConfigKey("hidden_dropout", "resid_pdrop", dropout_rate("resid_pdrop")),
    ConfigKey("embedding_dropout", "embd_pdrop", dropout_rate("embd_pdrop"), hidden_dropout_when_none),
    ConfigKey("attention_dropout", "attn_pdrop", dropout_rate("attn_pdrop")),
    # GPT2ForTokenClassification's dropout: classifier_dropout when given, else 0.1 (GPT2Config has no other).
    ConfigKey("classifier_dropout", "classifier_dropout", dropout_rate("classifier_dropout"),
              default=lambda config_json: 0.1),
    ConfigKey("initializer_range", "initializer_range", positive_number("initializer_range")),
    ConfigKey("bos_token_id", "bos_token_id", token_id("bos_token_id")),
    ConfigKey("eos_token_id", "eos_token_id", token_id("eos_token_id")),
    ConfigKey("pad_token_id", "pad_token_id", token_id("pad_token_id"), no_pad_when_read_without),
)

LAYER = "h.{i}"
BLOCK = "decoder.layers.{i}"
WEIGHTS = (
    *linear("embeddings", "wte", ("weight",)),
    *linear("decoder.positions", "wpe", ("weight",)),
    # c_attn: [hidden, 3 x hidden] = [W_q^T | W_k^T | W_v^T]; its bias is [b_q | b_k | b_v].
    WeightEntry((f"{BLOCK}.query.weight", f"{BLOCK}.key.weight", f"{BLOCK}.value.weight"),
                (f"{LAYER}.attn.c_attn.weight",), Split(dim=0, transpose=True)),
    WeightEntry((f"{BLOCK}.query.bias", f"{BLOCK}.key.bias", f"{BLOCK}.value.bias"),
                (f"{LAYER}.attn.c_attn.bias",), Split(dim=0)),
    *linear(f"{BLOCK}.attn_out", f"{LAYER}.attn.c_proj", ("weight",), transform=TRANSPOSE),
    *linear(f"{BLOCK}.attn_out", f"{LAYER}.attn.c_proj", ("bias",)),
    *linear(f"{BLOCK}.attn_norm", f"{LAYER}.ln_1"),
    *linear(f"{BLOCK}.ffn_in", f"{LAYER}.mlp.c_fc", ("weight",), transform=TRANSPOSE),
    *linear(f"{BLOCK}.ffn_in", f"{LAYER}.mlp.c_fc", ("bias",)),
    *linear(f"{BLOCK}.ffn_out", f"{LAYER}.mlp.c_proj", ("weight",), transform=TRANSPOSE),
    *linear(f"{BLOCK}.ffn_out", f"{LAYER}.mlp.c_proj", ("bias",)),
    *linear(f"{BLOCK}.ffn_norm", f"{LAYER}.ln_2"),
    *linear("decoder.final_norm", "ln_f"),
)

FAMILY = CheckpointFamily(
    model_type="gpt2",
    class_stem="GPT2",
    prefix="transformer",
    config_keys=CONFIG_KEYS,
    weights=WEIGHTS,
    heads={
        "lm": Head("tied_lm", None, {"tied": "lm_head"}),
        "classifier": Head("last_token", None, {"out": "score"}, bias=False),
        "token_classifier": Head("token", None, {"out": "classifier"}),
        "qa": Head("token", None, {"out": "qa_outputs"}),
    },
    architectures={
        "Model": (),
        "LMHeadModel": ("lm",),
        "ForSequenceClassification": ("classifier",),
        "ForTokenClassification": ("token_classifier",),
        "ForQuestionAnswering": ("qa",),
    },
    fixed={"positions": "learned", "norm": "layernorm", "pre_norm": True, "final_norm": True, "embedding_norm": False,
           "gated_ffn": False, "bias": True, "attention_head_size": None, "attention_scale": None,
           "embedding_scale": 1.0, "logit_scale": 1.0, "position_offset": 0, "prefix_lm": False},
    model="decoder",
    config_class=TransformerConfig,
    defaults=DECODER_DEFAULTS,
    word_embeddings="embeddings.weight",
    required={"scale_attn_weights": True, "scale_attn_by_inverse_layer_idx": False, "add_cross_attention": False},
    ignored=(".attn.bias", ".attn.masked_bias"),
)
