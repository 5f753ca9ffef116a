"""`bertology longformer convert`: a Longformer made from a BERT or RoBERTa model (bertology.model.longformer)."""

from __future__ import annotations

import argparse
import json
import sys

RECORD = "longformer.json"


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("longformer", help="long documents: make a Longformer from a short model",
                                   description="Longformer (Beltagy et al. 2020): sliding-window + global attention.")
    commands = parser.add_subparsers(dest="longformer_command", metavar="{convert}", required=True)
    convert = commands.add_parser(
        "convert", help="a Longformer from a BERT or RoBERTa model directory",
        description="Copies the position embeddings over and over up to --max-length, gives every layer a sliding "
        "window of --window tokens and global projections initialised from its local ones, and writes the model "
        "(transformers' layout), its tokenizer and longformer.json into --out.")
    convert.add_argument("--model", required=True, metavar="DIR", help="the BERT or RoBERTa model directory")
    convert.add_argument("--max-length", type=int, default=4096, metavar="N",
                         help="tokens the Longformer reads (default 4096; at least the source model's)")
    convert.add_argument("--window", type=int, default=512, metavar="W",
                         help="attention window in tokens, even: W/2 on each side (default 512)")
    convert.add_argument("--out", required=True, metavar="DIR", help="directory of the Longformer")
    convert.add_argument("--overwrite", action="store_true",
                         help="write into an --out folder that holds other files (kept; same-named ones replaced)")
    convert.set_defaults(func=run_convert)


def run_convert(args: argparse.Namespace) -> int:
    from bertology.io import check_output_directory, files_into
    from bertology.model import load
    from bertology.model.checkpoint import write_model_files
    from bertology.model.longformer import check_window, longformer_from

    check_window(args.window)  # before any work, as --out is
    out = check_output_directory(args.out, RECORD, "a Longformer of `bertology longformer convert`", args.overwrite)
    source = load(args.model)
    sep = source.tokenizer.sep_id if source.tokenizer is not None else None
    model, dropped = longformer_from(source.model, args.max_length, args.window, sep_token_id=sep)
    if source.tokenizer is not None:
        source.tokenizer.model_max_length = args.max_length
    record = {"model": str(args.model), "max_length": args.max_length, "window": args.window,
              "dropped_heads": dropped}
    with files_into(out) as tmp:
        write_model_files(model, tmp)
        if source.tokenizer is not None:
            source.tokenizer.save(tmp)
        (tmp / RECORD).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    note = f" (dropped heads: {', '.join(dropped)})" if dropped else ""
    print(f"a Longformer of {args.max_length} tokens, window {args.window}, saved to {out}{note}", file=sys.stderr)
    return 0
