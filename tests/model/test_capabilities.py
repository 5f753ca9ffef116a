"""Each model declares what it can do; callers above the model package ask for a capability, not a class."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest
import torch

import bertology.model as model_package
from bertology.errors import ConfigError
from bertology.model import (DECODER_ONLY, ENCODER_DECODER, GENERATES, MASKED_LM, BaseModel, EncoderModel, HeadSpec,
                             capabilities, preset, require)
from bertology.model import protocol as P
from bertology.model.elmo import ElmoConfig, ElmoModel
from bertology.model.longformer import LongformerConfig, LongformerModel
from bertology.model.registry import MODELS
from bertology.model.transformer import DecoderModel, Seq2SeqModel, TransformerModel
from bertology.model.xlnet import XLNetConfig, XLNetModel
from transformer_helpers import tiny_config

pytestmark = pytest.mark.usefixtures("one_thread")

SRC = Path(__file__).resolve().parents[2] / "src" / "bertology"


def encoder_config(**overrides):
    return preset("tiny", vocab_size=40, num_layers=1, hidden_size=16, num_heads=2, intermediate_size=32, **overrides)


def test_generating_models_declare_their_kind():
    torch.manual_seed(0)
    common = {P.LORA, P.BLOCKS}
    assert capabilities(DecoderModel(tiny_config(), [HeadSpec("lm", "tied_lm")])) \
        == {GENERATES, DECODER_ONLY, P.SCALAR_MIX} | common
    assert capabilities(Seq2SeqModel(tiny_config(), [HeadSpec("lm", "tied_lm")])) \
        == {GENERATES, ENCODER_DECODER} | common
    # The one bidirectional model holding the token table (an encoder-decoder's encoder alone, ModernBERT).
    assert capabilities(EncoderModel(tiny_config())) == {P.SCALAR_MIX, P.ATTENTIONS} | common
    assert capabilities(EncoderModel(tiny_config(), [HeadSpec("mlm", "masked_lm")])) \
        == {P.SCALAR_MIX, P.ATTENTIONS, P.MASKED_LM} | common


def test_an_encoder_declares_what_its_config_and_heads_give_it():
    torch.manual_seed(0)
    always = {P.ENCODER, P.ATTENTIONS, P.HEAD_MASK, P.LORA, P.SCALAR_MIX, P.BLOCKS}
    assert capabilities(EncoderModel(encoder_config(), [HeadSpec("mlm", "masked_lm")])) \
        == always | {MASKED_LM, P.POOLER, P.TOKEN_TYPES, P.PRUNES_HEADS}
    assert capabilities(EncoderModel(encoder_config(pooler=False, type_vocab_size=0))) == always | {P.PRUNES_HEADS}
    windowed = LongformerModel(LongformerConfig(vocab_size=50, num_layers=1, hidden_size=8, num_heads=2,
                                                intermediate_size=8, max_position_embeddings=20, attention_window=4))
    assert P.GLOBAL_TOKENS in capabilities(windowed) and P.PRUNES_HEADS not in capabilities(windowed)
    assert capabilities(object()) == frozenset()  # a model that declares nothing can do nothing asked of it


def test_xlnet_and_elmo_declare_theirs():
    torch.manual_seed(0)
    xlnet = XLNetModel(XLNetConfig(vocab_size=40, hidden_size=16, num_layers=2, num_heads=2, intermediate_size=24))
    assert capabilities(xlnet) == {P.PERMUTATION_LM, P.MEMORY, P.ATTENTIONS, P.TOKEN_TYPES, P.BLOCKS}
    assert xlnet.attention_heads() == ([[0, 1], [0, 1]], {})
    elmo = ElmoModel(ElmoConfig(vocab_size=0, filters=[[1, 4], [2, 8]], num_highway=1, projection_dim=8,
                                cell_size=16, num_layers=1, max_characters_per_token=10))
    assert capabilities(elmo) == {P.CHARACTERS, P.SCALAR_MIX}
    assert elmo.mix is None and not hasattr(Seq2SeqModel(tiny_config()), "mix")  # the slot only where a mix fits


def test_a_class_answers_for_every_instance_of_it():
    assert capabilities(Seq2SeqModel) == {GENERATES, ENCODER_DECODER, P.LORA, P.BLOCKS}
    assert P.ENCODER in capabilities(LongformerModel)
    assert MASKED_LM not in capabilities(EncoderModel)  # it depends on the heads: only an instance has it
    assert Seq2SeqModel.encoder_alone is EncoderModel and DecoderModel.encoder_alone is None
    assert capabilities(EncoderModel) == {P.ATTENTIONS, P.LORA, P.SCALAR_MIX, P.BLOCKS}  # the rest: its config's


def test_every_declared_capability_is_named_in_the_protocol():
    declared = set()
    for entry in MODELS.values():
        if entry.cls.__module__.startswith("bertology."):
            assert issubclass(entry.cls, BaseModel), entry.name
            declared |= capabilities(entry.cls)
    declared |= capabilities(EncoderModel(encoder_config(), [HeadSpec("mlm", "masked_lm")]))
    assert declared <= set(P.CAPABILITY_WORDS)
    for name in P.CAPABILITY_WORDS:
        assert getattr(P, name.upper().replace("-", "_")) == name  # each has its constant in bertology.model.protocol


def test_require_names_the_capability_and_the_model():
    decoder = DecoderModel(tiny_config(), [HeadSpec("lm", "tied_lm")])
    assert require(decoder, GENERATES, "generation") is decoder
    with pytest.raises(ConfigError, match="fill-mask needs a model that is a bidirectional encoder with a masked-LM "
                                          "head \\(capability 'masked-lm'\\); the model \\(DecoderModel, registered as "
                                          "'decoder'\\) does not declare it"):
        require(decoder, MASKED_LM, "fill-mask")
    with pytest.raises(ConfigError, match="the model \\(TransformerModel\\) does not declare it"):
        require(TransformerModel, GENERATES, "generation")  # an unregistered class is named by its class alone
    with pytest.raises(ValueError, match="unknown capability 'flies'"):
        require(decoder, "flies", "flying")


def test_the_base_model_runs_the_heads_and_sets_the_primary_logits():
    torch.manual_seed(0)
    model = EncoderModel(encoder_config(), [HeadSpec("tags", "token", num_labels=3),
                                            HeadSpec("cls", "pooled", num_labels=2)]).eval()
    ids = torch.randint(5, 40, (2, 6))
    with torch.no_grad():
        out = model(ids, torch.ones_like(ids))
    assert list(out.head_logits) == ["tags", "cls"] and out.logits is out.head_logits["tags"]
    assert out.logits.shape == (2, 6, 3) and out.head_logits["cls"].shape == (2, 2)
    assert list(model.state_dict())[0].startswith("encoder.")  # the body's parameters first, then the heads'
    assert [name for name in model.state_dict() if name.startswith("heads.")][0].startswith("heads.tags.")


# ------------------------------------------------------------------------------------------------------------------
# Nothing outside bertology.model asks which class it holds.

def model_class_names() -> set[str]:
    """The concrete model classes (the registered ones and the classes between them and BaseModel) and the stacks
    they are built of, found by introspection once every built-in model is imported."""
    importlib.import_module("bertology.model")
    names = set()
    for entry in MODELS.values():
        if entry.cls.__module__.startswith("bertology."):
            names |= {c.__name__ for c in entry.cls.__mro__ if issubclass(c, BaseModel) and c is not BaseModel}
    return names | {"Encoder", "Stack"}


def class_questions(tree: ast.AST, names: set[str]) -> list[tuple[int, str]]:
    """Where the code asks for a model class: isinstance / issubclass against one, `type(x) is` one, or a tuple,
    list or set of them (the class tuples such checks read)."""

    def named(node: ast.AST) -> set[str]:
        found = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
        found |= {n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute)}
        return found & names

    hits = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                and node.func.id in ("isinstance", "issubclass") and len(node.args) == 2 and named(node.args[1]):
            hits.append((node.lineno, f"{node.func.id} against {', '.join(sorted(named(node.args[1])))}"))
        elif isinstance(node, ast.Compare) and any(isinstance(op, (ast.Is, ast.IsNot, ast.Eq, ast.NotEq))
                                                   for op in node.ops) \
                and any(isinstance(c, ast.Name) and c.id in names for c in (node.left, *node.comparators)):
            hits.append((node.lineno, "a class compared"))
        elif isinstance(node, (ast.Tuple, ast.List, ast.Set)) \
                and any(isinstance(e, ast.Name) and e.id in names for e in node.elts):
            hits.append((node.lineno, "a collection of model classes"))
    return hits


def test_the_scan_finds_each_way_of_asking_for_a_class():
    names = {"EncoderModel", "XLNetModel"}
    code = ("isinstance(m, EncoderModel)\nissubclass(c, (int, model.XLNetModel))\nMODELS = (EncoderModel, str)\n"
            "type(m) is XLNetModel\nisinstance(m, Pretrained)\nx: EncoderModel | None = None\n")
    assert [line for line, _ in class_questions(ast.parse(code), names)] == [1, 2, 3, 4]


def test_nothing_outside_the_model_package_asks_for_a_model_class():
    names = model_class_names()
    assert {"EncoderModel", "LongformerModel", "DecoderModel", "Seq2SeqModel", "XLNetModel",
            "ElmoModel", "TransformerModel"} <= names
    found = []
    for path in sorted(SRC.rglob("*.py")):
        if (SRC / "model") in path.parents:
            continue
        for line, what in class_questions(ast.parse(path.read_text(), str(path)), names):
            found.append(f"{path.relative_to(SRC.parent)}:{line}: {what}")
    assert not found, "ask for a capability (bertology.model.protocol) instead:\n" + "\n".join(found)


def test_the_package_exports_the_base_and_require():
    assert model_package.BaseModel is BaseModel and model_package.require is require


def test_shared_blocks_stay_with_the_root_unit_in_every_model():
    from bertology.model.config import TransformerConfig
    from bertology.training.distributed import transformer_blocks

    torch.manual_seed(0)
    tiny = dict(vocab_size=40, hidden_size=16, num_layers=4, num_heads=2, intermediate_size=24)
    shared = DecoderModel(TransformerConfig.decoder(family="gpt2", num_layer_groups=2, **tiny))
    assert shared.decoder.plan == [0, 0, 1, 1]
    assert [id(b) for b in shared.reused_blocks()] == [id(b) for b in shared.decoder.layers]
    assert transformer_blocks(shared) == []  # each block runs twice: none is a unit of its own
    albert = EncoderModel(preset("tiny", num_layer_groups=1, **tiny))
    assert len(albert.reused_blocks()) == 1 and transformer_blocks(albert) == []
    plain = DecoderModel(TransformerConfig.decoder(family="gpt2", **tiny))
    assert plain.reused_blocks() == [] and len(transformer_blocks(plain)) == 4
