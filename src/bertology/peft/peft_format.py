"""LoRA in Hugging Face peft's files: `adapter_config.json` and `adapter_model.safetensors`, named for the transformers
model that bertology's checkpoint tables map the encoder to (bertology.model.checkpoint.name_map). For BERT with a
classifier, `encoder.layers.0.query.lora_A` is `base_model.model.bert.encoder.layer.0.attention.self.query.lora_A.weight`,
and trained modules that are not LoRA (the heads) are `modules_to_save`, stored under their transformers names.

Only the file format is shared with peft: bertology never imports it.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

from safetensors.torch import save_file
from torch import Tensor

from bertology.errors import CheckpointError, ConfigError
from bertology.io import atomic_directory
from bertology.model.checkpoint import HEADS, Pretrained, load, name_map, read_json_object, read_safetensors
from bertology.model.convert import family_for_config
from bertology.model.encoder import EncoderModel
from bertology.peft.common import freeze_base
from bertology.peft.lora import FACTORY as LORA, LoRALinear

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
PREFIX = "base_model.model."
# The peft task type of a model by its primary head (transformers' class for it); None: a plain PeftModel.
TASK_TYPES: dict[str, str] = {"classifier": "SEQ_CLS", "token_classifier": "TOKEN_CLS", "qa": "QUESTION_ANS"}


def hf_state(model: EncoderModel, prefixed: bool) -> tuple[dict[str, str], dict[str, Tensor]]:
    """Our name -> transformers' name for the base parameters, and the base state under transformers' names
    (tied MLM decoders included, as transformers' state dict has them)."""
    mapping = name_map(model.config, model.head_specs, prefixed)
    state = model.state_dict()
    out = {theirs: state[ours] for ours, theirs in mapping.items()}
    for spec in model.head_specs:
        tied = HEADS[model.config.family][spec.name][2].get("tied")
        if tied is not None:
            out[f"{tied}.weight"] = state["encoder.embeddings.word.weight"]
            out[f"{tied}.bias"] = state[f"heads.{spec.name}.bias"]
    return mapping, out


def module_names(parameter_names: list[str]) -> set[str]:
    """Every module path that holds one of the parameters, containers included."""
    out = set()
    for name in parameter_names:
        parts = name.split(".")[:-1]
        out.update(".".join(parts[:i]) for i in range(1, len(parts) + 1))
    return out


def target_modules(targeted: set[str], every_module: set[str]) -> list[str]:
    """peft matches a target t against a module name n when n == t or n ends with "." + t. Short names (the last
    component, as in ["query", "value"]) when they match exactly the targeted modules, else their full names."""
    short = sorted({name.rsplit(".", 1)[-1] for name in targeted})
    matched = {n for n in every_module for t in short if n == t or n.endswith("." + t)}
    return short if matched == targeted else sorted(targeted)


def save_lora_peft(model: EncoderModel, directory: str | os.PathLike, base_model_name_or_path: str | None = None,
                   task_type: str | None = "auto") -> dict[str, Any]:
    """Write `model`'s LoRA layers (and, under modules_to_save, its heads and any other trainable module) as peft's
    LoRA adapter files, atomically. `task_type` "auto" follows the primary head (SEQ_CLS, TOKEN_CLS, QUESTION_ANS,
    FEATURE_EXTRACTION without heads, none otherwise). Returns the adapter config written."""
    others = [where for where, (factory, _) in model.extensions.items() if factory != LORA]
    if others:
        raise ConfigError(f"peft's LoRA format holds LoRA layers only; the model also has {', '.join(others)}")
    layers = {where: model.get_submodule(where) for where in model.extensions}
    if not layers:
        raise ConfigError("the model has no LoRA layers to save (bertology.peft.apply_lora)")
    settings = {(m.rank, m.alpha, m.dropout) for m in layers.values() if isinstance(m, LoRALinear)}
    if len(settings) != 1:
        raise ConfigError(f"peft's LoRA files hold one rank, alpha and dropout; the model's LoRA layers have "
                          f"{sorted(settings)}")
    rank, alpha, dropout = settings.pop()
    prefixed = bool(model.head_specs)  # transformers' task models put the encoder under e.g. "bert."
    mapping, base = hf_state(model, prefixed)
    tensors: dict[str, Tensor] = {}
    targeted = set()
    for where, module in layers.items():
        theirs = mapping.get(f"{where}.weight")
        if theirs is None:
            raise ConfigError(f"LoRA layer {where!r} has no transformers name")
        name = theirs.removesuffix(".weight")
        targeted.add(name)
        tensors[f"{PREFIX}{name}.lora_A.weight"] = module.lora_A
        tensors[f"{PREFIX}{name}.lora_B.weight"] = module.lora_B
    # Modules saved whole: the heads (often new, so their weights must travel) and any trainable base parameter.
    lora_params = {id(p) for m in layers.values() for p in (m.lora_A, m.lora_B)}
    saved = {name for name, p in model.named_parameters()
             if name.startswith("heads.") or (p.requires_grad and id(p) not in lora_params)}
    unnamed = sorted(name for name in saved if name not in mapping)
    if unnamed:
        raise ConfigError(f"trainable parameters {', '.join(unnamed[:5])} have no transformers name")
    # A head is saved as its top module (transformers' "classifier", "cls", "qa_outputs"): peft wraps the module it
    # names, and a task type's own entry (SEQ_CLS adds "classifier") must not wrap a module inside another one.
    to_save = {mapping[name].split(".", 1)[0] if name.startswith("heads.") else mapping[name].rsplit(".", 1)[0]
               for name in saved}
    to_save = sorted(m for m in to_save if not any(m.startswith(other + ".") for other in to_save))
    for module in to_save:
        tensors.update({f"{PREFIX}{k}": v for k, v in base.items() if k.startswith(module + ".")})
    every_module = module_names(list(base))
    if task_type == "auto":
        task_type = TASK_TYPES.get(model.head_specs[0].name) if model.head_specs else "FEATURE_EXTRACTION"
    config = {
        "peft_type": "LORA",
        "task_type": task_type,
        "base_model_name_or_path": base_model_name_or_path,
        "r": rank,
        "lora_alpha": alpha,
        "lora_dropout": dropout,
        "target_modules": target_modules(targeted, every_module),
        "modules_to_save": to_save or None,
        "bias": "none",
        "fan_in_fan_out": False,
        "use_rslora": False,
        "use_dora": False,
        "init_lora_weights": True,
        "layers_to_transform": None,
        "layers_pattern": None,
        "rank_pattern": {},
        "alpha_pattern": {},
        "inference_mode": True,
    }
    with atomic_directory(directory) as tmp:
        (tmp / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
        save_file({k: v.detach().contiguous().clone() for k, v in tensors.items()}, tmp / WEIGHTS_FILE,
                  metadata={"format": "pt"})
    return config


# peft settings bertology's LoRA does not have: (key, the value it must have).
UNSUPPORTED = (("use_dora", False), ("fan_in_fan_out", False), ("bias", "none"), ("alpha_pattern", {}),
               ("target_parameters", None), ("lora_bias", False))


def load_lora_peft(base: str | os.PathLike | EncoderModel | Pretrained, directory: str | os.PathLike, *,
                   train_heads: bool = True) -> EncoderModel:
    """Apply a peft LoRA adapter directory to a bertology model: a model directory (loaded with bertology.load), a
    Pretrained, or an EncoderModel (extended in place). Its LoRA layers become LoRALinear extensions and its
    modules_to_save replace the model's weights. The LoRA parameters and the saved modules train, the rest is frozen
    (the heads too unless `train_heads` is False). Returns the model in eval mode."""
    directory = Path(directory)
    config_path, weights_path = directory / CONFIG_FILE, directory / WEIGHTS_FILE
    for path in (config_path, weights_path):
        if not path.is_file():
            raise CheckpointError(f"{path}: missing (a peft adapter directory holds {CONFIG_FILE} and {WEIGHTS_FILE})")
    config = read_json_object(config_path)
    if config.get("peft_type") != "LORA":
        raise CheckpointError(f"{config_path}: peft_type {config.get('peft_type')!r} is not LORA")
    for key, value in UNSUPPORTED:
        if config.get(key, value) not in (value, None if value == {} else value):
            raise CheckpointError(f"{config_path}: {key} {config[key]!r} is not supported by bertology's LoRA")
    try:
        rank, alpha = int(config["r"]), float(config["lora_alpha"])
        dropout = float(config.get("lora_dropout") or 0.0)
    except (KeyError, TypeError, ValueError) as error:
        raise CheckpointError(f"{config_path}: needs numbers r and lora_alpha ({error})") from None
    weights = read_safetensors(weights_path)
    model = base.model if isinstance(base, Pretrained) else base if isinstance(base, EncoderModel) else load(base).model
    family_prefix = family_for_config(model.config).prefix + "."
    stripped = {k.removeprefix(PREFIX): v for k, v in weights.items()}
    prefixed = any(k.startswith(family_prefix) for k in stripped)
    mapping = name_map(model.config, model.head_specs, prefixed)
    ours_of = {theirs: ours for ours, theirs in mapping.items()}
    tied = {f"{t}.{p}" for spec in model.head_specs for t in [HEADS[model.config.family][spec.name][2].get("tied")]
            if t is not None for p in ("weight", "bias")}
    lora: dict[str, dict[str, Tensor]] = {}
    replaced: dict[str, Tensor] = {}
    for key, tensor in stripped.items():
        for part in ("lora_A", "lora_B"):
            if key.endswith(f".{part}.weight"):
                module = key.removesuffix(f".{part}.weight")
                ours = ours_of.get(f"{module}.weight")
                if ours is None:
                    raise CheckpointError(f"{weights_path}: {key}: no module {module!r} in a {model.config.family} "
                                          "model bertology can wrap")
                lora.setdefault(ours.removesuffix(".weight"), {})[part] = tensor
                break
        else:
            if key in ours_of:
                replaced[ours_of[key]] = tensor
            elif key not in tied:  # a tied MLM decoder: the word embeddings and the head's bias hold it
                raise CheckpointError(f"{weights_path}: unexpected key {PREFIX}{key} for this {model.config.family} "
                                      f"model (heads: {', '.join(s.name for s in model.head_specs) or 'none'})")
    if not lora:
        raise CheckpointError(f"{weights_path}: holds no lora_A / lora_B weights")
    state = model.state_dict()
    for where, pair in sorted(lora.items()):
        if set(pair) != {"lora_A", "lora_B"}:
            raise CheckpointError(f"{weights_path}: {where} has {', '.join(pair)} but not both lora_A and lora_B")
        a, b = pair["lora_A"], pair["lora_B"]
        r = a.shape[0]
        if r != rank and not config.get("rank_pattern"):
            raise CheckpointError(f"{weights_path}: {where}: lora_A has rank {r}, the config's r is {rank}")
        # peft scales by alpha / r (alpha / sqrt(r) with rsLoRA), bertology by alpha / rank: the same update.
        scaling = alpha / (math.sqrt(r) if config.get("use_rslora") else r)
        module = model.add_extension(where, LORA, rank=r, alpha=scaling * r, dropout=dropout)
        if a.shape != module.lora_A.shape or b.shape != module.lora_B.shape:
            raise CheckpointError(f"{weights_path}: {where}: lora_A {tuple(a.shape)} and lora_B {tuple(b.shape)} do "
                                  f"not fit a [{module.out_features} x {module.in_features}] projection at rank {r}")
        replaced[f"{where}.lora_A"], replaced[f"{where}.lora_B"] = a, b
    for name, tensor in replaced.items():
        if name in state and tensor.shape != state[name].shape:
            raise CheckpointError(f"{weights_path}: {name}: file {tuple(tensor.shape)}, model {tuple(state[name].shape)}")
    model.load_state_dict(replaced, strict=False)
    saved_modules = [name for name in replaced if ".lora_" not in name]
    freeze_base(model, train_heads, saved_modules)
    return model.eval()
