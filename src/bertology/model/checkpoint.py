"""Checkpoints in and out: Hugging Face's layout, where each family's config keys and weight names are data (the
tables below), and bertology's native format (bertology.json) for models transformers has no class for."""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import Tensor

from bertology.errors import BertologyError, CheckpointError, ConfigError
from bertology.io import atomic_directory, recover
from bertology.model.config import FAMILIES, EncoderConfig
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
# The class-name stem transformers uses for each family (its config.json model_type is the family name).
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
# of each layer's parts.
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
    family = hf.get("model_type")
    if family not in FAMILIES:
        raise CheckpointError(f"{source}: unknown model_type {family!r}; supported: {', '.join(FAMILIES)}")
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
    if "pruned_heads" in hf:  # every family's key: {"layer": [heads]}, the heads a pruned model no longer has
        values["pruned_heads"] = hf["pruned_heads"] or {}
        used.add("pruned_heads")
    extra = {k: v for k, v in hf.items() if k not in used}
    try:
        return EncoderConfig(family=family, extra=extra, **values)  # type: ignore[arg-type]
    except ConfigError as error:
        raise ConfigError(f"{source}: {error}") from None


def config_to_hf(config: EncoderConfig, heads: tuple[HeadSpec, ...]) -> dict[str, Any]:
    hf: dict[str, Any] = dict(config.extra)
    family = config.family
    for ours, theirs in CONFIG_KEYS[family].items():
        value = getattr(config, ours)
        if ours == "embedding_size" and value is None:
            value = config.hidden_size
        if ours == "classifier_dropout" and value is None and family == "albert":
            value = config.head_dropout  # transformers' ALBERT needs a number here (its default would be 0.1)
        if value is not None or theirs not in hf:
            hf[theirs] = value
    hf.pop("pruned_heads", None)
    if config.pruned_heads:
        hf["pruned_heads"] = {str(layer): list(h) for layer, h in config.pruned_heads.items()}
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


def name_map(config: EncoderConfig, heads: tuple[HeadSpec, ...], prefixed: bool) -> dict[str, str]:
    """Our parameter name -> the HF key it comes from."""
    names = ENCODER_NAMES[config.family]
    base = f"{names['prefix']}." if prefixed else ""
    out: dict[str, str] = {}

    def linear(ours: str, theirs: str, params: tuple[str, ...] = ("weight", "bias")) -> None:
        for p in params:
            out[f"{ours}.{p}"] = f"{theirs}.{p}"

    for part, theirs in names["embeddings"].items():
        params = ("weight", "bias") if part == "norm" else ("weight",)
        linear(f"encoder.embeddings.{part}", base + theirs, params)
    if config.embedding_size is not None:
        linear("encoder.embeddings.project", base + names["project"])
    parts = names["layer_parts"]
    ours_of = {"q": "query", "k": "key", "v": "value"}
    for i in range(config.num_unique_layers):
        layer = base + names["layer"].format(i=i, group=i // config.inner_group_size, inner=i % config.inner_group_size)
        for part, theirs in parts.items():
            linear(f"encoder.layers.{i}.{ours_of.get(part, part)}", f"{layer}.{theirs}")
    if config.pooler:
        linear("encoder.pooler", base + names["pooler"])
    for spec in heads:
        table = HEADS[config.family].get(spec.name)
        if table is None:
            raise CheckpointError(f"family {config.family!r} has no head named {spec.name!r} in transformers' format")
        for part, theirs in table[2].items():
            if part == "bias":
                out[f"heads.{spec.name}.bias"] = theirs
            elif part != "tied":
                linear(f"heads.{spec.name}.{part}", theirs)
    return out


def hf_layout_problem(model: EncoderModel) -> str | None:
    """Why `model` cannot be written in transformers' layout, or None when it can."""
    config, family = model.config, model.config.family
    if model.extensions:
        return f"it has extensions ({', '.join(model.extensions)})"
    if config.embedding_size is not None and ENCODER_NAMES[family]["project"] is None:
        return f"it projects its embeddings (embedding_size), which transformers' {family} models do not"
    for spec in model.head_specs:
        table = HEADS[family].get(spec.name)
        if table is None:
            return f"transformers' {family} models have no head named {spec.name!r}"
        kind, act, _ = table
        if spec.kind != kind:
            return f"head {spec.name!r} is of kind {spec.kind!r}; transformers' {family} {spec.name!r} is {kind!r}"
        if spec.kind in ("masked_lm", "first_token", "token_mlp") and spec.activation != (act or config.hidden_act):
            return (f"head {spec.name!r} uses {spec.activation!r}; transformers' {family} {spec.name!r} uses "
                    f"{act or config.hidden_act!r}")
    try:
        architecture_name(family, tuple(spec.name for spec in model.head_specs))
    except CheckpointError as error:
        return str(error)
    # Parameters the tables do not name: modules set by hand into a layer (adapters, wrapped projections).
    unnamed = sorted(set(model.state_dict()) - set(name_map(config, model.head_specs, prefixed=False)))
    if unnamed:
        return f"parameters {', '.join(unnamed[:5])}{' ...' if len(unnamed) > 5 else ''} have no transformers name"
    return None


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

NATIVE_FILE = "bertology.json"  # present: the directory is in bertology's own format
NATIVE_VERSION = 1
Format = Literal["auto", "hf", "native"]


def read_json_object(path: Path) -> dict[str, Any]:
    """A JSON object from `path`; anything else (bad UTF-8, bad JSON, a list) is a CheckpointError naming the file."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as error:
        raise CheckpointError(f"{path}: not UTF-8 text ({error})") from None
    except json.JSONDecodeError as error:
        raise CheckpointError(f"{path}: not valid JSON: {error}") from None
    except RecursionError:
        raise CheckpointError(f"{path}: invalid JSON: arrays or objects nested too deeply") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: expected a JSON object, got a {type(data).__name__}")
    return data


def read_safetensors(path: Path) -> dict[str, Tensor]:
    try:
        return load_file(path)
    except (SafetensorError, OSError, ValueError) as error:  # truncated, garbage, unreadable
        raise CheckpointError(f"{path}: not a readable safetensors file ({error})") from None


def read_weights(directory: Path, *, renamed: bool = True) -> dict[str, Tensor]:
    """model.safetensors (single or sharded) or pytorch_model.bin (loaded with weights_only=True). `renamed`: drop the
    buffers some HF checkpoints carry and rename TF-era LayerNorm gamma/beta (for HF-named weights)."""
    single = directory / "model.safetensors"
    index = directory / "model.safetensors.index.json"
    legacy = directory / "pytorch_model.bin"
    if single.is_file():
        weights = read_safetensors(single)
    elif index.is_file():
        weight_map = read_json_object(index).get("weight_map")
        if not isinstance(weight_map, dict):
            raise CheckpointError(f"{index}: no \"weight_map\" object naming the shards")
        weights = {}
        for shard in sorted(set(map(str, weight_map.values()))):
            if not (directory / shard).is_file():
                raise CheckpointError(f"{index}: names shard {shard!r}, which is missing")
            weights.update(read_safetensors(directory / shard))
    elif legacy.is_file():
        try:
            weights = torch.load(legacy, map_location="cpu", weights_only=True)
        except Exception as error:  # pickle errors come in many types
            raise CheckpointError(f"{legacy}: cannot be read as a weights-only PyTorch state dict: {error}") from error
        if not isinstance(weights, dict):
            raise CheckpointError(f"{legacy}: holds a {type(weights).__name__}, not a state dict")
    else:
        present = ", ".join(sorted(p.name for p in directory.iterdir())) or "nothing"
        raise CheckpointError(
            f"{directory}: no weights found (expected model.safetensors, model.safetensors.index.json or "
            f"pytorch_model.bin; the directory holds {present})"
        )
    if not renamed:
        return weights
    out = {}
    for key, value in weights.items():
        if key.endswith(IGNORED_SUFFIXES):
            continue
        key = key.replace("LayerNorm.gamma", "LayerNorm.weight").replace("LayerNorm.beta", "LayerNorm.bias")
        out[key] = value
    return out


def load_model(directory: str | os.PathLike, heads: tuple[str, ...] | None = None) -> EncoderModel:
    """Build an EncoderModel from a model directory: transformers' layout (config.json), with the heads its
    architecture names, or bertology's native format (bertology.json), with its heads and extensions. `heads`
    overrides which heads are built (a subset of the saved ones, for the native format)."""
    directory = Path(directory)
    recover(directory)  # a writer killed while replacing it left the previous directory aside
    if not directory.is_dir():
        raise CheckpointError(f"{directory}: no such model directory")
    if (directory / NATIVE_FILE).is_file():
        return load_native(directory, heads)
    config_path = directory / "config.json"
    if not config_path.is_file():
        inside = sorted(sub.name for sub in directory.iterdir() if sub.is_dir() and not sub.name.startswith(".")
                        and ((sub / "config.json").is_file() or (sub / NATIVE_FILE).is_file()))
        if inside:  # a run folder (finetune --out, pretrain's output_dir) holds its model in a subfolder
            named = " or ".join(str(directory / name) for name in inside)
            raise CheckpointError(f"{directory}: config.json is missing; this folder holds a model in a subfolder: "
                                  f"give {named}")
        raise CheckpointError(f"{directory}: config.json is missing")
    hf = read_json_object(config_path)
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
    """HF-named `weights` as `model`'s state dict; missing, unexpected and mis-shaped keys are one CheckpointError."""
    mapping = name_map(model.config, model.head_specs, prefixed)
    expected = model.state_dict()
    state, missing, mismatched, used = {}, [], [], set()
    for ours, theirs in mapping.items():
        if theirs not in weights:
            missing.append(theirs)
            continue
        tensor = weights[theirs]
        used.add(theirs)
        if tensor.shape != expected[ours].shape:
            mismatched.append(f"{theirs}: checkpoint {tuple(tensor.shape)}, model {tuple(expected[ours].shape)}")
            continue
        state[ours] = tensor
    word = weights.get(mapping["encoder.embeddings.word.weight"])
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
    check_keys(source, model.config.family, missing, sorted(set(weights) - used), mismatched)
    return state


def check_keys(source: str, family: str, missing: list[str], unexpected: list[str], mismatched: list[str]) -> None:
    problems = []
    if missing:
        problems.append(f"missing keys: {', '.join(missing)}")
    if unexpected:
        problems.append(f"unexpected keys: {', '.join(unexpected)}")
    if mismatched:
        problems.append(f"shape mismatches: {'; '.join(mismatched)}")
    if problems:
        raise CheckpointError(f"{source}: weights do not fit a {family} model: " + " | ".join(problems))


def from_state_dict(model: EncoderModel) -> dict[str, Tensor]:
    """Our parameters under transformers' names."""
    mapping = name_map(model.config, model.head_specs, prefixed=bool(model.head_specs))
    return {theirs: tensor.detach().contiguous().clone() for ours, tensor in model.state_dict().items()
            for theirs in [mapping[ours]]}


# --- the native format ------------------------------------------------------------------------------------------------


def native_metadata(model: EncoderModel) -> dict[str, Any]:
    return {
        "format": "bertology",
        "version": NATIVE_VERSION,
        "encoder": model.config.to_dict(),
        "heads": [dataclasses.asdict(spec) for spec in model.head_specs],
        "extensions": {where: {"factory": factory, "options": options}
                       for where, (factory, options) in model.extensions.items()},
    }


def skeleton(metadata: dict[str, Any], source: str) -> EncoderModel:
    """The model `metadata` (bertology.json) describes, on the meta device: its parameter names and shapes only."""
    with torch.device("meta"):
        return build_native(metadata, source)


def build_native(metadata: dict[str, Any], source: str) -> EncoderModel:
    try:
        config = EncoderConfig.from_dict(metadata["encoder"])
        specs = [HeadSpec(**spec) for spec in metadata["heads"]]
        extensions = metadata.get("extensions", {})
        model = EncoderModel(config, specs)
        for where, entry in extensions.items():
            model.add_extension(where, entry["factory"], **entry["options"])
    except (BertologyError, KeyError, TypeError, AttributeError) as error:
        what = f"missing key {error}" if isinstance(error, KeyError) else str(error)
        raise CheckpointError(f"{source}: cannot build the model it describes: {what}") from None
    return model


def write_native(model: EncoderModel, directory: Path) -> None:
    metadata = native_metadata(model)
    state = model.state_dict()
    # Every parameter must be one that loading rebuilds: modules set by hand, not with add_extension, would be lost.
    rebuilt = skeleton(metadata, "model").state_dict()
    unknown = sorted(set(state) - set(rebuilt))
    if unknown:
        raise CheckpointError(f"cannot save parameters {', '.join(unknown[:5])}{' ...' if len(unknown) > 5 else ''}: "
                              "their modules were not added with EncoderModel.add_extension, so loading could not "
                              "rebuild them")
    (directory / NATIVE_FILE).write_text(json.dumps(metadata, indent=2) + "\n", encoding="utf-8")
    save_file({k: v.detach().contiguous().clone() for k, v in state.items()}, directory / "model.safetensors",
              metadata={"format": "pt"})


def read_state_dict(directory: str | os.PathLike, model: EncoderModel) -> dict[str, Tensor]:
    """The weights of a model directory in either format as `model`'s state dict (for resuming into a model built
    already); missing, unexpected and mis-shaped keys are one CheckpointError."""
    directory = Path(directory)
    if not (directory / NATIVE_FILE).is_file():
        weights = read_weights(directory)
        prefixed = any(k.startswith(ENCODER_NAMES[model.config.family]["prefix"] + ".") for k in weights)
        return to_state_dict(model, weights, prefixed, str(directory))
    weights = read_weights(directory, renamed=False)
    check_native_keys(str(directory), model, weights)
    return weights


def check_native_keys(source: str, model: EncoderModel, weights: dict[str, Tensor]) -> None:
    expected = model.state_dict()
    mismatched = [f"{k}: checkpoint {tuple(weights[k].shape)}, model {tuple(v.shape)}"
                  for k, v in expected.items() if k in weights and weights[k].shape != v.shape]
    check_keys(source, model.config.family, sorted(set(expected) - set(weights)), sorted(set(weights) - set(expected)),
               mismatched)


def load_native(directory: Path, heads: tuple[str, ...] | None) -> EncoderModel:
    path = directory / NATIVE_FILE
    metadata = read_json_object(path)
    if metadata.get("format") != "bertology" or metadata.get("version") != NATIVE_VERSION:
        raise CheckpointError(f"{path}: expected format \"bertology\" version {NATIVE_VERSION}, got "
                              f"{metadata.get('format')!r} version {metadata.get('version')!r}")
    weights = read_weights(directory, renamed=False)
    if heads is not None:  # keep the chosen heads, drop the others' weights
        saved = {spec.get("name") for spec in metadata.get("heads", []) if isinstance(spec, dict)}
        absent = [name for name in heads if name not in saved]
        if absent:
            raise CheckpointError(f"{path}: has no head(s) {', '.join(absent)}; it has {', '.join(sorted(saved))}")
        metadata = {**metadata, "heads": [spec for spec in metadata["heads"] if spec["name"] in heads]}
        dropped = tuple(f"heads.{name}." for name in saved - set(heads))
        weights = {k: v for k, v in weights.items() if not k.startswith(dropped)}
    model = build_native(metadata, str(path))
    check_native_keys(str(directory), model, weights)
    model.load_state_dict(weights)
    return model.eval()


# --- saving in either format ----------------------------------------------------------------------------------------


def save_model(model: EncoderModel, directory: str | os.PathLike, extra_files: dict[str, str] | None = None,
               format: Format = "auto") -> None:
    """Write the model (atomically: a killed save leaves any previous checkpoint intact). "hf": transformers' layout
    (config.json and model.safetensors); "native": bertology's (bertology.json and model.safetensors under our
    parameter names), for heads transformers has no class for and for extensions; "auto": HF when it applies."""
    with atomic_directory(directory) as tmp:
        write_model_files(model, tmp, format)
        for name, text in (extra_files or {}).items():
            (tmp / name).write_text(text, encoding="utf-8")


def write_model_files(model: EncoderModel, directory: Path, format: Format = "auto") -> None:
    from bertology.model.quantize import is_quantized  # here: quantize imports this module

    if is_quantized(model):  # int8 weights have no place in either layout; refuse rather than write a broken model
        raise CheckpointError("an int8-quantized model is for inference only and cannot be saved; save the float32 "
                              "model it was made from (bertology.model.quantize(model) copies it by default)")
    if format not in ("auto", "hf", "native"):
        raise CheckpointError(f"unknown checkpoint format {format!r}; expected auto, hf or native")
    problem = hf_layout_problem(model) if format != "native" else None
    if format == "hf" and problem is not None:
        raise CheckpointError(f"the model cannot be saved in transformers' layout: {problem} (save it with "
                              "format=\"native\")")
    if format == "native" or problem is not None:
        write_native(model, directory)
        return
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

    def save(self, directory: str | os.PathLike, format: Format = "auto") -> None:
        """The model (see save_model for the formats) and the tokenizer's files, in one atomic directory."""
        with atomic_directory(directory) as tmp:
            write_model_files(self.model, tmp, format)
            if self.tokenizer is not None:
                self.tokenizer.save(tmp)


TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "vocab.json")


def load(path: str | os.PathLike, heads: tuple[str, ...] | None = None) -> Pretrained:
    """Load a model directory (transformers' layout or bertology's native one, any supported family, with its heads)
    and its tokenizer."""
    from bertology.tokenization import load_tokenizer  # the tokenizer package imports nothing from the model

    model = load_model(path, heads)
    directory = Path(path)
    tokenizer = None
    if any((directory / name).is_file() for name in TOKENIZER_FILES):
        tokenizer = load_tokenizer(directory, model_type=model.config.family)
    return Pretrained(model=model, tokenizer=tokenizer)
