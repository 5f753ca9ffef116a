"""Fine-tuning on a registered task (``bertology.tasks.base.FinetuneTask``; built in: the GLUE tasks SST-2, CoLA,
MRPC, RTE, STS-B) with the shared training loop: the task's reader, heads and objectives, the dev metrics at every
evaluation, the best model kept, predictions in the task's own format scored by its official metric.

    from bertology.recipes.finetune import FinetuneConfig, finetune
    result = finetune(FinetuneConfig.from_dict({"task": {"name": "sst2", "data": "../shared/data/glue"},
                                                "model": "path/to/model", "run": {"output_dir": "runs/sst2"}}))

Outputs in ``run.output_dir``: ``metrics.jsonl`` (training loss, dev loss and the task's metrics, x100 as the
papers report them), ``model/`` (the one copy of the final model: the best one on the dev set, in the transformers
layout of the task's head class, e.g. ``*ForSequenceClassification``, with the label names in config.json;
bertology's native format when LoRA, adapters or prefixes are in it), ``best.json`` (its step and dev scores), the
dev predictions of that model in the task's format and ``dev_metrics.json`` (what ``bertology evaluate`` computes
from them), ``run_config.json`` (and ``curves.png`` with ``run.plot``), and with ``strategy.kind: lora`` also
``peft_adapter/`` (the adapter in Hugging Face peft's files).

While it runs it also keeps ``best/`` (the best model so far, with its dev predictions: each evaluation predicts
the dev set once, and the kept model's predictions are not computed again at the end) and ``checkpoints/`` (for
``--resume``). A finished run removes ``best/`` and, unless ``run.keep_checkpoint`` (``--keep-checkpoint``), its
checkpoints: the last one holds the optimizer state, twice the model's size again, and a finished fine-tuning
run has nothing left to resume. ``--resume`` on a finished run only completes that clean-up.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import json
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch

from bertology.config import from_mapping, to_mapping, validate
from bertology.errors import CheckpointError, ConfigError, DataError
from bertology.io import atomic_directory, atomic_write, check_output_file, remove_output
from bertology.model.checkpoint import Pretrained, load, write_model_files
from bertology.model.config import TransformerConfig
from bertology.model.convert import family_for_config
from bertology.model.heads import HeadSpec
from bertology.model.protocol import (BLOCKS, CHARACTERS, ENCODER, LORA, POOLER, SCALAR_MIX, Model, capabilities,
                                      model_kind, require)
from bertology.peft.common import Trainable
from bertology.recipes.pretrain import seed_everything
from bertology.tasks.base import FinetuneTask
from bertology.tasks.lookup import get_task
from bertology.tasks.user import is_task_file
from bertology.tokenization import Tokenizer
from bertology.training import distributed as D
from bertology.training.config import OptimConfig, RunConfig, SpeedConfig
from bertology.training.checkpoint import CHECKPOINTS_DIR
from bertology.training.trainer import (FINAL_MODEL_DIR, RUN_CONFIG_FILE, BatchSource, Trainer, check_output_dir,
                                        check_same_run)

BEST_DIR = "best"
BEST_FILE = "best.json"
DEV_METRICS = "dev_metrics.json"
PEFT_ADAPTER_DIR = "peft_adapter"
DEFAULT_MAX_LENGTH = 128  # for tasks that name no length of their own (`max_length` attribute: SQuAD's 384)


@dataclass
class TaskConfig:
    """The task (a registered name: sst2, cola, mrpc, rte, stsb, ..., or the path of a task file, .yaml/.yml/.json,
    describing a user's own files: ``bertology.tasks.user``) and ``data``, the folder of its files (for GLUE the
    GLUE folder holding ``SST-2/``, ``CoLA/`` ..., whose ``train.tsv`` and ``dev.tsv`` are read; not used by a task
    file, which names its own train and dev files). ``pooling`` is what a sentence task's classifier reads.
    ``epochs`` sets the length of the run; ``max_steps`` caps it; ``limit_train`` /
    ``limit_dev`` take only the first examples (quick runs)."""

    name: str = "sst2"
    data: str | None = None
    max_length: int | None = None  # tokens per example, specials included; None: the task's default
    # Sentence tasks: the classifier reads [CLS] through the family's own head ("cls": saved in the transformers
    # layout) or the mean of the real tokens' vectors ("mean": a linear layer on it, saved in the native format).
    # "max": their element-wise max; "bilstm-max": a BiLSTM over them, then the max (bertology.model.crf).
    pooling: Literal["cls", "mean", "max", "bilstm-max"] = "cls"
    # Tagging tasks: a linear layer on every token ("linear": the family's *ForTokenClassification), or a 2-layer
    # BiLSTM and a linear-chain CRF decoded by Viterbi ("bilstm-crf", bertology.model.crf; saved in the native format).
    tagger: Literal["linear", "bilstm-crf"] = "linear"
    # Sentence tasks on an encoder-decoder: true, text-to-text (the label generated as a word: T5's recipe,
    # bertology.tasks.text_to_text); false, the family's sequence classifier on the decoder (BART's and T5's
    # *ForSequenceClassification); null, the family's way (T5 text-to-text, BART the classifier).
    text_to_text: bool | None = None
    epochs: float = 3.0
    max_steps: int | None = None
    limit_train: int | None = None
    limit_dev: int | None = None
    # Retrieval-augmented generation (task rag, bertology.retrieval.rag): the query encoder's directory, the dense
    # passage index, passages per question, RAG-token or RAG-sequence, the temperature of p(z|x).
    retriever: str | None = None
    index: str | None = None
    k: int = 5
    marginalise: Literal["token", "sequence"] = "token"
    temperature: float = 1.0

    def __post_init__(self) -> None:
        validate(self, "task")
        get_task(self.name)  # a known task or a valid task file, else a ConfigError naming the known ones / the file
        if self.max_length is not None and self.max_length < 4:
            raise ConfigError(f"task.max_length: must be >= 4, got {self.max_length}")
        if not self.epochs > 0:
            raise ConfigError(f"task.epochs: must be > 0, got {self.epochs}")
        for key in ("max_steps", "limit_train", "limit_dev"):
            value = getattr(self, key)
            if value is not None and value < 1:
                raise ConfigError(f"task.{key}: must be >= 1 or null, got {value}")


@dataclass
class SelectConfig:
    """Which model is kept: the best dev ``metric`` (default: the task's first, e.g. accuracy, mcc, pearson),
    higher is better; after ``patience`` evaluations without improvement training stops (0: never early)."""

    metric: str | None = None
    patience: int = 0

    def __post_init__(self) -> None:
        validate(self, "select")
        if self.patience < 0:
            raise ConfigError(f"select.patience: must be >= 0, got {self.patience}")


@dataclass
class StrategyConfig:
    """What trains. ``full``: everything; ``frozen``: the head only (the encoder as a fixed feature extractor);
    ``lora``: low-rank updates of the ``targets`` projections (``rank``, ``alpha``, ``dropout``) plus the head;
    ``adapters``: bottleneck adapters after attention and feed-forward (``bottleneck``) plus the head; ``prefix``:
    ``prefix_length`` learned keys and values per layer plus the head; ``scalar-mix``: ELMo's recipe, a frozen
    encoder whose heads read gamma * sum_j softmax(s)_j h_j over the embedding output and every layer (a sentence
    classifier then reads the mix at [CLS] through dense-tanh-linear, or its mean with ``task.pooling: mean``); the
    same over a GPT-2 decoder's states (its classifier reads the mix at the last real token) or, for tagging, an
    encoder-decoder's encoder's (an encoder-decoder's own heads read its decoder: no mix). A
    pooler that the checkpoint lacked (and the head needs) trains too."""

    kind: Literal["full", "frozen", "lora", "adapters", "prefix", "scalar-mix"] = "full"
    rank: int = 8
    alpha: float = 16.0
    dropout: float = 0.0
    targets: list[str] = field(default_factory=lambda: ["query", "value"])
    bottleneck: int = 64
    prefix_length: int = 20

    def __post_init__(self) -> None:
        validate(self, "strategy")
        for key in ("rank", "bottleneck", "prefix_length"):
            if getattr(self, key) < 1:
                raise ConfigError(f"strategy.{key}: must be >= 1, got {getattr(self, key)}")
        if not self.alpha > 0:
            raise ConfigError(f"strategy.alpha: must be > 0, got {self.alpha}")
        if not 0 <= self.dropout < 1:
            raise ConfigError(f"strategy.dropout: must be in [0, 1), got {self.dropout}")
        known = ("query", "key", "value", "attn_out", "cross_query", "cross_key", "cross_value", "cross_out",
                 "ffn_in", "ffn_gate", "ffn_out")
        unknown = [t for t in self.targets if t not in known]
        if unknown or not self.targets:
            raise ConfigError(f"strategy.targets: expected some of {', '.join(known)}, got {self.targets}")


LM_HEAD_KINDS = ("tied_lm", "tied_lm_bias", "lm")
BLOCKLESS_STRATEGIES = ("full", "frozen", "scalar-mix")


def check_strategy(strategy: StrategyConfig, model: Model, fine_tuned: type | None = None) -> None:
    """The scalar mix of the layers is made for the models whose heads read one stack (capability SCALAR_MIX of
    `fine_tuned`, the class ``model_class`` fine-tunes, default the model's: an encoder, a decoder, an
    encoder-decoder's encoder alone for tagging), LoRA for the models that name projections it may wrap (LORA:
    encoders, GPT-2, BART, T5); the other strategies train any model. A model without transformer blocks to adapt
    (ELMo) trains fully, frozen (its top layer as features) or frozen under the scalar mix of its layers (ELMo's
    recipe)."""
    if BLOCKS not in capabilities(model) and strategy.kind not in BLOCKLESS_STRATEGIES:
        raise ConfigError(f"strategy.kind: {strategy.kind} adapts transformer blocks, which the model "
                          f"({model_kind(model)}) does not have (capability {BLOCKS!r}): use scalar-mix (ELMo's "
                          f"recipe: its frozen layers mixed), frozen or full")
    fine_tuned = fine_tuned or type(model)
    if strategy.kind == "scalar-mix":
        require(fine_tuned, SCALAR_MIX, "strategy.kind: scalar-mix (encoders, decoders and an encoder-decoder's "
                "encoder alone for tagging; use full, frozen, lora, adapters or prefix)")
    if strategy.kind == "lora":
        require(model, LORA, "strategy.kind: lora (use full, frozen, adapters or prefix)")


def apply_strategy(model: Model, strategy: StrategyConfig, fresh_pooler: bool) -> Trainable:
    """Freeze and extend ``model`` as ``strategy`` says; returns the trainable share. Under LoRA a decoder's or an
    encoder-decoder's language-model head (the checkpoint's own vocabulary projection) stays frozen, as peft's
    CAUSAL_LM and SEQ_2_SEQ_LM adapters leave it; a task's new heads train."""
    from bertology.peft import apply_adapters, apply_lora, apply_prefix, freeze_base, trainable_parameters

    also = ("encoder.pooler.",) if fresh_pooler else ()
    if strategy.kind == "lora":
        share = apply_lora(model, strategy.rank, strategy.alpha, strategy.dropout, tuple(strategy.targets),
                           also_train=also)
        if ENCODER not in capabilities(model):
            for spec in model.head_specs:
                if spec.kind in LM_HEAD_KINDS:
                    model.heads[spec.name].requires_grad_(False)
            share = trainable_parameters(model)
        return share
    if strategy.kind == "adapters":
        return apply_adapters(model, strategy.bottleneck, also_train=also)
    if strategy.kind == "prefix":
        return apply_prefix(model, strategy.prefix_length, also_train=also)
    if strategy.kind in ("frozen", "scalar-mix"):  # the mix is an extension: it trains with the heads
        freeze_base(model, train_heads=True, also_train=also)
    return trainable_parameters(model)


@dataclass
class FinetuneOptimConfig(OptimConfig):
    """The optimizer section with fine-tuning's usual defaults (BERT's recipe: a small learning rate, 10 % warm-up)."""

    lr: float = 5e-5
    warmup_ratio: float = 0.1


@dataclass
class FinetuneRunConfig(RunConfig):
    """The run section with fine-tuning's defaults; ``keep_checkpoint``: keep the last checkpoint (the model with
    the optimizer state) when the run ends, instead of dropping it (``model/`` is the run's result)."""

    output_dir: str = "runs/finetune"
    log_every: int = 20
    keep_checkpoint: bool = False


@dataclass
class FinetuneConfig:
    """A whole fine-tuning run: ``model`` (a model directory ``bertology.load`` reads), ``task``, ``select`` and
    the ``optim``, ``run`` and ``speed`` sections of every training run (``optim.total_steps`` is set from
    ``task.epochs`` and ``task.max_steps``; ``run.eval_every`` 0 means once an epoch)."""

    model: str = ""
    task: TaskConfig = field(default_factory=TaskConfig)
    strategy: StrategyConfig = field(default_factory=StrategyConfig)
    select: SelectConfig = field(default_factory=SelectConfig)
    optim: FinetuneOptimConfig = field(default_factory=FinetuneOptimConfig)
    run: FinetuneRunConfig = field(default_factory=FinetuneRunConfig)
    speed: SpeedConfig = field(default_factory=SpeedConfig)

    def __post_init__(self) -> None:
        validate(self)
        if not self.model.strip():
            raise ConfigError("model: the model directory to fine-tune is required")
        if self.speed.meta_init:
            raise ConfigError("speed.meta_init: fine-tuning starts from a model directory's weights; meta-device "
                              "construction is for pretraining a fresh model")
        if self.speed.fsdp:
            raise ConfigError("speed.fsdp: fine-tuning keeps whole models (dev selection scores and writes the model "
                              "during the run); it runs on one process or with DDP over several")
        metrics = get_task(self.task.name).metrics
        if self.select.metric is not None and self.select.metric not in metrics:
            raise ConfigError(f"select.metric: {self.task.name} reports {', '.join(metrics)}; got "
                              f"{self.select.metric!r}")

    @property
    def metric(self) -> str:
        return self.select.metric or get_task(self.task.name).metrics[0]

    def to_dict(self) -> dict[str, Any]:
        return to_mapping(self)

    @classmethod
    def from_dict(cls, data: Any) -> FinetuneConfig:
        return from_mapping(cls, data, "")


@dataclass
class FinetuneResult:
    output_dir: Path
    model_dir: Path
    best: dict[str, Any]
    dev_metrics: dict[str, Any]
    steps: int
    trainable: Trainable


def _data(config: FinetuneConfig) -> str:
    if config.task.data is None:
        if is_task_file(config.task.name):
            return ""  # a task file names its own train and dev files
        raise ConfigError(f"task.data: the folder with {config.task.name}'s files is required")
    return config.task.data


SENTENCE_HEAD_KINDS = ("pooled", "first_token", "last_token", "eos_token", "summary_last")


def task_heads(task: FinetuneTask, config: TransformerConfig, pooling: str = "cls", scalar_mix: bool = False,
               tagger: str = "linear") -> list[HeadSpec]:
    """The task's heads, with a sentence classifier reading the mean or the max of the tokens (``pooling="mean"``,
    ``"max"``), or, under a scalar mix, the mix at [CLS] (the pooler reads the last layer, not the mix:
    dense-tanh-linear takes its place); with ``tagger="bilstm-crf"`` the token classifier is a BiLSTM-CRF."""
    from bertology.tasks.tagging import TOKEN_CLASSIFIER

    heads = task.heads(config)
    if tagger == "bilstm-crf":
        if not any(h.name == TOKEN_CLASSIFIER for h in heads):
            raise ConfigError(f"task.tagger: 'bilstm-crf' applies to tagging tasks; {task.name} has no token "
                              f"classifier (heads: {', '.join(h.name for h in heads)})")
        heads = [HeadSpec(h.name, "bilstm_crf", h.num_labels) if h.name == TOKEN_CLASSIFIER else h for h in heads]
    if pooling in ("mean", "max", "bilstm-max"):
        if not any(h.kind in (*SENTENCE_HEAD_KINDS, "mean_pooled") for h in heads):
            raise ConfigError(f"task.pooling: {pooling!r} applies to sentence tasks; {task.name} has no sentence "
                              f"classifier (heads: {', '.join(h.kind for h in heads)})")
        kind = {"mean": "mean_pooled", "max": "max_pooled", "bilstm-max": "bilstm_max"}[pooling]
        return [HeadSpec(h.name, kind, h.num_labels) if h.kind in (*SENTENCE_HEAD_KINDS, "mean_pooled") else h
                for h in heads]
    if scalar_mix:
        return [HeadSpec(h.name, "first_token", h.num_labels, "tanh") if h.kind == "pooled" else h for h in heads]
    return heads


def for_model(task: FinetuneTask, model: Model, text_to_text: bool | None = None) -> FinetuneTask:
    """The task as it runs on ``model``: its ``for_model(model)`` when it has one (GLUE on T5, or on an
    encoder-decoder without a classifier of its own, is text-to-text; ``text_to_text``, ``task.text_to_text``,
    chooses for the tasks that offer both), else the task itself."""
    adapt = getattr(task, "for_model", None)
    if text_to_text is None:
        return adapt(model) if adapt is not None else task
    if adapt is None or "text_to_text" not in inspect.signature(adapt).parameters:
        raise ConfigError(f"task.text_to_text: {task.name} has one form only; the setting applies to the GLUE "
                          "tasks (sst2, cola, mrpc, rte, stsb)")
    return adapt(model, text_to_text=text_to_text)


def model_class(pretrained: Model, task: FinetuneTask) -> type:
    """The class fine-tuned: the checkpoint's own, except that a task labelling the input's own tokens
    (``labels_input_tokens``: tagging) fine-tunes an encoder-decoder's encoder alone."""
    if getattr(task, "labels_input_tokens", False) and pretrained.encoder_alone is not None:
        return pretrained.encoder_alone
    return type(pretrained)


def kept_head(pretrained: Model, spec: HeadSpec) -> HeadSpec | None:
    """The checkpoint's head that the task's head ``spec`` is: the same spec, or (a language-model head) the same
    name in the form the family stores it in (T5 v1.1's untied lm_head where the task asks for the tied one)."""
    have = {h.name: h for h in pretrained.head_specs}.get(spec.name)
    if have is None or have == spec:
        return have
    try:
        stored = family_for_config(pretrained.config).heads.get(spec.name)
    except CheckpointError:
        return None
    if stored is not None and stored.kind == spec.kind and stored.variant(have.kind) is not None \
            and have.num_labels == spec.num_labels:
        return have
    return None


def build_model(pretrained: Pretrained, task: FinetuneTask, seed: int, pooling: str = "cls",
                scalar_mix: bool = False, tagger: str = "linear") -> tuple[Model, bool]:
    """The pretrained model (an encoder, a decoder or an encoder-decoder: ``model_class``) with the task's fresh
    heads (and a fresh scalar mix), and whether a pooler was added (freshly initialised: a head of the family needs
    one and the checkpoint has none). A head the checkpoint has as the task wants it (a cloze task's masked-LM head,
    a text-to-text task's language-model head) keeps its weights."""
    config = pretrained.model.config
    characters = CHARACTERS in capabilities(pretrained.model)
    if characters:  # a task needs no word softmax: the fine-tuned ELMo model drops it
        config = dataclasses.replace(config, vocab_size=0, extra=dict(config.extra))
    heads = task_heads(task, config, pooling, scalar_mix, tagger)
    heads = [kept_head(pretrained.model, spec) or spec for spec in heads]
    fresh_pooler = any(h.kind == "pooled" for h in heads) and POOLER not in capabilities(pretrained.model)
    if fresh_pooler:
        config.pooler = True
    model = model_class(pretrained.model, task)(config, heads)
    extend = getattr(task, "extend_model", None)  # a task whose classifier is a model extension (span typing)
    if extend is not None:
        extend(model)
    if scalar_mix:
        model.add_extension("mix", "scalar_mix")
    model.init_weights(torch.Generator().manual_seed(seed))
    fresh = ("heads.", *(f"{where}." for where in model.extensions))  # the task's heads, the mix, span typing
    dropped = ("heads.", "softmax.") if characters else ("heads.",)
    body = {name: value for name, value in pretrained.model.state_dict().items() if not name.startswith(dropped)}
    wanted = {name for name in model.state_dict() if not name.startswith(fresh)}
    missing = sorted(wanted - set(body))
    unexpected = sorted(set(body) - wanted)
    part = type(model) is not type(pretrained.model)  # the encoder of an encoder-decoder: its decoder is left
    if any(not name.startswith("encoder.pooler.") for name in missing) \
            or any(not (part and name.startswith("decoder.")) for name in unexpected):
        raise ConfigError(f"model: the checkpoint's weights do not fit a {type(model).__name__}: missing {missing}, "
                          f"unexpected {unexpected}")
    model.load_state_dict({name: body[name] for name in wanted & set(body)}, strict=False)
    for spec in heads:
        if spec in pretrained.model.head_specs:
            model.heads[spec.name].load_state_dict(pretrained.model.heads[spec.name].state_dict())
    # The names a pipeline reports (SST-2's negative/positive, CoNLL's tags): a task's own, else its file labels.
    names = getattr(task, "config_label_names", task.label_names)()
    if names is not None:
        model.config.extra["id2label"] = {str(i): name for i, name in enumerate(names)}
        model.config.extra["label2id"] = {name: i for i, name in enumerate(names)}
    return model, fresh_pooler


class DevSelection:
    """An evaluator: the task's dev metrics of the current model, the best model kept in ``best/``, early
    stopping after ``select.patience`` evaluations without improvement."""

    def __init__(self, config: FinetuneConfig, task: FinetuneTask, dev: BatchSource, dev_examples: Sequence[Any],
                 tokenizer: Tokenizer) -> None:
        self.config, self.task, self.dev, self.dev_examples, self.tokenizer = config, task, dev, dev_examples, tokenizer
        self.directory = Path(config.run.output_dir) / BEST_DIR
        self.best = self._read_best()
        self.since_best = 0

    def _read_best(self) -> dict[str, Any] | None:
        path = self.directory / BEST_FILE
        if not path.is_file():
            return None
        try:
            return json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as error:
            raise DataError(f"{path}: invalid JSON: {error}") from None
        except RecursionError:
            raise DataError(f"{path}: invalid JSON: arrays or objects nested too deeply") from None

    def predict(self, model: Model, progress: bool = False) -> list[Any]:
        """The model's predictions of the dev set (with a progress bar when ``progress``)."""
        batch_size = max(32, self.config.optim.batch_size)
        with progress_bar(self.dev, batch_size, progress, "dev predictions"):
            return self.task.predict(model, self.dev, self.dev_examples, batch_size)

    def __call__(self, trainer: Trainer) -> dict[str, float]:
        predictions = self.predict(trainer.model, self.config.run.progress and trainer.env.is_main)
        scores = self.task.scores(predictions, self.dev_examples)
        value = scores[self.config.metric]
        improved = self.best is None or (math.isfinite(value) and value > self.best["value"])
        if improved:
            self.best = {"step": trainer.state.step, "metric": self.config.metric, "value": value, "scores": scores}
            self.since_best = 0
            if trainer.env.is_main:
                with atomic_directory(self.directory) as tmp:
                    write_model_files(trainer.model, tmp)
                    self.tokenizer.save(tmp)
                    save_with_model = getattr(self.task, "save_with_model", None)  # rag: the query encoder
                    if save_with_model is not None:
                        save_with_model(tmp)
                    self.task.write(tmp / self.task.predictions_file, predictions, self.dev_examples)
                    (tmp / BEST_FILE).write_text(json.dumps(self.best, indent=2) + "\n", encoding="utf-8")
        else:
            self.since_best += 1
            patience = self.config.select.patience
            if patience and self.since_best >= patience:
                trainer.request_stop(f"no better dev {self.config.metric} in {patience} evaluations "
                                     f"(best {self.best['value']:.2f} at step {self.best['step']})")
        return {f"dev_{name}": score for name, score in scores.items()}


@contextlib.contextmanager
def progress_bar(source: BatchSource, batch_size: int, enabled: bool, description: str) -> Iterator[None]:
    """While the block runs, a progress bar over the batches a task's ``predict`` draws from ``source`` (its
    ``batches`` method is wrapped on the instance and restored afterwards)."""
    if not enabled:
        yield
        return
    from tqdm import tqdm

    bar = tqdm(total=source.num_batches(0, batch_size, drop_last=False), desc=description, unit="batch",
               leave=False, dynamic_ncols=True)
    draw = source.batches

    def batches(*args: Any, **kwargs: Any) -> Iterator[Any]:
        for batch in draw(*args, **kwargs):
            yield batch
            bar.update(1)

    source.batches = batches  # type: ignore[method-assign]
    try:
        yield
    finally:
        del source.batches
        bar.close()


class WatchedSource:
    """A ``BatchSource`` that shows a progress bar whenever its batches are read (the dev loss of an evaluation)."""

    def __init__(self, source: BatchSource, description: str) -> None:
        self.source, self.description = source, description

    def num_batches(self, epoch: int, batch_size: int, rank: int = 0, world_size: int = 1,
                    drop_last: bool = True) -> int:
        return self.source.num_batches(epoch, batch_size, rank, world_size, drop_last)

    def batches(self, epoch: int, batch_size: int, start_batch: int = 0, rank: int = 0, world_size: int = 1,
                drop_last: bool = True) -> Iterator[Any]:
        from tqdm import tqdm

        total = self.num_batches(epoch, batch_size, rank, world_size, drop_last) - start_batch
        with tqdm(total=total, desc=self.description, unit="batch", leave=False, dynamic_ncols=True) as bar:
            for batch in self.source.batches(epoch, batch_size, start_batch, rank, world_size, drop_last):
                yield batch
                bar.update(1)


def task_tokenizer(pretrained: Pretrained, where: str) -> Any:
    """What the task's encoder reads text with: the model's tokenizer, or for a model that reads words as characters
    (ELMo) a ``bertology.tasks.words.WordTokenizer`` (with the model's word vocabulary, when it has one, for its
    lower-casing; a ConfigError naming ``where`` when a subword model has no tokenizer files."""
    if CHARACTERS in capabilities(pretrained.model):
        from bertology.tasks.words import WordTokenizer

        return WordTokenizer(pretrained.model.config.max_characters_per_token, pretrained.tokenizer)
    if pretrained.tokenizer is None:
        raise ConfigError(f"{where} has no tokenizer files")
    return pretrained.tokenizer


def model_inputs(encoded: BatchSource, tokenizer: Any) -> BatchSource:
    """The encoded examples as the model reads them: for a ``WordTokenizer``'s, batches of characters."""
    from bertology.tasks.words import CharacterBatches, WordTokenizer

    return CharacterBatches(encoded, tokenizer.types) if isinstance(tokenizer, WordTokenizer) else encoded


def predict_file(model_dir: str | Path, task_name: str, input_path: str | Path, output_path: str | Path,
                 max_length: int | None = None, batch_size: int = 64, dtype: str = "float32",
                 device: str | torch.device | None = None) -> int:
    """Predict every example of a task file (in the layout the task reads; for ``conll2003`` also a file of words
    only, one a line, a blank line after each sentence) with a fine-tuned model; writes the predictions in the
    task's own format (what ``bertology evaluate`` reads; ``bertology predict --help`` lists them) and returns
    their number. ``dtype="int8"`` runs the encoder layers in int8 (``bertology.model.quantize``, CPU only),
    "float16" and "bfloat16" under autocast on a GPU; ``device`` (None: the CPU; "auto", "cuda", ...) is where the
    model runs (``bertology.device``)."""
    from bertology.device import placement
    from bertology.model.quantize import with_dtype

    task = get_task(task_name)
    where = placement(device, dtype, int8=True)  # before the model is loaded
    check_output_file(output_path)  # and the output: not a directory, not below a file
    pretrained = where.move(with_dtype(load(model_dir), dtype))
    tokenizer = task_tokenizer(pretrained, str(model_dir))
    task = for_model(task, pretrained.model)
    wanted = task.heads(pretrained.model.config)
    have = {spec.name: spec for spec in pretrained.model.head_specs}
    for spec in wanted:
        if spec.name not in have:
            raise ConfigError(f"{model_dir}: not fine-tuned for {task.name}: it has no {spec.name!r} head (heads: "
                              f"{', '.join(have) or 'none'})")
        if have[spec.name].num_labels != spec.num_labels:
            raise ConfigError(f"{model_dir}: its {spec.name} has {have[spec.name].num_labels} outputs; "
                              f"{task.name} needs {spec.num_labels}")
    read_input = getattr(task, "read_input", None)  # a tagger also reads words without tags
    examples = read_input(Path(input_path)) if read_input is not None else task.read(Path(input_path))
    length = max_length or getattr(task, "max_length", DEFAULT_MAX_LENGTH)
    encoded = model_inputs(task.encode(tokenizer, examples, min(length, pretrained.model.config.max_length),
                                       train=False), tokenizer)
    with where.autocast():
        predictions = task.predict(pretrained.model, encoded, examples, batch_size)
    task.write(Path(output_path), predictions, examples)
    return len(examples)


def finetune(config: FinetuneConfig, resume: bool = False, overwrite: bool = False) -> FinetuneResult:
    """Fine-tune ``config.model`` on ``config.task`` (see the module docstring for what is written)."""
    out = Path(config.run.output_dir)
    env = D.init_distributed(config.speed)
    try:
        if overwrite and not resume:
            if env.is_main:
                check_output_dir(out, resume=False, overwrite=True, outputs=(BEST_DIR, BEST_FILE))
                remove_output(out / BEST_DIR, ignore_errors=True)
                (out / BEST_FILE).unlink(missing_ok=True)
            D.barrier(env)
        else:
            check_output_dir(out, resume=resume, overwrite=False, outputs=(BEST_DIR, BEST_FILE))
        if resume and (out / BEST_FILE).is_file():
            return _finished(config, out, env)
        torch.set_num_threads(config.speed.threads or D.default_threads(env))
        seed_everything(config.run.seed, env.rank)
        task = get_task(config.task.name)
        configure = getattr(task, "configure", None)  # a task with options of its own (rag: retriever, index, k)
        if configure is not None:
            task = configure(config.task)
        data = _data(config)
        train_examples = task.read(task.path(data, "train"), config.task.limit_train)
        dev_path = task.path(data, "dev")
        dev_examples = task.read(dev_path, config.task.limit_dev)
        pretrained = load(config.model)
        tokenizer = task_tokenizer(pretrained, f"model: {config.model}")
        task = for_model(task, pretrained.model, config.task.text_to_text)
        wanted = config.task.max_length or getattr(task, "max_length", DEFAULT_MAX_LENGTH)
        max_length = min(wanted, pretrained.model.config.max_length)
        train = model_inputs(task.encode(tokenizer, train_examples, max_length, train=True, seed=config.run.seed),
                             tokenizer)
        dev = model_inputs(task.encode(tokenizer, dev_examples, max_length, train=False), tokenizer)
        per_epoch = train.num_batches(0, config.optim.batch_size, env.rank, env.world_size)
        if per_epoch == 0:
            raise ConfigError(f"optim.batch_size: {config.optim.batch_size} x {env.world_size} is more than the "
                              f"{len(train_examples)} training examples")
        steps = max(1, math.ceil(config.task.epochs * per_epoch / config.optim.grad_accumulation))
        config.optim.total_steps = min(steps, config.task.max_steps or steps)
        if config.run.eval_every == 0:
            config.run.eval_every = max(1, per_epoch // config.optim.grad_accumulation)
        check_strategy(config.strategy, pretrained.model, model_class(pretrained.model, task))
        model, fresh_pooler = build_model(pretrained, task, config.run.seed, config.task.pooling,
                                          config.strategy.kind == "scalar-mix", config.task.tagger)
        trainable = apply_strategy(model, config.strategy, fresh_pooler)
        if trainable.trainable == 0:
            raise ConfigError(f"strategy.kind: {config.strategy.kind} leaves nothing to train: the task's heads "
                              f"({', '.join(h.name for h in model.head_specs)}) have no weights of their own (a "
                              "language-model head tied to the embeddings); use full, adapters or prefix")
        selection = DevSelection(config, task, dev, dev_examples, tokenizer)
        watched = WatchedSource(dev, "dev loss") if config.run.progress and env.is_main else dev
        trainer = Trainer(config, model, task.objectives(model.head_specs), train, watched, tokenizer, env,
                          evaluators=[selection])
        if resume:
            trainer.resume()
        trainer.train()
        if selection.best is None:  # best/ is gone (removed by hand): score the final model once
            selection(trainer)
        assert selection.best is not None
        model_dir = out / FINAL_MODEL_DIR
        if env.is_main:
            best = load(out / BEST_DIR)  # the final model is the best one
            model.load_state_dict(best.model.state_dict())
            Pretrained(model, tokenizer).save(model_dir)
            keep_with_model = getattr(task, "keep_with_model", None)  # rag: the best model's query encoder
            if keep_with_model is not None:
                keep_with_model(out / BEST_DIR, model_dir)
            if config.strategy.kind == "lora":  # the adapter as Hugging Face peft reads it, beside our own format
                from bertology.peft import peft_architecture, save_lora_peft

                if peft_architecture(model) is not None:  # transformers has a class for the model (not BART's
                    save_lora_peft(model, out / PEFT_ADAPTER_DIR, base_model_name_or_path=config.model)  # encoder)
            kept = out / BEST_DIR / task.predictions_file
            if kept.is_file():  # predicted when the best model was evaluated
                with atomic_write(out / task.predictions_file, "wb") as handle:
                    handle.write(kept.read_bytes())
            else:  # a best/ written by an earlier version, without its predictions
                task.write(out / task.predictions_file, selection.predict(model, config.run.progress), dev_examples)
            # The official scoring of the written file; on a dev subset, the same metrics computed in memory.
            dev_metrics = task.evaluate(out / task.predictions_file, dev_path) if config.task.limit_dev is None \
                else selection.best["scores"]
            with atomic_write(out / DEV_METRICS, "w", encoding="utf-8") as handle:
                json.dump(dev_metrics, handle, indent=2)
                handle.write("\n")
            record = {**selection.best, "final_step": trainer.state.step, "trainable": list(trainable)}
            with atomic_write(out / BEST_FILE, "w", encoding="utf-8") as handle:  # from here on the run is finished
                json.dump(record, handle, indent=2)
                handle.write("\n")
            drop_working_copies(out, config.run.keep_checkpoint)
        D.barrier(env)
        dev_metrics = json.loads((out / DEV_METRICS).read_text(encoding="utf-8"))
        return FinetuneResult(out, model_dir, selection.best, dev_metrics, trainer.state.step, trainable)
    finally:
        D.shutdown()


def drop_working_copies(out: Path, keep_checkpoint: bool) -> None:
    """A finished run's clean-up: ``best/`` (``model/`` is its copy now) and, unless ``keep_checkpoint``, the
    checkpoints."""
    remove_output(out / BEST_DIR, ignore_errors=True)
    if not keep_checkpoint:
        remove_output(out / CHECKPOINTS_DIR, ignore_errors=True)


def _finished(config: FinetuneConfig, out: Path, env: D.DistEnv) -> FinetuneResult:
    """``--resume`` on a finished run (its ``best.json`` written): nothing is trained or predicted again; the
    clean-up a kill may have interrupted is completed, and the run's result is read back from its files."""
    model_dir = out / FINAL_MODEL_DIR
    missing = [name for name in (FINAL_MODEL_DIR, DEV_METRICS) if not (out / name).exists()]
    if missing:
        raise DataError(f"{out}: a finished run ({BEST_FILE}) without {' or '.join(missing)}; its result is gone: "
                        "run it again with --overwrite")
    path = out / BEST_FILE
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
        steps, trainable = record.pop("final_step"), Trainable(*record.pop("trainable"))
        path = out / DEV_METRICS
        dev_metrics = json.loads(path.read_text(encoding="utf-8"))
        path = out / RUN_CONFIG_FILE
        saved = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None
    except (json.JSONDecodeError, UnicodeDecodeError, AttributeError, KeyError, TypeError) as error:
        raise DataError(f"{path}: not the file a finished run writes ({type(error).__name__}: {error})") from None
    if saved is not None:
        check_same_run(out / RUN_CONFIG_FILE, saved, config.to_dict())
    if env.is_main:
        drop_working_copies(out, config.run.keep_checkpoint)
    D.barrier(env)
    return FinetuneResult(out, model_dir, record, dev_metrics, steps, trainable)
