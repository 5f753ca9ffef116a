"""Longformer: RoBERTa's layout under `longformer.` with a window per layer (`attention_window`, a number or a
list) and each layer's global projections `attention.self.{query,key,value}_global`."""

from collections.abc import Mapping
from typing import Any

from bertology.model.convert import CheckpointFamily, ConfigKey, layer_linears, renamed_keys
from bertology.model.families import bert, roberta
from bertology.model.longformer import LongformerConfig


def windows(value: Any, hf: Mapping[str, Any]) -> Any:
    """One number stands for every layer, as transformers reads it."""
    if isinstance(value, int) and not isinstance(value, bool):
        return [value] * int(hf.get("num_hidden_layers", 12))
    return value


GLOBAL_PARTS = {"query_global": "attention.self.query_global", "key_global": "attention.self.key_global",
                "value_global": "attention.self.value_global"}

FAMILY = CheckpointFamily(
    model_type="longformer",
    class_stem="Longformer",
    prefix="longformer",
    config_keys=(*renamed_keys(bert.KEYS), ConfigKey("attention_window", "attention_window", windows),
                 ConfigKey("sep_token_id", "sep_token_id")),
    weights=bert.EMBEDDINGS + bert.LAYERS + layer_linears("encoder.layer.{i}", GLOBAL_PARTS) + bert.POOLER,
    heads=roberta.HEADS,
    architectures=bert.ARCHITECTURES,
    fixed={"positions_after_padding": True},
    model="longformer",
    config_class=LongformerConfig,
)
