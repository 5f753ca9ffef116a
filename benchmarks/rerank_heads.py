"""Why a reranker on all-MiniLM-L6-v2 stays at chance: small runs of each head and loss, and frozen probes
(docs/RETRIEVAL.md, "Why the reranker stayed at chance").

The data are `finetune --task rerank`'s: SQuAD v1.1 dev part A split by article, each train question with its own
paragraph (relevant) and its BM25 negative (irrelevant). Each step takes `--questions` train questions in order
of a seeded permutation, both of their pairs (so every step holds both labels), AdamW (weight decay 0.01), warm-up
10 % then linear decay. Scored on the first `--dev` dev questions: **pairwise**, the share whose own paragraph
outscores its BM25 negative, and the pairs' accuracy. One thread; CPU seconds of each run.

    python benchmarks/rerank_heads.py                  # the runs of the table
    python benchmarks/rerank_heads.py --probe          # logistic probes of the frozen model's features
    python benchmarks/rerank_heads.py --run '{"head": "cls", "lr": 3e-4, "steps": 50}'
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
from pathlib import Path

import bertology as _openmp_policy  # noqa: F401  (before torch: it sets OpenMP's passive waiting, read when torch loads)

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import DATA, minilm_dir  # noqa: E402

from bertology.model import load  # noqa: E402
from bertology.recipes.finetune import build_model  # noqa: E402
from bertology.tasks.lookup import get_task  # noqa: E402

SQUAD = DATA / "squad" / "squad-v1.1-dev-part-a.json"
# head: cls (monoBERT: rerank-cls), mean (the mean of all tokens + linear), segments (rerank's segment_cosine)
RUNS = (
    {"head": "cls", "loss": "pointwise", "lr": 5e-5, "steps": 40},
    {"head": "mean", "loss": "pointwise", "lr": 5e-5, "steps": 40},
    {"head": "cls", "loss": "softmax", "lr": 5e-5, "steps": 40},
    {"head": "cls", "loss": "pointwise", "lr": 3e-4, "steps": 50},
    {"head": "segments", "steps": 0, "bias": -10.0},
    {"head": "segments", "loss": "pointwise", "lr": 5e-5, "steps": 50, "bias": -10.0},
)


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def triples(split: str) -> list[tuple[str, str, str]]:
    task = get_task("rerank")
    return [(e.query, e.positive, e.negatives[0]) for e in task.source.read(task.path(str(SQUAD), split))
            if e.negatives]


def scores_of(model, tokenizer, rows, max_length: int) -> torch.Tensor:
    """The log-odds of `relevant` of each row's positive pair, then of each row's negative pair [2 x rows]."""
    batch = tokenizer.encode_batch([r[0] for r in rows] * 2, [r[1] for r in rows] + [r[2] for r in rows],
                                   max_length=max_length)
    logits = model(batch.input_ids, batch.attention_mask, batch.token_type_ids).head_logits["classifier"]
    return logits[:, 1] - logits[:, 0]


def run(train, dev, head: str = "cls", loss: str = "pointwise", lr: float = 5e-5, steps: int = 40,
        questions: int = 8, max_length: int = 192, seed: int = 0, bias: float | None = None, n_dev: int = 100) -> dict:
    start = cpu_seconds()
    torch.manual_seed(seed)
    pretrained = load(str(minilm_dir()))
    task = get_task("rerank" if head == "segments" else "rerank-cls")
    model, _ = build_model(pretrained, task, seed, "mean" if head == "mean" else "cls")
    if bias is not None:
        with torch.no_grad():
            model.heads["classifier"].bias.fill_(bias)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    warm = max(1.0, 0.1 * steps)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min((s + 1) / warm, max(0.0, (steps - s) / max(1e-9, steps - warm))))
    order = np.random.default_rng(seed).permutation(len(train))
    losses: list[float] = []
    model.train()
    for step in range(steps):
        rows = [train[i] for i in order[step * questions:(step + 1) * questions]]
        s = scores_of(model, pretrained.tokenizer, rows, max_length)
        n = len(rows)
        if loss == "pointwise":  # the two-label cross-entropy on (-s/2, s/2): the binary one on s
            value = F.binary_cross_entropy_with_logits(s, torch.cat([torch.ones(n), torch.zeros(n)]))
        else:  # softmax over each question's positive and negative
            value = F.cross_entropy(torch.stack([s[:n], s[n:]], 1), torch.zeros(n, dtype=torch.long))
        optimizer.zero_grad()
        value.backward()
        optimizer.step()
        schedule.step()
        losses.append(float(value.detach()))
    model.eval()
    positive, negative = [], []
    with torch.no_grad():
        for i in range(0, n_dev, 16):
            rows = dev[i:min(n_dev, i + 16)]
            s = scores_of(model, pretrained.tokenizer, rows, max_length).numpy()
            positive += s[:len(rows)].tolist()
            negative += s[len(rows):].tolist()
    positive, negative = np.array(positive), np.array(negative)
    return {"head": head, "loss": loss if steps else "-", "lr": lr if steps else "-", "steps": steps,
            "train_loss_last_10": round(float(np.mean(losses[-10:])), 3) if losses else None,
            "pairwise": round(100 * float((positive > negative).mean()), 1),
            "pair_accuracy": round(100 * float(((positive > 0).sum() + (negative <= 0).sum()) / (2 * len(positive))), 1),
            "cpu_s": round(cpu_seconds() - start, 1), "load": round(os.getloadavg()[0], 1)}


@torch.no_grad()
def probe(train, dev, n_train: int = 300, n_dev: int = 100, max_length: int = 192) -> dict:
    """Logistic probes of the frozen model's joint-pass features, the untrained segment cosine, the bi-encoder."""
    from sklearn.linear_model import LogisticRegression

    from bertology import embed

    start = cpu_seconds()
    pretrained = load(str(minilm_dir()))
    model, tokenizer = pretrained.model.eval(), pretrained.tokenizer

    def features(rows):
        out: dict[str, list] = {k: [] for k in ("cls", "pooler", "mean", "segments", "cosine")}
        texts = [r[0] for r in rows] * 2
        passages = [r[1] for r in rows] + [r[2] for r in rows]
        for i in range(0, len(texts), 16):
            batch = tokenizer.encode_batch(texts[i:i + 16], passages[i:i + 16], max_length=max_length)
            h = model(batch.input_ids, batch.attention_mask, batch.token_type_ids).last_hidden_state
            real, second = batch.attention_mask.bool(), batch.token_type_ids.bool()
            q, p = (real & ~second).float()[..., None], (real & second).float()[..., None]
            mq, mp = (h * q).sum(1) / q.sum(1), (h * p).sum(1) / p.sum(1)
            out["cls"].append(h[:, 0])
            out["pooler"].append(torch.tanh(model.encoder.pooler(h[:, 0])))
            out["mean"].append((h * real.float()[..., None]).sum(1) / real.sum(1, keepdim=True))
            out["segments"].append(torch.cat([mq, mp, mq * mp, (mq - mp).abs()], 1))
            out["cosine"].append(F.cosine_similarity(mq, mp))
        return {k: torch.cat(v).numpy() for k, v in out.items()}

    train, dev = train[:n_train], dev[:n_dev]
    on_train, on_dev = features(train), features(dev)
    labels = np.array([1] * len(train) + [0] * len(train))

    def pairwise(s):
        return round(100 * float((s[:len(dev)] > s[len(dev):]).mean()), 1)

    result = {"segment cosine, untrained": pairwise(on_dev["cosine"])}
    for name in ("cls", "pooler", "mean", "segments"):
        fitted = LogisticRegression(C=1.0, max_iter=2000).fit(on_train[name], labels)
        result[f"probe: {name}"] = pairwise(fitted.decision_function(on_dev[name]))
    options = dict(sentence="mean", levels=("sentence",), max_length=256, long_texts="truncate", normalize=True)
    queries = embed(pretrained, [r[0] for r in dev], **options).sentences
    passages = embed(pretrained, [r[1] for r in dev] + [r[2] for r in dev], **options).sentences
    result["bi-encoder cosine"] = pairwise(np.concatenate([(queries * passages[:len(dev)]).sum(1),
                                                           (queries * passages[len(dev):]).sum(1)]))
    result.update(cpu_s=round(cpu_seconds() - start, 1), load=round(os.getloadavg()[0], 1))
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", action="append", default=[], help="one run's settings as JSON (repeatable)")
    parser.add_argument("--probe", action="store_true", help="the frozen model's probes instead of runs")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    if not SQUAD.is_file():
        raise SystemExit(f"{SQUAD} not found (../shared/data is absent)")
    torch.set_num_threads(args.threads)
    train, dev = triples("train"), triples("dev")
    if args.probe:
        print(json.dumps(probe(train, dev)), flush=True)
        return
    for settings in [json.loads(r) for r in args.run] or RUNS:
        print(json.dumps(run(train, dev, **settings)), flush=True)


if __name__ == "__main__":
    main()
