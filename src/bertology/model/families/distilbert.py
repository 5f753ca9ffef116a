"""DistilBERT: its own config keys (`dim`, `n_layers`, ...), no token types, no pooler, its own layer names under
`transformer.layer.{i}`, and a classifier with a ReLU hidden layer over the first token."""

from bertology.model.convert import CheckpointFamily, Head, layer_linears, linear, renamed_keys
from bertology.model.families import bert

FAMILY = CheckpointFamily(
    model_type="distilbert",
    class_stem="DistilBert",
    prefix="distilbert",
    config_keys=renamed_keys({
        "vocab_size": "vocab_size",
        "hidden_size": "dim",
        "num_layers": "n_layers",
        "num_heads": "n_heads",
        "intermediate_size": "hidden_dim",
        "hidden_act": "activation",
        "max_position_embeddings": "max_position_embeddings",
        "pad_token_id": "pad_token_id",
        "hidden_dropout": "dropout",
        "attention_dropout": "attention_dropout",
        "classifier_dropout": "seq_classif_dropout",
        "initializer_range": "initializer_range",
    }),
    weights=(
        *linear("encoder.embeddings.word", "embeddings.word_embeddings", ("weight",)),
        *linear("encoder.embeddings.position", "embeddings.position_embeddings", ("weight",)),
        *linear("encoder.embeddings.norm", "embeddings.LayerNorm"),
        *layer_linears("transformer.layer.{i}", {
            "query": "attention.q_lin",
            "key": "attention.k_lin",
            "value": "attention.v_lin",
            "attn_out": "attention.out_lin",
            "attn_norm": "sa_layer_norm",
            "ffn_in": "ffn.lin1",
            "ffn_out": "ffn.lin2",
            "ffn_norm": "output_layer_norm",
        }),
    ),
    heads={
        "mlm": Head("masked_lm", None, {"dense": "vocab_transform", "norm": "vocab_layer_norm",
                                        "bias": "vocab_projector.bias", "tied": "vocab_projector"}),
        "classifier": Head("first_token", "relu", {"dense": "pre_classifier", "out": "classifier"}),
        "token_classifier": bert.TOKEN_CLASSIFIER,
        "qa": bert.QA,
    },
    architectures=bert.ARCHITECTURES,
    fixed={"type_vocab_size": 0, "layer_norm_eps": 1e-12, "pooler": False},
    # BERT's keys that DistilBertConfig keeps as given (and its models ignore) when one set of BERT-style keyword
    # arguments builds configs of several families. BERT's names for the layer count, width and heads are not among
    # them: DistilBertConfig maps those onto n_layers, dim and n_heads, so they never reach its config.json.
    tolerated=frozenset({"intermediate_size", "hidden_act", "hidden_dropout_prob", "attention_probs_dropout_prob",
                         "type_vocab_size", "layer_norm_eps", "classifier_dropout"}),
)
