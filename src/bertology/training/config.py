"""The run configuration of `bertology pretrain`: one YAML or JSON file mapped onto nested dataclasses.

Sections and what belongs where:

* ``model``: the architecture (a ``preset`` size plus field overrides, or ``init_from`` an existing checkpoint).
* ``tokenizer``: an existing tokenizer directory, or how to train one on the corpus.
* ``data``: the corpus, its shards, how instances are cut (``instances``) and masked (``masking``).
* ``objectives``: ``name -> options`` (``mlm``, ``nsp``); the default is MLM, plus NSP for ``nsp`` instances.
* ``optim``: everything that shapes the optimisation: batch size, accumulation, learning rate and schedule, clipping.
* ``run``: seed, output directory, how often to log, evaluate and checkpoint.
* ``speed``: settings that change only how fast the run goes, never what it computes (up to floating-point
  rounding: bf16 autocast, fused kernels): device, threads, autocast, torch.compile, prefetching, FSDP sharding.

Unknown keys and wrong types are errors naming the key's path (``optim.lerning_rate: unknown key; did you mean
lr?``). ``apply_overrides`` applies command-line ``key.path=value`` settings (values parsed as YAML).
"""

from __future__ import annotations

import dataclasses
import json
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from bertology.data.masking import MaskingConfig
from bertology.config import from_mapping, known_keys, suggest
from bertology.errors import ConfigError



@dataclass
class ModelConfig:
    """The encoder. Fields left at None come from ``preset`` (or ``init_from``), then EncoderConfig's defaults;
    ``vocab_size`` and ``pad_token_id`` default to the tokenizer's and must match it when given."""

    preset: str | None = "tiny"
    init_from: str | None = None  # a model directory (HF format) to continue pretraining from
    family: Literal["bert", "roberta", "xlm-roberta", "electra", "albert", "distilbert"] | None = None
    vocab_size: int | None = None
    hidden_size: int | None = None
    num_layers: int | None = None
    num_heads: int | None = None
    intermediate_size: int | None = None
    hidden_act: str | None = None
    max_position_embeddings: int | None = None
    type_vocab_size: int | None = None
    embedding_size: int | None = None
    num_layer_groups: int | None = None
    inner_group_size: int | None = None
    layer_norm_eps: float | None = None
    pad_token_id: int | None = None
    positions_after_padding: bool | None = None
    hidden_dropout: float | None = None
    attention_dropout: float | None = None
    initializer_range: float | None = None

    def overrides(self) -> dict[str, Any]:
        """The EncoderConfig fields set here."""
        skip = {"preset", "init_from"}
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if f.name not in skip and getattr(self, f.name) is not None}


@dataclass
class TokenizerConfig:
    """``path``: an existing tokenizer directory. Without it, one is trained on the corpus (``kind``,
    ``vocab_size``, ...) and saved to ``<output_dir>/tokenizer``, or reused from there on later runs."""

    path: str | None = None
    kind: Literal["wordpiece", "bpe", "unigram"] = "wordpiece"
    vocab_size: int = 8000
    style: Literal["bert", "roberta"] | None = None
    lowercase: bool | None = None
    min_frequency: int = 2

    def __post_init__(self) -> None:
        if self.vocab_size < 8:
            raise ConfigError(f"tokenizer.vocab_size: must be >= 8, got {self.vocab_size}")


@dataclass
class InstancesConfig:
    """How pretraining sequences are cut from documents (see bertology.data.instances); the seed is run.seed."""

    kind: Literal["nsp", "segment-pair", "full-sentences", "doc-sentences"] = "nsp"
    max_seq_length: int = 128
    short_seq_prob: float = 0.1
    dupe_factor: int = 1


@dataclass
class DataConfig:
    """The corpus and its shards. ``shards`` defaults to ``<output_dir>/shards`` (prepared once, then reused)."""

    corpus: list[str] = field(default_factory=list)
    format: Literal["bert", "text", "jsonl", "brown"] = "bert"
    text_field: str = "text"
    encoding: str = "utf-8"
    shards: str | None = None
    heldout_documents: int | float = 0  # a count, or a fraction of the documents, held out for evaluation
    shard_size_tokens: int = 1 << 24
    instances: InstancesConfig = field(default_factory=InstancesConfig)
    masking: MaskingConfig = field(default_factory=MaskingConfig)
    # > 1: batch instances of similar length within windows of this many batches (less padding, other batches).
    bucket_window: int = 0


@dataclass
class OptimConfig:
    """AdamW with warm-up and decay. ``batch_size`` is per process and micro-step; the effective batch is
    ``batch_size x grad_accumulation x world size``. ``warmup_steps`` wins over ``warmup_ratio``."""

    batch_size: int = 32
    grad_accumulation: int = 1
    total_steps: int = 1000  # optimizer steps
    lr: float = 1e-4
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-6
    weight_decay: float = 0.01
    warmup_steps: int | None = None
    warmup_ratio: float = 0.01
    schedule: Literal["linear", "cosine", "constant"] = "linear"
    min_lr_ratio: float = 0.0  # the learning rate decays to lr x min_lr_ratio
    clip_norm: float | None = 1.0

    def __post_init__(self) -> None:
        for key in ("batch_size", "grad_accumulation", "total_steps"):
            if getattr(self, key) < 1:
                raise ConfigError(f"optim.{key}: must be >= 1, got {getattr(self, key)}")
        if self.lr <= 0:
            raise ConfigError(f"optim.lr: must be > 0, got {self.lr}")
        if not (0 <= self.betas[0] < 1 and 0 <= self.betas[1] < 1):
            raise ConfigError(f"optim.betas: each must be in [0, 1), got {list(self.betas)}")
        if self.warmup_steps is not None and self.warmup_steps < 0:
            raise ConfigError(f"optim.warmup_steps: must be >= 0, got {self.warmup_steps}")
        if not 0 <= self.warmup_ratio <= 1:
            raise ConfigError(f"optim.warmup_ratio: must be in [0, 1], got {self.warmup_ratio}")
        if not 0 <= self.min_lr_ratio <= 1:
            raise ConfigError(f"optim.min_lr_ratio: must be in [0, 1], got {self.min_lr_ratio}")
        if self.clip_norm is not None and self.clip_norm <= 0:
            raise ConfigError(f"optim.clip_norm: must be > 0 or null, got {self.clip_norm}")

    @property
    def warmup(self) -> int:
        if self.warmup_steps is not None:
            return self.warmup_steps
        return int(round(self.warmup_ratio * self.total_steps))


@dataclass
class RunConfig:
    """Bookkeeping. Steps are optimizer steps; 0 for an ``*_every`` means only at the end of the run."""

    seed: int = 0
    output_dir: str = "runs/pretrain"
    log_every: int = 10
    eval_every: int = 0
    eval_at_start: bool = False  # evaluate the untrained model before the first step (step 0 in the metrics)
    eval_batches: int | None = None  # cap on held-out batches per evaluation (None: all)
    checkpoint_every: int = 0
    keep_last: int = 2
    plot: bool = False  # write a PNG of the curves at the end
    progress: bool = True  # tqdm progress bar

    def __post_init__(self) -> None:
        for key in ("log_every", "eval_every", "checkpoint_every", "seed"):
            if getattr(self, key) < 0:
                raise ConfigError(f"run.{key}: must be >= 0, got {getattr(self, key)}")
        if self.keep_last < 1:
            raise ConfigError(f"run.keep_last: must be >= 1, got {self.keep_last}")
        if self.eval_batches is not None and self.eval_batches < 1:
            raise ConfigError(f"run.eval_batches: must be >= 1 or null, got {self.eval_batches}")


@dataclass
class SpeedConfig:
    """Settings that change only speed. ``bf16`` None: autocast to bfloat16 where the device runs it natively
    (CUDA with bf16 support), off on CPU; True asks for it anywhere torch supports it."""

    device: str = "auto"  # auto: cuda:<local rank> when CUDA is available, else cpu
    threads: int | None = None  # torch intra-op threads per process; None: the cores divided among local ranks
    bf16: bool | None = None
    compile: bool = False  # torch.compile the encoder layers
    prefetch: int = 2  # batches prepared ahead in a background thread (0: in the training loop)
    fused_optimizer: bool = True  # AdamW's fused kernel where the device has it
    fsdp: bool = False  # shard parameters, gradients and optimizer state over ranks instead of DDP

    def __post_init__(self) -> None:
        if self.threads is not None and self.threads < 1:
            raise ConfigError(f"speed.threads: must be >= 1 or null, got {self.threads}")
        if self.prefetch < 0:
            raise ConfigError(f"speed.prefetch: must be >= 0, got {self.prefetch}")


@dataclass
class PretrainConfig:
    """A whole pretraining run (see the module docstring for the sections)."""

    model: ModelConfig = field(default_factory=ModelConfig)
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    data: DataConfig = field(default_factory=DataConfig)
    objectives: dict[str, dict[str, Any]] | None = None
    optim: OptimConfig = field(default_factory=OptimConfig)
    run: RunConfig = field(default_factory=RunConfig)
    speed: SpeedConfig = field(default_factory=SpeedConfig)

    def __post_init__(self) -> None:
        from bertology.objectives import OBJECTIVES

        if self.objectives is None:
            self.objectives = {"mlm": {}}
            if self.data.instances.kind == "nsp":
                self.objectives["nsp"] = {}
        if not self.objectives:
            raise ConfigError("objectives: at least one objective is needed")
        for name, options in self.objectives.items():
            if name not in OBJECTIVES:
                raise ConfigError(f"objectives.{name}: unknown objective{suggest(name, OBJECTIVES)}"
                                  f"{known_keys(set(OBJECTIVES))}")
            schema = OBJECTIVES[name]
            fields = {f.name for f in dataclasses.fields(schema)} - {"name", "activation"}
            from_mapping(_restrict(schema, fields), options, f"objectives.{name}")
        if "nsp" in self.objectives and self.data.instances.kind != "nsp":
            raise ConfigError(f"objectives.nsp: next-sentence prediction needs data.instances.kind 'nsp', "
                              f"got {self.data.instances.kind!r}")

    def to_dict(self) -> dict[str, Any]:
        return _plain(dataclasses.asdict(self))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], source: str | None = None) -> PretrainConfig:
        try:
            return from_mapping(cls, data, "")
        except ConfigError as error:
            if source is None:
                raise
            raise ConfigError(f"{source}: {error}") from None


def _restrict(cls: type, names: set[str]) -> type:
    """A dataclass with only the fields ``names`` of ``cls`` (to validate user-settable options)."""
    hints = typing.get_type_hints(cls)
    return dataclasses.make_dataclass(cls.__name__, [(n, hints[n], field(default=None)) for n in sorted(names)])


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def read_config_file(path: str | Path) -> dict[str, Any]:
    """The raw mapping of a YAML (``.yaml``/``.yml``) or JSON (``.json``) config file."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: config file not found")
    text = path.read_text(encoding="utf-8")
    try:
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except json.JSONDecodeError as error:
        raise ConfigError(f"{path}: line {error.lineno} column {error.colno}: invalid JSON: {error.msg}") from None
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f"line {mark.line + 1} column {mark.column + 1}: " if mark is not None else ""
        raise ConfigError(f"{path}: {where}invalid YAML: {getattr(error, 'problem', error)}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of sections, got {type(data).__name__}")
    return data


def apply_overrides(data: dict[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """Apply ``section.key=value`` settings to a raw config mapping (values parsed as YAML: 3, 1e-4, true, [a, b])."""
    data = json.loads(json.dumps(data))  # a deep copy of plain data
    for item in overrides:
        key, sep, text = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--set {item!r}: expected KEY.PATH=VALUE, e.g. optim.lr=1e-4")
        try:
            value = yaml.safe_load(text) if text.strip() else ""
        except yaml.YAMLError:
            value = text
        parts = key.strip().split(".")
        node = data
        for i, part in enumerate(parts[:-1]):
            child = node.setdefault(part, {})
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                raise ConfigError(f"--set {item!r}: {'.'.join(parts[:i + 1])} is not a section")
            node = child
        node[parts[-1]] = value
    return data


def load_config(path: str | Path | None = None, overrides: Sequence[str] = ()) -> PretrainConfig:
    """Read a config file (or start from defaults), apply ``--set`` overrides, and validate it."""
    data = read_config_file(path) if path is not None else {}
    data = apply_overrides(data, overrides)
    return PretrainConfig.from_dict(data, source=str(path) if path is not None else None)
