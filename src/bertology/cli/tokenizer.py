"""`bertology tokenizer train`: train a tokenizer on a corpus and write it in the Hugging Face layout."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bertology.cli._corpus_args import PREFIX_HELP, add_corpus_arguments, sources_from_args
from bertology.cli._result import print_result
from bertology.errors import ConfigError
from bertology.io import file_in_the_way
from bertology.tokenization import train_tokenizer

# Files that make a directory a model directory: its weights were trained with the tokenizer stored beside them.
MODEL_FILES: tuple[str, ...] = ("config.json", "model.safetensors", "pytorch_model.bin", "bertology.json")


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("tokenizer", help="train tokenizers")
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    train = actions.add_parser(
        "train",
        help="train a WordPiece, byte-level BPE or Unigram tokenizer (BERT, RoBERTa, GPT-2, BART, ALBERT, XLM-R, T5)",
        description="Train a tokenizer on the sentences of a corpus (files, directories or globs, read as "
        "`data prepare` reads them) and write tokenizer.json, tokenizer_config.json, special_tokens_map.json and "
        f"the vocabulary files to --out. {PREFIX_HELP}",
    )
    train.add_argument("--kind", required=True, choices=("wordpiece", "bpe", "bytelevel-bpe", "unigram"),
                       help="bytelevel-bpe is bpe (byte-level, as RoBERTa, GPT-2 and BART)")
    train.add_argument("--vocab-size", required=True, type=int)
    train.add_argument("--out", required=True, help="output directory")
    train.add_argument("--overwrite", action="store_true",
                       help="replace the tokenizer of an existing model directory (its weights depend on it)")
    add_corpus_arguments(train)
    train.add_argument("--style", choices=("bert", "roberta", "gpt2", "bart", "t5", "deberta"), default=None,
                       help="special-token style (default: bert for wordpiece, roberta otherwise): bpe also as gpt2 "
                       "or bart, unigram as bert (ALBERT), t5 (</s> after each text, <pad>, sentinels) or deberta "
                       "(DeBERTa-v3: [CLS] A [SEP] B [SEP], [PAD] 0)")
    train.add_argument("--sentinels", type=int, default=None, metavar="N",
                       help="t5 style: N sentinel tokens <extra_id_0> ... <extra_id_N-1> at the end of the vocabulary "
                       "(default 100, as T5)")
    case = train.add_mutually_exclusive_group()
    case.add_argument("--lowercase", dest="lowercase", action="store_true", default=None)
    case.add_argument("--no-lowercase", dest="lowercase", action="store_false")
    train.add_argument("--min-frequency", type=int, default=2)
    train.add_argument("--model-max-length", type=int, default=512)
    train.add_argument("--quiet", action="store_true", help="no progress bar")
    train.set_defaults(func=run_train)


def check_out(out: str | Path, overwrite: bool) -> Path:
    """--out must be a directory that can be created or filled, and not a model directory unless `overwrite`."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out}: is a file, not a directory")
    blocker = file_in_the_way(out)
    if blocker is not None:
        raise ConfigError(f"--out {out}: {blocker} is a file, not a directory")
    if out.is_dir() and not overwrite:
        present = [name for name in MODEL_FILES if (out / name).exists()]
        if present:
            raise ConfigError(f"--out {out}: holds a model ({', '.join(present)}) whose weights depend on the "
                              "tokenizer there; write the new tokenizer elsewhere, or pass --overwrite to replace it")
    return out


def run_train(args: argparse.Namespace) -> int:
    # The output directory and every source (missing paths, unknown encodings) are checked before training starts;
    # the sentences then stream from the readers, so the corpus never has to fit in memory.
    out = check_out(args.out, args.overwrite)
    tokenizer = train_tokenizer(
        sources_from_args(args),
        args.kind,
        args.vocab_size,
        style=args.style,
        lowercase=args.lowercase,
        min_frequency=args.min_frequency,
        show_progress=not args.quiet,
        model_max_length=args.model_max_length,
        sentinels=args.sentinels,
    )
    tokenizer.save(out)
    print_result({"out": out, "kind": args.kind, "style": tokenizer.style, "vocab_size": tokenizer.vocab_size})
    print(f"wrote {args.kind} tokenizer ({tokenizer.vocab_size} tokens, {tokenizer.style} style) to {out}",
          file=sys.stderr)
    if tokenizer.vocab_size < args.vocab_size:
        print(f"note: the corpus gave {tokenizer.vocab_size} of the {args.vocab_size} tokens asked for (a small "
              "corpus gives a small vocabulary)", file=sys.stderr)
    return 0
