"""Permutation LM (XLNet): the batch maker's targets attend exactly to the tokens before them in their order, the
query stream never sees its own content, the same batch through transformers' XLNetLMHeadModel gives the same loss
and gradients, and the objective trains an XLNet on pretraining instances with the shared loop."""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from bertology.data import InMemoryDocuments, InstanceConfig, PretrainingDataset
from bertology.errors import ConfigError
from bertology.model import load_model
from bertology.model.convert import from_state_dict
from bertology.model.xlnet import XLNetConfig, XLNetModel
from bertology.objectives.base import Passes
from bertology.objectives.plm import PermutationBatches, PermutationConfig, PermutationLM, permutation_batch
from bertology.tokenization.framing import Framing
from bertology.training.config import OptimConfig, RunConfig, SpeedConfig, TrainConfig
from bertology.training.trainer import Trainer

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "training"))
from pretrain_helpers import build, make_assets, run_shipped_config_briefly, tiny_config, write_corpus  # noqa: E402

SEP, CLS, PAD, MASK = 4, 3, 5, 6
VOCAB = 40


class Stop(Exception):
    pass


def stop_at(step: int):
    """A hook that stops the run at `step` (the checkpoints before it written)."""
    def hook(trainer, report) -> None:
        if report.step == step:
            raise Stop()
    return hook


def a_batch(seed: int = 0, rows: int = 4, length: int = 18):
    """Right-padded rows `text <sep> <cls>` (XLNet's framing) of random lengths, words of 1-3 tokens."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(7, VOCAB, (rows, length), generator=g)
    lengths = torch.randint(length // 2, length + 1, (rows,), generator=g)
    lengths[0] = length
    mask = (torch.arange(length) < lengths[:, None]).long()
    rows_index = torch.arange(rows)
    ids[rows_index, lengths - 2], ids[rows_index, lengths - 1] = SEP, CLS
    ids = ids.masked_fill(mask == 0, PAD)
    types = torch.zeros_like(ids)
    types[rows_index, lengths - 1] = 2
    starts = torch.rand(rows, length, generator=g) < 0.6
    return ids, mask, types, starts


def made(k: float = 6.0, seed: int = 0, **options):
    ids, mask, types, starts = a_batch(seed, **options)
    config = PermutationConfig(k=k)
    return permutation_batch(ids, mask, types, starts, (SEP, CLS), config, torch.Generator().manual_seed(seed)), starts


@pytest.mark.parametrize("k", [1.0, 2.0, 6.0, 7.0])
def test_each_target_sees_exactly_the_tokens_before_it_in_one_order(k) -> None:
    for seed in range(3):
        batch, _ = made(k, seed)
        real = batch.attention_mask.bool()
        sees = (batch.perm_mask == 0) & real[:, None, :]  # the query stream's view, padding aside
        targets = batch.target_mapping.sum(1).bool()
        special = (batch.input_ids == SEP) | (batch.input_ids == CLS)
        for row in range(batch.input_ids.shape[0]):
            t = targets[row].nonzero().flatten()
            context = real[row] & ~targets[row] & ~special[row]
            candidates = int((real[row] & ~special[row]).sum())
            assert len(t) == min(candidates, max(1, round(candidates / k)))  # 1/K of the real tokens
            among = sees[row][t][:, t]  # target i sees target j
            assert not among.diagonal().any()  # never itself
            assert not (among & among.T).any()  # of two targets, at most one sees the other ...
            assert ((among | among.T) | torch.eye(len(t), dtype=torch.bool)).all()  # ... and exactly one does
            assert sorted(among.sum(1).tolist()) == list(range(len(t)))  # a total order: 0, 1, ..., T - 1 before
            assert (among.float() @ among.float() <= among.float() * len(t)).all()  # transitive
            assert sees[row][t][:, context].all()  # the context comes first in every order
            assert not sees[row][context][:, t].any()  # and sees no target
            assert (batch.labels[row][: len(t)] == batch.input_ids[row][t]).all()
            assert (batch.labels[row][len(t):] == -100).all()


def test_targets_are_whole_word_spans_with_context_around() -> None:
    batch, starts = made(6.0, 0, rows=2, length=96)
    targets = batch.target_mapping.sum(1).bool()
    assert targets.sum(1).tolist() == [round(94 / 6), round(int((batch.attention_mask[1].sum() - 2)) / 6)]
    # Targets come in runs (spans), far fewer runs than targets.
    runs = (targets[:, 1:] & ~targets[:, :-1]).sum() + targets[:, 0].sum()
    assert runs < targets.sum() / 1.2


def xlnet(seed: int = 0, **overrides) -> XLNetModel:
    values = dict(vocab_size=VOCAB, hidden_size=16, num_layers=2, num_heads=2, intermediate_size=24,
                  hidden_dropout=0.0, summary_last_dropout=0.0, pad_token_id=PAD)
    values.update(overrides)
    model = XLNetModel(XLNetConfig(**values), PermutationLM().heads())
    model.init_weights(torch.Generator().manual_seed(seed))
    return model.eval()


def test_the_query_stream_never_sees_its_own_content() -> None:
    batch, _ = made(3.0, 1)
    model = xlnet()
    row = 0
    slots = batch.target_mapping[row].sum(1).bool().nonzero().flatten()
    position = batch.target_mapping[row].argmax(1)
    seen_by = (batch.perm_mask[row] == 0)  # [i, j]: i sees j
    inputs = {**model.forward_inputs(batch), "masked_positions": None}  # logits at every slot, [B, P, V]
    with torch.no_grad():
        before = model(**inputs).logits
        for slot in slots.tolist():
            i = int(position[slot])
            changed = batch.input_ids.clone()
            changed[row, i] = 7 if changed[row, i] != 7 else 8
            after = model(**{**inputs, "input_ids": changed}).logits
            assert torch.equal(after[row, slot], before[row, slot])  # its own prediction does not move
            for other in slots.tolist():  # the targets after it in the order see it
                j = int(position[other])
                if j != i and seen_by[j, i]:
                    assert not torch.allclose(after[row, other], before[row, other])


def test_same_loss_and_gradients_as_transformers() -> None:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    hf = transformers.XLNetLMHeadModel(transformers.XLNetConfig(
        vocab_size=VOCAB, d_model=16, n_layer=2, n_head=2, d_inner=24, dropout=0.0, pad_token_id=PAD)).eval()
    model = xlnet()
    from bertology.model.convert import to_state_dict

    model.load_state_dict(to_state_dict(model, hf.state_dict(), True, "transformers"))
    batch, _ = made(6.0, 2)
    objective = PermutationLM()
    out = objective(Passes(model, batch, None), batch)
    loss = out.loss_sum / objective.units(batch)
    expected = hf(input_ids=batch.input_ids, attention_mask=batch.attention_mask, token_type_ids=batch.token_type_ids,
                  perm_mask=batch.perm_mask, target_mapping=batch.target_mapping, labels=batch.labels)
    torch.testing.assert_close(loss, expected.loss, atol=1e-5, rtol=1e-5)
    loss.backward()
    expected.loss.backward()
    grads = copy.deepcopy(model)
    for copied, original in zip(grads.parameters(), model.parameters()):
        copied.data = original.grad
    ours = from_state_dict(grads)
    named = dict(hf.named_parameters())
    assert set(named) == set(ours)
    for name, parameter in named.items():
        torch.testing.assert_close(ours[name], parameter.grad, atol=1e-5, rtol=1e-5, msg=name)


def test_k_outside_one_to_the_length_is_refused() -> None:
    with pytest.raises(ConfigError, match="permutation.k: K must be at least 1"):
        PermutationConfig(k=0.5)
    with pytest.raises(ConfigError, match=r"permutation.k: K = 30.0 is outside \[1, 18\] \(sequence length\)"):
        made(30.0)
    with pytest.raises(ConfigError, match=r"permutation.k: K = 70.0 is outside \[1, 64\] "
                                          r"\(data.instances.max_seq_length\)"):
        PermutationBatches(PermutationConfig(k=70), (SEP, CLS), 0, 64)
    with pytest.raises(ConfigError, match="permutation.max_span: must be at least 1"):
        PermutationConfig(max_span=0)


XLNET = Framing(cls_id=CLS, sep_id=SEP, pad_id=PAD, mask_id=MASK, style="xlnet")


def corpus(seed: int, documents: int = 12):
    g = torch.Generator().manual_seed(seed)
    docs = []
    for _ in range(documents):  # sentences counting up from a random start: learnable from the context
        start = int(torch.randint(0, 10, (1,), generator=g))
        docs.append([[7 + (start + i + 4 * s) % 30 for i in range(4)] for s in range(4)])
    return InMemoryDocuments(docs)


def pretraining_data(seed: int):
    config = InstanceConfig(kind="doc-sentences", max_seq_length=24, dupe_factor=4)
    return PretrainingDataset(corpus(seed), XLNET, config, PermutationBatches(PermutationConfig(k=4), (SEP, CLS),
                                                                              seed, 24))


def test_batches_are_keyed_by_instances_and_epoch() -> None:
    data = pretraining_data(0)
    first, again = next(data.batches(0, 4)), next(pretraining_data(0).batches(0, 4))
    assert torch.equal(first.perm_mask, again.perm_mask) and torch.equal(first.labels, again.labels)
    later = next(data.batches(1, 4))
    assert not (torch.equal(later.input_ids, first.input_ids) and torch.equal(later.perm_mask, first.perm_mask))


def test_permutation_lm_trains_an_xlnet_with_the_shared_loop(tmp_path) -> None:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = xlnet(vocab_size=VOCAB).train()
    steps = 40
    config = TrainConfig(optim=OptimConfig(batch_size=8, total_steps=steps, lr=1e-2, warmup_steps=4,
                                           weight_decay=0.0),
                         run=RunConfig(output_dir=str(tmp_path / "run"), log_every=20, eval_every=steps,
                                       checkpoint_every=steps, progress=False),
                         speed=SpeedConfig(device="cpu", threads=1, prefetch=0))
    trainer = Trainer(config, model, [PermutationLM()], pretraining_data(0), eval_data=pretraining_data(1))
    before = trainer.evaluate()
    metrics = trainer.train()
    assert metrics["lm_loss"] < before["lm_loss"] - 0.5, (before, metrics)


# --- the pretraining recipe -------------------------------------------------------------------------------------

ROOT = Path(__file__).resolve().parents[2]
BROWN = ROOT.parent / "shared" / "data" / "brown-nltk"


@pytest.fixture(scope="module")
def xlnet_assets(tmp_path_factory):
    """A corpus, an XLNet-style Unigram tokenizer and its shards."""
    from bertology.data.shards import prepare_corpus
    from bertology.tokenization import load_tokenizer, train_tokenizer

    root = tmp_path_factory.mktemp("xlnet-assets")
    corpus = write_corpus(root / "corpus.txt")
    train_tokenizer([str(corpus)], "unigram", 120, style="xlnet", show_progress=False).save(root / "tokenizer")
    tokenizer = load_tokenizer(root / "tokenizer")  # as the runs read it (Unigram scores round-trip inexactly)
    prepare_corpus(str(corpus), tokenizer, root / "shards", heldout_documents=3, show_progress=False)
    return {"corpus": corpus, "tokenizer": root / "tokenizer", "shards": root / "shards"}


def xlnet_run(assets, output_dir, **sections):
    raw = tiny_config(assets, output_dir, **sections)
    raw["model"].pop("max_position_embeddings")
    raw["model"]["architecture"] = "xlnet"
    raw["data"]["instances"] = {"kind": "doc-sentences", "max_seq_length": 32}
    raw["objectives"] = {"plm": {"k": 4}}
    return raw


def test_pretrain_recipe_trains_saves_and_resumes_an_xlnet(tmp_path, xlnet_assets) -> None:
    transformers = pytest.importorskip("transformers")
    from bertology.recipes.pretrain import pretrain
    from bertology.tokenization import load_tokenizer

    tokenizer = load_tokenizer(xlnet_assets["tokenizer"])
    assert tokenizer.style == "xlnet" and [tokenizer.token_to_id(t) for t in ("<unk>", "<cls>", "<sep>", "<pad>")] \
        == [0, 3, 4, 5]
    settings = dict(optim={"total_steps": 6}, run={"checkpoint_every": 2, "eval_every": 3})
    reference = pretrain(build(xlnet_run(xlnet_assets, tmp_path / "reference", **settings)))
    assert reference.steps == 6 and reference.metrics["lm_loss"] > 0
    stopped = build(xlnet_run(xlnet_assets, tmp_path / "stopped", **settings))
    with pytest.raises(Stop):
        pretrain(stopped, hooks=[stop_at(5)])
    pretrain(build(xlnet_run(xlnet_assets, tmp_path / "stopped", **settings)), resume=True)
    ours, theirs = (load_file(tmp_path / run / "model" / "model.safetensors") for run in ("stopped", "reference"))
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)
    # The final model is transformers' XLNetLMHeadModel, with the same outputs.
    model_dir = tmp_path / "reference" / "model"
    assert json.loads((model_dir / "config.json").read_text())["architectures"] == ["XLNetLMHeadModel"]
    hf = transformers.XLNetLMHeadModel.from_pretrained(model_dir).eval()
    ours_model = load_model(model_dir).eval()
    batch, _ = made(4.0, 3)
    batch.input_ids = batch.input_ids % hf.config.vocab_size
    inputs = dict(attention_mask=batch.attention_mask, perm_mask=batch.perm_mask, target_mapping=batch.target_mapping)
    with torch.no_grad():
        torch.testing.assert_close(ours_model(batch.input_ids, **inputs).logits,
                                   hf(input_ids=batch.input_ids, **inputs).logits, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(("change", "error", "message"), [
    ({"model": {"family": "bert"}}, ConfigError,
     r"model.family: the xlnet architecture builds xlnet models, not 'bert': bert is a family of the encoder "
     r"architecture \(model: \{architecture: encoder, family: bert"),
    ({"objectives": {"mlm": {}}}, ConfigError, "objectives.mlm: trains encoder models, but model.architecture is "
                                               "xlnet"),
    ({"model": {"max_position_embeddings": 64}}, ConfigError,
     r"model.max_position_embeddings: unknown key for the xlnet architecture \(a field of encoder"),
    ({"objectives": {"plm": {"k": 40}}}, ConfigError,
     r"objectives.plm.k: K = 40.0 is outside \[1, 32\] \(data.instances.max_seq_length\)"),
])
def test_pretrain_recipe_refuses_what_does_not_fit_an_xlnet(tmp_path, xlnet_assets, change, error, message) -> None:
    from bertology.recipes.pretrain import pretrain

    raw = xlnet_run(xlnet_assets, tmp_path / "run")
    for section, values in change.items():
        if section == "objectives":
            raw["objectives"] = values
        else:
            raw[section].update(values)
    with pytest.raises(error, match=message):
        pretrain(build(raw))


def test_plm_with_a_bert_tokenizer_is_refused(tmp_path) -> None:
    from bertology.errors import TokenizerError
    from bertology.recipes.pretrain import pretrain

    (tmp_path / "assets").mkdir()
    raw = tiny_config(make_assets(tmp_path / "assets"), tmp_path / "run")
    raw["objectives"] = {"plm": {}}
    raw["data"]["instances"] = {"kind": "doc-sentences", "max_seq_length": 32}
    with pytest.raises(ConfigError, match="objectives.plm: trains xlnet models, but model.architecture is encoder"):
        pretrain(build(raw))
    raw["model"] = {"architecture": "xlnet", "preset": "tiny"}
    with pytest.raises(TokenizerError, match=r"model: xlnet models read texts framed as xlnet does \(A <sep> B <sep> "
                                             r"<cls>, padded on the left\), but the tokenizer is bert-style .*: set "
                                             r"tokenizer.style: xlnet"):
        pretrain(build(raw))


def test_shipped_config_runs_on_brown(tmp_path) -> None:
    if not BROWN.is_dir():
        pytest.skip(f"the Brown corpus is not at {BROWN} (see ../shared/data/README.md)")
    corpus = [BROWN / f"ca0{i}" for i in range(1, 5)]
    assert run_shipped_config_briefly(ROOT / "configs" / "xlnet-tiny.yaml", tmp_path / "run", corpus, heldout=1) == 0
    assert isinstance(load_model(tmp_path / "run" / "model"), XLNetModel)
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["kind"] == "eval" and rows[-1]["lm_loss"] > 0


def test_pretrain_refuses_to_start_an_xlnet_from_another_model(tmp_path, xlnet_assets) -> None:
    from bertology.model import EncoderModel, preset, save_model
    from bertology.recipes.pretrain import pretrain

    torch.manual_seed(0)
    save_model(EncoderModel(preset("tiny", vocab_size=40, num_layers=1, hidden_size=16, num_heads=2,
                                   intermediate_size=32)), tmp_path / "bert", format="native")
    raw = xlnet_run(xlnet_assets, tmp_path / "run")
    raw["model"]["init_from"] = str(tmp_path / "bert")
    with pytest.raises(ConfigError, match=f"model.architecture: model.init_from {tmp_path / 'bert'} holds a model of "
                                          "the encoder architecture, not xlnet"):
        pretrain(build(raw))
    assert not (tmp_path / "run").exists()
