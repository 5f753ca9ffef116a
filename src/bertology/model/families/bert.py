"""BERT: transformers' Bert* classes. Its embeddings, layers and config keys are the base the other families vary."""

from bertology.model.convert import CheckpointFamily, Head, layer_linears, linear, renamed_keys

# Our TransformerConfig field -> the key in a BERT-style config.json.
KEYS = {
    "vocab_size": "vocab_size",
    "hidden_size": "hidden_size",
    "num_layers": "num_hidden_layers",
    "num_heads": "num_attention_heads",
    "intermediate_size": "intermediate_size",
    "hidden_act": "hidden_act",
    "max_position_embeddings": "max_position_embeddings",
    "type_vocab_size": "type_vocab_size",
    "layer_norm_eps": "layer_norm_eps",
    "pad_token_id": "pad_token_id",
    "hidden_dropout": "hidden_dropout_prob",
    "attention_dropout": "attention_probs_dropout_prob",
    "classifier_dropout": "classifier_dropout",
    "initializer_range": "initializer_range",
}
EMBEDDINGS = (
    *linear("encoder.embeddings.word", "embeddings.word_embeddings", ("weight",)),
    *linear("encoder.embeddings.position", "embeddings.position_embeddings", ("weight",)),
    *linear("encoder.embeddings.token_type", "embeddings.token_type_embeddings", ("weight",), when="type_vocab_size"),
    *linear("encoder.embeddings.norm", "embeddings.LayerNorm"),
)
# Our layer part -> its module in transformers' layer.
LAYER_PARTS = {
    "query": "attention.self.query",
    "key": "attention.self.key",
    "value": "attention.self.value",
    "attn_out": "attention.output.dense",
    "attn_norm": "attention.output.LayerNorm",
    "ffn_in": "intermediate.dense",
    "ffn_out": "output.dense",
    "ffn_norm": "output.LayerNorm",
}
LAYERS = layer_linears("encoder.layer.{i}", LAYER_PARTS)
POOLER = linear("encoder.pooler", "pooler.dense", when="pooler")

# The fine-tuning heads every family shares with BERT.
TOKEN_CLASSIFIER = Head("token", None, {"out": "classifier"})
QA = Head("token", None, {"out": "qa_outputs"})
# Architecture suffixes every family has.
ARCHITECTURES = {
    "Model": (),
    "ForMaskedLM": ("mlm",),
    "ForSequenceClassification": ("classifier",),
    "ForTokenClassification": ("token_classifier",),
    "ForQuestionAnswering": ("qa",),
}

FAMILY = CheckpointFamily(
    model_type="bert",
    class_stem="Bert",
    prefix="bert",
    config_keys=renamed_keys(KEYS),
    weights=EMBEDDINGS + LAYERS + POOLER,
    heads={
        "mlm": Head("masked_lm", None, {"dense": "cls.predictions.transform.dense",
                                        "norm": "cls.predictions.transform.LayerNorm", "bias": "cls.predictions.bias",
                                        "tied": "cls.predictions.decoder"}),
        "nsp": Head("pooled", None, {"out": "cls.seq_relationship"}),
        "classifier": Head("pooled", None, {"out": "classifier"}),
        "token_classifier": TOKEN_CLASSIFIER,
        "qa": QA,
    },
    architectures={**ARCHITECTURES, "ForPreTraining": ("mlm", "nsp"), "ForNextSentencePrediction": ("nsp",)},
)
