"""FSDP2 (``fully_shard`` per transformer block, then the root), activation checkpointing and meta-device
construction: two CPU processes (gloo) sharding a batch of b train like one process with 2b; one process under
FSDP2 resumes bitwise and saves the model with its extensions; checkpointing and meta construction change nothing."""

from __future__ import annotations

import json
import os
import socket
import sys
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from safetensors.torch import load_file

from bertology.errors import ConfigError
from bertology.model import EncoderModel, HeadSpec, preset
from bertology.recipes.pretrain import pretrain
from bertology.training import distributed as D
from bertology.training.config import PretrainConfig
from numerics import EPS32
from pretrain_helpers import build, tiny_config

HERE = Path(__file__).resolve().parent
NO_DROPOUT = {"hidden_dropout": 0.0, "attention_dropout": 0.0}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world: int, port: int, raw: dict) -> None:
    sys.path.insert(0, str(HERE))
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world))
    pretrain(build(raw))


def _train_rows(run: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if r["kind"] == "train"]


def test_two_fsdp_processes_match_one_process_with_double_batch(assets, tmp_path):
    """2 x b under FSDP2 (gloo, each block its own unit, activations checkpointed, two accumulated micro-batches
    per step) == 1 x 2b without any of it: the same losses at every step, within 8 x float32 epsilon of each,
    relative (the two sum their rows in different orders and shapes; measured on AVX2: at most 3.1e-7 on losses
    of 0.69-5.5, under one ulp of 5.5), and the same weights after the last one, within 1e-6 (measured: 8.4e-8)."""
    settings = dict(model=NO_DROPOUT, run={"eval_every": 0, "checkpoint_every": 2, "log_every": 1})
    single = tiny_config(assets, tmp_path / "single", optim={"batch_size": 8, "grad_accumulation": 2,
                                                             "total_steps": 4}, **settings)
    pretrain(build(single))
    double = tiny_config(assets, tmp_path / "double", optim={"batch_size": 4, "grad_accumulation": 2,
                                                             "total_steps": 4},
                         speed={"fsdp": True, "activation_checkpointing": True}, **settings)
    mp.spawn(_worker, args=(2, _free_port(), double), nprocs=2, join=True)

    ours, reference = _train_rows(tmp_path / "double"), _train_rows(tmp_path / "single")
    assert [r["step"] for r in ours] == [1, 2, 3, 4]
    for mine, theirs in zip(ours, reference):
        for key in ("loss", "mlm_loss", "nsp_loss"):
            assert mine[key] == pytest.approx(theirs[key], rel=8 * EPS32, abs=0), (mine["step"], key)
    weights = load_file(tmp_path / "double" / "model" / "model.safetensors")
    expected = load_file(tmp_path / "single" / "model" / "model.safetensors")
    assert weights.keys() == expected.keys()
    for key in expected:
        torch.testing.assert_close(weights[key], expected[key], rtol=0, atol=1e-6, msg=key)
    # The checkpoint written under FSDP holds the whole model too (gathered, not rank 0's shard).
    step2 = load_file(tmp_path / "double" / "checkpoints" / "step-0000002" / "model.safetensors")
    assert {k: v.shape for k, v in step2.items()} == {k: v.shape for k, v in expected.items()}


def test_fsdp_with_checkpointing_and_meta_init_trains_exactly_like_the_plain_run(assets, tmp_path):
    """One process: FSDP2 on a one-process group, activation checkpointing (dropout on: the recomputation replays
    it) and meta-device construction give the same run, bit for bit."""
    plain = tiny_config(assets, tmp_path / "plain", optim={"total_steps": 3}, run={"checkpoint_every": 0})
    pretrain(build(plain))
    fast = tiny_config(assets, tmp_path / "fast", optim={"total_steps": 3}, run={"checkpoint_every": 0},
                       speed={"fsdp": True, "activation_checkpointing": True, "meta_init": True})
    pretrain(build(fast))
    assert [r["loss"] for r in _train_rows(tmp_path / "fast")] == [r["loss"] for r in _train_rows(tmp_path / "plain")]
    weights = load_file(tmp_path / "fast" / "model" / "model.safetensors")
    for key, value in load_file(tmp_path / "plain" / "model" / "model.safetensors").items():
        assert torch.equal(weights[key], value), key


@pytest.mark.parametrize("before, after", [(True, True), (True, False), (False, True)])
def test_fsdp_resume_is_bitwise(assets, tmp_path, before, after):
    """Stopped after the checkpoint at step 2 and resumed, with FSDP2 or without (a checkpoint has the same form
    either way: whole weights, the optimizer's state numbered as without FSDP), a run ends where an uninterrupted
    one does."""
    full = tiny_config(assets, tmp_path / "full", optim={"total_steps": 4}, run={"checkpoint_every": 2},
                       speed={"fsdp": True})
    pretrain(build(full))
    part = tiny_config(assets, tmp_path / "part", optim={"total_steps": 2}, run={"checkpoint_every": 2},
                       speed={"fsdp": before})
    pretrain(build(part))
    part["optim"]["total_steps"] = 4  # extend the run (may change on resume, as may speed.fsdp)
    part["speed"]["fsdp"] = after
    pretrain(build(part), resume=True)
    weights = load_file(tmp_path / "part" / "model" / "model.safetensors")
    for key, value in load_file(tmp_path / "full" / "model" / "model.safetensors").items():
        assert torch.equal(weights[key], value), key


def _lora_trainer(tmp_path: Path, fsdp: bool):
    from bertology.objectives import MaskedLM
    from bertology.peft import apply_lora
    from bertology.training import TrainConfig, Trainer

    class Masked:
        def __init__(self, ids: torch.Tensor) -> None:
            self.input_ids = ids
            self.attention_mask = torch.ones_like(ids)
            self.token_type_ids = torch.zeros_like(ids)
            self.masked_positions = torch.tensor([[r, 2] for r in range(len(ids))])
            self.mlm_labels = ids[:, 2].clone()
            self.input_ids = ids.clone()
            self.input_ids[:, 2] = 3

        def to(self, device, non_blocking=False):
            return self

    class Source:
        def num_batches(self, epoch, batch_size, rank=0, world_size=1, drop_last=True):
            return 4

        def batches(self, epoch, batch_size, start_batch=0, rank=0, world_size=1, drop_last=True):
            g = torch.Generator().manual_seed(epoch)
            ids = torch.randint(5, 40, (4 * batch_size, 8), generator=g)
            for b in range(start_batch, 4):
                yield Masked(ids[b * batch_size:(b + 1) * batch_size])

    objective = MaskedLM()
    model = EncoderModel(preset("tiny", vocab_size=40, num_layers=2, hidden_size=32, num_heads=2,
                                intermediate_size=64, max_position_embeddings=16), objective.heads())
    model.init_weights(torch.Generator().manual_seed(0))
    torch.manual_seed(0)  # LoRA's A matrices draw from the default generator
    apply_lora(model, rank=2, targets=("query", "value"))
    config = TrainConfig.from_dict({
        "optim": {"batch_size": 4, "total_steps": 3, "lr": 1e-2, "warmup_steps": 0},
        "run": {"output_dir": str(tmp_path / ("fsdp" if fsdp else "plain")), "log_every": 1, "progress": False},
        "speed": {"threads": 1, "prefetch": 0, "fsdp": fsdp},
    })
    return Trainer(config, model, [objective], Source())


def test_fsdp_saving_keeps_extensions(tmp_path):
    """The model written under FSDP2 goes through the normal writer with the whole state gathered: LoRA modules and
    their weights are saved (native format), equal to the run without FSDP."""
    import bertology

    try:
        _lora_trainer(tmp_path, fsdp=False).train()
        trainer = _lora_trainer(tmp_path, fsdp=True)
        trainer.train()
    finally:
        D.shutdown()
    saved = json.loads((tmp_path / "fsdp" / "model" / "bertology.json").read_text())
    assert {entry["factory"] for entry in saved["extensions"].values()} == {"lora"}
    assert len(saved["extensions"]) == 4  # query and value of 2 layers
    ours = bertology.load(tmp_path / "fsdp" / "model").model
    reference = bertology.load(tmp_path / "plain" / "model").model
    theirs = reference.state_dict()
    assert sum("lora_" in key for key in theirs) == 8  # A and B of 4 projections
    assert not torch.equal(theirs["encoder.layers.0.query.lora_B"], torch.zeros_like(theirs[
        "encoder.layers.0.query.lora_B"]))  # B starts at zero: it trained
    for key, value in ours.state_dict().items():
        assert torch.equal(value, theirs[key]), key
    assert ours.state_dict().keys() == theirs.keys()


# ------------------------------------------------------------------------------------------------- the blocks


def test_transformer_blocks_are_every_encoders_unshared_layers():
    from bertology.objectives.compose import TrainingLoss
    from bertology.objectives.electra import Electra

    electra = Electra(generator_layers=2)
    model = EncoderModel(preset("tiny", vocab_size=50, num_layers=3), electra.heads())
    electra.attach(model, torch.Generator().manual_seed(1))
    blocks = D.transformer_blocks(TrainingLoss(model, [electra]))
    assert [id(b) for b in blocks] == [id(b) for b in (*model.encoder.layers, *electra.generator.encoder.layers)]
    assert len(blocks) == 5
    shared = EncoderModel(preset("tiny", vocab_size=50, num_layers=4, num_layer_groups=1))
    assert D.transformer_blocks(shared) == []  # one layer run four times stays with the root unit


def test_activation_checkpointing_gives_the_same_loss_and_gradients():
    config = preset("tiny", vocab_size=50, num_layers=2, hidden_size=32, num_heads=2, intermediate_size=64)
    ids = torch.randint(5, 50, (3, 9), generator=torch.Generator().manual_seed(0))
    grads, saved = [], []
    for checkpointed in (False, True):
        model = D.initialised_model(config, [HeadSpec("mlm", "masked_lm")], seed=0)
        if checkpointed:
            for block in D.transformer_blocks(model):
                D.checkpoint_activations(block)
        model.train()  # dropout on: the recomputation must draw the same masks
        torch.manual_seed(7)
        kept = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: kept.append(t.numel()) or t, lambda t: t):
            loss = model(ids).logits.float().square().mean()
        saved.append(sum(kept))
        loss.backward()
        grads.append((loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}))
    assert torch.equal(grads[0][0], grads[1][0])
    assert grads[0][1].keys() == grads[1][1].keys() and len(grads[0][1]) > 20
    for name, grad in grads[0][1].items():
        assert torch.equal(grad, grads[1][1][name]), name
    assert saved[1] < saved[0] / 2  # the blocks kept their inputs only


def test_a_copy_of_a_checkpointed_block_runs_its_own_weights():
    """Gradients on (the checkpointed path): a deep copy's block runs with the copy's weights, not the original's."""
    import copy

    config = preset("tiny", vocab_size=50, num_layers=1, hidden_size=32, num_heads=2, intermediate_size=64)
    model = D.initialised_model(config, [], seed=0)
    D.checkpoint_activations(model.encoder.layers[0])
    twin = copy.deepcopy(model)
    with torch.no_grad():
        for p in twin.encoder.layers[0].parameters():
            p.mul_(0.5)
    ids = torch.randint(5, 50, (2, 6), generator=torch.Generator().manual_seed(0))
    model.eval()
    twin.eval()
    plain = D.initialised_model(config, [], seed=0)
    with torch.no_grad():
        for p in plain.encoder.layers[0].parameters():
            p.mul_(0.5)
    plain.eval()
    torch.testing.assert_close(twin(ids).last_hidden_state, plain(ids).last_hidden_state, rtol=0, atol=0)
    assert not torch.equal(model(ids).last_hidden_state, twin(ids).last_hidden_state)


@pytest.mark.parametrize("overrides", [
    {},
    {"family": "albert", "embedding_size": 16, "num_layer_groups": 1, "num_layers": 3},
    {"family": "roberta", "pad_token_id": 1},
    {"pooler": False},
])
def test_meta_init_is_bitwise_ordinary_construction(overrides):
    config = preset("tiny", vocab_size=60, max_position_embeddings=40, **overrides)
    heads = [HeadSpec("mlm", "masked_lm"), HeadSpec("tags", "token", num_labels=3),
             HeadSpec("span", "token_mlp", num_labels=2)]
    if config.pooler:
        heads.append(HeadSpec("cls", "pooled", num_labels=2))
    before = torch.random.get_rng_state()
    ordinary = D.initialised_model(config, heads, seed=5)
    meta = D.initialised_model(config, heads, seed=5, meta_init=True)
    # Neither draws from the default generator: dropout later does not depend on the choice.
    assert torch.equal(torch.random.get_rng_state(), before)
    assert not any(p.is_meta for p in meta.parameters())
    expected = ordinary.state_dict()
    assert meta.state_dict().keys() == expected.keys()
    for key, value in meta.state_dict().items():
        assert value.dtype == expected[key].dtype and torch.equal(value, expected[key]), key


@pytest.mark.parametrize("key", ["fsdp", "activation_checkpointing", "meta_init"])
def test_speed_switches_must_be_booleans(key):
    with pytest.raises(ConfigError, match=f"^speed.{key}: "):
        PretrainConfig.from_dict({"speed": {key: "yes"}})


@pytest.mark.parametrize("key, message", [("meta_init", "fine-tuning starts from a model directory"),
                                          ("fsdp", "fine-tuning keeps whole models")])
def test_fine_tuning_refuses_pretraining_only_speed_settings(tmp_path, key, message):
    from bertology.recipes.finetune import FinetuneConfig

    with pytest.raises(ConfigError, match=f"^speed.{key}: {message}"):
        FinetuneConfig.from_dict({"model": str(tmp_path), "task": {"name": "sst2"}, "speed": {key: True}})


def test_electra_under_fsdp_trains_like_the_plain_run(assets, tmp_path):
    """ELECTRA's generator (an objective's module sharing the embeddings) is sharded with its own blocks; the run,
    its checkpoint and the generator it saves are those of the run without FSDP."""
    def raw(name: str, speed: dict) -> dict:
        return tiny_config(assets, tmp_path / name, model={"family": "electra"},
                           data={"instances": {"kind": "full-sentences"}},
                           objectives={"electra": {"generator_size": 0.5}}, optim={"total_steps": 3},
                           run={"checkpoint_every": 2, "eval_every": 0}, speed=speed)

    pretrain(build(raw("plain", {})))
    pretrain(build(raw("fsdp", {"fsdp": True, "activation_checkpointing": True})))
    assert [r["loss"] for r in _train_rows(tmp_path / "fsdp")] == [r["loss"] for r in _train_rows(tmp_path / "plain")]
    for part in ("model", "generator", "checkpoints/step-0000002"):
        weights = load_file(tmp_path / "fsdp" / part / "model.safetensors")
        expected = load_file(tmp_path / "plain" / part / "model.safetensors")
        assert weights.keys() == expected.keys()
        for key, value in expected.items():
            assert torch.equal(weights[key], value), (part, key)
    state = load_file(tmp_path / "fsdp" / "checkpoints" / "step-0000002" / "trainer_state.safetensors")
    reference = load_file(tmp_path / "plain" / "checkpoints" / "step-0000002" / "trainer_state.safetensors")
    assert state.keys() == reference.keys()
    for key, value in reference.items():
        assert torch.equal(state[key], value), key
