"""XLM-R's multilingual sampling (Conneau et al., 2020; Lample & Conneau, 2019): several corpora, each tagged with a
language, mixed so that language i makes up a share

    q_i = p_i^alpha / sum_j p_j^alpha        (alpha = 0.3 in XLM-R)

of the training text, where p_i is its share of the corpora as given (in sentences, or whitespace-separated words).
alpha < 1 flattens the distribution: small languages are up-sampled (their text repeats), large ones down-sampled.

The mixture is drawn once, before tokenization, so that the tokenizer (a SentencePiece-style Unigram, as XLM-R's)
is trained on the same sampled mixture the model sees. The unit of a draw is a *block*: up to ``block_sentences``
consecutive sentences of one document, so that one long book is many draws and documents keep their order inside a
block. Draw k picks a language with probability r_i proportional to q_i / m_i (m_i: the mean size of language i's
blocks in units), so that the expected share of units from language i is exactly q_i; it then takes language i's
next block in a shuffled order that is reshuffled each time it runs out (up-sampled languages repeat every block
before any block a third time). Everything is seeded: the same config and seed give the same mixture.

The mixture is written in the BERT corpus format (a sentence per line, a blank line between blocks) with a JSON
report of p, q, r and the realised shares, and read by the ordinary pipeline (tokenizer training, shards).
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from bertology.config import validate
from bertology.text.corpus import CorpusFormat, list_corpus_files, read_documents
from bertology.data.instances import derive_seed
from bertology.errors import ConfigError, DataError
from bertology.io import atomic_directory

MIXTURE_FILE = "mixture.txt"
REPORT_FILE = "languages.json"
_LANGUAGE_STREAM = 11  # derive_seed stream of the language draws (instances use 1, dataset order 2 and 3)
_ORDER_STREAM = 12

Unit = Literal["sentences", "words"]


@dataclass
class LanguageCorpus:
    """One language's corpus: its ``language`` tag and the files (read as ``data.corpus`` is)."""

    language: str = ""
    corpus: list[str] = field(default_factory=list)
    format: CorpusFormat = "bert"
    text_field: str = "text"
    encoding: str = "utf-8"


@dataclass
class MultilingualConfig:
    """``languages``: the tagged corpora; ``alpha`` in (0, 1]: the sampling exponent (1: proportional to size);
    ``unit``: what p_i counts; ``block_sentences``: sentences per draw at most; ``blocks``: how many blocks the
    mixture holds (None: as many as all corpora hold together)."""

    languages: list[LanguageCorpus] = field(default_factory=list)
    alpha: float = 0.3
    unit: Unit = "sentences"
    block_sentences: int = 16
    blocks: int | None = None

    def __post_init__(self) -> None:
        where = "data.multilingual"
        validate(self, where)
        if not (0.0 < self.alpha <= 1.0):
            raise ConfigError(f"{where}.alpha: must be in (0, 1], got {self.alpha}")
        if not self.languages:
            raise ConfigError(f"{where}.languages: at least one language corpus is needed")
        tags = [corpus.language for corpus in self.languages]
        for index, corpus in enumerate(self.languages):
            if not corpus.language.strip():
                raise ConfigError(f"{where}.languages[{index}].language: must not be empty")
            if not corpus.corpus:
                raise ConfigError(f"{where}.languages[{index}].corpus: no files given for {corpus.language!r}")
            if corpus.language in tags[:index]:
                raise ConfigError(f"{where}.languages[{index}].language: {corpus.language!r} is given twice")
        if self.block_sentences < 1:
            raise ConfigError(f"{where}.block_sentences: must be >= 1, got {self.block_sentences}")
        if self.blocks is not None and self.blocks < 1:
            raise ConfigError(f"{where}.blocks: must be >= 1 or null, got {self.blocks}")


def sampling_probabilities(sizes: Sequence[float], alpha: float) -> np.ndarray:
    """q_i = p_i^alpha / sum_j p_j^alpha with p_i = sizes_i / sum(sizes)."""
    if not 0.0 < alpha <= 1.0:
        raise ConfigError(f"alpha: must be in (0, 1], got {alpha}")
    p = np.asarray(sizes, dtype=np.float64)
    if p.ndim != 1 or p.size == 0 or (p <= 0).any() or not np.isfinite(p).all():
        raise DataError(f"sampling_probabilities: sizes must be positive and finite, got {list(p)}")
    p = p / p.sum()
    q = p ** alpha
    return q / q.sum()


def block_size(block: Sequence[str], unit: Unit) -> int:
    return len(block) if unit == "sentences" else sum(len(sentence.split()) for sentence in block)


def read_blocks(corpus: LanguageCorpus, block_sentences: int, where: str) -> list[list[str]]:
    """The language's documents cut into blocks of at most ``block_sentences`` sentences; a corpus without any
    sentence is a DataError naming the language and its files."""
    files = list_corpus_files(corpus.corpus, corpus.format)
    blocks: list[list[str]] = []
    try:
        for document in read_documents(files, corpus.format, corpus.text_field, corpus.encoding):
            sentences = [" ".join(s.split()) for s in document]
            sentences = [s for s in sentences if s]
            blocks.extend(sentences[i:i + block_sentences] for i in range(0, len(sentences), block_sentences))
    except DataError as error:
        raise DataError(f"{where} ({corpus.language!r}): {error}") from None
    if not blocks:
        names = ", ".join(map(str, files[:3])) + (", ..." if len(files) > 3 else "")
        raise DataError(f"{where} ({corpus.language!r}): the corpus is empty (no sentence in {names})")
    return blocks


def draw_languages(weights: Sequence[float], count: int, seed: int) -> np.ndarray:
    """``count`` language indices drawn independently with probabilities ``weights`` (normalised), seeded."""
    r = np.asarray(weights, dtype=np.float64)
    rng = np.random.default_rng(derive_seed(seed, _LANGUAGE_STREAM))
    return rng.choice(len(r), size=count, p=r / r.sum())


@dataclass
class Mixture:
    """The sampled blocks in order, the language of each, and the numbers behind them."""

    blocks: list[list[str]]
    languages: list[str]
    report: dict[str, Any]


def sample_mixture(config: MultilingualConfig, seed: int = 0) -> Mixture:
    """Read every language's blocks and draw the mixture (see the module docstring)."""
    tags = [corpus.language for corpus in config.languages]
    per_language = [read_blocks(corpus, config.block_sentences, f"data.multilingual.languages[{i}]")
                    for i, corpus in enumerate(config.languages)]
    sizes = [np.array([block_size(b, config.unit) for b in blocks], dtype=np.float64) for blocks in per_language]
    totals = np.array([s.sum() for s in sizes])
    for i, total in enumerate(totals):
        if total <= 0:
            raise DataError(f"data.multilingual.languages[{i}] ({tags[i]!r}): no {config.unit} in the corpus")
    q = sampling_probabilities(totals, config.alpha)
    mean_size = np.array([s.mean() for s in sizes])
    r = q / mean_size
    r = r / r.sum()
    count = config.blocks if config.blocks is not None else sum(len(b) for b in per_language)
    drawn = draw_languages(r, count, seed)
    orders = [np.random.default_rng(derive_seed(seed, _ORDER_STREAM, i)) for i in range(len(tags))]
    queues: list[list[int]] = [[] for _ in tags]
    blocks, languages = [], []
    units = np.zeros(len(tags))
    for language in drawn.tolist():
        if not queues[language]:
            queues[language] = orders[language].permutation(len(per_language[language])).tolist()[::-1]
        index = queues[language].pop()
        blocks.append(per_language[language][index])
        languages.append(tags[language])
        units[language] += sizes[language][index]
    p = totals / totals.sum()
    report = {
        "settings": settings(config, seed),
        "alpha": config.alpha,
        "unit": config.unit,
        "block_sentences": config.block_sentences,
        "seed": seed,
        "blocks": count,
        "languages": {
            tag: {"units": int(totals[i]), "blocks_available": len(per_language[i]), "p": float(p[i]),
                  "q": float(q[i]), "draw_probability": float(r[i]),
                  "blocks_drawn": int((drawn == i).sum()), "share_drawn": float(units[i] / max(units.sum(), 1)),
                  "times_seen": float(units[i] / totals[i])}
            for i, tag in enumerate(tags)
        },
    }
    return Mixture(blocks, languages, report)


def write_mixture(mixture: Mixture, directory: str | Path) -> Path:
    """``mixture.txt`` (BERT corpus format) and ``languages.json`` (the report, and each block's language) in
    ``directory``, written atomically. Returns the mixture file."""
    directory = Path(directory)
    with atomic_directory(directory) as tmp:
        with open(tmp / MIXTURE_FILE, "w", encoding="utf-8") as handle:
            for block in mixture.blocks:
                handle.write("\n".join(block))
                handle.write("\n\n")
        report = {**mixture.report, "block_languages": mixture.languages}
        (tmp / REPORT_FILE).write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    return directory / MIXTURE_FILE


def chi_square(counts: Sequence[float], probabilities: Sequence[float]) -> float:
    """Pearson's statistic of observed ``counts`` against ``probabilities`` (for checking a sampler)."""
    counts = np.asarray(counts, dtype=np.float64)
    expected = counts.sum() * np.asarray(probabilities, dtype=np.float64)
    return float(((counts - expected) ** 2 / expected).sum()) if math.isfinite(expected.sum()) else math.inf


def settings(config: MultilingualConfig, seed: int) -> dict[str, Any]:
    """What a mixture is a function of (its corpora's files are named, not hashed)."""
    return {**json.loads(json.dumps(dataclasses.asdict(config))), "seed": seed}


def check_mixture(directory: str | Path, config: MultilingualConfig, seed: int) -> None:
    """A mixture drawn earlier in ``directory`` is reused only if it was drawn with these settings."""
    path = Path(directory) / REPORT_FILE
    try:
        saved = json.loads(path.read_text(encoding="utf-8")).get("settings")
    except (OSError, ValueError, AttributeError) as error:
        raise DataError(f"{path}: cannot read the mixture's report ({error}); remove {directory}") from None
    if saved != settings(config, seed):
        raise DataError(f"{path}: the mixture there was drawn with other data.multilingual settings or run.seed; "
                        f"remove {directory} (and the tokenizer and shards made from it) to draw it again")
