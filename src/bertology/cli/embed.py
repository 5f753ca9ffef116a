"""`bertology embed`: contextual vectors of the texts in a file, written as .npy or .npz."""

from __future__ import annotations

import argparse
import sys

import torch

from bertology.cli._result import print_result
from bertology.device import add_device_arguments, placement_from_args
from bertology.embeddings import check_output, embed, parse_layers, read_texts, save_vectors
from bertology.embeddings.corpus import CorpusSettings, embed_corpus, is_corpus_input
from bertology.embeddings.layers import LayerSpec
from bertology.errors import ConfigError
from bertology.model import load
from bertology.model.quantize import with_dtype


def layers_argument(text: str) -> LayerSpec:
    """--layers for argparse, which reports ArgumentTypeError as a usage error."""
    try:
        return parse_layers(text)
    except ConfigError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "embed",
        help="write contextual sentence, word or token vectors",
        description="Embed the texts of a file (one per line, or JSON lines) and write sentence vectors to "
        ".npy ([N, H]) or any level to .npz (vectors plus an index: text, word/token number, string, "
        "character span; texts and strings as UTF-8 bytes plus offsets, read them with "
        "bertology.embeddings.load_vectors). Texts longer than the model's positions are embedded in overlapping "
        "windows. The output path is checked before the model is loaded. "
        "Corpus mode: when --input is a directory or a glob pattern (quote it), every file is embedded into shards "
        "under the --output directory (vectors .npy plus a JSONL index per shard, a manifest.json), which --resume "
        "continues after a kill; --engine ray runs the shards on a Ray cluster (docs/EMBEDDING-AT-SCALE.md).",
    )
    parser.add_argument("--model", required=True, help="model directory (transformers layout)")
    parser.add_argument("--input", required=True,
                        help="UTF-8 text file, or (corpus mode) a directory or a glob pattern such as 'data/*.jsonl'")
    parser.add_argument("--format", choices=("lines", "jsonl"), default="lines",
                        help="lines: one text per line (empty lines are empty texts); jsonl: one object per line")
    parser.add_argument("--text-field", default="text", help="jsonl key holding the text (default: text)")
    parser.add_argument("--output", required=True,
                        help="OUT.npy (sentence level) or OUT.npz; in corpus mode, a directory")
    parser.add_argument("--level", choices=("sentence", "word", "token"), default="sentence")
    parser.add_argument("--layers", type=layers_argument, default="last",
                        help="last, sum-last-four, mean, concat, mix (the model's scalar mix), or comma-separated "
                        "hidden-state indices "
                        "(0 = embedding output, -1 = last layer; write --layers=-2,-1 when the list starts with a minus); "
                        "default: last")
    parser.add_argument("--combine", choices=("sum", "mean", "concat"), default=None,
                        help="how explicit layer indices are combined (default: mean)")
    parser.add_argument("--pooling", choices=("first", "mean", "last"), default="mean",
                        help="subword pooling for word vectors (default: mean)")
    parser.add_argument("--sentence", choices=("mean", "cls", "max"), default=None,
                        help="sentence vector: mean of all tokens, specials included, the summary token, or the "
                        "maximum over the tokens (default: a sentence-transformers directory's pooling, else mean)")
    parser.add_argument("--normalize", action=argparse.BooleanOptionalAction, default=None,
                        help="unit-length sentence vectors (default: as a sentence-transformers directory's "
                        "Normalize module says, else no)")
    parser.add_argument("--long-texts", choices=("windows", "truncate"), default=None,
                        help="truncate: a text's first tokens only (sentence-transformers' default, at its "
                        "max_seq_length); windows: all of it in overlapping windows (the default elsewhere)")
    parser.add_argument("--prompt", default=None, help="text prepended to every input (default: a "
                        "sentence-transformers directory's default prompt, if it has one)")
    parser.add_argument("--prompt-name", default=None, help="one of a sentence-transformers directory's prompts")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--max-length", type=int, default=None,
                        help="tokens per window, specials included (default: the model's positions)")
    parser.add_argument("--stride", type=int, default=None,
                        help="step between window starts in content tokens (default: half a window)")
    add_device_arguments(parser, int8=True, int8_help="the encoder layers' linear maps in int8 (faster on CPU, "
                         "vectors differ slightly from float32; docs/EMBEDDING-AT-SCALE.md)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    corpus = parser.add_argument_group("corpus mode (--input is a directory or a glob)")
    corpus.add_argument("--shard-size", type=int, default=10000, help="texts per shard (default: 10000)")
    corpus.add_argument("--id-field", default="id", help="jsonl key copied to the index as the document id "
                        "(default: id; absent keys give null)")
    corpus.add_argument("--resume", action="store_true",
                        help="continue the run in --output (same model, inputs and options), skipping finished shards")
    corpus.add_argument("--engine", choices=("local", "ray"), default="local",
                        help="local: this process; ray: an actor pool of encoders on a Ray cluster (pip install "
                        "-e '.[ray]' from the checkout)")
    corpus.add_argument("--address", default=None,
                        help="Ray cluster address (e.g. ray://host:10001 or auto); default: a local Ray instance")
    corpus.add_argument("--workers", type=int, default=None, help="Ray encoder actors (default: 2)")
    corpus.add_argument("--gpus-per-worker", type=float, default=None, metavar="G",
                        help="GPUs each Ray actor asks for (fractions share one, e.g. 0.5; default: 1 when this "
                        "machine has a GPU and --device is not cpu, else 0)")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch threads (per encoder on Ray; default: torch's own, 1 per Ray actor)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if is_corpus_input(args.input):
        return run_corpus(args)
    corpus_only = [flag for flag, given in (("--resume", args.resume), ("--engine", args.engine != "local"),
                                            ("--address", args.address is not None),
                                            ("--workers", args.workers is not None),
                                            ("--gpus-per-worker", args.gpus_per_worker is not None)) if given]
    if corpus_only:
        raise ConfigError(f"{', '.join(corpus_only)}: for corpus mode only (--input a directory or a glob pattern)")
    if args.prompt is not None and args.prompt_name is not None:
        raise ConfigError("--prompt and --prompt-name: give one of them, not both")
    if args.threads is not None:
        if args.threads < 1:
            raise ConfigError(f"threads must be a positive integer, got {args.threads}")
        torch.set_num_threads(args.threads)
    where = placement_from_args(args, int8=True)
    check_output(args.output, args.level)  # paths first: a bad --output fails before any embedding work
    texts = read_texts(args.input, args.format, args.text_field)
    pretrained = with_dtype(load(args.model), args.dtype)
    result = embed(
        pretrained,
        texts,
        layers=args.layers,
        combine=args.combine,
        pooling=args.pooling,
        sentence=args.sentence,
        levels=(args.level,),
        batch_size=args.batch_size,
        max_length=args.max_length,
        stride=args.stride,
        long_texts=args.long_texts,
        normalize=args.normalize,
        prompt=args.prompt,
        prompt_name=args.prompt_name,
        show_progress=not args.quiet and sys.stderr.isatty() and len(texts) > args.batch_size,
        device=where.device,
        dtype=where.float_dtype,
    )
    rows = save_vectors(result, args.output, args.level, meta={"model": str(args.model), "input": str(args.input)})
    print_result({"output": args.output, "level": args.level, "vectors": rows, "dim": result.dim,
                  "texts": len(texts)})
    print(f"wrote {rows} {args.level} vectors ({result.dim} dimensions) for {len(texts)} texts to {args.output}",
          file=sys.stderr)
    return 0


def run_corpus(args: argparse.Namespace) -> int:
    # The local engine runs here: its device is resolved now. Ray's actors resolve theirs (run_ray checks it).
    if args.gpus_per_worker is not None and args.engine != "ray":
        raise ConfigError("--gpus-per-worker: for corpus mode with --engine ray only")
    single_only = [flag for flag, given in (("--normalize", args.normalize is not None),
                                            ("--long-texts", args.long_texts is not None),
                                            ("--prompt", args.prompt is not None),
                                            ("--prompt-name", args.prompt_name is not None)) if given]
    if single_only:
        raise ConfigError(f"{', '.join(single_only)}: not in corpus mode (a corpus run embeds whole texts in windows "
                          "with bertology's options, recorded in its manifest)")
    device = placement_from_args(args, int8=True).device if args.engine == "local" else args.device
    settings = CorpusSettings(level=args.level, layers=args.layers, combine=args.combine, pooling=args.pooling,
                              sentence=args.sentence or "mean", batch_size=args.batch_size, max_length=args.max_length,
                              stride=args.stride, dtype=args.dtype, format=args.format, text_field=args.text_field,
                              id_field=args.id_field, shard_size=args.shard_size)
    report = embed_corpus(args.model, args.input, args.output, settings, resume=args.resume, engine=args.engine,
                          address=args.address, workers=args.workers, threads=args.threads, device=device,
                          gpus_per_worker=args.gpus_per_worker,
                          show_progress=not args.quiet and sys.stderr.isatty())
    print_result({"output": report.output, "texts": report.texts, "files": len(report.files),
                  "shards": report.shards, "written": report.written, "skipped": report.skipped, "dim": report.dim})
    print(f"{report.texts} texts in {len(report.files)} files: {report.written} shards written, {report.skipped} "
          f"already done, {report.shards} in all ({report.dim} dimensions) in {report.output}", file=sys.stderr)
    return 0
