"""One conversion engine between bertology's parameters and Hugging Face checkpoints.

A checkpoint family (BERT, RoBERTa, ...) is data: a `CheckpointFamily` declared in its own module under
`bertology.model.families` and registered with `register_family`. It says which config.json keys map to which
`TransformerConfig` fields (each optionally with a value transform in either direction), which facts the family fixes,
which weights map to which parameters (each entry with a transform: rename, transpose, reshape, split a fused tensor,
merge several, or tie to another parameter), its heads, and which transformers class has which heads. Everything
else here is shared by all families: reading and writing config.json, the weights in both directions, and one check
that names every missing, unexpected and mis-shaped key with the file they came from.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Callable

import torch
from torch import Tensor

from bertology.builtins import Registry
from bertology.errors import CheckpointError, ConfigError
from bertology.model.config import TransformerConfig
from bertology.model.heads import HeadSpec
from bertology.model.protocol import PRUNES_HEADS
from bertology.model.registry import model_class, model_name

# --- config keys --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ConfigKey:
    """One config.json key: `key` in the file is `field` of TransformerConfig. `read(value, config_json)` turns the file's
    value into ours, `write(value, config)` ours into the file's; None keeps the value as it is."""

    field: str
    key: str
    read: Callable[[Any, Mapping[str, Any]], Any] | None = None
    write: Callable[[Any, TransformerConfig], Any] | None = None
    # The value when config.json lacks the key or holds null (GPT-2's n_inner: None means 4 x n_embd); None: the
    # config class's default.
    default: Callable[[Mapping[str, Any]], Any] | None = None


def renamed_keys(mapping: Mapping[str, str]) -> tuple[ConfigKey, ...]:
    """Config keys that only change name: our field -> the config.json key."""
    return tuple(ConfigKey(ours, theirs) for ours, theirs in mapping.items())


# --- weight transforms --------------------------------------------------------------------------------------------


def resolve_shape(shape: tuple[int | str, ...], config: Any) -> tuple[int, ...]:
    """A shape whose entries are numbers or names of config attributes (e.g. "num_heads", "head_dim")."""
    return tuple(getattr(config, d) if isinstance(d, str) else d for d in shape)


@dataclass(frozen=True)
class Rename:
    """The tensor is stored as it is, under another name."""

    name = "rename"

    def arity_problem(self, ours: int, theirs: int) -> str | None:
        return None if ours == theirs == 1 else "a rename maps one parameter to one key"

    def load(self, theirs: list[Tensor], shapes: list[torch.Size]) -> list[Tensor]:
        return theirs

    def save(self, ours: list[Tensor], config: Any) -> list[Tensor]:
        return ours


@dataclass(frozen=True)
class Transpose:
    """The stored tensor is ours with two dimensions swapped (GPT-2's Conv1D keeps [in, out] where nn.Linear keeps
    [out, in])."""

    dims: tuple[int, int] = (0, 1)
    name = "transpose"

    def arity_problem(self, ours: int, theirs: int) -> str | None:
        return None if ours == theirs == 1 else "a transpose maps one parameter to one key"

    def load(self, theirs: list[Tensor], shapes: list[torch.Size]) -> list[Tensor]:
        return [theirs[0].transpose(*self.dims).contiguous()]

    def save(self, ours: list[Tensor], config: Any) -> list[Tensor]:
        return [ours[0].transpose(*self.dims).contiguous()]


@dataclass(frozen=True)
class Reshape:
    """The stored tensor has the same elements in another shape: `shape` is the stored one, numbers or config
    attribute names (-1 for the one left over). With `transpose`, the stored tensor is our 2-d one transposed, then
    reshaped (XLNet's [d_model, heads, head_dim] projections of an nn.Linear weight [heads x head_dim, d_model])."""

    shape: tuple[int | str, ...]
    transpose: bool = False
    name = "reshape"

    def arity_problem(self, ours: int, theirs: int) -> str | None:
        return None if ours == theirs == 1 else "a reshape maps one parameter to one key"

    def load(self, theirs: list[Tensor], shapes: list[torch.Size]) -> list[Tensor]:
        if self.transpose:
            return [theirs[0].reshape(tuple(shapes[0])[::-1]).transpose(0, 1).contiguous()]
        return [theirs[0].reshape(shapes[0])]

    def save(self, ours: list[Tensor], config: Any) -> list[Tensor]:
        tensor = ours[0].transpose(0, 1) if self.transpose else ours[0]
        return [tensor.reshape(resolve_shape(self.shape, config))]


@dataclass(frozen=True)
class Split:
    """One stored tensor holds several of ours side by side along `dim` (after a transpose when `transpose`), e.g.
    a fused query/key/value projection. The parts' widths are our parameters' shapes, so they may differ."""

    dim: int = 0
    transpose: bool = False
    name = "split"

    def arity_problem(self, ours: int, theirs: int) -> str | None:
        return None if ours >= 2 and theirs == 1 else "a split maps one key to two or more parameters"

    def load(self, theirs: list[Tensor], shapes: list[torch.Size]) -> list[Tensor]:
        fused = theirs[0].transpose(0, 1) if self.transpose else theirs[0]
        sizes = [shape[self.dim] for shape in shapes]
        if fused.shape[self.dim] != sum(sizes):
            raise ValueError(f"dimension {self.dim} is {fused.shape[self.dim]}, the parts need {sum(sizes)}")
        return [part.contiguous() for part in torch.split(fused, sizes, dim=self.dim)]

    def save(self, ours: list[Tensor], config: Any) -> list[Tensor]:
        fused = torch.cat(ours, dim=self.dim)
        return [fused.transpose(0, 1).contiguous() if self.transpose else fused]


@dataclass(frozen=True)
class Merge:
    """Several stored tensors are one of ours, concatenated along `dim`; saving cuts it into equal parts."""

    dim: int = 0
    parts: int = 2
    name = "merge"

    def arity_problem(self, ours: int, theirs: int) -> str | None:
        return None if ours == 1 and theirs >= 2 else "a merge maps two or more keys to one parameter"

    def load(self, theirs: list[Tensor], shapes: list[torch.Size]) -> list[Tensor]:
        return [torch.cat(theirs, dim=self.dim)]

    def save(self, ours: list[Tensor], config: Any) -> list[Tensor]:
        return [part.contiguous() for part in torch.tensor_split(ours[0], self.parts, dim=self.dim)]


@dataclass(frozen=True)
class Tie:
    """The stored keys are copies of our parameters (an MLM decoder tied to the word embeddings): not written, and
    on reading accepted when present, and when `check`, required to equal them."""

    check: bool = True
    name = "tie"

    def arity_problem(self, ours: int, theirs: int) -> str | None:
        return None if ours == theirs >= 1 else "a tie pairs each key with one parameter"


Transform = Rename | Transpose | Reshape | Split | Merge | Tie
RENAME = Rename()


@dataclass(frozen=True)
class WeightEntry:
    """Our parameter name(s) and the checkpoint key(s) they are stored under, with the transform between them.
    Names may hold `{i}` (the layer) or `{d}` (an encoder-decoder's decoder layer), and checkpoint keys also
    `{group}` and `{inner}` (ALBERT's shared layers).
    Base-model keys are written without the family's prefix (`bert.`), which is added when the checkpoint has heads;
    `when` names a config attribute that must be truthy for the entry to apply (e.g. "pooler"; after "not ", falsy);
    `layers` the one counting the layers (an encoder-decoder's two stacks may differ in depth)."""

    ours: tuple[str, ...]
    theirs: tuple[str, ...]
    transform: Transform = RENAME
    when: str | None = None
    layers: str = "num_unique_layers"  # the config attribute counting the layers `{i}` runs over
    first: int = 0  # the first layer `{i}` runs over (ModernBERT's layer 0 has no attention norm)

    def __post_init__(self) -> None:
        problem = self.transform.arity_problem(len(self.ours), len(self.theirs))
        if problem is not None:
            raise ConfigError(f"weight entry {self.ours} <- {self.theirs}: {problem}")
        if not isinstance(self.transform, Merge) or self.transform.parts == len(self.theirs):
            return
        raise ConfigError(f"weight entry {self.ours} <- {self.theirs}: Merge(parts={self.transform.parts}) but "
                          f"{len(self.theirs)} keys")


def linear(ours: str, theirs: str, params: tuple[str, ...] = ("weight", "bias"), when: str | None = None,
           transform: Transform = RENAME) -> tuple[WeightEntry, ...]:
    """One entry per parameter of a module (a Linear or LayerNorm's weight and bias, an Embedding's weight)."""
    return tuple(WeightEntry((f"{ours}.{p}",), (f"{theirs}.{p}",), transform, when) for p in params)


def layer_linears(layer: str, parts: Mapping[str, str]) -> tuple[WeightEntry, ...]:
    """Every layer's modules: our part (`query`) -> its name under the checkpoint's `layer` template."""
    return tuple(entry for ours, theirs in parts.items()
                 for entry in linear(f"encoder.layers.{{i}}.{ours}", f"{layer}.{theirs}"))


# --- heads and families -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Head:
    """A head as the family's transformers classes store it: its kind, its activation (None: the config's
    hidden_act) and its parts: our module part (`dense`, `norm`, `out`) -> the checkpoint's module name, `bias` /
    `weight` -> a bare bias / weight parameter, `tied` -> the decoder module tied to the word embeddings and to
    `bias`; `bias` False: its linear parts have no bias. `untied`: the same head with an output weight of its own,
    which a checkpoint holding the tied module's weight, different from the word embeddings, builds (as transformers
    unties them then: T5 v1.1's lm_head)."""

    kind: str
    activation: str | None = None
    parts: Mapping[str, str] = field(default_factory=dict)
    bias: bool = True  # False: its linear parts have a weight only (GPT-2's `score`)
    untied: Head | None = None
    # Entries beyond the parts, our names spelled in full with `{name}` for the head's (BART's final_logits_bias,
    # an LM head tied to a model whose word embeddings are not the encoder's).
    weights: tuple[WeightEntry, ...] = ()
    unbiased: tuple[str, ...] = ()  # parts whose modules have a weight only (ModernBERT's dense and norm)

    def __post_init__(self) -> None:
        object.__setattr__(self, "parts", MappingProxyType(dict(self.parts)))

    def variant(self, kind: str) -> Head | None:
        """This head, or its untied variant, when it is of `kind`."""
        return self if kind == self.kind else self.untied if self.untied and self.untied.kind == kind else None

    def entries(self, name: str, word: str = "encoder.embeddings.word.weight") -> tuple[WeightEntry, ...]:
        """The head's weight entries; `word` is our word-embedding parameter a `tied` part is tied to."""
        out: list[WeightEntry] = []
        params = ("weight", "bias") if self.bias else ("weight",)
        for part, theirs in self.parts.items():
            if part in ("bias", "weight"):
                out.append(WeightEntry((f"heads.{name}.{part}",), (theirs,)))
            elif part == "tied":
                out.append(WeightEntry((word,), (f"{theirs}.weight",), Tie(check=True)))
                if "bias" in self.parts:  # transformers ties the decoder's bias to the head's
                    out.append(WeightEntry((f"heads.{name}.bias",), (f"{theirs}.bias",), Tie(check=False)))
            else:
                out.extend(linear(f"heads.{name}.{part}", theirs, ("weight",) if part in self.unbiased else params))
        out.extend(WeightEntry(tuple(o.replace("{name}", name) for o in e.ours), e.theirs, e.transform, e.when)
                   for e in self.weights)
        return tuple(out)

    def as_tuple(self) -> tuple[str, str | None, dict[str, str]]:
        return self.kind, self.activation, dict(self.parts)


@dataclass(frozen=True)
class CheckpointFamily:
    """Everything that tells one family's checkpoints apart (see the module docstring). `family` is the
    TransformerConfig family the checkpoints build (the model_type by default); `architectures` maps transformers
    class-name suffixes (`ForMaskedLM`, `ForPreTraining`) to their heads, the first being the primary one; keys in
    `tolerated` may appear in the config even though another family's table uses them."""

    model_type: str
    class_stem: str
    prefix: str
    config_keys: tuple[ConfigKey, ...]
    weights: tuple[WeightEntry, ...]
    heads: Mapping[str, Head]
    architectures: Mapping[str, tuple[str, ...]]
    fixed: Mapping[str, Any] = field(default_factory=dict)
    family: str = ""
    tolerated: frozenset[str] = frozenset()
    # The registered model class its checkpoints build (bertology.model.registry) and that class's config.
    model: str = "encoder"
    config_class: type = TransformerConfig
    # The config fields' values where the family's models differ from the config class's defaults (BERT's) and
    # neither config.json nor `fixed` sets them (a decoder family's: DECODER_DEFAULTS).
    defaults: Mapping[str, Any] = field(default_factory=dict)
    # Architecture suffixes that build another registered model class (T5's EncoderModel: an encoder stack alone).
    models: Mapping[str, str] = field(default_factory=dict)
    # That model's word-embedding parameter (what a `tied` head part is tied to).
    word_embeddings: str = "encoder.embeddings.word.weight"
    # config.json keys whose value, when present and not null, must be this one (a variant bertology does not build,
    # e.g. GPT-2's scale_attn_by_inverse_layer_idx); a CheckpointError names the file and the key otherwise.
    required: Mapping[str, Any] = field(default_factory=dict)
    # Suffixes of checkpoint keys that are buffers, not weights (GPT-2's attn.bias causal mask): dropped on reading.
    ignored: tuple[str, ...] = ()
    # What a model of this family pretrained from scratch takes beyond `fixed`: defaults that follow the values
    # chosen so far (fixed, preset, the tokenizer's ids, the run config's settings) or the run's tokenizer
    # (bertology.model.registry.RunContext), such as T5's d_kv or BART's decoder start; the architecture's run-config
    # builder applies them to the fields the run config does not set.
    run_defaults: Callable[[Mapping[str, Any], Any], Mapping[str, Any]] | None = None
    # The heads as one config's checkpoints store them, where that depends on the config (DeBERTa's two masked-LM
    # layouts, its pooler's activation): config -> name -> Head, the names and kinds those of `heads`; None: `heads`.
    config_heads: Callable[[Any], Mapping[str, Head]] | None = None
    # A check of a checkpoint before its model is built: (the config read from `source`, config.json; the stored
    # weights; source) -> None, raising a ConfigError that names the key (one the weights disagree with, a value the
    # config keys keep unread in `extra`).
    check_checkpoint: Callable[[Any, Mapping[str, Tensor], str], None] | None = None
    # How a fresh model of this family is initialised, `init(model, generator)` (T5's: scales by fan-in); None:
    # BERT's (bertology.model.blocks.init_parameters), as the model's own init_weights does it.
    init: Callable[[Any, torch.Generator | None], None] | None = None
    # Architecture suffixes whose transformers class keeps the base model under another prefix than `prefix`
    # (T5ForSequenceClassification's T5Model under `transformer.`, where T5's other classes hold it at the top).
    prefixes: Mapping[str, str] = field(default_factory=dict)
    # Whether a sentence task (GLUE) fine-tunes the family's models as text-to-text, the label generated as a word,
    # unless `task.text_to_text` says otherwise, though the family has a sequence classifier (T5's recipe, as its
    # paper fine-tunes it); false: the classifier (BART's), or text-to-text where the family has none.
    text_to_text: bool = False

    def __post_init__(self) -> None:
        for name in ("heads", "architectures", "fixed", "required", "models", "defaults", "prefixes"):
            object.__setattr__(self, name, MappingProxyType(dict(getattr(self, name))))
        if not self.family:
            object.__setattr__(self, "family", self.model_type)
        where = f"checkpoint family {self.model_type!r}"
        if not self.model_type or not isinstance(self.model_type, str):
            raise ConfigError(f"checkpoint family: model_type must be a non-empty string, got {self.model_type!r}")
        fields = {f.name for f in dataclasses.fields(self.config_class)}
        config_name = self.config_class.__name__
        for key in self.config_keys:
            if key.field not in fields:
                raise ConfigError(f"{where}: config_keys: {key.key!r} maps to {key.field!r}, which is not a "
                                  f"field of {config_name}")
        for name in self.fixed:
            if name not in fields:
                raise ConfigError(f"{where}: fixed: {name!r} is not a field of {config_name}")
        for suffix, heads in self.architectures.items():
            for head in heads:
                if head not in self.heads:
                    raise ConfigError(f"{where}: architectures[{suffix!r}] names head {head!r}, which the family does "
                                      f"not declare (heads: {', '.join(self.heads) or 'none'})")
        for field_name in ("models", "prefixes"):
            for suffix in getattr(self, field_name):
                if suffix not in self.architectures:
                    raise ConfigError(f"{where}: {field_name} names architecture suffix {suffix!r}, which "
                                      "architectures lacks")
        if "Model" not in self.architectures:
            raise ConfigError(f"{where}: architectures has no 'Model' entry (the base model without heads)")

    def base_prefix(self, heads: tuple[str, ...]) -> str:
        """The prefix of the base-model keys in a checkpoint of the class with exactly these heads (`prefixes`,
        else `prefix`; keys carry it only where the checkpoint has heads)."""
        for suffix, names in self.architectures.items():
            if suffix in self.prefixes and tuple(names) == tuple(heads):
                return self.prefixes[suffix]
        return self.prefix

    def heads_of(self, config: Any) -> Mapping[str, Head]:
        """The heads as `config`'s checkpoints store them (`config_heads`, else `heads`)."""
        return self.config_heads(config) if self.config_heads is not None else self.heads

    @property
    def key_names(self) -> frozenset[str]:
        return frozenset(k.key for k in self.config_keys)

    def architecture_heads(self, architecture: str, source: str) -> tuple[str, ...]:
        if not isinstance(architecture, str) or not architecture.startswith(self.class_stem):
            raise CheckpointError(f"{source}: architectures: {architecture!r} does not belong to model type "
                                  f"{self.model_type!r}")
        suffix = architecture[len(self.class_stem):]
        if suffix not in self.architectures:
            known = ", ".join(self.class_stem + s for s in self.architectures)
            raise CheckpointError(f"{source}: architectures: unsupported architecture {architecture!r}; supported: "
                                  f"{known}")
        return self.architectures[suffix]

    def model_for(self, suffix: str) -> str:
        """The registered model class an architecture suffix builds."""
        return self.models.get(suffix, self.model)

    def architecture_name(self, heads: tuple[str, ...], model: str | None = None) -> str:
        """transformers' class with exactly these heads (and, when `model` names our registered class, built as
        that class)."""
        for suffix, names in self.architectures.items():
            if tuple(names) == tuple(heads) and (model is None or self.model_for(suffix) == model):
                return self.class_stem + suffix
        what = f" on a {model!r} model" if model is not None else ""
        raise CheckpointError(f"no transformers architecture of {self.model_type!r} has exactly the heads "
                              f"{heads}{what}")


# --- the registry -------------------------------------------------------------------------------------------------

def registry() -> Registry[CheckpointFamily]:
    """model_type -> family, the built-in ones first (bertology.builtins registers them on first use)."""
    return REGISTRY


def register_family(family: CheckpointFamily, *, replace: bool = False) -> CheckpointFamily:
    """Make `family`'s checkpoints loadable and savable. Registering an equal table again is harmless; another
    table under a registered model_type is an error unless `replace`."""
    if not isinstance(family, CheckpointFamily):
        raise ConfigError(f"register_family expects a CheckpointFamily, got {type(family).__name__}")
    known = registry()
    current = known.get(family.model_type)
    if current is not None and current != family and not replace:
        raise ConfigError(f"model_type {family.model_type!r} is registered already with another table (pass "
                          "replace=True to replace it)")
    known[family.model_type] = family
    return family


# model_type -> family; the built-in tables are registered from bertology.builtins on first use.
REGISTRY: Registry[CheckpointFamily] = Registry("families", lambda model_type, family: register_family(family))


def checkpoint_family(model_type: Any, source: str = "config.json") -> CheckpointFamily:
    known = registry()
    if not isinstance(model_type, str) or model_type not in known:
        raise CheckpointError(f"{source}: model_type: unknown model_type {model_type!r}; registered: "
                              f"{', '.join(known)}")
    return known[model_type]


def family_init(family: Any) -> Callable[[Any, torch.Generator | None], None] | None:
    """The initialisation of the models of the family `family` (a config's `family`) where the table of the
    family gives one (`CheckpointFamily.init`), else None."""
    return next((entry.init for entry in registry().values() if entry.family == family and entry.init is not None),
                None)


def family_for_config(config: TransformerConfig) -> CheckpointFamily:
    """The table a config is written with: the one it was read with (config.json's model_type, kept in `extra`)
    when that builds the config's family, else the one whose model_type is the family."""
    known = registry()
    family = getattr(config, "family", None)
    read_as = getattr(config, "extra", {}).get("model_type")
    read_with = known.get(read_as) if isinstance(read_as, str) else None
    if read_with is not None and read_with.family == family:
        return read_with
    if family in known:
        return known[family]
    raise CheckpointError(f"no registered checkpoint family builds {family or type(config).__name__!r} models; "
                          f"registered: {', '.join(known)}")


# --- config.json ------------------------------------------------------------------------------------------------


# Keys every transformers config may carry (PretrainedConfig's own, and the sequence-summary options that GPT-2,
# ELECTRA and XLNet configs share): a family's table may read them, but their presence says nothing about which
# family a file belongs to.
COMMON_KEYS = frozenset({"pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id", "sep_token_id",
                         "tie_word_embeddings", "is_encoder_decoder", "is_decoder", "use_cache", "summary_type",
                         "summary_use_proj", "summary_activation", "summary_proj_to_labels", "summary_first_dropout",
                         "summary_last_dropout"})


def check_mixed_keys(family: CheckpointFamily, hf: Mapping[str, Any], source: str) -> None:
    """A config key that only another registered family's table uses means the file mixes two families."""
    own = family.key_names | family.tolerated | COMMON_KEYS
    for other in registry().values():
        if other.model_type == family.model_type:
            continue
        for key in sorted(other.key_names - own):
            if hf.get(key) is not None:
                raise ConfigError(f"{source}: key {key!r} is a {other.model_type} config key, not a "
                                  f"{family.model_type} one: the file mixes two families' fields")


# Config fields that each count layers (or highway layers, ELMo's), every one of which holds weights of its own: no
# file can declare more of them than it stores tensors. ALBERT's shared layers hold one group, but a depth that many
# times the stored tensors is no model anyone trained either.
DEPTH_FIELDS = ("num_layers", "num_decoder_layers", "num_highway")


def check_depth(declared: Mapping[str, Any], tensors: int, source: str, weights: str) -> None:
    """A CheckpointError naming `source` and the key when a depth in `declared` (key -> value, as the file spells
    them) exceeds the `tensors` the weight file `weights` holds: checked before any model, even its meta-device
    skeleton (a module a layer), is built."""
    for key, value in declared.items():
        if isinstance(value, int) and not isinstance(value, bool) and value > tensors:
            raise CheckpointError(f"{source}: {key} {value}: {weights} holds {tensors} tensors, fewer than one a "
                                  "layer; the file declares layers its weights do not have")


def declared_depths(family: CheckpointFamily, hf: Mapping[str, Any]) -> dict[str, Any]:
    """config.json's depth keys (the family's spelling of DEPTH_FIELDS) and their values."""
    return {key.key: hf.get(key.key) for key in family.config_keys if key.field in DEPTH_FIELDS}


def config_from_hf(hf: dict[str, Any], source: str = "config.json") -> TransformerConfig:
    """Map a transformers config.json onto a TransformerConfig; keys bertology does not use are kept in `extra`."""
    family = checkpoint_family(hf.get("model_type"), source)
    check_mixed_keys(family, hf, source)
    if hf.get("position_embedding_type", "absolute") != "absolute":
        raise CheckpointError(
            f"{source}: position_embedding_type {hf['position_embedding_type']!r} is not supported (only 'absolute')"
        )
    for key, value in family.required.items():
        if hf.get(key) is not None and hf[key] != value:
            raise CheckpointError(f"{source}: {key} {hf[key]!r} is not supported: bertology builds "
                                  f"{family.model_type} models with {key} {value!r}")
    values: dict[str, Any] = {**{k: v for k, v in family.defaults.items() if k != "family"}, **family.fixed}
    used = set()
    for key in family.config_keys:
        try:
            if hf.get(key.key) is not None:
                values[key.field] = key.read(hf[key.key], hf) if key.read else hf[key.key]
                used.add(key.key)
            elif key.default is not None:
                values[key.field] = key.default(hf)
        except ConfigError as error:
            message = str(error)  # named by the key, unless the reader named a key already
            named = re.match(r"[A-Za-z_]\w*: ", message) is not None
            raise ConfigError(f"{source}: {message if named else f'{key.key}: {message}'}") from None
    try:
        # Every family's key ({"layer": [heads]}): pruned heads where the family's model prunes them (the BERT
        # family's: capability prunes-heads, which its config decides).
        declared = getattr(model_class(family.model), "config_capabilities", None)
        if "pruned_heads" in hf and declared is not None:
            values["pruned_heads"] = hf["pruned_heads"] or {}
            used.add("pruned_heads")
        elif hf.get("pruned_heads"):
            raise ConfigError(f"pruned_heads: {family.model_type} models cannot have pruned heads")
        extra = {k: v for k, v in hf.items() if k not in used}
        config = family.config_class(family=family.family, extra=extra, **values)  # type: ignore[arg-type]
        if declared is not None and config.pruned_heads and PRUNES_HEADS not in declared(config):
            raise ConfigError(f"pruned_heads: {family.model_type} models cannot have pruned heads")
        return config
    except (ConfigError, TypeError) as error:
        raise ConfigError(f"{source}: {error}") from None


def config_to_hf(config: TransformerConfig, heads: tuple[HeadSpec, ...], model: str | None = None) -> dict[str, Any]:
    """config.json for a model with these heads (`model`: its registered class, which picks among architectures
    with the same heads)."""
    family = family_for_config(config)
    hf: dict[str, Any] = dict(config.extra)
    for key in family.config_keys:
        value = getattr(config, key.field)
        if key.write is not None:
            value = key.write(value, config)
        if value is not None or key.key not in hf:
            hf[key.key] = value
    hf.pop("pruned_heads", None)
    if getattr(config, "pruned_heads", None):
        hf["pruned_heads"] = {str(layer): list(h) for layer, h in config.pruned_heads.items()}
    hf["model_type"] = family.model_type
    hf["architectures"] = [family.architecture_name(tuple(h.name for h in heads), model)]
    labelled = [h for h in heads if h.name in ("classifier", "token_classifier")]
    if labelled:
        n = labelled[0].num_labels
        if len(hf.get("id2label", {})) != n:
            hf["id2label"] = {str(i): f"LABEL_{i}" for i in range(n)}
            hf["label2id"] = {f"LABEL_{i}": i for i in range(n)}
        if labelled[0].kind in ("pooled", "first_token") and n == 1:
            hf.setdefault("problem_type", "regression")
    return hf


# --- weights --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Bound:
    """A weight entry with its names filled in for one model."""

    ours: tuple[str, ...]
    theirs: tuple[str, ...]
    transform: Transform


def applies(when: str | None, config: Any) -> bool:
    """Whether an entry's condition holds: the named config attribute is truthy (falsy after "not ")."""
    if when is None:
        return True
    if when.startswith("not "):
        return not getattr(config, when[4:])
    return bool(getattr(config, when))


def bound_entries(config: TransformerConfig, heads: tuple[HeadSpec, ...], prefixed: bool,
                  family: CheckpointFamily | None = None) -> list[Bound]:
    """Every entry of the family for this config and these heads, names filled in."""
    family = family or family_for_config(config)
    prefix = family.base_prefix(tuple(spec.name for spec in heads))
    base = f"{prefix}." if prefixed and prefix else ""
    out: list[Bound] = []
    group = getattr(config, "inner_group_size", 1)
    decoder_layers = getattr(config, "num_decoder_layers", None) or config.num_layers
    for entry in family.weights:
        if not applies(entry.when, config):
            continue
        spelled = entry.ours + entry.theirs
        if any("{d}" in name for name in spelled):  # an encoder-decoder's decoder layers
            indices = [dict(d=d) for d in range(decoder_layers)]
        elif any("{i}" in name for name in spelled):
            layers = getattr(config, entry.layers, None)
            if layers is None:  # a config without ALBERT's sharing (num_unique_layers): its depth
                layers = config.num_layers
            indices = [dict(i=i, group=i // group, inner=i % group) for i in range(entry.first, layers)]
        else:
            indices = [{}]
        for names in indices:
            out.append(Bound(tuple(n.format(**names) for n in entry.ours),
                             tuple(base + n.format(**names) for n in entry.theirs), entry.transform))
    for spec in heads:
        head = family.heads_of(config).get(spec.name)
        if head is None:
            raise CheckpointError(f"family {family.model_type!r} has no head named {spec.name!r} in transformers' "
                                  "format")
        head = head.variant(spec.kind) or head
        out.extend(Bound(e.ours, e.theirs, e.transform) for e in head.entries(spec.name, family.word_embeddings))
    return out


def model_entries(model: Any, prefixed: bool, family: CheckpointFamily) -> list[Bound]:
    """The bound entries for `model`; an entry naming a parameter the model lacks is a table error, except in a
    model of a class only some architectures build (`family.models`: T5's encoder stack), where the entries under
    a top-level module it does not have (the decoder) do not apply."""
    entries = bound_entries(model.config, model.head_specs, prefixed, family)
    if family.models and model_name(model) != family.model:
        children = {name for name, _ in model.named_children()}
        entries = [entry for entry in entries if any(name.split(".")[0] in children for name in entry.ours)]
    params = set(model.state_dict())
    absent = sorted({o for entry in entries for o in entry.ours if o not in params})
    if absent:
        raise CheckpointError(f"the {family.model_type} checkpoint table names parameters the model does not have: "
                              f"{', '.join(absent[:5])}{' ...' if len(absent) > 5 else ''}")
    return entries


def name_map(config: TransformerConfig, heads: tuple[HeadSpec, ...], prefixed: bool) -> dict[str, str]:
    """Our parameter name -> the checkpoint key it is stored under as it is (the entries that rename)."""
    return {b.ours[0]: b.theirs[0] for b in bound_entries(config, heads, prefixed) if isinstance(b.transform, Rename)}


def named_parameters(config: TransformerConfig, heads: tuple[HeadSpec, ...]) -> set[str]:
    """Our parameters that the family's entries store (tied ones excluded: they are stored once, elsewhere)."""
    return {o for b in bound_entries(config, heads, prefixed=False) if not isinstance(b.transform, Tie)
            for o in b.ours}


def to_state_dict(model: Any, weights: Mapping[str, Tensor], prefixed: bool, source: str,
                  family: CheckpointFamily | None = None) -> dict[str, Tensor]:
    """Checkpoint `weights` as `model`'s state dict; missing, unexpected and mis-shaped keys are one CheckpointError
    naming `source`."""
    family = family or family_for_config(model.config)
    expected = model.state_dict()
    entries = model_entries(model, prefixed, family)
    state: dict[str, Tensor] = {}
    missing: list[str] = []
    mismatched: list[str] = []
    used: set[str] = set()
    ties = []
    for entry in entries:
        if isinstance(entry.transform, Tie):
            ties.append(entry)
            continue
        absent = [k for k in entry.theirs if k not in weights]
        if absent:
            missing.extend(absent)
            continue
        used.update(entry.theirs)
        theirs = [weights[k] for k in entry.theirs]
        shapes = [expected[o].shape for o in entry.ours]
        try:
            ours = entry.transform.load(theirs, shapes)
            fits = all(t.shape == s for t, s in zip(ours, shapes))
        except (RuntimeError, ValueError):  # a reshape or split that the stored tensor cannot give
            fits = False
        if fits:
            state.update(zip(entry.ours, ours))
        elif isinstance(entry.transform, Rename):
            mismatched.append(f"{entry.theirs[0]}: checkpoint {tuple(theirs[0].shape)}, model {tuple(shapes[0])}")
        else:
            mismatched.append(f"{', '.join(entry.theirs)} ({entry.transform.name} to {', '.join(entry.ours)}): "
                              f"checkpoint {', '.join(str(tuple(t.shape)) for t in theirs)}, model "
                              f"{', '.join(str(tuple(s)) for s in shapes)}")
    for entry in ties:
        for ours, theirs in zip(entry.ours, entry.theirs):
            if theirs not in weights:
                continue
            used.add(theirs)
            if entry.transform.check and ours in state and not torch.equal(weights[theirs], state[ours]):
                mismatched.append(f"{theirs}: differs from {ours}, which transformers ties it to; untied weights are "
                                  "not supported")
    unexpected = sorted(k for k in set(weights) - used if not (family.ignored and k.endswith(family.ignored)))
    check_keys(source, family.model_type, missing, unexpected, mismatched)
    return state


def check_keys(source: str, family: str, missing: list[str], unexpected: list[str], mismatched: list[str]) -> None:
    """The one check of a checkpoint's keys against a model: every problem named in one CheckpointError."""
    problems = []
    if missing:
        problems.append(f"missing keys: {', '.join(missing)}")
    if unexpected:
        problems.append(f"unexpected keys: {', '.join(unexpected)}")
    if mismatched:
        problems.append(f"shape mismatches: {'; '.join(mismatched)}")
    if problems:
        raise CheckpointError(f"{source}: weights do not fit a {family} model: " + " | ".join(problems))


def from_state_dict(model: Any, family: CheckpointFamily | None = None) -> dict[str, Tensor]:
    """Our parameters under the checkpoint's names (with heads, base-model keys carry the family's prefix)."""
    family = family or family_for_config(model.config)
    state = model.state_dict()
    out: dict[str, Tensor] = {}
    covered: set[str] = set()
    for entry in model_entries(model, bool(model.head_specs), family):
        if isinstance(entry.transform, Tie):
            continue
        tensors = entry.transform.save([state[o].detach() for o in entry.ours], model.config)
        out.update((k, t.contiguous().clone()) for k, t in zip(entry.theirs, tensors))
        covered.update(entry.ours)
    unnamed = sorted(set(state) - covered)
    if unnamed:
        raise CheckpointError(f"parameters {', '.join(unnamed[:5])}{' ...' if len(unnamed) > 5 else ''} have no "
                              f"name in {family.model_type} checkpoints")
    return out


def head_specs(family: CheckpointFamily, config: TransformerConfig, names: tuple[str, ...],
               weights: Mapping[str, Tensor], source: str) -> tuple[HeadSpec, ...]:
    """The heads `names` as the family stores them; labels counted from the output layer's weight."""
    specs = []
    for name in names:
        head = family.heads_of(config).get(name)
        if head is None:
            raise CheckpointError(f"{source}: {family.model_type} checkpoints have no head {name!r} (heads: "
                                  f"{', '.join(family.heads)})")
        if head.untied is not None and unties(family, head, weights):
            head = head.untied
        num_labels = 2
        out = head.parts.get("out")
        if out is not None and f"{out}.weight" in weights:
            num_labels = weights[f"{out}.weight"].shape[0]
        specs.append(HeadSpec(name=name, kind=head.kind, num_labels=num_labels,  # type: ignore[arg-type]
                              activation=head.activation or config.hidden_act))
    return tuple(specs)


def unties(family: CheckpointFamily, head: Head, weights: Mapping[str, Tensor]) -> bool:
    """Whether the checkpoint holds `head`'s tied output weight with values of its own (not the word embeddings')."""
    tied = head.parts.get("tied")
    if tied is None or f"{tied}.weight" not in weights:
        return False
    stored = [e.theirs[0] for e in family.weights
              if e.ours == (family.word_embeddings,) and isinstance(e.transform, Rename)]
    for key in stored + [f"{family.prefix}.{k}" for k in stored]:
        if key in weights:
            return not torch.equal(weights[key], weights[f"{tied}.weight"])
    return True
