"""A 2-D map of one word's occurrences coloured by sense (the textbook's figure of "die").

Occurrences come from SemCor (every token whose lemma is the word and that carries a sense key; the first key
when a token has several) or from a labelled TSV (`sentence<TAB>word<TAB>sense`, the word's first whole-word
match in the sentence). Their contextual vectors (one hidden state) are projected to 2-D with UMAP (umap-learn,
when installed) or PCA (numpy, always), and drawn coloured by sense.
"""

from __future__ import annotations

import os
import re
import warnings
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bertology.analysis.base import Section, shell_command, write_numbers
from bertology.analysis.geometry import layer_vectors
from bertology.errors import BertologyError, ConfigError
from bertology.inputs import text_lines
from bertology.io import atomic_write

METHODS: tuple[str, ...] = ("auto", "umap", "pca")


class SenseMapError(BertologyError):
    """Too few occurrences to map, or a labelled file is malformed."""


@dataclass(frozen=True)
class Occurrence:
    sentence: str
    span: tuple[int, int]
    sense: str
    source: str = ""  # file:line


def read_labelled(path: str | os.PathLike) -> list[Occurrence]:
    """`sentence<TAB>word<TAB>sense` lines (empty lines and `#` comments skipped); the word must occur in the
    sentence as a whole word (its first match is used)."""
    occurrences = []
    for number, line in text_lines(path):  # bad bytes: a DataError naming the file, line and byte offset
        if not line.strip() or line.startswith("#"):
            continue
        cols = line.split("\t")
        if len(cols) != 3 or not all(c.strip() for c in cols):
            raise SenseMapError(f"{path}:{number}: expected sentence<TAB>word<TAB>sense, found {len(cols)} "
                                "column(s)" + (" with an empty one" if len(cols) == 3 else ""))
        sentence, word, sense = (c.strip() for c in cols)
        match = re.search(rf"(?<!\w){re.escape(word)}(?!\w)", sentence)
        if match is None:
            raise SenseMapError(f"{path}:{number}: {word!r} is not a whole word of the sentence")
        occurrences.append(Occurrence(sentence, match.span(), sense, f"{path}:{number}"))
    return occurrences


def semcor_occurrences(directory: str | os.PathLike, lemma: str, max_sentences: int | None = None,
                       pos: str | None = None) -> list[Occurrence]:
    """SemCor tokens of `lemma` (optionally of a part of speech, SemCor's tag prefix: NN, VB, JJ, RB) tagged with
    a sense key; the first key names the sense."""
    from bertology.analysis.semcor import read_semcor

    found = []
    for sentence in read_semcor(directory, max_sentences).sentences:
        for token in sentence.tokens:
            if token.lemma == lemma and token.keys and (pos is None or token.pos.startswith(pos)):
                found.append(Occurrence(sentence.text, (token.start, token.end), token.keys[0],
                                        f"{sentence.file}:{sentence.line}"))
    return found


def project(vectors: np.ndarray, method: str = "auto", seed: int = 0) -> tuple[np.ndarray, str]:
    """[N, D] -> [N, 2] by UMAP (when `method` is "umap", or "auto" with umap-learn installed) or PCA."""
    if method not in METHODS:
        raise ConfigError(f"method: unknown {method!r}; expected one of {', '.join(METHODS)}")
    if vectors.shape[0] < 3:
        raise SenseMapError(f"a map needs at least 3 occurrences, got {vectors.shape[0]}")
    if method in ("auto", "umap"):
        try:
            import umap
        except ImportError:
            if method == "umap":
                raise SenseMapError("method='umap' needs umap-learn: pip install 'bertology[analysis]' "
                                    "(or umap-learn)") from None
        else:
            reducer = umap.UMAP(n_components=2, n_neighbors=min(15, vectors.shape[0] - 1), random_state=seed,
                                metric="cosine")
            with warnings.catch_warnings():  # umap warns that a fixed seed means one thread: wanted here
                warnings.simplefilter("ignore", UserWarning)
                return np.asarray(reducer.fit_transform(vectors), dtype=np.float64), "umap"
    centred = np.asarray(vectors, np.float64) - np.mean(vectors, 0, dtype=np.float64)
    _, _, vt = np.linalg.svd(centred, full_matrices=False)
    return centred @ vt[:2].T, "pca"


def sense_map(pretrained: Any, occurrences: Sequence[Occurrence], out_dir: str | os.PathLike, *, word: str = "",
              layer: int = -1, method: str = "auto", min_count: int = 1, seed: int = 0,
              batch_size: int = 32, device: Any = None, dtype: str = "float32") -> tuple[dict[str, Any], list[Path]]:
    """Embed the occurrences, project them and write `sense_map.json` and `sense_map.png` into `out_dir`.
    Senses with fewer than `min_count` occurrences are left out (and counted). `device` (None: where the model
    is) and `dtype` say where and how the model runs (`bertology.device`)."""
    counts = Counter(o.sense for o in occurrences)
    kept = [o for o in occurrences if counts[o.sense] >= min_count]
    if len(kept) < 3:
        raise SenseMapError(f"{word or 'the word'}: {len(kept)} occurrence(s) in senses seen at least {min_count} "
                            "time(s); a map needs at least 3")
    data = layer_vectors(pretrained, [o.sentence for o in kept], spans=[[o.span] for o in kept], layers=[layer],
                         batch_size=batch_size, device=device, dtype=dtype)
    if data.counts["spans_without_tokens"]:
        raise SenseMapError(f"{data.counts['spans_without_tokens']} occurrence(s) have no token under this tokenizer")
    points, used = project(data.vectors[0], method, seed)
    senses = sorted({o.sense for o in kept}, key=lambda s: (-counts[s], s))
    numbers = {
        "word": word,
        "layer": data.layers[0],
        "method": used,
        "occurrences": len(kept),
        "left_out": {"occurrences": len(occurrences) - len(kept),
                     "senses": sum(1 for s in counts if counts[s] < min_count)},
        "senses": {s: counts[s] for s in senses},
        "points": [{"x": float(x), "y": float(y), "sense": o.sense, "sentence": o.sentence, "source": o.source}
                   for (x, y), o in zip(points.tolist(), kept)],
        "separation": _separation(data.vectors[0], [o.sense for o in kept]),
    }
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    write_numbers(out_dir / "sense_map.json", numbers)
    return numbers, [_plot(numbers, senses, out_dir / "sense_map.png")]


def _separation(vectors: np.ndarray, senses: list[str]) -> dict[str, float]:
    """Mean cosine of pairs of occurrences of one sense and of pairs of different senses: the map's claim that
    occurrences cluster by sense, as a number that does not depend on the projection."""
    u = vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
    cosine = u @ u.T
    labels = np.asarray(senses, dtype=object)
    same = labels[:, None] == labels[None, :]
    off_diagonal = ~np.eye(len(senses), dtype=bool)
    within, between = cosine[same & off_diagonal], cosine[~same]
    return {"within_sense": float(within.mean()) if within.size else float("nan"),
            "between_senses": float(between.mean()) if between.size else float("nan")}


def _plot(numbers: dict[str, Any], senses: list[str], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.0, 4.2), dpi=90)
    colours = plt.get_cmap("tab10")
    for k, sense in enumerate(senses[:10]):
        points = [(p["x"], p["y"]) for p in numbers["points"] if p["sense"] == sense]
        ax.scatter(*zip(*points), s=14, color=colours(k), label=f"{sense} ({len(points)})")
    rest = [(p["x"], p["y"]) for p in numbers["points"] if p["sense"] not in senses[:10]]
    if rest:
        ax.scatter(*zip(*rest), s=10, color="lightgray", label=f"other senses ({len(rest)})")
    ax.set_xticks([])
    ax.set_yticks([])
    ax.set_title(f"{numbers['word']!r}: {numbers['occurrences']} occurrences, hidden state {numbers['layer']}, "
                 f"{numbers['method'].upper()}", fontsize=10)
    ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    with atomic_write(path, "wb") as f:
        fig.savefig(f, format="png")
    plt.close(fig)
    return path


def report_section(pretrained: Any, out_dir: str | os.PathLike, data_dir: str | os.PathLike,
                   model_dir: str = "MODEL", lemma: str = "make", quick: bool = False) -> Section:
    """The map of one frequent, ambiguous SemCor lemma (`make` by default; senses seen at least 3 times). With
    `quick`, projected by PCA: UMAP's first call compiles its kernels (most of this section's time)."""
    semcor = Path(data_dir) / "semcor3.0-subset"
    occurrences = semcor_occurrences(semcor, lemma)
    method = "pca" if quick else "auto"
    numbers, figures = sense_map(pretrained, occurrences, out_dir, word=lemma, min_count=3, method=method)
    separation = numbers["separation"]
    notes = [f"{numbers['occurrences']} SemCor occurrences of {lemma!r} in {len(numbers['senses'])} senses; mean "
             f"cosine within a sense {separation['within_sense']:.3f}, between senses "
             f"{separation['between_senses']:.3f}."]
    command = shell_command("bertology", "sense-map", "--model", model_dir, "--semcor", semcor, "--lemma", lemma,
                            "--min-count", 3, "--out", out_dir, *(("--method", "pca") if quick else ()))
    headline = {"occurrences": numbers["occurrences"], "senses": len(numbers["senses"]),
                "mean cosine within a sense": round(separation["within_sense"], 3),
                "mean cosine between senses": round(separation["between_senses"], 3)}
    return Section("sense_map", f"The occurrences of {lemma!r} by sense", numbers, figures, command, notes,
                   headline)
