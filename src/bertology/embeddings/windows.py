"""Overlapping windows for texts longer than the model's positions, and the choice of window per token.

Windows cover a text's content tokens (specials excluded); each is then wrapped in the specials again. With
capacity C (content tokens per window) and stride S, window k starts at k * S, so consecutive windows overlap by
C - S tokens; the last window ends at the text's end and may be shorter, as in BERT's SQuAD script.

A token seen in several windows takes its vector from the window where it has the most context: the one that
maximises min(tokens to its left, tokens to its right) + 0.01 * window length; ties go to the earlier window.
"""

from __future__ import annotations

import numpy as np

from bertology.errors import ConfigError


def plan_windows(num_tokens: int, capacity: int, stride: int) -> list[tuple[int, int]]:
    """[start, stop) content-token spans; a text with no content tokens still gets one (empty) window."""
    if capacity < 1:
        raise ConfigError(f"window capacity must be at least 1 content token, got {capacity}")
    if not 1 <= stride <= capacity:
        raise ConfigError(f"stride must be between 1 and the window's {capacity} content tokens, got {stride}")
    spans = []
    start = 0
    while True:
        stop = min(start + capacity, num_tokens)
        spans.append((start, stop))
        if stop >= num_tokens:
            return spans
        start += stride


def max_context_window(spans: list[tuple[int, int]], num_tokens: int) -> np.ndarray:
    """For each content token, the index in `spans` of the window where it has the most context."""
    best = np.full(num_tokens, -np.inf)
    choice = np.zeros(num_tokens, dtype=np.int64)
    for k, (start, stop) in enumerate(spans):
        positions = np.arange(start, stop)
        score = np.minimum(positions - start, stop - 1 - positions) + 0.01 * (stop - start)
        better = score > best[start:stop]
        best[start:stop][better] = score[better]
        choice[start:stop][better] = k
    return choice
