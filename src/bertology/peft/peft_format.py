"""LoRA in Hugging Face peft's files: `adapter_config.json` and `adapter_model.safetensors`, named for the transformers
model that bertology's checkpoint tables map the model to (bertology.model.convert's entries). For BERT with a
classifier, `encoder.layers.0.query.lora_A` is `base_model.model.bert.encoder.layer.0.attention.self.query.lora_A.weight`,
and trained modules that are not LoRA (the heads) are `modules_to_save`, stored under their transformers names.
GPT-2's Conv1D modules store weights transposed (peft's fan_in_fan_out; LoRA's A and B are the same either way), and
its fused `c_attn` holds LoRA on our query/key/value as one block-structured pair (`fused_pair`, `split_fused`).

Only the file format is shared with peft: bertology never imports it.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file
from torch import Tensor

from bertology.errors import CheckpointError, ConfigError
from bertology.io import atomic_directory
from bertology.model.checkpoint import Pretrained, load, read_json_object, read_safetensors
from bertology.model.convert import Bound, Rename, Split, Tie, Transpose, family_for_config, model_entries
from bertology.model.protocol import Model
from bertology.model.registry import model_name
from bertology.peft.common import freeze_base
from bertology.peft.lora import FACTORY as LORA, LoRALinear

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
PREFIX = "base_model.model."
# The peft task type of a model by its primary head (transformers' class for it); None: a plain PeftModel.
TASK_TYPES: dict[str, str] = {"classifier": "SEQ_CLS", "token_classifier": "TOKEN_CLS", "qa": "QUESTION_ANS"}
# A language-model head on a decoder or an encoder-decoder: peft's generation task types.
LM_KINDS = ("tied_lm", "tied_lm_bias", "lm")
LM_TASK_TYPES = {"decoder": "CAUSAL_LM", "seq2seq": "SEQ_2_SEQ_LM"}
# safetensors metadata of a bertology-written adapter: fused module -> [[our projection, rank], ...] (save_lora_peft)
FUSED_KEY = "bertology.fused_lora"


@dataclass(frozen=True)
class Form:
    """Where one of our projections is in transformers' model: the module `module`, a Conv1D storing its weight
    transposed (`conv1d`: peft's fan_in_fan_out) or an nn.Linear; for a fused projection (GPT-2's `c_attn`) the
    projections `parts` whose outputs it stacks, `rows` wide each, of which ours is number `part`."""

    module: str
    conv1d: bool
    parts: tuple[str, ...] = ()
    rows: tuple[int, ...] = ()
    part: int = 0


def hf_state(model: Model, prefixed: bool) -> tuple[dict[str, Bound], dict[str, Tensor]]:
    """The family's entry holding each of our parameters, and the base state under transformers' names (tied
    copies included, as transformers' state dict has them)."""
    family = family_for_config(model.config)
    state = model.state_dict()
    entry_of: dict[str, Bound] = {}
    out: dict[str, Tensor] = {}
    for entry in model_entries(model, prefixed, family):
        tensors = [state[o] for o in entry.ours]
        if isinstance(entry.transform, Tie):
            out.update(zip(entry.theirs, tensors))
            continue
        out.update(zip(entry.theirs, entry.transform.save(tensors, model.config)))
        entry_of.update((o, entry) for o in entry.ours)
    return entry_of, out


def projection_forms(model: Model, entry_of: Mapping[str, Bound]) -> dict[str, Form]:
    """Our projection path -> its `Form` in transformers' model, for every projection stored as a weight matrix
    (renamed, transposed, or one slice of the output rows of a fused weight)."""
    forms: dict[str, Form] = {}
    for name, entry in entry_of.items():
        if not name.endswith(".weight"):
            continue
        path, transform = name.removesuffix(".weight"), entry.transform
        module = entry.theirs[0].removesuffix(".weight")
        if isinstance(transform, (Rename, Transpose)) and len(entry.ours) == 1 and entry.theirs[0].endswith(".weight"):
            forms[path] = Form(module, isinstance(transform, Transpose))
        elif isinstance(transform, Split) and transform.dim == 0 and all(o.endswith(".weight") for o in entry.ours):
            parts = tuple(o.removesuffix(".weight") for o in entry.ours)
            rows = tuple(model.get_submodule(p).weight.shape[0] for p in parts)
            forms[path] = Form(module, transform.transpose, parts, rows, parts.index(path))
    return forms


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


def peft_architecture(model: Model) -> str | None:
    """transformers' class that peft would wrap for `model` (its family's, for its heads), or None when transformers
    has none (an encoder-decoder's encoder with a head of BART's family, a family of bertology's own)."""
    try:
        return family_for_config(model.config).architecture_name(tuple(h.name for h in model.head_specs),
                                                                  model_name(model))
    except CheckpointError:
        return None


def task_type_of(model: Model) -> str | None:
    """peft's task type for `model` by its primary head (none for a head peft has no task for)."""
    if not model.head_specs:
        return "FEATURE_EXTRACTION"
    head = model.head_specs[0]
    if head.kind in LM_KINDS and model_name(model) in LM_TASK_TYPES:
        return LM_TASK_TYPES[model_name(model)]
    return TASK_TYPES.get(head.name)


def fused_pair(form: Form, layers: Mapping[str, LoRALinear]) -> tuple[Tensor, Tensor, list[list[Any]]]:
    """The LoRA layers on the parts of one fused projection as one exact pair: A stacks their A's ([sum r, in]),
    B puts each B in its own rows and columns ([sum rows, sum r], zero elsewhere), so that
    B A x = [B_q A_q x; 0; B_v A_v x] (a part without LoRA gets zero rows). Needs one scaling for all parts.
    Also returns [[our path, rank], ...]: what the fused pair was made of."""
    present = [(i, layers[p]) for i, p in enumerate(form.parts) if p in layers]
    starts = [sum(form.rows[:i]) for i in range(len(form.rows))]
    a = torch.cat([m.lora_A.detach() for _, m in present])
    b = a.new_zeros(sum(form.rows), a.shape[0])
    column = 0
    for i, m in present:
        b[starts[i]:starts[i] + form.rows[i], column:column + m.rank] = m.lora_B.detach()
        column += m.rank
    return a, b, [[form.parts[i], m.rank] for i, m in present]


def save_lora_peft(model: Model, directory: str | os.PathLike, base_model_name_or_path: str | None = None,
                   task_type: str | None = "auto") -> dict[str, Any]:
    """Write `model`'s LoRA layers (and, under modules_to_save, its heads and any other trainable module) as peft's
    LoRA adapter files, atomically, for the transformers model of its family (encoders, GPT-2, BART, T5).
    `task_type` "auto" follows the primary head (SEQ_CLS, TOKEN_CLS, QUESTION_ANS, CAUSAL_LM or SEQ_2_SEQ_LM for a
    language-model head, FEATURE_EXTRACTION without heads). Returns the adapter config written.

    A fused projection (GPT-2's `c_attn`, transformers' Conv1D holding query, key and value) is one peft LoRA
    module: LoRA on any of our query/key/value there is written as one pair of rank r x (number of them) whose B is
    block-structured (`fused_pair`), with the alpha that keeps alpha / r (peft's rank_pattern and alpha_pattern
    where modules differ); Conv1D modules set fan_in_fan_out. What peft's format cannot hold is refused: LoRA layers
    of different rank, alpha or dropout, Conv1D and nn.Linear targets in one model (peft has one fan_in_fan_out),
    a trainable parameter transformers keeps outside a module (BART's final_logits_bias buffer) or inside a module
    that also has LoRA."""
    if peft_architecture(model) is None:
        raise ConfigError(f"peft's LoRA files name the modules of transformers' model; transformers has no class for "
                          f"this {type(model).__name__} with heads {[h.name for h in model.head_specs]}")
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
    prefixed = bool(model.head_specs)  # transformers' task models put the base model under e.g. "bert."
    entry_of, base = hf_state(model, prefixed)
    forms = projection_forms(model, entry_of)
    tensors: dict[str, Tensor] = {}
    modules: dict[str, tuple[int, float]] = {}  # peft module -> (rank, alpha)
    fused: dict[str, list[list[Any]]] = {}
    conv1d = set()
    for where in layers:
        form = forms.get(where)
        if form is None:
            raise ConfigError(f"LoRA layer {where!r} has no transformers module of its own in peft's format")
        conv1d.add(form.conv1d)
        if form.module in modules:
            continue
        if form.parts:
            a, b, fused[form.module] = fused_pair(form, layers)  # type: ignore[arg-type]
            count = len(fused[form.module])
            modules[form.module] = (rank * count, alpha * count)  # alpha / r unchanged
        else:
            a, b = layers[where].lora_A, layers[where].lora_B
            modules[form.module] = (rank, alpha)
        tensors[f"{PREFIX}{form.module}.lora_A.weight"] = a
        tensors[f"{PREFIX}{form.module}.lora_B.weight"] = b
    if len(conv1d) > 1:
        raise ConfigError("peft's LoRA files have one fan_in_fan_out: this model's LoRA layers are on both Conv1D and "
                          "nn.Linear modules of transformers' model")
    # Modules saved whole: the heads (often new, so their weights must travel) and any trainable base parameter.
    lora_params = {id(p) for m in layers.values() for p in (m.lora_A, m.lora_B)}
    # A frozen language-model head is the base model's own (peft's CAUSAL_LM and SEQ_2_SEQ_LM leave it out).
    lm_heads = tuple(f"heads.{h.name}." for h in model.head_specs if h.kind in LM_KINDS)
    saved = sorted(name for name, p in model.named_parameters() if id(p) not in lora_params and (
        p.requires_grad or (name.startswith("heads.") and not name.startswith(lm_heads))))
    to_save = set()
    for name in saved:
        entry = entry_of.get(name)
        if entry is None:
            raise ConfigError(f"trainable parameter {name} has no transformers name")
        theirs = entry.theirs[0]
        if not isinstance(entry.transform, (Rename, Transpose)) or "." not in theirs:
            raise ConfigError(f"trainable parameter {name} is transformers' {theirs!r}, which is not a module's "
                              "parameter: peft's modules_to_save cannot hold it (keep it frozen, e.g. "
                              "apply_lora(..., train_heads=False))")
        # A head is saved as its top module (transformers' "classifier", "cls", "score"): peft wraps the module it
        # names, and a task type's own entry (SEQ_CLS adds "classifier") must not wrap a module inside another one.
        to_save.add(theirs.split(".", 1)[0] if name.startswith("heads.") else theirs.rsplit(".", 1)[0])
    to_save = {m for m in to_save if not any(m.startswith(other + ".") for other in to_save)}
    clash = sorted(m for m in to_save for t in modules if t == m or t.startswith(m + "."))
    if clash:
        raise ConfigError(f"module {clash[0]} would be saved whole and also holds LoRA layers; peft cannot do both")
    for module in sorted(to_save):
        tensors.update({f"{PREFIX}{k}": v for k, v in base.items() if k.startswith(module + ".")})
    every_module = module_names(list(base))
    if task_type == "auto":
        task_type = task_type_of(model)
    # The commonest (rank, alpha) is the config's, the smaller rank on a tie; the others are patterns.
    counts = Counter(modules.values())
    r, lora_alpha = max(counts, key=lambda pair: (counts[pair], -pair[0]))
    config = {
        "peft_type": "LORA",
        "task_type": task_type,
        "base_model_name_or_path": base_model_name_or_path,
        "r": r,
        "lora_alpha": lora_alpha,
        "lora_dropout": dropout,
        "target_modules": target_modules(set(modules), every_module),
        "modules_to_save": sorted(to_save) or None,
        "bias": "none",
        "fan_in_fan_out": conv1d == {True},
        "use_rslora": False,
        "use_dora": False,
        "init_lora_weights": True,
        "layers_to_transform": None,
        "layers_pattern": None,
        "rank_pattern": {re.escape(m): ra[0] for m, ra in sorted(modules.items()) if ra[0] != r},
        "alpha_pattern": {re.escape(m): ra[1] for m, ra in sorted(modules.items()) if ra[1] != lora_alpha},
        "inference_mode": True,
    }
    metadata = {"format": "pt"}
    if fused:  # which of our projections each fused pair holds, so that bertology reads it back as it was
        metadata[FUSED_KEY] = json.dumps(fused, sort_keys=True)
    with atomic_directory(directory) as tmp:
        (tmp / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
        save_file({k: v.detach().contiguous().clone() for k, v in tensors.items()}, tmp / WEIGHTS_FILE,
                  metadata=metadata)
    return config


# peft settings bertology's LoRA does not have: (key, the value it must have).
UNSUPPORTED = (("use_dora", False), ("bias", "none"), ("target_parameters", None), ("lora_bias", False))


def pattern_value(patterns: Mapping[str, Any], module: str, default: Any) -> Any:
    """peft's rank_pattern / alpha_pattern lookup: the first key that, as a regular expression, matches the end of
    the module's name at a component boundary."""
    for key, value in patterns.items():
        if re.match(rf"(.*\.)?({key})$", module):
            return value
    return default


def fused_metadata(path: Path) -> dict[str, Any]:
    """The fused pairs a bertology-written adapter records (see save_lora_peft); {} for any other file."""
    try:
        with safe_open(path, "pt") as handle:
            text = (handle.metadata() or {}).get(FUSED_KEY)
        return json.loads(text) if text else {}
    except (SafetensorError, OSError, ValueError) as error:
        raise CheckpointError(f"{path}: not a readable safetensors file ({error})") from None


def split_fused(module: str, form: Form, a: Tensor, b: Tensor, recorded: Any, where: str
                ) -> dict[str, tuple[Tensor, Tensor]]:
    """One fused projection's peft pair as LoRA pairs on our parts, exactly (B A x gives the same rows). A pair
    bertology wrote (`recorded`: [[part, rank], ...]) splits back into the pairs it was made of; any other gives each
    part the whole A and its rows of B (rank r each: the parts' A's train apart from then on)."""
    starts = [sum(form.rows[:i]) for i in range(len(form.rows))]
    rows = {p: slice(starts[i], starts[i] + form.rows[i]) for i, p in enumerate(form.parts)}
    if not recorded:
        return {p: (a.clone(), b[rows[p]].clone()) for p in form.parts}
    if not (isinstance(recorded, list) and all(isinstance(x, list) and len(x) == 2 and x[0] in rows
                                               and isinstance(x[1], int) for x in recorded)) \
            or sum(x[1] for x in recorded) != a.shape[0]:
        raise CheckpointError(f"{where}: the record of fused module {module} ({recorded!r}) does not fit its "
                              f"lora_A {tuple(a.shape)}")
    out, column = {}, 0
    for part, r in recorded:
        out[part] = (a[column:column + r].clone(), b[rows[part], column:column + r].clone())
        column += r
    return out


def load_lora_peft(base: str | os.PathLike | Model | Pretrained, directory: str | os.PathLike, *,
                   train_heads: bool = True) -> Model:
    """Apply a peft LoRA adapter directory to a bertology model: a model directory (loaded with bertology.load), a
    Pretrained, or a model (extended in place). Its LoRA layers become LoRALinear extensions (a fused module's,
    GPT-2's c_attn, LoRA on our query, key and value: see `split_fused`) and its modules_to_save replace the
    model's weights. The LoRA parameters and the saved modules train, the rest is frozen (the heads too unless
    `train_heads` is False). Returns the model in eval mode."""
    directory = Path(directory)
    config_path, weights_path = directory / CONFIG_FILE, directory / WEIGHTS_FILE
    for path in (config_path, weights_path):
        if not path.is_file():
            raise CheckpointError(f"{path}: missing (a peft adapter directory holds {CONFIG_FILE} and {WEIGHTS_FILE})")
    config = read_json_object(config_path)
    if config.get("peft_type") != "LORA":
        raise CheckpointError(f"{config_path}: peft_type {config.get('peft_type')!r} is not LORA")
    for key, value in UNSUPPORTED:
        if config.get(key, value) not in (value, None):
            raise CheckpointError(f"{config_path}: {key} {config[key]!r} is not supported by bertology's LoRA")
    try:
        rank, alpha = int(config["r"]), float(config["lora_alpha"])
        dropout = float(config.get("lora_dropout") or 0.0)
        rank_pattern = dict(config.get("rank_pattern") or {})
        alpha_pattern = {k: float(v) for k, v in (config.get("alpha_pattern") or {}).items()}
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        raise CheckpointError(f"{config_path}: needs numbers r and lora_alpha, and patterns mapping names to numbers "
                              f"({error})") from None
    weights = read_safetensors(weights_path)
    recorded = fused_metadata(weights_path)
    if isinstance(base, Pretrained):
        model = base.model
    elif isinstance(base, (str, os.PathLike)):
        model = load(base).model
    else:
        model = base
    family = family_for_config(model.config)
    base_prefix = family.base_prefix(tuple(spec.name for spec in model.head_specs))
    stripped = {k.removeprefix(PREFIX): v for k, v in weights.items()}
    prefixed = bool(base_prefix) and any(k.startswith(base_prefix + ".") for k in stripped)
    entry_of, base_state = hf_state(model, prefixed)
    tied = {t for e in model_entries(model, prefixed, family) if isinstance(e.transform, Tie) for t in e.theirs}
    ours_of = {theirs: ours for ours, entry in entry_of.items() for theirs in entry.theirs
               if isinstance(entry.transform, (Rename, Transpose)) and len(entry.ours) == 1}
    module_forms: dict[str, Form] = {}
    for path, form in projection_forms(model, entry_of).items():
        module_forms.setdefault(form.module, form if form.parts else dataclasses.replace(form, parts=(path,)))
    lora: dict[str, dict[str, Tensor]] = {}
    replaced: dict[str, Tensor] = {}
    for key, tensor in stripped.items():
        for part in ("lora_A", "lora_B"):
            if key.endswith(f".{part}.weight"):
                module = key.removesuffix(f".{part}.weight")
                if module not in module_forms:
                    raise CheckpointError(f"{weights_path}: {key}: no module {module!r} in a {model.config.family} "
                                          "model bertology can wrap")
                lora.setdefault(module, {})[part] = tensor
                break
        else:
            entry = entry_of.get(ours_of.get(key, ""))
            if entry is not None:
                replaced[entry.ours[0]] = entry.transform.load([tensor], [base_state[key].shape])[0] \
                    if isinstance(entry.transform, Transpose) else tensor
            elif key in base_state and key not in tied:
                raise CheckpointError(f"{weights_path}: {PREFIX}{key}: a saved module's weight that bertology "
                                      "cannot read back into one of its parameters (a fused or reshaped tensor)")
            elif key not in tied:  # a tied copy (an MLM decoder) is accepted; anything else is not ours
                raise CheckpointError(f"{weights_path}: unexpected key {PREFIX}{key} for this {model.config.family} "
                                      f"model (heads: {', '.join(s.name for s in model.head_specs) or 'none'})")
    if not lora:
        raise CheckpointError(f"{weights_path}: holds no lora_A / lora_B weights")
    state = model.state_dict()
    for module, pair in sorted(lora.items()):
        if set(pair) != {"lora_A", "lora_B"}:
            raise CheckpointError(f"{weights_path}: {module} has {', '.join(pair)} but not both lora_A and lora_B")
        a, b = pair["lora_A"], pair["lora_B"]
        r = a.shape[0]
        if r != pattern_value(rank_pattern, module, rank):
            raise CheckpointError(f"{weights_path}: {module}: lora_A has rank {r}, the config's r is "
                                  f"{pattern_value(rank_pattern, module, rank)}")
        # peft scales by alpha / r (alpha / sqrt(r) with rsLoRA), bertology by alpha / rank: the same update.
        scaling = pattern_value(alpha_pattern, module, alpha) / (math.sqrt(r) if config.get("use_rslora") else r)
        form = module_forms[module]
        rows = sum(form.rows) if form.parts and form.rows else None
        if a.dim() != 2 or b.dim() != 2 or b.shape[1] != r or (rows is not None and b.shape[0] != rows):
            raise CheckpointError(f"{weights_path}: {module}: lora_A {tuple(a.shape)} and lora_B {tuple(b.shape)} do "
                                  f"not fit a fused projection of {rows} outputs at rank {r}")
        pairs = (split_fused(module, form, a, b, recorded.get(module), str(weights_path)) if form.rows
                 else {form.parts[0]: (a, b)})
        for where, (part_a, part_b) in pairs.items():
            target = model.add_extension(where, LORA, rank=part_a.shape[0], alpha=scaling * part_a.shape[0],
                                         dropout=dropout)
            if part_a.shape != target.lora_A.shape or part_b.shape != target.lora_B.shape:
                raise CheckpointError(f"{weights_path}: {module}: lora_A {tuple(part_a.shape)} and lora_B "
                                      f"{tuple(part_b.shape)} do not fit a [{target.out_features} x "
                                      f"{target.in_features}] projection at rank {part_a.shape[0]}")
            replaced[f"{where}.lora_A"], replaced[f"{where}.lora_B"] = part_a, part_b
    for name, tensor in replaced.items():
        if name in state and tensor.shape != state[name].shape:
            raise CheckpointError(f"{weights_path}: {name}: file {tuple(tensor.shape)}, model {tuple(state[name].shape)}")
    model.load_state_dict(replaced, strict=False)
    saved_modules = [name for name in replaced if ".lora_" not in name]
    freeze_base(model, train_heads, saved_modules)
    return model.eval()
