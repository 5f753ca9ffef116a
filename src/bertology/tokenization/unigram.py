"""The scores of a trained Unigram vocabulary, estimated again in a fixed order, so that the same text gives the
same ``tokenizer.json`` in every run and process.

The tokenizers library's Unigram trainer visits the corpus words in the iteration order of a hash map seeded afresh
in every process: its expected counts are float sums taken in that order (the scores then differ in the last
digits from one process to the next: 548 of 2,000 on Brown's categories a-c), the characters it must add get
their small scores in hash-set order, and pieces of equal score are listed in hash order. Its choice of pieces
did not move (measured: the same pieces in six processes each on five corpora and sizes, from 57 to 4,000 pieces);
only their scores and order did. So the trainer chooses the pieces, and this module gives them their scores: the
same EM as the trainer's (expected counts over every segmentation of every distinct word, weighted by the word's
count; the digamma M-step of SentencePiece's Bayesian EM), started from the pieces' corpus frequencies and run
over the words in sorted order, with the sums taken by ``numpy.bincount`` (sequential, in array order) and exp
and log computed from IEEE arithmetic alone (numpy's own take other code on CPUs with AVX-512). The scores depend
only on the pieces and the word counts, never on the trainer's order or the CPU. (Should the trainer ever choose
other pieces in another process, on a near-tie of its pruning, the tokenizers would differ; no such case has been
seen.)

Cost, measured on the 13 Gutenberg books (T5 style, 8,000 pieces, 93,632 distinct words; two processes of
different hash seeds wrote the same tokenizer.json): the trainer 26 s of CPU, counting the words it sees 2.3 s more,
these scores about 3 s.
"""

from __future__ import annotations

from array import array
import math
from collections import Counter

import numpy as np

# EM rounds on the final vocabulary. The trainer's own scores come from two rounds on a vocabulary 10 % larger.
# Measured on Brown (1,000 pieces from category a, words of category r): after 2 rounds 99.6 % of the held-out
# words are split as with the trainer's scores, from 4 rounds on 99.5 % and the same token count (-0.01 %).
EM_ROUNDS = 4
# The tokenizers library's (and SentencePiece's) penalty of an unknown character below the lowest score.
UNK_PENALTY = 10.0
# SentencePiece drops a piece whose expected count falls below this; the vocabulary is fixed here, so such a piece
# keeps the score of this count instead (the lowest any piece gets).
MIN_EXPECTED = 0.5


# exp and log from +, -, *, / only, which IEEE rounds the same on every CPU: numpy's own float64 exp and log take
# another code path where the CPU has AVX-512, and rounded differently there (measured: with that path disabled
# through NPY_DISABLE_CPU_FEATURES the scores, and so tokenizer.json, changed). Both are within a few units in the
# last place of the true value (tested against math.exp and math.log).
_LN2_HI = 6.93147180369123816490e-01  # ln 2 in two parts: k * _LN2_HI is exact for any exponent k of a double
_LN2_LO = 1.90821492927058770002e-10
_INV_LN2 = 1.44269504088896338700e+00
_SQRT_HALF = 0.7071067811865476
_EXP_TERMS = [1.0 / math.factorial(n) for n in range(14)]  # |r| <= ln(2) / 2: r^14 / 14! < 1e-17
_LOG_TERMS = [1.0 / n for n in range(1, 24, 2)]  # |s| <= 0.172: s^24 / 25 < 1e-19
# Below this, exp is 0 in float64.
_EXP_UNDERFLOW = -745.2


def exp(x: np.ndarray) -> np.ndarray:
    """e ** x, elementwise, the same on every CPU (``-inf`` and anything below the float64 range give 0)."""
    x = np.asarray(x, dtype=np.float64)
    under = x < _EXP_UNDERFLOW
    x = np.where(under, 0.0, x)
    k = np.rint(x * _INV_LN2)
    r = (x - k * _LN2_HI) - k * _LN2_LO
    value = np.full_like(r, _EXP_TERMS[-1])
    for term in reversed(_EXP_TERMS[:-1]):
        value = value * r + term
    return np.where(under, 0.0, np.ldexp(value, k.astype(np.int64)))


def log(x: np.ndarray) -> np.ndarray:
    """The natural logarithm of positive finite ``x``, elementwise, the same on every CPU."""
    mantissa, exponent = np.frexp(np.asarray(x, dtype=np.float64))
    low = mantissa < _SQRT_HALF
    mantissa = np.where(low, mantissa * 2.0, mantissa)  # in [sqrt(1/2), sqrt(2))
    exponent = (exponent - low).astype(np.float64)
    s = (mantissa - 1.0) / (mantissa + 1.0)  # log m = 2 atanh(s) = 2 (s + s^3 / 3 + s^5 / 5 + ...)
    s2 = s * s
    series = np.full_like(s, _LOG_TERMS[-1])
    for term in reversed(_LOG_TERMS[:-1]):
        series = series * s2 + term
    return exponent * _LN2_HI + (2.0 * s * series + exponent * _LN2_LO)


def digamma(x: np.ndarray) -> np.ndarray:
    """The digamma function for positive ``x`` (as SentencePiece computes it: the recurrence up to 7, then the
    asymptotic series)."""
    x = np.array(x, dtype=np.float64)
    result = np.zeros_like(x)
    small = x < 7.0
    while small.any():
        result[small] -= 1.0 / x[small]
        x[small] += 1.0
        small = x < 7.0
    x -= 0.5
    xx = 1.0 / x
    xx2 = xx * xx
    xx4 = xx2 * xx2
    return (result + log(x) + xx2 / 24.0 - 7.0 / 960.0 * xx4 + 31.0 / 8064.0 * xx4 * xx2
            - 127.0 / 30720.0 * xx4 * xx4)


class _Lattices:
    """Every segmentation of every distinct word into ``pieces``, as arrays: node ``first[w] + i`` is the boundary
    before character ``i`` of word ``w``; an edge is a piece (or the unknown piece, id ``len(pieces)``, for a
    character that starts no one-character piece, as the tokenizers library's lattice has it) from one node to
    another."""

    def __init__(self, pieces: list[str], words: list[tuple[str, int]]) -> None:
        index = {piece: i for i, piece in enumerate(pieces)}
        unk = len(pieces)
        longest = max(len(piece) for piece in pieces)
        edges = array("q")  # flat: start node, end node, piece, the position in its word it ends at; per edge
        firsts: list[int] = []
        base = 0
        for word, _ in words:
            firsts.append(base)
            n = len(word)
            for start in range(n):
                if word[start] not in index:
                    edges.extend((base + start, base + start + 1, unk, start + 1))
                for end in range(start + 1, min(n, start + longest) + 1):
                    piece = index.get(word[start:end])
                    if piece is not None:
                        edges.extend((base + start, base + end, piece, end))
            base += n + 1
        table = np.frombuffer(edges, dtype=np.int64).reshape(-1, 4)
        self.nodes = base
        self.source, self.target, self.piece, end = table.T
        lengths = np.asarray([len(word) for word, _ in words], dtype=np.int64)
        self.counts = np.asarray([count for _, count in words], dtype=np.float64)
        self.first = np.asarray(firsts, dtype=np.int64)
        self.last = self.first + lengths
        self.word = np.repeat(np.arange(len(words)), lengths + 1)[self.source]
        start = end - (self.target - self.source)
        # The forward pass fills the nodes in the order of the position they are at, the backward pass in reverse.
        self.forward = _groups(end, self.target)
        self.backward = _groups(start, self.source)[::-1]

    def expected_counts(self, scores: np.ndarray) -> np.ndarray:
        """Each piece's expected count over the words' segmentations under ``scores`` (log probabilities, the
        unknown piece's last), weighted by the words' counts."""
        edge_score = scores[self.piece]
        alpha = np.full(self.nodes, -np.inf)
        alpha[self.first] = 0.0
        for edges, nodes, cuts in self.forward:
            alpha[nodes] = _log_sums(alpha[self.source[edges]] + edge_score[edges], cuts)
        beta = np.full(self.nodes, -np.inf)
        beta[self.last] = 0.0
        for edges, nodes, cuts in self.backward:
            beta[nodes] = _log_sums(beta[self.target[edges]] + edge_score[edges], cuts)
        total = alpha[self.last]
        marginal = exp(alpha[self.source] + edge_score + beta[self.target] - total[self.word])
        return np.bincount(self.piece, weights=marginal * self.counts[self.word], minlength=len(scores))


def _groups(positions: np.ndarray, nodes: np.ndarray) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """The edges by ``positions``, each group ordered by ``nodes``: (edges, the group's nodes once each, where each
    node's edges begin in the group)."""
    order = np.lexsort((nodes, positions))
    breaks = np.flatnonzero(np.diff(positions[order])) + 1
    groups = []
    for edges in np.split(order, breaks):
        keys = nodes[edges]
        cuts = np.concatenate([[0], np.flatnonzero(np.diff(keys)) + 1])
        groups.append((edges, keys[cuts], cuts))
    return groups


def _log_sums(terms: np.ndarray, cuts: np.ndarray) -> np.ndarray:
    """log(sum(exp(terms))) of each run of ``terms`` that begins at one of ``cuts``."""
    peak = np.maximum.reduceat(terms, cuts)
    counts = np.diff(np.append(cuts, len(terms)))
    return peak + log(np.add.reduceat(exp(terms - np.repeat(peak, counts)), cuts))


def unigram_scores(pieces: list[str], words: Counter[str], rounds: int = EM_ROUNDS) -> list[float]:
    """The log probabilities of ``pieces`` (a Unigram vocabulary without its special tokens) estimated on
    ``words`` (each distinct pre-tokenized word and its count): ``rounds`` of EM from the pieces' frequencies in
    the words."""
    if not pieces:
        return []
    lattices = _Lattices(pieces, sorted(words.items()))
    size = len(pieces)
    lengths = np.asarray([len(piece) for piece in pieces] + [1], dtype=np.float64)
    # Start as SentencePiece's seeds do: a piece's frequency times its length.
    expected = np.bincount(lattices.piece, weights=lattices.counts[lattices.word],
                           minlength=size + 1) * lengths
    scores = np.empty(size + 1)
    for round_ in range(rounds + 1):
        if round_:
            expected = lattices.expected_counts(scores)
        kept = np.maximum(expected[:size], MIN_EXPECTED)
        scores[:size] = digamma(kept) - digamma(kept.sum())
        scores[size] = scores[:size].min() - UNK_PENALTY
    return [float(score) for score in scores[:size]]
