"""What each attention head attends to (Clark et al. 2019, "What Does BERT Look At?"), on UD treebank sentences.

Per head (layer x head, 0-based; heads a pruned model no longer has are NaN):

- `entropy`: the mean over query tokens of the entropy (nats) of the head's attention distribution;
- `cls`, `sep`, `punct`: the mean share of attention given to [CLS], to [SEP] and to punctuation tokens (a token
  whose text, without the tokenizer's continuation marks, is all Unicode punctuation);
- `prev`, `next`: the share of query tokens whose most-attended token is the one just before (after) them, among
  the query tokens that have one; a head is *positional* when either share is at least 0.9;
- syntactic heads: attention is made word-level as Clark et al. do (attention *to* a word is summed over its
  subwords, attention *from* a word averaged over its subwords); for each dependent of each UD relation (root
  excluded), the head is right when the word it attends to most is the dependent's UD head. Each relation's best
  head is reported beside the best fixed-offset baseline (always predicting the word at the relation's most
  frequent offset head - dependent).

Sentences are the treebank's own words (pre-split, so word ids are exact); sentences longer than the model's
positions are skipped and counted. The heads are those of a BERT-family encoder (its layer plan: ALBERT's shared
layers, pruned heads) or of XLNet (its content stream; its relative positions make the probabilities of real
tokens the same whichever side the padding is on, so batches are padded on the right here too).
"""

from __future__ import annotations

import math
import unicodedata
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from bertology.analysis.base import Section, shell_command, write_numbers
from bertology.analysis.ud import UDSentence, read_split, stats
from bertology.errors import DataError
from bertology.io import atomic_write
from bertology.model.checkpoint import Pretrained

POSITIONAL_THRESHOLD = 0.9
PER_HEAD = ("entropy", "cls", "sep", "punct", "prev", "next")
TITLES = {"entropy": "entropy (nats)", "cls": "share to [CLS]", "sep": "share to [SEP]",
          "punct": "share to punctuation", "prev": "argmax at previous token", "next": "argmax at next token"}


def punctuation_ids(tokenizer: Any) -> Tensor:
    """A bool [vocab] vector: True for tokens whose text (continuation marks removed) is all punctuation."""
    flags = torch.zeros(tokenizer.vocab_size, dtype=torch.bool)
    specials = tokenizer.special_ids
    for i in range(tokenizer.vocab_size):
        token = tokenizer.id_to_token(i)
        if token is None or i in specials:
            continue
        text = token.removeprefix("##").lstrip("\u0120\u2581")  # WordPiece "##", byte-level "Ġ", SentencePiece "▁"
        flags[i] = bool(text) and all(unicodedata.category(c).startswith("P") for c in text)
    return flags


class _Totals:
    """Running sums over the flat list of heads (layer by layer, the heads each layer has)."""

    def __init__(self, num_heads: int, relations: list[str]) -> None:
        self.sums = {name: torch.zeros(num_heads, dtype=torch.float64) for name in ("entropy", "cls", "sep", "punct")}
        self.prev = torch.zeros(num_heads, dtype=torch.float64)
        self.next = torch.zeros(num_heads, dtype=torch.float64)
        self.queries = 0
        self.prev_queries = 0
        self.next_queries = 0
        self.uniform_entropy = 0.0
        self.relations = relations
        self.correct = torch.zeros(num_heads, len(relations), dtype=torch.float64)
        self.arcs = torch.zeros(len(relations), dtype=torch.float64)
        self.offsets: dict[str, Counter[int]] = {r: Counter() for r in relations}


def head_statistics(pretrained: Pretrained, sentences: Sequence[UDSentence], *, batch_size: int = 16,
                    min_relation_count: int = 100, show_progress: bool = False, device: Any = None,
                    dtype: str = "float32") -> dict[str, Any]:
    """The per-head statistics of the module docstring over `sentences`, as a JSON-able dict. `device` (None:
    where the model is) and `dtype` say where and how the model runs (`bertology.device`)."""
    from tqdm.auto import tqdm

    from bertology.device import place

    model, tokenizer = pretrained.model, pretrained.tokenizer
    if tokenizer is None:
        raise DataError("head statistics need the model's tokenizer; the model directory has none")
    if batch_size < 1:
        raise DataError(f"batch_size must be positive, got {batch_size}")
    config = model.config
    kept, pruned = head_layout(model)  # per layer call, the heads it has (original numbering)
    flat_heads = [(call, head) for call, heads in enumerate(kept) for head in heads]
    max_length = config.max_length
    punct = punctuation_ids(tokenizer)
    sep_id, cls_id = tokenizer.sep_id, tokenizer.cls_id

    encoded, skipped_long, skipped_arcs = [], 0, 0
    relation_counts: Counter[str] = Counter()
    for sentence in sentences:
        encoding = tokenizer.encode_words(sentence.words)
        if len(encoding.ids) > max_length:
            skipped_long += 1
            continue
        encoded.append((sentence, encoding))
        relation_counts.update(r for r, h in zip(sentence.relations, sentence.heads) if h > 0)
    if not encoded:
        raise DataError(f"no sentence to analyse: {len(sentences)} given, {skipped_long} longer than the model's "
                        f"{max_length} positions")
    relations = sorted(relation_counts)
    relation_index = {r: i for i, r in enumerate(relations)}
    totals = _Totals(len(flat_heads), relations)
    encoded.sort(key=lambda item: len(item[1].ids))  # similar lengths together: little padding

    where = place(pretrained, device, dtype)
    device = where.device
    batches = range(0, len(encoded), batch_size)
    for start in tqdm(batches, desc="attention", unit="batch", disable=not show_progress):
        chunk = encoded[start:start + batch_size]
        width = max(len(e.ids) for _, e in chunk)
        ids = torch.full((len(chunk), width), tokenizer.pad_id, dtype=torch.long)
        types = torch.zeros_like(ids)
        mask = torch.zeros_like(ids)
        for row, (_, e) in enumerate(chunk):
            ids[row, :len(e.ids)] = torch.tensor(e.ids)
            types[row, :len(e.ids)] = torch.tensor(e.type_ids)
            mask[row, :len(e.ids)] = 1
        with torch.no_grad(), where.autocast():
            out = model(ids.to(device), mask.to(device), token_type_ids=types.to(device), output_attentions=True)
        # [B, all heads, L, L]: the layers' heads side by side, in the order of flat_heads.
        probs = torch.cat([a.float().cpu() for a in out.attentions], 1)
        skipped_arcs += _accumulate(totals, probs, ids, mask, chunk, punct, sep_id, cls_id, relation_index)
    return _numbers(totals, flat_heads, len(kept), config.num_heads, pruned, encoded, sentences,
                    skipped_long, skipped_arcs, min_relation_count)


def head_layout(model: Any) -> tuple[list[list[int]], dict[int, list[int]]]:
    """Per layer call, the heads it has (original numbering), and the pruned heads: a BERT-family encoder's plan,
    or every head of every XLNet layer; another model (no attention probabilities to read) is unavailable."""
    from bertology.model.encoder import EncoderModel
    from bertology.model.transformer import EncoderStackModel
    from bertology.model.xlnet import XLNetModel

    config = model.config
    if isinstance(model, EncoderModel):
        return [config.kept_heads(index) for index in model.encoder.plan], config.pruned_heads
    if isinstance(model, (XLNetModel, EncoderStackModel)):  # every head of every layer (ModernBERT)
        return [list(range(config.num_heads)) for _ in range(config.num_layers)], {}
    from bertology.analysis.report import AnalysisUnavailable

    raise AnalysisUnavailable(f"attention heads are read from a BERT-family encoder, ModernBERT or XLNet; this model is a "
                              f"{type(model).__name__}")


def _accumulate(totals: _Totals, probs: Tensor, ids: Tensor, mask: Tensor, chunk: list, punct: Tensor,
                sep_id: int, cls_id: int, relation_index: dict[str, int]) -> int:
    """Add one batch's attention [B, heads, L, L] to the totals; returns the arcs skipped (a word without tokens)."""
    real = mask.bool()
    lengths = real.sum(1)
    width = ids.shape[1]
    query = real[:, None, :].double()  # [B, 1, L]
    p = probs.double()
    entropy = -(p * torch.where(p > 0, p.log(), torch.zeros_like(p))).sum(-1)  # [B, H, L]
    totals.sums["entropy"] += (entropy * query).sum((0, 2))
    totals.sums["cls"] += (p * (ids == cls_id)[:, None, None, :]).sum(-1).mul(query).sum((0, 2))
    totals.sums["sep"] += (p * (ids == sep_id)[:, None, None, :]).sum(-1).mul(query).sum((0, 2))
    totals.sums["punct"] += (p * (punct[ids] & real)[:, None, None, :]).sum(-1).mul(query).sum((0, 2))
    totals.queries += int(lengths.sum())
    totals.uniform_entropy += float(sum(n * math.log(n) for n in lengths.tolist()))
    target = probs.argmax(-1)  # [B, H, L]
    position = torch.arange(width)
    has_prev = real & (position[None, :] >= 1)
    has_next = real & (position[None, :] < (lengths[:, None] - 1))
    totals.prev += ((target == position - 1) & has_prev[:, None, :]).sum((0, 2)).double()
    totals.next += ((target == position + 1) & has_next[:, None, :]).sum((0, 2)).double()
    totals.prev_queries += int(has_prev.sum())
    totals.next_queries += int(has_next.sum())

    skipped = 0
    for row, (sentence, encoding) in enumerate(chunk):
        n, words = len(encoding.ids), len(sentence)
        to_word = torch.zeros(words, n, dtype=torch.float64)
        for token, word in enumerate(encoding.word_ids):
            if word is not None:
                to_word[word, token] = 1.0
        has_tokens = to_word.sum(1) > 0
        from_word = to_word / to_word.sum(1, keepdim=True).clamp(min=1)
        word_attention = from_word @ p[row, :, :n, :n] @ to_word.T  # [H, words, words]
        predicted = word_attention.argmax(-1)  # [H, words]
        deps, rels, gold = [], [], []
        for d, (head, relation) in enumerate(zip(sentence.heads, sentence.relations)):
            if head == 0:
                continue
            if not (has_tokens[d] and has_tokens[head - 1]):
                skipped += 1
                continue
            deps.append(d)
            rels.append(relation_index[relation])
            gold.append(head - 1)
            totals.offsets[relation][head - 1 - d] += 1
        if not deps:
            continue
        dep_t, rel_t, gold_t = torch.tensor(deps), torch.tensor(rels), torch.tensor(gold)
        hits = (predicted[:, dep_t] == gold_t).double()  # [H, arcs]
        totals.correct.index_add_(1, rel_t, hits)
        totals.arcs.index_add_(0, rel_t, torch.ones(len(deps), dtype=torch.float64))
    return skipped


def _numbers(totals: _Totals, flat_heads: list[tuple[int, int]], layers: int, heads: int,
             pruned: dict[int, list[int]], encoded: list, sentences: Sequence[UDSentence], skipped_long: int,
             skipped_arcs: int, min_relation_count: int) -> dict[str, Any]:
    def grid(values: Tensor) -> list[list[float | None]]:
        out = np.full((layers, heads), np.nan)
        for (call, head), value in zip(flat_heads, values.tolist()):
            out[call, head] = value
        return [[None if math.isnan(v) else round(float(v), 6) for v in row] for row in out]

    per_head = {name: grid(totals.sums[name] / totals.queries) for name in ("entropy", "cls", "sep", "punct")}
    per_head["prev"] = grid(totals.prev / max(totals.prev_queries, 1))
    per_head["next"] = grid(totals.next / max(totals.next_queries, 1))
    positional = []
    for k, (call, head) in enumerate(flat_heads):
        for offset, share in ((-1, totals.prev[k] / max(totals.prev_queries, 1)),
                              (1, totals.next[k] / max(totals.next_queries, 1))):
            if share >= POSITIONAL_THRESHOLD:
                positional.append({"layer": call, "head": head, "offset": offset, "share": round(float(share), 4)})

    syntactic, small = {}, {}
    all_correct = totals.correct.sum(1)
    all_arcs = float(totals.arcs.sum())
    for r, relation in enumerate(totals.relations):
        count = int(totals.arcs[r])
        if count < min_relation_count:
            small[relation] = count
            continue
        accuracy = totals.correct[:, r] / count
        best = int(accuracy.argmax())
        offset, hits = totals.offsets[relation].most_common(1)[0]
        syntactic[relation] = {
            "count": count,
            "best_head": {"layer": flat_heads[best][0], "head": flat_heads[best][1],
                          "accuracy": round(float(accuracy[best]), 4)},
            "baseline": {"offset": offset, "accuracy": round(hits / count, 4)},
            "accuracy": grid(accuracy),
        }
    overall = all_correct / max(all_arcs, 1)
    best_all = int(overall.argmax())
    all_offsets: Counter[int] = Counter()
    for counter in totals.offsets.values():
        all_offsets.update(counter)
    offset, hits = all_offsets.most_common(1)[0] if all_offsets else (0, 0)
    syntactic["all"] = {"count": int(all_arcs),
                        "best_head": {"layer": flat_heads[best_all][0], "head": flat_heads[best_all][1],
                                      "accuracy": round(float(overall[best_all]), 4)},
                        "baseline": {"offset": offset, "accuracy": round(hits / max(all_arcs, 1), 4)},
                        "accuracy": grid(overall)}
    means = {name: float(np.nanmean(np.array(per_head[name], dtype=float))) for name in PER_HEAD}
    return {
        "sentences": len(encoded),
        "tokens": totals.queries,
        "ud": stats([s for s, _ in encoded]).as_dict(),
        "skipped": {"sentences_longer_than_model": skipped_long, "arcs_of_words_without_tokens": skipped_arcs,
                    "relations_under_min_count": small},
        "layers": layers,
        "heads": heads,
        "pruned_heads": {str(k): v for k, v in pruned.items()},
        "indexing": "layers and heads are 0-based",
        "mean": {**{name: round(v, 6) for name, v in means.items()},
                 "uniform_entropy": round(totals.uniform_entropy / totals.queries, 6)},
        "per_head": per_head,
        "positional_threshold": POSITIONAL_THRESHOLD,
        "positional_heads": positional,
        "min_relation_count": min_relation_count,
        "syntactic": syntactic,
    }


# ------------------------------------------------------------------------------------------------------ figures


def pyplot() -> Any:
    """matplotlib's pyplot on the Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def head_heat_map(fig: Any, ax: Any, grid: np.ndarray, title: str, **limits: Any) -> None:
    """A layer x head heat map on `ax` with its colour bar (NaN, a pruned head, shows blank)."""
    image = ax.imshow(grid, cmap="viridis", aspect="auto", **limits)
    ax.set_title(title, fontsize=10)
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    ax.set_xticks(range(grid.shape[1]))
    ax.set_yticks(range(grid.shape[0]))
    ax.tick_params(labelsize=7)
    fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04)


def save_png(fig: Any, path: str | Path) -> Path:
    """Write the figure as PNG, atomically, and close it."""
    path = Path(path)
    fig.tight_layout()
    with atomic_write(path, "wb") as handle:
        fig.savefig(handle, format="png")
    pyplot().close(fig)
    return path


def plot_heatmaps(numbers: dict[str, Any], path: str | Path) -> Path:
    """One PNG: a layer x head heat map for each per-head statistic."""
    fig, axes = pyplot().subplots(2, 3, figsize=(11, 5.6), dpi=80)
    for ax, name in zip(axes.flat, PER_HEAD):
        head_heat_map(fig, ax, np.array(numbers["per_head"][name], dtype=float), TITLES[name], vmin=0.0,
                      vmax=None if name == "entropy" else 1.0)
    return save_png(fig, path)


def plot_syntactic(numbers: dict[str, Any], path: str | Path) -> Path:
    """One PNG: per relation, the best head's accuracy beside the best fixed-offset baseline."""

    rows = sorted(numbers["syntactic"].items(), key=lambda item: -item[1]["count"])
    names = [f"{r} ({v['best_head']['layer']}-{v['best_head']['head']})" for r, v in rows]
    best = [v["best_head"]["accuracy"] for _, v in rows]
    base = [v["baseline"]["accuracy"] for _, v in rows]
    fig, ax = pyplot().subplots(figsize=(7, 0.28 * len(rows) + 1.2), dpi=80)
    y = np.arange(len(rows))
    ax.barh(y - 0.2, best, height=0.4, label="best head (layer-head)")
    ax.barh(y + 0.2, base, height=0.4, label="best fixed offset")
    ax.set_yticks(y)
    ax.set_yticklabels(names, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, 1)
    ax.set_xlabel("share of dependents whose most-attended word is their UD head")
    ax.legend(fontsize=8, loc="lower right")
    return save_png(fig, path)


# ------------------------------------------------------------------------------------------------------ entry points


def analyze_heads(pretrained: Pretrained, ud_dir: str | Path, out_dir: str | Path, *, split: str = "dev",
                  limit: int | None = None, batch_size: int = 16, min_relation_count: int = 100,
                  show_progress: bool = False, device: Any = None, dtype: str = "float32") -> dict[str, Any]:
    """Read the `split` of the UD treebank in `ud_dir` (its first `limit` sentences), compute the head statistics
    and write `attention.json`, `attention-heads.png` and `attention-syntactic.png` to `out_dir` (the model on
    `device` in `dtype`, as `head_statistics` takes them)."""
    sentences = read_split(ud_dir, split, limit)
    numbers = head_statistics(pretrained, sentences, batch_size=batch_size, min_relation_count=min_relation_count,
                              show_progress=show_progress, device=device, dtype=dtype)
    numbers["data"] = {"ud": str(ud_dir), "split": split, "limit": limit}
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    write_numbers(out / "attention.json", numbers)
    plot_heatmaps(numbers, out / "attention-heads.png")
    plot_syntactic(numbers, out / "attention-syntactic.png")
    return numbers


def summary_table(numbers: dict[str, Any]) -> dict[str, Any]:
    """The short form the report shows: means, positional heads, and per relation best head vs baseline."""
    return {
        "sentences": numbers["sentences"],
        "tokens": numbers["tokens"],
        "mean over heads": numbers["mean"],
        "positional heads (layer-head: offset, share)": {f"{h['layer']}-{h['head']}": f"{h['offset']:+d}: {h['share']}"
                                                         for h in numbers["positional_heads"]},
        "syntactic heads (relation: best head accuracy vs best offset)": {
            r: f"head {v['best_head']['layer']}-{v['best_head']['head']}: {v['best_head']['accuracy']:.3f} vs "
               f"offset {v['baseline']['offset']:+d}: {v['baseline']['accuracy']:.3f} (n={v['count']})"
            for r, v in numbers["syntactic"].items()},
        "skipped": numbers["skipped"],
    }


def report_section(pretrained: Pretrained, out_dir: str | Path, data_dir: str | Path, *, quick: bool = False,
                   model_dir: str | None = None, show_progress: bool = False) -> Section:
    """The report's attention section on UD English-EWT dev (`data_dir/ud-english-ewt`); 500 sentences (100 with
    `quick`)."""
    from bertology.analysis.report import AnalysisUnavailable
    from bertology.model.elmo import ElmoModel

    if isinstance(pretrained.model, ElmoModel):
        raise AnalysisUnavailable("an ELMo model has no attention heads (a character CNN and LSTMs)")
    ud = Path(data_dir) / "ud-english-ewt"
    if not ud.is_dir():
        raise FileNotFoundError(f"{ud}: UD English-EWT is not there")
    limit = 100 if quick else 500
    out = Path(out_dir) / "attention"
    numbers = analyze_heads(pretrained, ud, out, limit=limit, show_progress=show_progress)
    # The most syntactic heads: the relations where the best head beats the best fixed offset by most.
    margins = sorted(((v["best_head"]["accuracy"] - v["baseline"]["accuracy"], relation, v)
                      for relation, v in numbers["syntactic"].items()), key=lambda item: -item[0])
    headline: dict[str, Any] = {"positional heads": len(numbers["positional_heads"])}
    for margin, relation, v in margins[:3]:
        headline[f"{relation}: head {v['best_head']['layer']}-{v['best_head']['head']} "
                 f"(best offset {v['baseline']['accuracy']:.3f})"] = round(v["best_head"]["accuracy"], 3)
    return Section(
        headline=headline,
        name="attention",
        title="Attention heads (Clark et al. 2019)",
        numbers=summary_table(numbers),
        figures=[out / "attention-heads.png", out / "attention-syntactic.png"],
        command=shell_command("bertology", "heads", "stats", "--model", model_dir or "MODEL", "--ud", ud, "--out", out,
                              "--limit", limit),
        notes=[f"UD English-EWT dev, first {limit} sentences; layers and heads are 0-based; full numbers in "
               f"{out / 'attention.json'}.",
               "Entropy in nats, averaged over query tokens; 'uniform_entropy' is that of uniform attention over "
               "the same sentences.",
               f"A head is positional when its argmax is the previous (next) token for at least "
               f"{POSITIONAL_THRESHOLD:.0%} of the tokens that have one."],
    )
