"""Hugging Face checkpoints in and out. Each family's config keys and weight names are data (the tables below);
one function reads them all and one writes them all."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import Tensor

from bertology.errors import CheckpointError
from bertology.io import atomic_directory
from bertology.model.config import EncoderConfig
from bertology.model.encoder import EncoderModel, HeadSpec

# --- config.json -------------------------------------------------------------------------------------------------

# Our EncoderConfig field -> the key in a BERT-style config.json.
BERT_CONFIG_KEYS: dict[str, str] = {
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
CONFIG_KEYS: dict[str, dict[str, str]] = {
    "bert": BERT_CONFIG_KEYS,
    "roberta": BERT_CONFIG_KEYS,
    "xlm-roberta": BERT_CONFIG_KEYS,
    "electra": {**BERT_CONFIG_KEYS, "embedding_size": "embedding_size"},
    "albert": {
        **{k: v for k, v in BERT_CONFIG_KEYS.items() if k != "classifier_dropout"},
        "classifier_dropout": "classifier_dropout_prob",
        "embedding_size": "embedding_size",
        "num_layer_groups": "num_hidden_groups",
        "inner_group_size": "inner_group_num",
    },
    "distilbert": {
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
    },
}
# Facts of a family that its config.json does not state.
FAMILY_FIXED: dict[str, dict[str, Any]] = {
    "bert": {},
    "roberta": {"positions_after_padding": True},
    "xlm-roberta": {"positions_after_padding": True},
    "electra": {"pooler": False},
    "albert": {},
    "distilbert": {"type_vocab_size": 0, "layer_norm_eps": 1e-12, "pooler": False},
}
# config.json "model_type" -> family, and the class-name stem transformers uses for it.
MODEL_TYPES: dict[str, str] = {
    "bert": "bert",
    "roberta": "roberta",
    "xlm-roberta": "xlm-roberta",
    "electra": "electra",
    "albert": "albert",
    "distilbert": "distilbert",
}
CLASS_STEMS: dict[str, str] = {
    "bert": "Bert",
    "roberta": "Roberta",
    "xlm-roberta": "XLMRoberta",
    "electra": "Electra",
    "albert": "Albert",
    "distilbert": "DistilBert",
}

# --- weight names ---------------------------------------------------------------------------------------------------

# Per family: the base-model prefix used when heads are present, embedding names, the per-layer prefix and the names
# of each layer's parts. Our qkv is the concatenation of the three HF projections.
BERT_LAYER = {
    "q": "attention.self.query",
    "k": "attention.self.key",
    "v": "attention.self.value",
    "attn_out": "attention.output.dense",
    "attn_norm": "attention.output.LayerNorm",
    "ffn_in": "intermediate.dense",
    "ffn_out": "output.dense",
    "ffn_norm": "output.LayerNorm",
}
BERT_EMBEDDINGS = {
    "word": "embeddings.word_embeddings",
    "position": "embeddings.position_embeddings",
    "token_type": "embeddings.token_type_embeddings",
    "norm": "embeddings.LayerNorm",
}
ENCODER_NAMES: dict[str, dict[str, Any]] = {
    "bert": {"prefix": "bert", "embeddings": BERT_EMBEDDINGS, "project": None, "pooler": "pooler.dense",
             "layer": "encoder.layer.{i}", "layer_parts": BERT_LAYER},
    "roberta": {"prefix": "roberta", "embeddings": BERT_EMBEDDINGS, "project": None, "pooler": "pooler.dense",
                "layer": "encoder.layer.{i}", "layer_parts": BERT_LAYER},
    "xlm-roberta": {"prefix": "roberta", "embeddings": BERT_EMBEDDINGS, "project": None, "pooler": "pooler.dense",
                    "layer": "encoder.layer.{i}", "layer_parts": BERT_LAYER},
    "electra": {"prefix": "electra", "embeddings": BERT_EMBEDDINGS, "project": "embeddings_project", "pooler": None,
                "layer": "encoder.layer.{i}", "layer_parts": BERT_LAYER},
    "albert": {
        "prefix": "albert",
        "embeddings": BERT_EMBEDDINGS,
        "project": "encoder.embedding_hidden_mapping_in",
        "pooler": "pooler",
        "layer": "encoder.albert_layer_groups.{group}.albert_layers.{inner}",
        "layer_parts": {
            "q": "attention.query",
            "k": "attention.key",
            "v": "attention.value",
            "attn_out": "attention.dense",
            "attn_norm": "attention.LayerNorm",
            "ffn_in": "ffn",
            "ffn_out": "ffn_output",
            "ffn_norm": "full_layer_layer_norm",
        },
    },
    "distilbert": {
        "prefix": "distilbert",
        "embeddings": {"word": "embeddings.word_embeddings", "position": "embeddings.position_embeddings",
                       "norm": "embeddings.LayerNorm"},
        "project": None,
        "pooler": None,
        "layer": "transformer.layer.{i}",
        "layer_parts": {
            "q": "attention.q_lin",
            "k": "attention.k_lin",
            "v": "attention.v_lin",
            "attn_out": "attention.out_lin",
            "attn_norm": "sa_layer_norm",
            "ffn_in": "ffn.lin1",
            "ffn_out": "ffn.lin2",
            "ffn_norm": "output_layer_norm",
        },
    },
}

# Per family and head name: (kind, activation — None means the config's hidden_act —, our module part -> HF name).
# MLM decoders are tied to the word embeddings: `tied` names the HF decoder weight, not stored separately here.
HEADS: dict[str, dict[str, tuple[str, str | None, dict[str, str]]]] = {
    "bert": {
        "mlm": ("masked_lm", None, {"dense": "cls.predictions.transform.dense",
                                    "norm": "cls.predictions.transform.LayerNorm", "bias": "cls.predictions.bias",
                                    "tied": "cls.predictions.decoder"}),
        "nsp": ("pooled", None, {"out": "cls.seq_relationship"}),
        "classifier": ("pooled", None, {"out": "classifier"}),
        "token_classifier": ("token", None, {"out": "classifier"}),
        "qa": ("token", None, {"out": "qa_outputs"}),
    },
    "roberta": {
        "mlm": ("masked_lm", "gelu", {"dense": "lm_head.dense", "norm": "lm_head.layer_norm", "bias": "lm_head.bias",
                                      "tied": "lm_head.decoder"}),
        "classifier": ("first_token", "tanh", {"dense": "classifier.dense", "out": "classifier.out_proj"}),
        "token_classifier": ("token", None, {"out": "classifier"}),
        "qa": ("token", None, {"out": "qa_outputs"}),
    },
    "electra": {
        "mlm": ("masked_lm", "gelu", {"dense": "generator_predictions.dense", "norm": "generator_predictions.LayerNorm",
                                      "bias": "generator_lm_head.bias", "tied": "generator_lm_head"}),
        "rtd": ("token_mlp", None, {"dense": "discriminator_predictions.dense",
                                    "out": "discriminator_predictions.dense_prediction"}),
        "classifier": ("first_token", "gelu", {"dense": "classifier.dense", "out": "classifier.out_proj"}),
        "token_classifier": ("token", None, {"out": "classifier"}),
        "qa": ("token", None, {"out": "qa_outputs"}),
    },
    "albert": {
        "mlm": ("masked_lm", None, {"dense": "predictions.dense", "norm": "predictions.LayerNorm",
                                    "bias": "predictions.bias", "tied": "predictions.decoder"}),
        "sop": ("pooled", None, {"out": "sop_classifier.classifier"}),
        "classifier": ("pooled", None, {"out": "classifier"}),
        "token_classifier": ("token", None, {"out": "classifier"}),
        "qa": ("token", None, {"out": "qa_outputs"}),
    },
    "distilbert": {
        "mlm": ("masked_lm", None, {"dense": "vocab_transform", "norm": "vocab_layer_norm",
                                    "bias": "vocab_projector.bias", "tied": "vocab_projector"}),
        "classifier": ("first_token", "relu", {"dense": "pre_classifier", "out": "classifier"}),
        "token_classifier": ("token", None, {"out": "classifier"}),
        "qa": ("token", None, {"out": "qa_outputs"}),
    },
}
HEADS["xlm-roberta"] = HEADS["roberta"]

# transformers class-name suffix -> heads, in order (the first is the primary head).
ARCHITECTURE_HEADS: dict[str, tuple[str, ...]] = {
    "Model": (),
    "ForMaskedLM": ("mlm",),
    "ForNextSentencePrediction": ("nsp",),
    "ForSequenceClassification": ("classifier",),
    "ForTokenClassification": ("token_classifier",),
    "ForQuestionAnswering": ("qa",),
}
PRETRAINING_HEADS: dict[str, tuple[str, ...]] = {"bert": ("mlm", "nsp"), "albert": ("mlm", "sop"), "electra": ("rtd",)}

# Buffers some checkpoints carry that are not weights.
IGNORED_SUFFIXES = ("position_ids", "embeddings.token_type_ids")


def architecture_heads(family: str, architecture: str) -> tuple[str, ...]:
    stem = CLASS_STEMS[family]
    if not architecture.startswith(stem):
        raise CheckpointError(f"architecture {architecture!r} does not belong to model type {family!r}")
    suffix = architecture[len(stem):]
    if suffix == "ForPreTraining" and family in PRETRAINING_HEADS:
        return PRETRAINING_HEADS[family]
    if suffix not in ARCHITECTURE_HEADS:
        known = [stem + s for s in ARCHITECTURE_HEADS] + [stem + "ForPreTraining"] * (family in PRETRAINING_HEADS)
        raise CheckpointError(f"unsupported architecture {architecture!r}; supported: {', '.join(known)}")
    return ARCHITECTURE_HEADS[suffix]


def architecture_name(family: str, heads: tuple[str, ...]) -> str:
    stem = CLASS_STEMS[family]
    if heads and heads == PRETRAINING_HEADS.get(family):
        return stem + "ForPreTraining"
    for suffix, names in ARCHITECTURE_HEADS.items():
        if names == heads:
            return stem + suffix
    raise CheckpointError(f"no transformers architecture of {family!r} has exactly the heads {heads}")


def config_from_hf(hf: dict[str, Any], source: str = "config.json") -> EncoderConfig:
    """Map a transformers config.json onto an EncoderConfig; keys bertology does not use are kept in `extra`."""
    model_type = hf.get("model_type")
    if model_type not in MODEL_TYPES:
        raise CheckpointError(
            f"{source}: unknown model_type {model_type!r}; supported: {', '.join(MODEL_TYPES)}"
        )
    family = MODEL_TYPES[model_type]
    if hf.get("position_embedding_type", "absolute") != "absolute":
        raise CheckpointError(
            f"{source}: position_embedding_type {hf['position_embedding_type']!r} is not supported (only 'absolute')"
        )
    values: dict[str, Any] = dict(FAMILY_FIXED[family])
    used = set()
    for ours, theirs in CONFIG_KEYS[family].items():
        if theirs in hf and hf[theirs] is not None:
            values[ours] = hf[theirs]
            used.add(theirs)
    if family == "electra" and values.get("embedding_size") == values.get("hidden_size"):
        values["embedding_size"] = None  # transformers adds no projection when the widths agree
    extra = {k: v for k, v in hf.items() if k not in used}
    return EncoderConfig(family=family, extra=extra, **values)  # type: ignore[arg-type]


def config_to_hf(config: EncoderConfig, heads: tuple[HeadSpec, ...]) -> dict[str, Any]:
    hf: dict[str, Any] = dict(config.extra)
    family = config.family
    for ours, theirs in CONFIG_KEYS[family].items():
        value = getattr(config, ours)
        if ours == "embedding_size" and value is None:
            value = config.hidden_size
        if value is not None or theirs not in hf:
            hf[theirs] = value
    hf["model_type"] = family
    hf["architectures"] = [architecture_name(family, tuple(h.name for h in heads))]
    labelled = [h for h in heads if h.name in ("classifier", "token_classifier")]
    if labelled:
        n = labelled[0].num_labels
        if len(hf.get("id2label", {})) != n:
            hf["id2label"] = {str(i): f"LABEL_{i}" for i in range(n)}
            hf["label2id"] = {f"LABEL_{i}": i for i in range(n)}
        if labelled[0].kind in ("pooled", "first_token") and n == 1:
            hf.setdefault("problem_type", "regression")
    return hf


# --- the name map ------------------------------------------------------------------------------------------------


def name_map(config: EncoderConfig, heads: tuple[HeadSpec, ...], prefixed: bool) -> dict[str, list[str]]:
    """Our parameter name -> the HF key(s) it comes from (several keys are concatenated along dim 0)."""
    names = ENCODER_NAMES[config.family]
    base = f"{names['prefix']}." if prefixed else ""
    out: dict[str, list[str]] = {}

    def linear(ours: str, theirs: str | list[str], params: tuple[str, ...] = ("weight", "bias")) -> None:
        theirs_list = [theirs] if isinstance(theirs, str) else theirs
        for p in params:
            out[f"{ours}.{p}"] = [f"{t}.{p}" for t in theirs_list]

    for part, theirs in names["embeddings"].items():
        params = ("weight", "bias") if part == "norm" else ("weight",)
        linear(f"encoder.embeddings.{part}", base + theirs, params)
    if config.embedding_size is not None:
        linear("encoder.embeddings.project", base + names["project"])
    parts = names["layer_parts"]
    for i in range(config.num_unique_layers):
        layer = base + names["layer"].format(i=i, group=i // config.inner_group_size, inner=i % config.inner_group_size)
        ours = f"encoder.layers.{i}"
        linear(f"{ours}.qkv", [f"{layer}.{parts[x]}" for x in ("q", "k", "v")])
        for part in ("attn_out", "attn_norm", "ffn_in", "ffn_out", "ffn_norm"):
            linear(f"{ours}.{part}", f"{layer}.{parts[part]}")
    if config.pooler:
        linear("encoder.pooler", base + names["pooler"])
    for spec in heads:
        table = HEADS[config.family].get(spec.name)
        if table is None:
            raise CheckpointError(f"family {config.family!r} has no head named {spec.name!r} in transformers' format")
        for part, theirs in table[2].items():
            if part == "bias":
                out[f"heads.{spec.name}.bias"] = [theirs]
            elif part != "tied":
                linear(f"heads.{spec.name}.{part}", theirs)
    return out


def head_specs(config: EncoderConfig, names: tuple[str, ...], weights: dict[str, Tensor]) -> tuple[HeadSpec, ...]:
    specs = []
    for name in names:
        kind, act, parts = HEADS[config.family][name]
        num_labels = 2
        if "out" in parts and f"{parts['out']}.weight" in weights:
            num_labels = weights[f"{parts['out']}.weight"].shape[0]
        specs.append(HeadSpec(name=name, kind=kind, num_labels=num_labels, activation=act or config.hidden_act))  # type: ignore[arg-type]
    return tuple(specs)


# --- reading and writing ---------------------------------------------------------------------------------------------


def read_weights(directory: Path) -> dict[str, Tensor]:
    """model.safetensors (single or sharded) or pytorch_model.bin (loaded with weights_only=True)."""
    single = directory / "model.safetensors"
    index = directory / "model.safetensors.index.json"
    legacy = directory / "pytorch_model.bin"
    if single.is_file():
        weights = load_file(single)
    elif index.is_file():
        weights = {}
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        for shard in shards:
            if not (directory / shard).is_file():
                raise CheckpointError(f"{index}: names shard {shard!r}, which is missing")
            weights.update(load_file(directory / shard))
    elif legacy.is_file():
        try:
            weights = torch.load(legacy, map_location="cpu", weights_only=True)
        except Exception as error:  # pickle errors come in many types
            raise CheckpointError(f"{legacy}: cannot be read as a weights-only PyTorch state dict: {error}") from error
    else:
        present = ", ".join(sorted(p.name for p in directory.iterdir())) or "nothing"
        raise CheckpointError(
            f"{directory}: no weights found (expected model.safetensors, model.safetensors.index.json or "
            f"pytorch_model.bin; the directory holds {present})"
        )
    renamed = {}
    for key, value in weights.items():
        if key.endswith(IGNORED_SUFFIXES):
            continue
        key = key.replace("LayerNorm.gamma", "LayerNorm.weight").replace("LayerNorm.beta", "LayerNorm.bias")
        renamed[key] = value
    return renamed


def load_model(directory: str | os.PathLike, heads: tuple[str, ...] | None = None) -> EncoderModel:
    """Build an EncoderModel from a transformers model directory, with the heads its architecture names."""
    directory = Path(directory)
    if not directory.is_dir():
        raise CheckpointError(f"{directory}: no such model directory")
    config_path = directory / "config.json"
    if not config_path.is_file():
        raise CheckpointError(f"{directory}: config.json is missing")
    try:
        hf = json.loads(config_path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise CheckpointError(f"{config_path}: not valid JSON: {error}") from error
    config = config_from_hf(hf, str(config_path))
    weights = read_weights(directory)
    prefix = ENCODER_NAMES[config.family]["prefix"] + "."
    prefixed = any(k.startswith(prefix) for k in weights)
    if heads is None:
        architectures = hf.get("architectures") or [CLASS_STEMS[config.family] + "Model"]
        heads = architecture_heads(config.family, architectures[0])
    if config.pooler:  # a BERT-style checkpoint without pooler weights (e.g. a masked-LM one) has no pooler
        pooler_key = (prefix if prefixed else "") + ENCODER_NAMES[config.family]["pooler"] + ".weight"
        config.pooler = pooler_key in weights
    specs = head_specs(config, heads, weights)
    model = EncoderModel(config, specs)
    model.load_state_dict(to_state_dict(model, weights, prefixed, str(directory)))
    return model.eval()


def to_state_dict(model: EncoderModel, weights: dict[str, Tensor], prefixed: bool, source: str) -> dict[str, Tensor]:
    mapping = name_map(model.config, model.head_specs, prefixed)
    expected = model.state_dict()
    state, missing, mismatched, used = {}, [], [], set()
    for ours, theirs in mapping.items():
        absent = [t for t in theirs if t not in weights]
        if absent:
            missing.extend(absent)
            continue
        tensor = torch.cat([weights[t] for t in theirs]) if len(theirs) > 1 else weights[theirs[0]]
        used.update(theirs)
        if tensor.shape != expected[ours].shape:
            mismatched.append(f"{'+'.join(theirs)}: checkpoint {tuple(tensor.shape)}, model {tuple(expected[ours].shape)}")
            continue
        state[ours] = tensor
    word = weights.get(mapping["encoder.embeddings.word.weight"][0])
    for spec in model.head_specs:
        tied = HEADS[model.config.family][spec.name][2].get("tied")
        if tied is None:
            continue
        used.update({f"{tied}.bias"})  # transformers ties the decoder bias to the head's bias
        decoder = weights.get(f"{tied}.weight")
        if decoder is not None:
            used.add(f"{tied}.weight")
            if word is not None and not torch.equal(decoder, word):
                mismatched.append(f"{tied}.weight: an MLM decoder not tied to the word embeddings is not supported")
    unexpected = sorted(set(weights) - used)
    problems = []
    if missing:
        problems.append(f"missing keys: {', '.join(missing)}")
    if unexpected:
        problems.append(f"unexpected keys: {', '.join(unexpected)}")
    if mismatched:
        problems.append(f"shape mismatches: {'; '.join(mismatched)}")
    if problems:
        raise CheckpointError(f"{source}: weights do not fit a {model.config.family} model: " + " | ".join(problems))
    return state


def from_state_dict(model: EncoderModel) -> dict[str, Tensor]:
    """Our parameters under transformers' names (fused qkv split back into query, key and value)."""
    prefixed = bool(model.head_specs)
    mapping = name_map(model.config, model.head_specs, prefixed)
    state = model.state_dict()
    out: dict[str, Tensor] = {}
    for ours, theirs in mapping.items():
        for key, piece in zip(theirs, state[ours].chunk(len(theirs))):
            out[key] = piece.detach().contiguous().clone()
    return out


def save_model(model: EncoderModel, directory: str | os.PathLike, extra_files: dict[str, str] | None = None) -> None:
    """Write config.json and model.safetensors (atomically: a killed save leaves any previous checkpoint intact)."""
    with atomic_directory(directory) as tmp:
        write_model_files(model, tmp)
        for name, text in (extra_files or {}).items():
            (tmp / name).write_text(text, encoding="utf-8")


def write_model_files(model: EncoderModel, directory: Path) -> None:
    config = config_to_hf(model.config, model.head_specs)
    (directory / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    save_file(from_state_dict(model), directory / "model.safetensors", metadata={"format": "pt"})


@dataclass
class Pretrained:
    """A loaded checkpoint: the model (in eval mode) and its tokenizer."""

    model: EncoderModel
    tokenizer: Any  # bertology.tokenization.Tokenizer, or None for a directory without tokenizer files

    @property
    def config(self) -> EncoderConfig:
        return self.model.config

    def save(self, directory: str | os.PathLike) -> None:
        with atomic_directory(directory) as tmp:
            write_model_files(self.model, tmp)
            if self.tokenizer is not None:
                self.tokenizer.save(tmp)


TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "vocab.json")


def load(path: str | os.PathLike, heads: tuple[str, ...] | None = None) -> Pretrained:
    """Load a transformers model directory (any supported family, with its heads) and its tokenizer."""
    from bertology.tokenization import load_tokenizer  # the tokenizer package imports nothing from the model

    model = load_model(path, heads)
    directory = Path(path)
    tokenizer = None
    if any((directory / name).is_file() for name in TOKENIZER_FILES):
        tokenizer = load_tokenizer(directory, model_type=model.config.family)
    return Pretrained(model=model, tokenizer=tokenizer)
