"""The one transformer stack every family is built from (encoders, decoders, both sides of an encoder-decoder):

    x_0 = Norm(s * E_word[w] + E_pos[p] + E_type[t])   (the norm if embedding_norm; a projection if embedding_size)
    x_l = Block_{plan[l]}(x_{l-1})                      (shared blocks under a layer plan: ALBERT)
    h   = Norm(x_N) if final_norm, then dropout if final_dropout (T5)

A `Stack` holds the positions (learned, sinusoidal, T5's relative buckets, or none), a layer plan (the unique layers
and, per layer call, the one it runs and its mask policy: bidirectional, causal, a sliding window), the final norm,
and, when it owns them, its input embeddings (`Embeddings`: token embeddings, positions, token types, the embedding
norm and projection; an encoder's). Without them the model embeds the tokens (a decoder's table is shared with its
LM head and, in an encoder-decoder, with the other side) and the stack adds the positions and the norm itself.

The parameters keep the names each family's checkpoints address: an encoder's stack `embeddings.{word, position,
token_type, norm, project}`, `layers.N.*`; a decoder's `positions`, `relative`, `embedding_norm`, `layers.N.*`,
`final_norm`.

Padding costs nothing: the real tokens of a padded [B, L] batch are packed into [T, H] for every linear layer, and
attention runs per sequence (bertology.model.attention.packed_attention); `packed=False` (or a key/value cache)
runs the padded computation; both give the same outputs at real tokens."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

import torch
from torch import Tensor, nn

from bertology.errors import ConfigError, InputError
from bertology.model.blocks import Block, BlockSpec, norm_layer
from bertology.model.config import TransformerConfig
from bertology.model.context import (
    BIDIRECTIONAL,
    CAUSAL,
    AttentionContext,
    KVCache,
    MaskPolicy,
    RelativeScores,
    ScoreProvider,
    sliding_window,
)
from bertology.model.disentangled import ConvLayer, RelativeTable
from bertology.model.dropout import fast_dropout
from bertology.model.packing import Layout
from bertology.model.positions import (
    LearnedPositions,
    RelativePositionBias,
    SinusoidalPositions,
    rotary_tables,
)
from bertology.model.protocol import check_id_range


def block_spec(config: TransformerConfig, index: int = 0, cross_attention: bool = False) -> BlockSpec:
    """The block of layer `index` (a unique layer's): the config's norm kind and placement, feed-forward and biases;
    a pruned layer keeps fewer heads of the same size (config.pruned_heads), so its projections are narrower; a
    windowed model's (Longformer's attention_window) has the global tokens' projections unless
    `global_projections` is false (ModernBERT); layer 0 has no attention norm when `first_attention_norm` is false."""
    spec = {"attention_scale": config.attention_scale, **disentangled_spec(config)}
    return BlockSpec(hidden_size=config.hidden_size, num_heads=config.heads_in_layer(index), head_dim=config.head_dim,
                     intermediate_size=config.intermediate_size, activation=config.hidden_act, norm=config.norm,
                     norm_eps=config.layer_norm_eps, pre_norm=config.pre_norm, gated=config.gated_ffn,
                     bias=config.bias, cross_attention=cross_attention, dropout=config.hidden_dropout,
                     attention_dropout=config.attention_dropout, activation_dropout=config.activation_dropout,
                     global_projections=config.attention_window is not None and config.global_projections,
                     norm_bias=config.norm_bias, attention_norm=config.first_attention_norm or index > 0, **spec)


def disentangled_spec(config: TransformerConfig) -> dict[str, object]:
    """DeBERTa's block settings: the scale 1 / sqrt(d (1 + terms)) and the relative projections of its own."""
    if not config.pos_att_type:
        return {}
    own = tuple(side for side, projected in (("key", config.relative_key_projection),
                                            ("query", config.relative_query_projection)) if projected)
    return {"attention_scale": (config.head_dim * (1 + len(config.pos_att_type))) ** -0.5,
            "relative_projections": own}


def position_ids_from_mask(attention_mask: Tensor, length: int) -> Tensor:
    """Positions counting real tokens only (left padding then starts at 0), for the last `length` columns."""
    positions = (attention_mask.long().cumsum(1) - 1).clamp(min=0)
    return positions[:, -length:]


def position_ids_in_documents(documents: Tensor) -> Tensor:
    """Positions counting from 0 at the start of every document of a packed row (`documents` [B, L]: an id per
    token, a new id where a new document starts; right padding)."""
    columns = torch.arange(documents.shape[1], device=documents.device).expand_as(documents)
    starts = torch.ones_like(documents, dtype=torch.bool)
    starts[:, 1:] = documents[:, 1:] != documents[:, :-1]
    return columns - torch.where(starts, columns, torch.zeros_like(columns)).cummax(1).values


def absolute_positions(config: TransformerConfig, width: int, table: bool = False) -> nn.Module | None:
    """The absolute position table of `config.positions` (None for relative or no positions): learned positions
    read at the position ids (`table`: a plain nn.Embedding, whose ids are its rows already: an encoder's, fairseq's
    offset included) or at the ids plus position_offset (BART's unused rows)."""
    if config.positions == "learned":
        if table and not config.position_offset:
            return nn.Embedding(config.max_position_embeddings, width)
        return LearnedPositions(config.max_position_embeddings, width, config.position_offset)
    if config.positions == "sinusoidal":
        return SinusoidalPositions(config.max_position_embeddings, width)
    return None


class Embeddings(nn.Module):
    """A stack's own input embeddings (an encoder's): token embeddings (scaled by embedding_scale), absolute
    positions, token types, then the embedding norm, dropout and the projection to hidden_size."""

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        width = config.token_embedding_size
        self.word = nn.Embedding(config.vocab_size, width, padding_idx=config.pad_token_id)
        self.position = absolute_positions(config, width, table=True)
        self.token_type = nn.Embedding(config.type_vocab_size, width) if config.type_vocab_size > 0 else None
        self.norm = (norm_layer(config.norm, width, config.layer_norm_eps, config.norm_bias) if config.embedding_norm
                     else None)
        self.project = nn.Linear(width, config.hidden_size) if config.embedding_size is not None else None
        self.scale = config.embedding_scale
        self.dropout = config.hidden_dropout if config.embedding_dropout is None else config.embedding_dropout

    def forward(self, input_ids: Tensor, position_ids: Tensor, token_type_ids: Tensor | None) -> Tensor:
        x = self.word(input_ids)
        if self.scale != 1.0:
            x = x * self.scale
        if self.position is not None:
            x = x + self.position(position_ids)
        if self.token_type is not None:
            x = x + self.token_type(token_type_ids if token_type_ids is not None else torch.zeros_like(input_ids))
        if self.norm is not None:
            x = self.norm(x)
        x = fast_dropout(x, self.dropout, self.training)
        return self.project(x) if self.project is not None else x


def run_layers(layers: Sequence[nn.Module], plan: Sequence[int], x: Tensor, context: AttentionContext,
               hidden_states: list[Tensor] | None = None, attentions: list[Tensor] | None = None,
               to_padded: Callable[[Tensor], Tensor] = lambda t: t, last_queries: Tensor | None = None,
               after_first: Callable[[Tensor], Tensor] | None = None) -> Tensor:
    """The layer loop of every stack: each layer call `call` runs `layers[plan[call]](x, context.at(call))`,
    appending its attention probabilities to `attentions` and its output (as `to_padded` makes it) to
    `hidden_states` when they are given, one entry per layer call (as transformers records them, ALBERT's groups
    too). `last_queries`: the rows at which the last call's output is wanted (`AttentionContext.queries`); that
    output is then no whole hidden state and is not recorded. XLNet's two-stream blocks run here too, both streams
    in the one input (`bertology.model.xlnet`). `after_first`: applied to the first call's output before it is
    recorded (DeBERTa-v2's convolution layer)."""
    for call, index in enumerate(plan):
        queries = last_queries if call == len(plan) - 1 else None
        x, probs = layers[index](x, context.at(call, queries=queries))
        if call == 0 and after_first is not None:
            x = after_first(x)
        if attentions is not None:
            attentions.append(probs)  # type: ignore[arg-type]
        if hidden_states is not None and queries is None:
            hidden_states.append(to_padded(x))
    return x


class StackOutput(NamedTuple):
    """A stack's outputs, padded [B, L, ...] (zeros at padding when packed)."""

    last_hidden_state: Tensor
    hidden_states: tuple[Tensor, ...] | None = None  # the embedding output, then every layer call's
    attentions: tuple[Tensor, ...] | None = None  # attention probabilities [B, heads, L, L], one per layer call


class Stack(nn.Module):
    """Positions, a plan of (possibly shared) blocks and the final norm; with `embeddings`, the input embeddings too
    (see the module docstring). `num_layers` None: the config's depth and layer plan (sharing, pruned heads,
    windows); a number: that many plain layers (an encoder-decoder's decoder of another depth). `block` builds each
    layer from its spec (a Block subclass)."""

    def __init__(self, config: TransformerConfig, num_layers: int | None = None, *, causal: bool = False,
                 cross_attention: bool = False, embeddings: bool = False,
                 block: Callable[[BlockSpec], Block] = Block) -> None:
        super().__init__()
        self.config = config
        self.causal = causal
        hidden = config.hidden_size
        self.embeddings: Embeddings | None = Embeddings(config) if embeddings else None
        if not embeddings:
            self.positions = absolute_positions(config, hidden)
        self.relative = (RelativePositionBias(config.num_heads, config.relative_attention_num_buckets,
                                              config.relative_attention_max_distance, bidirectional=not causal)
                         if config.positions == "relative" else None)
        # DeBERTa's relative-position table and the convolution beside its first layer
        self.disentangled = RelativeTable(config) if config.relative_attention or config.relative_norm else None
        self.conv = ConvLayer(config) if config.conv_kernel_size else None
        if causal and config.attention_window is not None:
            raise ConfigError("attention_window: windows are for bidirectional stacks; a causal stack attends to "
                              "every earlier position")
        if not embeddings:
            self.embedding_norm = (norm_layer(config.norm, hidden, config.layer_norm_eps, config.norm_bias)
                                   if config.embedding_norm else None)
        if num_layers is None or num_layers == config.num_layers:
            self.layers = nn.ModuleList(block(block_spec(config, i, cross_attention))
                                        for i in range(config.num_unique_layers))
            self.plan = [index for step in config.layer_plan() for index in step]  # unique layer per call
            windows = [config.window_of(i) for i in self.plan]
        else:
            self.layers = nn.ModuleList(block(block_spec(config, 0, cross_attention)) for _ in range(num_layers))
            self.plan = list(range(num_layers))
            windows = [None] * num_layers
        # Per layer call, who attends to whom: everyone, the causal past, or a window (half of it on each side).
        self.policies: list[MaskPolicy] = [
            CAUSAL if causal else sliding_window(w // 2) if w is not None else BIDIRECTIONAL for w in windows]
        self.windowed = any(w is not None for w in windows)
        # Rotary positions: per layer call, its base (one for the global layers, another for the windowed ones).
        self.thetas: list[float] | None = None
        if config.positions == "rotary":
            self.thetas = [config.theta_of(i) if w is not None else config.theta_of_global for i, w in
                           zip(self.plan, windows)]
        self.final_norm = (norm_layer(config.norm, hidden, config.layer_norm_eps, config.norm_bias) if config.final_norm
                           else None)

    def output(self, x: Tensor) -> Tensor:
        """The last layer's output through the final norm, then dropped out where the config says so (T5)."""
        if self.final_norm is not None:
            x = self.final_norm(x)
        return fast_dropout(x, self.config.hidden_dropout, self.training) if self.config.final_dropout else x

    @property
    def policy(self) -> MaskPolicy:
        """The mask policy of the first layer call (every call's, but in a windowed stack)."""
        return self.policies[0]

    @property
    def max_length(self) -> int:
        """The longest sequence the positions cover (TransformerConfig.max_length)."""
        return self.config.max_length

    def position_ids(self, input_ids: Tensor) -> Tensor:
        """An encoder's positions of its columns: from 0, or (fairseq) real tokens from pad + 1, padding at pad."""
        if self.config.positions_after_padding:
            real = input_ids.ne(self.config.pad_token_id).long()
            return torch.cumsum(real, 1) * real + self.config.pad_token_id
        return torch.arange(input_ids.shape[1], device=input_ids.device).expand_as(input_ids)

    def check_inputs(self, input_ids: Tensor) -> None:
        if input_ids.dim() != 2:
            raise InputError(f"input_ids must be [batch, length], got shape {tuple(input_ids.shape)}")
        if input_ids.shape[1] > self.max_length:
            raise InputError(f"a sequence of {input_ids.shape[1]} tokens is longer than the model's {self.max_length} "
                             "positions: truncate it, or embed it in windows (bertology.embed)")
        check_id_range(input_ids, self.config.vocab_size, "token ids")

    def global_tokens(self, global_attention_mask: Tensor | None, attention_mask: Tensor) -> Tensor | None:
        """The global tokens [B, L] as booleans after checking them, None when there are none."""
        if global_attention_mask is None:
            return None
        if self.config.attention_window is None:
            raise InputError("global_attention_mask: this model attends from every token to every token (it has no "
                             "attention_window); global tokens need a windowed model such as a Longformer")
        if not self.config.global_projections:
            raise InputError("global_attention_mask: this model's windows have no global tokens (no global "
                             "projections: ModernBERT's); global tokens need a windowed model such as a Longformer")
        if global_attention_mask.shape != attention_mask.shape:
            raise InputError(f"global_attention_mask must have the shape of input_ids {tuple(attention_mask.shape)}, "
                             f"got {tuple(global_attention_mask.shape)}")
        flags = global_attention_mask.bool()
        if global_attention_mask.device.type == "cpu":
            if not ((global_attention_mask == 0) | (global_attention_mask == 1)).all():
                raise InputError("global_attention_mask: expected 0 (local) or 1 (global) at every position")
            on_padding = (flags & ~attention_mask.bool()).nonzero()
            if len(on_padding):
                row, column = on_padding[0].tolist()
                raise InputError(f"global_attention_mask: row {row} puts a global token on padding (column {column}, "
                                 "where attention_mask is 0); mark real tokens only")
        return flags if bool(flags.any()) else None

    def head_scales(self, head_mask: Tensor | None) -> list[Tensor | None]:
        """Per layer call, the mask entries of the heads that layer has (None everywhere without a mask)."""
        if head_mask is None:
            return [None] * len(self.plan)
        expected = (len(self.plan), self.config.num_heads)
        if tuple(head_mask.shape) != expected:
            raise InputError(f"head_mask must be [layer calls, heads] = {list(expected)}, got {list(head_mask.shape)}")
        scales = []
        for call, index in enumerate(self.plan):
            kept = self.config.kept_heads(index)
            scales.append(head_mask[call] if len(kept) == self.config.num_heads else head_mask[call, kept])
        return scales

    def forward(self, inputs: Tensor, attention_mask: Tensor | None = None, *,
                token_type_ids: Tensor | None = None, position_ids: Tensor | None = None,
                memory: Tensor | None = None, memory_mask: Tensor | None = None,
                caches: list[KVCache] | None = None, packed: bool = True, output_hidden_states: bool = False,
                output_attentions: bool = False, documents: Tensor | None = None, lm_prefix: Tensor | None = None,
                layout: Layout | None = None, memory_layout: Layout | None = None,
                last_layer_at: Tensor | None = None, head_mask: Tensor | None = None,
                global_attention_mask: Tensor | None = None) -> StackOutput:
        """`inputs`: token ids [B, L] when the stack owns its embeddings, else the embedded tokens [B, L, H] (scaled).
        `attention_mask` [B, past + L] (real tokens, the cached positions included; default all real).

        `position_ids` [B, L] (a stack with embeddings): default `position_ids`. Without embeddings positions count
        the real tokens of the mask (left padding starts at 0), or from 0 in each document. `token_type_ids` [B, L].
        `documents` [B, L] (packed documents, see `bertology.model.packing`): each document attends within itself.
        `lm_prefix` [B, past + L] bool (a causal stack): a prefix LM's prefix, seen in both directions by its own
        tokens. `layout`: the packing of `attention_mask` (and `documents`), built already from the host's mask
        (then nothing in the forward waits for a GPU). `memory` [B, M, H] with `memory_mask` [B, M]: what
        cross-attention reads; `memory_layout` (packed, without a cache) packs it once, so that cross-attention
        projects its real tokens alone. `caches`: one KVCache per layer call (decoding; the padded layout).

        `global_attention_mask` [B, L] (a windowed stack's, 1 = global): tokens that attend to every token and that
        every token attends to, with the layers' global projections (Longformer); on real tokens only.
        `head_mask` [layer calls, num_heads]: each head's output multiplied by its entry (pruned heads keep their
        numbering; their entries are ignored). `last_layer_at` (flat indices into [B * L], packed, on CPU, without
        hidden states or attentions, unwindowed): the last layer runs only at these positions; the last hidden state
        is then zero everywhere else."""
        own = self.embeddings is not None
        if own:
            self.check_inputs(inputs)
        batch, length = inputs.shape[:2]
        past = caches[0].length if caches else 0
        if attention_mask is None:
            attention_mask = torch.ones(batch, past + length, dtype=torch.long, device=inputs.device)
        elif attention_mask.shape[1] != past + length:
            raise InputError(f"attention_mask covers {attention_mask.shape[1]} positions; the cache holds {past} and "
                             f"the input adds {length}")
        if documents is not None and (not packed or caches is not None):
            raise InputError("documents (packed documents) need the packed layout, without a key/value cache")
        if lm_prefix is not None and lm_prefix.shape != attention_mask.shape:
            raise InputError(f"lm_prefix has shape {tuple(lm_prefix.shape)}; it marks the positions of the attention "
                             f"mask, {tuple(attention_mask.shape)}")
        head_scales = self.head_scales(head_mask)
        flags = self.global_tokens(global_attention_mask, attention_mask)
        if not packed or caches is not None:
            layout = None
        elif layout is None:
            layout = Layout(attention_mask, documents)
        pack = layout.pack if layout is not None else (lambda t: t)
        if own:  # packed first: the embeddings are looked up at real tokens alone
            assert self.embeddings is not None
            if position_ids is None:
                position_ids = self.position_ids(inputs)
            x = self.embeddings(pack(inputs), pack(position_ids),
                                pack(token_type_ids) if token_type_ids is not None else None)
        else:
            x = inputs
            if self.positions is not None or self.thetas is not None:
                if past + length > self.config.max_length:
                    raise InputError(f"{past + length} positions exceed the model's {self.config.max_length}")
                position_ids = (position_ids_in_documents(documents) if documents is not None
                                else position_ids_from_mask(attention_mask, length))
            if self.positions is not None:
                x = x + self.positions(position_ids)
            if self.embedding_norm is not None:
                x = self.embedding_norm(x)
            dropout = self.config.embedding_dropout
            x = pack(fast_dropout(x, self.config.hidden_dropout if dropout is None else dropout, self.training))
        if layout is not None:
            if lm_prefix is not None:
                lm_prefix = layout.pack(lm_prefix)
            if flags is not None:
                flags = layout.pack(flags)
            key_mask = None
        else:
            key_mask = attention_mask.bool()
        scores: ScoreProvider | None = None
        if self.relative is not None:  # one table for every layer: packed, the widest row's; padded, the batch's
            scores = (RelativeScores(self.relative, layout.seq_len, layout.seq_len) if layout is not None
                      else RelativeScores(self.relative, length, past + length))
        if self.disentangled is not None and self.config.relative_attention:  # the rows the longest sequence reaches, projected once a layer call
            scores = self.disentangled.scores(self.layers, self.plan, layout.seq_len if layout is not None
                                              else past + length)
        if memory is not None and memory_layout is not None and layout is not None:
            memory = memory_layout.pack(memory)  # once for every layer's cross-attention
        else:
            memory_layout = None
        rotaries: list[tuple[Tensor, Tensor]] = []
        if self.thetas is not None:  # the tables once per base, shared by the layer calls that use it
            assert position_ids is not None
            at = pack(position_ids)
            rotary = {theta: rotary_tables(at, self.config.head_dim, theta) for theta in sorted(set(self.thetas))}
            rotaries = [rotary[theta] for theta in self.thetas]
        context = AttentionContext(layout=layout, key_mask=key_mask, global_tokens=flags, lm_prefix=lm_prefix,
                                   scores=scores, need_weights=output_attentions, memory=memory,
                                   memory_mask=memory_mask, memory_layout=memory_layout, policies=self.policies,
                                   caches=caches, head_scales=head_scales, rotaries=rotaries)
        to_padded = layout.unpack if layout is not None else (lambda t: t)
        hidden_states = [to_padded(x)] if output_hidden_states else None
        attentions: list[Tensor] | None = [] if output_attentions else None
        plan = self.plan
        # Only the rows a head reads need the last layer's queries and feed-forward. Choosing them is data-dependent
        # (a host synchronisation), which on a GPU costs more than the rows saved: there the last layer runs whole.
        # A windowed layer (Longformer) runs whole too.
        prune = (last_layer_at is not None and layout is not None and x.device.type == "cpu" and memory is None
                 and not (output_hidden_states or output_attentions) and not self.windowed and not self.causal
                 and self.relative is None and self.thetas is None and not self.config.relative_attention
                 and self.conv is None)
        if prune:
            plan = plan[:-1]
        conv, first_input = self.conv, x  # DeBERTa-v2's convolution over layer 0's input, added to its output
        after_first = None if conv is None else (lambda out: conv(first_input, out, layout, key_mask))
        x = run_layers(self.layers, plan, x, context, hidden_states, attentions, to_padded, after_first=after_first)
        if prune:
            assert layout is not None and last_layer_at is not None
            packed_of_flat = torch.empty(layout.batch_size * layout.seq_len, dtype=torch.long, device=x.device)
            packed_of_flat[layout.flat_index] = torch.arange(layout.num_tokens, device=x.device)
            real = last_layer_at[attention_mask.flatten()[last_layer_at].bool()]  # padding has no packed token
            queries = torch.unique(packed_of_flat[real])  # sorted, each once
            rows = self.output(self.layers[self.plan[-1]](x, context.at(len(self.plan) - 1, queries=queries))[0])
            out = x.new_zeros(layout.batch_size * layout.seq_len, x.shape[-1])
            out[layout.flat_index[queries]] = rows
            last = out.view(layout.batch_size, layout.seq_len, -1)
        else:
            if self.final_norm is not None or self.config.final_dropout:
                x = self.output(x)
                if hidden_states is not None:
                    hidden_states[-1] = to_padded(x)
            last = hidden_states[-1] if hidden_states is not None else to_padded(x)
        return StackOutput(last, tuple(hidden_states) if hidden_states is not None else None,
                           tuple(attentions) if attentions is not None else None)
