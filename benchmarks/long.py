"""Long inputs on CPU: time and peak memory of one forward against the length, for the same weights with Longformer's
window attention (bertology), with full attention (bertology, the same model as a RoBERTa), and in transformers'
LongformerModel.

    python benchmarks/long.py                       # lengths 512 .. 16k, a base-size model (minutes per row)
    python benchmarks/long.py --quick               # a tiny model, lengths 256 and 512: seconds, to check the script
    python benchmarks/long.py --plot long.png --json long.json

The model is built by transformers with seed 0 (LongformerModel, attention_window --window in every layer,
max_position_embeddings for the longest length), saved with `save_pretrained` and loaded by `bertology.load_model`,
so both sides read the same file; the full-attention model is the loaded one's encoder without windows. One batch
row of random ids, the first token global. Each (side, length) runs in a fresh process: the time is the median of
--repeats forwards after one warm-up, the peak memory the process's peak resident size during them (Linux's VmHWM,
reset before the first forward) less its size then. Full attention is skipped past --full-max tokens (its n x n scores)."""

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

            from bertology.model import EncoderConfig

            values = {f.name: getattr(model.config, f.name) for f in dataclasses.fields(EncoderConfig)}
            full = EncoderModel(EncoderConfig(**{**values, "family": "roberta", "attention_window": None}))
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[512, 1024, 2048, 4096, 8192, 16384])
    parser.add_argument("--window", type=int, default=512, help="attention_window (default 512)")
    parser.add_argument("--size", choices=SIZES, default="base")
    parser.add_argument("--sides", nargs="+", choices=SIDES, default=list(SIDES))
    parser.add_argument("--full-max", type=int, default=8192, help="longest length full attention runs at")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--quick", action="store_true", help="the tiny model at 256 and 512 tokens, window 64")
    parser.add_argument("--json", type=Path, help="write the rows here")
    parser.add_argument("--plot", type=Path, help="write the time and memory plot here (PNG)")
    parser.add_argument("--one", nargs=2, metavar=("SIDE", "LENGTH"), help=argparse.SUPPRESS)
    parser.add_argument("--model-dir", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(measure(args.model_dir, args.one[0], int(args.one[1]), args.repeats, args.threads)))
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
