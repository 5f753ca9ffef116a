"""ELMo's training step: bertology's ElmoModel against a plain torch.nn implementation of the same model.

    python benchmarks/elmo.py                       # CPU, the elmo-tiny sizes
    python benchmarks/elmo.py --device cuda --size released

The plain implementation is what one writes with torch.nn: with clipping (the released model clips its cell at 3
and its projected state at 3), AllenNLP's cell, `nn.Linear` input, state and projection layers stepped word by word
per direction and layer, with clamps (no fused LSTM can clip the cell the next step reads); without clipping,
`nn.LSTM(proj_size=...)` per direction and layer. Both share the character CNN's weights and compute the same loss
on the same batches (checked: the losses agree to float rounding). A step: truncated-backpropagation windows of W
words for both directions (batch B), the forward and backward LM losses through the full softmax, backward, no
optimizer.

One JSON line per configuration: words/s of each and the ratio.

    python benchmarks/elmo.py --embed               # embed's word vectors: ELMo against a BERT of similar size

`--embed` times `embed(levels=("word",), layers="mean")` over Brown sentences (../shared/data/brown-nltk) for two
pairs of an ELMo (clipping on, as released) and a BERT encoder of about the same parameters without embedding and
softmax tables (`EMBED_PAIRS`): the comparison's ELMo (2 x 160 -> 64) against docs/OBJECTIVES.md's encoder (2 layers
of 128), and configs/elmo-tiny.yaml's sizes (2 x 512 -> 128) against 3 layers of 256; WordPiece trained on the same
sentences, random weights (speed does not depend on them), the two systems timed in alternation in one process.

    python benchmarks/elmo.py --compare calibrate|pretrain|finetune|layers|table

runs the comparison of docs/ELMO.md ("ELMo against the MLM encoder"), writing under runs/elmo-compare/."""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import common
import torch
import torch.nn.functional as F
from torch import nn

from bertology.model.elmo import ElmoConfig, ElmoModel, tiny_config
from bertology.model.heads import HeadSpec
from bertology.objectives.mlm import linear_prediction_applies, linear_token_prediction, mlm_loss


class PlainBiLM(nn.Module):
    """The same biLM on torch.nn's LSTMs, its weights copied from an ElmoModel."""

    def __init__(self, ours: ElmoModel) -> None:
        super().__init__()
        config = ours.config
        self.config, self.characters, self.softmax, self.head = config, ours.characters, ours.softmax, ours.heads["lm"]
        self.clipped = config.clipped
        self.directions = nn.ModuleList()
        for layers in (ours.forward_layers, ours.backward_layers):
            stack = nn.ModuleList()
            for layer in layers:
                if self.clipped:  # AllenNLP's LSTM cell with projection: linear layers stepped per word
                    parts = nn.ModuleDict({"input": nn.Linear(layer.input_size, 4 * config.cell_size, bias=False),
                                           "state": nn.Linear(config.projection_dim, 4 * config.cell_size),
                                           "projection": nn.Linear(config.cell_size, config.projection_dim,
                                                                   bias=False)})
                    with torch.no_grad():
                        parts["input"].weight.copy_(layer.weight_ih)
                        parts["state"].weight.copy_(layer.weight_hh)
                        parts["state"].bias.copy_(layer.bias)
                        parts["projection"].weight.copy_(layer.weight_hr)
                    stack.append(parts)
                else:
                    lstm = nn.LSTM(layer.input_size, config.cell_size, proj_size=config.projection_dim,
                                   batch_first=True)
                    with torch.no_grad():
                        lstm.weight_ih_l0.copy_(layer.weight_ih)
                        lstm.weight_hh_l0.copy_(layer.weight_hh)
                        lstm.bias_ih_l0.copy_(layer.bias)
                        lstm.bias_hh_l0.zero_()
                        lstm.weight_hr_l0.copy_(layer.weight_hr)
                    stack.append(lstm)
            self.directions.append(stack)

    def run_layer(self, layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
        if not self.clipped:
            return layer(x)[0]
        batch = x.shape[0]
        h = x.new_zeros(batch, self.config.projection_dim)
        c = x.new_zeros(batch, self.config.cell_size)
        outputs = []
        for t in range(x.shape[1]):
            i, f, g, o = (layer["input"](x[:, t]) + layer["state"](h)).chunk(4, 1)
            c = (torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)).clamp(-self.config.cell_clip,
                                                                                 self.config.cell_clip)
            h = layer["projection"](torch.sigmoid(o) * torch.tanh(c)).clamp(-self.config.proj_clip,
                                                                            self.config.proj_clip)
            outputs.append(h)
        return torch.stack(outputs, 1)

    def forward(self, chars, targets, back_chars, back_targets):
        tops = []
        for d, (ids, stack) in enumerate(((chars, self.directions[0]), (back_chars, self.directions[1]))):
            x = self.characters(ids.flatten(0, 1)).view(*ids.shape[:2], -1)
            if d == 1:
                x = x.flip(1)
            for index, layer in enumerate(stack):
                y = self.run_layer(layer, x)
                x = y + x if index > 0 and self.config.skip_connections else y
            tops.append(x if d == 0 else x.flip(1))
        return sum(F.cross_entropy(F.linear(top.flatten(0, 1), self.softmax.weight, self.head.bias),
                                   t.flatten(), reduction="sum") for top, t in zip(tops, (targets, back_targets)))


def ours_loss(model: ElmoModel, chars, targets, back_chars, back_targets):
    """The loss as the `bilm` objective computes it: where `linear_prediction_applies`, the logits made in
    cache-sized pieces with their gradients, elsewhere the logits then the summed cross-entropy."""
    out = model(chars, backward_input_ids=back_chars)
    weight, bias = model.word_embeddings.weight, model.heads["lm"].bias
    pairs = ((out.forward_top.flatten(0, 1), targets.flatten()),
             (out.backward_top.flatten(0, 1), back_targets.flatten()))
    if linear_prediction_applies(weight):
        return sum(linear_token_prediction("lm", top, weight, bias, t).loss_sum for top, t in pairs)
    return sum(mlm_loss(model.lm_logits(top), t, reduction="sum") for top, t in pairs)


def brown_windows(count: int, window: int, max_characters: int) -> torch.Tensor:
    """Character ids [count, window, max_characters] of consecutive `window`-word stretches of the Brown corpus
    (../shared/data/brown-nltk), as the word streams of pretraining cut a text."""
    from bertology.data.corpus import read_documents
    from bertology.model.elmo import CharacterMapper

    mapper, words = CharacterMapper(max_characters), []
    for document in read_documents([str(Path("../shared/data/brown-nltk"))], "brown"):
        words += [w for sentence in document for w in sentence.split()]
        if len(words) >= count * window:
            break
    if len(words) < count * window:
        raise SystemExit(f"../shared/data/brown-nltk has fewer than {count * window} words")
    ids = torch.tensor([mapper.word(w) for w in words[:count * window]])
    return ids.view(count, window, max_characters)


def synchronized(run):
    def timed_run():
        torch.cuda.synchronize()
        run()
        torch.cuda.synchronize()
    return timed_run


EMBED_PAIRS = {  # ELMo sizes and BERT encoders of about the same parameters without embedding and softmax tables
    # the comparison's ELMo (docs/ELMO.md) and docs/OBJECTIVES.md's encoder: 2 layers of 128
    "objectives": ({"projection_dim": 64, "cell_size": 160},
                   {"hidden_size": 128, "num_layers": 2, "num_heads": 2, "intermediate_size": 512}),
    # configs/elmo-tiny.yaml and a BERT of 3 layers of 256
    "elmo-tiny": ({"projection_dim": 128, "cell_size": 512},
                  {"hidden_size": 256, "num_layers": 3, "num_heads": 4, "intermediate_size": 1024}),
}


def embed_speed(args: argparse.Namespace) -> None:
    """Each pair timed in alternation (ELMo, BERT, ELMo, BERT, ...) in one process, so that the machine's load
    weighs on both alike; the median words/s of each, and the range of the per-round ratio."""
    from bertology.data.corpus import read_documents
    from bertology.embeddings import embed
    from bertology.model import EncoderModel, preset
    from bertology.tokenization import train_tokenizer

    sentences = [s for d in read_documents([str(Path("../shared/data/brown-nltk"))], "brown") for s in d]
    texts = sentences[:args.texts]
    tokenizer = train_tokenizer(iter(sentences[:20000]), "wordpiece", 8000, show_progress=False)

    def count(module: nn.Module, skip: tuple[str, ...]) -> int:
        return sum(p.numel() for n, p in module.named_parameters() if not n.startswith(skip))

    for name, (elmo_size, bert_size) in EMBED_PAIRS.items():
        elmo = ElmoModel(tiny_config(dropout=0.0, **elmo_size)).eval()
        elmo.init_weights(torch.Generator().manual_seed(0))
        bert = EncoderModel(preset("tiny", vocab_size=tokenizer.vocab_size, max_position_embeddings=512,
                                   **bert_size)).eval()
        bert.init_weights(torch.Generator().manual_seed(0))
        runners = {"elmo": lambda: embed(elmo, texts, layers="mean", levels=("word",), batch_size=args.batch),
                   "bert": lambda: embed(bert, texts, tokenizer=tokenizer, layers="mean", levels=("word",),
                                         batch_size=args.batch)}
        words = len(runners["elmo"]().words.strings)
        runners["bert"]()
        times: dict[str, list[float]] = {"elmo": [], "bert": []}
        for _ in range(args.repeats):
            for system, run in runners.items():
                start = time.perf_counter()
                run()
                times[system].append(time.perf_counter() - start)
        ratios = sorted(b / e for e, b in zip(times["elmo"], times["bert"]))
        print(json.dumps({"pair": name, "texts": len(texts), "words": words, "batch": args.batch,
                          "elmo_params": count(elmo, ("softmax",)),
                          "bert_params": count(bert, ("encoder.embeddings.word",)),
                          "elmo_words_per_s": round(words / statistics.median(times["elmo"])),
                          "bert_words_per_s": round(words / statistics.median(times["bert"])),
                          "x_bert_median": round(statistics.median(ratios), 2),
                          "x_bert_range": [round(ratios[0], 2), round(ratios[-1], 2)]}), flush=True)


# --- ELMo-tiny against the MLM encoder of docs/OBJECTIVES.md, on one budget (docs/ELMO.md, "The comparison") -------

COMPARE = Path("runs/elmo-compare")  # everything the comparison writes, relative to the repository root
ELMO_SIZE = {"projection_dim": 64, "cell_size": 160}  # about the encoder's parameters (printed by `calibrate`)
COMPARE_FINETUNE = {  # the same recipe for both models: frozen features, a learned scalar mix, the same head
    "conll2003": {"data": "../shared/data/conll2003", "limit_train": 4000, "epochs": 3, "max_length": 128,
                  "tagger": "bilstm-crf", "metric": "f1"},
    "sst2": {"data": "../shared/data/glue", "limit_train": 20000, "epochs": 1, "max_length": 64, "pooling": "mean",
             "metric": "accuracy"},
}
WSD_SETS = ("senseval2", "semeval2007")


def elmo_corpus() -> Path:
    """Gutenberg + Brown as the encoder's shards read them, written once as one `bert`-format file for ELMo's
    word streams (one run config names one corpus format)."""
    from bertology.cli._corpus_args import corpus_sources
    from bertology.data.corpus import read_sources
    from bertology.io import atomic_write

    path = COMPARE / "gutenberg-brown.txt"
    if not path.exists():
        sources = corpus_sources(["../shared/data/gutenberg-nltk/*.txt", "brown:../shared/data/brown-nltk"], "text",
                                 encoding="latin-1")
        documents = ("\n".join(" ".join(s.split()) for s in d if s.strip()) for d in read_sources(sources))
        with atomic_write(path, "w", encoding="utf-8") as f:
            f.write("\n\n".join(documents) + "\n")
    return path


def elmo_pretrain(steps: int, out: Path) -> None:
    import subprocess
    import sys

    command = [sys.executable, "-m", "bertology", "pretrain", "--config", "configs/elmo-tiny.yaml", "--overwrite",
               "--set", f"data.corpus=[{elmo_corpus()}]", "--set", "data.format=bert",
               "--set", f"optim.total_steps={steps}", "--set", f"run.output_dir={out}", "--set", "speed.threads=1",
               "--set", f"run.eval_every={max(steps, 1)}", "--set", "run.checkpoint_every=0"]
    command += [f"--set=model.{key}={value}" for key, value in ELMO_SIZE.items()]
    print(" ".join(command), flush=True)
    subprocess.run(command, check=True)


def compare_calibrate(args: argparse.Namespace) -> None:
    """Seconds per step of the MLM encoder and of ELMo, one thread each, back to back in the order MLM, ELMo,
    ELMo, MLM (so that a load that rises or falls evenly over the four runs weighs on both alike); each system's
    figure is the mean of its two runs."""
    import objectives

    runs: dict[str, list[float]] = {"mlm": [], "elmo": []}
    for index, name in enumerate(("mlm", "elmo", "elmo", "mlm")):
        out = COMPARE / "calibrate" / f"{name}-{index}"
        if name == "mlm":
            objectives.pretrain("mlm", args.calibration_steps, out, ["speed.threads=1"])
        else:
            elmo_pretrain(args.calibration_steps, out)
        runs[name].append(objectives.seconds_per_step(out / "metrics.jsonl"))
        print(f"{name}: {runs[name][-1]:.4f} s/step", flush=True)
    timings = {name: statistics.mean(values) for name, values in runs.items()}
    (COMPARE / "seconds_per_step.json").write_text(json.dumps({**timings, "runs": runs}, indent=2) + "\n")


def compare_pretrain(args: argparse.Namespace) -> None:
    """Both models for the same seconds: MLM's steps of docs/OBJECTIVES.md's budget (`--mlm-steps`, 1,910 for its
    5 minutes), ELMo's the same seconds at the calibrated ratio of their step times."""
    import objectives

    timings = json.loads((COMPARE / "seconds_per_step.json").read_text())
    steps = {"mlm": args.mlm_steps, "elmo": round(args.mlm_steps * timings["mlm"] / timings["elmo"])}
    (COMPARE / "plan.json").write_text(json.dumps({"steps": steps, "seconds_per_step": timings}, indent=2) + "\n")
    for name in args.only or ("mlm", "elmo"):
        started = time.perf_counter()
        if name == "mlm":
            objectives.pretrain("mlm", steps[name], COMPARE / name, ["speed.threads=1"])
        else:
            elmo_pretrain(steps[name], COMPARE / name)
        print(f"{name}: {steps[name]} steps in {time.perf_counter() - started:.0f} s", flush=True)


def compare_finetune(args: argparse.Namespace) -> None:
    from bertology.recipes.finetune import FinetuneConfig, finetune

    path = COMPARE / "finetune.jsonl"
    done = {(r["model"], r["task"], r["seed"]) for r in map(json.loads, path.read_text().splitlines())} \
        if path.exists() else set()
    for seed in (0, 1, 2):
        for task in args.tasks:
            for name in args.only or ("mlm", "elmo"):
                if (name, task, seed) in done:
                    continue
                spec = COMPARE_FINETUNE[task]
                out = COMPARE / "finetune" / f"{name}-{task}-s{seed}"
                config = FinetuneConfig.from_dict({
                    "model": str(COMPARE / name / "model"),
                    "task": {"name": task, "data": spec["data"], "epochs": spec["epochs"],
                             "limit_train": spec["limit_train"], "max_length": spec["max_length"],
                             **{key: spec[key] for key in ("tagger", "pooling") if key in spec}},
                    "strategy": {"kind": "scalar-mix"},
                    "optim": {"batch_size": 32, "lr": 1e-2, "warmup_ratio": 0.01},
                    "run": {"output_dir": str(out), "progress": False, "seed": seed, "eval_every": 10**9,
                            "log_every": 100, "keep_last": 1},
                    "speed": {"threads": 1, "prefetch": 2},
                })
                started = time.perf_counter()
                result = finetune(config, overwrite=True)
                row = {"model": name, "task": task, "seed": seed, "metric": spec["metric"],
                       "value": result.dev_metrics[spec["metric"]], "seconds": round(time.perf_counter() - started)}
                print(json.dumps(row), flush=True)
                with path.open("a") as f:
                    f.write(json.dumps(row) + "\n")


def compare_layers(args: argparse.Namespace) -> None:
    """Per-layer WSD (`bertology wsd`: the nearest SemCor sense vector, no gloss, no propagation, WordNet's first
    sense where no candidate has a vector) and per-layer UPOS probing (`bertology probe`), layers 0, 1, 2 of
    both models (the encoder's embeddings and its two blocks; ELMo's token layer and its two biLSTM layers)."""
    import subprocess
    import sys

    def cli(*words: str) -> str:
        return subprocess.run([sys.executable, "-m", "bertology", *words, "--quiet"], check=True,
                              capture_output=True, text=True).stdout

    path = COMPARE / "layers.jsonl"
    done = {(r["model"], r["kind"], r["layer"]) for r in map(json.loads, path.read_text().splitlines())} \
        if path.exists() else set()
    for name in args.only or ("mlm", "elmo"):
        model = str(COMPARE / name / "model")
        if (name, "probe", "all") not in done:
            out = COMPARE / "probe" / name
            cli("probe", "--model", model, "--ud", "../shared/data/ud-english-ewt", "--tasks", "upos", "--out",
                str(out), "--overwrite", "--limit", str(args.probe_limit), "--device", "cpu")
            row = {"model": name, "kind": "probe", "layer": "all",
                   "result": json.loads((out / "probing.json").read_text())}
            with path.open("a") as f:
                f.write(json.dumps(row) + "\n")
        for layer in (0, 1, 2):
            if (name, "wsd", layer) in done:
                continue
            senses = COMPARE / "wsd" / f"{name}-{layer}.npz"
            senses.parent.mkdir(parents=True, exist_ok=True)
            cli("wsd", "fit", "--model", model, "--semcor", "../shared/data/semcor3.0-subset", "--wordnet",
                "../shared/data/wordnet-3.0", "--layers", str(layer), "--gloss-weight", "0", "--propagate", "none",
                "--out", str(senses), "--device", "cpu")
            scores = {}
            for name_set in WSD_SETS:
                data = Path("../shared/data/wsd-raganato2017") / name_set
                keys = senses.with_name(f"{name}-{layer}-{name_set}.key")
                cli("wsd", "predict", "--model", model, "--senses", str(senses), "--wordnet",
                    "../shared/data/wordnet-3.0", "--data", str(data / f"{name_set}.data.xml"), "--output", str(keys),
                    "--device", "cpu")
                scores[name_set] = json.loads(subprocess.run(
                    [sys.executable, "-m", "bertology", "wsd", "score", "--gold", str(data / f"{name_set}.gold.key.txt"),
                     "--predictions", str(keys)], check=True, capture_output=True, text=True).stdout)
            row = {"model": name, "kind": "wsd", "layer": layer, "result": scores}
            print(json.dumps(row), flush=True)
            with path.open("a") as f:
                f.write(json.dumps(row) + "\n")


def compare_table(args: argparse.Namespace) -> None:
    """The Markdown tables of docs/ELMO.md from what the other phases wrote (mean ± sample std over seeds)."""
    from bertology.training import read_metrics

    plan = json.loads((COMPARE / "plan.json").read_text())
    rows = [json.loads(line) for line in (COMPARE / "finetune.jsonl").read_text().splitlines()] \
        if (COMPARE / "finetune.jsonl").exists() else []
    layers = [json.loads(line) for line in (COMPARE / "layers.jsonl").read_text().splitlines()] \
        if (COMPARE / "layers.jsonl").exists() else []
    print("| model | s / step | steps | held-out | CoNLL-2003 dev F1 | SST-2 dev acc. |\n|---|---:|---:|---|---:|---:|")
    for name in ("mlm", "elmo"):
        evals = [r for r in read_metrics(COMPARE / name / "metrics.jsonl") if r["kind"] == "eval"] \
            if (COMPARE / name / "metrics.jsonl").exists() else []
        last = evals[-1] if evals else {}
        heldout = (f"MLM acc. {100 * last['mlm_accuracy']:.1f} %" if "mlm_accuracy" in last else
                   f"ppl {last['bilm_forward_perplexity']:.0f} fwd / {last['bilm_backward_perplexity']:.0f} bwd"
                   if "bilm_forward_perplexity" in last else "-")
        cells = []
        for task in ("conll2003", "sst2"):
            values = [r["value"] for r in rows if r["model"] == name and r["task"] == task]
            spread = f" ± {statistics.stdev(values):.2f}" if len(values) > 1 else ""
            cells.append(f"{statistics.mean(values):.2f}{spread} ({len(values)})" if values else "-")
        print(f"| {name} | {plan['seconds_per_step'][name]:.3f} | {plan['steps'][name]:,} | {heldout} | "
              f"{' | '.join(cells)} |")
    print("\n| model | layer | UPOS probe test acc. (selectivity) | WSD F1 senseval2 | WSD F1 semeval2007 |\n"
          "|---|---:|---:|---:|---:|")
    for name in ("mlm", "elmo"):
        probe = next((r["result"]["tasks"]["upos"] for r in layers if r["model"] == name and r["kind"] == "probe"),
                     None)
        for layer in (0, 1, 2):
            upos = next((f"{100 * r['test_accuracy']:.1f} ({100 * r['selectivity']:.1f})"
                         for r in (probe or {"layers": []})["layers"] if r["layer"] == layer), "-")
            wsd = next((r["result"] for r in layers if r["model"] == name and r["kind"] == "wsd"
                        and r["layer"] == layer), None)
            scores = [f"{wsd[s]['F1']:.1f}" if wsd else "-" for s in WSD_SETS]
            print(f"| {name} | {layer} | {upos} | {' | '.join(scores)} |")


def compare(args: argparse.Namespace) -> None:
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    COMPARE.mkdir(parents=True, exist_ok=True)
    {"calibrate": compare_calibrate, "pretrain": compare_pretrain, "finetune": compare_finetune,
     "layers": compare_layers, "table": compare_table}[args.compare](args)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--size", choices=("tiny", "released"), default="tiny")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--window", type=int, default=20)
    parser.add_argument("--vocab", type=int, default=8000)
    parser.add_argument("--text", choices=("brown", "random"), default="brown",
                        help="the step's words: consecutive windows of Brown (default) or random byte strings")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--embed", action="store_true", help="time embed on ELMo and on a BERT of similar size")
    parser.add_argument("--texts", type=int, default=256)
    parser.add_argument("--compare", choices=("calibrate", "pretrain", "finetune", "layers", "table"),
                        help="the comparison with the MLM encoder of docs/OBJECTIVES.md (see docs/ELMO.md)")
    parser.add_argument("--calibration-steps", type=int, default=40)
    parser.add_argument("--mlm-steps", type=int, default=1910, help="--compare pretrain: the encoder's steps")
    parser.add_argument("--only", nargs="*", choices=("mlm", "elmo"))
    parser.add_argument("--tasks", nargs="*", default=list(COMPARE_FINETUNE), choices=list(COMPARE_FINETUNE))
    parser.add_argument("--probe-limit", type=int, default=4000, help="--compare layers: sentences per UD split")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.compare:
        compare(args)
        return
    if args.embed:
        embed_speed(args)
        return
    device = torch.device(args.device)
    for clip in (3.0, None):
        if args.size == "tiny":
            config = tiny_config(vocab_size=args.vocab, projection_dim=128, cell_size=512, dropout=0.0,
                                 cell_clip=clip, proj_clip=clip)
        else:
            config = ElmoConfig(vocab_size=args.vocab, dropout=0.0, cell_clip=clip, proj_clip=clip)
        model = ElmoModel(config, [HeadSpec("lm", "tied_lm_bias")])
        model.init_weights(torch.Generator().manual_seed(0))
        plain = PlainBiLM(model)
        model.to(device).train()
        plain.to(device).train()
        g = torch.Generator().manual_seed(1)
        if args.text == "brown":  # consecutive windows of real text: words repeat, as in pretraining
            words = brown_windows(args.batch * 2, args.window, config.max_characters_per_token)
        else:  # random words of 1-10 random bytes: every word distinct
            words = torch.randint(1, 257, (args.batch * 2, args.window, config.max_characters_per_token),
                                  generator=g)
            lengths = torch.randint(2, 12, (args.batch * 2, args.window, 1), generator=g)
            positions = torch.arange(config.max_characters_per_token)
            words = torch.where(positions < lengths, words, 261)
            words[..., 0] = 259
            words.scatter_(2, lengths, 260)
        chars, back = words[:args.batch].to(device), words[args.batch:].to(device)
        targets = torch.randint(0, args.vocab, (2, args.batch, args.window), generator=g).to(device)
        batch = (chars, targets[0], back, targets[1])
        with torch.no_grad():
            a, b = ours_loss(model, *batch), plain(*batch)
        assert torch.allclose(a, b, rtol=1e-4), (float(a), float(b))

        def step(module, fn):
            def run():
                loss = fn(*batch)
                loss.backward()
                module.zero_grad(set_to_none=True)
            return run

        sides = {"ours": step(model, lambda *x: ours_loss(model, *x)), "plain": step(plain, plain)}
        if device.type == "cuda":
            sides = {name: synchronized(run) for name, run in sides.items()}
        seconds = common.interleaved(sides, 1, args.repeats)  # turns, so that load weighs on both alike
        ours_s, plain_s = seconds["ours"], seconds["plain"]
        words_per_step = 2 * args.batch * args.window
        print(json.dumps({"size": args.size, "clip": clip, "text": args.text, "threads": args.threads,
                          "device": str(device), "batch": args.batch,
                          "window": args.window, "bertology_words_per_s": round(words_per_step / ours_s),
                          "plain_words_per_s": round(words_per_step / plain_s),
                          "x_plain": round(plain_s / ours_s, 2)}), flush=True)


if __name__ == "__main__":
    main()
