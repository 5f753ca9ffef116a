"""Peak memory of DeBERTa-v3's disentangled attention on CPU: bertology against transformers' DebertaV2Model (and
the MLM step against DebertaV2ForMaskedLM) on the same weights and the same padded batch.

Each side runs in a fresh process: the model is loaded and the batch built, then one forward (torch.inference_mode)
or one training step (forward, backward of the MLM loss at 15 % of the real tokens) runs once; the figure is the
process's peak resident set during that call (VmHWM, reset just before it through /proc/self/clear_refs) less its
resident set before it: the activations, the score and relative-term tensors, the gradients. transformers computes each term as q @ P_k^T over all 2 x 256 relative
rows, [B x heads, L, 512], then gathers [B x heads, L, L]; bertology multiplies by the rows the batch's distances
reach (at most 2 L - 1), per group of equal lengths, on the packed real tokens.

    python benchmarks/deberta_memory.py                      # base shape, 8 rows of 128-512 tokens
    python benchmarks/deberta_memory.py --shape tiny --rows 4 --length 64
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def resident_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def child(side: str, directory: str, mode: str, rows: int, length: int) -> dict:
    import torch

    from bertology.model import load_model

    torch.set_num_threads(1)
    generator = torch.Generator().manual_seed(0)
    lengths = torch.linspace(length // 4, length, rows).long()  # right-padded rows of several lengths
    ids = torch.randint(5, 30000, (rows, length), generator=generator)
    mask = (torch.arange(length)[None, :] < lengths[:, None]).long()
    ids = ids.masked_fill(mask == 0, 0)
    masked = (torch.rand(rows, length, generator=generator) < 0.15) & mask.bool()
    labels = ids.masked_fill(~masked, -100)
    if side == "bertology":
        model = load_model(directory)
    else:
        import transformers

        name = "DebertaV2ForMaskedLM" if mode == "step" else "DebertaV2Model"
        model = getattr(transformers, name).from_pretrained(directory)
    Path("/proc/self/clear_refs").write_text("5")  # the peak resident set starts again from the current one
    before = resident_kib("VmRSS")
    if mode == "forward":
        model.eval()
        with torch.inference_mode():
            model(ids, mask) if side == "bertology" else model(input_ids=ids, attention_mask=mask)
    else:
        model.train()
        if side == "bertology":
            at = masked.nonzero()
            logits = model(ids, mask, masked_positions=at).logits
            loss = torch.nn.functional.cross_entropy(logits, ids[at[:, 0], at[:, 1]])
        else:
            loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        loss.backward()
    after = resident_kib("VmHWM")
    return {"side": side, "mode": mode, "peak_growth_mib": (after - before) / 1024, "real_tokens": int(mask.sum())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", choices=("tiny", "base"), default="base")
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--length", type=int, default=512)
    parser.add_argument("--child", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        side, directory, mode, rows, length = args.child
        print(json.dumps(child(side, directory, mode, int(rows), int(length))))
        return
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from inference import save_deberta

    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for mode, heads in (("forward", "Model"), ("step", "ForMaskedLM")):
            directory = Path(tmp) / mode
            save_deberta(args.shape, directory, heads)
            for side in ("bertology", "transformers"):
                out = subprocess.run([sys.executable, __file__, "--child", side, str(directory), mode,
                                      str(args.rows), str(args.length)], capture_output=True, text=True, check=True)
                results.append(json.loads(out.stdout.strip().splitlines()[-1]))
                print(results[-1], file=sys.stderr, flush=True)
    print(f"| DeBERTa-v3 {args.shape}, {args.rows} rows padded to {args.length} "
          f"({results[0]['real_tokens']} real tokens) | bertology | transformers | ratio |")
    print("|---|---:|---:|---:|")
    for mode in ("forward", "step"):
        ours, theirs = (next(r["peak_growth_mib"] for r in results if r["side"] == s and r["mode"] == mode)
                        for s in ("bertology", "transformers"))
        what = "forward (inference mode)" if mode == "forward" else "MLM training step (forward + backward)"
        ratio = f"{ours / theirs:.2f}" if theirs > 0 else "n/a"  # a tiny batch may not grow the resident set
        print(f"| {what}: peak resident growth | {ours:,.0f} MiB | {theirs:,.0f} MiB | {ratio} |")


if __name__ == "__main__":
    main()
