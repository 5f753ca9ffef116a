"""ModernBERT (Warner et al. 2024): transformers' ModernBert* classes, built as an `EncoderModel` holding its token
table (`stack_embeddings` false: the table is `embeddings`, as an encoder-decoder's) over the shared parts: pre-norm
blocks, LayerNorms and linear layers without biases, a GeGLU feed-forward, rotary positions with one base for the
global layers and another for the windowed ones, every `global_attn_every_n_layers`-th layer global (transformers'
`layer_types`) and the others a window of `local_attention` tokens (a query at i sees the keys
i - local_attention / 2 .. i + local_attention / 2, as transformers' masks and its flash call do), a norm after the
embeddings, none before layer 0's attention, a final norm.

transformers fuses the query, key and value projections (`attn.Wqkv`) and the feed-forward's two input projections
(`mlp.Wi`: its first half is activated, our `ffn_gate`; its second half is the linear branch, our `ffn_in`): both
are split here. The heads: the masked-LM head's dense -> act -> norm and the decoder tied to the word embeddings
with a bias of its own; the classifiers' prediction head (dense -> act -> norm) on the first token or the real
tokens' mean (`classifier_pooling`) or on every token (tagging, QA), then dropout and `classifier`.

Positions count real tokens, so right-padded batches (transformers' convention) give transformers' outputs.
Dropout: `attention_dropout` drops the probabilities and the attention output, as in transformers, and here the
feed-forward's output too (transformers leaves it); the published checkpoints train without dropout."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from bertology.errors import ConfigError
from bertology.model.convert import CheckpointFamily, ConfigKey, Head, Split, Tie, WeightEntry, linear, \
    renamed_keys
from bertology.model.config import DEFAULT_ROTARY_THETA, TransformerConfig

GLOBAL, WINDOWED = "full_attention", "sliding_attention"
# ModernBertConfig's defaults, for keys a config.json leaves out.
DEFAULTS = {
    "vocab_size": 50368, "hidden_size": 768, "intermediate_size": 1152, "num_layers": 22, "num_heads": 12,
    "hidden_act": "gelu", "max_position_embeddings": 8192, "layer_norm_eps": 1e-5, "pad_token_id": 50283,
    "eos_token_id": 50282, "bos_token_id": 50281, "hidden_dropout": 0.0, "attention_dropout": 0.0,
    "embedding_dropout": 0.0, "activation_dropout": 0.0, "classifier_dropout": 0.0, "classifier_pooling": "cls",
    "initializer_range": 0.02,
}
THETAS = {GLOBAL: 160_000.0, WINDOWED: 10_000.0}
OLD_THETA_KEYS = {GLOBAL: "global_rope_theta", WINDOWED: "local_rope_theta"}
# What every ModernBERT is and config.json does not say.
FIXED = {"positions": "rotary", "norm": "layernorm", "pre_norm": True, "embedding_norm": True, "final_norm": True,
         "gated_ffn": True, "bias": False, "norm_bias": False, "first_attention_norm": False, "head_bias": False,
         "embedding_scale": 1.0, "logit_scale": 1.0, "type_vocab_size": 0, "pooler": False,
         "global_projections": False, "stack_embeddings": False}
# Variants bertology does not build: a CheckpointError names the key when config.json says otherwise.
REQUIRED = {"norm_bias": False, "attention_bias": False, "mlp_bias": False, "classifier_bias": False,
            "decoder_bias": True, "classifier_activation": "gelu", "tie_word_embeddings": True}


def read_windows(hf: Mapping[str, Any]) -> list[int | None]:
    """Each layer's window from `layer_types` (or, in older files, every `global_attn_every_n_layers`-th layer
    global) and `local_attention` (the whole width: half of it on each side)."""
    width = hf.get("local_attention", 128)
    if isinstance(width, bool) or not isinstance(width, int) or width <= 0 or width % 2:
        raise ConfigError(f"local_attention: {width!r}: the window must be an even positive number of tokens (half "
                          "of it on each side of the query)")
    layers = hf.get("num_hidden_layers", DEFAULTS["num_layers"])
    types = hf.get("layer_types")
    if types is None:
        every = hf.get("global_attn_every_n_layers", 3)
        if isinstance(every, bool) or not isinstance(every, int) or every <= 0:
            raise ConfigError(f"global_attn_every_n_layers: expected a positive number, got {every!r}")
        types = [WINDOWED if i % every else GLOBAL for i in range(layers)]
    if not isinstance(types, list) or any(t not in (GLOBAL, WINDOWED) for t in types):
        raise ConfigError(f"layer_types: expected a list of {GLOBAL!r} and {WINDOWED!r}, got {types!r}")
    if len(types) != layers:
        raise ConfigError(f"layer_types: {len(types)} entries for {layers} layers (num_hidden_layers)")
    return [width if t == WINDOWED else None for t in types]


def write_layer_types(windows: list[int | None] | None, config: TransformerConfig) -> list[str]:
    windows = windows if windows is not None else [None] * config.num_layers
    return [GLOBAL if w is None else WINDOWED for w in windows]


def write_width(windows: list[int | None] | None, config: TransformerConfig) -> int:
    widths = sorted({w for w in windows or () if w is not None})
    if len(widths) > 1:
        raise ConfigError(f"attention_window: ModernBERT's local_attention is one width for every windowed layer; "
                          f"this config has {widths}")
    return widths[0] if widths else 128


def read_theta(kind: str) -> Any:
    """A rotary base from `rope_parameters` (or, in older files, `global_rope_theta` / `local_rope_theta`)."""

    def read(value: Any, hf: Mapping[str, Any]) -> float:
        if not isinstance(value, Mapping):
            raise ConfigError(f"rope_parameters: expected an object with {GLOBAL!r} and {WINDOWED!r}, got {value!r}")
        params = value.get(kind) or {}
        if params.get("rope_type", "default") != "default":
            raise ConfigError(f"rope_parameters: {kind} has rope_type {params['rope_type']!r}; bertology builds the "
                              "default rotary positions only")
        theta = params.get("rope_theta", hf.get(OLD_THETA_KEYS[kind], THETAS[kind]))
        if isinstance(theta, bool) or not isinstance(theta, (int, float)) or not theta > 0:
            raise ConfigError(f"rope_parameters: {kind} rope_theta must be a positive number, got {theta!r}")
        return float(theta)

    return read


def default_theta(kind: str) -> Any:
    return lambda hf: float(hf.get(OLD_THETA_KEYS[kind], THETAS[kind]))


def write_thetas(value: Any, config: TransformerConfig) -> dict[str, dict[str, Any]]:
    theta = config.rotary_theta if config.rotary_theta is not None else DEFAULT_ROTARY_THETA
    local = config.rotary_theta_local if config.rotary_theta_local is not None else theta
    return {WINDOWED: {"rope_type": "default", "rope_theta": local},
            GLOBAL: {"rope_type": "default", "rope_theta": theta}}


def keep(value: Any, config: Any) -> None:
    """A second field read from one key: written by the first."""
    return None


KEYS = {
    "vocab_size": "vocab_size",
    "hidden_size": "hidden_size",
    "num_layers": "num_hidden_layers",
    "num_heads": "num_attention_heads",
    "intermediate_size": "intermediate_size",
    "hidden_act": "hidden_activation",
    "max_position_embeddings": "max_position_embeddings",
    "layer_norm_eps": "norm_eps",
    "pad_token_id": "pad_token_id",
    "bos_token_id": "bos_token_id",
    "eos_token_id": "eos_token_id",
    "attention_dropout": "attention_dropout",
    "embedding_dropout": "embedding_dropout",
    "activation_dropout": "mlp_dropout",
    "classifier_dropout": "classifier_dropout",
    "classifier_pooling": "classifier_pooling",
    "initializer_range": "initializer_range",
}
CONFIG_KEYS = (
    *renamed_keys(KEYS),
    ConfigKey("hidden_dropout", "attention_dropout", write=keep),
    ConfigKey("rotary_theta", "rope_parameters", read_theta(GLOBAL), write_thetas, default=default_theta(GLOBAL)),
    ConfigKey("rotary_theta_local", "rope_parameters", read_theta(WINDOWED), keep, default=default_theta(WINDOWED)),
    ConfigKey("attention_window", "layer_types", lambda v, hf: read_windows(hf), write_layer_types,
              default=read_windows),
    ConfigKey("attention_window", "local_attention", lambda v, hf: read_windows(hf), write_width,
              default=read_windows),
)

LAYER = "layers.{i}"
OURS = "encoder.layers.{i}"
WEIGHTS = (
    *linear("embeddings", "embeddings.tok_embeddings", ("weight",)),
    *linear("encoder.embedding_norm", "embeddings.norm", ("weight",)),
    WeightEntry((f"{OURS}.attn_norm.weight",), (f"{LAYER}.attn_norm.weight",), first=1),
    WeightEntry(tuple(f"{OURS}.{p}.weight" for p in ("query", "key", "value")), (f"{LAYER}.attn.Wqkv.weight",),
                Split(0)),
    WeightEntry((f"{OURS}.attn_out.weight",), (f"{LAYER}.attn.Wo.weight",)),
    WeightEntry((f"{OURS}.ffn_norm.weight",), (f"{LAYER}.mlp_norm.weight",)),
    WeightEntry((f"{OURS}.ffn_gate.weight", f"{OURS}.ffn_in.weight"), (f"{LAYER}.mlp.Wi.weight",), Split(0)),
    WeightEntry((f"{OURS}.ffn_out.weight",), (f"{LAYER}.mlp.Wo.weight",)),
    *linear("encoder.final_norm", "final_norm", ("weight",)),
)


def prediction(kind: str) -> Head:
    """A classifier over the prediction head (`head.dense`, `head.norm`) with its output layer `classifier`."""
    return Head(kind, "gelu", {"dense": "head.dense", "norm": "head.norm", "out": "classifier"},
                unbiased=("dense", "norm"))


def run_defaults(values: Mapping[str, Any], run: Any) -> dict[str, Any]:
    """A ModernBERT pretrained from scratch: its begin and end ids are the tokenizer's opening and closing tokens."""
    return {"bos_token_id": run.cls_id, "eos_token_id": run.sep_id}


FAMILY = CheckpointFamily(
    model_type="modernbert",
    class_stem="ModernBert",
    prefix="model",
    config_keys=CONFIG_KEYS,
    weights=WEIGHTS,
    heads={
        "mlm": Head("masked_lm", "gelu", {"dense": "head.dense", "norm": "head.norm", "bias": "decoder.bias"},
                    unbiased=("dense", "norm"),
                    weights=(WeightEntry(("embeddings.weight",), ("decoder.weight",), Tie(check=True)),)),
        "classifier": prediction("prediction_pooled"),
        "token_classifier": prediction("prediction_token"),
        "qa": prediction("prediction_token"),
    },
    architectures={
        "Model": (),
        "ForMaskedLM": ("mlm",),
        "ForSequenceClassification": ("classifier",),
        "ForTokenClassification": ("token_classifier",),
        "ForQuestionAnswering": ("qa",),
    },
    fixed={**DEFAULTS, **FIXED},
    required=REQUIRED,
    model="encoder",
    config_class=TransformerConfig,
    word_embeddings="embeddings.weight",
    run_defaults=run_defaults,
)
