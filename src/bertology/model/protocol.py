"""The `Model` protocol: what the trainer, objectives, tasks, PEFT and tools may ask of any model.

`EncoderModel` (bidirectional), `DecoderModel` (causal, with a key/value cache), `Seq2SeqModel`, `XLNetModel` and
`ElmoModel` implement it, each deriving from `bertology.model.base.BaseModel`. Code above the model package types
its arguments as `Model` and never asks which class it holds: where a feature needs more than the protocol, it asks
for a declared capability with `require(model, CAPABILITY, feature)`, which names what is missing."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import torch
from torch import Tensor, nn

from bertology.errors import ConfigError, InputError
from bertology.model.heads import HeadSpec


@runtime_checkable
class Model(Protocol):
    """A model with named heads, extension slots and a forward pass taking transformers' keyword names."""

    config: Any
    head_specs: tuple[HeadSpec, ...]
    heads: nn.ModuleDict
    extensions: dict[str, tuple[str, dict[str, Any]]]
    capabilities: frozenset[str]  # what the model can do: the names below

    def __call__(self, input_ids: Tensor, attention_mask: Tensor | None = None, *args: Any, **kwargs: Any) -> Any: ...

    def forward_inputs(self, batch: Any) -> dict[str, Any]:
        """The keyword arguments of this model's forward pass for a training batch (the fields it reads)."""
        ...

    def blocks(self) -> Sequence[nn.Module]:
        """The transformer blocks, in order: the unit of sharding and activation checkpointing."""
        ...

    def layer_states(self, input_ids: Tensor, attention_mask: Tensor,
                     token_type_ids: Tensor | None = None) -> tuple[Tensor, ...]:
        """The contextual representations that embeddings and analyses read: the embedding output, then each
        block's output ([B, L, H] each; an encoder-decoder's encoder side)."""
        ...

    def add_extension(self, where: str, factory: str, **options: Any) -> nn.Module: ...

    def init_weights(self, generator: Any = None) -> None: ...

    @property
    def word_embeddings(self) -> nn.Embedding: ...


# What a model can do, declared by its class (bertology.model.base.BaseModel: `CAPABILITIES`, and what depends on its
# config or heads in `conditional_capabilities`), so that code above the model package asks for what it needs
# (`require`) instead of which class it holds.
GENERATES = "generates"              # autoregressive decoding through a key/value cache (`bertology.generate`)
DECODER_ONLY = "decoder-only"        # a causal decoder: a prompt is the start of its own output
ENCODER_DECODER = "encoder-decoder"  # an encoder read once (`encode`), then a decoder generating from its start token
MASKED_LM = "masked-lm"              # a bidirectional encoder with a masked-LM head ('mlm')
ENCODER = "encoder"                  # the BERT-family encoder: `encoder.embeddings`, `encoder.layers`, its layer plan
PERMUTATION_LM = "permutation-lm"    # two-stream attention (`perm_mask`, `target_mapping`): XLNet's LM predicts there
MEMORY = "memory"                    # carries each layer's memory of earlier segments (`mems`, `use_mems`)
ATTENTIONS = "attentions"            # `forward(output_attentions=True)`; `attention_heads()` names each call's heads
HEAD_MASK = "head-mask"              # `forward(head_mask=[layer calls, heads])` scales each head's output
PRUNES_HEADS = "prunes-heads"        # `prune_heads({layer: heads})` removes heads for good
LORA = "lora"                        # blocks whose linear projections LoRA may wrap: `lora_targets` names them
SCALAR_MIX = "scalar-mix"            # heads read one stack's states: the extension "scalar_mix" at "mix" may replace them
BLOCKS = "blocks"                    # transformer blocks (`blocks()`) with adapter and prefix slots
POOLER = "pooler"                    # a pooler (dense + tanh over the first token) that 'pooled' heads read
TOKEN_TYPES = "token-types"          # reads segment ids (`token_type_ids`)
GLOBAL_TOKENS = "global-tokens"      # windowed attention with global tokens (`global_attention_mask`: Longformer)
CHARACTERS = "characters"            # reads words as characters ([B, L, C] ids; a word tokenizer, no subwords)

# Each capability in words, for the errors that name a missing one.
CAPABILITY_WORDS = {
    GENERATES: "generates text through a key/value cache",
    DECODER_ONLY: "is a causal decoder",
    ENCODER_DECODER: "is an encoder-decoder",
    MASKED_LM: "is a bidirectional encoder with a masked-LM head",
    ENCODER: "is a bidirectional encoder of the BERT family",
    PERMUTATION_LM: "predicts through two-stream (permutation) attention",
    MEMORY: "carries a memory of earlier segments",
    ATTENTIONS: "returns attention probabilities",
    HEAD_MASK: "takes a head mask",
    PRUNES_HEADS: "prunes attention heads",
    LORA: "has projections LoRA may wrap",
    SCALAR_MIX: "has heads reading one stack's states (a scalar mix can replace them)",
    BLOCKS: "is built of transformer blocks",
    POOLER: "has a pooler",
    TOKEN_TYPES: "reads token type ids",
    GLOBAL_TOKENS: "has windowed attention with global tokens",
    CHARACTERS: "reads words as characters",
}


def capabilities(model: Any) -> frozenset[str]:
    """What `model` (an instance, or a model class: what every instance of it can do) declares it can do; nothing
    for a model that declares nothing."""
    if isinstance(model, type):
        declared = getattr(model, "CAPABILITIES", None)  # a BaseModel's; else a plain class attribute, if any
        if declared is None:
            declared = getattr(model, "capabilities", ())
        return frozenset(declared) if isinstance(declared, (frozenset, set, tuple, list)) else frozenset()
    return frozenset(getattr(model, "capabilities", ()))


def model_kind(model: Any) -> str:
    """How errors name `model` (an instance or a class): its class and, when registered, its registered name."""
    from bertology.model.registry import MODELS

    cls = model if isinstance(model, type) else type(model)
    name = next((entry.name for entry in MODELS.values() if entry.cls is cls), None)
    return f"{cls.__name__}, registered as {name!r}" if name is not None else cls.__name__


def require(model: Any, capability: str, feature: str, error: type[Exception] = ConfigError) -> Any:
    """`model` when it declares `capability`; else `error` (a ConfigError by default) saying that `feature` needs
    it and naming the capability and the model."""
    if capability not in CAPABILITY_WORDS:
        raise ValueError(f"unknown capability {capability!r}")
    if capability not in capabilities(model):
        raise error(f"{feature} needs a model that {CAPABILITY_WORDS[capability]} (capability {capability!r}); "
                    f"the model ({model_kind(model)}) does not declare it")
    return model


def check_id_range(ids: Tensor, vocab_size: int, what: str) -> None:
    """`ids` all in [0, vocab_size), else an InputError naming `what` and the range found. On an accelerator the
    check runs on the device (reading the values would make the host wait for it)."""
    if not ids.numel():
        return
    if ids.device.type != "cpu":
        torch._assert_async(((ids >= 0) & (ids < vocab_size)).all(), f"{what} must lie in [0, {vocab_size})")
    elif int(ids.min()) < 0 or int(ids.max()) >= vocab_size:
        raise InputError(f"{what} must lie in [0, {vocab_size}), got [{int(ids.min())}, {int(ids.max())}]: does the "
                         "tokenizer match the model?")
