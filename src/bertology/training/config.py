"""The run configuration of `bertology pretrain`: one YAML or JSON file mapped onto nested dataclasses.

Sections and what belongs where:

* ``model``: ``architecture`` (a registered model: encoder, decoder, seq2seq, xlnet, elmo), a ``preset`` size or
  ``init_from`` an existing checkpoint, and fields of the architecture's config class (``family``, ``hidden_size``,
  ...), checked against that class as the registry has it.
* ``tokenizer``: an existing tokenizer directory, or how to train one on the corpus.
* ``data``: the corpus, its shards, how instances are cut (``instances``) and masked (``masking``), or corrupted
  into an encoder-decoder's sources and targets (``span_corruption``: T5's; ``noise``: BART's).
* ``objectives``: ``name -> options`` (``mlm``, ``nsp``, ``sop``, ``span_boundary``, ...); the default is MLM, plus
  NSP for ``nsp`` instances, SOP for ``sop`` instances and the span boundary objective with span masking.
* ``optim``: everything that shapes the optimisation: batch size, accumulation, learning rate and schedule, clipping.
* ``run``: seed, output directory, how often to log, evaluate and checkpoint.
* ``speed``: settings that change only how fast the run goes, never what it computes (up to floating-point
  rounding: bf16 autocast, fused kernels): device, threads, autocast, torch.compile, prefetching, FSDP sharding,
  activation checkpointing, meta-device construction.

Unknown keys, wrong types, non-finite numbers and out-of-range values are errors naming the key's path
(``optim.lerning_rate: unknown key; did you mean lr?``); so are a key given twice in a file and a file that is not
UTF-8. ``apply_overrides`` applies command-line ``key.path=value`` settings (values parsed as YAML).
"""

from __future__ import annotations

import codecs
import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from bertology.config import (
    check_schema_values,
    decode_text,
    from_mapping,
    known_keys,
    load_json,
    load_yaml,
    open_inline,
    schema_fields,
    suggest,
    to_mapping,
    validate,
)
from bertology.data.bart_noise import NoiseConfig
from bertology.data.instances import InstanceConfig
from bertology.data.masking import MaskingConfig
from bertology.data.multilingual import MultilingualConfig
from bertology.data.span_corruption import SpanCorruptionConfig
from bertology.errors import ConfigError
from bertology.model.config import PRESET_SIZES
from bertology.model.registry import alias


def architectures() -> dict[str, Any]:
    """The registered architectures a run config may name (``model.architecture``) -> their registry entries
    (``bertology.model.registry``); those with a run-config builder can be pretrained from scratch."""
    import bertology.model.run_configs  # noqa: F401  (registers every built-in model and its builder)
    from bertology.model.registry import MODELS

    return dict(MODELS)


# The shape a model section has (named by the errors that meet an older one).
MODEL_SHAPE = ("model: {architecture: NAME, preset: SIZE, init_from: DIR, <fields of the architecture's config "
               "class>}")


@dataclass
class ModelConfig:
    """The model: ``architecture`` names a registered model (``encoder``, ``decoder``, ``seq2seq``, ``xlnet``,
    ``elmo``; bertology.model.registry), ``preset`` a size (tiny ... large; ELMo: tiny or null for the released
    sizes) or ``init_from`` a model directory to continue, and the section's other keys are fields of that
    architecture's config class (found through the registry), written flat: ``model: {architecture: decoder,
    family: gpt2, preset: mini, hidden_size: 256}``. ``family`` picks the family of those the architecture builds
    (an encoder: bert by default, roberta, albert, ...; a decoder: gpt2; an encoder-decoder: t5, bart). Unset fields
    come from the preset, then the family's (bertology.model.run_configs); ``vocab_size`` and the special ids are the
    tokenizer's and must match it when given. ``architecture`` defaults to the encoder, or with ``init_from`` to the
    checkpoint's model (whose config the settings then change)."""

    architecture: str | None = None
    preset: str | None = "tiny"
    init_from: str | None = None  # a model directory (HF format) to continue pretraining from
    settings: dict[str, Any] = open_inline()  # fields of the architecture's config class

    def __post_init__(self) -> None:
        validate(self, "model")
        known = architectures()
        old = [key for key in ("elmo", "overrides", "transformer", "xlnet") if key in self.settings]
        if old:
            raise ConfigError(f"model.{old[0]}: the model section is {MODEL_SHAPE} now; write the settings at the "
                              f"section's level with the architecture they belong to (e.g. model: {{architecture: "
                              f"{'elmo' if old[0] == 'elmo' else 'xlnet' if old[0] == 'xlnet' else 'encoder'}, "
                              f"preset: tiny, ...}})")
        renamed = alias(self.architecture)  # an old name: the architecture it is now, with what it implied
        if renamed is not None:
            self.architecture = renamed[0]
            self.settings = {**renamed[1], **self.settings}
        if self.architecture is not None and self.architecture not in known:
            raise ConfigError(f"model.architecture: unknown architecture {self.architecture!r}"
                              f"{suggest(self.architecture, known)}{known_keys(known)}")
        if self.preset is not None and self.preset not in PRESET_SIZES:
            raise ConfigError(f"model.preset: unknown preset {self.preset!r}{suggest(self.preset, PRESET_SIZES)}"
                              f"{known_keys(PRESET_SIZES)}")
        if self.architecture is None and self.init_from is not None:
            return  # the checkpoint's architecture, whose config class the recipe checks the settings against
        from bertology.model.run_configs import check_family

        check_family(self.kind, self.settings)
        self.settings = self.checked_settings(self.kind)
        if self.kind == "elmo" and self.preset not in ("tiny", None):
            raise ConfigError(f"model.preset: ELMo has the preset 'tiny' or none (the released sizes), got "
                              f"{self.preset!r}")

    def checked_settings(self, architecture: str) -> dict[str, Any]:
        """The settings checked against `architecture`'s config class: an unknown key is an error naming it (and,
        if another architecture's config has it, that architecture)."""
        known = architectures()

        def hint(key: str) -> str:
            owners = [name for name, entry in known.items() if key in schema_fields(entry.config_class)]
            if not owners:
                return ""
            return (f" for the {architecture} architecture (a field of {', '.join(owners)} models: set "
                    f"model.architecture; {MODEL_SHAPE})")

        return check_schema_values(known[architecture].config_class, self.settings, "model", hint)

    @property
    def kind(self) -> str:
        """The architecture built (its registered name): ``architecture``, the encoder when unset."""
        return self.architecture or "encoder"

    @property
    def family(self) -> str | None:
        """The family the settings name, else the architecture's default one."""
        from bertology.model.run_configs import default_family

        return self.settings.get("family") or (default_family(self.kind) if self.architecture or not self.init_from
                                               else None)


@dataclass
class TokenizerConfig:
    """``path``: an existing tokenizer directory. Without it, one is trained on the corpus (``kind``,
    ``vocab_size``, ``style``, ...; ``bertology.tokenization.train_tokenizer``) and saved to
    ``<output_dir>/tokenizer``, or reused from there on later runs. ``style`` picks the family's special tokens and
    framing: ``gpt2`` (byte-level BPE, <|endoftext|>), ``t5`` (Unigram with ``sentinels`` sentinel tokens, T5's
    100 by default), ``bart``, ``xlnet``, ``bert``, ``roberta``.

    ``adapt`` (docs/ADAPTATION.md) says what a run does with a vocabulary: ``keep`` (the default) uses ``path``, or
    with ``model.init_from`` and no ``path`` the tokenizer saved in that model directory, else trains one as
    above; ``extend`` (with ``model.init_from``) appends the ``extend_size`` most frequent entries of a ``kind``
    tokenizer of ``vocab_size`` trained on the corpus to the model's tokenizer (``path`` or the model directory's),
    kept at ``<output_dir>/tokenizer``; ``new`` trains a fresh vocabulary on the corpus for a model pretrained from
    scratch (SciBERT's SciVocab): neither ``path`` nor ``model.init_from``."""

    path: str | None = None
    kind: Literal["wordpiece", "bpe", "unigram", "word"] = "wordpiece"  # word: whole words (ELMo's softmax)
    vocab_size: int = 8000
    style: Literal["bert", "roberta", "xlnet", "gpt2", "bart", "t5", "deberta"] | None = None
    lowercase: bool | None = None
    min_frequency: int = 2
    sentinels: int | None = None  # with style t5 (None: T5's 100)
    adapt: Literal["keep", "extend", "new"] = "keep"
    extend_size: int | None = None  # with adapt extend: how many entries are added

    def __post_init__(self) -> None:
        validate(self, "tokenizer")
        if self.adapt == "extend":
            if self.extend_size is None or self.extend_size < 1:
                raise ConfigError(f"tokenizer.extend_size: adapt extend adds this many entries; must be >= 1, got "
                                  f"{self.extend_size}")
            if self.kind not in ("wordpiece", "bpe"):
                raise ConfigError(f"tokenizer.kind: adapt extend learns WordPiece or BPE entries, got {self.kind!r}")
        elif self.extend_size is not None:
            raise ConfigError(f"tokenizer.extend_size: read with adapt extend only, but adapt is {self.adapt!r}")
        if self.adapt == "new" and self.path is not None:
            raise ConfigError("tokenizer.path: adapt new trains a fresh vocabulary on the corpus; leave path unset "
                              "(or use adapt keep)")
        if self.vocab_size < 8:
            raise ConfigError(f"tokenizer.vocab_size: must be >= 8, got {self.vocab_size}")
        if self.min_frequency < 0:
            raise ConfigError(f"tokenizer.min_frequency: must be >= 0, got {self.min_frequency}")
        if self.sentinels is not None and self.sentinels < 1:
            raise ConfigError(f"tokenizer.sentinels: must be >= 1, got {self.sentinels}")
        if self.sentinels is not None and self.style != "t5":
            raise ConfigError(f"tokenizer.sentinels: sentinels are T5's, for a t5-style tokenizer; style is "
                              f"{self.style!r}")


@dataclass
class DataConfig:
    """The corpus and its shards. ``shards`` defaults to ``<output_dir>/shards`` (prepared once, then reused)."""

    corpus: list[str] = field(default_factory=list)
    format: Literal["bert", "text", "jsonl", "brown", "glue"] = "bert"
    text_field: str = "text"
    # With format glue: the GLUE task whose train.tsv texts are the corpus (task-adaptive pretraining).
    task: str | None = None
    encoding: str = "utf-8"
    shards: str | None = None
    heldout_documents: int | float = 0  # a count, or a fraction of the documents, held out for evaluation
    shard_size_tokens: int = 1 << 24
    instances: InstanceConfig = field(default_factory=InstanceConfig)
    masking: MaskingConfig = field(default_factory=MaskingConfig)
    # > 1: batch instances of similar length within windows of this many batches (less padding, other batches).
    bucket_window: int = 0
    # Language-tagged corpora mixed by XLM-R's sampling (bertology.data.multilingual), instead of ``corpus``.
    multilingual: MultilingualConfig | None = None
    # T5's span corruption (bertology.data.span_corruption): the sources and targets of the denoise objective;
    # its ``objective`` picks another of T5's Table 3 (i.i.d. spans, BERT-style, MASS, drop, deshuffle, prefix LM).
    span_corruption: SpanCorruptionConfig | None = None
    # BART's noise functions (bertology.data.bart_noise): the other way to make them.
    noise: NoiseConfig | None = None

    def __post_init__(self) -> None:
        validate(self, "data")
        if any(not path.strip() for path in self.corpus):
            raise ConfigError(f"data.corpus: an empty path in {self.corpus!r}")
        if not self.text_field:
            raise ConfigError("data.text_field: must not be empty")
        try:
            codecs.lookup(self.encoding)
        except LookupError:
            raise ConfigError(f"data.encoding: unknown text encoding {self.encoding!r}") from None
        if isinstance(self.heldout_documents, float):
            if not 0.0 <= self.heldout_documents < 1.0:
                raise ConfigError(f"data.heldout_documents: a fraction must be in [0, 1), got "
                                  f"{self.heldout_documents} (an int is a count of documents)")
        elif self.heldout_documents < 0:
            raise ConfigError(f"data.heldout_documents: must be >= 0, got {self.heldout_documents}")
        if self.shard_size_tokens < 1:
            raise ConfigError(f"data.shard_size_tokens: must be >= 1, got {self.shard_size_tokens}")
        if self.bucket_window < 0:
            raise ConfigError(f"data.bucket_window: must be >= 0, got {self.bucket_window}")
        if self.multilingual is not None and self.corpus:
            raise ConfigError("data.corpus: give the corpora under data.multilingual.languages, not both")
        if self.format == "glue":
            from bertology.data.corpus import glue_task

            if self.task is None:
                raise ConfigError("data.task: the glue format reads a GLUE task's train.tsv: name the task (sst2, "
                                  "cola, mrpc, rte, stsb)")
            try:
                glue_task(self.task)
            except ConfigError as error:
                raise ConfigError(f"data.{error}") from None
        elif self.task is not None:
            raise ConfigError(f"data.task: read by data.format glue only, but data.format is {self.format!r}")


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
    # Layer-wise learning-rate decay: layer i of L learns at lr x layer_decay ** (L - i), heads at lr (1: off).
    layer_decay: float = 1.0
    # The model's token table learns at lr x embedding_lr_scale (1: at lr, as every other parameter). T5's table is
    # N(0, 1) beside matrices of std fan_in ** -0.5: under one AdamW lr it moves about sqrt(hidden) times slower
    # for its scale than they do; Adafactor's relative steps (T5's optimizer) move both alike. None: 1 (as runs
    # before the option recorded it).
    embedding_lr_scale: float | None = None
    # Train only the parameters whose names match one of these fnmatch patterns (the model's own names, as in
    # its state dict: "heads.mlm.*" trains a fresh MLM head over a frozen encoder; an objective's own modules are
    # "objective_modules.NAME.*"); every other parameter is frozen, bit for bit. A parameter shared under several
    # names (a tied decoder) trains only if every one of its names matches. None: everything trains.
    train_only: list[str] | None = None

    def __post_init__(self) -> None:
        validate(self, "optim")
        if self.train_only is not None:
            if not self.train_only:
                raise ConfigError("optim.train_only: give at least one parameter-name pattern, or null to train "
                                  "every parameter")
            for index, pattern in enumerate(self.train_only):
                if not pattern.strip():
                    raise ConfigError(f"optim.train_only[{index}]: must not be empty")
        for key in ("batch_size", "grad_accumulation", "total_steps"):
            if getattr(self, key) < 1:
                raise ConfigError(f"optim.{key}: must be >= 1, got {getattr(self, key)}")
        if self.lr <= 0:
            raise ConfigError(f"optim.lr: must be > 0, got {self.lr}")
        if not (0 <= self.betas[0] < 1 and 0 <= self.betas[1] < 1):
            raise ConfigError(f"optim.betas: each must be in [0, 1), got {list(self.betas)}")
        if self.eps <= 0:
            raise ConfigError(f"optim.eps: must be > 0, got {self.eps}")
        if self.weight_decay < 0:
            raise ConfigError(f"optim.weight_decay: must be >= 0, got {self.weight_decay}")
        if self.warmup_steps is not None and self.warmup_steps < 0:
            raise ConfigError(f"optim.warmup_steps: must be >= 0, got {self.warmup_steps}")
        if not 0 <= self.warmup_ratio <= 1:
            raise ConfigError(f"optim.warmup_ratio: must be in [0, 1], got {self.warmup_ratio}")
        if not 0 <= self.min_lr_ratio <= 1:
            raise ConfigError(f"optim.min_lr_ratio: must be in [0, 1], got {self.min_lr_ratio}")
        if self.clip_norm is not None and self.clip_norm <= 0:
            raise ConfigError(f"optim.clip_norm: must be > 0 or null, got {self.clip_norm}")
        if not 0 < self.layer_decay <= 1:
            raise ConfigError(f"optim.layer_decay: must be in (0, 1], got {self.layer_decay}")
        if self.embedding_lr_scale is not None and self.embedding_lr_scale <= 0:
            raise ConfigError(f"optim.embedding_lr_scale: must be > 0, got {self.embedding_lr_scale}")

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
        validate(self, "run")
        for key in ("log_every", "eval_every", "checkpoint_every"):
            if getattr(self, key) < 0:
                raise ConfigError(f"run.{key}: must be >= 0, got {getattr(self, key)}")
        # torch.manual_seed takes 64 bits, and each rank adds to the seed.
        if not 0 <= self.seed < 2**63:
            raise ConfigError(f"run.seed: must be in [0, 2**63), got {self.seed}")
        if not self.output_dir.strip():
            raise ConfigError("run.output_dir: must not be empty")
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
    compile: bool = False  # torch.compile each block's token-wise work (model.blocks(); attention stays eager)
    prefetch: int = 2  # batches prepared ahead in a background thread (0: in the training loop)
    fused_optimizer: bool = True  # AdamW's fused kernel where the device has it
    # FSDP2: shard parameters, gradients and optimizer state over ranks (each transformer block one unit, then the
    # root) instead of DDP; also with one process. For pretraining (fine-tuning refuses it).
    fsdp: bool = False
    # Recompute each transformer block's activations in the backward instead of keeping them (less memory, about a
    # third more compute; the same gradients).
    activation_checkpointing: bool = False
    # Build a fresh model on the meta device and materialise it once with its initialisation (no default
    # initialisation first): the same weights, bit for bit. For pretraining; fine-tuning starts from a checkpoint.
    meta_init: bool = False
    # CUDA graphs: each micro-batch's forward and backward replayed as one launch (bertology.training.graphs: one
    # process on one GPU, masked-LM pretraining batches padded to static shapes). None (auto): on wherever that
    # holds and nothing below excludes it (compile, fsdp, activation checkpointing). The packed token count is rounded
    # up to a multiple of graph_bucket: larger buckets mean fewer graphs and more padding.
    cuda_graphs: bool | None = None
    graph_bucket: int = 256

    def __post_init__(self) -> None:
        validate(self, "speed")
        if not self.device.strip():
            raise ConfigError("speed.device: must not be empty (auto, cpu, cuda, cuda:1, ...)")
        if self.threads is not None and self.threads < 1:
            raise ConfigError(f"speed.threads: must be >= 1 or null, got {self.threads}")
        if self.prefetch < 0:
            raise ConfigError(f"speed.prefetch: must be >= 0, got {self.prefetch}")
        if self.graph_bucket < 1:
            raise ConfigError(f"speed.graph_bucket: must be >= 1, got {self.graph_bucket}")
        if self.cuda_graphs:
            for other in ("compile", "fsdp", "activation_checkpointing"):
                if getattr(self, other):
                    raise ConfigError(f"speed.cuda_graphs: cannot be combined with speed.{other}; turn one off")


@dataclass
class TrainConfig:
    """The sections every training run has, and all the trainer reads: a run whose data, model and objectives are
    built in Python (a fine-tuning task, a test) needs only these. ``PretrainConfig`` adds its own sections."""

    optim: OptimConfig = field(default_factory=OptimConfig)
    run: RunConfig = field(default_factory=RunConfig)
    speed: SpeedConfig = field(default_factory=SpeedConfig)

    def to_dict(self) -> dict[str, Any]:
        return to_mapping(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TrainConfig:
        return from_mapping(cls, data, "")


# The objective a run of each architecture trains when the config names none (an encoder: MLM, and NSP, SOP or
# the span boundary objective as the instances and masking ask).
DEFAULT_OBJECTIVE = {"decoder": "clm", "seq2seq": "denoise", "xlnet": "plm", "elmo": "bilm"}


@dataclass
class PretrainConfig:
    """A whole pretraining run (see the module docstring for the sections).

    ``objectives`` maps an objective's name (a key of ``bertology.objectives.OBJECTIVES``) to its options, the
    fields of its class less ``bertology.objectives.FIXED_FIELDS``; they are checked once, here, by
    ``bertology.objectives.build_objectives``, and ``build_objectives`` makes the objective instances by the same
    function."""

    model: ModelConfig = field(default_factory=ModelConfig)
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    data: DataConfig = field(default_factory=DataConfig)
    objectives: dict[str, dict[str, Any] | None] | None = None
    optim: OptimConfig = field(default_factory=OptimConfig)
    run: RunConfig = field(default_factory=RunConfig)
    speed: SpeedConfig = field(default_factory=SpeedConfig)

    def __post_init__(self) -> None:
        if self.objectives is None and self.model.kind in DEFAULT_OBJECTIVE:
            self.objectives = {DEFAULT_OBJECTIVE[self.model.kind]: {}}
        if self.objectives is None:
            self.objectives = {"mlm": {}}
            if self.data.instances.nsp:
                self.objectives["nsp"] = {}
            if self.data.instances.kind == "sop":
                self.objectives["sop"] = {}
            if self.data.masking.spans is not None:
                self.objectives["span_boundary"] = {}
        validate(self)
        if not self.objectives:
            raise ConfigError("objectives: at least one objective is needed")
        built = self._build_objectives()  # each objective checks its own options
        # The options as given (null as {}), with their values checked and converted (2 -> 2.0 for a float).
        self.objectives = {name: {key: getattr(built[name], key) for key in (options or {})}
                           for name, options in self.objectives.items()}
        if self.data.instances.kind == "segment-stream" and "plm" not in self.objectives:
            raise ConfigError("data.instances.kind: segment-stream carries XLNet's memory from batch to batch, for "
                              "the permutation LM (objectives.plm); use doc-sentences or full-sentences")
        if self.model.init_from is None:
            for name, objective in built.items():
                if self.model.kind not in objective.trains:
                    raise ConfigError(f"objectives.{name}: trains {' or '.join(objective.trains)} models, but "
                                      f"model.architecture is {self.model.kind}")
        causal = [name for name in ("clm", "prefixlm") if name in self.objectives]
        if self.data.instances.kind == "packed-documents" and not causal:
            raise ConfigError("data.instances.kind: packed-documents rows hold several documents whose boundaries "
                              "only causal and prefix LM keep (objectives.clm, objectives.prefixlm); use "
                              "doc-sentences or full-sentences")
        if causal and self.data.instances.pairs:
            raise ConfigError(f"objectives.{causal[0]}: next-token prediction reads running text: set "
                              f"data.instances.kind to packed-documents (or doc-sentences, full-sentences), got "
                              f"{self.data.instances.kind!r}")
        if len(causal) > 1:
            raise ConfigError("objectives.prefixlm: makes its own batches (a split per row); train it or "
                              "objectives.clm, not both")
        if causal == ["clm"] and self.model.settings.get("prefix_lm"):
            raise ConfigError("model.prefix_lm: a prefix LM reads an input in both directions, which would show "
                              "objectives.clm the tokens it predicts; train it with objectives.prefixlm")
        if "denoise" in self.objectives and self.data.span_corruption is None and self.data.noise is None:
            raise ConfigError("objectives.denoise: needs sources and targets: set data.span_corruption (T5's span "
                              "corruption, e.g. {noise_density: 0.15, mean_noise_span_length: 3}) or data.noise "
                              "(BART's noise functions, e.g. {text_infilling: {}, sentence_permutation: {}})")
        for key in ("span_corruption", "noise"):
            if getattr(self.data, key) is not None and "denoise" not in self.objectives:
                raise ConfigError(f"data.{key}: makes sources and targets for objectives.denoise, which is not "
                                  f"among the objectives")
        if self.data.span_corruption is not None and self.data.noise is not None:
            raise ConfigError("data.noise: give T5's span corruption (data.span_corruption) or BART's noise "
                              "(data.noise), not both")
        if self.data.noise is not None and self.data.instances.kind != "doc-sentences":
            raise ConfigError(f"data.noise: BART's noise takes one document a row, with its sentences: set "
                              f"data.instances.kind to doc-sentences, got {self.data.instances.kind!r}")
        if "denoise" in self.objectives and self.data.instances.kind not in ("doc-sentences", "full-sentences"):
            raise ConfigError(f"objectives.denoise: corrupts running text: set data.instances.kind to doc-sentences "
                              f"(or full-sentences), got {self.data.instances.kind!r}")
        if "nsp" in self.objectives and not self.data.instances.nsp:
            raise ConfigError(f"objectives.nsp: next-sentence prediction needs data.instances.kind 'nsp', "
                              f"got {self.data.instances.kind!r}")
        if "sop" in self.objectives and self.data.instances.kind != "sop":
            raise ConfigError(f"objectives.sop: sentence-order prediction needs data.instances.kind 'sop', "
                              f"got {self.data.instances.kind!r}")
        self._check_elmo()
        self._check_adapt()
        spans = self.data.masking.spans
        if "span_boundary" in self.objectives and spans is None:
            raise ConfigError("objectives.span_boundary: the span boundary objective needs span masking "
                              "(data.masking.spans, e.g. {geometric_p: 0.2, max_words: 10})")
        room = self.data.instances.max_seq_length - 2  # tokens of text beside [CLS] and [SEP]
        if spans is not None and spans.max_words > room:
            raise ConfigError(f"data.masking.spans.max_words: a span of {spans.max_words} words is longer than a "
                              f"sequence (data.instances.max_seq_length {self.data.instances.max_seq_length} holds "
                              f"at most {room} tokens of text)")

    def _check_elmo(self) -> None:
        """An ELMo run (model.architecture elmo) is the bilm objective on word streams of a word vocabulary, and
        only that."""
        elmo = self.model.kind == "elmo"
        parts = {"model.architecture 'elmo'": elmo, "objectives.bilm": "bilm" in self.objectives,
                 "data.instances.kind 'word-stream'": self.data.instances.kind == "word-stream",
                 "tokenizer.kind 'word'": self.tokenizer.kind == "word"}
        if any(parts.values()) and not all(parts.values()):
            given = [name for name, on in parts.items() if on]
            missing = [name for name, on in parts.items() if not on]
            raise ConfigError(f"{given[0]}: ELMo pretraining needs {', '.join(parts)} together; missing "
                              f"{', '.join(missing)}")
        if elmo:
            others = sorted(set(self.objectives) - {"bilm"})
            if others:
                raise ConfigError(f"objectives.{others[0]}: an ELMo run trains the bilm objective only")
            if self.model.init_from is not None:
                raise ConfigError("model.init_from: ELMo runs start from a fresh model")

    def _check_adapt(self) -> None:
        """Vocabulary adaptation: extending needs a model to extend and a corpus to learn from; a new vocabulary
        means pretraining from scratch."""
        adapt = self.tokenizer.adapt
        if adapt == "extend":
            if self.model.init_from is None:
                raise ConfigError("tokenizer.adapt: extend grows the vocabulary of model.init_from's model; set "
                                  "model.init_from")
            if self.model.kind != "encoder":
                raise ConfigError("tokenizer.adapt: extend grows an encoder's vocabulary (BERT family)")
            if not self.data.corpus:
                raise ConfigError("tokenizer.adapt: extend learns the new entries from data.corpus; give it")
        if adapt == "new" and self.model.init_from is not None:
            raise ConfigError("tokenizer.adapt: new is a fresh vocabulary for a model pretrained from scratch; leave "
                              "model.init_from unset (keep or extend continue a model)")

    def _build_objectives(self) -> dict[str, Any]:
        from bertology.objectives import build_objectives

        return dict(zip(self.objectives, build_objectives(self.objectives)))

    def build_objectives(self) -> list[Any]:
        """New objective instances (``bertology.objectives``), in the order of the ``objectives`` section."""
        return list(self._build_objectives().values())

    def to_dict(self) -> dict[str, Any]:
        return to_mapping(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], source: str | None = None) -> PretrainConfig:
        try:
            return from_mapping(cls, data, "")
        except ConfigError as error:
            if source is None:
                raise
            raise ConfigError(f"{source}: {error}") from None


def read_config_file(path: str | Path) -> dict[str, Any]:
    """The raw mapping of a YAML (``.yaml``/``.yml``) or JSON (``.json``) config file: UTF-8, no key twice."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: config file not found")
    text = decode_text(path.read_bytes(), str(path))
    data = load_json(text, str(path)) if path.suffix == ".json" else load_yaml(text, str(path))
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of sections, got {type(data).__name__}")
    return data


def apply_overrides(data: dict[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """Apply ``section.key=value`` settings to a raw config mapping (values parsed as YAML: 3, 1e-4, true, [a, b])."""
    data = copy.deepcopy(data)
    for item in overrides:
        key, sep, text = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--set {item!r}: expected KEY.PATH=VALUE, e.g. optim.lr=1e-4")
        value = load_yaml(text, f"--set {item!r}", invalid_as_text=True) if text.strip() else ""
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
