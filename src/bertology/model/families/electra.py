"""ELECTRA: BERT's layout under `electra.` without a pooler, with a projection from narrower embeddings (which
transformers only adds when embedding_size differs from hidden_size), a generator MLM head and the discriminator's
replaced-token head."""

from typing import Any, Mapping

from bertology.model.config import TransformerConfig
from bertology.model.convert import CheckpointFamily, ConfigKey, Head, linear, renamed_keys
from bertology.model.families import bert


def no_projection_when_as_wide(value: Any, config_json: Mapping[str, Any]) -> Any:
    """transformers adds no projection when the embeddings are as wide as the layers: bertology's None."""
    return None if value == config_json.get("hidden_size") else value


def hidden_size_when_none(value: Any, config: TransformerConfig) -> Any:
    return config.hidden_size if value is None else value


FAMILY = CheckpointFamily(
    model_type="electra",
    class_stem="Electra",
    prefix="electra",
    config_keys=(*renamed_keys(bert.KEYS),
                 ConfigKey("embedding_size", "embedding_size", no_projection_when_as_wide, hidden_size_when_none)),
    weights=(*bert.EMBEDDINGS, *linear("encoder.embeddings.project", "embeddings_project", when="embedding_size"),
             *bert.LAYERS),
    heads={
        "mlm": Head("masked_lm", "gelu", {"dense": "generator_predictions.dense",
                                          "norm": "generator_predictions.LayerNorm", "bias": "generator_lm_head.bias",
                                          "tied": "generator_lm_head"}),
        "rtd": Head("token_mlp", None, {"dense": "discriminator_predictions.dense",
                                        "out": "discriminator_predictions.dense_prediction"}),
        "classifier": Head("first_token", "gelu", {"dense": "classifier.dense", "out": "classifier.out_proj"}),
        "token_classifier": bert.TOKEN_CLASSIFIER,
        "qa": bert.QA,
    },
    architectures={**bert.ARCHITECTURES, "ForPreTraining": ("rtd",)},
    fixed={"pooler": False},
)
