"""CUDA graphs need static shapes: `static_batch` pads a pretraining batch (filler rows, padded targets) so that the
losses, unit counts and gradients stay those of the batch as it was. The capture itself needs a GPU
(benchmarks/gpu.py checks it there); the padding, the objectives' ignored targets and the bad settings are tested
here."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from bertology.data.dataset import PretrainingBatch
from bertology.errors import ConfigError
from bertology.model import EncoderModel, HeadSpec, Layout, preset
from bertology.objectives.base import IGNORE, Objective
from bertology.objectives.compose import TrainingLoss
from bertology.objectives.mlm import MaskedLM, mlm_loss
from bertology.objectives.nsp import NextSentence
from bertology.training.config import OptimConfig, RunConfig, SpeedConfig, TrainConfig
from bertology.training.graphs import check_static_objectives, static_batch
from bertology.training.trainer import Trainer


def random_batch(seed: int, rows: int = 5, width: int = 37, vocab: int = 60) -> PretrainingBatch:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(3, width + 1, (rows,), generator=g)
    lengths[0] = width
    mask = (torch.arange(width) < lengths[:, None]).long()
    ids = torch.randint(5, vocab, (rows, width), generator=g) * mask
    selected = (torch.rand(rows, width, generator=g) < 0.2) & mask.bool()
    return PretrainingBatch(input_ids=ids, attention_mask=mask, token_type_ids=(torch.arange(width) > 4).long() * mask,
                            masked_positions=selected.nonzero(), mlm_labels=ids[selected],
                            next_sentence_labels=torch.randint(0, 2, (rows,), generator=g),
                            instance_ids=torch.arange(rows))


@pytest.mark.parametrize("bucket", [1, 16, 64, 256])
@pytest.mark.parametrize("seed", range(4))
def test_static_shapes_depend_on_the_bucket_only(seed, bucket):
    batch = random_batch(seed, rows=3 + seed, width=20 + 11 * seed)
    static = static_batch(batch, bucket, max_width=128)
    rows, width = batch.input_ids.shape
    real = int(batch.attention_mask.sum())
    tokens = int(static.attention_mask.sum())
    assert tokens % bucket == 0 and real < tokens <= real + bucket + static.input_ids.shape[0] - rows
    assert static.input_ids.shape[1] % 64 == 0 and static.input_ids.shape[1] >= width
    filler = static.attention_mask[rows:]
    assert (filler.sum(1) >= 1).all() and (filler.sum(1) <= static.input_ids.shape[1]).all()
    assert torch.equal(static.input_ids[:rows, :width], batch.input_ids)
    assert torch.equal(static.attention_mask[:rows, :width], batch.attention_mask)
    masked = len(batch.mlm_labels)
    assert len(static.mlm_labels) % max(1, bucket // 4) == 0 and len(static.mlm_labels) > masked
    assert torch.equal(static.mlm_labels[:masked], batch.mlm_labels) and (static.mlm_labels[masked:] == IGNORE).all()
    assert static.attention_mask[tuple(static.masked_positions[masked:].T)].all()  # padded targets read real tokens
    assert torch.equal(static.next_sentence_labels[:rows], batch.next_sentence_labels)
    assert (static.next_sentence_labels[rows:] == IGNORE).all()
    # every row, filler included, is one sequence of the packing: the sequence count is fixed by the shapes
    assert len(Layout(static.attention_mask).cu_seqlens) == static.input_ids.shape[0] + 1


def test_width_stays_within_the_model_positions():
    batch = random_batch(0, width=50)
    assert static_batch(batch, 64, max_width=50).input_ids.shape[1] == 50
    assert static_batch(batch, 64, max_width=512).input_ids.shape[1] == 64


def loss_and_grads(model, loss_module, batch):
    model.zero_grad(set_to_none=True)
    units = loss_module.units(batch)
    loss, stats = loss_module(batch, {n: u.float() for n, u in units.items()})
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return units, stats, grads


@pytest.mark.parametrize("seed", range(3))
def test_a_static_batch_gives_the_same_losses_units_and_gradients(seed):
    torch.manual_seed(seed)
    torch.set_num_threads(1)
    config = preset("tiny", vocab_size=60, hidden_dropout=0.0, attention_dropout=0.0, max_position_embeddings=128)
    objectives = [MaskedLM(), NextSentence()]
    model = EncoderModel(config, [h for o in objectives for h in o.heads()])
    model.init_weights(torch.Generator().manual_seed(seed))
    loss_module = TrainingLoss(model, objectives)
    batch = random_batch(seed)
    units, stats, grads = loss_and_grads(model, loss_module, batch)
    static_units, static_stats, static_grads = loss_and_grads(model, loss_module, static_batch(batch, 32, 128))
    assert {n: int(u) for n, u in static_units.items()} == {n: int(u) for n, u in units.items()}
    for key, value in stats.items():
        torch.testing.assert_close(static_stats[key].double(), value.double(), rtol=1e-5, atol=1e-5)
    assert static_grads.keys() == grads.keys()
    for name, grad in grads.items():
        torch.testing.assert_close(static_grads[name], grad, rtol=1e-5, atol=1e-6, msg=name)


def test_mlm_loss_skips_ignored_targets_like_cross_entropy():
    torch.manual_seed(0)
    logits = torch.randn(9, 17, requires_grad=True)
    labels = torch.tensor([3, IGNORE, 0, 16, IGNORE, 5, 5, 1, IGNORE])
    ours = mlm_loss(logits, labels, reduction="sum")
    (grad_ours,) = torch.autograd.grad(ours, logits)
    theirs = F.cross_entropy(logits, labels, reduction="sum", ignore_index=IGNORE)
    (grad_theirs,) = torch.autograd.grad(theirs, logits)
    torch.testing.assert_close(ours, theirs)
    torch.testing.assert_close(grad_ours, grad_theirs)
    assert (grad_ours[labels == IGNORE] == 0).all()


def test_bad_settings_are_named(tmp_path):
    for other in ("compile", "fsdp", "activation_checkpointing"):
        with pytest.raises(ConfigError, match=f"speed.cuda_graphs: cannot be combined with speed.{other}"):
            SpeedConfig(cuda_graphs=True, **{other: True})
    with pytest.raises(ConfigError, match="speed.graph_bucket: must be >= 1"):
        SpeedConfig(graph_bucket=0)
    model = EncoderModel(preset("tiny", vocab_size=60), [HeadSpec("mlm", "masked_lm")])
    config = TrainConfig(optim=OptimConfig(batch_size=2, total_steps=1), run=RunConfig(output_dir=str(tmp_path)),
                         speed=SpeedConfig(device="cpu", threads=1, prefetch=0, cuda_graphs=True))
    with pytest.raises(ConfigError, match="speed.cuda_graphs: needs a CUDA device; this run's is cpu"):
        Trainer(config, model, [MaskedLM()], None)  # type: ignore[arg-type]

    for auto_or_off in (None, False):  # auto: graphs only where they run (a GPU); never an error
        speed = SpeedConfig(device="cpu", threads=1, prefetch=0, cuda_graphs=auto_or_off, compile=True)
        trainer = Trainer(TrainConfig(optim=config.optim, run=config.run, speed=speed), model, [MaskedLM()], None)  # type: ignore[arg-type]
        assert trainer.graphs is None

    class Unpadded(Objective):  # static_shapes: the base class's False
        name = "rtd"

    with pytest.raises(ConfigError, match="objective 'rtd' does not take batches padded to static shapes"):
        check_static_objectives([MaskedLM(), Unpadded()])
    with pytest.raises(ConfigError, match="batches of type dict cannot be given static shapes"):
        static_batch({"input_ids": torch.zeros(1, 1)}, 8, 8)
