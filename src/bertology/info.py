"""What a checkpoint is: architecture, parameter counts (unique and as run, for ALBERT's shared layers) and tokenizer."""

from __future__ import annotations

import os
from dataclasses import dataclass

from torch import nn

from bertology.errors import CheckpointError
from bertology.model import Pretrained, TransformerConfig, load
from bertology.model.protocol import CHARACTERS, ENCODER, capabilities
from bertology.model.checkpoint import architecture_name


@dataclass(frozen=True)
class ParameterCounts:
    total: int  # unique parameters (tied and shared weights counted once)
    embeddings: int  # token, position and type embeddings, their LayerNorm and projection
    layers: int  # unique transformer layers
    layers_as_run: int  # every layer call counted: differs from `layers` when layers are shared (ALBERT)
    pooler: int
    heads: int

    @property
    def shared(self) -> bool:
        return self.layers_as_run != self.layers


@dataclass(frozen=True)
class TokenizerFacts:
    kind: str  # wordpiece, bpe, unigram
    style: str  # the special-token framing (bert, roberta, gpt2, t5, xlnet, ...)
    vocab_size: int
    specials: dict[str, tuple[str, int]]  # role -> (token, id)
    lowercase: bool
    model_max_length: int | None


@dataclass(frozen=True)
class ModelInfo:
    source: str
    config: TransformerConfig
    architecture: str | None
    task_heads: tuple[str, ...]
    parameters: ParameterCounts
    tokenizer: TokenizerFacts | None

    @property
    def usable_positions(self) -> int:
        """Tokens per sequence, specials included: RoBERTa-style positions start after the padding index."""
        return self.config.max_length

    def format(self) -> str:
        c, p = self.config, self.parameters
        depth = str(c.num_layers)
        if c.num_layer_groups is not None:
            depth += (f" layer calls over {c.num_unique_layers} unique layer(s) "
                      f"({c.num_layer_groups} group(s) of {c.inner_group_size})")
        rows = [
            ("model", self.source),
            ("family", f"{c.family}" + (f" ({self.architecture})" if self.architecture else "")),
            ("layers", depth),
            ("hidden size", str(c.hidden_size)),
            ("attention heads", f"{c.num_heads} (head size {c.head_dim})"),
            *([("window", ", ".join(str(w) for w in sorted(set(c.attention_window)))
                + " tokens (half on each side), global tokens with their own projections")]
              if getattr(c, "attention_window", None) is not None else []),
            ("intermediate", f"{c.intermediate_size} ({c.hidden_act})"),
            ("embedding size", str(c.token_embedding_size)
             + (" (projected to the hidden size)" if c.embedding_size is not None else "")),
            ("positions", f"{c.max_position_embeddings} ({self.usable_positions} usable per sequence)"),
            ("vocabulary", str(c.vocab_size)),
            ("token types", str(c.type_vocab_size)),
            ("pooler", "yes" if c.pooler else "no"),
            ("task heads", ", ".join(self.task_heads) or "none"),
        ]
        lines = [f"{key:<16}{value}" for key, value in rows]
        lines += ["", "parameters"]
        counts = [("total", p.total), ("embeddings", p.embeddings), ("layers", p.layers)]
        if p.shared:
            counts.append(("layers as run", p.layers_as_run))
        counts += [("pooler", p.pooler), ("heads", p.heads)]
        lines += [f"  {key:<14}{value:>14,}" for key, value in counts]
        if p.shared:
            lines.append(f"  (layers are shared: {p.layers:,} unique weights do the work of {p.layers_as_run:,})")
        lines += ["", "tokenizer"]
        lines += format_tokenizer(self.tokenizer, c.vocab_size)
        return "\n".join(lines)


def count(module: nn.Module | None) -> int:
    return sum(p.numel() for p in module.parameters()) if module is not None else 0


@dataclass(frozen=True)
class ElmoInfo:
    """An ELMo model (`bertology.model.elmo`): its sizes, parameter counts and word vocabulary."""

    source: str
    model: nn.Module
    tokenizer: object | None

    def format(self) -> str:
        c, m = self.model.config, self.model
        clip = ", ".join(f"{name} at {value}" for name, value in (("cell", c.cell_clip), ("projection", c.proj_clip))
                         if value is not None) or "none"
        rows = [
            ("model", self.source),
            ("family", "elmo (character CNN + forward and backward LSTM language models)"),
            ("characters", f"{c.max_characters_per_token} a word, embedded in {c.char_embedding_dim}"),
            ("filters", ", ".join(f"{n} x width {w}" for w, n in c.filters) + f" ({c.num_filters}, "
             f"{c.char_activation}), {c.num_highway} highway layer(s)"),
            ("LSTM layers", f"{c.num_layers} a direction, cell {c.cell_size} -> projection {c.projection_dim}"
             + (", residual" if c.skip_connections else "")),
            ("clipping", clip),
            ("output layers", f"{c.num_layers + 1} of {c.hidden_size}"),
            ("softmax", f"{c.vocab_size} words" if c.vocab_size else "none"),
            ("task heads", ", ".join(spec.name for spec in m.head_specs) or "none"),
        ]
        lines = [f"{key:<16}{value}" for key, value in rows]
        lines += ["", "parameters"]
        counts = [("total", count(m)), ("characters", count(m.characters)),
                  ("forward LSTM", count(m.forward_layers)), ("backward LSTM", count(m.backward_layers)),
                  ("softmax", count(m.softmax)), ("heads", count(m.heads))]
        lines += [f"  {key:<14}{value:>14,}" for key, value in counts]
        words = getattr(self.tokenizer, "words", None)
        lines += ["", "tokenizer",
                  f"  words ({len(words)}, {'lower-cased' if self.tokenizer.lowercase else 'cased'})"  # type: ignore
                  if words is not None else "  none (no word vocabulary in the directory)"]
        return "\n".join(lines)


@dataclass(frozen=True)
class StackInfo:
    """A model that is not one BERT-style encoder: a decoder (GPT-2), an encoder-decoder (T5, BART), an
    encoder-decoder's encoder alone, or XLNet. Its sizes, its stacks' parameter counts and its tokenizer."""

    source: str
    model: nn.Module
    architecture: str | None
    tokenizer: TokenizerFacts | None

    def stacks(self) -> list[tuple[str, nn.Module]]:
        """The model's stacks of layers, by name: XLNet's layers, or each side's Stack."""
        m = self.model
        if isinstance(getattr(m, "layers", None), nn.ModuleList):  # XLNet: the layers straight on the model
            return [("layers", m.layers)]
        return [(name, getattr(m, name)) for name in ("encoder", "decoder") if isinstance(getattr(m, name, None),
                                                                                         nn.Module)]

    def format(self) -> str:
        m, c = self.model, self.model.config
        kind = {"DecoderModel": "decoder (causal language model)", "Seq2SeqModel": "encoder-decoder",
                "XLNetModel": "permutation language model (two-stream attention, relative positions)"}.get(
                    type(m).__name__, type(m).__name__)
        decoder_layers = getattr(c, "num_decoder_layers", None)
        depth = str(c.num_layers) if type(m).__name__ != "Seq2SeqModel" else (
            f"{c.num_layers} encoder, {decoder_layers if decoder_layers is not None else c.num_layers} decoder")
        head_dim = getattr(c, "attention_head_size", None) or c.hidden_size // c.num_heads
        positions = getattr(c, "positions", "relative")
        if positions == "learned":
            where = f"learned, {c.max_position_embeddings}"
        else:
            where = "relative" + (f" ({c.relative_attention_num_buckets} buckets up to distance "
                                  f"{c.relative_attention_max_distance})" if hasattr(c, "relative_attention_num_buckets")
                                  else "")
        rows = [
            ("model", self.source),
            ("family", f"{c.family}, {kind}" + (f" ({self.architecture})" if self.architecture else "")),
            ("layers", depth),
            ("hidden size", str(c.hidden_size)),
            ("attention heads", f"{c.num_heads} (head size {head_dim})"),
            ("intermediate", f"{c.intermediate_size} ({c.hidden_act})"),
            ("positions", where),
            ("vocabulary", str(c.vocab_size)),
            ("task heads", ", ".join(spec.name for spec in m.head_specs) or "none"),
        ]
        lines = [f"{key:<16}{value}" for key, value in rows]
        lines += ["", "parameters"]
        counts = [("total", count(m)), ("embeddings", count(getattr(m, "embeddings", None)))]
        counts += [(name, count(stack)) for name, stack in self.stacks()]
        counts.append(("heads", count(getattr(m, "heads", None))))
        lines += [f"  {key:<14}{value:>14,}" for key, value in counts]
        lines += ["", "tokenizer"]
        lines += format_tokenizer(self.tokenizer, c.vocab_size)
        return "\n".join(lines)


def format_tokenizer(t: TokenizerFacts | None, model_vocab: int) -> list[str]:
    if t is None:
        return ["  none (no tokenizer files in the directory)"]
    lines = [
        f"  {'kind':<14}{t.kind}",
        f"  {'style':<14}{t.style}",
        f"  {'vocabulary':<14}{t.vocab_size}",
        f"  {'lowercases':<14}{'yes' if t.lowercase else 'no'}",
        f"  {'max length':<14}{t.model_max_length if t.model_max_length is not None else 'not set'}",
        f"  {'specials':<14}" + "  ".join(f"{role}={token!r} ({i})" for role, (token, i) in t.specials.items()),
    ]
    if t.vocab_size != model_vocab:
        lines.append(f"  note: the tokenizer has {t.vocab_size} tokens, the model's vocabulary {model_vocab}")
    return lines


def describe(model: str | os.PathLike | Pretrained) -> ModelInfo | ElmoInfo | StackInfo:
    """Architecture, parameter counts and tokenizer facts of a model directory or a loaded checkpoint."""
    source = str(model) if not isinstance(model, Pretrained) else "(in memory)"
    pretrained = model if isinstance(model, Pretrained) else load(model)
    if CHARACTERS in capabilities(pretrained.model):  # ELMo
        return ElmoInfo(source, pretrained.model, pretrained.tokenizer)
    if ENCODER not in capabilities(pretrained.model):  # GPT-2, T5, BART, XLNet
        heads = tuple(spec.name for spec in pretrained.model.head_specs)
        try:
            architecture = architecture_name(pretrained.model.config.family, heads)
        except CheckpointError:
            architecture = None
        return StackInfo(source, pretrained.model, architecture, tokenizer_facts(pretrained.tokenizer))
    encoder_model, config = pretrained.model, pretrained.model.config
    encoder = encoder_model.encoder
    per_layer = [count(layer) for layer in encoder.layers]
    heads = tuple(spec.name for spec in encoder_model.head_specs)
    try:
        architecture = architecture_name(config.family, heads)
    except CheckpointError:  # a head combination transformers has no class for
        architecture = None
    parameters = ParameterCounts(
        total=count(encoder_model),
        embeddings=count(encoder.embeddings),
        layers=sum(per_layer),
        layers_as_run=sum(per_layer[i] for i in encoder.plan),
        pooler=count(encoder.pooler),
        heads=count(encoder_model.heads),
    )
    return ModelInfo(source, config, architecture, heads, parameters, tokenizer_facts(pretrained.tokenizer))


def tokenizer_facts(tokenizer) -> TokenizerFacts | None:
    if tokenizer is None:
        return None
    normalizer = tokenizer.backend.normalizer
    lowercase = normalizer is not None and normalizer.normalize_str("A") == "a"
    specials = {  # the roles the tokenizer has (GPT-2's has no cls, sep or mask)
        role: (getattr(tokenizer, f"{role}_token"), getattr(tokenizer, f"{role}_id"))
        for role in ("cls", "sep", "pad", "mask", "unk") if getattr(tokenizer, f"{role}_token") is not None
    }
    return TokenizerFacts(tokenizer.kind, tokenizer.style, tokenizer.vocab_size, specials, lowercase,
                          tokenizer.model_max_length)
