"""The geometry of contextual word vectors, layer by layer.

- Anisotropy (Ethayarajh 2019): the expected cosine similarity of two word occurrences drawn at random from
  different contexts (sentences). It is computed exactly over *all* such pairs, not over a sample: with u the unit
  vectors and U_s the sum of sentence s's unit vectors, the sum of cross-sentence cosines is
  ||sum_s U_s||^2 - sum_s ||U_s||^2. Its 95 % confidence interval is a cluster bootstrap over sentences (pairs
  within one sentence are never counted, pairs sharing a sentence are not independent, so sentences are the unit
  resampled).
- Self-similarity: the mean cosine between occurrences of one word type in different sentences, averaged over
  the types with at least `min_occurrences` occurrences in at least two sentences; intra-sentence similarity: the
  mean cosine of a sentence's words with the mean of its word vectors, averaged over sentences. Both are also
  given minus the layer's anisotropy, Ethayarajh's adjustment.
- Rogue dimensions (Timkey & van Schijndel 2021): dimension i's contribution to the expected cosine is
  E[u_i v_i] over cross-sentence pairs; the contributions sum to the anisotropy, and a few dimensions with
  shares far above 1/D dominate it.
- Standardisation z = (x - mu) / sigma, mu and sigma per dimension estimated on a corpus (`Standardiser`), and
  every number above after it.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from bertology.analysis.base import Section, shell_command, write_numbers
from bertology.embeddings import embed
from bertology.errors import BertologyError, ConfigError, DataError
from bertology.inputs import text_lines
from bertology.io import atomic_write

# Fewer sentences than this make the bootstrap interval of the anisotropy unreliable: the result carries a warning.
MIN_STABLE_SENTENCES = 100
# A sentence chunk embedded at once: all layers of its tokens are held in memory together.
CHUNK_TEXTS = 256
# Below this expected cosine, dimensions' shares of it are not reported (null): the ratio would be noise.
SHARE_MIN_COSINE = 1e-3


class GeometryError(BertologyError):
    """A corpus cannot give the asked-for estimate (too few sentences or words), or vectors do not fit."""


# --------------------------------------------------------------------------------- vectors of every layer


@dataclass
class LayerVectors:
    """Word vectors of every asked-for hidden state: `layers[k]` is a hidden-state index (0 = embedding output)
    and `vectors[k]` its [N, H] float32 array; row r is word `strings[r]` of text `text_index[r]`."""

    layers: tuple[int, ...]
    vectors: list[np.ndarray]
    text_index: np.ndarray
    strings: list[str]
    texts: list[str]
    counts: dict[str, int]  # what was met and skipped: texts, words, windowed (too long) texts, empty spans


def layer_vectors(
    pretrained: Any,
    texts: Sequence[str],
    *,
    spans: Sequence[Sequence[tuple[int, int]]] | None = None,
    layers: Sequence[int] | None = None,
    batch_size: int = 32,
    show_progress: bool = False,
    description: str = "embedding",
    device: Any = None,
    dtype: str = "float32",
) -> LayerVectors:
    """Word vectors of `texts` at every hidden state in `layers` (default: all, 0..L), in one forward per batch.

    Words are the tokenizer's pre-tokenised words (the tokens sharing a word id), or, with `spans`, the given character spans of each text (e.g.
    a treebank's words); a span's vector is the mean of the subword tokens overlapping it. A span that no token
    overlaps (characters the tokenizer drops) gets no row and is counted in `counts["spans_without_tokens"]`.
    Texts longer than the model are embedded in overlapping windows (see `bertology.embed`) and counted in
    `counts["texts_windowed"]`. `device` (None: where the model is) and `dtype` say where and how the model runs
    (`bertology.device`)."""
    texts = list(texts)
    if spans is not None and len(spans) != len(texts):
        raise ConfigError(f"spans: {len(spans)} span lists for {len(texts)} texts")
    num_layers = pretrained.model.config.num_layers
    wanted = tuple(range(num_layers + 1)) if layers is None else tuple(
        i % (num_layers + 1) for i in layers)
    for i in layers or ():
        if not -(num_layers + 1) <= i <= num_layers:
            raise ConfigError(f"layers: {i} is out of range for a model with {num_layers} layers (hidden states "
                              f"0..{num_layers})")
    hidden = pretrained.model.config.hidden_size
    per_layer: list[list[np.ndarray]] = [[] for _ in wanted]
    text_index: list[np.ndarray] = []
    strings: list[str] = []
    counts = {"texts": len(texts), "words": 0, "texts_windowed": 0, "spans_without_tokens": 0}
    with tqdm(total=len(texts), unit="text", desc=description, disable=not show_progress,
              dynamic_ncols=True) as bar:
        for first in range(0, len(texts), CHUNK_TEXTS):
            chunk = texts[first: first + CHUNK_TEXTS]
            result = embed(pretrained, chunk, layers=list(wanted), combine="concat", levels=("token",),
                           batch_size=batch_size, model_settings=False, device=device, dtype=dtype)
            capacity = result.window_length - 2
            tokens = result.tokens
            for t, source in enumerate(chunk):
                rows = tokens.rows(t)
                visible = tokens.word_index[rows] >= 0  # tokens of nothing but whitespace belong to no word
                if int(visible.sum()) > capacity:
                    counts["texts_windowed"] += 1
                starts, ends = tokens.start[rows][visible], tokens.end[rows][visible]
                if spans is None:  # the tokenizer's words: from their first token's start to their last's end
                    order = np.argsort(tokens.word_index[rows][visible], kind="stable")
                    ids, first_rows = np.unique(tokens.word_index[rows][visible][order], return_index=True)
                    word_spans = np.stack([np.minimum.reduceat(starts[order], first_rows),
                                           np.maximum.reduceat(ends[order], first_rows)], 1) if ids.size else \
                        np.zeros((0, 2), np.int64)
                else:
                    word_spans = np.asarray(spans[first + t], dtype=np.int64).reshape(-1, 2)
                # a word's vector is the mean of the tokens covering some of its characters
                means, covered = result.span_means(t, word_spans)
                counts["spans_without_tokens"] += int((~covered).sum())
                pooled = means[covered]
                for k in range(len(wanted)):
                    per_layer[k].append(pooled[:, k * hidden:(k + 1) * hidden])
                text_index.append(np.full(int(covered.sum()), first + t, dtype=np.int64))
                strings.extend(source[a:b] for (a, b), ok in zip(word_spans.tolist(), covered) if ok)
            bar.update(len(chunk))
    vectors = [np.ascontiguousarray(np.concatenate(parts)) if parts else np.zeros((0, hidden), np.float32)
               for parts in per_layer]
    index = np.concatenate(text_index) if text_index else np.zeros(0, np.int64)
    counts["words"] = int(index.shape[0])
    return LayerVectors(wanted, vectors, index, strings, texts, counts)


# --------------------------------------------------------------------------------- standardisation


@dataclass(frozen=True)
class Standardiser:
    """z = (x - mean) / std per dimension, estimated on a corpus's vectors (a dimension with zero spread keeps
    std 1 so it maps to 0)."""

    mean: np.ndarray
    std: np.ndarray
    count: int

    @classmethod
    def fit(cls, vectors: np.ndarray) -> Standardiser:
        vectors = np.asarray(vectors, dtype=np.float64)
        if vectors.ndim != 2 or vectors.shape[0] < 2:
            raise GeometryError(f"standardisation needs at least 2 vectors of shape [N, D], got {vectors.shape}")
        std = vectors.std(0)
        return cls(vectors.mean(0), np.where(std > 0, std, 1.0), int(vectors.shape[0]))

    def __call__(self, vectors: np.ndarray) -> np.ndarray:
        if vectors.shape[-1] != self.mean.shape[0]:
            raise GeometryError(f"standardiser fitted on {self.mean.shape[0]} dimensions, given {vectors.shape[-1]}")
        return ((vectors - self.mean) / self.std).astype(np.float32)

    def to_dict(self) -> dict[str, Any]:
        return {"mean": self.mean.tolist(), "std": self.std.tolist(), "count": self.count}

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = "standardiser") -> Standardiser:
        try:
            mean, std = np.asarray(data["mean"], np.float64), np.asarray(data["std"], np.float64)
            count = int(data["count"])
        except (KeyError, TypeError, ValueError) as error:
            raise DataError(f"{where}: expected keys mean, std (lists of numbers) and count: {error}") from None
        if mean.shape != std.shape or mean.ndim != 1 or (std <= 0).any():
            raise DataError(f"{where}: mean and std must be equal-length lists, std positive")
        return cls(mean, std, count)

    def save(self, path: str | os.PathLike) -> None:
        with atomic_write(Path(path), "w", encoding="utf-8") as f:
            json.dump(self.to_dict(), f)

    @classmethod
    def load(cls, path: str | os.PathLike) -> Standardiser:
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as error:
            raise DataError(f"{path}: cannot read a standardiser: {error}") from None
        return cls.from_dict(data, str(path))


# --------------------------------------------------------------------------------- the measures


def unit(vectors: np.ndarray) -> np.ndarray:
    """Rows scaled to length 1 (float64; a zero row stays zero)."""
    vectors = np.asarray(vectors, dtype=np.float64)
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return vectors / np.where(norms > 0, norms, 1.0)


def _sentence_sums(units: np.ndarray, groups: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per group (sentence): the sum of its unit vectors [S, D] and its size [S]."""
    _, inverse, sizes = np.unique(groups, return_inverse=True, return_counts=True)
    sums = np.zeros((sizes.shape[0], units.shape[1]))
    np.add.at(sums, inverse, units)
    return sums, sizes.astype(np.float64)


def cross_context_contributions(units: np.ndarray, groups: np.ndarray) -> np.ndarray:
    """Per dimension i, the mean of u_i v_i over all ordered pairs of rows from different groups; their sum is
    the mean cosine of those pairs (the rows being unit vectors)."""
    sums, sizes = _sentence_sums(units, groups)
    pairs = sizes.sum() ** 2 - (sizes ** 2).sum()
    if pairs <= 0:
        raise GeometryError("anisotropy needs words from at least two different sentences")
    total = sums.sum(0)
    return (total ** 2 - (sums ** 2).sum(0)) / pairs


def anisotropy(vectors: np.ndarray, groups: np.ndarray, *, bootstrap: int = 1000, seed: int = 0,
               level: float = 0.95) -> dict[str, float]:
    """The expected cosine of two rows from different groups, exact over all pairs, with a cluster-bootstrap
    confidence interval over groups (percentile method, `bootstrap` replicates; none when 0)."""
    units = unit(vectors)
    value = float(cross_context_contributions(units, groups).sum())
    result = {"mean": value, "low": math.nan, "high": math.nan}
    if bootstrap:
        sums, sizes = _sentence_sums(units, groups)
        rng = np.random.default_rng(seed)
        s = sizes.shape[0]
        estimates = np.empty(bootstrap)
        gram = sums @ sums.T  # [S, S]: dot products of sentence sums
        diag = np.diag(gram)
        for start in range(0, bootstrap, 100):
            count = min(100, bootstrap - start)
            weights = rng.multinomial(s, np.full(s, 1.0 / s), size=count).astype(np.float64)  # [B, S]
            # copies of one sentence are one context: pairs within any copy or between copies are left out
            numerator = np.einsum("bs,st,bt->b", weights, gram, weights) - (weights ** 2) @ diag
            pairs = (weights @ sizes) ** 2 - (weights ** 2) @ (sizes ** 2)
            estimates[start: start + count] = numerator / np.where(pairs > 0, pairs, np.nan)
        low, high = np.nanquantile(estimates, [(1 - level) / 2, 1 - (1 - level) / 2])
        result.update(low=float(low), high=float(high))
    return result


def rogue_dimensions(vectors: np.ndarray, groups: np.ndarray, top: int = 5) -> dict[str, Any]:
    """Each dimension's share of the expected cross-context cosine (Timkey & van Schijndel 2021), the `top`
    largest by absolute contribution, and how much of the total they make together."""
    contributions = cross_context_contributions(unit(vectors), groups)
    total = float(contributions.sum())
    order = np.argsort(-np.abs(contributions))[:top]
    # Near zero expected cosine (e.g. after standardisation) a share is a ratio of noise: left undefined.
    shares = contributions / total if abs(total) >= SHARE_MIN_COSINE else np.full_like(contributions, math.nan)
    return {
        "expected_cosine": total,
        "top": [{"dimension": int(i), "contribution": float(contributions[i]), "share": float(shares[i])}
                for i in order],
        "top_share": float(shares[order].sum()),
        "contributions": contributions.tolist(),
        "uniform_share": 1.0 / contributions.shape[0],
    }


def self_similarity(vectors: np.ndarray, groups: np.ndarray, types: Sequence[str], *,
                    min_occurrences: int = 5) -> dict[str, Any]:
    """Mean cosine between a word type's occurrences in different sentences, averaged over the types with at
    least `min_occurrences` occurrences spread over two or more sentences."""
    units = unit(vectors)
    types = np.asarray(types, dtype=object)
    values = []
    order = np.argsort(types, kind="stable")
    sorted_types = types[order]
    boundaries = np.flatnonzero(sorted_types[1:] != sorted_types[:-1]) + 1
    for rows in np.split(order, boundaries):
        if rows.shape[0] < min_occurrences or np.unique(groups[rows]).shape[0] < 2:
            continue
        values.append(float(cross_context_contributions(units[rows], groups[rows]).sum()))
    return {"mean": float(np.mean(values)) if values else math.nan, "types": len(values)}


def intra_sentence_similarity(vectors: np.ndarray, groups: np.ndarray) -> float:
    """Mean over sentences (of two or more words) of the mean cosine between each word and the sentence's mean
    word vector."""
    units = unit(vectors)
    _, inverse, sizes = np.unique(groups, return_inverse=True, return_counts=True)
    means = np.zeros((sizes.shape[0], vectors.shape[1]))
    np.add.at(means, inverse, np.asarray(vectors, np.float64))
    means /= sizes[:, None]
    means = unit(means)
    cosines = np.einsum("nd,nd->n", units, means[inverse])
    per_sentence = np.bincount(inverse, weights=cosines) / sizes
    keep = sizes >= 2
    if not keep.any():
        return math.nan
    return float(per_sentence[keep].mean())


# --------------------------------------------------------------------------------- the analysis


@dataclass(frozen=True)
class GeometryOptions:
    bootstrap: int = 1000
    seed: int = 0
    min_occurrences: int = 5
    top_dimensions: int = 5
    lowercase_types: bool = True  # word types for self-similarity


def measure(data: LayerVectors, options: GeometryOptions = GeometryOptions(),
            standardiser: dict[int, Standardiser] | None = None) -> dict[str, Any]:
    """Every measure for every layer of `data`, raw and standardised (by `standardiser[layer]`, default: mu and
    sigma estimated on `data` itself). Raises GeometryError when fewer than two sentences have words; records a
    warning when the corpus is small (fewer than MIN_STABLE_SENTENCES sentences) or no word type is frequent
    enough for self-similarity."""
    groups = data.text_index
    sentences = int(np.unique(groups).shape[0])
    if sentences < 2:
        raise GeometryError(f"the corpus has words in {sentences} sentence(s); anisotropy compares words of "
                            "different sentences and needs at least 2")
    warnings_list: list[str] = []
    if sentences < MIN_STABLE_SENTENCES:
        warnings_list.append(f"only {sentences} sentences (fewer than {MIN_STABLE_SENTENCES}): the bootstrap "
                             "interval over sentences is unreliable and the estimates are noisy")
    types = [s.lower() for s in data.strings] if options.lowercase_types else list(data.strings)
    layers = []
    for k, layer in enumerate(data.layers):
        raw = data.vectors[k]
        scaler = (standardiser or {}).get(layer) or Standardiser.fit(raw)
        row: dict[str, Any] = {"layer": layer}
        for name, vectors in (("raw", raw), ("standardised", scaler(raw))):
            aniso = anisotropy(vectors, groups, bootstrap=options.bootstrap, seed=options.seed)
            selfsim = self_similarity(vectors, groups, types, min_occurrences=options.min_occurrences)
            intra = intra_sentence_similarity(vectors, groups)
            row[name] = {
                "anisotropy": aniso,
                "self_similarity": selfsim["mean"],
                "self_similarity_adjusted": selfsim["mean"] - aniso["mean"],
                "self_similarity_types": selfsim["types"],
                "intra_sentence_similarity": intra,
                "intra_sentence_similarity_adjusted": intra - aniso["mean"],
                "rogue": rogue_dimensions(vectors, groups, options.top_dimensions),
            }
        layers.append(row)
    if layers and layers[0]["raw"]["self_similarity_types"] == 0:
        warnings_list.append(f"no word type occurs {options.min_occurrences} or more times in two or more "
                             "sentences: self-similarity is undefined (null)")
    return {
        "sentences": sentences,
        "words": int(groups.shape[0]),
        "counts": data.counts,
        "options": options.__dict__,
        "layers": layers,
        "warnings": warnings_list,
    }


def plot(numbers: dict[str, Any], out_dir: Path, title: str = "") -> list[Path]:
    """anisotropy.png (by layer, raw and standardised, with intervals; adjusted self- and intra-sentence
    similarity) and rogue_dimensions.png (shares of the top dimensions at the last layer, raw and standardised)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = numbers["layers"]
    x = [r["layer"] for r in rows]
    figures = []
    fig, ax = plt.subplots(figsize=(6.4, 3.8), dpi=90)
    for name, colour in (("raw", "tab:red"), ("standardised", "tab:blue")):
        mean = [r[name]["anisotropy"]["mean"] for r in rows]
        low = [r[name]["anisotropy"]["low"] for r in rows]
        high = [r[name]["anisotropy"]["high"] for r in rows]
        ax.plot(x, mean, "o-", color=colour, label=f"anisotropy ({name})")
        if all(v is not None and math.isfinite(v) for v in low + high):
            ax.fill_between(x, low, high, color=colour, alpha=0.2)
        ax.plot(x, [r[name]["self_similarity_adjusted"] for r in rows], "s--", color=colour, alpha=0.7,
                label=f"self-similarity - anisotropy ({name})")
        ax.plot(x, [r[name]["intra_sentence_similarity_adjusted"] for r in rows], "^:", color=colour, alpha=0.7,
                label=f"intra-sentence - anisotropy ({name})")
    ax.set_xlabel("hidden state (0 = embeddings)")
    ax.set_ylabel("cosine")
    ax.set_xticks(x)
    ax.set_title(title or "anisotropy by layer (95 % interval shaded)")
    ax.legend(fontsize=6, loc="best")
    fig.tight_layout()
    path = out_dir / "anisotropy.png"
    _save(fig, path)
    plt.close(fig)
    figures.append(path)

    last = rows[-1]
    raw, standard = last["raw"]["rogue"], last["standardised"]["rogue"]
    dims = [t["dimension"] for t in raw["top"]]
    fig, ax = plt.subplots(figsize=(6.4, 3.2), dpi=90)
    positions = np.arange(len(dims))
    ax.bar(positions - 0.2, [raw["contributions"][d] for d in dims], 0.4, color="tab:red",
           label=f"raw (E[cos] = {raw['expected_cosine']:.3f})")
    ax.bar(positions + 0.2, [standard["contributions"][d] for d in dims], 0.4, color="tab:blue",
           label=f"standardised (E[cos] = {standard['expected_cosine']:.3f})")
    for p, t in zip(positions, raw["top"]):
        if t["share"] is not None and math.isfinite(t["share"]):
            ax.annotate(f"{100 * t['share']:.0f} %", (p - 0.2, raw["contributions"][t["dimension"]]),
                        ha="center", va="bottom", fontsize=7)
    ax.set_xticks(positions, [str(d) for d in dims])
    ax.set_xlabel("dimension (the raw vectors' largest contributions; label: share of E[cos])")
    ax.set_ylabel("contribution to E[cos]")
    ax.set_title(f"rogue dimensions, hidden state {last['layer']}", fontsize=10)
    ax.legend(fontsize=7)
    fig.tight_layout()
    path = out_dir / "rogue_dimensions.png"
    _save(fig, path)
    plt.close(fig)
    figures.append(path)
    return figures


def _save(fig: Any, path: Path) -> None:
    with atomic_write(path, "wb") as f:
        fig.savefig(f, format="png")


def read_corpus(paths: Sequence[str | os.PathLike], limit: int | None = None) -> list[str]:
    """Sentences from text files, one per non-empty line (a corpus file of one sentence or paragraph per line)."""
    texts: list[str] = []
    for path in paths:
        for _, line in text_lines(path):  # bad bytes: a DataError naming the file, line and byte offset
            if line.strip():
                texts.append(line.strip())
            if limit is not None and len(texts) >= limit:
                return texts
    return texts


def analyse(pretrained: Any, texts: Sequence[str], out_dir: str | os.PathLike, *,
            spans: Sequence[Sequence[tuple[int, int]]] | None = None, layers: Sequence[int] | None = None,
            options: GeometryOptions = GeometryOptions(), batch_size: int = 32, show_progress: bool = False,
            source: dict[str, Any] | None = None, device: Any = None,
            dtype: str = "float32") -> tuple[dict[str, Any], list[Path]]:
    """Embed `texts` (words of every layer), measure, write `anisotropy.json` and the figures into `out_dir`.
    `device` (None: where the model is) and `dtype` say where and how the model runs (`bertology.device`)."""
    out_dir = Path(out_dir)
    clock = time.perf_counter()
    data = layer_vectors(pretrained, texts, spans=spans, layers=layers, batch_size=batch_size,
                         show_progress=show_progress, description="anisotropy", device=device, dtype=dtype)
    embedded = time.perf_counter() - clock
    numbers = measure(data, options)
    numbers["source"] = source or {}
    numbers["seconds"] = {"embedding": round(embedded, 1), "total": round(time.perf_counter() - clock, 1)}
    out_dir.mkdir(parents=True, exist_ok=True)
    write_numbers(out_dir / "anisotropy.json", numbers)
    for warning in numbers["warnings"]:
        print(f"warning: {warning}", file=sys.stderr)
    return numbers, plot(numbers, out_dir)


# UD English-EWT dev sentences the quick report measures (of 2,001).
QUICK_SENTENCES = 500


def report_section(pretrained: Any, out_dir: str | os.PathLike, data_dir: str | os.PathLike,
                   model_dir: str = "MODEL", quick: bool = False) -> Section:
    """The geometry part of the report, on the sentences of UD English-EWT's dev set (words as the treebank
    splits them; the first QUICK_SENTENCES with `quick`)."""
    from bertology.analysis.ud import read_split

    corpus = Path(data_dir) / "ud-english-ewt"
    limit = QUICK_SENTENCES if quick else None
    sentences = read_split(corpus, "dev", limit)
    out_dir = Path(out_dir)
    numbers, figures = analyse(pretrained, [s.text for s in sentences], out_dir,
                               spans=[s.spans for s in sentences],
                               source={"corpus": str(corpus / "en_ewt-ud-dev.conllu"), "words": "treebank words"})
    last = numbers["layers"][-1]
    notes = [f"{numbers['sentences']} sentences, {numbers['words']} words of UD English-EWT dev.",
             f"last layer: anisotropy {last['raw']['anisotropy']['mean']:.3f}, after standardisation "
             f"{last['standardised']['anisotropy']['mean']:.3f}; the top {len(last['raw']['rogue']['top'])} "
             f"dimensions make {100 * last['raw']['rogue']['top_share']:.0f} % of the expected cosine."]
    notes += [f"warning: {w}" for w in numbers["warnings"]]
    command = shell_command("bertology", "anisotropy", "--model", model_dir, "--ud", corpus, "--out", out_dir,
                            *(("--limit", limit) if limit else ()))
    headline = {"anisotropy, last layer": round(last["raw"]["anisotropy"]["mean"], 3),
                "after standardisation": round(last["standardised"]["anisotropy"]["mean"], 3),
                f"share of the expected cosine in the top {len(last['raw']['rogue']['top'])} dimensions":
                    f"{100 * last['raw']['rogue']['top_share']:.0f} %"}
    return Section("anisotropy", "Anisotropy, self-similarity and rogue dimensions", numbers, figures, command,
                   notes, headline)
