"""A run killed between two training rows and resumed writes the same rows as an uninterrupted run: the metrics
summed since the last row are part of the checkpoint, so the first row after the resume averages the same steps."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F

from bertology.model import EncoderModel, preset
from bertology.model.encoder import HeadSpec
from bertology.objectives.base import (Objective, ObjectiveOutput, classification_output, classification_summary,
                                       first_tokens)
from bertology.training import TrainConfig, Trainer, read_metrics


@dataclass
class FirstTokenLabel(Objective):
    num_labels: int = 2
    weight: float = 1.0
    name: str = "label"

    def heads(self):
        return (HeadSpec(self.name, "pooled", num_labels=self.num_labels),)

    def reads(self, batch):
        return first_tokens(batch)

    def units(self, batch):
        return torch.tensor(len(batch.labels))

    def __call__(self, passes, batch) -> ObjectiveOutput:
        logits = passes.shared.head_logits[self.name]
        return classification_output(self.name, logits, batch.labels,
                                     F.cross_entropy(logits.float(), batch.labels, reduction="sum"))

    def summarize(self, totals):
        return classification_summary(self.name, totals)


@dataclass
class Batch:
    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    token_type_ids: torch.Tensor
    labels: torch.Tensor

    def to(self, device, non_blocking=False):
        return self


class Data:
    def __init__(self):
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(6, 30, (128, 8), generator=g)
        self.labels = (self.ids[:, 1] > 17).long()

    def num_batches(self, epoch, batch_size, rank=0, world_size=1, drop_last=True):
        return len(self.ids) // (batch_size * world_size)

    def batches(self, epoch, batch_size, start_batch=0, rank=0, world_size=1, drop_last=True):
        order = torch.randperm(len(self.ids), generator=torch.Generator().manual_seed(epoch))
        for b in range(start_batch, self.num_batches(epoch, batch_size, rank, world_size)):
            rows = order[b * batch_size:(b + 1) * batch_size]
            ids = self.ids[rows]
            yield Batch(ids, torch.ones_like(ids), torch.zeros_like(ids), self.labels[rows])


class Killed(Exception):
    pass


def trainer(out, hooks=()):
    torch.manual_seed(0)  # dropout draws from the global generator, as a fresh process would seed it
    objective = FirstTokenLabel()
    model = EncoderModel(preset("tiny", vocab_size=30, num_layers=1, hidden_size=16, num_heads=2,
                                intermediate_size=32, max_position_embeddings=16), objective.heads())
    model.init_weights(torch.Generator().manual_seed(0))
    config = TrainConfig.from_dict({
        "optim": {"batch_size": 8, "total_steps": 8, "lr": 3e-3, "warmup_steps": 1},
        "run": {"output_dir": str(out), "log_every": 4, "checkpoint_every": 3, "progress": False},
        "speed": {"threads": 1, "prefetch": 0}})
    return Trainer(config, model, [objective], Data(), hooks=list(hooks))


def train_rows(out):
    return [{k: v for k, v in r.items() if k != "tokens_per_s"} for r in read_metrics(out / "metrics.jsonl")
            if r["kind"] == "train"]


@pytest.mark.parametrize("kill_at", [5, 7])  # resumed from step 3 (before the first row), from step 6
def test_the_first_row_after_a_resume_averages_the_same_steps(tmp_path, kill_at):
    trainer(tmp_path / "whole").train()

    def kill(t, report):
        if report.step == kill_at:
            raise Killed

    with pytest.raises(Killed):
        trainer(tmp_path / "killed", [kill]).train()
    resumed = trainer(tmp_path / "killed")
    assert resumed.resume()  # from the checkpoint at step 3: step 4's row needs steps 1-3 too
    resumed.train()
    whole, again = train_rows(tmp_path / "whole"), train_rows(tmp_path / "killed")
    assert [r["step"] for r in again] == [4, 8]
    assert again == whole
