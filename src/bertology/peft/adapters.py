"""Bottleneck adapters (Houlsby et al. 2019, "Parameter-Efficient Transfer Learning for NLP").

Each sublayer's output h (attention after its output projection, and the feed-forward) passes through
    h + f(h W_down + b_down) W_up + b_up
before the layer's residual add and LayerNorm. W_up and b_up start at zero, so a fresh adapter is the identity and the
adapted model computes exactly what the base model does. Houlsby et al. also train the LayerNorms
(`apply_adapters(..., train_layer_norms=True)`).
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import Tensor, nn

from bertology.errors import ConfigError
from bertology.model.config import ACTIVATIONS, TransformerConfig
from bertology.model.extensions import register_extension
from bertology.model.heads import activation
from bertology.model.protocol import Model
from bertology.peft.common import (Trainable, block_paths, check_choice, check_positive_int, freeze_base, layer_indices,
                                   trainable_parameters)

FACTORY = "bottleneck_adapter"
SLOTS: dict[str, str] = {"attn": "attn_adapter", "ffn": "ffn_adapter"}


class Adapter(nn.Module):
    """h + f(h W_down) W_up on [..., hidden]; `up` is zero at initialisation (the identity)."""

    def __init__(self, hidden: int, bottleneck: int, activation_name: str = "gelu") -> None:
        super().__init__()
        check_positive_int(hidden, "adapter hidden size")
        check_positive_int(bottleneck, "adapter bottleneck")
        self.activation_name = check_choice(activation_name, ACTIVATIONS, "adapter activation")
        self.down = nn.Linear(hidden, bottleneck)
        self.up = nn.Linear(bottleneck, hidden)
        nn.init.zeros_(self.up.weight)
        nn.init.zeros_(self.up.bias)
        self.act = activation(activation_name)

    def forward(self, h: Tensor) -> Tensor:
        return h + self.up(self.act(self.down(h)))

    def extra_repr(self) -> str:
        return f"activation={self.activation_name}"


def adapter_factory(config: TransformerConfig, current: nn.Module | None, bottleneck: int,
                    activation: str = "gelu") -> Adapter:
    """The registered extension "bottleneck_adapter", for a layer's `attn_adapter` or `ffn_adapter` slot."""
    if current is not None:
        raise ConfigError(f"bottleneck_adapter: the slot already holds a {type(current).__name__}")
    return Adapter(config.hidden_size, bottleneck, activation)


register_extension(FACTORY, adapter_factory)


def apply_adapters(model: Model, bottleneck: int = 64, activation: str = "gelu",
                   sublayers: Sequence[str] = ("attn", "ffn"), layers: Sequence[int] | None = None, *,
                   train_layer_norms: bool = False, train_heads: bool = True, also_train: Sequence[str] = (),
                   verbose: bool = False) -> Trainable:
    """Put an adapter after each of the `sublayers` ("attn", "ffn") of the chosen (unique) layers (all for None),
    through `model.add_extension`; then freeze the encoder except the extensions, every LayerNorm of the encoder when
    `train_layer_norms` (as Houlsby et al.), the heads when `train_heads`, and names starting with one of
    `also_train`. Returns the trainable share (printed too when `verbose`)."""
    check_positive_int(bottleneck, "adapter bottleneck")
    check_choice(activation, ACTIVATIONS, "adapter activation")
    if isinstance(sublayers, str):
        sublayers = (sublayers,)
    unknown = [s for s in sublayers if s not in SLOTS]
    if unknown or not sublayers or len(set(sublayers)) != len(sublayers):
        raise ConfigError(f"adapter sublayers: expected distinct values among {', '.join(SLOTS)}, got {list(sublayers)}")
    paths = block_paths(model)
    for index in layer_indices(model, layers, "adapter layers"):
        for sublayer in sublayers:
            model.add_extension(f"{paths[index]}.{SLOTS[sublayer]}", FACTORY, bottleneck=bottleneck,
                                activation=activation)
    norms = [f"{name}." for name, module in model.named_modules()
             if isinstance(module, (nn.LayerNorm, nn.RMSNorm)) and not name.startswith("heads.")] \
        if train_layer_norms else []
    freeze_base(model, train_heads, (*also_train, *norms))
    share = trainable_parameters(model)
    if verbose:
        print(share)
    return share
