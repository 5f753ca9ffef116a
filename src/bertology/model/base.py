"""The common half of the `Model` protocol, written once: named heads built from their specs, the extensions record
and `add_extension`, running the heads (the first one's logits are the output's `logits`), the optional scalar mix
the heads read instead of the last layer, and the declared capabilities (bertology.model.protocol).

Every model root (the BERT-family encoder, the decoders and encoder-decoders, XLNet, ELMo) derives from
`BaseModel`; it builds its own body first and then calls `init_heads`, so that the modules keep the order (and the
parameter names) they have always had: `init_weights` draws from one generator in module order."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from torch import Tensor, nn

from bertology.model.extensions import add_extension
from bertology.model.heads import HeadInputs, HeadSpec, build_head
from bertology.model.protocol import SCALAR_MIX


class BaseModel(nn.Module):
    """A model with named heads and extension slots. Subclasses set `config_class`, declare what every instance can
    do in `CAPABILITIES` (and what depends on the instance's config or heads in `conditional_capabilities`), build
    their body and call `init_heads(heads)`."""

    config_class: ClassVar[type]
    # What every model of the class can do (names in bertology.model.protocol).
    CAPABILITIES: ClassVar[frozenset[str]] = frozenset()
    # The block projections LoRA may wrap (slot names of bertology.model.blocks.Block), for a class declaring LORA.
    lora_targets: ClassVar[tuple[str, ...]] = ()
    # The class of this model's encoder side alone, for one whose encoder can be fine-tuned without the rest (an
    # encoder-decoder's: a tagger labels the input's own tokens); None where there is none.
    encoder_alone: ClassVar[type | None] = None

    def __init__(self, config: Any) -> None:
        super().__init__()
        self.config = config

    def init_heads(self, heads: Sequence[HeadSpec]) -> None:
        """The heads (`head_specs`, and `heads` built from them, in order: the first is the primary one), an empty
        extensions record and, for a class declaring SCALAR_MIX, the empty `mix` slot the extension "scalar_mix"
        fills."""
        self.head_specs = tuple(heads)
        self.heads = nn.ModuleDict({spec.name: build_head(self.config, spec) for spec in self.head_specs})
        # Modules plugged in with add_extension: module path -> (factory name, options), to rebuild them on load.
        self.extensions: dict[str, tuple[str, dict[str, Any]]] = {}
        if SCALAR_MIX in self.CAPABILITIES:
            # An optional mix of all hidden states (ELMo's scalar mix, the extension "scalar_mix" at "mix"): when
            # set, the heads read it instead of the last layer.
            self.mix: nn.Module | None = None

    @property
    def capabilities(self) -> frozenset[str]:
        return self.CAPABILITIES | self.conditional_capabilities()

    def conditional_capabilities(self) -> frozenset[str]:
        """What this instance can do beyond its class's `CAPABILITIES` (from its config or heads)."""
        return frozenset()

    def reused_blocks(self) -> list[nn.Module]:
        """The blocks run more than once per forward (shared layers under a stack's layer plan: ALBERT's): they stay
        with the root unit when FSDP shards the blocks and are not checkpointed one by one."""
        from bertology.model.stack import Stack

        return [layer for stack in self.modules() if isinstance(stack, Stack)
                for index, layer in enumerate(stack.layers) if stack.plan.count(index) != 1]

    def add_extension(self, where: str, factory: str, **options: Any) -> nn.Module:
        """Plug a registered extension in at the module path `where` (bertology.model.extensions.add_extension):
        "encoder.layers.3.attn_adapter", or "encoder.layers.0.query" to wrap that projection."""
        return add_extension(self, where, factory, **options)

    def apply_heads(self, out: Any, inputs: HeadInputs, specs: Sequence[HeadSpec] | None = None) -> None:
        """Run the heads `specs` (default: all) on `inputs` into `out.head_logits`; the first one's logits become
        `out.logits`. Nothing without heads."""
        specs = self.head_specs if specs is None else specs
        for spec in specs:
            out.head_logits[spec.name] = self.heads[spec.name](inputs)
        if specs:
            out.logits = out.head_logits[specs[0].name]

    def mixed_states(self, out: Any, keep_states: bool) -> Tensor:
        """What the heads read: the mix of `out.hidden_states` under a scalar mix (dropped from `out` unless the
        caller asked for them), else the last hidden state."""
        if SCALAR_MIX not in self.CAPABILITIES or self.mix is None:
            return out.last_hidden_state
        assert out.hidden_states is not None
        mixed = self.mix(out.hidden_states)
        if not keep_states:
            out.hidden_states = None
        return mixed
