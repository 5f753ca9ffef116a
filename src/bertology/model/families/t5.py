"""T5: transformers' T5Model, T5ForConditionalGeneration, T5ForSequenceClassification, T5ForQuestionAnswering (each a
Seq2SeqModel) and T5EncoderModel (an EncoderModel holding the token table, as the Seq2SeqModel does:
`stack_embeddings` false).

The sequence classifier is BART's head (`families.bart.EOS_CLASSIFIER`: dense -> tanh -> out_proj on the decoder's
state at the input's last EOS), stored beside a T5Model under `transformer.` (`prefixes`); the question-answering
head puts `qa_outputs` on every decoder token, the base model at the top as in T5ForConditionalGeneration. Both read
the decoder over the input shifted right behind the start token when no decoder inputs are given
(`shifted_decoder_inputs`, as transformers' two classes do; its T5Model and T5ForConditionalGeneration ask for them
instead).

v1.0 has a ReLU feed-forward (`DenseReluDense.wi`), v1.1 a gated-GELU one (`wi_0` the gated branch, our `ffn_gate`;
`wi_1` our `ffn_in`). The language-model head is tied to `shared` and reads the decoder output scaled by
d_model ** -0.5 unless config.json says otherwise (`scale_decoder_outputs`, or before it `tie_word_embeddings`
false, as v1.1 checkpoints say); a checkpoint whose `lm_head.weight` differs from `shared.weight` builds an untied
head of kind "lm" (transformers unties them then too). Every block stores the relative-position table in block 0
only (one table per stack, shared by its layers); `encoder.embed_tokens` and `decoder.embed_tokens` are copies of
`shared`, accepted on reading and not written.

A fresh T5 is initialised as T5's own code initialises it (`init_weights`), not as BERT: every weight is drawn with
a standard deviation set by its fan-in, so that unit-scale inputs give unit-scale outputs, and the token embeddings
are N(0, 1) (the tied head's d_model ** -0.5 output scale then gives unit-scale logits)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from bertology.errors import ConfigError
from bertology.model.convert import CheckpointFamily, ConfigKey, Head, Tie, WeightEntry, linear, renamed_keys
from bertology.model.config import DECODER_DEFAULTS, TransformerConfig
from bertology.model.families.bart import EOS_CLASSIFIER
from bertology.model.families.bert import QA
from bertology.model.heads import LMHead

# Activations a feed_forward_proj may name ("ACT" or "gated-ACT"), as transformers' T5 reads them.
ACTIVATIONS = ("relu", "gelu", "gelu_new", "gelu_pytorch_tanh", "silu", "swish")


def parse_projection(value: Any) -> tuple[str, bool]:
    """feed_forward_proj -> (activation, gated); "gated-gelu" is the tanh-approximated GELU, as in transformers."""
    parts = value.split("-") if isinstance(value, str) else []
    if not parts or len(parts) > 2 or (len(parts) == 2 and parts[0] != "gated") or parts[-1] not in ACTIVATIONS:
        raise ConfigError(f"unsupported feed-forward projection {value!r}; expected ACT or gated-ACT with ACT one of "
                          f"{', '.join(ACTIVATIONS)} (e.g. 'relu' for T5 v1.0, 'gated-gelu' for v1.1)")
    return ("gelu_new" if value == "gated-gelu" else parts[-1]), len(parts) == 2


def projection(config: TransformerConfig) -> str:
    act = config.hidden_act
    if config.gated_ffn:
        return "gated-gelu" if act in ("gelu_new", "gelu_pytorch_tanh") else f"gated-{act}"
    return act


def logit_scale(hf: Mapping[str, Any]) -> float:
    """d_model ** -0.5 when the decoder output is scaled before the vocabulary projection, else 1."""
    scaled = hf.get("scale_decoder_outputs")
    if scaled is None:
        scaled = hf.get("tie_word_embeddings") is not False
    return float(hf.get("d_model", DEFAULTS["hidden_size"])) ** -0.5 if scaled else 1.0


def keep(value: Any, config: Any) -> None:
    """A second field read from one key: written by the first."""
    return None


# Our TransformerConfig field -> T5's config.json key.
KEYS = {
    "vocab_size": "vocab_size",
    "hidden_size": "d_model",
    "attention_head_size": "d_kv",
    "intermediate_size": "d_ff",
    "num_layers": "num_layers",
    "num_decoder_layers": "num_decoder_layers",
    "num_heads": "num_heads",
    "relative_attention_num_buckets": "relative_attention_num_buckets",
    "relative_attention_max_distance": "relative_attention_max_distance",
    "hidden_dropout": "dropout_rate",
    "layer_norm_eps": "layer_norm_epsilon",
    "classifier_dropout": "classifier_dropout",
    "pad_token_id": "pad_token_id",
    "eos_token_id": "eos_token_id",
    "decoder_start_token_id": "decoder_start_token_id",
}
CONFIG_KEYS = (
    *renamed_keys(KEYS),
    ConfigKey("attention_dropout", "dropout_rate", write=keep),
    # T5's one dropout_rate is also the feed-forward's, after its activation (DenseReluDense: wi -> act -> dropout
    # -> wo; the gated one after act(wi_0) * wi_1).
    ConfigKey("activation_dropout", "dropout_rate", write=keep),
    ConfigKey("hidden_act", "feed_forward_proj", read=lambda v, hf: parse_projection(v)[0],
              write=lambda v, config: projection(config)),
    ConfigKey("gated_ffn", "feed_forward_proj", read=lambda v, hf: parse_projection(v)[1], write=keep),
    ConfigKey("logit_scale", "d_model", read=lambda v, hf: logit_scale(hf), write=keep),
    ConfigKey("logit_scale", "scale_decoder_outputs", read=lambda v, hf: logit_scale(hf),
              write=lambda v, config: v != 1.0),
    # Read as transformers before scale_decoder_outputs did; written so that those versions scale alike.
    ConfigKey("logit_scale", "tie_word_embeddings", read=lambda v, hf: logit_scale(hf),
              write=lambda v, config: v != 1.0),
)
# T5Config's defaults, for keys a config.json leaves out.
DEFAULTS = {
    "vocab_size": 32128, "hidden_size": 512, "attention_head_size": 64, "intermediate_size": 2048, "num_layers": 6,
    "num_heads": 8, "relative_attention_num_buckets": 32, "relative_attention_max_distance": 128,
    "hidden_dropout": 0.1, "attention_dropout": 0.1, "activation_dropout": 0.1, "layer_norm_eps": 1e-6,
    "hidden_act": "relu", "gated_ffn": False, "logit_scale": 512 ** -0.5, "pad_token_id": 0, "eos_token_id": 1,
    "decoder_start_token_id": 0,
}
# What every T5 is and config.json does not say.
FIXED = {"positions": "relative", "norm": "rmsnorm", "pre_norm": True, "bias": False, "attention_scale": 1.0,
         "final_norm": True, "final_dropout": True, "embedding_norm": False, "embedding_scale": 1.0,
         "shifted_decoder_inputs": True}


def stack(side: str, layers: str, cross: bool) -> tuple[WeightEntry, ...]:
    """One stack's weights: every block's sublayers (self-attention, cross-attention in the decoder, feed-forward),
    block 0's relative-position table and the final norm."""
    block, ours = f"{side}.block.{{i}}.layer", f"{side}.layers.{{i}}"
    ffn = 2 if cross else 1

    def weight(our: str, theirs: str, when: str | None = None) -> WeightEntry:
        return WeightEntry((f"{ours}.{our}.weight",), (f"{block}.{theirs}.weight",), when=when, layers=layers)

    attention = [("", 0, "SelfAttention", "attn")] + ([("cross_", 1, "EncDecAttention", "cross")] if cross else [])
    entries = []
    for prefix, index, name, norm in attention:
        entries += [weight(f"{prefix}{our}", f"{index}.{name}.{theirs}")
                    for our, theirs in (("query", "q"), ("key", "k"), ("value", "v"))]
        entries += [weight(f"{'cross_out' if prefix else 'attn_out'}", f"{index}.{name}.o"),
                    weight(f"{norm}_norm", f"{index}.layer_norm")]
    entries += [
        weight("ffn_in", f"{ffn}.DenseReluDense.wi", when="not gated_ffn"),
        weight("ffn_gate", f"{ffn}.DenseReluDense.wi_0", when="gated_ffn"),
        weight("ffn_in", f"{ffn}.DenseReluDense.wi_1", when="gated_ffn"),
        weight("ffn_out", f"{ffn}.DenseReluDense.wo"),
        weight("ffn_norm", f"{ffn}.layer_norm"),
        *linear(f"{side}.relative.embedding", f"{side}.block.0.layer.0.SelfAttention.relative_attention_bias",
                ("weight",)),
        *linear(f"{side}.final_norm", f"{side}.final_layer_norm", ("weight",)),
        WeightEntry(("embeddings.weight",), (f"{side}.embed_tokens.weight",), Tie(check=True)),
    ]
    return tuple(entries)


WEIGHTS = (
    *linear("embeddings", "shared", ("weight",)),
    *stack("encoder", "num_layers", cross=False),
    *stack("decoder", "decoder_depth", cross=True),
)

def run_defaults(values: Mapping[str, Any], run: Any) -> dict[str, Any]:
    """A T5 pretrained from scratch: d_kv and the tied head's output scale follow the width, the decoder is as deep
    as the encoder and starts from the padding token, and the feed-forward's activation is dropped out at
    ``model.hidden_dropout`` (T5Config's rules: one dropout_rate)."""
    return {"attention_head_size": values["hidden_size"] // values["num_heads"],
            "activation_dropout": values["hidden_dropout"],
            "logit_scale": values["hidden_size"] ** -0.5, "num_decoder_layers": values["num_layers"],
            "classifier_dropout": 0.0, "decoder_start_token_id": run.fill_id}


QUERIES = ("query", "cross_query")


@torch.no_grad()
def init_weights(model: nn.Module, generator: torch.Generator | None = None) -> None:
    """T5's initialisation (Mesh TensorFlow's, as transformers' T5PreTrainedModel draws it): token embeddings
    N(0, 1); in every block the query N(0, (d_model * d_kv) ** -0.5), key and value N(0, d_model ** -0.5), the
    attention output N(0, (heads * d_kv) ** -0.5), the feed-forward's input (and gate) N(0, d_model ** -0.5) and
    output N(0, d_ff ** -0.5), cross-attention as self-attention; the relative-position tables
    N(0, d_model ** -0.5); norms 1; any other layer of the body N(0, fan_in ** -0.5). An untied language-model
    head is N(0, 1) (kind "lm", as transformers' lm_head), any other head's linear layers N(0, d_model ** -0.5) with
    zero biases (T5's classification and question-answering heads). Modules are drawn in registration order from
    `generator`."""
    config = model.config
    d = config.hidden_size
    for name, module in model.named_modules():
        if isinstance(module, LMHead):
            std = 1.0
        elif isinstance(module, nn.Linear) and name.startswith("heads."):
            std = d ** -0.5
        elif isinstance(module, nn.Linear):  # the query's std also carries attention's missing d_kv ** -0.5
            std = (d * config.head_dim) ** -0.5 if name.rsplit(".", 1)[-1] in QUERIES else module.in_features ** -0.5
        if isinstance(module, nn.Linear):
            module.weight.normal_(0.0, std, generator=generator)
            if module.bias is not None:
                module.bias.zero_()
        elif isinstance(module, nn.Embedding):
            std = 1.0 if name == "embeddings" else d ** -0.5
            module.weight.normal_(0.0, std, generator=generator)
        elif isinstance(module, (nn.LayerNorm, nn.RMSNorm)):
            if module.weight is not None:
                module.weight.fill_(1.0)
            if getattr(module, "bias", None) is not None:
                module.bias.zero_()
    for head in getattr(model, "heads", {}).values():
        bias = getattr(head, "bias", None)
        if isinstance(bias, torch.Tensor) and not isinstance(head, nn.Linear):
            bias.zero_()


FAMILY = CheckpointFamily(
    model_type="t5",
    class_stem="T5",
    prefix="",
    config_keys=CONFIG_KEYS,
    weights=WEIGHTS,
    heads={"lm": Head("tied_lm", parts={"tied": "lm_head"}, untied=Head("lm", parts={"weight": "lm_head.weight"})),
           "classifier": EOS_CLASSIFIER, "qa": QA},
    architectures={"Model": (), "ForConditionalGeneration": ("lm",), "EncoderModel": (),
                   "ForSequenceClassification": ("classifier",), "ForQuestionAnswering": ("qa",)},
    prefixes={"ForSequenceClassification": "transformer"},
    text_to_text=True,  # GLUE as T5 fine-tunes it; `task.text_to_text: false` trains the classifier instead
    fixed={**DEFAULTS, **FIXED},
    model="seq2seq",
    config_class=TransformerConfig,
    defaults=DECODER_DEFAULTS,
    models={"EncoderModel": "encoder"},
    word_embeddings="embeddings.weight",
    run_defaults=run_defaults,
    init=init_weights,
)
