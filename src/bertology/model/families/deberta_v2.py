"""DeBERTa-v2 and v3 (He et al. 2021, 2023): transformers' DebertaV2* classes, an `EncoderModel` over the shared
parts: BERT's post-norm blocks whose scores add the disentangled terms (`bertology.model.disentangled`: a score
provider of the attention context, per-layer projections of one relative-position table), absolute positions only
with `position_biased_input`, token types only when `type_vocab_size` > 0, and the convolution beside the first
layer of the larger v2 checkpoints (`conv_kernel_size`).

The heads: the masked-LM head in either layout transformers reads (`legacy` true, its default and what it writes:
`cls.predictions.*` with a decoder tied to the word embeddings; false: `lm_predictions.lm_head.*`), the sequence
classifier's ContextPooler (dense -> `pooler_hidden_act` on the first token: a `first_token` head with `pooler.dense`
and `classifier`), the token classifier and the QA outputs. Dropout: the classifier's two dropouts both take
`cls_dropout` (transformers drops the pooler's input by `pooler_dropout`, 0 in the published configs)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import Tensor

from bertology.errors import ConfigError
from bertology.model.config import ACTIVATIONS, TransformerConfig
from bertology.model.convert import CheckpointFamily, ConfigKey, Head, layer_linears, linear, renamed_keys
from bertology.model.families import bert

# DebertaV2Config's defaults, for keys a config.json leaves out.
DEFAULTS = {
    "vocab_size": 128100, "hidden_size": 1536, "num_layers": 24, "num_heads": 24, "intermediate_size": 6144,
    "hidden_act": "gelu", "hidden_dropout": 0.1, "attention_dropout": 0.1, "max_position_embeddings": 512,
    "type_vocab_size": 0, "initializer_range": 0.02, "layer_norm_eps": 1e-7, "pad_token_id": 0,
    "relative_attention": False, "max_relative_positions": -1, "position_buckets": -1, "pos_att_type": (),
    "share_att_key": False, "relative_norm": False, "positions": "learned",
}
FIXED = {"pooler": False, "embedding_size": None}

KEYS = {
    **bert.KEYS,
    "classifier_dropout": "cls_dropout",
    "relative_attention": "relative_attention",
    "max_relative_positions": "max_relative_positions",
    "position_buckets": "position_buckets",
    "share_att_key": "share_att_key",
    "conv_kernel_size": "conv_kernel_size",
    "conv_groups": "conv_groups",
    "conv_act": "conv_act",
}


def read_terms(value: Any, hf: Mapping[str, Any]) -> tuple[str, ...]:
    """pos_att_type: a list, or the older "c2p|p2c" string (checked by the config)."""
    if isinstance(value, str):
        return tuple(t.strip() for t in value.lower().split("|") if t.strip())
    if not isinstance(value, (list, tuple)):
        raise ConfigError(f"pos_att_type: expected a list such as [\"p2c\", \"c2p\"], got {value!r}")
    return tuple(value)


def read_norm(value: Any, hf: Mapping[str, Any]) -> bool:
    """norm_rel_ebd: "layer_norm" (normed relative embeddings) or "none"."""
    parts = [p.strip() for p in value.lower().split("|")] if isinstance(value, str) else None
    if parts is None or any(p not in ("layer_norm", "none") for p in parts):
        raise ConfigError(f"norm_rel_ebd: expected \"layer_norm\" or \"none\", got {value!r}")
    return "layer_norm" in parts


def read_embedding_size(value: Any, hf: Mapping[str, Any]) -> None:
    """embedding_size: as wide as the layers (transformers then adds no projection); anything else is refused."""
    hidden = hf.get("hidden_size", DEFAULTS["hidden_size"])
    if value != hidden:
        raise ConfigError(f"embedding_size: {value!r} differs from hidden_size {hidden!r}; bertology builds DeBERTa "
                          "without the projection of narrower embeddings")
    return None


def read_pooler_width(value: Any, hf: Mapping[str, Any]) -> None:
    hidden = hf.get("hidden_size", DEFAULTS["hidden_size"])
    if value != hidden:
        raise ConfigError(f"pooler_hidden_size: {value!r} differs from hidden_size {hidden!r}; the ContextPooler "
                          "is built as wide as the layers")
    return None


def keep(value: Any, config: Any) -> None:
    """A second field read from one key: written by the first."""
    return None


CONFIG_KEYS = (
    *renamed_keys(KEYS),
    ConfigKey("pos_att_type", "pos_att_type", read_terms, lambda v, config: list(v)),
    ConfigKey("relative_norm", "norm_rel_ebd", read_norm, lambda v, config: "layer_norm" if v else "none"),
    ConfigKey("positions", "position_biased_input", lambda v, hf: "learned" if v else "none",
              lambda v, config: v == "learned"),
    ConfigKey("embedding_size", "embedding_size", read_embedding_size, lambda v, config: config.hidden_size),
    ConfigKey("embedding_size", "pooler_hidden_size", read_pooler_width, lambda v, config: config.hidden_size),
)

LAYER_PARTS = {
    "query": "attention.self.query_proj",
    "key": "attention.self.key_proj",
    "value": "attention.self.value_proj",
    "attn_out": "attention.output.dense",
    "attn_norm": "attention.output.LayerNorm",
    "ffn_in": "intermediate.dense",
    "ffn_out": "output.dense",
    "ffn_norm": "output.LayerNorm",
}
LAYER = "encoder.layer.{i}"
OURS = "encoder.layers.{i}"
WEIGHTS = (
    *linear("encoder.embeddings.word", "embeddings.word_embeddings", ("weight",)),
    *linear("encoder.embeddings.position", "embeddings.position_embeddings", ("weight",), when="learned_positions"),
    *linear("encoder.embeddings.token_type", "embeddings.token_type_embeddings", ("weight",), when="type_vocab_size"),
    *linear("encoder.embeddings.norm", "embeddings.LayerNorm"),
    *layer_linears(LAYER, LAYER_PARTS),
    *linear(f"{OURS}.pos_key", f"{LAYER}.attention.self.pos_key_proj", when="relative_key_projection"),
    *linear(f"{OURS}.pos_query", f"{LAYER}.attention.self.pos_query_proj", when="relative_query_projection"),
    *linear("encoder.disentangled.table", "encoder.rel_embeddings", ("weight",), when="relative_attention"),
    *linear("encoder.disentangled.norm", "encoder.LayerNorm", when="relative_norm"),
    *linear("encoder.conv.conv", "encoder.conv.conv", when="conv_kernel_size"),
    *linear("encoder.conv.norm", "encoder.conv.LayerNorm", when="conv_kernel_size"),
)

LEGACY_MLM = Head("masked_lm", None, {"dense": "cls.predictions.transform.dense",
                                      "norm": "cls.predictions.transform.LayerNorm", "bias": "cls.predictions.bias",
                                      "tied": "cls.predictions.decoder"})
MLM = Head("masked_lm", None, {"dense": "lm_predictions.lm_head.dense", "norm": "lm_predictions.lm_head.LayerNorm",
                               "bias": "lm_predictions.lm_head.bias"})


def classifier(act: str) -> Head:
    """The ContextPooler (dense -> act on the first token) and the classifier."""
    return Head("first_token", act, {"dense": "pooler.dense", "out": "classifier"})


HEADS = {
    "mlm": LEGACY_MLM,
    "classifier": classifier("gelu"),
    "token_classifier": bert.TOKEN_CLASSIFIER,
    "qa": bert.QA,
}


def config_heads(config: TransformerConfig) -> dict[str, Head]:
    """The heads as this config's checkpoint stores them: config.json's `legacy` (default true) picks the masked-LM
    layout, its `pooler_hidden_act` (default gelu) the pooler's activation."""
    extra = getattr(config, "extra", {})
    act = extra.get("pooler_hidden_act", "gelu")
    if act not in ACTIVATIONS:
        raise ConfigError(f"pooler_hidden_act: unknown activation {act!r}; expected one of {', '.join(ACTIVATIONS)}")
    legacy = extra.get("legacy", True)
    return {**HEADS, "mlm": LEGACY_MLM if legacy is not False else MLM, "classifier": classifier(act)}


def check_checkpoint(config: TransformerConfig, weights: Mapping[str, Tensor], source: str) -> None:
    """The pooler's activation is one bertology has; the stored relative-position table has the 2 x span rows
    config.json's buckets (or distances) make."""
    try:
        config_heads(config)
    except ConfigError as error:
        raise ConfigError(f"{source}: {error}") from None
    if not config.relative_attention:
        return
    for key in ("encoder.rel_embeddings.weight", "deberta.encoder.rel_embeddings.weight"):
        if key in weights and weights[key].shape[0] != 2 * config.relative_span:
            named = ("position_buckets" if config.position_buckets > 0
                     else "max_relative_positions" if config.max_relative_positions > 0 else "max_position_embeddings")
            raise ConfigError(f"{source}: {named}: position_buckets {config.position_buckets} and "
                              f"max_relative_positions {config.max_relative_positions} make a relative-position table "
                              f"of {2 * config.relative_span} rows; the weights store {key} with "
                              f"{weights[key].shape[0]}")


def run_defaults(values: Mapping[str, Any], run: Any) -> dict[str, Any]:
    """A DeBERTa pretrained from scratch is a v3 unless the settings say otherwise: both terms over 256 log buckets a
    side up to the positions' count, shared position keys, normed relative embeddings, no absolute positions, no
    token types."""
    return {"relative_attention": True, "pos_att_type": ("p2c", "c2p"), "share_att_key": True,
            "relative_norm": True, "positions": "none", "type_vocab_size": 0,
            "position_buckets": min(256, values.get("max_position_embeddings", 512)),
            "max_relative_positions": -1}


FAMILY = CheckpointFamily(
    model_type="deberta-v2",
    class_stem="DebertaV2",
    prefix="deberta",
    config_keys=CONFIG_KEYS,
    weights=WEIGHTS,
    heads=HEADS,
    architectures=bert.ARCHITECTURES,
    fixed={**DEFAULTS, **FIXED},
    config_heads=config_heads,
    check_checkpoint=check_checkpoint,
    run_defaults=run_defaults,
)
