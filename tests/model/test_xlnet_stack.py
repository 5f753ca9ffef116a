"""XLNet on the one stack's parts: its layers run in the stack's layer loop (`stack.run_layers`, every layer call as
`layer(x, context.at(call))`), one attention context a forward holding the two-stream plan, each call's memory and
the relative and segment terms as score providers; the packed joint stream and the padded rows give the same
outputs; a layer called without the plan is a clear error. (Parity with transformers: tests/model/test_xlnet.py.)"""

from __future__ import annotations

import pytest
import torch

from bertology.errors import InputError
from bertology.model import stack
from bertology.model import xlnet as X
from bertology.model.context import AttentionContext
from bertology.model.heads import HeadSpec

pytestmark = pytest.mark.usefixtures("one_thread")

VOCAB, LENGTH = 30, 7


def build() -> X.XLNetModel:
    config = X.XLNetConfig(vocab_size=VOCAB, hidden_size=16, num_layers=3, num_heads=2, intermediate_size=24,
                           hidden_dropout=0.0, pad_token_id=0, mem_len=None)
    model = X.XLNetModel(config, [HeadSpec("lm", "tied_lm_bias")])
    model.init_weights(torch.Generator().manual_seed(0))
    return model.eval()


def inputs(seed: int = 0) -> dict[str, torch.Tensor]:
    """Three left-padded rows (7, 4 and 6 real tokens), two segments, a perm_mask and two targets a row."""
    g = torch.Generator().manual_seed(seed)
    mask = torch.tensor([[1] * 7, [0] * 3 + [1] * 4, [0] + [1] * 6])
    ids = torch.randint(1, VOCAB, (3, LENGTH), generator=g).masked_fill(mask == 0, 0)
    types = torch.zeros_like(ids)
    types[:, -2:] = 1
    perm = (torch.rand(3, LENGTH, LENGTH, generator=g) < 0.4).float()
    mapping = torch.zeros(3, 2, LENGTH)
    for row, positions in enumerate(([1, 5], [4, 6], [2, 3])):
        mapping[row, [0, 1], positions] = 1
    return dict(input_ids=ids, attention_mask=mask, token_type_ids=types, perm_mask=perm, target_mapping=mapping)


@pytest.fixture
def loops(monkeypatch):
    """Every call of the stack's loop from XLNet: (plan, context, last_queries)."""
    calls = []

    def recording(layers, plan, x, context, *args, **kwargs):
        calls.append((list(plan), context, kwargs.get("last_queries")))
        return stack.run_layers(layers, plan, x, context, *args, **kwargs)

    monkeypatch.setattr(X, "run_layers", recording)
    return calls


@pytest.mark.parametrize("packed", [True, False])
def test_both_paths_run_in_the_stack_loop(loops, packed):
    model = build()
    batch = inputs()
    with torch.no_grad():
        out = model(**batch, use_mems=not packed)
    assert len(loops) == 1
    plan, context, last_queries = loops[0]
    assert plan == [0, 1, 2]
    assert isinstance(context.streams, X.Packed if packed else X.PaddedStreams)
    assert last_queries is not None  # the last layer computes the query stream alone
    if packed:
        assert all(isinstance(bucket.scores, X.XLNetScores) for bucket in context.streams.buckets)
        assert torch.equal(last_queries, context.streams.slot_rows)
    else:
        assert context.scores is context.streams.scores
        # the permutations as the context's mask: row 0's content query 0 may not see key 1 where perm_mask says so
        assert context.mask.shape == (3, 1, LENGTH + 2, LENGTH)
        blocked = (batch["perm_mask"][0] > 0) & ~torch.eye(LENGTH, dtype=torch.bool)
        assert torch.equal(context.mask[0, 0, :LENGTH], ~blocked)
        assert context.streams.length == LENGTH and context.streams.slots == 2
        assert len(out.mems) == 3


def test_each_layer_call_reads_its_own_memory(loops):
    """A second segment's forward: layer call i attends to mems[i] (as [B, M, H]); and that memory changes the
    outputs (it is read)."""
    model = build()
    batch = inputs()
    with torch.no_grad():
        first = model(batch["input_ids"], batch["attention_mask"], use_mems=True)
        second = model(**inputs(1), mems=first.mems, use_mems=True)
        without = model(**inputs(1), use_mems=True)
    context = loops[1][1]
    for call in range(3):
        assert torch.equal(context.at(call).mem, first.mems[call].transpose(0, 1))
    assert not torch.allclose(second.last_hidden_state, without.last_hidden_state)


def test_context_at_picks_the_calls_memory_and_keeps_the_plan():
    mems = [torch.full((1, 2, 4), float(i)) for i in range(3)]
    plan = object()
    context = AttentionContext(streams=plan, mems=mems)
    for call in range(3):
        view = context.at(call)
        assert view.mem is mems[call] and view.streams is plan and view.call == call
    assert AttentionContext().at(0).mem is None


def test_packed_and_padded_agree_with_hidden_states():
    """The joint stream (packed) and the padded rows, every content state and the query stream's logits."""
    model = build()
    batch = inputs(2)
    with torch.no_grad():
        packed = model(**batch, use_mems=False, output_hidden_states=True)
        padded = model(**batch, use_mems=True, output_hidden_states=True)
    real = batch["attention_mask"].bool()
    assert len(packed.hidden_states) == len(padded.hidden_states) == 4
    for ours, theirs in zip(packed.hidden_states, padded.hidden_states, strict=True):
        torch.testing.assert_close(ours[real], theirs[real], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(packed.logits, padded.logits, atol=1e-5, rtol=1e-5)


def test_a_layer_without_the_two_stream_plan_is_refused():
    layer = build().layers[0]
    with pytest.raises(InputError, match="AttentionContext.streams"):
        layer(torch.zeros(1, 3, 16), AttentionContext())
    with pytest.raises(InputError, match="two-stream plan"):
        layer(torch.zeros(1, 3, 16))
