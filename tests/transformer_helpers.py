"""Decoders and encoder-decoders assembled from the shared parts with weights copied by hand from random transformers
models (GPT-2, T5), for tests that compare the two: the parts, generation."""

from __future__ import annotations

from typing import Any

import torch

from bertology.model import HeadSpec
from bertology.model.transformer import DecoderModel, Seq2SeqModel, TransformerConfig


def tiny_config(**overrides: Any) -> TransformerConfig:
    values = dict(vocab_size=50, hidden_size=16, num_layers=2, num_heads=2, intermediate_size=32,
                  max_position_embeddings=32, hidden_dropout=0.0, attention_dropout=0.0, decoder_start_token_id=0)
    values.update(overrides)
    return TransformerConfig.decoder(**values)


def gpt2_state_dict(hf: torch.nn.Module) -> dict[str, torch.Tensor]:
    """A GPT2LMHeadModel's weights under a DecoderModel's names (the fused, transposed c_attn split in three)."""
    sd, state = hf.state_dict(), {}
    state["embeddings.weight"], state["decoder.positions.weight"] = sd["transformer.wte.weight"], sd["transformer.wpe.weight"]
    for i in range(hf.config.n_layer):
        hf_layer, layer = f"transformer.h.{i}.", f"decoder.layers.{i}."
        for part, name in (("query", 0), ("key", 1), ("value", 2)):
            state[f"{layer}{part}.weight"] = sd[hf_layer + "attn.c_attn.weight"].chunk(3, 1)[name].T
            state[f"{layer}{part}.bias"] = sd[hf_layer + "attn.c_attn.bias"].chunk(3)[name]
        for ours_name, theirs in (("attn_out", "attn.c_proj"), ("ffn_in", "mlp.c_fc"), ("ffn_out", "mlp.c_proj")):
            state[f"{layer}{ours_name}.weight"], state[f"{layer}{ours_name}.bias"] = (
                sd[hf_layer + theirs + ".weight"].T, sd[hf_layer + theirs + ".bias"])
        for ours_name, theirs in (("attn_norm", "ln_1"), ("ffn_norm", "ln_2")):
            for p in ("weight", "bias"):
                state[f"{layer}{ours_name}.{p}"] = sd[f"{hf_layer}{theirs}.{p}"]
    for p in ("weight", "bias"):
        state[f"decoder.final_norm.{p}"] = sd[f"transformer.ln_f.{p}"]
    return state


def t5_state_dict(hf: torch.nn.Module) -> dict[str, torch.Tensor]:
    """A T5ForConditionalGeneration's (tied) weights under a Seq2SeqModel's names."""
    sd = hf.state_dict()
    gated = hf.config.is_gated_act
    state = {"embeddings.weight": sd["shared.weight"]}
    for side, depth in (("encoder", hf.config.num_layers), ("decoder", hf.config.num_decoder_layers)):
        state[f"{side}.relative.embedding.weight"] = sd[f"{side}.block.0.layer.0.SelfAttention.relative_attention_bias.weight"]
        state[f"{side}.final_norm.weight"] = sd[f"{side}.final_layer_norm.weight"]
        for i in range(depth):
            block, layer = f"{side}.block.{i}.layer.", f"{side}.layers.{i}."
            parts = [("", 0, "SelfAttention", "attn")]
            if side == "decoder":
                parts.append(("cross_", 1, "EncDecAttention", "cross"))
            for prefix, index, name, norm in parts:
                for ours_name, theirs in (("query", "q"), ("key", "k"), ("value", "v")):
                    state[f"{layer}{prefix}{ours_name}.weight"] = sd[f"{block}{index}.{name}.{theirs}.weight"]
                state[f"{layer}{'cross_out' if prefix else 'attn_out'}.weight"] = sd[f"{block}{index}.{name}.o.weight"]
                state[f"{layer}{norm}_norm.weight"] = sd[f"{block}{index}.layer_norm.weight"]
            ffn = len(parts)
            if gated:
                state[f"{layer}ffn_gate.weight"] = sd[f"{block}{ffn}.DenseReluDense.wi_0.weight"]
                state[f"{layer}ffn_in.weight"] = sd[f"{block}{ffn}.DenseReluDense.wi_1.weight"]
            else:
                state[f"{layer}ffn_in.weight"] = sd[f"{block}{ffn}.DenseReluDense.wi.weight"]
            state[f"{layer}ffn_out.weight"] = sd[f"{block}{ffn}.DenseReluDense.wo.weight"]
            state[f"{layer}ffn_norm.weight"] = sd[f"{block}{ffn}.layer_norm.weight"]
    return state


def gpt2_pair(vocab_size: int = 60, positions: int = 32, layers: int = 2, **hf_options: Any) -> tuple[Any, DecoderModel]:
    """A random GPT2LMHeadModel (no dropout) and the DecoderModel holding its weights, both in eval mode."""
    from transformers import GPT2Config, GPT2LMHeadModel

    hf = GPT2LMHeadModel(GPT2Config(vocab_size=vocab_size, n_positions=positions, n_embd=16, n_layer=layers, n_head=2,
                                    resid_pdrop=0, embd_pdrop=0, attn_pdrop=0, **hf_options)).eval()
    ours = DecoderModel(tiny_config(vocab_size=vocab_size, hidden_size=16, num_layers=layers, intermediate_size=64,
                                    max_position_embeddings=positions, hidden_act="gelu_new",
                                    bos_token_id=hf.config.bos_token_id, eos_token_id=hf.config.eos_token_id),
                        [HeadSpec("lm", "tied_lm")]).eval()
    ours.load_state_dict(gpt2_state_dict(hf))
    return hf, ours


def t5_pair(gated: bool = False, vocab_size: int = 40, **hf_options: Any) -> tuple[Any, Seq2SeqModel]:
    """A random T5ForConditionalGeneration (tied, no dropout; v1.1's gated GELU when `gated`) and the Seq2SeqModel
    holding its weights, both in eval mode."""
    from transformers import T5Config, T5ForConditionalGeneration

    options = dict(decoder_start_token_id=0)
    options.update(hf_options)
    hf = T5ForConditionalGeneration(T5Config(
        vocab_size=vocab_size, d_model=16, d_kv=4, d_ff=24, num_layers=2, num_decoder_layers=2, num_heads=3,
        relative_attention_num_buckets=8, relative_attention_max_distance=20, dropout_rate=0.0,
        feed_forward_proj="gated-gelu" if gated else "relu", tie_word_embeddings=True, **options,
    )).eval()
    config = tiny_config(vocab_size=vocab_size, hidden_size=16, num_heads=3, attention_head_size=4,
                         intermediate_size=24, positions="relative", relative_attention_num_buckets=8,
                         relative_attention_max_distance=20, norm="rmsnorm", layer_norm_eps=1e-6, pre_norm=True,
                         gated_ffn=gated, bias=False, attention_scale=1.0, hidden_act="gelu_new" if gated else "relu",
                         logit_scale=16 ** -0.5, pad_token_id=hf.config.pad_token_id,
                         eos_token_id=hf.config.eos_token_id, decoder_start_token_id=hf.config.decoder_start_token_id)
    ours = Seq2SeqModel(config, [HeadSpec("lm", "tied_lm")]).eval()
    ours.load_state_dict(t5_state_dict(hf))
    return hf, ours
