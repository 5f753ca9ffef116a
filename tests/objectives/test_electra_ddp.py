"""ELECTRA under DDP: two CPU processes (gloo) x batch b end with the same discriminator and generator as one
process x batch 2b (the generator's parameters, its embeddings shared with the discriminator, and both losses'
per-unit normalisation over the effective batch)."""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from safetensors.torch import load_file

HELPERS = Path(__file__).resolve().parents[1] / "training"
sys.path.insert(0, str(HELPERS))
from pretrain_helpers import build, make_assets, tiny_config  # noqa: E402


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world: int, port: int, raw: dict) -> None:
    sys.path.insert(0, str(HELPERS))
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world))
    from bertology.recipes.pretrain import pretrain

    pretrain(build(raw))


@pytest.mark.slow
def test_two_processes_match_one_process_with_double_batch(tmp_path):
    from bertology.recipes.pretrain import pretrain

    assets = make_assets(tmp_path)
    settings = dict(model={"family": "electra", "hidden_dropout": 0.0, "attention_dropout": 0.0},
                    data={"instances": {"kind": "full-sentences"}},
                    objectives={"electra": {"generator_size": 0.5}},
                    run={"eval_every": 0, "checkpoint_every": 0, "log_every": 3})
    single = tiny_config(assets, tmp_path / "single", optim={"batch_size": 8, "total_steps": 3}, **settings)
    pretrain(build(single))
    double = tiny_config(assets, tmp_path / "double", optim={"batch_size": 4, "total_steps": 3}, **settings)
    mp.spawn(_worker, args=(2, _free_port(), double), nprocs=2, join=True)
    for part in ("model", "generator"):
        ours = load_file(tmp_path / "double" / part / "model.safetensors")
        reference = load_file(tmp_path / "single" / part / "model.safetensors")
        assert ours.keys() == reference.keys()
        for key in reference:
            torch.testing.assert_close(ours[key], reference[key], rtol=1e-4, atol=1e-5, msg=f"{part} {key}")
