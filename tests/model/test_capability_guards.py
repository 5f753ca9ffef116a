"""Each feature that needs a capability refuses a model without it, with an error naming the capability and the model
(and runs on one that declares it)."""

from __future__ import annotations

import pytest
import torch

from bertology.analysis.report import AnalysisUnavailable
from bertology.embeddings.result import EmbeddingError
from bertology.errors import CheckpointError, ConfigError
from bertology.model import EncoderModel, HeadSpec, preset
from bertology.model.elmo import ElmoConfig, ElmoModel
from bertology.model.transformer import DecoderModel, Seq2SeqModel
from bertology.model.xlnet import XLNetConfig, XLNetModel
from transformer_helpers import tiny_config

pytestmark = pytest.mark.usefixtures("one_thread")


def encoder(heads=()):
    torch.manual_seed(0)
    return EncoderModel(preset("tiny", vocab_size=40, num_layers=2, hidden_size=16, num_heads=2,
                               intermediate_size=32), list(heads))


def decoder():
    torch.manual_seed(0)
    return DecoderModel(tiny_config(), [HeadSpec("lm", "tied_lm")])


def seq2seq():
    torch.manual_seed(0)
    return Seq2SeqModel(tiny_config(), [HeadSpec("lm", "tied_lm")])


def elmo():
    torch.manual_seed(0)
    return ElmoModel(ElmoConfig(filters=[[1, 4], [2, 8]], num_highway=1, projection_dim=8, cell_size=16,
                                num_layers=1, max_characters_per_token=10))


def xlnet():
    torch.manual_seed(0)
    return XLNetModel(XLNetConfig(vocab_size=40, hidden_size=16, num_layers=2, num_heads=2, intermediate_size=24))


def refusal(capability: str, cls: str, name: str) -> str:
    return f"\\(capability '{capability}'\\); the model \\({cls}, registered as '{name}'\\) does not declare it"


def test_generation_needs_generates():
    from bertology.generation import generate

    with pytest.raises(ConfigError, match="generation needs .*" + refusal("generates", "XLNetModel", "xlnet")):
        generate(xlnet(), input_ids=torch.ones(1, 3, dtype=torch.long))
    assert generate(decoder(), input_ids=torch.ones(1, 3, dtype=torch.long), max_new_tokens=2).shape == (1, 5)


def test_prefix_lm_needs_a_decoder_only_model():
    from bertology.generation import generate

    with pytest.raises(ConfigError, match="prefix_lm: a decoder's option \\(its prompt read in both "
                                          "directions, capability 'decoder-only'\\); the model \\(Seq2SeqModel, "
                                          "registered as 'seq2seq'\\) does not declare it"):
        generate(seq2seq(), input_ids=torch.ones(1, 3, dtype=torch.long), prefix_lm=True)


def test_lora_needs_lora_targets():
    from bertology.peft import apply_lora

    with pytest.raises(ConfigError, match="LoRA needs a model that has projections LoRA may wrap .*"
                                          + refusal("lora", "XLNetModel", "xlnet")):
        apply_lora(xlnet(), targets=("query",))
    with pytest.raises(ConfigError, match="lora targets: this model's \\(chosen\\) blocks have no projection "
                                          "'cross_query' \\(LoRA may wrap query, key, value, attn_out, ffn_in, "
                                          "ffn_gate, ffn_out\\)"):
        apply_lora(encoder(), targets=("cross_query",))
    model = encoder()
    apply_lora(model, targets=("query", "ffn_out"))
    assert set(model.extensions) == {f"encoder.layers.{i}.{t}" for i in range(2) for t in ("query", "ffn_out")}


@pytest.mark.parametrize("method", ["adapters", "prefix tuning"])
def test_adapters_and_prefixes_need_transformer_blocks(method):
    from bertology.peft import apply_adapters, apply_prefix

    apply = apply_adapters if method == "adapters" else apply_prefix
    with pytest.raises(ConfigError, match=f"{method} needs a model that is built of transformer blocks "
                                          + refusal("blocks", "ElmoModel", "elmo")):
        apply(elmo())
    model = xlnet()
    apply(model)
    assert model.extensions


def test_the_finetuning_strategies_ask_for_theirs():
    from bertology.recipes.finetune import StrategyConfig, check_strategy

    with pytest.raises(ConfigError, match="strategy.kind: scalar-mix .* needs a model that has heads reading one "
                                          "stack's states .*" + refusal("scalar-mix", "Seq2SeqModel", "seq2seq")):
        check_strategy(StrategyConfig(kind="scalar-mix"), seq2seq())
    check_strategy(StrategyConfig(kind="scalar-mix"), seq2seq(), EncoderModel)  # a tagger's encoder alone
    with pytest.raises(ConfigError, match="strategy.kind: lora .*" + refusal("lora", "XLNetModel", "xlnet")):
        check_strategy(StrategyConfig(kind="lora"), xlnet())
    with pytest.raises(ConfigError, match="strategy.kind: prefix adapts transformer blocks, which the model "
                                          "\\(ElmoModel, registered as 'elmo'\\) does not have \\(capability "
                                          "'blocks'\\)"):
        check_strategy(StrategyConfig(kind="prefix"), elmo())
    for kind in ("full", "frozen", "scalar-mix"):
        check_strategy(StrategyConfig(kind=kind), elmo())


def test_encoder_only_features_need_the_encoder():
    from bertology.model.vocabulary import extend_vocabulary
    from bertology.objectives.distill import init_student
    from bertology.objectives.electra import Electra

    for call, feature in ((lambda m: extend_vocabulary(m, [[1, 2]]), "vocabulary extension"),
                          (lambda m: Electra().attach(m), "ELECTRA"), (lambda m: init_student(m, []), "distillation")):
        with pytest.raises(ConfigError, match=f"{feature}.* needs a model that is a bidirectional encoder of the "
                                              "BERT family " + refusal("encoder", "XLNetModel", "xlnet")):
            call(xlnet())
    model = encoder([HeadSpec("mlm", "masked_lm")])
    extend_vocabulary(model, [[5, 6]])
    assert model.config.vocab_size == 41


def test_head_analyses_need_head_masks_and_attentions():
    from bertology.analysis.attention import head_layout
    from bertology.analysis.importance import existing_heads

    with pytest.raises(ConfigError, match="head importance and pruning .* needs a model that takes a head mask "
                                          + refusal("head-mask", "XLNetModel", "xlnet")):
        existing_heads(xlnet())
    with pytest.raises(AnalysisUnavailable, match="attention heads are read from a model that returns attention "
                                                  "probabilities \\(capability 'attentions': .*\\); the model "
                                                  "\\(Seq2SeqModel, registered as 'seq2seq'\\) does not declare it"):
        head_layout(seq2seq())
    model = encoder()
    model.prune_heads({1: [0]})
    assert head_layout(model) == ([[0, 1], [1]], {1: [0]})
    assert existing_heads(model).tolist() == [[True, True], [False, True]]
    assert head_layout(xlnet()) == ([[0, 1], [0, 1]], {})


def test_text_to_text_needs_an_encoder_decoder():
    from bertology.tasks.text_to_text import require_seq2seq

    with pytest.raises(ConfigError, match="SQuAD as text-to-text .* needs a model that is an encoder-decoder "
                                          + refusal("encoder-decoder", "DecoderModel", "decoder")):
        require_seq2seq(decoder(), "SQuAD")
    require_seq2seq(seq2seq(), "SQuAD")


def test_fill_mask_asks_what_the_model_is():
    from bertology.objectives.fill_mask import fill_mask

    with pytest.raises(CheckpointError, match="this is a decoder-only model"):
        fill_mask(decoder(), None, "a [MASK]")
    with pytest.raises(CheckpointError, match="fill-mask needs a model with a language-model head; this one has "
                                              "no head"):
        fill_mask(xlnet(), None, "a <mask>")  # a permutation LM predicts through its 'lm' head
    with pytest.raises(CheckpointError, match="fill-mask needs a model with a masked-LM head; this one has no head"):
        fill_mask(encoder(), None, "a [MASK]")


def test_the_elmo_backbone_needs_characters():
    from bertology.embeddings.elmo import ElmoBackbone

    with pytest.raises(EmbeddingError, match="ElmoBackbone needs a model that reads words as characters \\(capability "
                                             "'characters': ELMo\\), got EncoderModel, registered as 'encoder'"):
        ElmoBackbone(encoder())
    assert ElmoBackbone(elmo()).model is not None
