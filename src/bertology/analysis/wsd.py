"""Word sense disambiguation by the nearest sense embedding (LMMS 1-NN; Loureiro & Jorge, ACL 2019).

`fit_senses`: a sense's vector is the mean contextual vector of the SemCor tokens tagged with its key (the
subword tokens of a token, or of a multi-word expression, averaged; layers as `bertology.embed`'s). `predict`: for
each instance of a framework data file, the candidate senses are the WordNet 3.0 senses of its lemma and part of
speech and the answer is the candidate whose vector is nearest by cosine; when no candidate has a vector, WordNet's
first sense. `score`: the framework scorer's semantics.

The LMMS extensions are options of `predict` (their defaults are stored with the vectors by `fit_senses`):

- `propagate`: vectors for senses SemCor never tags, through WordNet, as LMMS's extend.py: a key whose synset has
  tagged keys takes their mean ("synset"); else the mean of its synset's direct hypernyms' vectors ("hypernym");
  else the mean vector of its lexicographer file ("lexname", every synset with a vector after the first two steps
  counted once). Unlike extend.py, the hypernym step reads only the synset step's vectors, so the result does
  not depend on the order keys are visited in.
- `gloss_weight`: the sense vector joined with the vector of its gloss text "lemma - lemma1 , lemma2 -
  definition" (LMMS's emb_glosses.py; mean over its tokens, specials included). LMMS concatenates the
  L2-normalised contextual and gloss vectors and the test vector with itself; the cosine of those 2D-vectors is
  the mean of the two cosines, so the score here is (1 - w) cos(t, v_s) + w cos(t, g_s) and w = 0.5 is LMMS.
  Gloss vectors are computed at prediction time for the candidates only (a few thousand per data set instead of
  WordNet's 206,941 senses).
- `standardize`: z = (x - mu) / sigma per dimension before the cosine, mu and sigma estimated on every SemCor
  token at fit time (Timkey & van Schijndel 2021: a few rogue dimensions dominate cosine similarity).
  Standardisation is affine, so standardising the mean vectors equals averaging the standardised tokens.
- `first_sense_bonus`: a number b added to the score of the candidate WordNet lists first (when it has a vector):
  the nearest sense wins over the first sense only by more than b. Not part of LMMS; SemCor's skew towards
  first senses is what makes the first-sense baseline strong on small training sets.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from bertology.analysis.base import Section, shell_command, write_numbers
from bertology.analysis.raganato import read_keys, read_raganato, write_keys
from bertology.analysis.semcor import read_semcor
from bertology.analysis.wordnet import WordNet, load_wordnet
from bertology.errors import ConfigError, DataError
from bertology.inputs import read_npz
from bertology.io import atomic_write, check_output_file

FORMAT = "bertology-sense-vectors/1"
PROPAGATIONS = ("none", "synset", "hypernym", "lexname")
# The configuration that scored best on senseval2 + semeval2007 with all-MiniLM-L6-v2 (docs/analysis/wsd.md).
DEFAULT_LAYERS: Any = "last"
DEFAULT_PROPAGATE = "none"
DEFAULT_GLOSS_WEIGHT = 0.25
DEFAULT_STANDARDIZE = False
DEFAULT_FIRST_SENSE_BONUS = 0.02
# Sentences embedded per call of `embed`: bounds the token vectors held at once.
CHUNK_SENTENCES = 512
_SS_POS = {"1": "NOUN", "2": "VERB", "3": "ADJ", "4": "ADV", "5": "ADJ"}


class SenseVectorError(DataError):
    """A sense-vector file cannot be read, or does not belong to the model it is used with."""


@dataclass
class SenseVectors:
    """Mean contextual vectors of the SemCor-tagged senses (not standardised), the lexname means used by
    propagation, the token mean and standard deviation for standardisation, and how they were made."""

    keys: list[str]
    vectors: np.ndarray  # [S, D] float32
    counts: np.ndarray  # [S] int64: tokens averaged per key
    lexnames: list[str]
    lexname_vectors: np.ndarray  # [K, D] float32
    mean: np.ndarray  # [D] float32, over every SemCor token
    std: np.ndarray  # [D] float32
    config: dict[str, Any]  # layers, combine, propagate, gloss_weight, standardize, max_length
    model: dict[str, Any]  # path, fingerprint, num_layers, hidden_size
    stats: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.index = {key: i for i, key in enumerate(self.keys)}

    @property
    def dim(self) -> int:
        return int(self.vectors.shape[1])

    def save(self, path: str | os.PathLike) -> Path:
        """One .npz (numeric arrays, keys as UTF-8 bytes + offsets, metadata as JSON), written atomically."""
        path = Path(path)
        if path.suffix != ".npz":
            raise ConfigError(f"{path}: sense vectors are written to a .npz file")
        from bertology.embeddings.files import _pack_strings

        meta = {"format": FORMAT, "config": self.config, "model": self.model, "stats": self.stats,
                "lexnames": self.lexnames}
        with atomic_write(path, "wb") as handle:
            np.savez(handle, vectors=self.vectors, counts=self.counts, lexname_vectors=self.lexname_vectors,
                     mean=self.mean, std=self.std, **_pack_strings("keys", self.keys),
                     meta=np.frombuffer(json.dumps(meta).encode("utf-8"), dtype=np.uint8))
        return path

    @classmethod
    def load(cls, path: str | os.PathLike) -> SenseVectors:
        from bertology.embeddings.files import _unpack_strings

        path = Path(path)
        what = "a sense-vector file written by bertology wsd fit"
        # Sizes and headers are checked before any array is read: a truncated, empty or tampered file is named.
        arrays = read_npz(path, ("vectors", "counts", "lexname_vectors", "mean", "std", "keys_utf8", "keys_offsets",
                                 "meta"), SenseVectorError, what)
        try:
            meta = json.loads(arrays["meta"].tobytes().decode("utf-8"))
            keys = _unpack_strings(arrays["keys_utf8"], arrays["keys_offsets"], path, "keys")
        except (ValueError, UnicodeDecodeError, DataError) as error:
            raise SenseVectorError(f"{path}: not {what} ({error})") from None
        if not isinstance(meta, dict) or meta.get("format") != FORMAT:
            found = meta.get("format") if isinstance(meta, dict) else None
            raise SenseVectorError(f"{path}: format {found!r}, expected {FORMAT!r}")
        for key, kind in (("lexnames", list), ("config", dict), ("model", dict)):
            if not isinstance(meta.get(key), kind):
                raise SenseVectorError(f"{path}: meta.{key} is missing or not a JSON {kind.__name__}")
        vectors = arrays["vectors"]
        if vectors.ndim != 2 or len(keys) != vectors.shape[0] or arrays["counts"].shape != (len(keys),):
            raise SenseVectorError(f"{path}: {len(keys)} keys for vectors of shape {list(vectors.shape)}")
        dim = vectors.shape[1]
        for name, shape in (("mean", (dim,)), ("std", (dim,)), ("lexname_vectors", (len(meta["lexnames"]), dim))):
            if arrays[name].shape != shape:
                raise SenseVectorError(f"{path}: {name} has shape {list(arrays[name].shape)}, expected {list(shape)}")
        return cls(keys, vectors, arrays["counts"], list(meta["lexnames"]), arrays["lexname_vectors"],
                   arrays["mean"], arrays["std"], meta["config"], meta["model"], meta.get("stats", {}))


# ------------------------------------------------------------------------------------------------------- fit


def fit_senses(
    pretrained: Any,
    semcor_dir: str | os.PathLike,
    wordnet_dir: str | os.PathLike,
    *,
    layers: Any = DEFAULT_LAYERS,
    combine: str | None = None,
    propagate: str = DEFAULT_PROPAGATE,
    gloss_weight: float = DEFAULT_GLOSS_WEIGHT,
    standardize: bool = DEFAULT_STANDARDIZE,
    first_sense_bonus: float = DEFAULT_FIRST_SENSE_BONUS,
    batch_size: int = 64,
    max_length: int | None = None,
    max_sentences: int | None = None,
    show_progress: bool = False,
    device: Any = None,
    dtype: str = "float32",
) -> SenseVectors:
    """Sense vectors from the SemCor tag files under `semcor_dir`, for a `Pretrained` model (or a model
    directory). `propagate`, `gloss_weight`, `standardize` and `first_sense_bonus` are stored as the defaults
    `predict` uses.
    Keys not in WordNet are skipped and counted in `stats`; so are tokens whose text the tokenizer drops.
    `device` (None: where the model is, the CPU for a directory) and `dtype` say where and how the model runs
    (`bertology.device`)."""
    _check_options(propagate, gloss_weight, first_sense_bonus)
    pretrained, model_info = _model(pretrained)
    from bertology.device import place  # torch: imported only where a model runs

    where = place(pretrained, device, dtype)
    started = time.perf_counter()
    wordnet = load_wordnet(wordnet_dir)
    corpus = read_semcor(semcor_dir, max_sentences=max_sentences)
    stats: Counter = Counter(corpus.counts)
    key_index: dict[str, int] = {}
    texts, spans, span_keys = [], [], []
    for sentence in corpus.sentences:
        texts.append(sentence.text)
        spans.append([(t.start, t.end) for t in sentence.tokens])
        for token in sentence.tokens:
            ids = []
            for key in token.keys:
                if key not in wordnet:
                    stats["keys not in WordNet"] += 1
                    continue
                ids.append(key_index.setdefault(key, len(key_index)))
            span_keys.append(ids)
    if not key_index:
        raise DataError(f"{semcor_dir}: no token is tagged with a WordNet sense key; nothing to fit")

    config = {"layers": layers if isinstance(layers, str) else list(np.atleast_1d(layers).tolist()),
              "combine": combine, "max_length": max_length, "propagate": propagate,
              "gloss_weight": float(gloss_weight), "standardize": bool(standardize),
              "first_sense_bonus": float(first_sense_bonus)}
    sums = None
    counts = np.zeros(len(key_index), dtype=np.int64)
    moment1 = moment2 = None
    seen = 0
    row = 0
    for vectors, missing, long_texts in _span_vectors(pretrained, texts, spans, config, batch_size, show_progress,
                                                      "SemCor", where.dtype):
        if sums is None:
            sums = np.zeros((len(key_index), vectors.shape[1]), dtype=np.float64)
            moment1 = np.zeros(vectors.shape[1], dtype=np.float64)
            moment2 = np.zeros(vectors.shape[1], dtype=np.float64)
        stats["tokens the tokenizer drops"] += int(missing.sum())
        stats["sentences longer than the model (windowed)"] += long_texts
        good = ~missing
        moment1 += vectors[good].sum(0, dtype=np.float64)
        moment2 += np.square(vectors[good], dtype=np.float64).sum(0)
        seen += int(good.sum())
        for r in range(vectors.shape[0]):
            ids = span_keys[row + r]
            if ids and not missing[r]:
                sums[ids] += vectors[r]
                counts[ids] += 1
        row += vectors.shape[0]
    if seen < 2:
        raise DataError(f"{semcor_dir}: {seen} embedded tokens; too few to estimate a mean and a deviation")
    keep = counts > 0
    keys = [k for k, i in sorted(key_index.items(), key=lambda item: item[1]) if keep[i]]
    means = (sums[keep] / counts[keep, None]).astype(np.float32)
    mu = moment1 / seen
    std = np.sqrt(np.maximum(moment2 / seen - mu**2, 0.0) * seen / (seen - 1))
    senses = SenseVectors(keys, means, counts[keep], [], np.zeros((0, means.shape[1]), np.float32),
                          mu.astype(np.float32), np.maximum(std, 1e-6).astype(np.float32), config, model_info)
    senses.lexnames, senses.lexname_vectors = _lexname_vectors(senses, wordnet)
    stats["senses with a vector"] = len(keys)
    stats["token-key pairs averaged"] = int(counts.sum())
    senses.stats = {**{k: int(v) for k, v in sorted(stats.items())},
                    "fit seconds": round(time.perf_counter() - started, 1)}
    return senses


# --------------------------------------------------------------------------------------------------- predict


def predict(
    pretrained: Any,
    senses: SenseVectors | str | os.PathLike,
    wordnet_dir: str | os.PathLike,
    data: str | os.PathLike,
    output: str | os.PathLike | None = None,
    *,
    propagate: str | None = None,
    gloss_weight: float | None = None,
    standardize: bool | tuple[np.ndarray, np.ndarray] | None = None,
    first_sense_bonus: float | None = None,
    batch_size: int = 64,
    show_progress: bool = False,
    device: Any = None,
    dtype: str = "float32",
) -> tuple[dict[str, str], dict[str, Any]]:
    """Disambiguate every instance of a framework `.data.xml` file, the model on `device` in `dtype` as
    `fit_senses` takes them; returns {instance id: sense key} (written to `output` as a key file when given) and
    a JSON-able summary with the counts. Options left None take the values
    stored with the sense vectors. `standardize` may also be a (mu, sigma) pair of [D] arrays estimated on another
    corpus, used instead of the SemCor estimate."""
    if output is not None:
        check_output_file(output)  # before any inference work
    source = str(senses) if not isinstance(senses, SenseVectors) else None
    if not isinstance(senses, SenseVectors):
        senses = SenseVectors.load(senses)
    propagate = senses.config["propagate"] if propagate is None else propagate
    gloss_weight = senses.config["gloss_weight"] if gloss_weight is None else float(gloss_weight)
    standardize = senses.config["standardize"] if standardize is None else standardize
    if isinstance(standardize, tuple):
        mu, sigma = (np.asarray(a, dtype=np.float64) for a in standardize)
        if mu.shape != (senses.dim,) or sigma.shape != (senses.dim,) or not (sigma > 0).all():
            raise ConfigError(f"standardize: expected (mu, sigma) of shape [{senses.dim}] with sigma > 0, got "
                              f"{list(mu.shape)} and {list(sigma.shape)}")
        standardize, source_of_z = True, "given"
    else:
        standardize, source_of_z = bool(standardize), "SemCor tokens"
        mu, sigma = senses.mean.astype(np.float64), senses.std.astype(np.float64)
    if first_sense_bonus is None:
        first_sense_bonus = senses.config.get("first_sense_bonus", 0.0)
    _check_options(propagate, gloss_weight, first_sense_bonus)
    pretrained, model_info = _model(pretrained)
    if model_info["fingerprint"] != senses.model["fingerprint"]:
        raise SenseVectorError(f"{source or 'the sense vectors'} were fitted with the model at "
                               f"{senses.model.get('path')} (weights {senses.model['fingerprint'][:12]}...), not with "
                               f"{model_info['path']} ({model_info['fingerprint'][:12]}...)")
    from bertology.device import place  # torch: imported only where a model runs

    where = place(pretrained, device, dtype)
    started = time.perf_counter()
    wordnet = load_wordnet(wordnet_dir)
    dataset = read_raganato(data)
    counts: Counter = Counter()
    spans: list[list[tuple[int, int]]] = [[] for _ in dataset.sentences]
    for instance in dataset.instances:
        spans[instance.sentence].append((instance.start, instance.end))
    vectors = []
    for chunk, missing, long_texts in _span_vectors(pretrained, [s.text for s in dataset.sentences], spans,
                                                    senses.config, batch_size, show_progress, "instances",
                                                    where.dtype):
        vectors.append(chunk)
        counts["instances the tokenizer drops"] += int(missing.sum())
        counts["sentences longer than the model (windowed)"] += long_texts
    token_vectors = np.concatenate(vectors) if vectors else np.zeros((0, senses.dim), np.float32)
    # Instances come sentence by sentence, so row i of token_vectors is instance i.

    resolver = _Resolver(senses, wordnet, propagate)
    candidates: dict[str, list[tuple[str, np.ndarray]]] = {}
    for instance in dataset.instances:
        keys = wordnet.candidates(instance.lemma, instance.pos)
        found = [(k, resolver.vector(k)) for k in keys]
        candidates[instance.id] = [(k, v) for k, v in found if v is not None]
    gloss = {}
    if gloss_weight > 0:  # only candidates that can win need a gloss vector
        wanted = sorted({k for scored in candidates.values() for k, _ in scored})
        gloss = _gloss_vectors(pretrained, wordnet, wanted, senses.config, batch_size, show_progress, where.dtype)

    def prepare(x: np.ndarray) -> np.ndarray:
        if standardize:
            x = (x - mu) / sigma
        norm = np.linalg.norm(x, axis=-1, keepdims=True)
        return x / np.maximum(norm, 1e-12)

    predictions: dict[str, str] = {}
    for row, instance in enumerate(dataset.instances):
        keys = wordnet.candidates(instance.lemma, instance.pos)
        counts["instances"] += 1
        if not keys:
            counts["lemmas with no senses (unanswered)"] += 1
            continue
        vector = token_vectors[row]
        scored = candidates[instance.id]
        if not scored or not np.isfinite(vector).all() or not np.any(vector):
            predictions[instance.id] = keys[0]
            counts["first-sense fallback (no candidate has a vector)"] += 1
            continue
        t = prepare(vector)
        context = prepare(np.stack([v for _, v in scored]))
        similarity = (1 - gloss_weight) * (context @ t)
        if gloss_weight > 0:
            similarity += gloss_weight * (prepare(np.stack([gloss[k] for k, _ in scored])) @ t)
        if first_sense_bonus and scored[0][0] == keys[0]:
            similarity[0] += first_sense_bonus
        predictions[instance.id] = scored[int(np.argmax(similarity))][0]
        counts["answered by nearest sense"] += 1
        counts["single candidate"] += len(keys) == 1
    if output is not None:
        write_keys(output, predictions)
    summary = {
        "data": str(data),
        "senses": source,
        "options": {"propagate": propagate, "gloss_weight": gloss_weight,
                    "standardize": source_of_z if standardize else False,
                    "first_sense_bonus": first_sense_bonus,
                    **{k: senses.config[k] for k in ("layers", "combine")}},
        "counts": {k: int(v) for k, v in sorted(counts.items())},
        "candidate vectors by source": dict(sorted(resolver.sources.items())),
        "seconds": round(time.perf_counter() - started, 1),
    }
    return predictions, summary


# ----------------------------------------------------------------------------------------------------- score


def score(gold: str | os.PathLike | dict[str, list[str]],
          predictions: str | os.PathLike | dict[str, list[str]]) -> dict[str, Any]:
    """The framework scorer (Scorer.java of Raganato et al. 2017): an instance's answer is right when it is among
    its gold keys (an instance answered with n keys counts each as 1/n); instances missing from the gold file
    are ignored. P = right / answered, R = right / gold instances, F1 = 2PR / (P + R), in percent; also per part
    of speech (from the first gold key's ss_type: 1 NOUN, 2 VERB, 3 and 5 ADJ, 4 ADV)."""
    gold_keys = gold if isinstance(gold, dict) else read_keys(gold)
    system = predictions if isinstance(predictions, dict) else read_keys(predictions)
    totals: dict[str, Counter] = {"ALL": Counter()}
    for instance_id, keys in gold_keys.items():
        pos = _SS_POS.get(keys[0].partition("%")[2][:1], "OTHER") if keys else "OTHER"
        for group in ("ALL", pos):
            tally = totals.setdefault(group, Counter())
            tally["total"] += 1
            answers = system.get(instance_id)
            if answers:
                right = sum(a in keys for a in answers) / len(answers)
                tally["right"] += right
                tally["answered"] += 1
    result = _prf(totals.pop("ALL"))
    result["per_pos"] = {pos: _prf(totals[pos]) for pos in ("NOUN", "VERB", "ADJ", "ADV", "OTHER") if pos in totals}
    result["unknown ids in predictions"] = sum(1 for i in system if i not in gold_keys)
    return result


def _prf(tally: Counter) -> dict[str, Any]:
    right, answered, total = tally["right"], tally["answered"], tally["total"]
    p = right / answered if answered else 0.0
    r = right / total if total else 0.0
    f1 = 2 * p * r / (p + r) if p + r else 0.0
    return {"P": 100 * p, "R": 100 * r, "F1": 100 * f1, "right": right, "answered": answered, "total": total}


def first_sense_baseline(wordnet_dir: str | os.PathLike, data: str | os.PathLike) -> dict[str, str]:
    """WordNet's first sense (lowest sense number in index.sense) of every instance's lemma and POS."""
    wordnet = load_wordnet(wordnet_dir)
    answers = {}
    for instance in read_raganato(data).instances:
        key = wordnet.first_sense(instance.lemma, instance.pos)
        if key is not None:
            answers[instance.id] = key
    return answers


# ---------------------------------------------------------------------------------------------------- report


# SemCor sentences the quick report fits on (of 11,182): the fit is most of the section's time.
QUICK_SEMCOR_SENTENCES = 1500


def report_section(pretrained: Any, out_dir: str | os.PathLike, data_dir: str | os.PathLike,
                   show_progress: bool = False, quick: bool = False) -> Section:
    """Fit on SemCor with the defaults (its first QUICK_SEMCOR_SENTENCES sentences with `quick`), predict and score
    senseval2 and semeval2007 beside the first-sense baseline, and write `wsd.json` (and the sense vectors and
    predictions) under `out_dir`."""
    out_dir, data_dir = Path(out_dir), Path(data_dir)
    semcor, wordnet_dir = data_dir / "semcor3.0-subset", data_dir / "wordnet-3.0"
    framework = data_dir / "wsd-raganato2017"
    pretrained_obj, info = _model(pretrained)
    limit = QUICK_SEMCOR_SENTENCES if quick else None
    senses = fit_senses(pretrained_obj, semcor, wordnet_dir, show_progress=show_progress, max_sentences=limit)
    senses.model["path"] = info["path"]
    senses.save(out_dir / "wsd-senses.npz")
    numbers: dict[str, Any] = {"fit": senses.stats, "config": senses.config, "sets": {}}
    notes = [f"sense vectors from the first {limit:,} SemCor sentences (quick run)"] if limit else []
    headline: dict[str, Any] = {}
    for name in ("senseval2", "semeval2007"):
        data, gold = framework / name / f"{name}.data.xml", framework / name / f"{name}.gold.key.txt"
        if not data.is_file() or not gold.is_file():
            notes.append(f"{name}: {data} or its gold keys are missing; not scored")
            continue
        predictions, summary = predict(pretrained_obj, senses, wordnet_dir, data, out_dir / f"wsd-{name}.key",
                                       show_progress=show_progress)
        numbers["sets"][name] = {"nearest sense": score(gold, {k: [v] for k, v in predictions.items()}),
                                 "first sense": score(gold, {k: [v] for k, v in
                                                             first_sense_baseline(wordnet_dir, data).items()}),
                                 "prediction": summary}
        scores = numbers["sets"][name]
        headline[f"{name} F1 (nearest sense)"] = round(scores["nearest sense"]["F1"], 1)
        headline[f"{name} F1 (first-sense baseline)"] = round(scores["first sense"]["F1"], 1)
    write_numbers(out_dir / "wsd.json", numbers)
    model_arg = info["path"] or "MODEL"
    senses_file = out_dir / "wsd-senses.npz"
    # Each path quoted; the loop's "$s" parts are appended in double quotes, so the shell joins them to it.
    framework_q, out_q = shell_command(framework), shell_command(out_dir)
    command = (shell_command("bertology", "wsd", "fit", "--model", model_arg, "--semcor", semcor, "--wordnet",
                             wordnet_dir, "--out", senses_file, *(("--max-sentences", limit) if limit else ()))
               + " && for s in senseval2 semeval2007; do "
               + shell_command("bertology", "wsd", "predict", "--model", model_arg, "--senses", senses_file,
                               "--wordnet", wordnet_dir)
               + f' --data {framework_q}/"$s/$s.data.xml" --output {out_q}/"wsd-$s.key" && bertology wsd score '
               + f'--gold {framework_q}/"$s/$s.gold.key.txt" --predictions {out_q}/"wsd-$s.key"; done')
    return Section("wsd", "Word sense disambiguation (LMMS 1-NN)", numbers, [], command, notes, headline)


# ------------------------------------------------------------------------------------------------- internals


class _Resolver:
    """A candidate key's contextual vector under a propagation level, with the source of each counted."""

    def __init__(self, senses: SenseVectors, wordnet: WordNet, propagate: str) -> None:
        self.senses, self.wordnet = senses, wordnet
        self.level = PROPAGATIONS.index(propagate)
        self.lexnames = dict(zip(senses.lexnames, senses.lexname_vectors))
        self.sources: Counter = Counter()
        self._synset_cache: dict[str, np.ndarray | None] = {}

    def synset_vector(self, synset_id: str) -> np.ndarray | None:
        if synset_id not in self._synset_cache:
            rows = [self.senses.index[k] for k in self.wordnet.keys_of(synset_id) if k in self.senses.index]
            self._synset_cache[synset_id] = self.senses.vectors[rows].mean(0, dtype=np.float64) if rows else None
        return self._synset_cache[synset_id]

    def hypernym_vector(self, synset_id: str) -> np.ndarray | None:
        found = [v for h in self.wordnet.synsets[synset_id].hypernyms
                 if (v := self.synset_vector(h)) is not None]
        return np.mean(found, axis=0) if found else None

    def vector(self, key: str) -> np.ndarray | None:
        row = self.senses.index.get(key)
        if row is not None:
            self.sources["semcor"] += 1
            return self.senses.vectors[row]
        synset = self.wordnet.senses[key].synset
        steps = (("synset", self.synset_vector), ("hypernym", self.hypernym_vector),
                 ("lexname", lambda s: self.lexnames.get(self.wordnet.synsets[s].lexname)))
        for level, (name, step) in enumerate(steps, 1):
            if level > self.level:
                break
            found = step(synset)
            if found is not None:
                self.sources[name] += 1
                return np.asarray(found, dtype=np.float32)
        self.sources["none"] += 1
        return None


def _lexname_vectors(senses: SenseVectors, wordnet: WordNet) -> tuple[list[str], np.ndarray]:
    """The mean vector of each lexicographer file over its synsets that have a vector after the synset and
    hypernym steps (LMMS extend.py's lexname level)."""
    resolver = _Resolver(senses, wordnet, "hypernym")
    sums: dict[str, np.ndarray] = {}
    counts: Counter = Counter()
    for synset_id, synset in wordnet.synsets.items():
        vector = resolver.synset_vector(synset_id)
        if vector is None:
            vector = resolver.hypernym_vector(synset_id)
        if vector is not None:
            sums[synset.lexname] = sums.get(synset.lexname, 0) + vector
            counts[synset.lexname] += 1
    names = sorted(sums)
    table = np.stack([sums[n] / counts[n] for n in names]).astype(np.float32) if names else np.zeros(
        (0, senses.dim), np.float32)
    return names, table


def _gloss_vectors(pretrained: Any, wordnet: WordNet, keys: Sequence[str], config: dict[str, Any],
                   batch_size: int, show_progress: bool, dtype: str = "float32") -> dict[str, np.ndarray]:
    from bertology.embeddings import embed

    texts = [wordnet.gloss_text(k) for k in keys]
    result = embed(pretrained, texts, layers=config["layers"], combine=config["combine"], levels=("sentence",),
                   batch_size=batch_size, max_length=config["max_length"],
                   show_progress=show_progress and len(texts) > batch_size, model_settings=False, dtype=dtype)
    return dict(zip(keys, result.sentences))


def _span_vectors(pretrained: Any, texts: Sequence[str], spans: Sequence[Sequence[tuple[int, int]]],
                  config: dict[str, Any], batch_size: int, show_progress: bool, what: str, dtype: str = "float32"):
    """Yield, a chunk of texts at a time, the vectors of the character spans of each text ([spans, D], the
    subword tokens overlapping a span averaged), a mask of the spans no token covers (their rows are zero) and
    how many texts needed more than one window."""
    from tqdm.auto import tqdm

    from bertology.embeddings import embed

    with tqdm(total=len(texts), unit="sentence", desc=what, disable=not show_progress, dynamic_ncols=True,
              file=sys.stderr) as bar:
        for first in range(0, len(texts), CHUNK_SENTENCES):
            chunk = list(texts[first: first + CHUNK_SENTENCES])
            result = embed(pretrained, chunk, layers=config["layers"], combine=config["combine"],
                           levels=("token",), batch_size=batch_size, max_length=config["max_length"],
                           model_settings=False, dtype=dtype)
            capacity = result.window_length - 2
            out, missing = [], []
            long_texts = 0
            for i in range(len(chunk)):
                rows = result.tokens.rows(i)
                long_texts += (rows.stop - rows.start) > capacity
                means, covered = result.span_means(i, spans[first + i])
                out.append(means)
                missing.append(~covered)
            bar.update(len(chunk))
            yield (np.concatenate(out) if out else np.zeros((0, result.dim), np.float32),
                   np.concatenate(missing) if missing else np.zeros(0, bool), long_texts)


def _model(pretrained: Any) -> tuple[Any, dict[str, Any]]:
    """A `Pretrained` (loaded when given a directory) and what identifies it: its directory when known, its
    fingerprint (`bertology.model.fingerprint`: encoder config, weights and tokenizer) and its size."""
    path = None
    if isinstance(pretrained, (str, os.PathLike)):
        from bertology.model import load

        path = str(pretrained)
        pretrained = load(pretrained)
    digest = getattr(pretrained, "_bertology_wsd_fingerprint", None)
    if digest is None:
        from bertology.model import fingerprint

        digest = fingerprint(pretrained)
        try:  # hashing ~100 MB of weights is worth doing once per model object
            pretrained._bertology_wsd_fingerprint = digest
        except AttributeError:
            pass
    config = pretrained.model.config
    return pretrained, {"path": path, "fingerprint": digest, "num_layers": config.num_layers,
                        "hidden_size": config.hidden_size}


def _check_options(propagate: str, gloss_weight: float, first_sense_bonus: float = 0.0) -> None:
    if propagate not in PROPAGATIONS:
        raise ConfigError(f"propagate: unknown {propagate!r}; expected one of {', '.join(PROPAGATIONS)}")
    if isinstance(gloss_weight, bool) or not isinstance(gloss_weight, (int, float)) or not 0 <= gloss_weight <= 1:
        raise ConfigError(f"gloss_weight must be a number in [0, 1], got {gloss_weight!r}")
    if isinstance(first_sense_bonus, bool) or not isinstance(first_sense_bonus, (int, float)) or not (
            0 <= first_sense_bonus <= 2):
        raise ConfigError(f"first_sense_bonus must be a number in [0, 2] (cosines differ by at most 2), got "
                          f"{first_sense_bonus!r}")
