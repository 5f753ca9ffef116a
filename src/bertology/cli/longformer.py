"""`bertology longformer convert`: a Longformer made from a BERT or RoBERTa model (bertology.model.longformer)."""

from __future__ import annotations

import argparse
import json
import sys

from bertology.cli._types import positive, seed
from bertology.cli._result import print_result

RECORD = "longformer.json"


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("longformer", help="long documents: make a Longformer from a short model",
                                   description="Longformer (Beltagy et al. 2020): sliding-window + global attention.")
    commands = parser.add_subparsers(dest="longformer_command", metavar="{convert,mlm-loss}", required=True)
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
    loss = commands.add_parser(
        "mlm-loss", help="held-out masked-LM loss on long documents, the same masked tokens for every model",
        description="Cuts the texts into documents of --length tokens, masks each once (15%%, 80/10/10, keyed by "
        "--seed and the document's number) and prints, per --model, one JSON line: the mean cross-entropy at the "
        "masked tokens, a short model reading each document in windows overlapping by half (each mask scored in "
        "the window where it has the most context), a Longformer reading it in one forward.")
    loss.add_argument("--model", required=True, action="append", metavar="DIR",
                      help="a model with a masked-LM head (repeat: every model must tokenize the texts alike)")
    loss.add_argument("--text", required=True, nargs="+", metavar="FILE", help="held-out texts, one document each")
    loss.add_argument("--length", type=positive, metavar="N",
                      help="tokens per document, specials excluded (default: what the longest model reads whole)")
    loss.add_argument("--max-documents", type=positive, metavar="N", help="score the first N documents only")
    loss.add_argument("--seed", type=seed, default=0, help="the masking keys' seed (default 0)")
    loss.add_argument("--encoding", default="utf-8", help="the texts' encoding (default utf-8)")
    loss.add_argument("--batch-size", type=positive, default=8, metavar="N", help="windows per forward (default 8)")
    loss.set_defaults(func=run_mlm_loss)


def run_convert(args: argparse.Namespace) -> int:
    from bertology.io import check_output_directory, files_into
    from bertology.model import load
    from bertology.model.checkpoint import write_model_files
    from bertology.model.longformer import check_max_length, check_source, check_window, longformer_from

    check_window(args.window)  # before any work, as --out is
    check_max_length(args.max_length)
    out = check_output_directory(args.out, RECORD, "a Longformer of `bertology longformer convert`", args.overwrite)
    source = load(args.model)
    check_source(source.model)  # an ELMo or a decoder is named before its tokenizer is asked for separators
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
    print_result({"out": out, **record})
    note = f" (dropped heads: {', '.join(dropped)})" if dropped else ""
    print(f"a Longformer of {args.max_length} tokens, window {args.window}, saved to {out}{note}", file=sys.stderr)
    return 0


def run_mlm_loss(args: argparse.Namespace) -> int:
    from pathlib import Path

    from bertology.errors import ConfigError, DataError
    from bertology.model import MASKED_LM, capabilities, load
    from bertology.recipes.long_mlm import long_document_mlm_loss, mask_documents

    texts = []
    for name in args.text:
        try:
            texts.append(Path(name).read_text(encoding=args.encoding))
        except OSError as error:
            raise DataError(f"--text {name}: {error.strerror or error}") from None
        except UnicodeDecodeError as error:
            raise DataError(f"--text {name}: not {args.encoding} at byte {error.start} (see --encoding)") from None
    models = [load(directory) for directory in args.model]
    for directory, pretrained in zip(args.model, models):
        if MASKED_LM not in capabilities(pretrained.model):
            raise ConfigError(f"--model {directory}: a {getattr(pretrained.model.config, 'family', '?')} model without "
                              "a masked-LM head ('mlm'); mlm-loss scores masked-LM encoders (BERT, RoBERTa, a "
                              "Longformer)")
        if pretrained.tokenizer is None:
            raise ConfigError(f"--model {directory}: no tokenizer files")
    first = models[0].tokenizer
    for directory, pretrained in zip(args.model[1:], models[1:]):
        if any(pretrained.tokenizer.encode(t[:2000], add_special_tokens=False).ids
               != first.encode(t[:2000], add_special_tokens=False).ids for t in texts):
            raise ConfigError(f"--model {directory}: its tokenizer splits the texts otherwise than {args.model[0]}'s; "
                              "the models must share one to be scored on the same masked tokens")
    specials = len(first.framing.frame([]).ids)
    length = args.length or max(p.model.config.max_length for p in models) - specials
    documents = mask_documents(first, texts, length, seed=args.seed, max_documents=args.max_documents)
    for directory, pretrained in zip(args.model, models):
        result = long_document_mlm_loss(pretrained, documents, batch_size=args.batch_size)
        print(json.dumps({"model": str(directory), "loss": round(result.loss, 6), "masked": result.masked,
                          "documents": result.documents, "document_tokens": length, "window": result.window,
                          "forwards": result.forwards}), flush=True)
    return 0
