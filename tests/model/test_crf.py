"""The linear-chain CRF against brute-force enumeration of every tag sequence, its padding invariance and the
BiLSTM-CRF head (kind "bilstm_crf")."""

from __future__ import annotations

import itertools

import pytest
import torch

from bertology.errors import InputError
from bertology.model.crf import BiLSTMCRFHead, LinearChainCRF, compact
from bertology.model.heads import HeadInputs, HeadSpec, build_head
from bertology.tasks.tagging import bio_constraints, bio_labels


def _crf(tags: int, seed: int = 0) -> LinearChainCRF:
    torch.manual_seed(seed)
    crf = LinearChainCRF(tags)
    with torch.no_grad():
        for parameter in crf.parameters():
            parameter.normal_()
    return crf


@torch.no_grad()
def _score(crf: LinearChainCRF, emissions: torch.Tensor, path: tuple[int, ...]) -> float:
    """s(y) written out for one sequence."""
    total = crf.start[path[0]] + crf.end[path[-1]] + sum(emissions[t, y] for t, y in enumerate(path))
    return float(total + sum(crf.transitions[a, b] for a, b in zip(path, path[1:])))


@pytest.mark.parametrize("tags,lengths", [(3, [1, 4, 2]), (4, [3, 1])])
def test_log_partition_score_and_viterbi_equal_brute_force(tags, lengths):
    crf = _crf(tags)
    emissions = torch.randn(len(lengths), max(lengths), tags, dtype=torch.float64).float()
    mask = torch.arange(max(lengths))[None] < torch.tensor(lengths)[:, None]
    gold = torch.randint(0, tags, mask.shape)
    with torch.no_grad():
        log_z, score, best = crf.log_partition(emissions, mask), crf.score(emissions, gold, mask), \
            crf.viterbi(emissions, mask)
    for row, n in enumerate(lengths):
        paths = list(itertools.product(range(tags), repeat=n))
        scores = torch.tensor([_score(crf, emissions[row], p) for p in paths], dtype=torch.float64)
        assert float(log_z[row]) == pytest.approx(float(torch.logsumexp(scores, 0)), abs=1e-4)
        assert float(score[row]) == pytest.approx(_score(crf, emissions[row], tuple(gold[row, :n].tolist())),
                                                  abs=1e-4)
        assert tuple(best[row, :n].tolist()) == paths[int(scores.argmax())]
    # A probability distribution: the likelihoods of all sequences of a row sum to one.
    n = lengths[0]
    every = torch.tensor(list(itertools.product(range(tags), repeat=n)))
    with torch.no_grad():
        total = crf.log_likelihood(emissions[:1].expand(len(every), -1, -1)[:, :n], every,
                                   mask[:1, :n].expand(len(every), -1)).exp().sum()
    assert float(total) == pytest.approx(1.0, abs=1e-5)


def test_bio_constrained_viterbi_is_the_best_valid_sequence():
    labels = bio_labels(["LOC", "PER"])  # O B-LOC I-LOC B-PER I-PER
    allowed, allowed_start = bio_constraints(labels)
    names = labels.names
    assert not allowed[names.index("O"), names.index("I-LOC")] and allowed[names.index("B-LOC"), names.index("I-LOC")]
    assert not allowed[names.index("I-PER"), names.index("I-LOC")] and not allowed_start[names.index("I-PER")]
    crf = _crf(len(names), seed=3)
    with torch.no_grad():
        crf.transitions[:, names.index("I-LOC")] += 5.0  # invalid moves are the attractive ones
        crf.start[names.index("I-PER")] += 5.0
    emissions = torch.randn(2, 4, len(names))
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]], dtype=torch.bool)
    best = crf.viterbi(emissions, mask, allowed, allowed_start)

    def valid(path):
        tags = [names[y] for y in path]
        return all(not t.startswith("I-") or (p is not None and p[2:] == t[2:] and p != "O")
                   for p, t in zip([None, *tags], tags))

    for row, n in enumerate((4, 3)):
        paths = [p for p in itertools.product(range(len(names)), repeat=n) if valid(p)]
        scores = [_score(crf, emissions[row], p) for p in paths]
        assert tuple(best[row, :n].tolist()) == paths[max(range(len(paths)), key=scores.__getitem__)]
    assert not all(valid(tuple(p)) for p in crf.viterbi(emissions, mask).tolist())  # unconstrained: invalid


def test_padding_changes_nothing_and_gradients_are_finite():
    crf = _crf(5)
    emissions = torch.randn(1, 3, 5, requires_grad=True)
    tags = torch.tensor([[1, 4, 2]])
    alone = crf.log_likelihood(emissions, tags, torch.ones(1, 3, dtype=torch.bool))
    # The same row padded to 7 words with huge scores in the padding, beside a longer row.
    padded = torch.cat([emissions, torch.full((1, 4, 5), 1e4)], 1)
    other = torch.randn(1, 7, 5)
    batch = torch.cat([padded, other])
    mask = torch.tensor([[1, 1, 1, 0, 0, 0, 0], [1] * 7], dtype=torch.bool)
    both = crf.log_likelihood(batch, torch.cat([torch.cat([tags, torch.full((1, 4), 3)], 1),
                                                torch.randint(0, 5, (1, 7))]), mask)
    torch.testing.assert_close(both[0], alone[0])
    torch.testing.assert_close(crf.viterbi(batch, mask)[0, :3], crf.viterbi(emissions, mask[:1, :3])[0])
    (-both.sum()).backward()
    assert all(torch.isfinite(p.grad).all() for p in crf.parameters()) and torch.isfinite(emissions.grad).all()
    assert float(both[0].detach()) < 0 and float(crf.log_partition(batch[:, :0], mask[:, :0]).abs().sum()) == 0


def test_compact_moves_the_kept_positions_first():
    values = torch.arange(12).reshape(2, 6)
    keep = torch.tensor([[0, 1, 0, 1, 1, 0], [1, 0, 0, 0, 0, 0]], dtype=torch.bool)
    out, mask = compact(values, keep)
    assert out[0].tolist() == [1, 3, 4] and out[1, :1].tolist() == [6]
    assert mask.tolist() == [[True, True, True], [True, False, False]]


class _Config:
    hidden_size, head_dropout = 8, 0.0


@torch.no_grad()
def test_the_head_reads_the_real_tokens_whatever_the_padding():
    torch.manual_seed(0)
    head = build_head(_Config(), HeadSpec("token_classifier", "bilstm_crf", num_labels=5)).eval()
    assert isinstance(head, BiLSTMCRFHead)
    hidden = torch.randn(1, 4, 8)
    alone = head(HeadInputs(hidden, torch.ones(1, 4, dtype=torch.long), torch.zeros(0)))
    noise = torch.randn(1, 3, 8)
    right = head(HeadInputs(torch.cat([hidden, noise], 1), torch.tensor([[1, 1, 1, 1, 0, 0, 0]]), torch.zeros(0)))
    left = head(HeadInputs(torch.cat([noise, hidden], 1), torch.tensor([[0, 0, 0, 1, 1, 1, 1]]), torch.zeros(0)))
    torch.testing.assert_close(right[:, :4], alone)
    torch.testing.assert_close(left[:, 3:], alone)
    assert float(right[:, 4:].abs().sum()) == 0
    at = torch.tensor([[1, 0, 1, 1, 0, 0, 0]], dtype=torch.bool)
    tags, mask = head.decode(right, at)
    assert tags.shape == (1, 3) and mask.all()
    with pytest.raises(InputError, match=r"CRF: emissions must be \[batch, words, 5\]"):
        head.crf.log_partition(torch.zeros(1, 2, 4), torch.ones(1, 2, dtype=torch.bool))


@torch.no_grad()
def test_the_bilstm_max_sentence_head_reads_only_the_real_tokens():
    torch.manual_seed(0)
    head = build_head(_Config(), HeadSpec("classifier", "bilstm_max", num_labels=3)).eval()
    hidden, noise = torch.randn(2, 4, 8), torch.randn(2, 2, 8)
    alone = head(HeadInputs(hidden, torch.ones(2, 4, dtype=torch.long), torch.zeros(0)))
    left = head(HeadInputs(torch.cat([noise, hidden], 1), torch.tensor([[0, 0, 1, 1, 1, 1]] * 2), torch.zeros(0)))
    assert alone.shape == (2, 3)
    torch.testing.assert_close(left, alone)
