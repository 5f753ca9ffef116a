"""The run config's model section resolved through the registry: each architecture's registered builder
(bertology.model.run_configs) makes its config from the preset, the settings and the run's tokenizer."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from bertology.errors import ConfigError, TokenizerError
from bertology.model.registry import RunContext, registered
from bertology.training.config import ModelConfig, PretrainConfig, architectures

SRC = Path(__file__).resolve().parents[2] / "src" / "bertology"

# A BERT-style tokenizer of 120 entries, [PAD] 0, [CLS] 2, [SEP] 3.
BERT_RUN = RunContext(vocab_size=120, pad_id=0, fill_id=0, cls_id=2, sep_id=3, style="bert", max_seq_length=32,
                      text_overhead=2)


def build(name, settings=None, preset="tiny", run=BERT_RUN, base=None):
    return registered(name).run_config(settings or {}, preset, run, base)


def test_every_buildable_architecture_registers_its_builder():
    buildable = {name for name, entry in architectures().items() if entry.run_config is not None}
    assert buildable == {"encoder", "decoder", "seq2seq", "xlnet", "elmo"}
    for name in buildable:
        config = build(name, {"family": {"decoder": "gpt2", "seq2seq": "t5"}[name]}
                       if name in ("decoder", "seq2seq") else {})
        assert type(config) is registered(name).config_class  # the class the registry holds, nothing imported


def test_an_encoder_is_the_preset_the_family_and_the_tokenizer():
    bert = build("encoder")
    assert (bert.family, bert.num_layers, bert.hidden_size, bert.num_heads, bert.intermediate_size) == (
        "bert", 2, 128, 2, 512)
    assert (bert.vocab_size, bert.pad_token_id, bert.type_vocab_size, bert.layer_norm_eps) == (120, 0, 2, 1e-12)
    # RoBERTa's run defaults (one segment, fairseq's epsilon) and positions after the padding id; given settings win.
    roberta = build("encoder", {"family": "roberta"}, run=dataclasses.replace(BERT_RUN, pad_id=1, fill_id=1))
    assert (roberta.type_vocab_size, roberta.layer_norm_eps, roberta.positions_after_padding) == (1, 1e-5, True)
    assert roberta.max_position_embeddings == 512 + 1 + 1
    mine = build("encoder", {"family": "roberta", "type_vocab_size": 2, "max_position_embeddings": 40},
                 run=dataclasses.replace(BERT_RUN, pad_id=1, fill_id=1))
    assert (mine.type_vocab_size, mine.max_position_embeddings, mine.layer_norm_eps) == (2, 40, 1e-5)
    albert = build("encoder", {"family": "albert", "embedding_size": 16}, preset=None)
    assert (albert.family, albert.embedding_size, albert.hidden_size) == ("albert", 16, 768)  # the class's sizes


def test_t5_and_bart_take_their_families_run_defaults():
    t5_run = RunContext(vocab_size=200, pad_id=0, fill_id=0, cls_id=None, sep_id=1, style="t5", max_seq_length=32)
    t5 = build("seq2seq", {"family": "t5", "hidden_size": 96, "num_heads": 4}, preset="mini", run=t5_run)
    assert (t5.attention_head_size, t5.logit_scale, t5.num_layers, t5.num_decoder_layers) == (24, 96 ** -0.5, 4, 4)
    assert (t5.decoder_start_token_id, t5.pad_token_id, t5.eos_token_id, t5.positions) == (0, 0, 1, "relative")
    given = build("seq2seq", {"family": "t5", "attention_head_size": 8, "num_decoder_layers": 1}, run=t5_run)
    assert (given.attention_head_size, given.num_decoder_layers) == (8, 1)
    bart_run = RunContext(vocab_size=200, pad_id=1, fill_id=1, cls_id=0, sep_id=2, style="bart", max_seq_length=32)
    bart = build("seq2seq", {"family": "bart"}, run=bart_run)
    assert (bart.decoder_start_token_id, bart.bos_token_id, bart.eos_token_id, bart.num_decoder_layers) == (2, 0, 2, 2)
    gpt2 = build("decoder", {"family": "gpt2"}, run=bart_run)
    assert (gpt2.family, gpt2.decoder_start_token_id, gpt2.pad_token_id) == ("gpt2", None, 1)


def test_xlnet_takes_its_memory_from_segment_streams():
    run = RunContext(vocab_size=120, pad_id=5, fill_id=5, cls_id=3, sep_id=4, style="xlnet", max_seq_length=16,
                     text_overhead=2, segment_stream=True)
    xlnet = build("xlnet", {"mem_len": 20}, run=run)
    assert (xlnet.reuse_len, xlnet.mem_len, xlnet.hidden_size, xlnet.pad_token_id) == (14, 20, 128, 5)
    with pytest.raises(ConfigError, match="^model.mem_len: segment streams carry the memory"):
        build("xlnet", {"mem_len": 0}, run=run)
    with pytest.raises(ConfigError, match=r"^model.reuse_len: 17 is longer than a segment"):
        build("xlnet", {"reuse_len": 17}, run=run)
    assert build("xlnet", run=dataclasses.replace(run, segment_stream=False)).reuse_len is None


def test_elmo_sizes_and_vocabulary():
    elmo = build("elmo", {"cell_size": 64}, run=RunContext(vocab_size=30))
    assert (elmo.vocab_size, elmo.cell_size, elmo.projection_dim) == (30, 64, 64)  # tiny_config's projection
    released = build("elmo", preset=None, run=RunContext(vocab_size=30))
    assert (released.cell_size, released.projection_dim) == (4096, 512)
    with pytest.raises(ConfigError, match=r"^model.vocab_size: the vocabulary size is the word vocabulary's"):
        build("elmo", {"vocab_size": 30}, run=RunContext(vocab_size=30))
    with pytest.raises(ConfigError, match="^model.init_from: ELMo runs start from a fresh model"):
        build("elmo", run=RunContext(vocab_size=30), base=elmo)


def test_the_tokenizers_ids_must_match_what_is_given():
    with pytest.raises(TokenizerError, match=r"^model.vocab_size is 99 but the tokenizer's is 120: .*leave "
                                             r"model.vocab_size unset"):
        build("encoder", {"vocab_size": 99})
    with pytest.raises(TokenizerError, match=r"^model.pad_token_id is 4 but the tokenizer's is 0"):
        build("decoder", {"family": "gpt2", "pad_token_id": 4})
    with pytest.raises(ConfigError, match=r"^model: unknown activation 'nope'"):
        build("encoder", {"hidden_act": "nope"})


def test_a_continued_model_takes_the_settings_as_changes_to_its_config():
    base = build("encoder", {"family": "electra"})
    changed = build("encoder", {"hidden_dropout": 0.0}, run=dataclasses.replace(BERT_RUN, vocab_size=7), base=base)
    assert changed.hidden_dropout == 0.0 and changed.vocab_size == 120 and changed.family == "electra"
    with pytest.raises(ConfigError, match=r"^model.family: model.init_from's model is of the family electra, not bert"):
        build("encoder", {"family": "bert"}, base=base)


def test_the_recipe_refuses_a_tokenizer_the_family_does_not_read(tmp_path, one_thread):
    """No family is inferred from the tokenizer's style: a RoBERTa-style tokenizer with the encoder's default
    family (bert) is an error naming what to set."""
    from bertology.recipes.pretrain import build_model
    from bertology.tokenization import train_tokenizer

    texts = [f"the {word} sat on the mat and the dog ran" for word in ("cat", "bird", "fish", "cow")] * 5
    tokenizer = train_tokenizer(iter(texts), "bpe", 200, show_progress=False)
    assert tokenizer.style == "roberta"
    config = PretrainConfig.from_dict({"data": {"instances": {"kind": "full-sentences", "max_seq_length": 32}},
                                       "run": {"output_dir": str(tmp_path / "run")}})
    with pytest.raises(TokenizerError, match=r"^model: bert models read texts framed as bert does .*, but the "
                                             r"tokenizer is roberta-style .*: set tokenizer.style: bert, or the "
                                             r"model.family that reads roberta-style texts"):
        build_model(config, tokenizer, config.build_objectives())
    config.model.settings["family"] = "roberta"
    model = build_model(config, tokenizer, config.build_objectives())
    assert model.config.family == "roberta" and model.config.type_vocab_size == 1
    assert model.config.pad_token_id == tokenizer.pad_id and model.config.vocab_size == tokenizer.vocab_size


def test_a_setting_that_changes_a_continued_models_weights_is_refused(one_thread):
    import torch

    from bertology.model import EncoderModel, HeadSpec
    from bertology.recipes.pretrain import load_pretrained

    torch.manual_seed(0)
    base = build("encoder")
    pretrained = EncoderModel(base, (HeadSpec("mlm", "masked_lm"),))
    wider = EncoderModel(dataclasses.replace(base, intermediate_size=64), (HeadSpec("mlm", "masked_lm"),))
    with pytest.raises(ConfigError, match=r"^model: the settings change the shape of encoder\.layers\.0\.ffn_in"):
        load_pretrained(wider, pretrained)
    same = EncoderModel(dataclasses.replace(base, hidden_dropout=0.0), (HeadSpec("mlm", "masked_lm"),))
    load_pretrained(same, pretrained)
    assert all(torch.equal(a, b) for a, b in zip(same.state_dict().values(), pretrained.state_dict().values()))


def test_objectives_declare_their_hooks_in_one_base_class(one_thread):
    import torch

    from bertology.model import EncoderModel, HeadSpec
    from bertology.objectives import OBJECTIVES, MaskedLM, Objective, TrainingLoss

    assert all(issubclass(cls, Objective) for cls in OBJECTIVES.values())
    trains = {name: cls.trains for name, cls in OBJECTIVES.items()}
    assert trains["plm"] == ("xlnet",) and trains["bilm"] == ("elmo",) and trains["clm"] == ("decoder",)
    assert trains["denoise"] == ("seq2seq",) and trains["mlm"] == ("encoder",)
    mlm = MaskedLM()
    config = build("encoder", {"hidden_act": "relu"})
    mlm.fit_model_config(config, None)
    assert mlm.activation == "relu" and mlm.heads()[0].activation == "relu"
    assert mlm.batch_maker(None, 0, 8) is None and mlm.initial_model(()) is None and mlm.terms() == (mlm,)
    assert mlm.load_with_model("nowhere") is False and mlm.save_with_model("nowhere", None) is None

    class Stray:  # the objective protocol's methods, but not the base class
        name, weight = "stray", 1.0

    with torch.random.fork_rng():
        model = EncoderModel(config, (HeadSpec("mlm", "masked_lm"),))
    with pytest.raises(ConfigError, match="^objectives: Stray does not derive bertology.objectives.Objective"):
        TrainingLoss(model, [mlm, Stray()])


def test_nothing_probes_objectives_for_their_hooks():
    """The trainer and the recipes call the base class's hooks; none looks them up with getattr or hasattr."""
    files = [SRC / "recipes" / "pretrain.py", *sorted((SRC / "training").glob("*.py")),
             *sorted((SRC / "objectives").glob("*.py"))]
    for path in files:
        text = path.read_text(encoding="utf-8")
        for probe in ("getattr(objective", "hasattr(objective", "getattr(o,", "hasattr(o,"):
            assert probe not in text, f"{path.name}: {probe}"
    recipe = (SRC / "recipes" / "pretrain.py").read_text(encoding="utf-8")
    assert "tokenizer.style ==" not in recipe and "DECODER_START" not in recipe and "FAMILY_FIXED" not in recipe


def test_an_architecture_of_one_family_builds_it_when_the_family_is_unset():
    assert build("decoder").family == "gpt2"
    # encoder-stack, the name ModernBERT's architecture had before there was one bidirectional model, builds it still
    old = ModelConfig(architecture="encoder-stack", settings={"num_layers": 3})
    assert (old.kind, old.family, old.settings) == ("encoder", "modernbert", {"family": "modernbert", "num_layers": 3})
    assert build("encoder").family == "bert"  # the config class's default, one of the encoder's many families
