"""Save only what was trained: the trainable parameters (and the heads), with the recipe that rebuilds the model around
them from its base checkpoint (the extensions, the head specs, which parameters train) and a fingerprint of the frozen
base weights, so that the wrong base is refused rather than giving other outputs.

A directory holds `trained.json` (the recipe) and `trained.safetensors` (the tensors, under bertology's parameter
names). `load_trained(base, directory)` gives the trained model back, with the same parameters training.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from safetensors.torch import save_file
from torch import nn

from bertology.errors import BertologyError, CheckpointError
from bertology.io import atomic_directory
from bertology.model.checkpoint import Pretrained, load, read_json_object, read_safetensors
from bertology.model.heads import HeadSpec
from bertology.model.protocol import Model
from bertology.model.registry import model_name, registered
from bertology.model.identity import EVAL_IRRELEVANT, state_fingerprint

RECIPE_FILE = "trained.json"
WEIGHTS_FILE = "trained.safetensors"
FORMAT = "bertology-trained"
VERSION = 2  # 2: "model" names the registered model class, "config" its config; 1: an EncoderModel under "encoder"
VERSIONS = (1, 2)


def saved_names(model: Model) -> list[str]:
    """The state-dict names save_trained writes: the trainable parameters and every head's."""
    trainable = {id(p) for p in model.parameters() if p.requires_grad}
    names = [name for name, p in model.named_parameters() if id(p) in trainable or name.startswith("heads.")]
    return sorted(set(names))


def save_trained(model: Model, directory: str | os.PathLike, base: str | None = None) -> list[str]:
    """Write the trainable parameters and the heads of `model` with the recipe to rebuild it on its base (atomically).
    `base` (optional) records where the base checkpoint is. Returns the names written."""
    names = saved_names(model)
    state = model.state_dict()
    trainable = sorted(name for name, p in model.named_parameters() if p.requires_grad)
    recipe = {
        "format": FORMAT,
        "version": VERSION,
        "base": base,
        "model": model_name(model),
        "config": model.config.to_dict(),
        "heads": [dataclasses.asdict(spec) for spec in model.head_specs],
        "extensions": {where: {"factory": factory, "options": options}
                       for where, (factory, options) in model.extensions.items()},
        "trainable": trainable,
        "base_fingerprint": state_fingerprint(state, set(names)),  # the frozen base weights
    }
    with atomic_directory(directory) as tmp:
        (tmp / RECIPE_FILE).write_text(json.dumps(recipe, indent=2) + "\n", encoding="utf-8")
        save_file({name: state[name].detach().contiguous().clone() for name in names}, tmp / WEIGHTS_FILE,
                  metadata={"format": "pt"})
    return names


def load_trained(base: str | os.PathLike | Model | Pretrained, directory: str | os.PathLike, *,
                 check_base: bool = True) -> Model:
    """The model save_trained wrote: the base (a model directory for bertology.load, a Pretrained, or a model,
    whose encoder weights are used and which is not changed) with the recorded heads and extensions and the saved
    tensors; the recorded parameters train, the rest is frozen. `check_base`: refuse a base whose frozen weights
    differ from the ones the model was trained on. Returns the model in eval mode."""
    directory = Path(directory)
    recipe_path, weights_path = directory / RECIPE_FILE, directory / WEIGHTS_FILE
    for path in (recipe_path, weights_path):
        if not path.is_file():
            raise CheckpointError(f"{path}: missing (save_trained writes {RECIPE_FILE} and {WEIGHTS_FILE})")
    recipe = read_json_object(recipe_path)
    if recipe.get("format") != FORMAT or recipe.get("version") not in VERSIONS:
        raise CheckpointError(f"{recipe_path}: expected format {FORMAT!r} version {' or '.join(map(str, VERSIONS))}, got "
                              f"{recipe.get('format')!r} version {recipe.get('version')!r}")
    trained = read_safetensors(weights_path)
    if isinstance(base, Pretrained):
        base_model = base.model
    elif isinstance(base, nn.Module):
        base_model = base
    else:
        base_model = load(base).model
    try:
        entry = registered("encoder" if recipe["version"] == 1 else recipe["model"])
        config = entry.config_class.from_dict(recipe["encoder" if recipe["version"] == 1 else "config"])
        specs = [HeadSpec(**spec) for spec in recipe["heads"]]
        extensions = dict(recipe["extensions"])
        trainable = set(recipe["trainable"])
        expected_fingerprint = recipe["base_fingerprint"]
    except (BertologyError, KeyError, TypeError, AttributeError, ValueError) as error:
        what = f"missing key {error}" if isinstance(error, KeyError) else str(error)
        raise CheckpointError(f"{recipe_path}: {what}") from None
    differ = [key for key in config.to_dict()
              if key not in EVAL_IRRELEVANT and getattr(base_model.config, key) != getattr(config, key)]
    if differ:
        raise CheckpointError(f"{recipe_path}: the base model differs from the one trained in "
                              f"{', '.join(f'{k} ({getattr(base_model.config, k)!r} vs {getattr(config, k)!r})' for k in differ)}")
    config.extra = dict(base_model.config.extra)
    model = entry.cls(config, specs)
    for where, extension in extensions.items():
        try:
            model.add_extension(where, extension["factory"], **extension["options"])
        except (BertologyError, KeyError, TypeError) as error:
            raise CheckpointError(f"{recipe_path}: cannot rebuild extension {where!r}: {error}") from None
    expected = model.state_dict()
    unexpected = sorted(set(trained) - set(expected))
    mismatched = [f"{k}: file {tuple(v.shape)}, model {tuple(expected[k].shape)}" for k, v in trained.items()
                  if k in expected and v.shape != expected[k].shape]
    if unexpected or mismatched:
        raise CheckpointError(f"{weights_path}: does not fit the model {recipe_path.name} describes: "
                              + " | ".join(filter(None, [unexpected and f"unexpected keys: {', '.join(unexpected)}",
                                                         mismatched and f"shape mismatches: {'; '.join(mismatched)}"])))
    base_state = base_model.state_dict()
    from_base = sorted(set(expected) - set(trained))
    missing = [name for name in from_base if name not in base_state]
    if missing:
        raise CheckpointError(f"{weights_path}: the base model has no {', '.join(missing[:5])}"
                              f"{' ...' if len(missing) > 5 else ''}, and the file does not hold them either")
    mismatched = [f"{k}: base {tuple(base_state[k].shape)}, model {tuple(expected[k].shape)}" for k in from_base
                  if base_state[k].shape != expected[k].shape]
    if mismatched:
        raise CheckpointError(f"the base model does not fit {recipe_path}: {'; '.join(mismatched)}")
    state = {name: base_state[name] for name in from_base}
    if check_base:
        found = state_fingerprint(state)
        if found != expected_fingerprint:
            raise CheckpointError(f"{recipe_path}: the base model's frozen weights are not the ones these parameters "
                                  "were trained on (base_fingerprint differs); pass check_base=False to load anyway")
    state.update(trained)
    model.load_state_dict(state)
    unknown = sorted(trainable - set(name for name, _ in model.named_parameters()))
    if unknown:
        raise CheckpointError(f"{recipe_path}: \"trainable\" names parameters the model does not have: "
                              f"{', '.join(unknown[:5])}")
    for name, parameter in model.named_parameters():
        parameter.requires_grad_(name in trainable)
    return model.eval()

