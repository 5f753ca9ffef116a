"""Causal decoders and encoder-decoders as thin wrappers over the one `Stack` (bertology.model.stack): `DecoderModel`
(GPT-style, a causal stack with a key/value cache) and `Seq2SeqModel` (BART/T5-style: a bidirectional and a causal,
cross-attending stack sharing the model's token table; its encoder alone is the one bidirectional model,
bertology.model.encoder.EncoderModel). A family is a `TransformerConfig` (norm placement and kind, gated or dense
feed-forward, biases, position kind, embedding scale) plus its checkpoint tables; no family has a class here.

    x_0 = s * E_word[w] (+ E_pos[p]) (-> Norm if embedding_norm)
    x_l = Block_l(x_{l-1})              causal self-attention (decoder), + cross-attention over the encoder's output
    h   = Norm(x_N) if final_norm

Forward passes take transformers' keyword names (input_ids, attention_mask, decoder_input_ids,
decoder_attention_mask, labels, past_key_values, use_cache) and return logits and the cache under the same names."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from bertology.errors import ConfigError, InputError
from bertology.model.base import BaseModel
from bertology.model.blocks import KVCache, init_parameters
from bertology.model.config import DEFAULT_ROTARY_THETA, TransformerConfig  # noqa: F401  (the family tables')
from bertology.model.encoder import EncoderModel
from bertology.model.heads import HeadInputs, HeadSpec, MaskedLMHead, TiedLMBiasHead
from bertology.model.packing import Layout
from bertology.model.protocol import (
    BLOCKS,
    DECODER_ONLY,
    ENCODER_DECODER,
    GENERATES,
    LORA,
    SCALAR_MIX,
    check_id_range,
)
from bertology.model.stack import (  # noqa: F401  (re-exported: the decoders' position helpers)
    Stack,
    StackOutput,
    position_ids_from_mask,
    position_ids_in_documents,
)


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


def check_ids(input_ids: Tensor, vocab_size: int, what: str = "input_ids") -> None:
    if input_ids.dim() != 2:
        raise InputError(f"{what} must be [batch, length], got shape {tuple(input_ids.shape)}")
    check_id_range(input_ids, vocab_size, what)


def lm_loss(logits: Tensor, labels: Tensor) -> Tensor:
    """Mean cross-entropy over the labels that are not -100 (transformers' convention)."""
    return F.cross_entropy(logits.flatten(0, -2).float(), labels.flatten(), ignore_index=-100)


class TransformerModel(BaseModel):
    """What decoders and encoder-decoders share: token embeddings, heads, extensions and initialisation."""

    config_class = TransformerConfig
    CAPABILITIES = frozenset({LORA, BLOCKS})
    lora_targets = ("query", "key", "value", "attn_out", "cross_query", "cross_key", "cross_value", "cross_out",
                    "ffn_in", "ffn_gate", "ffn_out")

    def __init__(self, config: TransformerConfig, heads: Sequence[HeadSpec]) -> None:
        super().__init__(config)
        self.embeddings = nn.Embedding(config.vocab_size, config.hidden_size)
        self.init_heads(heads)

    @property
    def word_embeddings(self) -> nn.Embedding:
        return self.embeddings

    def embed(self, input_ids: Tensor) -> Tensor:
        x = self.embeddings(input_ids)
        return x * self.config.embedding_scale if self.config.embedding_scale != 1.0 else x

    def run_heads(self, out: ModelOutput, attention_mask: Tensor, masked_positions: Tensor | None,
                  input_ids: Tensor | None = None, hidden: Tensor | None = None) -> None:
        """The heads on `hidden` (default: the last hidden state)."""
        if not self.head_specs:
            return
        self.apply_heads(out, HeadInputs(
            hidden=out.last_hidden_state if hidden is None else hidden, attention_mask=attention_mask,
            word_embeddings=self.embeddings.weight, masked_positions=masked_positions, input_ids=input_ids,
            logit_scale=self.config.logit_scale))

    @torch.no_grad()
    def init_weights(self, generator: torch.Generator | None = None) -> None:
        """The family's initialisation where its checkpoint table has one (T5's: bertology.model.families.t5),
        else BERT's (bertology.model.blocks.init_parameters) and zero vocabulary biases."""
        from bertology.model.convert import family_init  # the tables import the model classes

        init = family_init(self.config.family)
        if init is not None:
            init(self, generator)
            return
        init_parameters(self, self.config.initializer_range, generator)
        for head in self.heads.values():
            if isinstance(head, (MaskedLMHead, TiedLMBiasHead)):
                head.bias.zero_()


class DecoderModel(TransformerModel):
    """A causal decoder (GPT-style) with heads; the first head is the primary one (`logits`)."""

    CAPABILITIES = TransformerModel.CAPABILITIES | {GENERATES, DECODER_ONLY, SCALAR_MIX}

    def __init__(self, config: TransformerConfig, heads: Sequence[HeadSpec] = ()) -> None:
        super().__init__(config, heads)
        self.decoder = Stack(config, causal=True)

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
        states = self.decoder(self.embed(input_ids), attention_mask, output_hidden_states=True).hidden_states
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
            caches = [KVCache() for _ in self.decoder.plan]
        past = caches[0].length if caches else 0
        if attention_mask is None:
            attention_mask = torch.ones(input_ids.shape[0], past + input_ids.shape[1], dtype=torch.long,
                                        device=input_ids.device)
        if self.config.prefix_lm and lm_prefix is None and past == 0:
            lm_prefix = attention_mask.bool()
        hidden, hidden_states, _ = self.decoder(self.embed(input_ids), attention_mask, caches=caches, packed=packed,
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

    CAPABILITIES = TransformerModel.CAPABILITIES | {GENERATES, ENCODER_DECODER}

    def __init__(self, config: TransformerConfig, heads: Sequence[HeadSpec] = ()) -> None:
        super().__init__(config, heads)
        self.encoder = Stack(config)
        self.decoder = Stack(config, config.decoder_depth, causal=True, cross_attention=True)

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
        states = self.encoder(self.embed(input_ids), attention_mask, output_hidden_states=True).hidden_states
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
            caches = [KVCache() for _ in self.decoder.plan]
        past = caches[0].length if caches else 0
        if decoder_attention_mask is None:
            decoder_attention_mask = torch.ones(decoder_input_ids.shape[0], past + decoder_input_ids.shape[1],
                                                dtype=torch.long, device=decoder_input_ids.device)
        hidden = self.decoder(embedded, decoder_attention_mask, memory=encoder_outputs,
                              memory_mask=attention_mask, caches=caches, packed=packed, layout=decoder_layout,
                              memory_layout=layout if packed_memory else None).last_hidden_state
        out = ModelOutput(last_hidden_state=hidden, encoder_last_hidden_state=encoder_outputs,
                          past_key_values=caches if use_cache else None)
        # Heads that pick tokens by id (BART's classifier: the last EOS) read the encoder's input_ids.
        self.run_heads(out, decoder_attention_mask[:, -decoder_input_ids.shape[1]:], masked_positions, input_ids)
        if labels is not None and out.logits is not None and masked_positions is None:
            out.loss = lm_loss(out.logits, labels)
        return out


# A tagger fine-tunes an encoder-decoder's encoder alone: the one bidirectional model, holding the token table as the
# encoder-decoder does (its config's stack_embeddings is false), so that the checkpoint's encoder loads into it.
Seq2SeqModel.encoder_alone = EncoderModel
