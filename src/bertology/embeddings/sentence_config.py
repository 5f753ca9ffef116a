"""The sentence-embedding settings of a sentence-transformers model directory, read from its own files.

Such a directory holds ``modules.json``: its pipeline of modules, here a Transformer (the directory itself), a
Pooling module (its ``config.json``: the pooling mode, and ``include_prompt``) and optionally a Normalize module;
``sentence_bert_config.json``: ``max_seq_length`` (texts are truncated there, specials included) and
``do_lower_case``; ``config_sentence_transformers.json``: named ``prompts`` and the ``default_prompt_name``.
`bertology.embed` takes these as its defaults on such a directory, and `bertology.retrieval`'s indexes record them,
so that both give what ``SentenceTransformer.encode`` gives. Modules that change the vectors in ways bertology does
not reproduce (a Dense projection, say) are refused, naming the file and the module.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bertology.errors import ConfigError
from bertology.inputs import json_file, json_value

MODULES_FILE = "modules.json"
SETTINGS_FILE = "sentence_bert_config.json"
PROMPTS_FILE = "config_sentence_transformers.json"

# sentence-transformers' pooling modes, in the order of its legacy boolean keys, and embed's name for each.
_LEGACY_MODES = {"pooling_mode_cls_token": "cls", "pooling_mode_max_tokens": "max",
                 "pooling_mode_mean_tokens": "mean", "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
                 "pooling_mode_weightedmean_tokens": "weightedmean", "pooling_mode_lasttoken": "lasttoken"}
SUPPORTED_MODES = ("mean", "cls", "max")
# Modules that leave the vectors as the Transformer, Pooling and Normalize modules make them.
_TRANSPARENT = ("Transformer", "Pooling", "Normalize")


@dataclass(frozen=True)
class SentenceConfig:
    """What a sentence-transformers directory says about its sentence vectors.

    `sentence`: embed's sentence pooling ("mean", "cls" or "max"); `max_length`: ``max_seq_length`` (None when
    absent); `normalize`: a Normalize module follows the pooling; `lower_case`: ``do_lower_case``; `prompts`:
    name -> text; `default_prompt`: the name of the prompt prepended when none is asked for (None: no prompt);
    `include_prompt`: whether the prompt's tokens are pooled with the text's."""

    directory: Path
    sentence: str = "mean"
    max_length: int | None = None
    normalize: bool = False
    lower_case: bool = False
    prompts: Mapping[str, str] = field(default_factory=dict)
    default_prompt: str | None = None
    include_prompt: bool = True

    def prompt(self, name: str | None) -> str:
        """The text of prompt `name` (None: the default prompt, or none)."""
        if name is None:
            return self.prompts[self.default_prompt] if self.default_prompt is not None else ""
        if name not in self.prompts:
            known = ", ".join(sorted(self.prompts)) or "none"
            raise ConfigError(f"prompt_name: {name!r} is not a prompt of {self.directory / PROMPTS_FILE} "
                              f"(it has {known})")
        return self.prompts[name]


def read_sentence_config(directory: str | os.PathLike | None) -> SentenceConfig | None:
    """The settings of a sentence-transformers directory; None for any other directory (no ``modules.json``, or
    one without a Pooling module) and for None."""
    if directory is None:
        return None
    directory = Path(directory)
    modules_file = directory / MODULES_FILE
    if not modules_file.is_file():
        return None
    modules = json_value(modules_file, ConfigError)
    if not isinstance(modules, list) or not all(isinstance(m, Mapping) for m in modules):
        raise ConfigError(f"{modules_file}: expected a list of modules (objects with a type and a path)")
    kinds = [str(m.get("type", "")).rsplit(".", 1)[-1] for m in modules]
    if "Pooling" not in kinds:
        return None
    for module, kind in zip(modules, kinds):
        if kind not in _TRANSPARENT:
            raise ConfigError(f"{modules_file}: module {module.get('name', kind)!r} of type {module.get('type')!r} "
                              f"is not supported (only {', '.join(_TRANSPARENT)}); its vectors would differ from "
                              f"sentence-transformers'")
    pooling = modules[kinds.index("Pooling")]
    if kinds.index("Pooling") < (kinds.index("Transformer") if "Transformer" in kinds else 0):
        raise ConfigError(f"{modules_file}: the Pooling module comes before the Transformer")
    if "Normalize" in kinds and kinds.index("Normalize") < kinds.index("Pooling"):
        raise ConfigError(f"{modules_file}: the Normalize module comes before the Pooling module")
    pooling_file = directory / str(pooling.get("path", "")) / "config.json"
    pooling_config = json_file(pooling_file, ConfigError)
    sentence = _pooling_mode(pooling_config, pooling_file)
    include_prompt = pooling_config.get("include_prompt", True)
    if not isinstance(include_prompt, bool):
        raise ConfigError(f"{pooling_file}: include_prompt must be true or false, got {include_prompt!r}")

    max_length, lower_case = None, False
    settings_file = directory / SETTINGS_FILE
    if settings_file.is_file():
        settings = json_file(settings_file, ConfigError)
        max_length = settings.get("max_seq_length")
        if max_length is not None and (isinstance(max_length, bool) or not isinstance(max_length, int)
                                       or max_length < 3):
            raise ConfigError(f"{settings_file}: max_seq_length must be an integer of at least 3, got "
                              f"{max_length!r}")
        lower_case = settings.get("do_lower_case", False)
        if not isinstance(lower_case, bool):
            raise ConfigError(f"{settings_file}: do_lower_case must be true or false, got {lower_case!r}")

    prompts: dict[str, str] = {}
    default_prompt = None
    prompts_file = directory / PROMPTS_FILE
    if prompts_file.is_file():
        extra = json_file(prompts_file, ConfigError)
        found = extra.get("prompts") or {}
        if not isinstance(found, Mapping) or not all(isinstance(k, str) and isinstance(v, str)
                                                     for k, v in found.items()):
            raise ConfigError(f"{prompts_file}: prompts must map names to texts, got {found!r}")
        prompts = dict(found)
        default_prompt = extra.get("default_prompt_name")
        if default_prompt is not None and default_prompt not in prompts:
            raise ConfigError(f"{prompts_file}: default_prompt_name {default_prompt!r} is not one of its prompts "
                              f"({', '.join(sorted(prompts)) or 'none'})")
    return SentenceConfig(directory=directory, sentence=sentence, max_length=max_length,
                          normalize="Normalize" in kinds, lower_case=lower_case, prompts=prompts,
                          default_prompt=default_prompt, include_prompt=include_prompt)


def _pooling_mode(config: Mapping[str, Any], path: Path) -> str:
    mode = config.get("pooling_mode")
    if mode is None:
        modes = [name for key, name in _LEGACY_MODES.items() if config.get(key) is True]
        modes = modes or ["mean"]  # sentence-transformers' default when no key is set
    else:
        modes = [mode] if isinstance(mode, str) else list(mode) if isinstance(mode, list) else [repr(mode)]
    if len(modes) != 1 or modes[0] not in SUPPORTED_MODES:
        raise ConfigError(f"{path}: pooling {' + '.join(map(str, modes))} is not supported ({', '.join(SUPPORTED_MODES)} "
                          "only); pass the embedding options explicitly")
    return modes[0]
