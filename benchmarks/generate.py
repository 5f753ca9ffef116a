"""Generation on CPU: `bertology.generate` against transformers' `generate`, greedy with the key/value cache (and one
beam-search row), batch 8, on the same random GPT-2 and T5 weights.

    python benchmarks/generate.py                 # print the table (about two minutes, 1 thread)
    python benchmarks/generate.py --write         # ... and rewrite the "## Generation" section of RESULTS.md
    python benchmarks/generate.py --quick         # tiny models and few tokens: seconds, to check the script
    python benchmarks/generate.py --rows gpt2-base --repeats 9   # one row

Each model is built by transformers with seed 0 (GPT2LMHeadModel, T5ForConditionalGeneration), saved with
`save_pretrained` and loaded back by `bertology.load_model`, so both sides read the same files. Prompts are real
text: SST-2 dev sentences and Gutenberg paragraphs, tokenised with a byte-level BPE trained here on that text
(`tokenizers`), each cut to a length drawn from 16-48 tokens; left-padded for GPT-2, right-padded for T5's encoder.
Before anything is timed both sides generate once and their token ids are compared (printed; a row whose tokens
differ says so). Then the sides take turns (common.interleaved) and the median call is kept. Tokens/s counts the new
tokens of each row up to and including its EOS (the padding after it is not counted), the same count for both sides.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

# As benchmarks/inference.py: OpenMP workers wait passively on a shared machine; set before torch loads OpenMP.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("RAYON_NUM_THREADS", "1")  # the BPE trainer's threads, on a shared machine
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

import bertology  # noqa: E402
from bertology.model import load_model  # noqa: E402

SECTION = "Generation"
RESULTS = Path(__file__).resolve().parent / "RESULTS.md"
PAD, EOS, UNK = 0, 1, 2  # the trained tokenizer's special ids, shared by both model kinds (T5's own layout)
BATCH = 8


@dataclass(frozen=True)
class Row:
    """One table row: a model and a search."""

    name: str  # for --rows
    label: str
    kind: str  # "gpt2" or "t5"
    size: dict
    num_beams: int = 1


def rows(quick: bool) -> list[Row]:
    if quick:
        small = dict(layers=2, hidden=64, heads=4, inner=128)
        return [Row("gpt2", "GPT-2 tiny", "gpt2", small), Row("gpt2-beam", "GPT-2 tiny", "gpt2", small, num_beams=4),
                Row("t5", "T5 v1.1 tiny", "t5", dict(layers=2, hidden=64, heads=4, inner=128))]
    small = dict(layers=4, hidden=256, heads=4, inner=1024)
    return [Row("gpt2", "GPT-2 small", "gpt2", small),
            Row("gpt2-base", "GPT-2 base-like", "gpt2", dict(layers=6, hidden=512, heads=8, inner=2048)),
            Row("gpt2-beam", "GPT-2 small", "gpt2", small, num_beams=4),
            Row("t5", "T5 v1.1 small", "t5", dict(layers=4, hidden=256, heads=4, inner=640))]


def shape(row: Row) -> str:
    s = row.size
    layers = f"{s['layers']} + {s['layers']} layers" if row.kind == "t5" else f"{s['layers']} layers"
    return f"{layers} x {s['hidden']}, {s['heads']} heads, ff {s['inner']}"


# --- tokenizer and prompts ----------------------------------------------------------------------------------------


def train_tokenizer(texts: list[str], vocab_size: int):
    """A byte-level BPE trained on `texts`, with <pad>, </s>, <unk> as ids 0, 1, 2."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<pad>", "</s>", "<unk>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tokenizer.train_from_iterator(texts, trainer)
    assert [tokenizer.token_to_id(t) for t in ("<pad>", "</s>", "<unk>")] == [PAD, EOS, UNK]
    return tokenizer


def prompts(tokenizer, texts: list[str], seed: int) -> list[list[int]]:
    """BATCH prompts: texts of at least 16 tokens, each cut to a length drawn uniformly from 16-48."""
    rng = np.random.default_rng(seed)
    out: list[list[int]] = []
    while len(out) < BATCH:
        ids = tokenizer.encode(texts[rng.integers(len(texts))]).ids
        if len(ids) >= 16:
            out.append(ids[: min(len(ids), int(rng.integers(16, 49)))])
    return out


def padded(rows_: list[list[int]], left: bool) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(r) for r in rows_)
    ids = torch.full((len(rows_), width), PAD, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, r in enumerate(rows_):
        span = slice(width - len(r), width) if left else slice(0, len(r))
        ids[i, span], mask[i, span] = torch.tensor(r), 1
    return ids, mask


# --- models -------------------------------------------------------------------------------------------------------


def build(row: Row, vocab: int, positions: int, directory: Path):
    """The transformers model (seed 0, random weights), saved to `directory`, and bertology's load of it."""
    from transformers import GPT2Config, GPT2LMHeadModel, T5Config, T5ForConditionalGeneration

    s = row.size
    torch.manual_seed(0)
    if row.kind == "gpt2":
        hf = GPT2LMHeadModel(GPT2Config(vocab_size=vocab, n_positions=positions, n_embd=s["hidden"],
                                        n_layer=s["layers"], n_head=s["heads"], n_inner=s["inner"],
                                        bos_token_id=EOS, eos_token_id=EOS, pad_token_id=PAD))
    else:  # v1.1: gated GELU, untied head, no dropout at inference
        hf = T5ForConditionalGeneration(T5Config(
            vocab_size=vocab, d_model=s["hidden"], d_kv=s["hidden"] // s["heads"], d_ff=s["inner"],
            num_layers=s["layers"], num_decoder_layers=s["layers"], num_heads=s["heads"],
            feed_forward_proj="gated-gelu", tie_word_embeddings=False, pad_token_id=PAD, eos_token_id=EOS,
            decoder_start_token_id=PAD))
    hf.eval().save_pretrained(directory)
    return hf, load_model(directory).eval()


def new_tokens(sequences: torch.Tensor, start: int) -> int:
    """New tokens of every row up to and including its first EOS."""
    total = 0
    for row in sequences[:, start:].tolist():
        total += row.index(EOS) + 1 if EOS in row else len(row)
    return total


# --- the run ------------------------------------------------------------------------------------------------------


def measure(row: Row, hf, ours, ids, mask, args) -> tuple[list[str], dict]:
    options = dict(max_new_tokens=args.new_tokens, num_beams=row.num_beams)
    if row.num_beams > 1:
        options["early_stopping"] = False

    def theirs():
        return hf.generate(input_ids=ids, attention_mask=mask, do_sample=False, pad_token_id=PAD, eos_token_id=EOS,
                           **options)

    def mine():
        return bertology.generate(ours, input_ids=ids, attention_mask=mask, pad_token_id=PAD, eos_token_id=EOS,
                                  **options)

    with torch.inference_mode():
        expected, got = theirs(), mine()
        same = expected.shape == got.shape and torch.equal(expected, got)
        start = ids.shape[1] if row.kind == "gpt2" else 1
        count = new_tokens(got, start)
        check = "identical" if same else "DIFFERENT"
        print(f"  check {row.label}, beams {row.num_beams}: {check} token ids "
              f"({tuple(got.shape)} bertology, {tuple(expected.shape)} transformers; {count} new tokens)",
              file=sys.stderr, flush=True)
        seconds = common.interleaved({"bertology": mine, "transformers": theirs}, warmup=args.warmup,
                                     repeats=args.repeats)
    rates = {name: count / s for name, s in seconds.items()}
    search = "greedy" if row.num_beams == 1 else f"beam {row.num_beams}"
    ratio = rates["bertology"] / rates["transformers"]
    print(f"  {row.label} {search}: bertology {rates['bertology']:.0f} tok/s, transformers "
          f"{rates['transformers']:.0f} tok/s, x{ratio:.2f}", file=sys.stderr, flush=True)
    line = (f"| {row.label} ({shape(row)}) | {search} | {ids.shape[1]} | {count} | {'yes' if same else '**no**'} | "
            f"{rates['bertology']:,.0f} | {rates['transformers']:,.0f} | {ratio:.2f} | "
            f"{1000 * seconds['bertology']:,.0f} | {1000 * seconds['transformers']:,.0f} |")
    return [line], {"same": same}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="tiny models, 8 new tokens, 1 repeat: seconds")
    parser.add_argument("--new-tokens", type=int, default=None, help="max_new_tokens (default 64; --quick: 8)")
    parser.add_argument("--vocab", type=int, default=None, help="BPE vocabulary size (default 8192; --quick: 1000)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed calls per side first")
    parser.add_argument("--repeats", type=int, default=None, help="timed calls per side, median kept (default 15)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (one process, the sides take turns)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the prompt sampling")
    parser.add_argument("--rows", default=None,
                        help="comma-separated subset of gpt2, gpt2-base, gpt2-beam, t5 (default: all)")
    parser.add_argument("--write", action="store_true", help="rewrite the Generation section of RESULTS.md")
    args = parser.parse_args(argv)
    args.new_tokens = args.new_tokens or (8 if args.quick else 64)
    args.vocab = args.vocab or (1000 if args.quick else 8192)
    args.repeats = args.repeats or (1 if args.quick else 15)
    common.check_data()
    if args.write and args.rows:
        parser.error("--write records every row: leave out --rows")
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    torch.set_num_threads(args.threads)
    began, load_start = time.perf_counter(), os.getloadavg()

    sentences = common.sst2_sentences()
    paragraphs = common.gutenberg_paragraphs()
    corpus = sentences + paragraphs[: 2000 if args.quick else 40000]
    tokenizer = train_tokenizer(corpus, args.vocab)
    texts = [t for t in sentences if len(t.split()) >= 12] + paragraphs[::50]
    prompt_rows = prompts(tokenizer, texts, args.seed)
    lengths = sorted(len(r) for r in prompt_rows)
    positions = max(lengths) + args.new_tokens + 8
    print(f"prompts: {BATCH} rows, lengths {lengths}, vocab {tokenizer.get_vocab_size()}", file=sys.stderr, flush=True)

    command = " ".join(["python", "benchmarks/generate.py", *(argv if argv is not None else sys.argv[1:])])
    out = [f"## {SECTION}", "",
           f"Reproduce: `{command}` (from the repository root, with the virtualenv active). "
           f"Run on {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}.", "",
           "| machine | |", "|---|---|"]
    out += [f"| {k} | {v} |" for k, v in common.machine_facts(args.threads).items()]
    out += [f"| OMP_WAIT_POLICY | {os.environ['OMP_WAIT_POLICY']} |",
            f"| load average at start (1/5/15 min) | {' / '.join(f'{x:.1f}' for x in load_start)} |", ""]
    out += [f"`bertology.generate` against transformers' `generate` on the same random weights (seed 0, built by "
            f"transformers, `save_pretrained`, loaded by `bertology.load_model`), batch {BATCH}, "
            f"max_new_tokens {args.new_tokens}, key/value cache on both sides, fp32, torch.inference_mode, "
            f"{args.threads} thread(s), one process, the sides taking turns call by call (order rotating), "
            f"{args.warmup} warm-up call(s) per side, median of {args.repeats} calls. Prompts: real text (SST-2 dev "
            f"sentences, Gutenberg paragraphs) tokenised with a byte-level BPE trained in the script on SST-2 dev + "
            f"Gutenberg (vocabulary {tokenizer.get_vocab_size()}), cut to lengths drawn from 16-48 "
            f"(here {', '.join(map(str, lengths))}); left-padded for GPT-2, right-padded for T5's encoder. "
            "\"new tokens\": the batch's generated tokens up to and including each row's EOS, counted once and "
            "used for both sides' tokens/s (with beams: the tokens of the returned best sequences, not of every beam). "
            "\"same tokens\": both sides' output ids equal, checked before timing.",
            "",
            "| model | search | prompt width | new tokens | same tokens | bertology tok/s | transformers tok/s | "
            "x transformers | bertology ms / call | transformers ms / call |",
            "|---|---|---:|---:|---|---:|---:|---:|---:|---:|"]
    all_same = True
    cache: dict[tuple, tuple] = {}
    chosen = rows(args.quick)
    if args.rows:
        wanted = args.rows.split(",")
        unknown = sorted(set(wanted) - {r.name for r in chosen})
        if unknown:
            parser.error(f"unknown row(s): {', '.join(unknown)}")
        chosen = [r for r in chosen if r.name in wanted]
    for row in chosen:
        key = (row.kind, tuple(sorted(row.size.items())))
        print(f"{row.label} ({shape(row)}), beams {row.num_beams}", file=sys.stderr, flush=True)
        with tempfile.TemporaryDirectory() as tmp:
            if key not in cache:
                cache.clear()
                cache[key] = build(row, tokenizer.get_vocab_size(), positions, Path(tmp))
            hf, ours = cache[key]
            ids, mask = padded(prompt_rows, left=row.kind == "gpt2")
            lines, info = measure(row, hf, ours, ids, mask, args)
        out += lines
        all_same &= info["same"]
    out += ["", f"Load average at the end (1/5/15 min): {' / '.join(f'{x:.1f}' for x in os.getloadavg())}; "
            f"the whole run took {time.perf_counter() - began:.0f} s."]
    if not all_same:
        out += ["", "**Some rows' tokens differ between the two sides: their timings compare different work.**"]
    print("\n".join(out))
    if args.write:
        common.write_section(RESULTS, SECTION, out)


if __name__ == "__main__":
    main()
