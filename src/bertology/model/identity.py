"""Which model is this: a fingerprint of what decides a model's outputs, independent of how it was saved."""

from __future__ import annotations

import hashlib
import json
from typing import Any, Union

import torch
from torch import Tensor

from bertology.errors import ConfigError
from bertology.model.checkpoint import Pretrained
from bertology.model.elmo import ElmoModel
from bertology.model.encoder import EncoderModel
from bertology.tokenization.tokenizer import tokenizer_fingerprint

# Encoder settings that do not change the function a model computes in eval mode: left out of its fingerprint.
EVAL_IRRELEVANT = frozenset({"hidden_dropout", "attention_dropout", "classifier_dropout", "initializer_range"})
# ELMo's: its dropout, and the word softmax (pretraining only), which no word vector reads.
ELMO_IRRELEVANT = frozenset({"dropout", "classifier_dropout", "initializer_range", "vocab_size", "pad_token_id",
                             "extra"})


def state_fingerprint(state: dict[str, Tensor], skip: set[str] | frozenset[str] = frozenset()) -> str:
    """SHA-256 over the names, dtypes, shapes and bytes of the tensors of `state` whose names are not in `skip`."""
    digest = hashlib.sha256()
    for name in sorted(set(state) - set(skip)):
        tensor = state[name].detach().cpu().contiguous()
        digest.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}|".encode())
        digest.update(tensor.view(torch.uint8).numpy().tobytes() if tensor.numel() else b"")
    return digest.hexdigest()


def fingerprint(model: Union[Pretrained, EncoderModel, ElmoModel], tokenizer: Any = None) -> str:
    """SHA-256 of what decides a model's vectors: the encoder's config (dropout and initialisation left out), the
    encoder's tensors (names, dtypes, shapes, bytes; heads left out: they do not change the encoder's outputs; for
    another model, XLNet say, every tensor but its heads') and the tokenizer's definition (a `Pretrained`'s own,
    else `tokenizer`, else none). For ELMo: its config without dropout and the softmax's size, the biLM's tensors
    and its mix, and whether its word vocabulary lower-cases. Equal for the same weights saved in transformers'
    layout and bertology's native one."""
    if isinstance(model, Pretrained):
        tokenizer = model.tokenizer if tokenizer is None else tokenizer
        model = model.model
    if isinstance(model, ElmoModel):  # the biLM and its scalar mix, when it has one (what layers="mix" reads)
        state = {k: v for k, v in model.state_dict().items() if not k.startswith(("heads.", "softmax."))}
        irrelevant = ELMO_IRRELEVANT
    elif isinstance(model, EncoderModel):
        state, irrelevant = model.encoder.state_dict(), EVAL_IRRELEVANT
    elif isinstance(model, torch.nn.Module) and hasattr(getattr(model, "config", None), "to_dict"):
        state = {name: value for name, value in model.state_dict().items() if not name.startswith("heads.")}
        irrelevant = EVAL_IRRELEVANT
    else:
        raise ConfigError(f"expected a loaded model (bertology.load), got {type(model).__name__}")
    config = model.config.to_dict()
    for key in irrelevant:
        config.pop(key, None)
    digest = hashlib.sha256()
    digest.update(json.dumps(config, sort_keys=True, default=str).encode())
    digest.update(state_fingerprint(state).encode())
    if tokenizer is None:
        digest.update(b"-")
    elif hasattr(tokenizer, "split") and hasattr(tokenizer, "lowercase"):  # ELMo's words: only the rule matters
        digest.update(f"words|lowercase={bool(tokenizer.lowercase)}".encode())
    else:
        digest.update(tokenizer_fingerprint(tokenizer).encode())
    return digest.hexdigest()
