"""ALBERT: factorised embeddings projected to the hidden width, and layers shared across depth in groups
(`albert_layer_groups.{group}.albert_layers.{inner}`); a sentence-order head for pretraining."""

from typing import Any

from bertology.model.config import TransformerConfig
from bertology.model.convert import CheckpointFamily, ConfigKey, Head, layer_linears, linear, renamed_keys
from bertology.model.families import bert
from bertology.model.families.electra import hidden_size_when_none


def head_dropout_when_none(value: Any, config: TransformerConfig) -> Any:
    """transformers' ALBERT needs a number here (its default would be 0.1)."""
    return config.head_dropout if value is None else value


FAMILY = CheckpointFamily(
    model_type="albert",
    class_stem="Albert",
    prefix="albert",
    config_keys=(
        *renamed_keys({k: v for k, v in bert.KEYS.items() if k != "classifier_dropout"}),
        ConfigKey("classifier_dropout", "classifier_dropout_prob", write=head_dropout_when_none),
        ConfigKey("embedding_size", "embedding_size", write=hidden_size_when_none),
        ConfigKey("num_layer_groups", "num_hidden_groups"),
        ConfigKey("inner_group_size", "inner_group_num"),
    ),
    weights=(
        *bert.EMBEDDINGS,
        *linear("encoder.embeddings.project", "encoder.embedding_hidden_mapping_in", when="embedding_size"),
        *layer_linears("encoder.albert_layer_groups.{group}.albert_layers.{inner}", {
            "query": "attention.query",
            "key": "attention.key",
            "value": "attention.value",
            "attn_out": "attention.dense",
            "attn_norm": "attention.LayerNorm",
            "ffn_in": "ffn",
            "ffn_out": "ffn_output",
            "ffn_norm": "full_layer_layer_norm",
        }),
        *linear("encoder.pooler", "pooler", when="pooler"),
    ),
    heads={
        "mlm": Head("masked_lm", None, {"dense": "predictions.dense", "norm": "predictions.LayerNorm",
                                        "bias": "predictions.bias", "tied": "predictions.decoder"}),
        "sop": Head("pooled", None, {"out": "sop_classifier.classifier"}),
        "classifier": Head("pooled", None, {"out": "classifier"}),
        "token_classifier": bert.TOKEN_CLASSIFIER,
        "qa": bert.QA,
    },
    architectures={**bert.ARCHITECTURES, "ForPreTraining": ("mlm", "sop")},
)
