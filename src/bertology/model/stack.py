"""The one transformer stack every family is built from: its blocks' specs from the one config.

`block_spec` turns a `TransformerConfig` into the `BlockSpec` of one layer."""

from __future__ import annotations

from bertology.model.blocks import BlockSpec
from bertology.model.config import TransformerConfig


def block_spec(config: TransformerConfig, index: int = 0, cross_attention: bool = False) -> BlockSpec:
    """The block of layer `index` (a unique layer's): the config's norm kind and placement, feed-forward and biases;
    a pruned layer keeps fewer heads of the same size (config.pruned_heads), so its projections are narrower; a
    windowed model's (Longformer's attention_window) has the global tokens' projections unless
    `global_projections` is false (ModernBERT); layer 0 has no attention norm when `first_attention_norm` is false."""
    return BlockSpec(hidden_size=config.hidden_size, num_heads=config.heads_in_layer(index), head_dim=config.head_dim,
                     intermediate_size=config.intermediate_size, activation=config.hidden_act, norm=config.norm,
                     norm_eps=config.layer_norm_eps, pre_norm=config.pre_norm, gated=config.gated_ffn,
                     bias=config.bias, cross_attention=cross_attention, dropout=config.hidden_dropout,
                     attention_dropout=config.attention_dropout, attention_scale=config.attention_scale,
                     activation_dropout=config.activation_dropout,
                     global_projections=config.attention_window is not None and config.global_projections,
                     norm_bias=config.norm_bias, attention_norm=config.first_attention_norm or index > 0)
