"""How each architecture a run config names builds its config: ``model: {architecture, preset, init_from, ...}``.

One function per registered architecture (``bertology.model.registry.register_run_config``), called by the
pretraining recipe as ``build(settings, preset, run, base)``:

* ``settings``: the model section's other keys, fields of the architecture's config class (already checked against
  its fields and types by the run config);
* ``preset``: a size of ``PRESET_SIZES`` (layers, hidden; hidden / 64 heads and a 4 x hidden feed-forward, as in the
  BERT papers), or None for the config class's own sizes;
* ``run``: the tokenizer's vocabulary size and special ids and the instances' shape (``RunContext``);
* ``base``: with ``model.init_from``, the checkpoint's config, which the settings then change (the preset and the
  tokenizer's ids are the checkpoint's).

A fresh config is, field by field: the family's ``fixed`` facts (its checkpoint table), the preset's sizes, the
tokenizer's vocabulary and ids, the settings, then the family's ``run_defaults`` for the fields the settings leave
unset (T5's d_kv and head scale, RoBERTa's single segment, the decoder's start token). Nothing here looks at the
tokenizer's style: the family is the settings' (or the config class's default).
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Mapping
from typing import Any

from bertology.errors import ConfigError, TokenizerError
from bertology.model.checkpoint import registry as checkpoint_families
from bertology.model.config import DECODER_DEFAULTS, PRESET_SIZES
from bertology.model.registry import RunContext, registered


def architecture_families(name: str) -> tuple[str, ...]:
    """The checkpoint families whose checkpoints build the architecture registered as `name` (bertology.model.convert's
    ``CheckpointFamily.model``): the values ``model.family`` may take with it."""
    return tuple(family for family, entry in checkpoint_families().items() if entry.model == name)


def default_family(name: str) -> str | None:
    """The family a run of architecture `name` builds when ``model.family`` is unset: its config class's default
    when that is one of its families, its only family when it has one, else None (the family must be given)."""
    fields = {f.name: f for f in dataclasses.fields(registered(name).config_class)}
    value = fields["family"].default if "family" in fields else None
    families = architecture_families(name)
    if isinstance(value, str) and (value in families or not families):
        return value
    return families[0] if len(families) == 1 else None  # an architecture of one family builds that one


def check_family(name: str, settings: Mapping[str, Any]) -> str | None:
    """``model.family`` (or the architecture's default) checked against the architecture's families."""
    families = architecture_families(name)
    family = settings.get("family", default_family(name))
    if family is None:
        raise ConfigError(f"model.family: the {name} architecture builds a model of one of the families "
                          f"{', '.join(families)}; set model.family")
    if families and family not in families:
        known = checkpoint_families()
        owner = known[family].model if isinstance(family, str) and family in known else None
        if owner is None:
            close = difflib.get_close_matches(str(family), list(known), n=1)
            raise ConfigError(f"model.family: unknown family {family!r}{f'; did you mean {close[0]}?' if close else ''}"
                              f" (the {name} architecture builds {', '.join(families)} models)")
        raise ConfigError(f"model.family: the {name} architecture builds {', '.join(families)} models, not "
                          f"{family!r}: {family} is a family of the {owner} architecture (model: {{architecture: "
                          f"{owner}, family: {family}, ...}})")
    if not families and "family" in settings and family != default_family(name):
        raise ConfigError(f"model.family: {name} models are of the family {default_family(name)!r}, got {family!r}")
    return family


def preset_sizes(preset: str | None) -> dict[str, int]:
    """The fields a preset sets; none for None."""
    if preset is None:
        return {}
    if preset not in PRESET_SIZES:
        raise ConfigError(f"model.preset: unknown preset {preset!r}; expected one of {', '.join(PRESET_SIZES)}")
    layers, hidden = PRESET_SIZES[preset]
    return {"num_layers": layers, "hidden_size": hidden, "num_heads": max(1, hidden // 64),
            "intermediate_size": 4 * hidden}


def _matches(values: Mapping[str, Any], pairs: Mapping[str, Any]) -> None:
    for key, actual in pairs.items():
        if values[key] != actual:
            raise TokenizerError(f"model.{key} is {values[key]} but the tokenizer's is {actual}: the tokenizer does "
                                 f"not match the model (leave model.{key} unset to take the tokenizer's)")


def _where(name: str, error: ConfigError) -> ConfigError:
    """A config class's own error named by the model section's key it is about (``model.mem_len: ...``), else by
    the section."""
    message = str(error)
    first = message.split(":")[0].split(" ")[0]
    fields = {f.name for f in dataclasses.fields(registered(name).config_class)}
    return ConfigError(f"model.{message}" if first in fields else f"model: {message}")


def _make(name: str, values: Mapping[str, Any]) -> Any:
    try:
        return registered(name).config_class(**values)
    except ConfigError as error:
        raise _where(name, error) from None


def continued_config(name: str, base: Any, settings: Mapping[str, Any]) -> Any:
    """The config of a checkpoint of architecture `name` that a run continues, with the settings changed (every
    architecture's, also one without a builder of its own: a converted Longformer)."""
    if "family" in settings and settings["family"] != base.family:
        raise ConfigError(f"model.family: model.init_from's model is of the family {base.family}, not "
                          f"{settings['family']}")
    try:
        return dataclasses.replace(base, **settings)
    except ConfigError as error:
        raise _where(name, error) from None
    except TypeError as error:  # a field of another architecture's config
        raise ConfigError(f"model: model.init_from's model is one of the {name} architecture: {error}") from None


def _fresh(name: str, settings: Mapping[str, Any], preset: str | None, run: RunContext,
           ids: Mapping[str, Any], start: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A fresh config's values: the architecture's defaults (``start``, over the config class's), the family's fixed
    facts, the preset, the tokenizer's ids, the settings, the family's run defaults for the fields left unset."""
    family = check_family(name, settings)
    entry = checkpoint_families().get(family) if family is not None else None
    values: dict[str, Any] = {**(start or {}), "family": family, **(entry.fixed if entry is not None else {})}
    values.update(preset_sizes(preset))
    values.update(ids)
    values.update(settings)
    if entry is not None and entry.run_defaults is not None:
        values.update({k: v for k, v in entry.run_defaults(values, run).items() if k not in settings})
    return values


def encoder_config(settings: Mapping[str, Any], preset: str | None, run: RunContext, base: Any = None) -> Any:
    """A bidirectional encoder (bert unless ``model.family`` says otherwise: roberta, albert, ..., modernbert);
    positions numbered after the padding id (RoBERTa's) get 512 of them unless ``max_position_embeddings`` is set."""
    if base is not None:
        return continued_config("encoder", base, settings)
    values = _fresh("encoder", settings, preset, run, {"vocab_size": run.vocab_size, "pad_token_id": run.pad_id})
    _matches(values, {"vocab_size": run.vocab_size, "pad_token_id": run.pad_id})
    if values.get("positions_after_padding") and "max_position_embeddings" not in settings:
        values["max_position_embeddings"] = 512 + values["pad_token_id"] + 1
    return _make("encoder", values)


def _transformer_config(name: str, settings: Mapping[str, Any], preset: str | None, run: RunContext,
                        base: Any) -> Any:
    if base is not None:
        config = continued_config(name, base, settings)
    else:
        ids = {"vocab_size": run.vocab_size, "pad_token_id": run.fill_id, "bos_token_id": run.cls_id,
               "eos_token_id": run.sep_id}
        # A GPT-2-shaped decoder's defaults, then the family's facts.
        values = _fresh(name, settings, preset, run, ids, DECODER_DEFAULTS)
        if name == "seq2seq" and values.get("num_decoder_layers") is None:  # config.json states both depths
            values["num_decoder_layers"] = values["num_layers"]
        _matches(values, {"vocab_size": run.vocab_size, "pad_token_id": run.fill_id})
        config = _make(name, values)
    if name == "seq2seq" and config.decoder_start_token_id is None:  # a checkpoint that names none: the family's
        entry = checkpoint_families().get(config.family)
        start = entry.run_defaults(dataclasses.asdict(config), run).get("decoder_start_token_id") \
            if entry is not None and entry.run_defaults is not None else None
        config = dataclasses.replace(config, decoder_start_token_id=run.fill_id if start is None else start)
    return config


def decoder_config(settings: Mapping[str, Any], preset: str | None, run: RunContext, base: Any = None) -> Any:
    """A decoder-only transformer of ``model.family`` (gpt2): padding, begin and end ids from the tokenizer."""
    return _transformer_config("decoder", settings, preset, run, base)


def seq2seq_config(settings: Mapping[str, Any], preset: str | None, run: RunContext, base: Any = None) -> Any:
    """An encoder-decoder of ``model.family`` (t5, bart): as deep a decoder as the encoder unless set, starting
    from the family's start token."""
    return _transformer_config("seq2seq", settings, preset, run, base)


def xlnet_config(settings: Mapping[str, Any], preset: str | None, run: RunContext, base: Any = None) -> Any:
    """An XLNet; on segment streams (``data.instances.kind: segment-stream``) a segment's text becomes the next
    one's memory (reuse_len: a row less its special tokens), which needs a bounded memory (mem_len >= 1)."""
    if base is not None:
        config = continued_config("xlnet", base, settings)
    else:
        check_family("xlnet", settings)
        values: dict[str, Any] = {**preset_sizes(preset), "vocab_size": run.vocab_size, "pad_token_id": run.pad_id}
        if run.segment_stream:
            values["reuse_len"] = run.max_seq_length - run.text_overhead
        values.update(settings)
        _matches(values, {"vocab_size": run.vocab_size, "pad_token_id": run.pad_id})
        config = _make("xlnet", values)
    if run.segment_stream:
        if not config.mem_len:
            raise ConfigError(f"model.mem_len: segment streams carry the memory from batch to batch; it needs a "
                              f"length >= 1 (the positions kept), got {config.mem_len!r}")
        if config.reuse_len is not None and config.reuse_len > run.max_seq_length:
            raise ConfigError(f"model.reuse_len: {config.reuse_len} is longer than a segment "
                              f"(data.instances.max_seq_length {run.max_seq_length}); it is how many of a segment's "
                              f"first positions become memory")
    return config


def elmo_config(settings: Mapping[str, Any], preset: str | None, run: RunContext, base: Any = None) -> Any:
    """An ELMo biLM: its tiny sizes with preset ``tiny`` (bertology.model.elmo.tiny_config), the released ones with
    preset null; the word softmax's vocabulary is the run's word vocabulary."""
    from bertology.model.elmo import tiny_config

    if base is not None:
        raise ConfigError("model.init_from: ELMo runs start from a fresh model")
    if preset not in ("tiny", None):
        raise ConfigError(f"model.preset: ELMo has the preset 'tiny' or none (the released sizes), got {preset!r}")
    if "vocab_size" in settings:
        raise ConfigError("model.vocab_size: the vocabulary size is the word vocabulary's (tokenizer.vocab_size)")
    check_family("elmo", settings)
    config_class = registered("elmo").config_class
    start = tiny_config().to_dict() if preset == "tiny" else config_class().to_dict()
    try:
        return config_class.from_dict({**start, **settings, "vocab_size": run.vocab_size})
    except ConfigError as error:
        raise _where("elmo", error) from None
