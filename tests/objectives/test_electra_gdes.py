"""ELECTRA's embedding sharing options: DeBERTa-v3's gradient-disentangled embedding sharing (``gdes``: the
discriminator's tables are sg(E_G) + E_delta), ELECTRA's shared embeddings and none."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest
import torch

import bertology
from bertology.errors import ConfigError
from bertology.model import EncoderModel, TransformerConfig
from bertology.objectives import TrainingLoss, build_objectives
from bertology.objectives.base import Passes
from bertology.objectives.electra import Electra, GradientDisentangledEmbedding

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "objectives"))
sys.path.insert(0, str(ROOT / "tests" / "training"))
from pretrain_helpers import make_assets, tiny_config  # noqa: E402
from test_electra import _batch  # noqa: E402

TABLES = ("word", "position", "token_type")
pytestmark = pytest.mark.usefixtures("one_thread")


def _discriminator(electra: Electra, family: str = "electra", embedding_size: int | None = None) -> EncoderModel:
    config = TransformerConfig(family=family, vocab_size=40, hidden_size=32, num_layers=2, num_heads=2,
                               intermediate_size=64, max_position_embeddings=32, pooler=False, type_vocab_size=2,
                               embedding_size=embedding_size, hidden_dropout=0.0, attention_dropout=0.0)
    electra.activation = "gelu"
    model = EncoderModel(config, electra.heads())
    model.init_weights(torch.Generator().manual_seed(0))
    electra.attach(model, torch.Generator().manual_seed(1))
    return model


def _token_types(batch):
    """Some rows with a second segment, so that both token-type rows are read."""
    types = torch.zeros_like(batch.input_ids)
    types[:, 5:] = 1
    batch.token_type_ids = types * batch.attention_mask
    return batch


def _term_grads(loss_module, batch, params):
    """The gradient of each term's weighted, normalised loss alone (as TrainingLoss weighs it), per parameter."""
    units = {k: v.float() for k, v in loss_module.units(batch).items()}
    passes = Passes(loss_module.model, batch, None)
    grads = {}
    for term in loss_module.objectives:
        loss = term(passes, batch).loss_sum * (term.weight / units[term.name].clamp(min=1))
        grads[term.name] = torch.autograd.grad(loss, params, allow_unused=True, retain_graph=True)
    return units, grads


def _zero(grad):
    return grad is None or not grad.abs().sum()


def test_gdes_tables_and_their_starting_point():
    torch.manual_seed(0)
    plain = EncoderModel(TransformerConfig(family="electra", vocab_size=40, hidden_size=32, num_layers=2,
                                           num_heads=2, intermediate_size=64, max_position_embeddings=32,
                                           pooler=False, type_vocab_size=2, hidden_dropout=0.0,
                                           attention_dropout=0.0),
                         Electra(activation="gelu").heads())
    plain.init_weights(torch.Generator().manual_seed(0))
    electra = Electra(generator_size=0.5, embedding_sharing="gdes")
    model = _discriminator(electra)
    gen = electra.generator
    ours, theirs = model.encoder.embeddings, gen.encoder.embeddings
    for part in TABLES:
        table = getattr(ours, part)
        assert isinstance(table, GradientDisentangledEmbedding) and table.source is getattr(theirs, part)
        assert not table.delta.abs().sum()  # E_delta starts at zero, E_G at the discriminator's initial table
        assert torch.equal(table.source.weight, getattr(plain.encoder.embeddings, part).weight)
        assert electra.embedding_deltas[part] is table.delta
    assert ours.norm is not theirs.norm  # each encoder's own embedding LayerNorm
    # The discriminator as initialised is the plain model: the same logits.
    batch = _token_types(_batch())
    with torch.no_grad():
        torch.testing.assert_close(model(batch.input_ids, batch.attention_mask, batch.token_type_ids).head_logits["rtd"],
                                   plain(batch.input_ids, batch.attention_mask, batch.token_type_ids).head_logits["rtd"],
                                   rtol=0, atol=0)
    # The state dict is a plain model's (folded tables): the same keys, nothing of the delta.
    assert model.state_dict().keys() == plain.state_dict().keys()
    # One set of parameters in the training module; E_delta once, though the model and the objective hold it.
    params = list(TrainingLoss(model, [electra]).parameters())
    assert len(params) == len({id(p) for p in params})
    assert sum(p is electra.embedding_deltas["word"] for p in params) == 1


def test_gdes_gradients_flow_as_stated():
    """E_G's gradient is the MLM loss's alone, E_delta's the RTD loss's alone; with ELECTRA's sharing the one
    table gets both."""
    torch.manual_seed(0)
    electra = Electra(generator_size=0.5, embedding_sharing="gdes")
    model = _discriminator(electra).eval()
    loss_module = TrainingLoss(model, [electra]).eval()
    batch = _token_types(_batch())
    tables = model.encoder.embeddings
    sources = [getattr(tables, part).source.weight for part in TABLES]
    deltas = [electra.embedding_deltas[part] for part in TABLES]
    units, grads = _term_grads(loss_module, batch, [*sources, *deltas])
    for i, part in enumerate(TABLES):
        assert not _zero(grads["generator"][i]), part  # the MLM loss trains E_G
        assert _zero(grads["rtd"][i]), part  # the RTD loss does not reach it
        assert _zero(grads["generator"][len(TABLES) + i]), part  # nor does the MLM loss reach E_delta
        assert not _zero(grads["rtd"][len(TABLES) + i]), part
    # The combined loss's gradients, as the trainer computes them, are each term's alone.
    loss_module.zero_grad()
    loss, _ = loss_module(batch, units)
    loss.backward()
    for i, part in enumerate(TABLES):
        torch.testing.assert_close(sources[i].grad, grads["generator"][i], rtol=1e-6, atol=1e-9)
        torch.testing.assert_close(deltas[i].grad, grads["rtd"][len(TABLES) + i], rtol=1e-6, atol=1e-9)

    shared = Electra(generator_size=0.5, embedding_sharing="shared")
    model = _discriminator(shared).eval()
    word = model.encoder.embeddings.word.weight
    assert shared.generator.encoder.embeddings.word.weight is word
    _, grads = _term_grads(TrainingLoss(model, [shared]).eval(), batch, [word])
    assert not _zero(grads["generator"][0]) and not _zero(grads["rtd"][0])


def test_no_sharing_gives_the_generator_embeddings_of_its_own():
    torch.manual_seed(0)
    electra = Electra(generator_size=0.5, embedding_sharing="none")
    model = _discriminator(electra)
    ours, theirs = model.encoder.embeddings, electra.generator.encoder.embeddings
    for part in (*TABLES, "norm"):
        assert type(getattr(ours, part)) is type(getattr(theirs, part)) and getattr(ours, part) is not getattr(theirs, part)
    assert not torch.equal(ours.word.weight, theirs.word.weight) and not len(electra.embedding_deltas)
    batch = _token_types(_batch())
    loss_module = TrainingLoss(model.eval(), [electra]).eval()
    _, grads = _term_grads(loss_module, batch, [ours.word.weight, theirs.word.weight])
    assert _zero(grads["generator"][0]) and not _zero(grads["generator"][1])
    assert not _zero(grads["rtd"][0]) and _zero(grads["rtd"][1])


def test_the_folded_discriminator_loads_in_transformers_with_the_same_logits(tmp_path):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    electra = Electra(generator_size=0.5, embedding_sharing="gdes")
    model = _discriminator(electra).eval()
    with torch.no_grad():  # a trained E_delta: the folded table differs from E_G
        for delta in electra.embedding_deltas.values():
            delta.copy_(0.05 * torch.randn(delta.shape, generator=torch.Generator().manual_seed(3)))
    bertology.model.checkpoint.Pretrained(model, None).save(tmp_path / "model")
    electra.save_with_model(tmp_path, None)
    ids = torch.randint(5, 40, (3, 9), generator=torch.Generator().manual_seed(2))
    mask = torch.ones_like(ids)
    mask[1, 6:] = 0
    types = torch.zeros_like(ids)
    types[:, 4:] = 1
    with torch.no_grad():
        disc = transformers.ElectraForPreTraining.from_pretrained(tmp_path / "model").eval()
        gen = transformers.ElectraForMaskedLM.from_pretrained(tmp_path / "generator").eval()
        ours = model(ids, mask, types).head_logits["rtd"]
        real = mask.bool()
        theirs = disc(ids, attention_mask=mask, token_type_ids=types).logits
        torch.testing.assert_close(theirs[real], ours[real], atol=1e-5, rtol=0)
        loaded = bertology.load(tmp_path / "model").model
        assert not any(isinstance(m, GradientDisentangledEmbedding) for m in loaded.modules())
        torch.testing.assert_close(loaded(ids, mask, types).head_logits["rtd"][real], ours[real], atol=1e-6, rtol=0)
    tables = model.encoder.embeddings
    folded = disc.electra.embeddings.word_embeddings.weight
    assert torch.equal(folded, tables.word.source.weight + tables.word.delta)
    assert torch.equal(gen.electra.embeddings.word_embeddings.weight, tables.word.source.weight)
    assert torch.equal(disc.electra.embeddings.position_embeddings.weight,
                       tables.position.source.weight + tables.position.delta)
    assert not torch.equal(folded, gen.electra.embeddings.word_embeddings.weight)


def test_loading_a_folded_table_sets_the_delta():
    torch.manual_seed(0)
    electra = Electra(generator_size=0.5, embedding_sharing="gdes")
    model = _discriminator(electra)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    key = "encoder.embeddings.word.weight"
    state[key] = state[key] + 0.25
    model.load_state_dict(state)
    torch.testing.assert_close(electra.embedding_deltas["word"], torch.full_like(state[key], 0.25), rtol=0,
                               atol=1e-6)
    with pytest.raises(RuntimeError, match="size mismatch for encoder.embeddings.word.weight"):
        model.load_state_dict({**state, key: state[key][:-1]})
    with pytest.raises(RuntimeError, match="Unexpected key.*encoder.embeddings.word.delta"):
        model.load_state_dict({**state, "encoder.embeddings.word.delta": state[key]})


@pytest.mark.parametrize("value", ["tied", "GDES", ""])
def test_a_bad_sharing_option_names_the_key(value):
    with pytest.raises(ConfigError, match=r"objectives\.electra\.embedding_sharing: must be one of none, shared, "
                                          r"gdes, got"):
        build_objectives({"electra": {"embedding_sharing": value}})


def _config(assets, out, **electra):
    from bertology.training.config import PretrainConfig

    return PretrainConfig.from_dict(tiny_config(
        assets, out, model={"family": "electra"}, data={"instances": {"kind": "full-sentences"}},
        objectives={"electra": {"generator_size": 0.5, "embedding_sharing": "gdes", **electra}},
        optim={"total_steps": 4}, run={"checkpoint_every": 2, "eval_every": 0, "keep_last": 3}))


def test_gdes_resume_is_bitwise(tmp_path):
    """A GDES run resumed from its step-2 checkpoint ends with the same discriminator (folded), generator and
    E_delta, bit for bit; the saved discriminator's tables are the generator's plus the trained E_delta."""
    from safetensors.torch import load_file

    from bertology.recipes.pretrain import pretrain

    assets = make_assets(tmp_path)
    pretrain(_config(assets, tmp_path / "a"))
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    for name in ("model", "generator", "checkpoints/step-0000004"):
        shutil.rmtree(tmp_path / "b" / name)
    pretrain(_config(assets, tmp_path / "b"), resume=True)
    for part in ("model", "generator"):
        a = load_file(tmp_path / "a" / part / "model.safetensors")
        b = load_file(tmp_path / "b" / part / "model.safetensors")
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), part
    state = {}
    for run in ("a", "b"):
        tensors = load_file(tmp_path / run / "checkpoints" / "step-0000004" / "trainer_state.safetensors")
        state[run] = {k: v for k, v in tensors.items() if "embedding_deltas" in k}
    assert state["a"] and state["a"].keys() == state["b"].keys()
    assert all(torch.equal(state["a"][k], state["b"][k]) for k in state["a"])
    disc = load_file(tmp_path / "a" / "model" / "model.safetensors")
    gen = load_file(tmp_path / "a" / "generator" / "model.safetensors")
    word = "electra.embeddings.word_embeddings.weight"
    delta = next(v for k, v in state["a"].items() if k.endswith("word"))
    assert delta.abs().sum() > 0  # the RTD loss trained E_delta
    assert torch.equal(disc[word], gen[word] + delta)


def test_continuing_a_gdes_run_restores_its_tables(tmp_path):
    """model.init_from a GDES run's model/: the generator (its own tables included) is the saved one and the
    discriminator's tables stay the saved, folded ones (E_delta = the difference)."""
    from bertology.recipes.pretrain import build_model, pretrain
    from bertology.tokenization import load_tokenizer

    assets = make_assets(tmp_path)
    pretrain(_config(assets, tmp_path / "first"))
    again = _config(assets, tmp_path / "second")
    again.model.init_from = str(tmp_path / "first" / "model")
    objectives = again.build_objectives()
    model = build_model(again, load_tokenizer(assets["tokenizer"]), objectives)
    saved_gen = bertology.load(tmp_path / "first" / "generator").model.state_dict()
    ours = objectives[0].generator.state_dict()
    assert ours.keys() == saved_gen.keys() and all(torch.equal(v, saved_gen[k]) for k, v in ours.items())
    saved = bertology.load(tmp_path / "first" / "model").model.state_dict()
    for key, value in model.state_dict().items():
        torch.testing.assert_close(value, saved[key], rtol=0, atol=1e-6, msg=key)
    assert isinstance(model.encoder.embeddings.word, GradientDisentangledEmbedding)


def test_deberta_v3_tiny_config_runs_a_few_steps(tmp_path):
    """configs/deberta-v3-tiny.yaml (a DeBERTa generator and discriminator, RTD with GDES, DeBERTa-v3's Unigram
    tokenizer) for 3 steps on five Brown files: both models written, the discriminator's table the generator's
    plus a trained E_delta, and DeBERTa-v3's shape."""
    from pretrain_helpers import run_shipped_config_briefly

    brown = ROOT.parent / "shared" / "data" / "brown-nltk"
    if not brown.is_dir():
        pytest.skip(f"the Brown corpus is not at {brown}")
    out = tmp_path / "run"
    corpus = [brown / f"ca0{i}" for i in range(1, 6)]
    assert run_shipped_config_briefly(ROOT / "configs" / "deberta-v3-tiny.yaml", out, corpus, heldout=2) == 0
    import json

    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert {"generator_accuracy", "rtd_loss", "rtd_recall"} <= set(rows[-1])
    disc, gen = bertology.load(out / "model"), bertology.load(out / "generator")
    config = disc.model.config
    assert config.family == gen.model.config.family == "deberta-v2"
    assert config.relative_attention and config.pos_att_type == ("p2c", "c2p") and config.share_att_key
    assert config.positions == "none" and config.type_vocab_size == 0
    assert gen.model.config.hidden_size == config.hidden_size // 4
    assert disc.tokenizer.style == "deberta" and disc.tokenizer.vocab_size == gen.tokenizer.vocab_size
    assert not any(isinstance(m, GradientDisentangledEmbedding) for m in disc.model.modules())
    # Only the token table is shared (DeBERTa-v3 has no absolute positions and no token types): the folded table
    # differs from the generator's by the trained E_delta.
    word = disc.model.encoder.embeddings.word.weight
    assert not torch.equal(word, gen.model.encoder.embeddings.word.weight)
