"""The same word in different senses gets different contextual vectors: cosine tables for bank, bat, play, record."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from bertology.embeddings import embed
from bertology.embeddings.backbone import Backbone
from bertology.embeddings.layers import Combine, LayerSpec
from bertology.embeddings.result import EmbeddingError, Pooling
from bertology.model import Model, Pretrained
from bertology.tokenization import Tokenizer

# word -> (sense, sentence) pairs; the word occurs once, in lower case, in each sentence.
SENSE_EXAMPLES: dict[str, list[tuple[str, str]]] = {
    "bank": [
        ("river", "We spread a blanket on the grassy bank and watched the river flow by."),
        ("river", "The canoe drifted towards the muddy bank where the ducks were nesting."),
        ("river", "After the storm the stream burst its bank and flooded the meadow."),
        ("money", "She opened a savings account at the bank on the high street."),
        ("money", "The bank approved his mortgage after checking his salary."),
        ("money", "I need to withdraw some cash from the bank before it closes."),
    ],
    "bat": [
        ("animal", "A bat flew out of the cave at dusk to hunt for moths."),
        ("animal", "The tiny bat hung upside down from a beam in the barn."),
        ("animal", "Every bat in the colony finds insects by echolocation."),
        ("sport", "He swung the bat and sent the ball over the fence."),
        ("sport", "She oiled her new cricket bat, made of English willow."),
        ("sport", "The batter gripped the bat and waited for the pitch."),
    ],
    "play": [
        ("theatre", "We saw a play by Shakespeare at the theatre last night."),
        ("theatre", "The actors rehearsed the play for weeks before opening night."),
        ("theatre", "Her first play was staged in a small theatre in Dublin."),
        ("game", "The children play football in the park after school."),
        ("game", "Would you like to play chess with me this evening?"),
        ("game", "On Fridays they play cards with the neighbours."),
    ],
    "record": [
        ("music", "He put the record on the turntable and lowered the needle."),
        ("music", "My grandfather kept every record the band ever released on vinyl."),
        ("music", "The record was scratched, so the song kept skipping."),
        ("best", "She broke the world record for the hundred metres."),
        ("best", "The team set a new record for wins in a single season."),
        ("best", "His record of forty goals in one season still stands."),
    ],
}


@dataclass(frozen=True)
class SenseTable:
    """Pairwise cosine similarities of one word's occurrences, each labelled with its sense."""

    word: str
    senses: list[str]
    sentences: list[str]
    cosine: np.ndarray  # [n, n]

    def _pairs(self, same: bool) -> np.ndarray:
        labels = np.array(self.senses)
        mask = (labels[:, None] == labels[None, :]) == same
        np.fill_diagonal(mask, False)
        return self.cosine[mask]

    @property
    def same_sense_mean(self) -> float:
        return float(self._pairs(True).mean())

    @property
    def cross_sense_mean(self) -> float:
        return float(self._pairs(False).mean())

    def labels(self) -> list[str]:
        """"river1", "river2", "money1", ...: the sense and the occurrence's number within it."""
        seen: dict[str, int] = {}
        out = []
        for sense in self.senses:
            seen[sense] = seen.get(sense, 0) + 1
            out.append(f"{sense}{seen[sense]}")
        return out

    def gap(self, senses: Sequence[str] | None = None) -> float:
        """Mean cosine of same-sense pairs minus that of cross-sense pairs, under `senses` (default: the true ones)."""
        labels = np.array(self.senses if senses is None else senses)
        same = labels[:, None] == labels[None, :]
        off_diagonal = ~np.eye(len(labels), dtype=bool)
        return float(self.cosine[same & off_diagonal].mean() - self.cosine[~same].mean())

    def null_gaps(self) -> np.ndarray:
        """The gap under every distinct labelling of these sentences with the same number of each sense: the
        exact permutation distribution when senses do not matter (20 labellings for 3 + 3 sentences)."""
        return np.array([self.gap(labels) for labels in distinct_orders(self.senses)])

    def p_value(self) -> float:
        """Exact permutation test: the share of labellings whose gap is at least the true one's. With 3 + 3
        sentences the smallest possible is 2 / 20 = 0.1 (the true split and its sense names swapped)."""
        return float(np.mean(self.null_gaps() >= self.gap() - GAP_TIES))

    def summary(self) -> str:
        same, cross, p = self.same_sense_mean, self.cross_sense_mean, self.p_value()
        smallest = float(np.mean(self.null_gaps() >= self.null_gaps().max() - GAP_TIES))
        verdict = ("senses separate: no other split of these sentences does better" if p <= smallest + GAP_TIES else
                   "senses do NOT separate beyond chance")
        return (f"{self.word}: same-sense {same:.3f} vs cross-sense {cross:.3f} ({same - cross:+.3f}; p = {p:.2f}, "
                f"smallest possible {smallest:.2f}: {verdict})")

    def format(self) -> str:
        labels = self.labels()
        width = max(6, *(len(label) for label in labels))
        lines = [f"{self.word!r}"]
        for label, sentence in zip(labels, self.sentences):
            lines.append(f"  {label:<{width}}  {highlight(sentence, self.word)}")
        lines.append("")
        lines.append(" " * (width + 2) + "".join(f"{label:>{width + 1}}" for label in labels))
        for i, label in enumerate(labels):
            cells = []
            for j in range(len(labels)):
                if i == j:
                    cell = "-"
                else:
                    # a star marks pairs of the same sense, so the blocks stand out without colour
                    cell = f"{self.cosine[i, j]:.2f}" + ("*" if self.senses[i] == self.senses[j] else " ")
                cells.append(f"{cell:>{width + 1}}")
            lines.append(f"  {label:<{width}}" + "".join(cells))
        lines.append("")
        lines.append(self.summary())
        return "\n".join(lines)


# Gaps within this of each other count as tied (float32 vectors: the cosines carry about 1e-7 of rounding).
GAP_TIES = 1e-6


def distinct_orders(items: Sequence[str]) -> list[tuple[str, ...]]:
    """Every distinct ordering of a multiset (C(6, 3) = 20 for three of one label and three of another)."""
    counts: dict[str, int] = {}
    for item in items:
        counts[item] = counts.get(item, 0) + 1
    out: list[tuple[str, ...]] = []

    def extend(prefix: list[str]) -> None:
        if len(prefix) == len(items):
            out.append(tuple(prefix))
            return
        for label in counts:
            if counts[label]:
                counts[label] -= 1
                extend([*prefix, label])
                counts[label] += 1

    extend([])
    return out


def combined_p_value(tables: Sequence[SenseTable]) -> float:
    """One exact permutation test over all words at once: the statistic is the sum of the words' gaps, each word's
    labels permuted independently (the smallest possible p is the product of the words' smallest ones)."""
    total = np.zeros(1)
    for table in tables:
        total = (total[:, None] + table.null_gaps()[None, :]).ravel()
    observed = sum(table.gap() for table in tables)
    return float(np.mean(total >= observed - GAP_TIES * len(tables)))


def highlight(sentence: str, word: str) -> str:
    """The sentence with the first whole-word occurrence of `word` in brackets."""
    return re.sub(rf"(?<!\w){re.escape(word)}(?!\w)", f"[{word}]", sentence, count=1)


def sense_tables(
    model: Backbone | Pretrained | Model,
    examples: Mapping[str, Sequence[tuple[str, str]]] | None = None,
    *,
    tokenizer: Tokenizer | None = None,
    layers: LayerSpec = "sum-last-four",
    combine: Combine | None = None,
    pooling: Pooling = "mean",
    device: str | torch.device | None = None,
    dtype: str = "float32",
) -> list[SenseTable]:
    """One SenseTable per word of `examples` (default: SENSE_EXAMPLES). Each occurrence's vector pools its subword
    tokens; all sentences are embedded in one call (on `device` in `dtype`, as `embed` takes them)."""
    examples = SENSE_EXAMPLES if examples is None else examples
    flat = [(word, sense, sentence) for word, pairs in examples.items() for sense, sentence in pairs]
    if not flat:
        raise EmbeddingError("sense_tables: no example sentences")
    result = embed(model, [s for _, _, s in flat], tokenizer=tokenizer, layers=layers, combine=combine,
                   pooling=pooling, levels=("token",), model_settings=False, device=device, dtype=dtype)
    vectors = np.stack([result.vector(i, word) for i, (word, _, _) in enumerate(flat)])
    tables = []
    first = 0
    for word, pairs in examples.items():
        v = vectors[first: first + len(pairs)]
        first += len(pairs)
        senses = [sense for sense, _ in pairs]
        if len(set(senses)) < 2 or all(senses.count(s) < 2 for s in senses):
            raise EmbeddingError(f"sense_tables: {word!r} needs two senses and two sentences of one of them")
        unit = v / np.linalg.norm(v, axis=1, keepdims=True)
        tables.append(SenseTable(word, senses, [s for _, s in pairs], unit @ unit.T))
    return tables


def format_report(tables: Sequence[SenseTable], header: str = "") -> str:
    """All tables, then one summary line per word."""
    blocks = [header] if header else []
    blocks.extend(table.format() for table in tables)
    blocks.append("summary (mean cosine of same-sense pairs vs pairs of different senses; * = same sense; p: the "
                  "share of all ways to label the sentences with the same sense counts that separate them as well or "
                  "better, an exact permutation test)\n"
                  + "\n".join("  " + table.summary() for table in tables)
                  + (f"\n  all {len(tables)} words together: p = {combined_p_value(tables):.2g} (exact permutation test "
                     "of the summed gaps)" if len(tables) > 1 else ""))
    return "\n\n".join(blocks)
