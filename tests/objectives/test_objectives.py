"""MLM and NSP losses and metrics, the effective-batch normalisation of TrainingLoss, and where the shared pass
runs its last layer."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from bertology.data.dataset import PretrainingBatch
from bertology.errors import ConfigError, DataError
from bertology.model import EncoderModel, preset
from bertology.model.encoder import EncoderOutput
from bertology.objectives import (
    MaskedLM,
    NextSentence,
    Objective,
    Passes,
    TrainingLoss,
    build_objectives,
    mlm_loss,
    nsp_loss,
)


def test_mlm_loss_is_mean_negative_log_likelihood_at_selected_tokens():
    logits = torch.randn(5, 11)
    labels = torch.tensor([0, 3, 10, 3, 7])
    expected = -torch.stack([logits[i].log_softmax(-1)[labels[i]] for i in range(5)]).mean()
    torch.testing.assert_close(mlm_loss(logits, labels), expected)
    assert mlm_loss(torch.zeros(0, 11, requires_grad=True), torch.zeros(0, dtype=torch.long), "sum").item() == 0.0
    two = torch.tensor([[2.0, 0.0], [0.0, 1.0]])
    torch.testing.assert_close(nsp_loss(two, torch.tensor([0, 0])), F.cross_entropy(two, torch.tensor([0, 0])))


def test_objective_stats_and_summary():
    logits = torch.tensor([[5.0, 0, 0], [0, 5.0, 0], [0, 0, 5.0], [5.0, 0, 0]])
    labels = torch.tensor([0, 1, 0, 0])  # three of four right
    batch = PretrainingBatch(torch.zeros(2, 4, dtype=torch.long), torch.ones(2, 4, dtype=torch.long),
                             torch.zeros(2, 4, dtype=torch.long), torch.zeros(4, 2, dtype=torch.long), labels,
                             torch.tensor([1, 0]))
    output = EncoderOutput(last_hidden_state=torch.zeros(2, 4, 3),
                           head_logits={"mlm": logits, "nsp": torch.tensor([[0.0, 1.0], [0.0, 1.0]])})
    passes = Passes(None, batch, None)  # type: ignore[arg-type]
    passes.shared = output  # the shared pass, already computed
    mlm = MaskedLM()(passes, batch)
    assert mlm.stats["mlm_units"].item() == 4 and mlm.stats["mlm_correct"].item() == 3
    summary = MaskedLM().summarize({k: float(v) for k, v in mlm.stats.items()})
    assert summary["mlm_accuracy"] == 0.75
    assert summary["perplexity"] == pytest.approx(math.exp(summary["mlm_loss"]))
    nsp = NextSentence()(passes, batch)
    assert nsp.stats["nsp_correct"].item() == 1 and nsp.stats["nsp_units"].item() == 2
    no_labels = PretrainingBatch(batch.input_ids, batch.attention_mask, batch.token_type_ids,
                                 batch.masked_positions, labels, None)
    with pytest.raises(DataError, match="needs next-sentence labels"):
        NextSentence().units(no_labels)


def test_build_objectives_checks_names_and_options():
    objectives = build_objectives({"mlm": {"weight": 0.5}, "nsp": {}})
    assert [o.name for o in objectives] == ["mlm", "nsp"] and objectives[0].weight == 0.5
    with pytest.raises(ConfigError, match="objectives.rtd: unknown objective"):
        build_objectives({"rtd": {}})
    with pytest.raises(ConfigError, match="objectives.mlm.wieght: unknown key"):
        build_objectives({"mlm": {"wieght": 1}})


def _random_batch(generator: torch.Generator, rows: int, vocab: int) -> PretrainingBatch:
    lengths = torch.randint(5, 12, (rows,), generator=generator)
    width = int(lengths.max())
    mask = (torch.arange(width)[None, :] < lengths[:, None]).long()
    ids = torch.randint(5, vocab, (rows, width), generator=generator) * mask
    selected = (torch.rand(rows, width, generator=generator) < 0.3) & mask.bool()
    selected[:, 1] = True
    return PretrainingBatch(ids, mask, torch.zeros_like(ids), selected.nonzero(), ids[selected],
                            torch.randint(0, 2, (rows,), generator=generator))


def test_split_batches_give_the_gradient_of_the_whole():
    """Loss sums divided by the unit count of the effective batch: micro-batches add up to the full gradient."""
    torch.manual_seed(0)
    config = preset("tiny", vocab_size=40, num_layers=1, hidden_size=32, num_heads=2, intermediate_size=64,
                    hidden_dropout=0.0, attention_dropout=0.0)
    objectives = build_objectives({"mlm": {}, "nsp": {"weight": 0.5}})
    model = EncoderModel(config, [s for o in objectives for s in o.heads()])
    model.init_weights(torch.Generator().manual_seed(0))
    loss_module = TrainingLoss(model, objectives)
    g = torch.Generator().manual_seed(1)
    a, b = _random_batch(g, 3, 40), _random_batch(g, 5, 40)

    def grads() -> list[torch.Tensor]:
        out = [p.grad.clone() for p in model.parameters()]
        model.zero_grad()
        return out

    width = max(a.input_ids.shape[1], b.input_ids.shape[1])

    def pad(t: torch.Tensor) -> torch.Tensor:
        return F.pad(t, (0, width - t.shape[1]))

    whole = PretrainingBatch(torch.cat([pad(a.input_ids), pad(b.input_ids)]),
                             torch.cat([pad(a.attention_mask), pad(b.attention_mask)]),
                             torch.cat([pad(a.token_type_ids), pad(b.token_type_ids)]),
                             torch.cat([a.masked_positions, b.masked_positions + torch.tensor([3, 0])]),
                             torch.cat([a.mlm_labels, b.mlm_labels]),
                             torch.cat([a.next_sentence_labels, b.next_sentence_labels]))
    units = {k: v.float() for k, v in loss_module.units(whole).items()}
    loss, _ = loss_module(whole, units)
    loss.backward()
    reference = grads()
    expected = MaskedLM()(Passes(model, whole, None), whole).loss_sum / whole.mlm_labels.shape[0]
    assert expected.item() > 0
    for part in (a, b):
        loss_module(part, units)[0].backward()
    split = grads()
    for x, y in zip(reference, split):
        torch.testing.assert_close(x, y, rtol=1e-4, atol=1e-6)


class _ReadsEveryToken(Objective):
    """A toy objective that reads the last layer at every real token (as a span-boundary objective reads span
    boundaries): the shared pass must not prune the last layer for it."""

    name = "every_token"
    weight = 1.0

    def heads(self):
        return ()

    def reads(self, batch):
        return None

    def units(self, batch):
        return batch.attention_mask.sum()

    def __call__(self, passes, batch):
        from bertology.objectives import ObjectiveOutput

        h = passes.shared.last_hidden_state
        loss = (h.pow(2).sum(-1) * batch.attention_mask).sum()
        self.seen = h.detach()
        return ObjectiveOutput(loss, {"every_token_units": batch.attention_mask.sum(),
                                      "every_token_loss_sum": loss.detach()})

    def summarize(self, totals):
        return {"every_token_loss": totals["every_token_loss_sum"] / max(1.0, totals["every_token_units"])}


def _tiny_model(objectives) -> EncoderModel:
    config = preset("tiny", vocab_size=40, num_layers=2, hidden_size=32, num_heads=2, intermediate_size=64,
                    hidden_dropout=0.0, attention_dropout=0.0)
    model = EncoderModel(config, [s for o in objectives for s in o.heads()])
    model.init_weights(torch.Generator().manual_seed(0))
    return model.eval()


def test_the_last_layer_runs_where_any_objective_reads():
    batch = _random_batch(torch.Generator().manual_seed(3), 4, 40)
    objectives = [MaskedLM(), NextSentence()]
    loss_module = TrainingLoss(_tiny_model(objectives), objectives)
    at = loss_module.last_layer_at(batch)
    assert at is not None
    rows = {tuple(p) for p in at.tolist()}
    assert {tuple(p) for p in batch.masked_positions.tolist()} <= rows and {(r, 0) for r in range(4)} <= rows
    # With MLM + NSP alone the last layer is pruned: zero away from masked tokens and [CLS].
    shared = Passes(loss_module.model, batch, at).shared
    untouched = torch.ones(batch.input_ids.shape, dtype=torch.bool)
    untouched[at[:, 0], at[:, 1]] = False
    untouched &= batch.attention_mask.bool()
    assert untouched.any() and shared.last_hidden_state[untouched].abs().sum() == 0

    every = _ReadsEveryToken()
    both = [MaskedLM(), NextSentence(), every]
    loss_module = TrainingLoss(_tiny_model(both), both)
    assert loss_module.last_layer_at(batch) is None
    units = {k: v.float() for k, v in loss_module.units(batch).items()}
    loss_module(batch, units)
    full = loss_module.model(batch.input_ids, batch.attention_mask, batch.token_type_ids).last_hidden_state
    real = batch.attention_mask.bool()
    torch.testing.assert_close(every.seen[real], full[real].detach())
    assert every.seen[real].abs().min() > 0


def test_an_objective_may_run_passes_of_its_own():
    """A generator -> discriminator objective: a second forward pass on corrupted ids, its own units and stats."""
    from bertology.objectives import ObjectiveOutput

    class Replaced(Objective):
        name, weight = "replaced", 1.0

        def heads(self):
            return ()

        def reads(self, batch):
            return batch.masked_positions[:0]  # reads nothing of the shared pass

        def units(self, batch):
            return torch.tensor(batch.input_ids.shape[0])

        def __call__(self, passes, batch):
            corrupted = batch.input_ids.clone()
            corrupted[batch.masked_positions[:, 0], batch.masked_positions[:, 1]] = 7
            out = passes.run(corrupted, batch.attention_mask)
            loss = out.last_hidden_state[:, 0].pow(2).sum()
            return ObjectiveOutput(loss, {"replaced_units": self.units(batch), "replaced_loss_sum": loss.detach()})

        def summarize(self, totals):
            return {"replaced_loss": totals["replaced_loss_sum"] / totals["replaced_units"]}

    batch = _random_batch(torch.Generator().manual_seed(4), 3, 40)
    objectives = [MaskedLM(), Replaced()]
    loss_module = TrainingLoss(_tiny_model(objectives), objectives)
    units = {k: v.float() for k, v in loss_module.units(batch).items()}
    loss, stats = loss_module(batch, units)
    loss.backward()
    assert set(stats) >= {"mlm_units", "replaced_units"} and math.isfinite(loss.item())
    summary = loss_module.summarize({k: float(v) for k, v in stats.items()})
    assert summary["loss"] == pytest.approx(summary["mlm_loss"] + summary["replaced_loss"])


def test_two_objectives_with_one_name_are_refused():
    objectives = [MaskedLM(), MaskedLM()]
    with pytest.raises(ConfigError, match="two objectives are named 'mlm'"):
        TrainingLoss(_tiny_model(objectives[:1]), objectives)
