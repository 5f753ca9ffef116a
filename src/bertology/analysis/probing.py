"""Per-layer linear probes on a Universal Dependencies treebank, with Hewitt & Liang's (2019) control tasks.

- UPOS: a softmax regression from a word's vector (at one hidden state) to its universal part of speech.
- Relation: a softmax regression from the concatenation [head vector; dependent vector] of every non-root word to
  its universal dependency relation (subtypes stripped: `nmod:poss` counts as `nmod`).
- Control tasks: every word type (its form) gets a label drawn once from the task's empirical label distribution
  on the training set, fixed across train, dev and test; the relation control reads the dependent's type. A probe
  that scores well on the control task memorises word identity rather than reading the property, so the number
  reported beside accuracy is selectivity = accuracy - control accuracy (both on test).

Features: the treebank's words (multiword tokens split by character, see `bertology.analysis.ud`) embedded once
for every hidden state (`geometry.layer_vectors`), standardised with the training set's mean and deviation (an
affine map, so the probe stays linear). Training: full-batch-per-epoch minibatch Adam on cached features; the L2
weight and the number of epochs are chosen on dev accuracy, and test is reported once for that choice.
"""

from __future__ import annotations

import math
import os
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bertology.analysis.base import Section, shell_command, write_numbers
from bertology.analysis.geometry import LayerVectors, layer_vectors
from bertology.analysis.ud import UDSentence, read_split, stats
from bertology.device import place
from bertology.errors import BertologyError, ConfigError
from bertology.io import atomic_write

TASKS: tuple[str, ...] = ("upos", "relation")


class ProbingError(BertologyError):
    """A probing run cannot go on: no training words, a label set of one, mismatched features."""


@dataclass(frozen=True)
class ProbeOptions:
    """Probe training: minibatch Adam, `epochs` at most (the best dev epoch is kept), `l2` weights tried."""

    epochs: int = 12
    batch_size: int = 256
    learning_rate: float = 1e-2
    l2: tuple[float, ...] = (0.0, 1e-3)
    seed: int = 0

    def __post_init__(self) -> None:
        if self.epochs < 1 or self.batch_size < 1 or self.learning_rate <= 0 or not self.l2 or \
                any(w < 0 for w in self.l2):
            raise ConfigError(f"probe options: epochs, batch_size, learning_rate and l2 must be positive (l2 >= 0), "
                              f"got {self}")


# --------------------------------------------------------------------------------- labels and control tasks


def task_examples(sentences: Sequence[UDSentence], task: str) -> tuple[list[tuple[int, int, int]], list[str],
                                                                       list[str]]:
    """The examples of a task over sentences: (sentence, dependent word, head word or -1) indices, labels and the
    word type the control task reads (the dependent's form)."""
    if task not in TASKS:
        raise ConfigError(f"task: unknown {task!r}; expected one of {', '.join(TASKS)}")
    examples, labels, types = [], [], []
    for s, sentence in enumerate(sentences):
        for i, word in enumerate(sentence.words):
            if task == "upos":
                examples.append((s, i, -1))
                labels.append(sentence.upos[i])
            else:
                if sentence.heads[i] == 0:  # the root has no head word: its relation is given away
                    continue
                examples.append((s, i, sentence.heads[i] - 1))
                labels.append(sentence.relations[i])
            types.append(word)
    return examples, labels, types


def control_labels(train_labels: Sequence[str], word_types: Sequence[str], seed: int = 0) -> dict[str, str]:
    """Hewitt & Liang's control task: each word type (sorted, so the draw does not depend on the order met) gets
    a label sampled independently from the empirical distribution of `train_labels`."""
    counts = Counter(train_labels)
    if not counts:
        raise ProbingError("control task: no training labels")
    labels = sorted(counts)
    weights = np.array([counts[label] for label in labels], dtype=np.float64)
    types = sorted(set(word_types))
    draws = np.random.default_rng(seed).choice(len(labels), size=len(types), p=weights / weights.sum())
    return {word: labels[k] for word, k in zip(types, draws.tolist())}


def selectivity(accuracy: float, control_accuracy: float) -> float:
    """Hewitt & Liang's selectivity: task accuracy minus control-task accuracy (same probe, same features)."""
    return accuracy - control_accuracy


# --------------------------------------------------------------------------------- the probe


@dataclass
class ProbeResult:
    dev_accuracy: float
    test_accuracy: float
    l2: float
    epochs: int


def train_probe(train_x: torch.Tensor, train_y: torch.Tensor, dev_x: torch.Tensor, dev_y: torch.Tensor,
                test_x: torch.Tensor, test_y: torch.Tensor, num_labels: int,
                options: ProbeOptions = ProbeOptions()) -> ProbeResult:
    """A softmax-regression probe: for each L2 weight, train up to `epochs` epochs, keeping the epoch with the
    best dev accuracy; the (L2, epoch) with the best dev accuracy is scored once on test."""
    if train_x.shape[0] == 0:
        raise ProbingError("a probe needs training examples")
    best: tuple[float, float, int, dict[str, torch.Tensor]] | None = None
    for l2 in options.l2:
        generator = torch.Generator().manual_seed(options.seed)
        probe = torch.nn.Linear(train_x.shape[1], num_labels)
        with torch.no_grad():
            probe.weight.normal_(0.0, 0.01, generator=generator)
            probe.bias.zero_()
        optimiser = torch.optim.Adam(probe.parameters(), lr=options.learning_rate)
        n = train_x.shape[0]
        for epoch in range(1, options.epochs + 1):
            order = torch.randperm(n, generator=generator)
            for start in range(0, n, options.batch_size):
                rows = order[start: start + options.batch_size]
                loss = torch.nn.functional.cross_entropy(probe(train_x[rows]), train_y[rows])
                if l2:
                    loss = loss + l2 * probe.weight.square().sum()
                optimiser.zero_grad()
                loss.backward()
                optimiser.step()
            accuracy = _accuracy(probe, dev_x, dev_y)
            if best is None or accuracy > best[0]:
                best = (accuracy, l2, epoch, {k: v.detach().clone() for k, v in probe.state_dict().items()})
    accuracy, l2, epoch, state = best
    probe = torch.nn.Linear(train_x.shape[1], num_labels)
    probe.load_state_dict(state)
    return ProbeResult(accuracy, _accuracy(probe, test_x, test_y), l2, epoch)


def _accuracy(probe: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    if x.shape[0] == 0:
        return math.nan
    with torch.no_grad():
        return float((probe(x).argmax(1) == y).double().mean())


# --------------------------------------------------------------------------------- the analysis


@dataclass
class _Split:
    sentences: list[UDSentence]
    vectors: LayerVectors
    offsets: np.ndarray  # first row of each sentence in the vectors


def _embed_split(pretrained: Any, sentences: list[UDSentence], layers: Sequence[int] | None, batch_size: int,
                 show_progress: bool, name: str, dtype: str = "float32") -> _Split:
    data = layer_vectors(pretrained, [s.text for s in sentences], spans=[s.spans for s in sentences], layers=layers,
                         batch_size=batch_size, show_progress=show_progress, description=f"probe features ({name})",
                         dtype=dtype)
    if data.counts["spans_without_tokens"]:
        # a word without tokens would shift every later row of its sentence: such sentences cannot be aligned
        raise ProbingError(f"{data.counts['spans_without_tokens']} treebank words have no token under this "
                           "tokenizer (characters it drops); probing needs a vector for every word")
    sizes = np.bincount(data.text_index, minlength=len(sentences))
    offsets = np.zeros(len(sentences), dtype=np.int64)
    np.cumsum(sizes[:-1], out=offsets[1:])
    return _Split(sentences, data, offsets)


def _features(split: _Split, layer: int, examples: list[tuple[int, int, int]], pair: bool) -> np.ndarray:
    """[n, H] dependent vectors, or [n, 2H] [head; dependent] for a pair task."""
    vectors = split.vectors.vectors[layer]
    index = np.asarray(examples, dtype=np.int64).reshape(-1, 3)
    dependents = vectors[split.offsets[index[:, 0]] + index[:, 1]]
    if not pair:
        return dependents
    heads = vectors[split.offsets[index[:, 0]] + index[:, 2]]
    return np.concatenate([heads, dependents], axis=1)


def probe_layers(splits: dict[str, _Split], tasks: Sequence[str] = TASKS, options: ProbeOptions = ProbeOptions(),
                 show_progress: bool = False) -> dict[str, Any]:
    """Train every task's probe and its control probe at every embedded layer; accuracies on dev and test."""
    from tqdm.auto import tqdm

    results: dict[str, Any] = {}
    layers = splits["train"].vectors.layers
    for task in tasks:
        per_split = {name: task_examples(split.sentences, task) for name, split in splits.items()}
        train_labels = per_split["train"][1]
        label_names = sorted(set(train_labels))
        if len(label_names) < 2:
            raise ProbingError(f"{task}: the training words have {len(label_names)} label(s); a probe needs two")
        label_id = {label: k for k, label in enumerate(label_names)}
        control = control_labels(train_labels, [t for _, _, types in per_split.values() for t in types],
                                 options.seed)
        unseen = {name: sum(1 for label in labels if label not in label_id)
                  for name, (_, labels, _) in per_split.items()}
        majority = Counter(train_labels).most_common(1)[0][0]
        rows = []
        for k, layer in enumerate(tqdm(layers, desc=f"probing {task}", disable=not show_progress)):
            x, y, yc = {}, {}, {}
            for name, split in splits.items():
                examples, labels, types = per_split[name]
                x[name] = _features(split, k, examples, pair=task == "relation")
                # a dev/test label never seen in training can never be predicted: -1 counts as wrong
                y[name] = torch.tensor([label_id.get(label, -1) for label in labels])
                yc[name] = torch.tensor([label_id[control[t]] for t in types])
            mean = x["train"].mean(0, dtype=np.float64)
            std = x["train"].std(0, dtype=np.float64)
            std[std == 0] = 1.0
            tx = {name: torch.from_numpy(((v - mean) / std).astype(np.float32)) for name, v in x.items()}
            task_result = train_probe(tx["train"], y["train"], tx["dev"], y["dev"], tx["test"], y["test"],
                                      len(label_names), options)
            control_result = train_probe(tx["train"], yc["train"], tx["dev"], yc["dev"], tx["test"], yc["test"],
                                         len(label_names), options)
            rows.append({
                "layer": layer,
                "dev_accuracy": task_result.dev_accuracy,
                "test_accuracy": task_result.test_accuracy,
                "control_dev_accuracy": control_result.dev_accuracy,
                "control_test_accuracy": control_result.test_accuracy,
                "selectivity": selectivity(task_result.test_accuracy, control_result.test_accuracy),
                "chosen": {"task": {"l2": task_result.l2, "epochs": task_result.epochs},
                           "control": {"l2": control_result.l2, "epochs": control_result.epochs}},
            })
        best = max(rows, key=lambda r: r["dev_accuracy"])
        results[task] = {
            "labels": label_names,
            "examples": {name: len(labels) for name, (_, labels, _) in per_split.items()},
            "labels_unseen_in_train": unseen,
            "majority_label": majority,
            "majority_test_accuracy": float(np.mean([label == majority for label in per_split["test"][1]])),
            "control_types": len(control),
            "layers": rows,
            "best_layer_by_dev": best["layer"],
        }
    return results


def plot(numbers: dict[str, Any], path: Path, title: str = "") -> Path:
    """Test accuracy (solid), control accuracy (dotted) and selectivity (dashed) by layer, one colour per task."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 3.6), dpi=90)
    for (task, result), colour in zip(numbers["tasks"].items(), ("tab:blue", "tab:green")):
        x = [r["layer"] for r in result["layers"]]
        ax.plot(x, [r["test_accuracy"] for r in result["layers"]], "o-", color=colour, label=f"{task} accuracy")
        ax.plot(x, [r["control_test_accuracy"] for r in result["layers"]], "x:", color=colour,
                label=f"{task} control accuracy")
        ax.plot(x, [r["selectivity"] for r in result["layers"]], "s--", color=colour, label=f"{task} selectivity")
        ax.set_xticks(x)
    ax.set_xlabel("hidden state (0 = embeddings)")
    ax.set_ylabel("test accuracy / selectivity")
    ax.set_ylim(0, 1)
    ax.set_title(title or "linear probes on UD English-EWT by layer", fontsize=10)
    ax.legend(fontsize=7, loc="lower right", ncol=2)
    fig.tight_layout()
    with atomic_write(path, "wb") as f:
        fig.savefig(f, format="png")
    plt.close(fig)
    return path


def probe(pretrained: Any, ud_dir: str | os.PathLike, out_dir: str | os.PathLike, *,
          layers: Sequence[int] | None = None, limit: int | None = None, tasks: Sequence[str] = TASKS,
          options: ProbeOptions = ProbeOptions(), batch_size: int = 32, show_progress: bool = False,
          device: Any = None, dtype: str = "float32") -> tuple[dict[str, Any], list[Path]]:
    """Probe every layer (or `layers`) of `pretrained` on the treebank in `ud_dir` (train, dev, test; `limit`
    caps each split's sentences); writes `probing.json` and `probing.png` into `out_dir`. `device` (None: where
    the model is) and `dtype` say where and how the model embeds the words (`bertology.device`); the probes train
    on the CPU."""
    out_dir = Path(out_dir)
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise ConfigError(f"limit must be a positive number of sentences, got {limit!r}")
    for task in tasks:
        if task not in TASKS:
            raise ConfigError(f"tasks: unknown {task!r}; expected some of {', '.join(TASKS)}")
    where = place(pretrained, device, dtype)
    torch.manual_seed(options.seed)
    clock = time.perf_counter()
    splits = {}
    for name in ("train", "dev", "test"):
        sentences = read_split(ud_dir, name, limit)
        splits[name] = _embed_split(pretrained, sentences, layers, batch_size, show_progress, name, where.dtype)
    embedded = time.perf_counter() - clock
    tasks_result = probe_layers(splits, tasks, options, show_progress)
    numbers = {
        "treebank": str(ud_dir),
        "limit": limit,
        "data": {name: {**stats(split.sentences).as_dict(), **split.vectors.counts}
                 for name, split in splits.items()},
        "options": {**options.__dict__, "l2": list(options.l2)},
        "tasks": tasks_result,
        "seconds": {"features": round(embedded, 1), "total": round(time.perf_counter() - clock, 1)},
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    write_numbers(out_dir / "probing.json", numbers)
    figure = plot(numbers, out_dir / "probing.png")
    for name, task in tasks_result.items():
        best = next(r for r in task["layers"] if r["layer"] == task["best_layer_by_dev"])
        print(f"{name}: best layer {best['layer']} (by dev), test accuracy {best['test_accuracy']:.3f}, "
              f"selectivity {best['selectivity']:.3f}", file=sys.stderr)
    return numbers, [figure]


# Sentences per split the quick report probes (docs/ANALYSIS.md's probing rows use as many).
QUICK_SENTENCES = 300


def report_section(pretrained: Any, out_dir: str | os.PathLike, data_dir: str | os.PathLike,
                   model_dir: str = "MODEL", limit: int | None = 2000, quick: bool = False) -> Section:
    """The probing part of the report: UD English-EWT, the first `limit` sentences of each split
    (QUICK_SENTENCES with `quick`)."""
    ud = Path(data_dir) / "ud-english-ewt"
    if quick:
        limit = min(limit or QUICK_SENTENCES, QUICK_SENTENCES)
    numbers, figures = probe(pretrained, ud, out_dir, limit=limit)
    notes = []
    headline: dict[str, Any] = {}
    for task, result in numbers["tasks"].items():
        best = next(r for r in result["layers"] if r["layer"] == result["best_layer_by_dev"])
        headline[f"{task}: best layer (on dev)"] = best["layer"]
        headline[f"{task}: test accuracy there (majority {result['majority_test_accuracy']:.3f})"] = round(
            best["test_accuracy"], 3)
        headline[f"{task}: selectivity there"] = round(best["selectivity"], 3)
        notes.append(f"{task}: best hidden state {best['layer']} (chosen on dev): test accuracy "
                     f"{best['test_accuracy']:.3f}, control {best['control_test_accuracy']:.3f}, selectivity "
                     f"{best['selectivity']:.3f}; majority label {result['majority_test_accuracy']:.3f}.")
    command = shell_command("bertology", "probe", "--model", model_dir, "--ud", ud, "--out", out_dir,
                            *(("--limit", limit) if limit else ()))
    return Section("probing", "Linear probes by layer (UPOS, dependency relations) with control tasks", numbers,
                   figures, command, notes, headline)
