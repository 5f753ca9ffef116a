"""ALBERT's sentence-order prediction: the instances (consecutive segments of one document, swapped half the time,
as ALBERT's create_pretraining_data), the objective, training an ALBERT encoder with shared layers, the
AlbertForPreTraining round trip through transformers, MLM+SOP on a BERT encoder, bad settings, and
configs/albert-tiny.yaml end to end."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import bertology
from bertology.data.instances import InMemoryDocuments, InstanceConfig, SpecialTokens, create_instances
from bertology.data.dataset import PretrainingBatch
from bertology.errors import ConfigError, DataError
from bertology.model import TransformerConfig, EncoderModel, save_model
from bertology.objectives import MaskedLM, SentenceOrder, TrainingLoss
from bertology.objectives.base import Passes
from bertology.training.config import load_config

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "training"))
from pretrain_helpers import build, make_assets, run_shipped_config_briefly, tiny_config  # noqa: E402

BROWN = ROOT.parent / "shared" / "data" / "brown-nltk"
SPECIAL = SpecialTokens(cls_id=1, sep_id=2, pad_id=0, mask_id=3)


def _documents(count: int = 600, seed: int = 0) -> InMemoryDocuments:
    """Sentence j of document d is ``2 + j`` tokens, every one the id 1000 * (d + 1) + j: each token says where it
    came from."""
    rng = np.random.default_rng(seed)
    docs = []
    for d in range(count):
        sentences = int(rng.integers(1, 12))
        docs.append([[1000 * (d + 1) + j] * int(rng.integers(2, 14)) for j in range(sentences)])
    return InMemoryDocuments(docs)


def _segments(instance) -> tuple[np.ndarray, np.ndarray]:
    ids = instance.input_ids
    seps = np.flatnonzero(ids == SPECIAL.sep_id)
    return ids[1:seps[0]], ids[seps[0] + 1:seps[1]]


def test_sop_instances_are_consecutive_segments_swapped_half_the_time():
    config = InstanceConfig(kind="sop", max_seq_length=40, seed=3)
    instances, stats = create_instances(_documents(), config, SPECIAL)
    in_order = swapped = other_document = 0
    for instance in instances:
        a, b = _segments(instance)
        assert instance.is_random_next is not None
        first = instance.input_ids[0:len(a) + 2]
        assert (instance.token_type_ids[:len(first)] == 0).all() and (instance.token_type_ids[len(first):] == 1).all()
        doc_a, doc_b = a // 1000, b // 1000
        assert (doc_a == doc_a[0]).all() and (doc_b == doc_b[0]).all()
        sent_a, sent_b = a % 1000, b % 1000
        # Truncation may cut away the sentences where A and B meet; an untruncated pair meets exactly.
        whole = len(a) + len(b) < config.max_seq_length - 3
        if doc_a[0] != doc_b[0]:
            # ALBERT: a chunk of one sentence takes B from another document, labelled 1.
            assert instance.is_random_next and len(np.unique(sent_a)) == 1
            other_document += 1
        elif instance.is_random_next:
            assert sent_b.max() < sent_a.min() and (sent_b.max() + 1 == sent_a.min() or not whole)
            swapped += 1
        else:
            assert sent_a.max() < sent_b.min() and (sent_a.max() + 1 == sent_b.min() or not whole)
            in_order += 1
    n = in_order + swapped
    assert n > 700
    assert abs(swapped / n - 0.5) < 4 * math.sqrt(0.25 / n)
    assert stats.random_next == swapped + other_document
    assert other_document <= stats.single_sentence_chunks


def test_sop_batches_carry_the_order_labels():
    from bertology.data.dataset import PretrainingDataset
    from bertology.data.masking import Masker, MaskingConfig

    config = InstanceConfig(kind="sop", max_seq_length=40, seed=3)
    data = PretrainingDataset(_documents(), SPECIAL, config, Masker(MaskingConfig(), SPECIAL, 7000))
    batch = next(iter(data.batches(0, 16)))
    assert batch.next_sentence_labels is not None and set(batch.next_sentence_labels.tolist()) <= {0, 1}


def test_sop_objective_and_missing_labels():
    sop = SentenceOrder()
    assert [h.name for h in sop.heads()] == ["sop"] and sop.heads()[0].kind == "pooled"
    batch = PretrainingBatch(torch.zeros(2, 4, dtype=torch.long), torch.ones(2, 4, dtype=torch.long),
                             torch.zeros(2, 4, dtype=torch.long), torch.zeros(0, 2, dtype=torch.long),
                             torch.zeros(0, dtype=torch.long), torch.tensor([1, 0]))
    from bertology.model.encoder import EncoderOutput

    passes = Passes(None, batch, None)  # type: ignore[arg-type]
    passes.shared = EncoderOutput(last_hidden_state=torch.zeros(2, 4, 3),
                                  head_logits={"sop": torch.tensor([[0.0, 2.0], [0.0, 2.0]])})
    out = sop(passes, batch)
    assert out.stats["sop_correct"].item() == 1 and out.stats["sop_units"].item() == 2
    expected = torch.nn.functional.cross_entropy(torch.tensor([[0.0, 2.0], [0.0, 2.0]]), torch.tensor([1, 0]),
                                                 reduction="sum")
    torch.testing.assert_close(out.loss_sum, expected)
    batch.next_sentence_labels = None
    with pytest.raises(DataError, match="needs sentence-order labels.*kind must be 'sop'"):
        sop.units(batch)


def _albert(shared: bool = True) -> EncoderModel:
    config = TransformerConfig(family="albert", vocab_size=60, hidden_size=32, num_layers=4, num_heads=2,
                           intermediate_size=64, max_position_embeddings=32, embedding_size=16,
                           num_layer_groups=1 if shared else None, hidden_act="gelu_new", hidden_dropout=0.0,
                           attention_dropout=0.0)
    model = EncoderModel(config, [*MaskedLM(activation="gelu_new").heads(), *SentenceOrder().heads()])
    model.init_weights(torch.Generator().manual_seed(0))
    return model


def _pairs(rows: int = 4, width: int = 12) -> PretrainingBatch:
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(5, 60, (rows, width), generator=g)
    ids[:, 0], ids[:, 5], ids[:, -1] = 1, 2, 2
    types = torch.zeros_like(ids)
    types[:, 6:] = 1
    positions = torch.tensor([[r, c] for r in range(rows) for c in (2, 8)])
    labels = ids[positions[:, 0], positions[:, 1]].clone()
    ids[positions[:, 0], positions[:, 1]] = 3
    return PretrainingBatch(ids, torch.ones_like(ids), types, positions, labels, torch.tensor([0, 1] * (rows // 2)))


def test_gradients_of_a_shared_layer_are_the_sum_over_its_uses():
    """ALBERT's cross-layer sharing trains: the one shared layer's gradient equals the sum of the gradients of four
    unshared copies of it."""
    shared = _albert(shared=True)
    unshared = _albert(shared=False)
    state = shared.state_dict()
    copied = {k: v for k, v in state.items() if not k.startswith("encoder.layers.")}
    for depth in range(4):
        copied.update({k.replace("encoder.layers.0.", f"encoder.layers.{depth}."): v
                       for k, v in state.items() if k.startswith("encoder.layers.0.")})
    unshared.load_state_dict(copied)
    batch = _pairs()
    for model in (shared, unshared):
        loss = TrainingLoss(model, [MaskedLM(activation="gelu_new"), SentenceOrder()])
        total, _ = loss(batch, loss.units(batch))
        total.backward()
    assert len(shared.encoder.layers) == 1
    for name, parameter in shared.encoder.layers[0].named_parameters():
        summed = sum(dict(unshared.encoder.layers[d].named_parameters())[name].grad for d in range(4))
        torch.testing.assert_close(parameter.grad, summed, rtol=1e-4, atol=1e-6)
        assert parameter.grad.abs().sum() > 0


def test_albert_for_pretraining_round_trip_through_transformers(tmp_path):
    transformers = pytest.importorskip("transformers")
    model = _albert().eval()
    save_model(model, tmp_path / "albert")
    config = json.loads((tmp_path / "albert" / "config.json").read_text())
    assert config["architectures"] == ["AlbertForPreTraining"]
    theirs = transformers.AlbertForPreTraining.from_pretrained(tmp_path / "albert").eval()
    batch = _pairs()
    everywhere = torch.stack(torch.meshgrid(torch.arange(4), torch.arange(12), indexing="ij"), -1).reshape(-1, 2)
    with torch.no_grad():
        ours = model(batch.input_ids, batch.attention_mask, batch.token_type_ids, masked_positions=everywhere)
        reference = theirs(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                           token_type_ids=batch.token_type_ids)
    torch.testing.assert_close(ours.head_logits["mlm"], reference.prediction_logits.reshape(-1, 60),
                               rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ours.head_logits["sop"], reference.sop_logits, rtol=1e-5, atol=1e-5)


def test_a_trained_albert_is_saved_as_albert_for_pretraining(tmp_path):
    """A few steps of MLM + SOP on an ALBERT encoder through the recipe; transformers reads the result with the
    same logits; MLM + SOP on a BERT encoder is saved in the native format and reloads exactly."""
    transformers = pytest.importorskip("transformers")
    from bertology.recipes.pretrain import pretrain

    (tmp_path / "assets").mkdir()
    assets = make_assets(tmp_path / "assets")
    albert = {"family": "albert", "embedding_size": 16, "num_layers": 4, "num_layer_groups": 1,
              "hidden_act": "gelu_new"}
    result = pretrain(build(tiny_config(assets, tmp_path / "albert", model=albert,
                                        data={"instances": {"kind": "sop"}}, run={"checkpoint_every": 0})))
    assert {"mlm_loss", "sop_loss", "sop_accuracy"} <= set(result.metrics)
    ours = bertology.load(result.model_dir).model
    theirs = transformers.AlbertForPreTraining.from_pretrained(result.model_dir).eval()
    batch = _pairs()
    batch.input_ids.clamp_(max=ours.config.vocab_size - 1)
    with torch.no_grad():
        mine = ours(batch.input_ids, batch.attention_mask, batch.token_type_ids)
        reference = theirs(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                           token_type_ids=batch.token_type_ids)
    torch.testing.assert_close(mine.head_logits["sop"], reference.sop_logits, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(mine.head_logits["mlm"], reference.prediction_logits, rtol=1e-5, atol=1e-5)

    bert = pretrain(build(tiny_config(assets, tmp_path / "bert", data={"instances": {"kind": "sop"}},
                                      run={"checkpoint_every": 0})))
    assert (bert.model_dir / "bertology.json").is_file()  # transformers' BERT has no sentence-order head
    reloaded = bertology.load(bert.model_dir).model
    assert [spec.name for spec in reloaded.head_specs] == ["mlm", "sop"]


@pytest.mark.parametrize("settings, message", [
    (["objectives.sop={}", "data.instances.kind=nsp"], "objectives.sop: sentence-order prediction needs"),
    (["objectives.nsp={}", "data.instances.kind=sop"], "objectives.nsp: next-sentence prediction needs"),
    (["data.instances.kind=sops"], "data.instances.kind: expected one of"),
])
def test_bad_sop_settings_name_the_key(settings, message):
    with pytest.raises(ConfigError, match=f"^{message}"):
        load_config(None, settings)


def test_sop_defaults_and_one_document():
    assert load_config(None, ["data.instances.kind=sop"]).objectives == {"mlm": {}, "sop": {}}
    with pytest.raises(DataError, match="kind 'sop'.*at least two non-empty documents"):
        create_instances(InMemoryDocuments([[[5, 6], [7, 8]]]), InstanceConfig(kind="sop"), SPECIAL)


def test_shipped_config_runs_on_brown(tmp_path):
    if not BROWN.is_dir():
        pytest.skip(f"the Brown corpus is not at {BROWN} (see ../shared/data/README.md)")
    corpus = [BROWN / f"ca0{i}" for i in range(1, 7)]
    assert run_shipped_config_briefly(ROOT / "configs" / "albert-tiny.yaml", tmp_path / "run", corpus, heldout=2) == 0
    config = json.loads((tmp_path / "run" / "model" / "config.json").read_text())
    assert config["architectures"] == ["AlbertForPreTraining"] and config["num_hidden_groups"] == 1
    assert config["embedding_size"] == 64 and config["num_hidden_layers"] == 4
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["kind"] == "eval" and rows[-1]["sop_loss"] > 0
