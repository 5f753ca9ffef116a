"""Checkpoints hold the trainer state as safetensors + JSON: what the trainer restores comes back exactly, nothing
is unpickled, corrupt files give one-line errors naming the file, and files get the usual permissions."""

from __future__ import annotations

import copy
import json
import math
import os
import random
import stat

import numpy as np
import pytest
import torch
from torch import nn

from bertology.errors import CheckpointError
from bertology.model.config import TransformerConfig
from bertology.model.encoder import EncoderModel
from bertology.training.checkpoint import (
    STATE_JSON,
    STATE_PT,
    STATE_TENSORS,
    TrainingState,
    capture_rng,
    decode_state,
    encode_state,
    list_checkpoints,
    prune_checkpoints,
    read_checkpoint,
    restore_rng,
    save_checkpoint,
)


@pytest.fixture(scope="module")
def model() -> EncoderModel:
    torch.manual_seed(0)
    config = TransformerConfig(vocab_size=50, hidden_size=16, num_layers=2, num_heads=2, intermediate_size=32,
                           max_position_embeddings=32)
    return EncoderModel(config)


def round_trip(tmp_path, model, trainer_state, step=3):
    state = TrainingState(step=step, epoch=1, batch=7, tokens=1234, config={"optim": {"lr": 1e-3}})
    path = save_checkpoint(tmp_path / "run", model, None, state, trainer_state)
    model_state, read_state, read_trainer = read_checkpoint(path, model)
    assert read_state == state
    expected = model.state_dict()
    assert model_state.keys() == expected.keys()
    assert all(torch.equal(model_state[k], expected[k]) for k in expected)
    return read_trainer


def assert_same(a, b):
    """Equal structure, types and values; tensors bitwise equal with the same dtype and shape; nan == nan."""
    assert type(a) is type(b), (a, b)
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b), (a, b)
    elif isinstance(a, dict):
        assert list(a) == list(b)
        for key in a:
            assert_same(a[key], b[key])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            assert_same(x, y)
    elif isinstance(a, float) and math.isnan(a):
        assert math.isnan(b)
    else:
        assert a == b


# ------------------------------------------------------------------------------------------------------ serializer
def test_generic_structure_round_trips_through_files(tmp_path, model):
    base = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    state = {
        "floats": [0.1, -0.0, math.inf, -math.inf, math.nan, 1e-300, 1.0],
        "ints_and_bools": [0, 1, True, False, 2**40, -3],
        "none": None,
        "text": "ünïcode / slashes",
        "tuples": (1, (2.5, None), ()),
        "int_keys": {0: {"step": torch.tensor(3.0)}, 10: "x"},
        "mixed_keys": {0: "int", "0": "str", (1, 2): "tuple"},
        "looks_like_a_tag": {"__tensor__": "not a tensor"},
        "empty": {},
        "shared": [base, base, base[1], base.t(), base[:, ::2]],
        "dtypes": [torch.tensor([1, 2], dtype=torch.uint8), torch.tensor([True, False]),
                   torch.tensor([1.5], dtype=torch.bfloat16), torch.tensor([2**62], dtype=torch.int64),
                   torch.zeros(0, 3), torch.tensor(7, dtype=torch.int32)],
        "a/b": torch.ones(1),
        "a": {"b": torch.zeros(1)},
    }
    original = copy.deepcopy(state)
    read = round_trip(tmp_path, model, state)
    assert_same(read, original)
    assert all(not t.is_shared() for t in read["shared"])
    # The encoded form is plain JSON (no NaN literals), and its tensors are all that the safetensors file holds.
    encoded, tensors = encode_state(state)
    text = json.dumps(encoded, allow_nan=False)
    assert_same(decode_state(json.loads(text), tensors), original)


def test_unstorable_values_are_refused_when_writing():
    with pytest.raises(TypeError, match="at a/0: cannot store a set"):
        encode_state({"a": [{1, 2}]})


def test_adamw_and_lambdalr_round_trip_take_the_same_next_step(tmp_path, model):
    def make():
        torch.manual_seed(1)
        net = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3))
        decay = [p for n, p in net.named_parameters() if n.endswith("weight")]
        no_decay = [p for n, p in net.named_parameters() if n.endswith("bias")]
        optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01, "max_norm": math.inf},
                                       {"params": no_decay, "weight_decay": 0.0, "max_norm": 1.0}], lr=1e-2)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / 3) * 0.9 ** s)
        return net, optimizer, scheduler

    def step(net, optimizer, scheduler, seed):
        generator = torch.Generator().manual_seed(seed)
        x, y = torch.randn(5, 4, generator=generator), torch.randn(5, 3, generator=generator)
        optimizer.zero_grad()
        nn.functional.mse_loss(net(x), y).backward()
        optimizer.step()
        scheduler.step()

    net, optimizer, scheduler = make()
    for seed in range(4):
        step(net, optimizer, scheduler, seed)
    trainer_state = {"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
                     "objective_modules": net.state_dict(), "rng": [capture_rng()], "world_size": 1}
    read = round_trip(tmp_path, model, trainer_state)
    assert_same(read["optimizer"], optimizer.state_dict())
    assert set(read["optimizer"]["state"]) == {0, 1, 2, 3}  # int parameter ids, not JSON's strings
    assert read["optimizer"]["state"][0]["step"].ndim == 0
    assert isinstance(read["optimizer"]["param_groups"][0]["betas"], tuple)
    assert_same(read["scheduler"], scheduler.state_dict())
    assert read["world_size"] == 1

    net2, optimizer2, scheduler2 = make()
    net2.load_state_dict(read["objective_modules"])
    optimizer2.load_state_dict(read["optimizer"])
    scheduler2.load_state_dict(read["scheduler"])
    step(net, optimizer, scheduler, 99)
    step(net2, optimizer2, scheduler2, 99)
    for a, b in zip(net.parameters(), net2.parameters()):
        assert torch.equal(a, b)
    assert scheduler.get_last_lr() == scheduler2.get_last_lr()
    assert_same(optimizer2.state_dict(), optimizer.state_dict())


def draws():
    return ([random.random() for _ in range(3)], random.gauss(0, 1), np.random.rand(3).tolist(),
            np.random.standard_normal(), torch.rand(3), torch.randn(2))


@pytest.mark.parametrize("cached_gaussians", [False, True])
def test_rng_streams_are_restored_bitwise_from_a_written_checkpoint(tmp_path, model, cached_gaussians):
    random.seed(5)
    np.random.seed(5)
    torch.manual_seed(5)
    if cached_gaussians:  # leave a cached second Gaussian in Python's and NumPy's state
        random.gauss(0, 1)
        np.random.standard_normal()
    rng = capture_rng()
    expected = draws()
    read = round_trip(tmp_path, model, {"rng": [rng]})
    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)
    restore_rng(read["rng"][0])
    again = draws()
    assert again[:4] == expected[:4]
    assert torch.equal(again[4], expected[4]) and torch.equal(again[5], expected[5])


# ---------------------------------------------------------------------------------------------- nothing unpickled
class _CreatesFile:
    """Unpickling this creates ``path``: a stand-in for any code a pickle can run."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_a_pickled_trainer_state_is_refused_and_never_unpickled(tmp_path, model):
    # The payload works: loading it the way older versions did creates the file.
    probe = tmp_path / "probe-marker"
    torch.save({"optimizer": _CreatesFile(probe)}, tmp_path / "probe.pt")
    torch.load(tmp_path / "probe.pt", weights_only=False)
    assert probe.exists()

    marker = tmp_path / "marker"
    path = save_checkpoint(tmp_path / "run", model, None, TrainingState(step=2), {"world_size": 1})
    os.remove(path / STATE_TENSORS)
    (path / STATE_JSON).write_text(json.dumps({"step": 2, "epoch": 0, "batch": 0, "tokens": 0, "config": {}}))
    torch.save({"optimizer": _CreatesFile(marker)}, path / STATE_PT)
    with pytest.raises(CheckpointError) as caught:
        read_checkpoint(path, model)
    message = str(caught.value)
    assert str(path / STATE_PT) in message and "older" in message and "pickle" in message
    assert "\n" not in message
    assert not marker.exists()


def test_a_pickled_model_file_is_never_unpickled(tmp_path, model):
    marker = tmp_path / "marker"
    path = save_checkpoint(tmp_path / "run", model, None, TrainingState(step=2), {"world_size": 1})
    os.remove(path / "model.safetensors")
    torch.save({"w": _CreatesFile(marker)}, path / "pytorch_model.bin")
    with pytest.raises(CheckpointError, match="no model.safetensors"):
        read_checkpoint(path, model)
    assert not marker.exists()


# ------------------------------------------------------------------------------------------------- corrupt files
@pytest.fixture
def checkpoint(tmp_path, model):
    state = {"optimizer": {"state": {0: {"step": torch.tensor(1.0)}}, "param_groups": []}, "world_size": 1}
    return save_checkpoint(tmp_path / "run", model, None, TrainingState(step=1), state)


def refused(path, model, file, *fragments):
    with pytest.raises(CheckpointError) as caught:
        read_checkpoint(path, model)
    message = str(caught.value)
    assert "\n" not in message and str(path / file) in message, message
    for fragment in fragments:
        assert fragment in message, message


@pytest.mark.parametrize("name", ["model.safetensors", STATE_TENSORS])
@pytest.mark.parametrize("damage", ["truncated", "garbage", "empty"])
def test_damaged_safetensors_files_are_named(checkpoint, model, name, damage):
    file = checkpoint / name
    data = file.read_bytes()
    file.write_bytes({"truncated": data[: len(data) // 2], "garbage": b"not safetensors at all " * 4,
                      "empty": b""}[damage])
    refused(checkpoint, model, name, "safetensors")


def test_invalid_json_is_named(checkpoint, model):
    file = checkpoint / STATE_JSON
    file.write_text(file.read_text()[:-20])
    refused(checkpoint, model, STATE_JSON, "invalid JSON")


def test_a_placeholder_naming_a_missing_tensor_is_named(checkpoint, model):
    file = checkpoint / STATE_JSON
    document = json.loads(file.read_text())
    document["trainer"]["extra"] = {"__tensor__": "no/such/tensor"}
    file.write_text(json.dumps(document))
    refused(checkpoint, model, STATE_JSON, "no/such/tensor", STATE_TENSORS)


@pytest.mark.parametrize("change,fragment", [
    ({"format": 99}, "newer bertology version"),
    ({"step": "three"}, "step must be a non-negative integer"),
    ({"surprise": 1}, "unknown keys surprise"),
    ({"trainer": {"x": {"__tuple__": 3}}}, "__tuple__ must hold a list"),
    ({"trainer": {"x": {"__float__": "big"}}}, "invalid __float__ value"),
])
def test_an_invalid_state_document_is_named(checkpoint, model, change, fragment):
    file = checkpoint / STATE_JSON
    file.write_text(json.dumps({**json.loads(file.read_text()), **change}))
    refused(checkpoint, model, STATE_JSON, fragment)


def test_missing_trainer_tensors_file(checkpoint, model):
    os.remove(checkpoint / STATE_TENSORS)
    with pytest.raises(CheckpointError, match=f"not a training checkpoint \\(no {STATE_TENSORS}\\)"):
        read_checkpoint(checkpoint, model)


# --------------------------------------------------------------------------------------------------- permissions
@pytest.mark.parametrize("umask,file_mode,dir_mode", [(0o022, 0o644, 0o755), (0o002, 0o664, 0o775),
                                                      (0o077, 0o600, 0o700)])
def test_checkpoint_files_honour_the_umask(tmp_path, model, umask, file_mode, dir_mode):
    from bertology.tokenization import train_tokenizer

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the cat sat on the mat .\nthe dog ran over the road .\n" * 5, encoding="utf-8")
    tokenizer = train_tokenizer([str(corpus)], "wordpiece", 60, show_progress=False, min_frequency=1)
    previous = os.umask(umask)
    try:
        path = save_checkpoint(tmp_path / "run", model, tokenizer, TrainingState(step=1),
                               {"optimizer": {"state": {0: {"exp_avg": torch.ones(3)}}}})
    finally:
        os.umask(previous)
    names = sorted(p.name for p in path.iterdir())
    assert {"config.json", "model.safetensors", STATE_TENSORS, STATE_JSON, "tokenizer.json"} <= set(names)
    assert STATE_PT not in names
    assert stat.S_IMODE(path.stat().st_mode) == dir_mode
    modes = {p.name: oct(stat.S_IMODE(p.stat().st_mode)) for p in path.iterdir()}
    assert modes == {name: oct(file_mode) for name in names}
    assert [step for step, _ in list_checkpoints(tmp_path / "run")] == [1]


# ------------------------------------------------------------------------------------------------------- pruning
def test_prune_removes_a_killed_writers_leftovers_and_recovers_a_moved_aside_checkpoint(tmp_path, model):
    import subprocess
    import sys

    from bertology import io

    out = tmp_path / "run"
    for step in (1, 2, 3):
        save_checkpoint(out, model, None, TrainingState(step=step), {"world_size": 1})
    root = out / "checkpoints"
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True)
    tag = f"{int(dead.stdout)}-{io._HOST}"
    half_written = root / f".step-0000004.{tag}.abc123.tmp"
    half_written.mkdir()
    (half_written / "model.safetensors").write_bytes(b"partial")
    # Killed between moving step 2 aside and renaming its replacement in: step 2 must come back, not be deleted.
    (root / "step-0000002").rename(root / f".step-0000002.{tag}.old")
    live = root / f".step-0000005.{os.getpid()}-{io._HOST}.def456.tmp"  # a writer still running (this process)
    live.mkdir()
    removed = prune_checkpoints(out, keep_last=2)
    assert half_written in removed and not half_written.exists()
    assert [step for step, _ in list_checkpoints(out)] == [2, 3]
    assert (root / "step-0000001") in removed
    assert live.exists()
