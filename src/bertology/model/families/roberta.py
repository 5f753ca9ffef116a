"""RoBERTa: BERT's weights under `roberta.`, positions numbered after the padding id (fairseq's convention), an MLM
head `lm_head` with GELU and a classifier with a hidden layer over the first token."""

from bertology.model.convert import CheckpointFamily, Head, renamed_keys
from bertology.model.families import bert

HEADS = {
    "mlm": Head("masked_lm", "gelu", {"dense": "lm_head.dense", "norm": "lm_head.layer_norm", "bias": "lm_head.bias",
                                      "tied": "lm_head.decoder"}),
    "classifier": Head("first_token", "tanh", {"dense": "classifier.dense", "out": "classifier.out_proj"}),
    "token_classifier": bert.TOKEN_CLASSIFIER,
    "qa": bert.QA,
}

def run_defaults(values: object, run: object) -> dict[str, object]:
    """A RoBERTa pretrained from scratch: one segment embedding and fairseq's norm epsilon."""
    return {"type_vocab_size": 1, "layer_norm_eps": 1e-5}


FAMILY = CheckpointFamily(
    model_type="roberta",
    class_stem="Roberta",
    prefix="roberta",
    config_keys=renamed_keys(bert.KEYS),
    weights=bert.EMBEDDINGS + bert.LAYERS + bert.POOLER,
    heads=HEADS,
    architectures=bert.ARCHITECTURES,
    fixed={"positions_after_padding": True},
    run_defaults=run_defaults,
)
