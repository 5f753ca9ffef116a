"""Continuous batching (`bertology.generation.RunningBatch`): requests that join a running batch at different steps,
with prompts of different lengths, are decoded together and each gets `generate`'s tokens for its prompt alone
(greedy, and sampled with the same seed); cancelled and finished requests leave and free their rows; the cache
stays as wide as its longest row."""

from __future__ import annotations

import pytest
import torch
from transformer_helpers import tiny_config

from bertology import generate
from bertology.generation import Group, RunningBatch, make_settings
from bertology.model import HeadSpec
from bertology.model.transformer import DecoderModel, Seq2SeqModel

PAD, EOS = 3, 2


@pytest.fixture(autouse=True)
def _seeded():
    torch.manual_seed(0)
    torch.set_num_threads(1)


def build(kind: str, positions: str = "learned"):
    torch.manual_seed(7)
    config = tiny_config(vocab_size=40, max_position_embeddings=48, positions=positions, eos_token_id=EOS,
                         pad_token_id=PAD, decoder_start_token_id=0, initializer_range=0.5)
    cls = DecoderModel if kind == "decoder" else Seq2SeqModel
    model = cls(config, [HeadSpec("lm", "tied_lm")])
    model.init_weights(torch.Generator().manual_seed(3))
    return model.eval()


MODELS = [("decoder", "learned"), ("seq2seq", "learned"), ("seq2seq", "relative"), ("decoder", "relative")]


def solo(model, prompt, rows=1, **options):
    ids = torch.tensor([prompt] * rows)
    out = generate(model, ids, torch.ones_like(ids), **options)
    start = len(prompt) if isinstance(model, DecoderModel) else 1
    return out[:, start:].tolist()


def drain(batch, groups, outputs):
    """Steps until `groups` have all finished, collecting each group's rows' tokens."""
    while any(not g.done for g in groups):
        for chosen in batch.step():
            for row, (token, live) in enumerate(zip(chosen.tokens, chosen.live)):
                outputs.setdefault(id(chosen.group), [[] for _ in range(chosen.group.rows)])[row].append(token)


@pytest.mark.parametrize("kind, positions", MODELS)
def test_requests_joining_at_different_steps_get_their_solo_tokens(kind, positions):
    model = build(kind, positions)
    prompts = [[5, 9, 11, 7], [8, 6, 30, 21, 17, 12, 4, 9, 10], [13], [22, 23, 24, 25, 26, 27]]
    news = [12, 7, 15, 9]
    batch = RunningBatch(model)
    settings = [make_settings(model.config, max_new_tokens=n, eos_token_id=[]) for n in news]
    groups = [Group(s, rows=1) for s in settings]
    outputs: dict[int, list[list[int]]] = {}
    seen_rows = []
    batch.add(prompts[0], groups[0])
    for k in range(1, len(prompts)):  # one more request joins after every two steps
        for _ in range(2):
            for chosen in batch.step():
                outputs.setdefault(id(chosen.group), [[]])[0].append(chosen.tokens[0])
            seen_rows.append(batch.rows)
        batch.add(prompts[k], groups[k])
    drain(batch, groups, outputs)
    assert max(seen_rows) >= 3  # they really shared the batch
    for prompt, new, group in zip(prompts, news, groups):
        assert outputs[id(group)] == solo(model, prompt, max_new_tokens=new, eos_token_id=[])
    assert len(batch) == 0 and batch.rows == 0 and batch.step() == []


@pytest.mark.parametrize("kind", ["decoder", "seq2seq"])
def test_the_same_seed_gives_generates_draws_and_rows_stop_at_eos(kind):
    model = build(kind)
    prompt = [5, 9, 11]
    options = {"max_new_tokens": 10, "do_sample": True, "temperature": 0.9, "top_p": 0.95}
    free = solo(model, prompt, rows=3, seed=11, eos_token_id=[], **options)
    eos = free[1][3]  # row 1 says EOS at its fourth token
    expected = solo(model, prompt, rows=3, seed=11, eos_token_id=eos, pad_token_id=PAD, **options)
    batch = RunningBatch(model)
    other = Group(make_settings(model.config, max_new_tokens=14, eos_token_id=[]), rows=1)
    batch.add([8, 8, 6, 30, 21], other)
    batch.step()
    settings = make_settings(model.config, eos_token_id=eos, pad_token_id=PAD, seed=11, **options)
    group = Group(settings, rows=3, generator=torch.Generator().manual_seed(11), logprobs=2)
    batch.add(prompt, group)
    outputs: dict[int, list[list[int]]] = {}
    drain(batch, [group, other], outputs)
    assert outputs[id(group)] == expected
    row = outputs[id(group)][1]  # until its EOS, the draws of the run without one; then padding
    end = free[1].index(eos) + 1
    assert row[:end] == free[1][:end] and set(row[end:]) == {PAD}


def test_cancelled_and_finished_groups_free_their_rows_and_the_cache_shrinks():
    model = build("decoder")
    batch = RunningBatch(model)
    long = Group(make_settings(model.config, max_new_tokens=6, eos_token_id=[]), rows=2)
    short = Group(make_settings(model.config, max_new_tokens=20, eos_token_id=[]), rows=1)
    batch.add(list(range(4, 24)), long)  # a 20-token prompt
    batch.add([5, 6], short)
    assert batch.rows == 3 and batch.step_state.mask.shape[1] == 20
    batch.step()
    batch.cancel(long)
    assert batch.rows == 3  # it leaves at the next step
    chosen = batch.step()
    assert [c.group for c in chosen] == [short] and batch.rows == 1
    # the cache now holds the short request's 2 + 2 positions, not the long prompt's 20 + 2
    assert batch.step_state.mask.shape[1] == 4 and batch.step_state.caches[0].keys.shape[2] == 4
    outputs: dict[int, list[list[int]]] = {}
    drain(batch, [short], outputs)
    assert short.done and len(batch) == 0


def test_log_probabilities_are_the_models():
    model = build("decoder")
    batch = RunningBatch(model)
    group = Group(make_settings(model.config, max_new_tokens=1, eos_token_id=[]), rows=1, logprobs=3)
    batch.add([5, 9, 11], group)
    chosen = batch.step()[0]
    ids = torch.tensor([[5, 9, 11]])
    with torch.no_grad():
        logits = model(ids, torch.ones_like(ids)).logits[0, -1].double()
    expected = logits.log_softmax(-1)
    top = expected.topk(3)
    assert chosen.tokens[0] == int(top.indices[0])
    assert chosen.logprob[0] == pytest.approx(float(top.values[0]), abs=1e-5)
    assert [t for t, _ in chosen.top[0]] == top.indices.tolist()
    assert [v for _, v in chosen.top[0]] == pytest.approx(top.values.tolist(), abs=1e-5)


@pytest.mark.parametrize("kind, positions", MODELS)
def test_prompts_of_different_lengths_joining_together_get_their_solo_tokens(kind, positions):
    model = build(kind, positions)
    prompts = [[5, 9, 11, 7], [8, 6, 30, 21, 17, 12, 4, 9, 10], [13]]
    batch = RunningBatch(model)
    first = Group(make_settings(model.config, max_new_tokens=9, eos_token_id=[]), rows=1)
    batch.add([20, 21, 22], first)
    batch.step()
    groups = [Group(make_settings(model.config, max_new_tokens=8, eos_token_id=[]), rows=r) for r in (1, 2, 1)]
    batch.add_many(list(zip(prompts, groups)))  # read in one padded forward, then joined to the running row
    assert batch.rows == 5
    outputs: dict[int, list[list[int]]] = {}
    drain(batch, groups + [first], outputs)
    for prompt, group in zip(prompts, groups):
        assert outputs[id(group)] == solo(model, prompt, rows=group.rows, max_new_tokens=8, eos_token_id=[])
