"""Checkpoints in and out: Hugging Face's layout, converted by one engine from each family's table
(`bertology.model.convert`, the tables in `bertology.model.families`), and bertology's native format
(bertology.json) for models transformers has no class for, which records the registered model class it rebuilds
(`bertology.model.registry`)."""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file
from torch import Tensor

from bertology.errors import BertologyError, CheckpointError
from bertology.inputs import json_file
from bertology.io import atomic_directory, recover
from bertology.model.config import TransformerConfig
from bertology.model.convert import (
    DEPTH_FIELDS,
    CheckpointFamily,
    check_depth,
    check_keys,
    checkpoint_family,
    config_from_hf,
    config_to_hf,
    declared_depths,
    family_for_config,
    from_state_dict,
    head_specs,
    name_map,
    named_parameters,
    registry,
    to_state_dict,
)
from bertology.model.encoder import HeadSpec
from bertology.model.elmo_format import read_elmo  # ELMo's released format (h5py is imported when it is read)
from bertology.model.int8 import is_quantized
from bertology.model.local import resolve_model_path
from bertology.model.protocol import Model
from bertology.model.registry import model_class, model_name, registered

__all__ = [  # what other modules import from here, the engine's names included
    "FAMILY_FIXED", "HEADS", "NATIVE_FILE", "TEXT_TO_TEXT", "TOKENIZER_FILES", "CheckpointFamily", "Pretrained",
    "architecture_name", "check_keys", "config_from_hf", "config_to_hf", "from_state_dict", "load", "load_model", "name_map",
    "read_json_object", "read_safetensors", "read_state_dict", "read_weights", "save_model", "to_state_dict",
    "write_model_files",
]


class FamilyView(Mapping[str, Any]):
    """A read-only view of one fact of every registered family, by model_type (families registered later
    included)."""

    def __init__(self, fact: Any) -> None:
        self.fact = fact

    def __getitem__(self, model_type: str) -> Any:
        return self.fact(registry()[model_type])

    def __iter__(self) -> Iterator[str]:
        return iter(registry())

    def __len__(self) -> int:
        return len(registry())


# model_type -> facts its config.json does not state; model_type -> head name -> (kind, activation, parts).
FAMILY_FIXED: Mapping[str, dict[str, Any]] = FamilyView(lambda family: dict(family.fixed))
HEADS: Mapping[str, dict[str, tuple[str, str | None, dict[str, str]]]] = FamilyView(
    lambda family: {name: head.as_tuple() for name, head in family.heads.items()})
# model_type -> whether sentence tasks fine-tune it as text-to-text by default (CheckpointFamily.text_to_text).
TEXT_TO_TEXT: Mapping[str, bool] = FamilyView(lambda family: family.text_to_text)

# Buffers some checkpoints carry that are not weights.
IGNORED_SUFFIXES = ("position_ids", "embeddings.token_type_ids")


def architecture_name(family: str, heads: tuple[str, ...]) -> str:
    """transformers' class name for a `family` model with exactly these heads (a CheckpointError when none has)."""
    return checkpoint_family(family, "model").architecture_name(tuple(heads))


def hf_layout_problem(model: Model) -> str | None:
    """Why `model` cannot be written in transformers' layout, or None when it can."""
    config = model.config
    try:
        family = family_for_config(config)
    except CheckpointError as error:
        return str(error)
    name = family.model_type
    if model.extensions:
        return f"it has extensions ({', '.join(model.extensions)})"
    stated = {key.field for key in family.config_keys}  # config.json carries these, whatever their value
    for fact, value in family.fixed.items():  # what transformers' classes of the family always are
        if fact not in stated and getattr(config, fact) != value:
            return f"its {fact} is {getattr(config, fact)!r}; transformers' {name} models have {value!r}"
    projects = any(o.startswith("encoder.embeddings.project.") for e in family.weights for o in e.ours)
    if getattr(config, "embedding_size", None) is not None and not projects:
        return f"it projects its embeddings (embedding_size), which transformers' {name} models do not"
    for spec in model.head_specs:
        head = family.heads_of(config).get(spec.name)
        if head is None:
            return f"transformers' {name} models have no head named {spec.name!r}"
        head = head.variant(spec.kind) or head
        act = head.activation or config.hidden_act
        if spec.kind != head.kind:
            return f"head {spec.name!r} is of kind {spec.kind!r}; transformers' {name} {spec.name!r} is {head.kind!r}"
        if spec.kind in ("masked_lm", "first_token", "token_mlp", "eos_token") and spec.activation != act:
            return f"head {spec.name!r} uses {spec.activation!r}; transformers' {name} {spec.name!r} uses {act!r}"
    try:
        family.architecture_name(tuple(spec.name for spec in model.head_specs), model_name(model))
    except CheckpointError as error:
        return str(error)
    # Parameters the table does not name: modules set by hand into a layer (adapters, wrapped projections).
    unnamed = sorted(set(model.state_dict()) - named_parameters(config, model.head_specs))
    if unnamed:
        return f"parameters {', '.join(unnamed[:5])}{' ...' if len(unnamed) > 5 else ''} have no transformers name"
    return None


# --- reading and writing ---------------------------------------------------------------------------------------------

NATIVE_FILE = "bertology.json"  # present: the directory is in bertology's own format
NATIVE_VERSION = 2  # 2: "model" names the registered class, "config" its config; 1: an EncoderModel under "encoder"
NATIVE_VERSIONS = (1, 2)
Format = Literal["auto", "hf", "native"]


def read_json_object(path: Path) -> dict[str, Any]:
    """A JSON object from `path`; anything else (bad UTF-8, bad JSON, a list) is a CheckpointError naming the file."""
    return json_file(path, CheckpointError)


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


def weight_file_name(directory: Path) -> str:
    """The weight file(s) of a model directory, as errors name them."""
    for name in ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin"):
        if (directory / name).is_file():
            return str(directory / name)
    return str(directory / "model.safetensors")


def stored_tensor_count(directory: Path) -> int | None:
    """How many tensors a model directory's safetensors weights hold, from their headers alone (nothing loaded);
    None when that cannot be told so (a pytorch_model.bin, an unreadable file: reading the weights says why)."""
    single, index = directory / "model.safetensors", directory / "model.safetensors.index.json"
    try:
        if single.is_file():
            paths = [single]
        elif index.is_file():
            weight_map = read_json_object(index).get("weight_map")
            if not isinstance(weight_map, dict):
                return None
            paths = [directory / shard for shard in sorted(set(map(str, weight_map.values())))]
        else:
            return None
        count = 0
        for path in paths:
            with safe_open(path, framework="pt") as handle:
                count += len(handle.keys())
        return count
    except (SafetensorError, OSError, ValueError, CheckpointError):
        return None


# Buffers a model builds beyond its weights (sinusoid tables sized by the declared positions) may hold at most this
# many values more than the weights do: nothing the file stores bounds them otherwise.
BUFFER_ALLOWANCE = 1 << 22


def planned(build: Any, weights: Mapping[str, Tensor], source: str) -> Model:
    """`build()` on the meta device: the model's parameter names and shapes, nothing allocated. Its buffers (which
    no weight file holds) may not outgrow the weights by more than BUFFER_ALLOWANCE values."""
    with torch.device("meta"):
        skeleton_model = build()
    stored = sum(tensor.numel() for tensor in weights.values())
    buffers = sum(buffer.numel() for buffer in skeleton_model.buffers())
    if buffers > stored + BUFFER_ALLOWANCE:
        raise CheckpointError(f"{source}: the model it declares builds {buffers} values of fixed tables (position "
                              f"sinusoids) beside {stored} stored weights: its positions or widths are larger than "
                              "any its weights were trained for")
    return skeleton_model


def load_model(directory: str | os.PathLike, heads: tuple[str, ...] | None = None) -> Model:
    """Build an EncoderModel from a model directory: transformers' layout (config.json), with the heads its
    architecture names, or bertology's native format (bertology.json), with its heads and extensions. `heads`
    overrides which heads are built (a subset of the saved ones, for the native format). `directory` may also be
    the name of an installed model (`bertology models`)."""
    directory = resolve_model_path(directory)
    recover(directory)  # a writer killed while replacing it left the previous directory aside
    if not directory.is_dir():
        raise CheckpointError(f"{directory}: no such model directory")
    if (directory / NATIVE_FILE).is_file():
        return load_native(directory, heads)
    config_path = directory / "config.json"
    if not config_path.is_file() and (directory / "options.json").is_file() and (directory / "weights.hdf5").is_file():
        return read_elmo(directory / "options.json", directory / "weights.hdf5")
    if not config_path.is_file():
        inside = sorted(sub.name for sub in directory.iterdir() if sub.is_dir() and not sub.name.startswith(".")
                        and ((sub / "config.json").is_file() or (sub / NATIVE_FILE).is_file()))
        if inside:  # a run folder (finetune --out, pretrain's output_dir) holds its model in a subfolder
            named = " or ".join(str(directory / name) for name in inside)
            raise CheckpointError(f"{directory}: config.json is missing; this folder holds a model in a subfolder: "
                                  f"give {named}")
        raise CheckpointError(f"{directory}: config.json is missing")
    hf = read_json_object(config_path)
    family = checkpoint_family(hf.get("model_type"), str(config_path))
    # The depths config.json declares against what the weights hold, before anything is built from them (a
    # Longformer's windows, one a layer, included).
    tensors = stored_tensor_count(directory)
    if tensors is not None:
        check_depth(declared_depths(family, hf), tensors, str(config_path), weight_file_name(directory))
    config = config_from_hf(hf, str(config_path))
    weights = read_weights(directory)
    check_depth(declared_depths(family, hf), len(weights), str(config_path), weight_file_name(directory))
    if family.check_checkpoint is not None:
        family.check_checkpoint(config, weights, str(config_path))
    architectures = hf.get("architectures") or [family.class_stem + "Model"]
    if not isinstance(architectures, list):
        raise CheckpointError(f"{config_path}: architectures: expected a list of class names, got {architectures!r}")
    if heads is None:
        heads = family.architecture_heads(architectures[0], str(config_path))
    # The registered class the architecture builds (T5EncoderModel: an encoder stack), chosen heads or not.
    built = family.model_for(architectures[0][len(family.class_stem):]) if isinstance(architectures[0], str) \
        else family.model
    prefix = family.base_prefix(tuple(heads))
    prefixed = bool(prefix) and any(k.startswith(prefix + ".") for k in weights)
    if getattr(config, "pooler", False):  # a BERT-style checkpoint without pooler weights (a masked-LM one) has none
        base = prefix + "." if prefixed else ""
        config.pooler = any(base + key in weights for entry in family.weights if entry.when == "pooler"
                            for key in entry.theirs)
    specs = head_specs(family, config, tuple(heads), weights, str(config_path))
    # Every shape the config declares is compared with the stored ones on a meta-device skeleton first: a config
    # declaring a hidden size of 2**20 is refused, naming the weights that do not fit, before anything is allocated.
    skeleton_model = planned(lambda: model_class(built)(config, specs), weights, str(config_path))
    try:
        state = to_state_dict(skeleton_model, weights, prefixed, str(directory), family)
    except CheckpointError as error:
        raise CheckpointError(f"{error} (the model's shapes are those {config_path} declares)") from None
    model = model_class(built)(config, specs)
    model.load_state_dict(state)
    return model.eval()


# --- the native format ------------------------------------------------------------------------------------------------


def native_metadata(model: Model) -> dict[str, Any]:
    return {
        "format": "bertology",
        "version": NATIVE_VERSION,
        "model": model_name(model),
        "config": model.config.to_dict(),
        "heads": [dataclasses.asdict(spec) for spec in model.head_specs],
        "extensions": {where: {"factory": factory, "options": options}
                       for where, (factory, options) in model.extensions.items()},
    }


def skeleton(metadata: dict[str, Any], source: str) -> Model:
    """The model `metadata` (bertology.json) describes, on the meta device: its parameter names and shapes only."""
    with torch.device("meta"):
        return build_native(metadata, source)


def build_native(metadata: dict[str, Any], source: str) -> Model:
    """The registered model class `metadata` names, built from its config, heads and extensions (version 1 files
    hold an EncoderModel's config under "encoder")."""
    try:
        if metadata.get("version") == 1:
            entry, config_data = registered("encoder"), metadata["encoder"]
        else:
            entry, config_data = registered(metadata["model"]), metadata["config"]
        config = entry.config_class.from_dict(config_data)
        specs = [HeadSpec(**spec) for spec in metadata["heads"]]
        extensions = metadata.get("extensions", {})
        model = entry.cls(config, specs)
        for where, extension in extensions.items():
            model.add_extension(where, extension["factory"], **extension["options"])
    except (BertologyError, KeyError, TypeError, AttributeError) as error:
        what = f"missing key {error}" if isinstance(error, KeyError) else str(error)
        raise CheckpointError(f"{source}: cannot build the model it describes: {what}") from None
    return model


def write_native(model: Model, directory: Path) -> None:
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


def read_state_dict(directory: str | os.PathLike, model: Model) -> dict[str, Tensor]:
    """The weights of a model directory in either format as `model`'s state dict (for resuming into a model built
    already); missing, unexpected and mis-shaped keys are one CheckpointError."""
    directory = Path(directory)
    if not (directory / NATIVE_FILE).is_file():
        weights = read_weights(directory)
        family = family_for_config(model.config)
        prefix = family.base_prefix(tuple(spec.name for spec in model.head_specs))
        prefixed = bool(prefix) and any(k.startswith(prefix + ".") for k in weights)
        return to_state_dict(model, weights, prefixed, str(directory), family)
    weights = read_weights(directory, renamed=False)
    check_native_keys(str(directory), model, weights)
    return weights


def check_native_keys(source: str, model: Model, weights: dict[str, Tensor]) -> None:
    expected = model.state_dict()
    mismatched = [f"{k}: checkpoint {tuple(weights[k].shape)}, model {tuple(v.shape)}"
                  for k, v in expected.items() if k in weights and weights[k].shape != v.shape]
    check_keys(source, getattr(model.config, "family", type(model).__name__), sorted(set(expected) - set(weights)),
               sorted(set(weights) - set(expected)), mismatched)


def load_native(directory: Path, heads: tuple[str, ...] | None) -> Model:
    path = directory / NATIVE_FILE
    metadata = read_json_object(path)
    if metadata.get("format") != "bertology" or metadata.get("version") not in NATIVE_VERSIONS:
        raise CheckpointError(f"{path}: expected format \"bertology\" version "
                              f"{' or '.join(map(str, NATIVE_VERSIONS))}, got {metadata.get('format')!r} version "
                              f"{metadata.get('version')!r}")
    weights = read_weights(directory, renamed=False)
    if heads is not None:  # keep the chosen heads, drop the others' weights
        saved = {spec.get("name") for spec in metadata.get("heads", []) if isinstance(spec, dict)}
        absent = [name for name in heads if name not in saved]
        if absent:
            raise CheckpointError(f"{path}: has no head(s) {', '.join(absent)}; it has {', '.join(sorted(saved))}")
        metadata = {**metadata, "heads": [spec for spec in metadata["heads"] if spec["name"] in heads]}
        dropped = tuple(f"heads.{name}." for name in saved - set(heads))
        weights = {k: v for k, v in weights.items() if not k.startswith(dropped)}
    config_data = metadata.get("encoder" if metadata.get("version") == 1 else "config")
    if isinstance(config_data, dict):  # the depths declared against the weights, before any module is built
        check_depth({f"config.{field}": config_data.get(field) for field in DEPTH_FIELDS}, len(weights), str(path),
                    str(directory / "model.safetensors"))
    # The shapes declared against the stored ones on a meta-device skeleton, before anything is allocated.
    skeleton_model = planned(lambda: build_native(metadata, str(path)), weights, str(path))
    try:
        check_native_keys(str(directory), skeleton_model, weights)
    except CheckpointError as error:
        raise CheckpointError(f"{error} (the model's shapes are those {path} declares)") from None
    model = build_native(metadata, str(path))
    model.load_state_dict(weights)
    return model.eval()


# --- saving in either format ----------------------------------------------------------------------------------------


def save_model(model: Model, directory: str | os.PathLike, extra_files: dict[str, str] | None = None,
               format: Format = "auto") -> None:
    """Write the model (atomically: a killed save leaves any previous checkpoint intact). "hf": transformers' layout
    (config.json and model.safetensors); "native": bertology's (bertology.json and model.safetensors under our
    parameter names), for heads transformers has no class for and for extensions; "auto": HF when it applies."""
    with atomic_directory(directory) as tmp:
        write_model_files(model, tmp, format)
        for name, text in (extra_files or {}).items():
            (tmp / name).write_text(text, encoding="utf-8")


def write_model_files(model: Model, directory: Path, format: Format = "auto") -> None:
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
    config = config_to_hf(model.config, model.head_specs, model_name(model))
    (directory / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    save_file(from_state_dict(model), directory / "model.safetensors", metadata={"format": "pt"})


@dataclass
class Pretrained:
    """A loaded checkpoint: the model (in eval mode), its tokenizer, and the directory it was loaded from (None
    for a model built in memory; `bertology.embed` reads a sentence-transformers directory's settings there)."""

    model: Model
    tokenizer: Any  # bertology.tokenization.Tokenizer, or None for a directory without tokenizer files
    directory: Path | None = None

    @property
    def config(self) -> TransformerConfig:
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
    from bertology.tokenization.words import WordVocabulary

    directory = resolve_model_path(path)
    model = load_model(directory, heads)
    tokenizer = None
    if getattr(model.config, "family", None) == "elmo":  # a word vocabulary (ELMo's softmax), if one is there
        return Pretrained(model=model, tokenizer=WordVocabulary.find(directory), directory=directory)
    if any((directory / name).is_file() for name in TOKENIZER_FILES):
        from bertology.tokenization._pipeline import MODEL_TYPE_STYLE

        # A family with a framing of its own names it; a model built here (a native "transformer" decoder) lets the
        # tokenizer's files say which framing they have.
        family = getattr(model.config, "family", None)
        tokenizer = load_tokenizer(directory, model_type=family if family in MODEL_TYPE_STYLE else None)
    return Pretrained(model=model, tokenizer=tokenizer, directory=directory)
