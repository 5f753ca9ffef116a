"""Two CPU processes (gloo) x batch b train to the same weights as one process x batch 2b, and every training
instance is seen exactly once per epoch across the ranks."""

from __future__ import annotations

import json
import os
import socket
import sys
from pathlib import Path

import torch
import torch.multiprocessing as mp
from safetensors.torch import load_file

from bertology.recipes.pretrain import pretrain
from pretrain_helpers import build, tiny_config

HERE = Path(__file__).resolve().parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world: int, port: int, raw: dict, seen_dir: str) -> None:
    sys.path.insert(0, str(HERE))
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world))
    seen: list[list[int]] = []

    def record(trainer, report):
        seen.append([i for ids in report.instance_ids for i in ids.tolist()] + [report.epoch])

    pretrain(build(raw), hooks=[record])
    Path(seen_dir, f"rank{rank}.json").write_text(json.dumps(seen))


def test_two_processes_match_one_process_with_double_batch(assets, tmp_path):
    settings = dict(model={"hidden_dropout": 0.0, "attention_dropout": 0.0},
                    run={"eval_every": 0, "checkpoint_every": 0, "log_every": 2})
    single = tiny_config(assets, tmp_path / "single", optim={"batch_size": 8, "total_steps": 3}, **settings)
    pretrain(build(single))
    # Two ranks of batch 4: the same 8 instances per step as the single process (see the dataset's rank split).
    double = tiny_config(assets, tmp_path / "double", optim={"batch_size": 4, "total_steps": 3}, **settings)
    seen_dir = tmp_path / "seen"
    seen_dir.mkdir()
    mp.spawn(_worker, args=(2, _free_port(), double, str(seen_dir)), nprocs=2, join=True)

    ours = load_file(tmp_path / "double" / "model" / "model.safetensors")
    reference = load_file(tmp_path / "single" / "model" / "model.safetensors")
    for key in reference:
        torch.testing.assert_close(ours[key], reference[key], rtol=1e-4, atol=1e-5, msg=key)
    metrics = [json.loads(line) for line in (tmp_path / "double" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics if m["kind"] == "train"] == [2, 3]  # rank 0 alone wrote, once per step


def test_every_instance_once_per_epoch_across_ranks(assets, tmp_path):
    from bertology.data.shards import TokenizedCorpus
    from bertology.recipes.pretrain import build_datasets, build_tokenizer

    raw = tiny_config(assets, tmp_path / "run", optim={"batch_size": 2},
                      run={"eval_every": 0, "checkpoint_every": 0, "log_every": 0})
    config = build(raw)
    tokenizer = build_tokenizer(config)
    train, _ = build_datasets(config, tokenizer, TokenizedCorpus(assets["shards"]), None)
    count = train.num_instances(0)
    steps_per_epoch = count // 4  # 2 ranks x batch 2, the remainder dropped
    raw["optim"]["total_steps"] = steps_per_epoch + 1  # one step into the second epoch
    seen_dir = tmp_path / "seen"
    seen_dir.mkdir()
    mp.spawn(_worker, args=(2, _free_port(), raw, str(seen_dir)), nprocs=2, join=True)
    per_rank = [json.loads((seen_dir / f"rank{r}.json").read_text()) for r in range(2)]
    first_epoch = [i for rank in per_rank for step in rank[:steps_per_epoch] for i in step[:-1]]
    assert len(first_epoch) == steps_per_epoch * 4
    assert len(set(first_epoch)) == len(first_epoch)  # no instance twice
    assert set(first_epoch) <= set(range(count)) and len(set(first_epoch)) >= count - 3  # all but the dropped tail
    rank0, rank1 = ({i for step in rank[:steps_per_epoch] for i in step[:-1]} for rank in per_rank)
    assert not rank0 & rank1
    assert per_rank[0][-1][-1] == 1  # the last step read from the second epoch
