"""A permutation-LM forward and backward of XLNet on CPU: bertology's XLNetModel against transformers'
XLNetLMHeadModel with the same weights and the same batch (perm_mask, target_mapping and labels from
bertology.objectives.plm, K = 6), dropout 0.1, fp32, one thread; bertology's loss as its objective computes it (the
head at the predicted slots alone, the summed cross-entropy), transformers' through its `labels`. The two sides
alternate step by step, so that a busy neighbour on a shared machine slows both alike; the fastest and the median
step of each are printed.

    python benchmarks/xlnet_step.py                       # XLNet-tiny: 2 layers, 128 wide, batch 32 x 128
    python benchmarks/xlnet_step.py --layers 4 --hidden 256 --steps 6   # mini
"""

from __future__ import annotations

import argparse
import statistics
import time

import bertology as _openmp_policy  # noqa: F401  (before torch: it sets OpenMP's passive waiting, read when torch loads)

import torch
import transformers

from bertology.model.convert import to_state_dict
from bertology.model.xlnet import XLNetConfig, XLNetModel
from bertology.objectives.mlm import mlm_loss
from bertology.objectives.plm import PermutationConfig, PermutationLM, permutation_batch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--length", type=int, default=128)
    parser.add_argument("--vocab", type=int, default=8000)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    heads = max(1, args.hidden // 64)
    hf = transformers.XLNetLMHeadModel(transformers.XLNetConfig(
        vocab_size=args.vocab, d_model=args.hidden, n_layer=args.layers, n_head=heads, d_inner=4 * args.hidden,
        dropout=0.1)).train()
    ours = XLNetModel(XLNetConfig(vocab_size=args.vocab, hidden_size=args.hidden, num_layers=args.layers,
                                  num_heads=heads, intermediate_size=4 * args.hidden, hidden_dropout=0.1),
                      PermutationLM().heads()).train()
    ours.load_state_dict(to_state_dict(ours, hf.state_dict(), True, "transformers"))
    ids = torch.randint(7, args.vocab, (args.batch, args.length))
    ids[:, -2], ids[:, -1] = 4, 3  # <sep> <cls>
    batch = permutation_batch(ids, torch.ones_like(ids), torch.zeros_like(ids), torch.rand(ids.shape) < 0.7, (3, 4),
                              PermutationConfig(k=6), torch.Generator().manual_seed(0))
    inputs = dict(attention_mask=batch.attention_mask, perm_mask=batch.perm_mask,
                  target_mapping=batch.target_mapping)
    at = batch.masked_positions
    labels = batch.labels[at[:, 0], at[:, 1]]

    def theirs() -> None:
        hf(input_ids=batch.input_ids, labels=batch.labels, **inputs).loss.backward()

    def bertology() -> None:  # as the objective runs it: the head at the predicted slots alone
        logits = ours(batch.input_ids, masked_positions=at, use_mems=False, **inputs).logits
        (mlm_loss(logits, labels, reduction="sum") / len(labels)).backward()

    steps: dict[str, list[float]] = {"transformers": [], "bertology": []}
    for step in range(args.steps + 1):
        for name, run in (("transformers", theirs), ("bertology", bertology)):
            start = time.perf_counter()
            run()
            if step:  # the first is a warm-up
                steps[name].append(time.perf_counter() - start)
    for name, times in steps.items():
        print(f"{name:13s} fastest {min(times):.3f} s  median {statistics.median(times):.3f} s")
    print(f"speed-up: {min(steps['transformers']) / min(steps['bertology']):.2f}x fastest, "
          f"{statistics.median(steps['transformers']) / statistics.median(steps['bertology']):.2f}x median")


if __name__ == "__main__":
    main()
