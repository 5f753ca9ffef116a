"""Long inputs on CPU: time and peak memory of one forward against the length, for the same weights with Longformer's
window attention (bertology), with full attention (bertology, the same model as a RoBERTa), and in transformers'
LongformerModel.

    python benchmarks/long.py                       # lengths 512 .. 16k, a base-size model (minutes per row)
    python benchmarks/long.py --quick               # a tiny model, lengths 256 and 512: seconds, to check the script
    python benchmarks/long.py --plot long.png --json long.json
    python benchmarks/long.py --embed --model ROBERTA_DIR --embed-lengths 1024 4096   # embed: one forward vs windows
    python benchmarks/long.py --embed --quick       # a tiny random RoBERTa, 128 to 1,000 tokens: checks the script

The model is built by transformers with seed 0 (LongformerModel, attention_window --window in every layer,
max_position_embeddings for the longest length), saved with `save_pretrained` and loaded by `bertology.load_model`,
so both sides read the same file; the full-attention model is the loaded one's encoder without windows. One batch
row of random ids, the first token global. Each (side, length) runs in a fresh process: the time is the median of
--repeats forwards after one warm-up, the peak memory the process's peak resident size during them (Linux's VmHWM,
reset before the first forward) less its size then. Full attention is skipped past --full-max tokens (its n x n scores).

`--embed` compares `bertology.embed` of one long text read by a short model in windows (its length, embed's default
stride) with the Longformer made from it (`longformer_from`, --window) reading the text in one forward, its <s>
global: the cosine of every content token's last-layer vector in the one against the other (mean, 5th percentile,
minimum), of the mean-pooled text vectors, and the time of each (median of --repeats after one warm-up; in this
process). The text is the first N tokens of --text (default: a Gutenberg book of ../shared/data)."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as the other benchmarks: passive OpenMP waiting when shared

import torch  # noqa: E402

SIDES = ("window", "full", "transformers")
SIZES = {"base": dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072),
         "tiny": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128)}


def build(directory: Path, size: str, window: int, max_length: int) -> None:
    import transformers

    config = transformers.LongformerConfig(vocab_size=50265, max_position_embeddings=max_length + 2, type_vocab_size=1,
                                           pad_token_id=1, attention_window=window, **SIZES[size])
    torch.manual_seed(0)
    transformers.LongformerModel(config).eval().save_pretrained(directory)


def status_mb(field: str) -> float:
    """VmRSS (resident now) or VmHWM (its peak) from /proc/self/status, in MB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise SystemExit(f"/proc/self/status has no {field}")


def reset_peak() -> None:
    """Start the peak resident size (VmHWM) afresh: Linux's clear_refs 5."""
    Path("/proc/self/clear_refs").write_text("5")


def measure(directory: Path, side: str, length: int, repeats: int, threads: int) -> dict:
    """One row, in this process: seconds (median) and peak memory (MB above the size before the first forward)."""
    torch.set_num_threads(threads)
    if side == "transformers":
        import transformers

        model = transformers.LongformerModel.from_pretrained(directory).eval()

        def forward(ids, flags):
            return model(input_ids=ids, global_attention_mask=flags).last_hidden_state
    else:
        from bertology.model import EncoderModel, load_model

        model = load_model(directory)
        if side == "full":  # the same weights with every token attending to every token: a RoBERTa
            import dataclasses

            from bertology.model import TransformerConfig

            values = {f.name: getattr(model.config, f.name) for f in dataclasses.fields(TransformerConfig)}
            full = EncoderModel(TransformerConfig(**{**values, "family": "roberta", "attention_window": None}))
            full.load_state_dict({k: v for k, v in model.state_dict().items() if "_global." not in k})
            model = full.eval()

            def forward(ids, flags):
                return model(ids).last_hidden_state
        else:
            def forward(ids, flags):
                return model(ids, global_attention_mask=flags).last_hidden_state
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 50000, (1, length), generator=generator)
    flags = torch.zeros_like(ids)
    flags[0, 0] = 1
    reset_peak()
    before = status_mb("VmRSS")
    times = []
    with torch.no_grad():
        forward(ids, flags)
        for _ in range(repeats):
            start = time.perf_counter()
            forward(ids, flags)
            times.append(time.perf_counter() - start)
    peak = status_mb("VmHWM")
    return {"side": side, "length": length, "seconds": statistics.median(times),
            "tokens_per_second": length / statistics.median(times), "peak_mb": max(peak - before, 0.0)}


def run_one(directory: Path, side: str, length: int, repeats: int, threads: int) -> dict:
    command = [sys.executable, __file__, "--one", side, str(length), "--model-dir", str(directory), "--repeats",
               str(repeats), "--threads", str(threads)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[1] / "src"),
                                                        os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    if done.returncode:
        raise SystemExit(f"{side} at {length} tokens failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, 2, figsize=(10, 4))
    for side in SIDES:
        mine = sorted((r for r in rows if r["side"] == side), key=lambda r: r["length"])
        if not mine:
            continue
        lengths = [r["length"] for r in mine]
        axes[0].plot(lengths, [r["seconds"] for r in mine], marker="o", label=side)
        axes[1].plot(lengths, [r["peak_mb"] for r in mine], marker="o", label=side)
    for axis, label in zip(axes, ("seconds per forward", "peak memory (MB)")):
        axis.set_xscale("log", base=2)
        axis.set_yscale("log")
        axis.set_xlabel("tokens")
        axis.set_ylabel(label)
        axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)


BOOK = Path(__file__).resolve().parents[2] / "shared" / "data" / "gutenberg-nltk" / "chesterton-thursday.txt"


def tiny_roberta(directory: Path, text: str) -> None:
    """A tiny random RoBERTa with a masked-LM head and a byte-level BPE trained on `text` (the --quick model)."""
    from bertology.model import EncoderModel, HeadSpec, Pretrained, preset
    from bertology.tokenization import train_tokenizer

    tokenizer = train_tokenizer(iter(text.splitlines()), "bpe", 500, show_progress=False, style="roberta")
    config = preset("tiny", vocab_size=tokenizer.vocab_size, num_layers=2, hidden_size=64, num_heads=2,
                    intermediate_size=128, max_position_embeddings=130, family="roberta", pad_token_id=1,
                    positions_after_padding=True, type_vocab_size=1)
    model = EncoderModel(config, [HeadSpec("mlm", "masked_lm")])
    model.init_weights(torch.Generator().manual_seed(0))
    Pretrained(model, tokenizer).save(directory)


def embed_comparison(short, long, text: str, length: int, repeats: int = 3) -> dict:
    """One row of --embed: the first `length` tokens of `text` (specials included) embedded by the `short`
    Pretrained in windows and by the `long` one in one forward; cosines per token and times (see the docstring)."""
    import numpy as np

    from bertology import embed
    from bertology.embeddings.windows import plan_windows

    encoding = short.tokenizer.encode(text, add_special_tokens=False)
    content = length - len(short.tokenizer.framing.frame([]).ids)
    if len(encoding.ids) < content:
        raise SystemExit(f"the text has {len(encoding.ids)} tokens, fewer than the {content} asked for")
    piece = text[:encoding.offsets[content - 1][1]]
    results, times = {}, {}
    for name, model in (("windows", short), ("one_forward", long)):
        embed(model, [piece], levels=("token", "sentence"))  # warm-up
        seconds = []
        for _ in range(repeats):
            start = time.perf_counter()
            results[name] = embed(model, [piece], levels=("token", "sentence"))
            seconds.append(time.perf_counter() - start)
        times[name] = statistics.median(seconds)
    a, b = results["windows"].tokens.vectors, results["one_forward"].tokens.vectors
    if a.shape != b.shape:
        raise SystemExit(f"the two read different tokens: {a.shape} against {b.shape}")
    cos = (a * b).sum(1) / np.maximum(np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1), 1e-12)
    u, v = results["windows"].sentences[0], results["one_forward"].sentences[0]
    capacity = results["windows"].window_length - (length - content)
    windows = len(plan_windows(content, capacity, min(results["windows"].stride, capacity)))
    return {"tokens": length, "content_tokens": int(len(a)), "short_window": results["windows"].window_length,
            "windows": windows, "cosine_mean": float(cos.mean()), "cosine_p5": float(np.percentile(cos, 5)),
            "cosine_min": float(cos.min()), "sentence_cosine": float(u @ v / (np.linalg.norm(u) * np.linalg.norm(v))),
            "windows_seconds": times["windows"], "one_forward_seconds": times["one_forward"],
            "speedup": times["windows"] / times["one_forward"]}


def run_embed(args: argparse.Namespace) -> list[dict]:
    from bertology.model import Pretrained, load
    from bertology.model.longformer import longformer_from

    torch.set_num_threads(args.threads)
    text = args.text.read_text(encoding="latin-1") if args.text is not None and args.text.is_file() else None
    if text is None:  # no book: words from a fixed vocabulary, seeded
        generator = torch.Generator().manual_seed(0)
        words = "the cat sat on a mat while old men walked by the green river and talked of long ago".split()
        text = "\n".join(" ".join(words[i] for i in torch.randint(len(words), (12,), generator=generator).tolist())
                         for _ in range(4000))
    with tempfile.TemporaryDirectory() as tmp:
        directory = args.model
        if directory is None:
            directory = Path(tmp) / "tiny-roberta"
            tiny_roberta(directory, text[:200_000])
        short = load(directory)
        longest = max(args.embed_lengths)
        model, _ = longformer_from(short.model, max(longest, short.model.config.max_length), args.window,
                                   sep_token_id=short.tokenizer.sep_id)
        long = Pretrained(model, short.tokenizer)
        rows = []
        print(f"{directory if args.model else 'tiny random RoBERTa'}: windows of {short.model.config.max_length} "
              f"tokens against one Longformer forward (window {args.window}), {args.threads} thread(s)")
        print("| tokens | windows | cosine mean | p5 | min | text vector cosine | windows s | one forward s | "
              "speed-up |\n|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for length in args.embed_lengths:
            row = embed_comparison(short, long, text, length, args.repeats)
            rows.append(row)
            print(f"| {length} | {row['windows']} | {row['cosine_mean']:.4f} | {row['cosine_p5']:.4f} | "
                  f"{row['cosine_min']:.4f} | {row['sentence_cosine']:.4f} | {row['windows_seconds']:.3f} | "
                  f"{row['one_forward_seconds']:.3f} | {row['speedup']:.2f}x |", flush=True)
            # A text the short model reads in one window, inside the Longformer's window: the same vectors.
            if length <= short.model.config.max_length and args.window >= 2 * length and row["cosine_min"] < 0.9999:
                raise SystemExit(f"at {length} tokens the one forward differs from the short model's: "
                                 f"cosine {row['cosine_min']:.6f}")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[512, 1024, 2048, 4096, 8192, 16384])
    parser.add_argument("--window", type=int, default=512, help="attention_window (default 512)")
    parser.add_argument("--size", choices=SIZES, default="base")
    parser.add_argument("--sides", nargs="+", choices=SIDES, default=list(SIDES))
    parser.add_argument("--full-max", type=int, default=8192, help="longest length full attention runs at")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--quick", action="store_true", help="the tiny model at 256 and 512 tokens, window 64 (with --embed: a tiny "
                        "random RoBERTa, 128 to 1,000 tokens, window 256)")
    parser.add_argument("--json", type=Path, help="write the rows here")
    parser.add_argument("--plot", type=Path, help="write the time and memory plot here (PNG)")
    parser.add_argument("--embed", action="store_true", help="embed of a long text: one forward against windows")
    parser.add_argument("--model", type=Path, help="--embed: the short BERT or RoBERTa (default: a tiny random one)")
    parser.add_argument("--embed-lengths", type=int, nargs="+", default=[1024, 4096], help="--embed: text tokens")
    parser.add_argument("--text", type=Path, default=BOOK, help="--embed: the long text (Latin-1)")
    parser.add_argument("--one", nargs=2, metavar=("SIDE", "LENGTH"), help=argparse.SUPPRESS)
    parser.add_argument("--model-dir", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(measure(args.model_dir, args.one[0], int(args.one[1]), args.repeats, args.threads)))
        return
    if args.embed:
        if args.quick:
            args.model, args.embed_lengths, args.window, args.repeats = None, [128, 256, 1000], 256, 1
        rows = run_embed(args)
        if args.json:
            args.json.write_text(json.dumps(rows, indent=2) + "\n", encoding="utf-8")
        return
    if args.quick:
        args.size, args.lengths, args.window, args.repeats = "tiny", [256, 512], 64, 1
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp) / "longformer"
        build(directory, args.size, args.window, max(args.lengths))
        rows = []
        print(f"{args.size} model, window {args.window}, {args.threads} thread(s)")
        print("| tokens | side | seconds | tokens/s | peak MB |\n|---:|---|---:|---:|---:|")
        for length in args.lengths:
            for side in args.sides:
                if side == "full" and length > args.full_max:
                    continue
                row = run_one(directory, side, length, args.repeats, args.threads)
                rows.append(row)
                print(f"| {length} | {side} | {row['seconds']:.3f} | {row['tokens_per_second']:.0f} | "
                      f"{row['peak_mb']:.0f} |", flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n", encoding="utf-8")
    if args.plot:
        plot(rows, args.plot)


if __name__ == "__main__":
    main()
