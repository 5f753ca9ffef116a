"""Pretraining from a run config: tokenizer -> shards -> datasets -> model -> trainer.

    from bertology.recipes.pretrain import pretrain
    from bertology.training import load_config
    pretrain(load_config("configs/bert-tiny-quickstart.yaml", ["optim.total_steps=200"]))

Under torchrun, rank 0 trains the tokenizer and writes the shards while the others wait, then every rank reads them.
"""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass
from itertools import chain
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from bertology.data.bart_noise import BartNoise, DenoisingBatches
from bertology.data.corpus import CorpusSource
from bertology.data.dataset import PretrainingDataset, StepClock
from bertology.data.masking import Masker
from bertology.data.segment_streams import SegmentStreams
from bertology.data.seq2seq import Seq2SeqBatches
from bertology.data.span_corruption import SpanCorruption
from bertology.data.shards import HELDOUT_DIR, TokenizedCorpus, prepare_corpus
from bertology.data.span_masking import SpanBatches
from bertology.errors import ConfigError, DataError, TokenizerError
from bertology.model.checkpoint import FAMILY_FIXED, load_model
from bertology.model.config import PRESET_SIZES, TransformerConfig, preset
from bertology.model.convert import family_for_config
from bertology.model.encoder import EncoderModel
from bertology.model.protocol import ENCODER, PERMUTATION_LM, capabilities, model_kind
from bertology.model.registry import model_class, model_name
from bertology.model.xlnet import XLNetConfig, XLNetModel
from bertology.objectives.base import Objective
from bertology.objectives.plm import PermutationLM
from bertology.tokenization import Tokenizer, load_tokenizer, train_tokenizer
from bertology.tokenization._pipeline import MODEL_TYPE_STYLE
from bertology.tokenization.framing import FRAMINGS
from bertology.training import distributed as D
from bertology.training.config import PretrainConfig
from bertology.training.trainer import FINAL_MODEL_DIR, Hook, Trainer, check_output_dir

TOKENIZER_DIR = "tokenizer"
SHARDS_DIR = "shards"
MIXTURE_DIR = "mixture"


@dataclass
class PretrainResult:
    output_dir: Path
    model_dir: Path
    metrics: dict[str, float]
    steps: int


def seed_everything(seed: int, rank: int = 0) -> None:
    """Seed Python, NumPy and torch; ranks get different streams (dropout differs per rank, as it should)."""
    value = seed + 1_000_003 * rank
    random.seed(value)
    np.random.seed(value % 2**32)
    torch.manual_seed(value)


def _on_rank0_first(env: D.DistEnv, make: Any) -> Any:
    """Run ``make`` on rank 0 while the others wait, then on the others (which then only read its result)."""
    result = make() if env.is_main else None
    D.barrier(env)
    if not env.is_main:
        result = make()
    return result


def corpus_source(config: PretrainConfig, env: D.DistEnv | None = None) -> CorpusSource | None:
    """The training text: ``data.corpus``, or with ``data.multilingual`` the sampled mixture of its languages
    (drawn once into ``<output_dir>/mixture``, so that the tokenizer and the shards read the same text); None when
    neither is given."""
    data = config.data
    if data.multilingual is None:
        return CorpusSource(data.corpus, data.format, data.text_field, data.encoding,
                            data.task) if data.corpus else None
    from bertology.data.multilingual import MIXTURE_FILE, check_mixture, sample_mixture, write_mixture

    directory = Path(config.run.output_dir) / MIXTURE_DIR
    multilingual = data.multilingual

    def make() -> Path:
        if (directory / MIXTURE_FILE).is_file():
            check_mixture(directory, multilingual, config.run.seed)
        else:
            write_mixture(sample_mixture(multilingual, config.run.seed), directory)
        return directory / MIXTURE_FILE

    return CorpusSource(str(_on_rank0_first(env or D.DistEnv(), make)), "bert")


def init_directory(config: PretrainConfig) -> Path | None:
    """``model.init_from``'s model directory (a path, or an installed model's name), checked before any work;
    None without it."""
    if config.model.init_from is None:
        return None
    from bertology.errors import CheckpointError
    from bertology.model.local import resolve_model_path

    try:
        directory = resolve_model_path(config.model.init_from)
    except CheckpointError as error:
        raise ConfigError(f"model.init_from: {error}") from None
    if not directory.is_dir():
        what = "is not a directory" if directory.exists() else "does not exist"
        raise ConfigError(f"model.init_from: {config.model.init_from} {what} (a model directory to continue "
                          "pretraining from)")
    return directory


def base_tokenizer(config: PretrainConfig) -> Tokenizer:
    """The tokenizer of the model continued from: ``tokenizer.path``, else the one in ``model.init_from``."""
    if config.tokenizer.path is not None:
        return load_tokenizer(config.tokenizer.path)
    directory = init_directory(config)
    assert directory is not None
    try:
        return load_tokenizer(directory)
    except TokenizerError as error:
        raise TokenizerError(f"model.init_from: {error}; the run reads the model's tokenizer from there, or give "
                             "tokenizer.path") from None


def build_tokenizer(config: PretrainConfig, env: D.DistEnv | None = None) -> Tokenizer:
    """The configured tokenizer directory; with ``model.init_from`` and no path, that model's; with ``tokenizer.adapt:
    extend``, that one extended by the corpus's frequent entries; else one trained on the corpus. Made ones are kept
    at ``<output_dir>/tokenizer`` (and read from there by a resumed run)."""
    env = env or D.DistEnv()
    tok = config.tokenizer
    if tok.adapt == "keep" and (tok.path is not None or config.model.init_from is not None):
        return base_tokenizer(config)
    directory = Path(config.run.output_dir) / TOKENIZER_DIR

    def make() -> Tokenizer:
        if (directory / "tokenizer.json").is_file():
            return load_tokenizer(directory)
        source = corpus_source(config, env)
        if source is None:
            raise ConfigError("data.corpus: no corpus files given (needed to train the tokenizer)")
        if tok.adapt == "extend":
            extended = extended_tokenizer(config, source)
            extended.save(directory)
            return load_tokenizer(directory)
        documents = source.documents()
        tokenizer = train_tokenizer(chain.from_iterable(documents), tok.kind, tok.vocab_size, style=tok.style,
                                    lowercase=tok.lowercase, min_frequency=tok.min_frequency,
                                    show_progress=False, sentinels=tok.sentinels)
        tokenizer.save(directory)
        # The saved copy, as a resumed run (and every other rank) reads it: one tokenizer for every run of the
        # directory, whose fingerprint the shards record.
        return load_tokenizer(directory)

    return _on_rank0_first(env, make)


def extended_tokenizer(config: PretrainConfig, source: CorpusSource) -> Tokenizer:
    """The base tokenizer (``base_tokenizer``) with the ``tokenizer.extend_size`` most frequent entries of a
    ``tokenizer.kind`` tokenizer of ``tokenizer.vocab_size`` trained on the corpus (its lower-casing the base's
    unless ``tokenizer.lowercase`` says otherwise; bertology.tokenization.extend)."""
    from bertology.tokenization.extend import check_extension, domain_entries, extend_tokenizer, lowercases

    tok = config.tokenizer
    assert tok.extend_size is not None
    old = base_tokenizer(config)
    where = f"tokenizer {old.source or tok.path}"
    check_extension(old, tok.extend_size, where)
    if old.kind != tok.kind:
        raise ConfigError(f"tokenizer.kind: {tok.kind} entries cannot extend {where}, a {old.kind} tokenizer; set "
                          f"tokenizer.kind: {old.kind}")
    lowercase = lowercases(old) if tok.lowercase is None else tok.lowercase
    style = old.style if old.kind == "bpe" and old.style in ("roberta", "gpt2", "bart") else None
    domain = train_tokenizer(chain.from_iterable(source.documents()), tok.kind, tok.vocab_size, style=style,
                             lowercase=lowercase, min_frequency=tok.min_frequency, show_progress=False)
    entries = domain_entries(old, domain, source.documents(), tok.extend_size)
    if not entries:
        raise DataError(f"tokenizer.adapt: the corpus's {tok.kind} vocabulary of {tok.vocab_size} has no entry "
                        f"that {where} lacks; nothing to extend it with (use adapt keep)")
    return extend_tokenizer(old, entries, domain)


def build_corpus(config: PretrainConfig, tokenizer: Tokenizer, env: D.DistEnv | None = None
                 ) -> tuple[TokenizedCorpus, TokenizedCorpus | None]:
    """The training shards and the held-out shards (if any): prepared once, checked against the tokenizer."""
    env = env or D.DistEnv()
    data = config.data
    directory = Path(data.shards) if data.shards is not None else Path(config.run.output_dir) / SHARDS_DIR

    def make() -> TokenizedCorpus:
        if (directory / "metadata.json").is_file():
            return TokenizedCorpus(directory, tokenizer)
        source = corpus_source(config, env)
        if source is None:
            raise ConfigError(f"data.corpus: no corpus files given and no shards at {directory}")
        return prepare_corpus(source, tokenizer, directory, shard_size_tokens=data.shard_size_tokens,
                              heldout_documents=data.heldout_documents, seed=config.run.seed,
                              show_progress=config.run.progress and env.is_main)

    train = _on_rank0_first(env, make)
    heldout = TokenizedCorpus(directory / HELDOUT_DIR, tokenizer) if (directory / HELDOUT_DIR).is_dir() else None
    return train, heldout


def build_datasets(config: PretrainConfig, tokenizer: Tokenizer, train: TokenizedCorpus,
                   heldout: TokenizedCorpus | None, objectives: list[Objective] | None = None
                   ) -> tuple[PretrainingDataset, PretrainingDataset | None]:
    """Training instances (masked as configured, made into batches by an objective that has a `batch_maker`:
    permutation LM, causal LM, or into sources and targets by T5's span corruption) and held-out instances (one
    fixed, static masking)."""
    inst = config.data.instances
    special = tokenizer.framing
    masking = config.data.masking
    makers = [objective for objective in objectives or () if hasattr(objective, "batch_maker")]

    # A masking-rate schedule reads the optimizer step of each micro-batch.
    clock = StepClock(config.optim.grad_accumulation, config.optim.total_steps)

    def dataset(corpus: TokenizedCorpus, masking_config: Any, dupe_factor: int,
                bucket_window: int = 0) -> PretrainingDataset:
        instance_config = dataclasses.replace(inst, dupe_factor=dupe_factor, seed=config.run.seed)
        if makers:
            make = makers[0].batch_maker(special, config.run.seed, inst.max_seq_length)  # type: ignore[attr-defined]
            if inst.kind == "segment-stream":  # XLNet with memory: rows continue their documents batch after batch
                return SegmentStreams(corpus, special, inst.max_seq_length, make, config.run.seed)  # type: ignore
            return PretrainingDataset(corpus, special, instance_config, make, bucket_window)
        if config.data.span_corruption is not None:  # T5: sources and targets for the encoder-decoder
            room = inst.max_seq_length - special.overhead(False)
            maker = SpanCorruption(config.data.span_corruption, special, config.run.seed, dupe_factor, room,
                                   tokenizer.vocab_size, tokenizer.special_ids)
            pairs = Seq2SeqBatches(maker, decoder_start_token(config, tokenizer))
            return PretrainingDataset(corpus, special, instance_config, pairs, bucket_window, clock)
        if config.data.noise is not None:  # BART: the original text from its noised copy
            noise = BartNoise(config.data.noise, special, max_length=inst.max_seq_length)
            maker = DenoisingBatches(noise, config.run.seed, dupe_factor)
            pairs = Seq2SeqBatches(maker, decoder_start_token(config, tokenizer))
            return PretrainingDataset(corpus, special, instance_config, pairs, bucket_window, clock)
        counts = corpus.unigram_counts if masking_config.replacement == "unigram" else None
        masker = Masker(masking_config, special, tokenizer.vocab_size, tokenizer.special_ids, counts)
        make_batch: Any = masker
        if masking_config.spans is not None:  # SpanBERT's span masking
            make_batch = SpanBatches(masker, config.run.seed, dupe_factor, clock)
        return PretrainingDataset(corpus, special, instance_config, make_batch, bucket_window, clock)

    train_data = dataset(train, masking, inst.dupe_factor, config.data.bucket_window)
    eval_data = None
    if heldout is not None:  # one fixed masking, at the schedule's final rate
        eval_data = dataset(heldout, dataclasses.replace(masking.final(), dynamic=False), 1)
    return train_data, eval_data


def decoder_start_token(config: PretrainConfig, tokenizer: Tokenizer) -> int:
    """The token an encoder-decoder's decoder starts from: the one ``model.init_from``'s config names, else the
    family's (``DECODER_START``: T5 the padding token, BART ``</s>``)."""
    if config.model.init_from is not None:
        start = getattr(load_model(config.model.init_from).config, "decoder_start_token_id", None)
        if start is not None:
            return int(start)
    role = DECODER_START.get(config.model.family or "", "pad")
    return getattr(tokenizer.framing, f"{role}_id") if role != "pad" else tokenizer.framing.fill_id


def build_model_config(config: PretrainConfig, tokenizer: Tokenizer) -> TransformerConfig:
    """The config of the model ``model.family`` builds: an encoder's or a decoder's (``transformer_config``)."""
    return encoder_config(config, tokenizer) if config.model.kind == "encoder" else transformer_config(config,
                                                                                                        tokenizer)


# The special token an encoder-decoder's decoder starts from, by family (T5: the padding token; BART: </s>).
DECODER_START = {"t5": "pad", "bart": "sep"}


def transformer_config(config: PretrainConfig, tokenizer: Tokenizer) -> TransformerConfig:
    """A decoder's or an encoder-decoder's config: the family's fixed facts, the preset's size (hidden / 64 heads,
    a 4 x hidden feed-forward, as for the encoders), then the overrides; the vocabulary and the special ids (padding,
    begin, end, the decoder's start) come from the tokenizer."""
    model = config.model
    family = model.family
    assert family is not None
    values: dict[str, Any] = {"family": family, **FAMILY_FIXED[family]}
    if model.preset is not None:
        layers, hidden = PRESET_SIZES[model.preset]
        values.update(num_layers=layers, hidden_size=hidden, num_heads=max(1, hidden // 64),
                      intermediate_size=4 * hidden)
    framing = tokenizer.framing
    values.update(vocab_size=tokenizer.vocab_size, pad_token_id=framing.fill_id, bos_token_id=framing.cls_id,
                  eos_token_id=framing.sep_id)
    if model.kind == "seq2seq":
        values["decoder_start_token_id"] = decoder_start_token(config, tokenizer)
    given = model.settings
    values.update(given)
    if family == "t5":  # d_kv and the tied head's output scale follow the width unless given; T5Config's numbers
        derived = {"attention_head_size": values["hidden_size"] // values["num_heads"],
                   "logit_scale": values["hidden_size"] ** -0.5, "num_decoder_layers": values["num_layers"],
                   "classifier_dropout": 0.0}
        values.update({key: value for key, value in derived.items() if key not in given})
    if model.kind == "seq2seq" and values.get("num_decoder_layers") is None:  # config.json states both depths
        values["num_decoder_layers"] = values["num_layers"]
    for key, actual in (("vocab_size", tokenizer.vocab_size), ("pad_token_id", framing.fill_id)):
        if values[key] != actual:
            raise TokenizerError(f"model.{key} is {values[key]} but the tokenizer's is {actual}: the tokenizer does "
                                 f"not match the model (leave model.{key} unset to take the tokenizer's)")
    try:
        return TransformerConfig.decoder(**values)
    except ConfigError as error:
        raise ConfigError(f"model: {error}") from None


def encoder_config(config: PretrainConfig, tokenizer: Tokenizer) -> TransformerConfig:
    """The model's config from the preset and overrides; the vocabulary and padding id come from the tokenizer."""
    model = config.model
    overrides = dict(model.overrides)
    family = model.family or ("bert" if tokenizer.style == "bert" else "roberta")
    values: dict[str, Any] = {"family": family, **FAMILY_FIXED[family]}
    if tokenizer.style == "roberta":
        values.update(type_vocab_size=1, layer_norm_eps=1e-5)
    values.update(vocab_size=tokenizer.vocab_size, pad_token_id=tokenizer.pad_id)
    values.update(overrides)
    for key, actual in (("vocab_size", tokenizer.vocab_size), ("pad_token_id", tokenizer.pad_id)):
        if values[key] != actual:
            raise TokenizerError(f"model.{key} is {values[key]} but the tokenizer's is {actual}: the tokenizer does "
                                 f"not match the model (leave model.{key} unset to take the tokenizer's)")
    if values.get("positions_after_padding") and "max_position_embeddings" not in overrides:
        values["max_position_embeddings"] = 512 + values["pad_token_id"] + 1
    try:
        return preset(model.preset, **values) if model.preset is not None else TransformerConfig(**values)
    except ConfigError as error:
        raise ConfigError(f"model: {error}") from None


def check_model_matches(model_config: TransformerConfig, tokenizer: Tokenizer,
                        config: PretrainConfig, where: str) -> None:
    """The tokenizer and sequence length fit the model: same vocabulary size and padding id, positions enough."""
    if config.model.kind != "encoder":
        check_transformer_matches(model_config, tokenizer, config, where)
        return
    problems = []
    if model_config.vocab_size != tokenizer.vocab_size:
        problems.append(f"vocab_size {model_config.vocab_size} != tokenizer vocabulary {tokenizer.vocab_size}")
    if model_config.pad_token_id != tokenizer.pad_id:
        problems.append(f"pad_token_id {model_config.pad_token_id} != tokenizer pad id {tokenizer.pad_id} "
                        f"({tokenizer.pad_token!r})")
    segments = 1 + max(piece.segment for piece in tokenizer.framing.pieces(config.data.instances.pairs))
    if model_config.type_vocab_size < segments:
        what = "pairs" if config.data.instances.pairs else "texts"
        problems.append(f"type_vocab_size {model_config.type_vocab_size} < {segments}, but {tokenizer.style}-style "
                        f"{what} use segment {segments - 1}")
    if problems:
        raise TokenizerError(f"{where}: the tokenizer does not match the model: " + "; ".join(problems))
    length = config.data.instances.max_seq_length
    offset = model_config.first_position
    if length > model_config.max_length:
        raise ConfigError(f"data.instances.max_seq_length: {length} needs {length + offset} positions, but the "
                          f"model has {model_config.max_position_embeddings} (model.max_position_embeddings)")


def check_transformer_matches(model_config: TransformerConfig, tokenizer: Tokenizer, config: PretrainConfig,
                              where: str) -> None:
    """A decoder's tokenizer frames texts as its family's do, its vocabulary and padding id are the tokenizer's, and
    its positions cover a row."""
    style = MODEL_TYPE_STYLE.get(model_config.family)
    if style is not None and not FRAMINGS[tokenizer.style].frames_like(FRAMINGS[style]):
        raise TokenizerError(f"{where}: {model_config.family} models read texts framed as {style} does "
                             f"({FRAMINGS[style].describe()}), but the tokenizer is {tokenizer.style}-style "
                             f"({FRAMINGS[tokenizer.style].describe()}): set tokenizer.style: {style}")
    problems = []
    if model_config.vocab_size != tokenizer.vocab_size:
        problems.append(f"vocab_size {model_config.vocab_size} != tokenizer vocabulary {tokenizer.vocab_size}")
    if model_config.pad_token_id != tokenizer.framing.fill_id:
        problems.append(f"pad_token_id {model_config.pad_token_id} != tokenizer pad id {tokenizer.framing.fill_id}")
    if problems:
        raise TokenizerError(f"{where}: the tokenizer does not match the model: " + "; ".join(problems))
    length = config.data.instances.max_seq_length
    if length > model_config.max_length:
        raise ConfigError(f"data.instances.max_seq_length: {length} tokens need {length} positions, but the model has "
                          f"{model_config.max_length} (model.max_position_embeddings)")


def check_objectives_fit(kind: str, objectives: list[Objective]) -> None:
    """Each objective trains the kind of model built (``kind``: its registered name, ``bertology.model.registry``):
    an objective's ``trains`` names the models it can train (the encoder when it does not say; an encoder's
    subclass, a Longformer, is an encoder too)."""
    kinds = {kind, "encoder"} if ENCODER in capabilities(model_class(kind)) else {kind}
    for objective in objectives:
        trains = getattr(objective, "trains", ("encoder",))
        if not kinds & set(trains):
            raise ConfigError(f"objectives.{objective.name}: trains {' or '.join(trains)} models, but model.family "
                              f"builds a {kind} model")


# The model section's keys an XLNet takes (the shape, activation, norm, dropout and initialisation).
XLNET_KEYS = ("vocab_size", "pad_token_id", "hidden_size", "num_layers", "num_heads", "intermediate_size",
              "hidden_act", "layer_norm_eps", "hidden_dropout", "initializer_range")


def xlnet_model(config: PretrainConfig, tokenizer: Tokenizer, objectives: list[Objective]) -> XLNetModel:
    """The XLNet an xlnet-style tokenizer or the permutation-LM objective asks for: its shape from model.preset and
    the model section (seeded by run.seed), or ``model.init_from``; trained by plm alone."""
    framing = FRAMINGS["xlnet"]
    if tokenizer.style != "xlnet":
        raise TokenizerError(f"objectives.plm: permutation LM trains an XLNet, which reads texts framed as xlnet does "
                             f"({framing.describe()}), but the tokenizer is {tokenizer.style}-style "
                             "(tokenizer.style: xlnet, tokenizer.kind: unigram)")
    model = config.model
    family = model.family
    if family is not None:
        raise ConfigError(f"model.family: {family!r} models read texts framed as {FRAMINGS['bert'].describe()} (or "
                          f"roberta's), but the tokenizer frames them as xlnet does ({framing.describe()}): leave "
                          f"model.family unset to pretrain an XLNet, or use a {family}-style tokenizer")
    others = [getattr(o, "name", "?") for o in objectives if not isinstance(o, PermutationLM)]
    if others or not objectives:
        raise ConfigError(f"objectives: an XLNet (the tokenizer is xlnet-style) pretrains with plm alone, got "
                          f"{', '.join(others) or 'none'}")
    heads = [spec for objective in objectives for spec in objective.heads()]
    unused = sorted(set(model.overrides) - set(XLNET_KEYS))
    if unused:
        raise ConfigError(f"model.{unused[0]}: XLNet models have no such setting (relative positions, no "
                          f"pooler); they take {', '.join(XLNET_KEYS)}")
    if model.init_from is not None:
        pretrained = load_model(model.init_from)
        if PERMUTATION_LM not in capabilities(pretrained):
            raise ConfigError(f"model.init_from: {model.init_from} holds a model ({model_kind(pretrained)}) that is "
                              f"not an XLNet (capability {PERMUTATION_LM!r})")
        try:
            xlnet_config = dataclasses.replace(pretrained.config, **model.xlnet)
        except ConfigError as error:
            raise ConfigError(f"model.{error}") from None
    else:
        shape = preset(model.preset) if model.preset is not None else TransformerConfig()
        values = {key: getattr(shape, key) for key in XLNET_KEYS}
        values.update(vocab_size=tokenizer.vocab_size, pad_token_id=tokenizer.pad_id)
        if config.data.instances.kind == "segment-stream":  # the memory: the previous segments' text
            values.update(reuse_len=config.data.instances.max_seq_length - tokenizer.framing.overhead(False))
        values.update({**model.overrides, **model.xlnet})
        try:
            xlnet_config = XLNetConfig(**values)
        except ConfigError as error:
            raise ConfigError(f"model.{error}") from None
    check_memory(config, xlnet_config)
    for key, actual in (("vocab_size", tokenizer.vocab_size), ("pad_token_id", tokenizer.pad_id)):
        if getattr(xlnet_config, key) != actual:
            raise TokenizerError(f"model.{key} is {getattr(xlnet_config, key)} but the tokenizer's is {actual}: the "
                                 "tokenizer does not match the model")
    built = XLNetModel(xlnet_config, heads)
    built.init_weights(torch.Generator().manual_seed(config.run.seed))
    if model.init_from is not None:
        built.load_state_dict(pretrained.state_dict(), strict=False)  # the heads it lacks keep their initialisation
    return built


def check_memory(config: PretrainConfig, xlnet: XLNetConfig) -> None:
    """On segment streams the memory carries over: mem_len at least 1 (a bounded memory), reuse_len at most a
    segment's length."""
    if config.data.instances.kind != "segment-stream":
        return
    if not xlnet.mem_len:
        raise ConfigError(f"model.mem_len: segment streams carry the memory from batch to batch; it needs a length "
                          f">= 1 (the positions kept), got {xlnet.mem_len!r}")
    length = config.data.instances.max_seq_length
    if xlnet.reuse_len is not None and xlnet.reuse_len > length:
        raise ConfigError(f"model.reuse_len: {xlnet.reuse_len} is longer than a segment "
                          f"(data.instances.max_seq_length {length}); it is how many of a segment's first positions "
                          f"become memory")


def build_model(config: PretrainConfig, tokenizer: Tokenizer, objectives: list[Objective]) -> Any:
    """A freshly initialised model (seeded by run.seed; on the meta device first with ``speed.meta_init``) or, with
    ``model.init_from``, a pretrained one. An xlnet-style tokenizer or the plm objective builds an XLNet."""
    if tokenizer.style == "xlnet" or any(isinstance(o, PermutationLM) for o in objectives):
        return xlnet_model(config, tokenizer, objectives)
    if config.model.xlnet:
        raise ConfigError(f"model.{sorted(config.model.xlnet)[0]}: a field of XLNet models (an xlnet-style "
                          f"tokenizer), not of {config.model.family or 'bert'} models")
    if config.model.init_from is not None:
        source = config.model.init_from
        pretrained = load_model(init_directory(config) or source)
        if config.tokenizer.adapt == "extend":
            grow_vocabulary(config, pretrained, tokenizer)
        model_config = pretrained.config
        check_model_matches(model_config, tokenizer, config, f"model.init_from {source}")
    else:
        model_config = build_model_config(config, tokenizer)
        check_model_matches(model_config, tokenizer, config, "model")
    for objective in objectives:  # heads whose activation follows the model's (BERT's MLM transform)
        if getattr(objective, "activation", "") is None:
            objective.activation = model_config.hidden_act  # type: ignore[attr-defined]
        # A language-model head of the kind the family's transformers class has (BART's adds final_logits_bias).
        lm = family_for_config(model_config).heads.get("lm") if hasattr(objective, "lm_kind") else None
        if lm is not None:
            objective.lm_kind = lm.kind  # type: ignore[attr-defined]
    heads = [spec for objective in objectives for spec in objective.heads()]
    derived = _model_from_objectives(config, tokenizer, objectives, heads)
    kind = model_name(pretrained) if config.model.init_from is not None else config.model.kind
    check_objectives_fit(kind, objectives)
    cls = model_class(kind)
    if derived is not None:
        model = derived
    elif config.model.init_from is not None:
        model = D.initialised_model(model_config, heads, config.run.seed, config.speed.meta_init, cls)
        # The body comes from the checkpoint; heads it lacks start from the initialisation above.
        body = {k: v for k, v in pretrained.state_dict().items() if not k.startswith("heads.")}
        model.load_state_dict({**model.state_dict(), **body})
        for name, head in pretrained.heads.items():
            if name in model.heads and type(model.heads[name]) is type(head):
                model.heads[name].load_state_dict(head.state_dict())
    else:
        model = D.initialised_model(model_config, heads, config.run.seed, config.speed.meta_init, cls)
    for objective in objectives:  # modules built around the model (ELECTRA's generator shares its embeddings)
        attach = getattr(objective, "attach", None)
        if attach is not None:
            attach(model, torch.Generator().manual_seed(config.run.seed + 1))
        # What the objective saved beside the model it continues from (SpanBERT's boundary head), if anything.
        load_beside = getattr(objective, "load_with_model", None)
        if load_beside is not None and config.model.init_from is not None:
            load_beside(config.model.init_from)
    return model


def grow_vocabulary(config: PretrainConfig, pretrained: Any, tokenizer: Tokenizer) -> None:
    """``pretrained`` (model.init_from's model, which reads the base tokenizer) grown to the extended ``tokenizer``:
    each new id's embedding and masked-LM bias the mean of those of the pieces the base tokenizer splits it into."""
    from bertology.model.vocabulary import extend_vocabulary
    from bertology.tokenization.extend import old_pieces

    old = base_tokenizer(config)
    check_model_matches(pretrained.config, old, config, f"model.init_from {config.model.init_from}")
    added = range(old.vocab_size, tokenizer.vocab_size)
    for index in range(old.vocab_size):  # the extended tokenizer keeps every id of the base one
        if tokenizer.id_to_token(index) != old.id_to_token(index):
            raise TokenizerError(f"{tokenizer.source}: id {index} is {tokenizer.id_to_token(index)!r}, but "
                                 f"{old.source}'s is {old.id_to_token(index)!r}: not an extension of the model's "
                                 f"tokenizer (remove {tokenizer.source} to extend again)")
    extend_vocabulary(pretrained, [old_pieces(old, str(tokenizer.id_to_token(i))) for i in added])


def objectives_to_save(config: PretrainConfig, trainer: Trainer, objectives: list[Objective]) -> list[Objective]:
    """The objectives whose ``save_with_model`` writes what they trained. Under FSDP their modules hold shards, so
    (every rank taking part in the gathering) rank 0 gets fresh instances built around the gathered model and given
    the gathered weights, and the other ranks none; without FSDP the trained objectives themselves."""
    if not trainer.fsdp or not any(isinstance(o, nn.Module) for o in objectives):
        return objectives
    model, state = trainer.gathered("objectives' modules")
    if model is None or state is None:
        return []
    fresh = config.build_objectives()
    for objective in fresh:
        if getattr(objective, "activation", "") is None:
            objective.activation = model.config.hidden_act  # type: ignore[attr-defined]
        attach = getattr(objective, "attach", None)
        if attach is not None:
            attach(model, torch.Generator().manual_seed(config.run.seed + 1))
    nn.ModuleDict({o.name: o for o in fresh if isinstance(o, nn.Module)}).load_state_dict(state)
    return fresh


def _model_from_objectives(config: PretrainConfig, tokenizer: Tokenizer, objectives: list[Objective],
                           heads: list[Any]) -> EncoderModel | None:
    """The model an objective derives from another one (a distillation student from its teacher), or None. Such an
    objective also checks that the run's tokenizer is its teacher's (``check_tokenizer``)."""
    for objective in objectives:
        check = getattr(objective, "check_tokenizer", None)
        if check is not None:
            check(tokenizer, tokenizer.vocab_size, tokenizer.pad_id)
        derive = getattr(objective, "initial_model", None)
        model = derive(heads, torch.Generator().manual_seed(config.run.seed)) if derive is not None else None
        if model is None:
            continue
        where = f"objectives.{getattr(objective, 'name', '?')}"
        if config.model.init_from is not None:
            raise ConfigError(f"model.init_from: {where} builds the model from its teacher; leave model.init_from "
                              "unset")
        check_model_matches(model.config, tokenizer, config, f"{where}.teacher")
        return model
    return None


def build_elmo_run(config: PretrainConfig, objectives: list[Objective], env: D.DistEnv | None = None
                   ) -> tuple[Any, Any, Any, nn.Module]:
    """An ELMo run's word vocabulary (trained on the training documents into ``<output_dir>/tokenizer/words.txt``,
    or ``tokenizer.path``'s), its training and held-out word streams and its fresh model (seeded by run.seed; built
    without drawing from torch's default generator, on the meta device first with ``speed.meta_init``)."""
    from bertology.data.shards import select_heldout
    from bertology.data.word_streams import WordStreams
    from bertology.model.elmo import ElmoModel
    from bertology.tokenization.words import WORDS_FILE, WordVocabulary

    env = env or D.DistEnv()
    source = corpus_source(config, env)
    if source is None:
        raise ConfigError("data.corpus: no corpus files given")
    documents = list(source.documents())
    heldout = select_heldout(len(documents), config.data.heldout_documents, config.run.seed)
    train_docs = [d for d, held in zip(documents, heldout) if not held]
    heldout_docs = [d for d, held in zip(documents, heldout) if held]
    tok = config.tokenizer
    directory = Path(tok.path) if tok.path is not None else Path(config.run.output_dir) / TOKENIZER_DIR

    def make() -> WordVocabulary:
        if tok.path is not None or (directory / WORDS_FILE).is_file():
            return WordVocabulary.load(directory)
        vocabulary = WordVocabulary.build((s for d in train_docs for s in d), tok.vocab_size, tok.min_frequency,
                                          bool(tok.lowercase))
        vocabulary.save(directory)
        return vocabulary

    vocabulary = _on_rank0_first(env, make)
    model_config = config.model.elmo_config(vocabulary.vocab_size)
    for objective in objectives:  # what depends on the vocabulary (a sampled softmax's negatives), before any step
        check = getattr(objective, "check_vocabulary", None)
        if check is not None:
            check(model_config.vocab_size)
    window, seed = config.data.instances.max_seq_length, config.run.seed
    width = model_config.max_characters_per_token
    train = WordStreams(train_docs, vocabulary, window, seed, width)
    evaluation = WordStreams(heldout_docs, vocabulary, window, seed, width, shuffle=False) if heldout_docs else None
    heads = [spec for objective in objectives for spec in objective.heads()]
    if config.speed.meta_init:  # as distributed.initialised_model: no default initialisation, no default generator
        with torch.device("meta"):
            model = ElmoModel(model_config, heads)
        model.to_empty(device="cpu")
    else:
        with torch.random.fork_rng(devices=[]):
            model = ElmoModel(model_config, heads)
    model.init_weights(torch.Generator().manual_seed(seed))
    return vocabulary, train, evaluation, model


def pretrain(config: PretrainConfig, resume: bool = False, plot: bool | None = None,
             hooks: list[Hook] | None = None, overwrite: bool = False) -> PretrainResult:
    """Run a whole pretraining from ``config``. ``resume``: continue from the latest checkpoint, if any;
    ``overwrite``: replace an earlier run's outputs in ``run.output_dir`` (refused otherwise)."""
    if plot is not None:
        config.run.plot = plot
    env = D.init_distributed(config.speed)
    try:
        # The output directory is checked before any work, so a mistake costs nothing.
        if overwrite and not resume:
            if env.is_main:
                check_output_dir(config.run.output_dir, resume=False, overwrite=True)
            D.barrier(env)
        else:
            check_output_dir(config.run.output_dir, resume=resume, overwrite=False)
        init_directory(config)  # a missing model directory costs nothing either
        torch.set_num_threads(config.speed.threads or D.default_threads(env))
        seed_everything(config.run.seed, env.rank)
        objectives = config.build_objectives()
        if config.model.elmo is not None:  # word streams of a word vocabulary for a biLM (instances 'word-stream')
            tokenizer, train_data, eval_data, model = build_elmo_run(config, objectives, env)
        else:
            tokenizer = build_tokenizer(config, env)
            train_corpus, heldout_corpus = build_corpus(config, tokenizer, env)
            train_data, eval_data = build_datasets(config, tokenizer, train_corpus, heldout_corpus, objectives)
            model = build_model(config, tokenizer, objectives)
        trainer = Trainer(config, model, objectives, train_data, eval_data, tokenizer, env, hooks or ())
        if resume:
            trainer.resume()
        metrics = trainer.train()
        output_dir = Path(config.run.output_dir)
        for objective in objectives_to_save(config, trainer, objectives):
            save = getattr(objective, "save_with_model", None)  # what it trains beside the model (ELECTRA's generator)
            if save is not None and env.is_main:
                save(output_dir, tokenizer)
        return PretrainResult(output_dir, output_dir / FINAL_MODEL_DIR, metrics, trainer.state.step)
    finally:
        D.shutdown()
