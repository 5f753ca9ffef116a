"""Pretraining from a run config: tokenizer -> shards -> model config -> model (with the objectives' heads) ->
datasets -> trainer.

The model comes from the registry: ``model.architecture`` names a registered model, whose registered builder
(bertology.model.run_configs) makes its config from the preset, the section's settings and the tokenizer; the
objectives are fitted to that config (``Objective.fit_model_config``) and give their heads; the model class the
registry holds is built with them (or continued from ``model.init_from``), and the objectives attach what they
train beside it. Nothing here knows a family.

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
from bertology.data.shards import HELDOUT_DIR, TokenizedCorpus, prepare_corpus
from bertology.data.span_corruption import SpanCorruption
from bertology.data.span_masking import SpanBatches
from bertology.errors import CheckpointError, ConfigError, DataError, TokenizerError
from bertology.model.checkpoint import load_model
from bertology.model.convert import family_for_config
from bertology.model.protocol import ENCODER, capabilities
from bertology.model.registry import RunContext, model_class, model_name, registered
from bertology.model.run_configs import continued_config
from bertology.objectives.base import Objective
from bertology.tokenization import Tokenizer, load_tokenizer, train_tokenizer
from bertology.tokenization._pipeline import MODEL_TYPE_STYLE
from bertology.tokenization.framing import FRAMINGS
from bertology.training import distributed as D
from bertology.training.config import PretrainConfig, architectures
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
                   heldout: TokenizedCorpus | None, objectives: list[Objective] | None = None,
                   model_config: Any = None) -> tuple[PretrainingDataset, PretrainingDataset | None]:
    """Training instances (masked as configured, made into batches by an objective that has a `batch_maker`:
    permutation LM, causal LM, or into sources and targets by T5's span corruption or BART's noise, for a decoder
    that starts from ``model_config``'s start token: the run's model config, built when not given) and held-out
    instances (one fixed, static masking)."""
    inst = config.data.instances
    special = tokenizer.framing
    masking = config.data.masking

    # A masking-rate schedule reads the optimizer step of each micro-batch.
    clock = StepClock(config.optim.grad_accumulation, config.optim.total_steps)

    def decoder_start() -> int:
        start = (model_config or build_model_config(config, tokenizer)).decoder_start_token_id
        return special.fill_id if start is None else int(start)

    def dataset(corpus: TokenizedCorpus, masking_config: Any, dupe_factor: int,
                bucket_window: int = 0) -> PretrainingDataset:
        instance_config = dataclasses.replace(inst, dupe_factor=dupe_factor, seed=config.run.seed)
        makers = (o.batch_maker(special, config.run.seed, inst.max_seq_length) for o in objectives or ())
        make = next((maker for maker in makers if maker is not None), None)
        if make is not None:
            if inst.kind == "segment-stream":  # XLNet with memory: rows continue their documents batch after batch
                return SegmentStreams(corpus, special, inst.max_seq_length, make, config.run.seed)  # type: ignore
            return PretrainingDataset(corpus, special, instance_config, make, bucket_window)
        if config.data.span_corruption is not None:  # T5: sources and targets for the encoder-decoder
            room = inst.max_seq_length - special.overhead(False)
            maker = SpanCorruption(config.data.span_corruption, special, config.run.seed, dupe_factor, room,
                                   tokenizer.vocab_size, tokenizer.special_ids)
            pairs = Seq2SeqBatches(maker, decoder_start())
            return PretrainingDataset(corpus, special, instance_config, pairs, bucket_window, clock)
        if config.data.noise is not None:  # BART: the original text from its noised copy
            noise = BartNoise(config.data.noise, special, max_length=inst.max_seq_length)
            maker = DenoisingBatches(noise, config.run.seed, dupe_factor)
            pairs = Seq2SeqBatches(maker, decoder_start())
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


# --- build config -> build model ----------------------------------------------------------------------------------


def run_context(config: PretrainConfig, tokenizer: Tokenizer | Any) -> RunContext:
    """What the architecture's builder reads of the run: the tokenizer's vocabulary and special ids (a word
    vocabulary has only its size) and the instances' shape."""
    inst = config.data.instances
    if not isinstance(tokenizer, Tokenizer):  # ELMo's word vocabulary
        return RunContext(tokenizer.vocab_size, max_seq_length=inst.max_seq_length)
    framing = tokenizer.framing
    return RunContext(tokenizer.vocab_size, tokenizer.pad_id, framing.fill_id, framing.cls_id, framing.sep_id,
                      tokenizer.style, inst.max_seq_length, framing.overhead(False), inst.kind == "segment-stream")


def build_model_config(config: PretrainConfig, tokenizer: Tokenizer | Any, pretrained: Any = None) -> Any:
    """The model's config, built by the architecture's registered builder (bertology.model.run_configs) from
    ``model.preset``, the section's settings and the tokenizer; with ``pretrained`` (model.init_from's model), its
    config changed by the settings."""
    model = config.model
    name = model_name(pretrained) if pretrained is not None else model.kind
    if pretrained is not None and model.architecture not in (None, name):
        raise ConfigError(f"model.architecture: model.init_from {model.init_from} holds a model of the {name} "
                          f"architecture, not {model.architecture}")
    build = registered(name).run_config
    if build is None and pretrained is not None:
        return continued_config(name, pretrained.config, model.checked_settings(name))
    if build is None:
        able = [key for key, entry in architectures().items() if entry.run_config is not None]
        raise ConfigError(f"model.architecture: {name} models are not built from a run config; those that are: "
                          f"{', '.join(able)} (or continue a {name} model with model.init_from)")
    base = pretrained.config if pretrained is not None else None
    return build(model.checked_settings(name), model.preset, run_context(config, tokenizer), base)


def check_framing(family: str | None, tokenizer: Tokenizer, where: str) -> None:
    """The tokenizer frames texts as the model's family reads them."""
    style = MODEL_TYPE_STYLE.get(family or "")
    if style is not None and not FRAMINGS[tokenizer.style].frames_like(FRAMINGS[style]):
        raise TokenizerError(f"{where}: {family} models read texts framed as {style} does "
                             f"({FRAMINGS[style].describe()}), but the tokenizer is {tokenizer.style}-style "
                             f"({FRAMINGS[tokenizer.style].describe()}): set tokenizer.style: {style}, or the "
                             f"model.family that reads {tokenizer.style}-style texts")


def check_model_matches(model_config: Any, tokenizer: Tokenizer, config: PretrainConfig, where: str) -> None:
    """The tokenizer and sequence length fit the model: the same vocabulary size and padding id, segment embeddings
    and positions enough."""
    fields = {f.name for f in dataclasses.fields(model_config)}
    problems = []
    if model_config.vocab_size != tokenizer.vocab_size:
        problems.append(f"vocab_size {model_config.vocab_size} != tokenizer vocabulary {tokenizer.vocab_size}")
    if model_config.pad_token_id != tokenizer.framing.fill_id:
        problems.append(f"pad_token_id {model_config.pad_token_id} != tokenizer pad id {tokenizer.framing.fill_id} "
                        f"({tokenizer.pad_token!r})")
    if "type_vocab_size" in fields and model_config.type_vocab_size:  # 0: no segment embeddings, none read
        segments = 1 + max(piece.segment for piece in tokenizer.framing.pieces(config.data.instances.pairs))
        if model_config.type_vocab_size < segments:
            what = "pairs" if config.data.instances.pairs else "texts"
            problems.append(f"type_vocab_size {model_config.type_vocab_size} < {segments}, but {tokenizer.style}-"
                            f"style {what} use segment {segments - 1}")
    if problems:
        raise TokenizerError(f"{where}: the tokenizer does not match the model: " + "; ".join(problems))
    length = config.data.instances.max_seq_length
    if "max_position_embeddings" in fields and length > model_config.max_length:
        table = model_config.max_position_embeddings  # rows before position 0 (RoBERTa's, BART's) count in it
        raise ConfigError(f"data.instances.max_seq_length: {length} needs {length + table - model_config.max_length} "
                          f"positions, but the model has {table} (model.max_position_embeddings)")


def check_objectives_fit(kind: str, objectives: list[Objective]) -> None:
    """Each objective trains the kind of model built (``kind``: its registered name, ``bertology.model.registry``):
    an objective's ``trains`` names the models it can train (an encoder's subclass, a Longformer, is an encoder
    too)."""
    kinds = {kind, "encoder"} if ENCODER in capabilities(model_class(kind)) else {kind}
    for objective in objectives:
        if not kinds & set(objective.trains):
            raise ConfigError(f"objectives.{objective.name}: trains {' or '.join(objective.trains)} models, but the "
                              f"model is a {kind} model (model.architecture)")


def pretrained_model(config: PretrainConfig, tokenizer: Tokenizer) -> Any:
    """``model.init_from``'s model (grown to an extended vocabulary with ``tokenizer.adapt: extend``), or None."""
    if config.model.init_from is None:
        return None
    pretrained = load_model(init_directory(config) or config.model.init_from)
    if config.tokenizer.adapt == "extend":
        grow_vocabulary(config, pretrained, tokenizer)
    return pretrained


def build_model(config: PretrainConfig, tokenizer: Tokenizer | Any, objectives: list[Objective]) -> Any:
    """The run's model: its config (``build_model_config``), the objectives fitted to it (their heads' activation,
    the family's language-model head), then the model with their heads, freshly initialised (seeded by run.seed;
    on the meta device first with ``speed.meta_init``), derived by an objective (a distillation student) or
    continued from ``model.init_from`` (its weights; heads it lacks keep their initialisation); last, the modules
    the objectives build around it."""
    pretrained = pretrained_model(config, tokenizer)
    if pretrained is None and isinstance(tokenizer, Tokenizer):  # before the tokenizer's ids are taken
        check_framing(config.model.family, tokenizer, "model")
    model_config = build_model_config(config, tokenizer, pretrained)
    kind = model_name(pretrained) if pretrained is not None else config.model.kind
    check_objectives_fit(kind, objectives)
    if isinstance(tokenizer, Tokenizer):
        where = f"model.init_from {config.model.init_from}" if pretrained is not None else "model"
        # A continued encoder reads the tokenizer it was trained with, whatever its family (a Longformer converted
        # from a BERT reads BERT's texts); other continued models read texts as their family does.
        if pretrained is not None and not issubclass(model_class(kind), model_class("encoder")):
            check_framing(model_config.family, tokenizer, where)
        check_model_matches(model_config, tokenizer, config, where)
        for objective in objectives:  # a distillation teacher's tokenizer must be the run's
            objective.check_tokenizer(tokenizer, tokenizer.vocab_size, tokenizer.pad_id)
    lm = lm_head_kind(model_config)
    for objective in objectives:
        objective.fit_model_config(model_config, lm)
        objective.check_vocabulary(model_config.vocab_size)  # a sampled softmax's negatives, before any step
    heads = [spec for objective in objectives for spec in objective.heads()]
    model = derived_model(config, tokenizer, objectives, heads)
    if model is None:
        model = D.initialised_model(model_config, heads, config.run.seed, config.speed.meta_init, model_class(kind))
    if pretrained is not None:
        load_pretrained(model, pretrained)
    for objective in objectives:  # modules built around the model (ELECTRA's generator shares its embeddings)
        objective.attach(model, torch.Generator().manual_seed(config.run.seed + 1))
        if config.model.init_from is not None:  # what it saved beside that model (SpanBERT's boundary head)
            objective.load_with_model(config.model.init_from)
    return model


def lm_head_kind(model_config: Any) -> str | None:
    """The kind of language-model head of the config's family, as its transformers class has it (BART's adds
    final_logits_bias); None when the family has no registered checkpoint table or no such head."""
    try:
        head = family_for_config(model_config).heads.get("lm")
    except CheckpointError:
        return None
    return head.kind if head is not None else None


def load_pretrained(model: nn.Module, pretrained: Any) -> None:
    """``pretrained``'s weights into ``model`` (built with the settings' changes to its config): the body, and the
    heads of the same kind; a setting that changes a weight's shape is an error naming the weight."""
    body = {k: v for k, v in pretrained.state_dict().items() if not k.startswith("heads.")}
    own = model.state_dict()
    changed = sorted(k for k, v in body.items() if k in own and own[k].shape != v.shape)
    if changed:
        raise ConfigError(f"model: the settings change the shape of {changed[0]} ({tuple(body[changed[0]].shape)} "
                          f"in model.init_from's model, {tuple(own[changed[0]].shape)} now); a continued model takes "
                          f"only settings that keep its weights")
    model.load_state_dict({**own, **body})
    for name, head in pretrained.heads.items():
        if name in model.heads and type(model.heads[name]) is type(head):
            model.heads[name].load_state_dict(head.state_dict())


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
    lm = lm_head_kind(model.config)
    for objective in fresh:
        objective.fit_model_config(model.config, lm)
        objective.attach(model, torch.Generator().manual_seed(config.run.seed + 1))
    nn.ModuleDict({o.name: o for o in fresh if isinstance(o, nn.Module)}).load_state_dict(state)
    return fresh


def derived_model(config: PretrainConfig, tokenizer: Tokenizer, objectives: list[Objective],
                  heads: list[Any]) -> Any:
    """The model an objective derives from another one (a distillation student from its teacher), or None."""
    for objective in objectives:
        model = objective.initial_model(heads, torch.Generator().manual_seed(config.run.seed))
        if model is None:
            continue
        where = f"objectives.{objective.name}"
        if config.model.init_from is not None:
            raise ConfigError(f"model.init_from: {where} builds the model from its teacher; leave model.init_from "
                              "unset")
        check_model_matches(model.config, tokenizer, config, f"{where}.teacher")
        return model
    return None


def elmo_vocabulary(config: PretrainConfig, env: D.DistEnv | None = None) -> tuple[Any, list[Any], list[Any]]:
    """An ELMo run's word vocabulary (trained on the training documents into ``<output_dir>/tokenizer/words.txt``,
    or ``tokenizer.path``'s) and its training and held-out documents."""
    from bertology.data.shards import select_heldout
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

    return _on_rank0_first(env, make), train_docs, heldout_docs


def elmo_streams(config: PretrainConfig, vocabulary: Any, documents: list[Any], heldout: list[Any],
                 model_config: Any) -> tuple[Any, Any]:
    """An ELMo run's training and held-out word streams (windows of data.instances.max_seq_length words)."""
    from bertology.data.word_streams import WordStreams

    window, seed = config.data.instances.max_seq_length, config.run.seed
    width = model_config.max_characters_per_token
    train = WordStreams(documents, vocabulary, window, seed, width)
    evaluation = WordStreams(heldout, vocabulary, window, seed, width, shuffle=False) if heldout else None
    return train, evaluation


def build_elmo_run(config: PretrainConfig, objectives: list[Objective], env: D.DistEnv | None = None
                   ) -> tuple[Any, Any, Any, nn.Module]:
    """An ELMo run's word vocabulary, its training and held-out word streams and its model (``build_model``)."""
    vocabulary, documents, heldout = elmo_vocabulary(config, env)
    model = build_model(config, vocabulary, objectives)
    return (vocabulary, *elmo_streams(config, vocabulary, documents, heldout, model.config), model)


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
        if config.model.kind == "elmo":  # word streams of a word vocabulary for a biLM (instances 'word-stream')
            tokenizer, train_data, eval_data, model = build_elmo_run(config, objectives, env)
        else:
            tokenizer = build_tokenizer(config, env)
            train_corpus, heldout_corpus = build_corpus(config, tokenizer, env)
            model = build_model(config, tokenizer, objectives)
            train_data, eval_data = build_datasets(config, tokenizer, train_corpus, heldout_corpus, objectives,
                                                   model.config)
        trainer = Trainer(config, model, objectives, train_data, eval_data, tokenizer, env, hooks or ())
        if resume:
            trainer.resume()
        metrics = trainer.train()
        output_dir = Path(config.run.output_dir)
        for objective in objectives_to_save(config, trainer, objectives):  # every rank: FSDP gathers
            if env.is_main:  # what it trains beside the model (ELECTRA's generator)
                objective.save_with_model(output_dir, tokenizer)
        return PretrainResult(output_dir, output_dir / FINAL_MODEL_DIR, metrics, trainer.state.step)
    finally:
        D.shutdown()
