"""Causal decoders and encoder-decoders assembled from the shared parts: `DecoderModel` (GPT-style, with a key/value
cache) and `Seq2SeqModel` (BART/T5-style). A family is a `TransformerConfig` (norm placement and kind, gated or
dense feed-forward, biases, position kind, embedding scale) plus its checkpoint tables; no family has a class here.

    x_0 = s * E_word[w] (+ E_pos[p]) (-> Norm if embedding_norm)
    x_l = Block_l(x_{l-1})              causal self-attention (decoder), + cross-attention over the encoder's output
    h   = Norm(x_N) if final_norm

Forward passes take transformers' keyword names (input_ids, attention_mask, decoder_input_ids,
decoder_attention_mask, labels, past_key_values, use_cache) and return logits and the cache under the same names."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from bertology.errors import ConfigError, InputError
from bertology.model.attention import BIDIRECTIONAL, CAUSAL, sliding_window
from bertology.model.blocks import Block, KVCache, init_parameters, norm_layer
from bertology.model.config import DEFAULT_ROTARY_THETA, TransformerConfig  # noqa: F401  (the family tables')
from bertology.model.dropout import fast_dropout
from bertology.model.extensions import add_extension
from bertology.model.heads import HeadInputs, HeadSpec, MaskedLMHead, TiedLMBiasHead, build_head
from bertology.model.packing import Layout
from bertology.model.positions import LearnedPositions, RelativePositionBias, SinusoidalPositions, rotary_tables
from bertology.model.protocol import DECODER_ONLY, ENCODER_DECODER, GENERATES, MASKED_LM, check_id_range
from bertology.model.registry import register_model
from bertology.model.stack import block_spec

@dataclass
class ModelOutput:
    """What a decoder or encoder-decoder forward returns, named as in transformers."""

    last_hidden_state: Tensor
    logits: Tensor | None = None
    head_logits: dict[str, Tensor] = field(default_factory=dict)
    loss: Tensor | None = None  # mean cross-entropy of `labels` (when given)
    past_key_values: list[KVCache] | None = None
    hidden_states: tuple[Tensor, ...] | None = None
    encoder_last_hidden_state: Tensor | None = None
    attentions: tuple[Tensor, ...] | None = None  # attention probabilities [B, heads, L, L], one per layer


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


class Stack(nn.Module):
    """Positions, a list of blocks and the final norm; the token embeddings are the model's (they may be shared)."""

    def __init__(self, config: TransformerConfig, num_layers: int, *, causal: bool, cross_attention: bool) -> None:
        super().__init__()
        self.config = config
        self.policy = CAUSAL if causal else BIDIRECTIONAL
        if causal and config.attention_window is not None:
            raise ConfigError("attention_window: windows are for bidirectional stacks; a causal stack attends to "
                              "every earlier position")
        # Each layer's mask policy (a window of w tokens: w / 2 on each side) and rotary base.
        self.policies = [sliding_window(w // 2) if (w := config.window_of(i)) is not None else self.policy
                         for i in range(num_layers)]
        self.thetas = ([config.theta_of(i) for i in range(num_layers)] if config.positions == "rotary" else None)
        hidden = config.hidden_size
        self.positions: nn.Module | None = None
        if config.positions == "learned":
            self.positions = LearnedPositions(config.max_position_embeddings, hidden, config.position_offset)
        elif config.positions == "sinusoidal":
            self.positions = SinusoidalPositions(config.max_position_embeddings, hidden)
        self.relative = (RelativePositionBias(config.num_heads, config.relative_attention_num_buckets,
                                              config.relative_attention_max_distance, bidirectional=not causal)
                         if config.positions == "relative" else None)
        eps, norm_bias = config.layer_norm_eps, config.norm_bias
        self.embedding_norm = norm_layer(config.norm, hidden, eps, norm_bias) if config.embedding_norm else None
        self.layers = nn.ModuleList(Block(block_spec(config, i, cross_attention)) for i in range(num_layers))
        self.final_norm = norm_layer(config.norm, hidden, eps, norm_bias) if config.final_norm else None

    def forward(self, embedded: Tensor, attention_mask: Tensor, *, memory: Tensor | None = None,
                memory_mask: Tensor | None = None, caches: list[KVCache] | None = None, packed: bool = True,
                output_hidden_states: bool = False, documents: Tensor | None = None,
                lm_prefix: Tensor | None = None, layout: Layout | None = None,
                memory_layout: Layout | None = None,
                attentions: list[Tensor] | None = None) -> tuple[Tensor, tuple[Tensor, ...] | None]:
        """`embedded` [B, L, H] (token embeddings, scaled); `attention_mask` [B, past + L] (real tokens, the cached
        positions included). Returns the last hidden state [B, L, H] (zeros at padding when packed) and, when asked,
        the hidden states (after the embeddings, then after every block; the last one after the final norm).
        `documents` [B, L] (packed documents, see `bertology.model.packing`): each document attends within itself
        and counts its positions from 0. `lm_prefix` [B, past + L] bool (a causal stack only): a prefix LM's prefix,
        whose tokens see each other in both directions (bertology.model.attention.combined_mask). `layout`: the
        packing of `attention_mask` (and `documents`), built already from the host's mask (the trainer does, so that
        nothing in the forward waits for a GPU); else worked out here. `memory_layout`: the packing of `memory_mask`
        (packed, without a cache): cross-attention then projects the memory's real tokens alone. `attentions`: a
        list that every layer's attention probabilities [B, heads, L, L] are appended to."""
        length = embedded.shape[1]
        past = caches[0].length if caches else 0
        if attention_mask.shape[1] != past + length:
            raise InputError(f"attention_mask covers {attention_mask.shape[1]} positions; the cache holds {past} and "
                             f"the input adds {length}")
        if documents is not None and (not packed or caches is not None):
            raise InputError("documents (packed documents) need the packed layout, without a key/value cache")
        if lm_prefix is not None and lm_prefix.shape != attention_mask.shape:
            raise InputError(f"lm_prefix has shape {tuple(lm_prefix.shape)}; it marks the positions of the attention "
                             f"mask, {tuple(attention_mask.shape)}")
        x = embedded
        positions = None
        if self.positions is not None or self.thetas is not None:
            if past + length > self.config.max_length:
                raise InputError(f"{past + length} positions exceed the model's {self.config.max_length}")
            positions = (position_ids_in_documents(documents) if documents is not None
                         else position_ids_from_mask(attention_mask, length))
        if self.positions is not None:
            x = x + self.positions(positions)
        if self.embedding_norm is not None:
            x = self.embedding_norm(x)
        dropout = self.config.embedding_dropout
        x = fast_dropout(x, self.config.hidden_dropout if dropout is None else dropout, self.training)
        if not packed or caches is not None:
            layout = None
        elif layout is None:
            layout = Layout(attention_mask, documents)
        if layout is not None:
            x = layout.pack(x)
            if lm_prefix is not None:
                lm_prefix = layout.pack(lm_prefix)
            bias = (corners(self.relative(layout.seq_len, layout.seq_len)[None])
                    if self.relative is not None else None)
            key_mask = None
        else:
            bias = self.relative(length, past + length)[None] if self.relative is not None else None
            key_mask = attention_mask
        if memory is not None and memory_layout is not None and layout is not None:
            memory = memory_layout.pack(memory)  # once for every layer's cross-attention
        else:
            memory_layout = None
        rotary: dict[float, tuple[Tensor, Tensor]] = {}
        if self.thetas is not None:  # the tables once per base, shared by the layers that use it
            assert positions is not None
            at = layout.pack(positions) if layout is not None else positions
            head_dim = self.config.head_dim
            rotary = {theta: rotary_tables(at, head_dim, theta) for theta in sorted(set(self.thetas))}
        to_padded = layout.unpack if layout is not None else (lambda t: t)
        hidden_states = [to_padded(x)] if output_hidden_states else None
        for index, block in enumerate(self.layers):
            x, probs = block(x, layout, key_mask, attentions is not None, policy=self.policies[index], bias=bias,
                             memory=memory, memory_mask=memory_mask,
                             cache=caches[index] if caches is not None else None, lm_prefix=lm_prefix,
                             memory_layout=memory_layout,
                             rotary=rotary[self.thetas[index]] if self.thetas is not None else None)
            if attentions is not None:
                assert probs is not None
                attentions.append(probs)
            if hidden_states is not None:
                hidden_states.append(to_padded(x))
        if self.final_norm is not None:
            x = self.final_norm(x)
            if hidden_states is not None:
                hidden_states[-1] = to_padded(x)
        return to_padded(x), (tuple(hidden_states) if hidden_states is not None else None)


def corners(table: Tensor) -> Callable[[int, int], Tensor]:
    """The score bias of a packed stream's sequences from one relative-position table [1, heads, L, L] for the
    padded rows, computed once for every layer and group: a sequence of n tokens reads its top-left n x n corner
    (the bias depends on key - query only; the padded kernel reads the whole table). Each corner is cut once, so the backward adds every layer's gradient there
    before one pass into the table."""
    cut: dict[tuple[int, int], Tensor] = {}

    def bias(queries: int, keys: int) -> Tensor:
        if (queries, keys) not in cut:
            cut[queries, keys] = table[..., :queries, :keys]
        return cut[queries, keys]

    return bias


def check_ids(input_ids: Tensor, vocab_size: int, what: str = "input_ids") -> None:
    if input_ids.dim() != 2:
        raise InputError(f"{what} must be [batch, length], got shape {tuple(input_ids.shape)}")
    check_id_range(input_ids, vocab_size, what)


def lm_loss(logits: Tensor, labels: Tensor) -> Tensor:
    """Mean cross-entropy over the labels that are not -100 (transformers' convention)."""
    return F.cross_entropy(logits.flatten(0, -2).float(), labels.flatten(), ignore_index=-100)


class TransformerModel(nn.Module):
    """What decoders and encoder-decoders share: token embeddings, heads, extensions and initialisation."""

    config_class = TransformerConfig

    def __init__(self, config: TransformerConfig, heads: Sequence[HeadSpec]) -> None:
        super().__init__()
        self.config = config
        self.embeddings = nn.Embedding(config.vocab_size, config.hidden_size)
        self.head_specs = tuple(heads)
        self.heads = nn.ModuleDict({spec.name: build_head(config, spec) for spec in heads})
        self.extensions: dict[str, tuple[str, dict[str, Any]]] = {}

    @property
    def word_embeddings(self) -> nn.Embedding:
        return self.embeddings

    def embed(self, input_ids: Tensor) -> Tensor:
        x = self.embeddings(input_ids)
        return x * self.config.embedding_scale if self.config.embedding_scale != 1.0 else x

    def mixed_states(self, out: ModelOutput, keep_states: bool) -> Tensor:
        """What the heads read: the mix of `out.hidden_states` under a scalar mix (`self.mix`, a decoder's or an
        encoder stack's; dropped from `out` unless the caller asked for them), else the last hidden state."""
        if self.mix is None:
            return out.last_hidden_state
        assert out.hidden_states is not None
        mixed = self.mix(out.hidden_states)
        if not keep_states:
            out.hidden_states = None
        return mixed

    def run_heads(self, out: ModelOutput, attention_mask: Tensor, masked_positions: Tensor | None,
                  input_ids: Tensor | None = None, hidden: Tensor | None = None) -> None:
        """The heads on `hidden` (default: the last hidden state)."""
        if not self.head_specs:
            return
        inputs = HeadInputs(hidden=out.last_hidden_state if hidden is None else hidden, attention_mask=attention_mask,
                            word_embeddings=self.embeddings.weight, masked_positions=masked_positions,
                            input_ids=input_ids, logit_scale=self.config.logit_scale)
        for spec in self.head_specs:
            out.head_logits[spec.name] = self.heads[spec.name](inputs)
        out.logits = out.head_logits[self.head_specs[0].name]

    def add_extension(self, where: str, factory: str, **options: Any) -> nn.Module:
        return add_extension(self, where, factory, **options)

    @torch.no_grad()
    def init_weights(self, generator: torch.Generator | None = None) -> None:
        """BERT's initialisation (bertology.model.blocks.init_parameters) and zero vocabulary biases."""
        init_parameters(self, self.config.initializer_range, generator)
        for head in self.heads.values():
            if isinstance(head, (MaskedLMHead, TiedLMBiasHead)):
                head.bias.zero_()


class DecoderModel(TransformerModel):
    """A causal decoder (GPT-style) with heads; the first head is the primary one (`logits`)."""

    capabilities = frozenset({GENERATES, DECODER_ONLY})

    def __init__(self, config: TransformerConfig, heads: Sequence[HeadSpec] = ()) -> None:
        super().__init__(config, heads)
        self.decoder = Stack(config, config.num_layers, causal=True, cross_attention=False)
        # An optional mix of the embedding output and every block's output (ELMo's scalar mix, the extension
        # "scalar_mix" at "mix"): the heads then read it instead of the last state.
        self.mix: nn.Module | None = None

    def blocks(self) -> list[nn.Module]:
        return list(self.decoder.layers)

    def forward_inputs(self, batch: Any) -> dict[str, Any]:
        inputs = {"input_ids": batch.input_ids, "attention_mask": batch.attention_mask,
                  "masked_positions": getattr(batch, "masked_positions", None),
                  "layout": getattr(batch, "layout", None)}
        for name in ("documents", "lm_prefix"):  # packed documents, a prefix LM's prefix (bertology.data.causal)
            value = getattr(batch, name, None)
            if value is not None:
                inputs[name] = value
        return inputs

    def layer_states(self, input_ids: Tensor, attention_mask: Tensor,
                     token_type_ids: Tensor | None = None) -> tuple[Tensor, ...]:
        """The contextual representations embed and the analyses read: the embedding output, then every block's
        (the last after the final norm), [B, L, H] each."""
        check_ids(input_ids, self.config.vocab_size)
        states = self.decoder(self.embed(input_ids), attention_mask, output_hidden_states=True)[1]
        assert states is not None
        return states

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None, *, labels: Tensor | None = None,
                past_key_values: list[KVCache] | None = None, use_cache: bool = False,
                masked_positions: Tensor | None = None, output_hidden_states: bool = False,
                packed: bool = True, last_layer_at: Tensor | None = None,
                documents: Tensor | None = None, lm_prefix: Tensor | None = None,
                layout: Layout | None = None) -> ModelOutput:
        """`attention_mask` [B, past + L] covers the cached positions too (as transformers'). `labels` [B, L]: the
        loss of predicting token t + 1 at position t (-100 ignored). `masked_positions` [N, 2]: logits only there.
        With `use_cache`, `past_key_values` holds the cache after this call (a new one when none was given).
        `last_layer_at`: where the caller reads the last layer (the Model protocol lets a model skip the rest); a
        language model reads nearly every position, so this one computes them all. `documents` [B, L]: several
        documents packed in each row (see `Stack.forward`); `labels` then ignore the boundaries only if the caller
        sets the first label of each document to -100. `lm_prefix` [B, past + L] bool: a prefix LM's prefix, seen in
        both directions by its own tokens (causal after it). `layout`: the packing of `attention_mask` and
        `documents`, built already (see `Stack.forward`)."""
        check_ids(input_ids, self.config.vocab_size)
        caches = past_key_values
        if use_cache and caches is None:
            caches = [KVCache() for _ in self.decoder.layers]
        past = caches[0].length if caches else 0
        if attention_mask is None:
            attention_mask = torch.ones(input_ids.shape[0], past + input_ids.shape[1], dtype=torch.long,
                                        device=input_ids.device)
        if self.config.prefix_lm and lm_prefix is None and past == 0:
            lm_prefix = attention_mask.bool()
        hidden, hidden_states = self.decoder(self.embed(input_ids), attention_mask, caches=caches, packed=packed,
                                             output_hidden_states=output_hidden_states or self.mix is not None,
                                             documents=documents, lm_prefix=lm_prefix, layout=layout)
        out = ModelOutput(last_hidden_state=hidden, hidden_states=hidden_states,
                          past_key_values=caches if use_cache else None)
        self.run_heads(out, attention_mask[:, -input_ids.shape[1]:], masked_positions,
                       hidden=self.mixed_states(out, output_hidden_states))
        if labels is not None and out.logits is not None and masked_positions is None:
            out.loss = lm_loss(out.logits[:, :-1], labels[:, 1:])
        return out


def shift_right(labels: Tensor, start: int, pad: int) -> Tensor:
    """Decoder inputs from labels: the start token, then the labels but the last, -100 replaced by padding."""
    out = labels.new_full(labels.shape, pad)
    out[:, 1:] = labels[:, :-1]
    out[:, 0] = start
    return out.masked_fill(out == -100, pad)


class Seq2SeqModel(TransformerModel):
    """An encoder-decoder (BART/T5-style) sharing one token embedding; the decoder cross-attends to the encoder's
    last hidden state."""

    capabilities = frozenset({GENERATES, ENCODER_DECODER})

    def __init__(self, config: TransformerConfig, heads: Sequence[HeadSpec] = ()) -> None:
        super().__init__(config, heads)
        self.encoder = Stack(config, config.num_layers, causal=False, cross_attention=False)
        self.decoder = Stack(config, config.num_decoder_layers or config.num_layers, causal=True, cross_attention=True)

    def blocks(self) -> list[nn.Module]:
        return [*self.encoder.layers, *self.decoder.layers]

    def forward_inputs(self, batch: Any) -> dict[str, Any]:
        """A training batch's encoder and decoder inputs (the decoder's its own `decoder_input_ids`, else the input
        shifted right where the config says so) and `masked_positions`. A batch's `labels` are its objectives' to
        read (class ids, token labels): the objectives take the loss from the heads' logits."""
        return {"input_ids": batch.input_ids, "attention_mask": batch.attention_mask,
                "decoder_input_ids": getattr(batch, "decoder_input_ids", None),
                "decoder_attention_mask": getattr(batch, "decoder_attention_mask", None),
                "masked_positions": getattr(batch, "masked_positions", None),
                "layout": getattr(batch, "layout", None), "decoder_layout": getattr(batch, "decoder_layout", None)}

    def layer_states(self, input_ids: Tensor, attention_mask: Tensor,
                     token_type_ids: Tensor | None = None) -> tuple[Tensor, ...]:
        """The encoder's contextual representations (what embed and the analyses read): the embedding output, then
        every encoder block's (the last after the final norm), [B, L, H] each."""
        check_ids(input_ids, self.config.vocab_size)
        states = self.encoder(self.embed(input_ids), attention_mask, output_hidden_states=True)[1]
        assert states is not None
        return states

    def encode(self, input_ids: Tensor, attention_mask: Tensor | None = None, packed: bool = True,
               layout: Layout | None = None) -> Tensor:
        check_ids(input_ids, self.config.vocab_size)
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        return self.encoder(self.embed(input_ids), attention_mask, packed=packed, layout=layout)[0]

    def forward(self, input_ids: Tensor | None = None, attention_mask: Tensor | None = None,
                decoder_input_ids: Tensor | None = None, decoder_attention_mask: Tensor | None = None, *,
                encoder_outputs: Tensor | None = None, labels: Tensor | None = None,
                past_key_values: list[KVCache] | None = None, use_cache: bool = False,
                masked_positions: Tensor | None = None, packed: bool = True,
                last_layer_at: Tensor | None = None, layout: Layout | None = None,
                decoder_layout: Layout | None = None) -> ModelOutput:
        """`labels` [B, L_dec]: the loss of each decoder position (-100 ignored); without `decoder_input_ids` they
        are the labels shifted right behind `decoder_start_token_id`. `encoder_outputs`: the encoder's last hidden
        state from an earlier call (decoding step by step). `last_layer_at` (the Model protocol's): every decoder
        position is computed. `layout`, `decoder_layout`: the packings of the two masks, built already (Stack);
        without a cache the encoder's packs the memory too, so that cross-attention projects its real tokens alone."""
        if encoder_outputs is None:
            if input_ids is None:
                raise InputError("give input_ids or encoder_outputs")
            check_ids(input_ids, self.config.vocab_size)
        if attention_mask is None:
            source = encoder_outputs if encoder_outputs is not None else input_ids
            assert source is not None
            attention_mask = torch.ones(source.shape[:2], dtype=torch.long, device=source.device)
        packed_memory = packed and past_key_values is None and not use_cache
        if layout is None and packed_memory:  # one layout for the encoder and the decoder's cross-attention
            layout = Layout(attention_mask)
        if decoder_input_ids is None:
            shifted = labels if labels is not None else input_ids if self.config.shifted_decoder_inputs else None
            if shifted is None:
                raise InputError("give decoder_input_ids or labels")
            start = self.config.decoder_start_token_id
            if start is None:
                raise ConfigError("decoder_start_token_id is not set: decoder inputs cannot be made from "
                                  f"{'labels' if labels is not None else 'input_ids'}")
            decoder_input_ids = shift_right(shifted, start, self.config.pad_token_id)
        check_ids(decoder_input_ids, self.config.vocab_size, "decoder_input_ids")
        if encoder_outputs is None:
            assert input_ids is not None
            # Both sides' tokens in one lookup: the table's gradient is then one scatter into a [V, H] matrix (and
            # one sum with the tied head's) instead of two.
            both = self.embed(torch.cat([input_ids.reshape(-1), decoder_input_ids.reshape(-1)]))
            source, target = both.split([input_ids.numel(), decoder_input_ids.numel()])
            encoder_outputs = self.encoder(source.view(*input_ids.shape, -1), attention_mask, packed=packed,
                                           layout=layout)[0]
            embedded = target.view(*decoder_input_ids.shape, -1)
        else:
            embedded = self.embed(decoder_input_ids)
        caches = past_key_values
        if use_cache and caches is None:
            caches = [KVCache() for _ in self.decoder.layers]
        past = caches[0].length if caches else 0
        if decoder_attention_mask is None:
            decoder_attention_mask = torch.ones(decoder_input_ids.shape[0], past + decoder_input_ids.shape[1],
                                                dtype=torch.long, device=decoder_input_ids.device)
        hidden, _ = self.decoder(embedded, decoder_attention_mask, memory=encoder_outputs,
                                 memory_mask=attention_mask, caches=caches, packed=packed, layout=decoder_layout,
                                 memory_layout=layout if packed_memory else None)
        out = ModelOutput(last_hidden_state=hidden, encoder_last_hidden_state=encoder_outputs,
                          past_key_values=caches if use_cache else None)
        # Heads that pick tokens by id (BART's classifier: the last EOS) read the encoder's input_ids.
        self.run_heads(out, decoder_attention_mask[:, -decoder_input_ids.shape[1]:], masked_positions, input_ids)
        if labels is not None and out.logits is not None and masked_positions is None:
            out.loss = lm_loss(out.logits, labels)
        return out


class EncoderStackModel(TransformerModel):
    """An encoder-decoder's encoder side alone (T5EncoderModel): the token embeddings and a bidirectional `Stack`,
    named as in `Seq2SeqModel`, so that a seq2seq checkpoint's encoder loads into it; also a bidirectional encoder of
    its own (ModernBERT), fill-mask with its masked-LM head."""

    @property
    def capabilities(self) -> frozenset[str]:
        return frozenset({MASKED_LM}) if "mlm" in self.heads else frozenset()

    def __init__(self, config: TransformerConfig, heads: Sequence[HeadSpec] = ()) -> None:
        super().__init__(config, heads)
        self.encoder = Stack(config, config.num_layers, causal=False, cross_attention=False)
        self.mix: nn.Module | None = None  # as DecoderModel's, over the encoder's states

    def blocks(self) -> list[nn.Module]:
        return list(self.encoder.layers)

    def forward_inputs(self, batch: Any) -> dict[str, Any]:
        return {"input_ids": batch.input_ids, "attention_mask": batch.attention_mask,
                "masked_positions": getattr(batch, "masked_positions", None),
                "layout": getattr(batch, "layout", None)}

    def layer_states(self, input_ids: Tensor, attention_mask: Tensor,
                     token_type_ids: Tensor | None = None) -> tuple[Tensor, ...]:
        """The embedding output, then every block's (the last after the final norm), [B, L, H] each."""
        return self(input_ids, attention_mask, token_type_ids,  # type: ignore[return-value]
                    output_hidden_states=True).hidden_states

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None,
                token_type_ids: Tensor | None = None, *, masked_positions: Tensor | None = None,
                output_hidden_states: bool = False, packed: bool = True, last_layer_at: Tensor | None = None,
                layout: Layout | None = None, output_attentions: bool = False) -> ModelOutput:
        """`token_type_ids`: the stack has no token types, so only zeros (or none) are taken (callers that frame a
        pair pass its segments; the model reads the pair from its separators). `last_layer_at` (the Model
        protocol's): every position is computed. `layout`: the packing of `attention_mask`, built already."""
        check_ids(input_ids, self.config.vocab_size)
        if token_type_ids is not None and input_ids.device.type == "cpu" and bool(token_type_ids.any()):
            raise InputError("token_type_ids: this model has no token type embeddings; give zeros or none")
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        attentions: list[Tensor] | None = [] if output_attentions else None
        hidden, states = self.encoder(self.embed(input_ids), attention_mask, packed=packed, layout=layout,
                                      output_hidden_states=output_hidden_states or self.mix is not None,
                                      attentions=attentions)
        out = ModelOutput(last_hidden_state=hidden, hidden_states=states,
                          attentions=tuple(attentions) if attentions is not None else None)
        self.run_heads(out, attention_mask, masked_positions, hidden=self.mixed_states(out, output_hidden_states))
        return out


register_model("decoder", DecoderModel)
register_model("seq2seq", Seq2SeqModel)
register_model("encoder-stack", EncoderStackModel)
