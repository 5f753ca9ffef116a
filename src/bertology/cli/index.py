"""`bertology index build`: embed a passages file (or a SQuAD file's paragraphs) and write a dense index."""

from __future__ import annotations

import argparse
import sys
import time

from bertology.cli._result import print_result
from bertology.device import add_device_arguments, placement_from_args


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "index",
        help="build a retrieval index (dense: faiss over sentence vectors; bm25: bm25s; hybrid: both, fused)",
        description="Passage indexes for `bertology search` and `bertology evaluate --task retrieval`.",
    )
    commands = parser.add_subparsers(dest="index_command", metavar="COMMAND", required=True)
    build = commands.add_parser(
        "build",
        help="embed passages and write an index directory",
        description="Embed every passage with the model (normalised sentence vectors, by default as the model "
        "was trained: a sentence-transformers directory's pooling and max_seq_length, else the mean of the last "
        "layer) and write an index directory atomically: index.json (model fingerprint, options, structure), "
        "vectors.faiss, passages.jsonl. Passages: JSON lines {\"id\": string or integer, \"text\": string}, ids "
        "unique; other keys are ignored.",
    )
    build.add_argument("--kind", choices=("dense", "bm25", "hybrid"), default="dense",
                       help="dense (faiss over the model's sentence vectors, the default), bm25 (bm25s; no model) or "
                       "hybrid (both, their rankings fused: --fusion)")
    build.add_argument("--model", default=None, help="model directory (dense and hybrid)")
    source = build.add_mutually_exclusive_group(required=True)
    source.add_argument("--input", metavar="PASSAGES.jsonl", help="passages file (JSON lines with id and text)")
    source.add_argument("--squad", metavar="FILE",
                        help="index the paragraphs of a SQuAD v1.1 file (ids <article>-<paragraph>)")
    build.add_argument("--out", required=True, metavar="INDEX", help="index directory to write (replaced if it is one)")
    build.add_argument("--vectors", metavar="CORPUS_OUT", default=None,
                       help="index the vectors of a finished `bertology embed` corpus run of these passages (jsonl "
                       "with their ids) instead of embedding them; its options are used, a sample is checked")
    build.add_argument("--approximate", choices=("hnsw", "ivf"), default=None,
                       help="approximate search instead of exact (faiss IndexFlatIP)")
    build.add_argument("--hnsw-m", type=int, default=32, help="hnsw: neighbours per node (default 32)")
    build.add_argument("--ef-construction", type=int, default=200, help="hnsw: build-time beam (default 200)")
    build.add_argument("--ef-search", type=int, default=128, help="hnsw: search-time beam (default 128)")
    build.add_argument("--nlist", type=int, default=None, help="ivf: k-means cells (default 4 sqrt(N), at most N / 39)")
    build.add_argument("--nprobe", type=int, default=16, help="ivf: cells visited per query (default 16)")
    build.add_argument("--sentence", choices=("mean", "cls"), default=None,
                       help="sentence pooling (default: the model's own, else mean)")
    build.add_argument("--layers", default=None,
                       help="hidden states as for `bertology embed` (default: the last layer)")
    build.add_argument("--max-length", type=int, default=None,
                       help="tokens per text, specials included (default: the model's max_seq_length or positions)")
    build.add_argument("--long-texts", choices=("windows", "truncate"), default=None,
                       help="texts over --max-length: embedded in windows, or truncated (default: truncate for a "
                       "sentence-transformers model, as it encodes, else windows)")
    build.add_argument("--k1", type=float, default=1.5, help="bm25: term-frequency saturation (default 1.5)")
    build.add_argument("--b", type=float, default=0.75, help="bm25: length normalisation (default 0.75)")
    build.add_argument("--fusion", choices=("rrf", "interpolate"), default="rrf",
                       help="hybrid: reciprocal rank fusion (default) or interpolated min-max normalised scores")
    build.add_argument("--weight", type=float, default=0.5,
                       help="hybrid, interpolate: the dense score's weight, bm25's being 1 - weight (default 0.5)")
    build.add_argument("--rrf-k", type=int, default=60, help="hybrid, rrf: the constant k in 1 / (k + rank) (60)")
    build.add_argument("--fusion-depth", type=int, default=100,
                       help="hybrid: passages each retriever ranks before fusing (default 100, at least k)")
    build.add_argument("--batch-size", type=int, default=32)
    build.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's own setting)")
    build.add_argument("--quiet", action="store_true", help="no progress bar")
    add_device_arguments(build)
    build.set_defaults(func=run_build)


def run_build(args: argparse.Namespace) -> int:
    import dataclasses

    from bertology.cli.embed import layers_argument
    from bertology.model import load
    from bertology.retrieval import Index, Structure, model_options, read_passages, squad_passages
    from bertology.errors import ConfigError
    from bertology.retrieval.index import check_output, corpus_vectors, set_threads

    from bertology.retrieval import BM25Options, Fusion, HybridIndex, SparseIndex

    where = placement_from_args(args)
    bm25 = BM25Options(k1=args.k1, b=args.b)
    fusion = Fusion(args.fusion, weight=args.weight, rrf_k=args.rrf_k, depth=args.fusion_depth)
    if args.kind == "bm25":
        dense_only = [f"--{name}" for name, value in (("model", args.model), ("vectors", args.vectors),
                                                      ("approximate", args.approximate)) if value is not None]
        if dense_only:
            raise ConfigError(f"{', '.join(dense_only)}: a bm25 index embeds nothing; drop them or use --kind "
                              f"dense or hybrid")
        check_output(args.out, files=("bm25.npz", "vocabulary.json"))
        started = time.perf_counter()
        passages = read_passages(args.input) if args.input else squad_passages(args.squad)
        index = SparseIndex.build(passages, options=bm25)
        index.save(args.out)
        print_result({"out": args.out, "kind": "bm25", "passages": len(index), "terms": index.meta["terms"]})
        print(f"indexed {len(index)} passages (bm25, {index.meta['terms']} terms) in "
              f"{time.perf_counter() - started:.1f} s to {args.out}", file=sys.stderr)
        return 0
    if args.model is None:
        raise ConfigError(f"--model: a {args.kind} index embeds the passages with a model; give its directory")
    if args.kind == "hybrid" and args.vectors is not None:
        raise ConfigError("--vectors: for --kind dense only")
    if args.vectors is not None and args.dtype != "float32":
        raise ConfigError(f"--dtype {args.dtype}: with --vectors the corpus run's vectors are indexed and only a "
                          f"check of a few passages is embedded, in float32 (on --device)")
    check_output(args.out, files=("dense", "bm25") if args.kind == "hybrid" else ("vectors.faiss",))  # before work
    set_threads(args.threads)
    structure = Structure(args.approximate or "flat", hnsw_m=args.hnsw_m, ef_construction=args.ef_construction,
                          ef_search=args.ef_search, nlist=args.nlist, nprobe=args.nprobe)
    passages = read_passages(args.input) if args.input else squad_passages(args.squad)
    options = model_options(args.model)
    changes = {}
    if args.sentence is not None:
        changes["sentence"] = args.sentence
    if args.layers is not None:
        layers = layers_argument(args.layers)
        changes["layers"] = list(layers) if isinstance(layers, (list, tuple)) else layers
    if args.max_length is not None:
        changes["max_length"] = args.max_length
    if args.long_texts is not None:
        changes["long_texts"] = args.long_texts
    if changes:
        options = dataclasses.replace(options, **changes, source=f"{options.source}, changed: {', '.join(changes)}")
    started = time.perf_counter()
    pretrained = load(args.model)
    if args.vectors is not None:
        if changes:
            raise ConfigError(f"--vectors: the corpus run's embedding options are used; drop --{', --'.join(changes)}"
                              .replace("_", "-"))
        vectors, options = corpus_vectors(args.vectors, passages)
        where.move(pretrained)  # the check's passages are embedded where the model is
        index = Index.from_vectors(pretrained, passages, vectors, options=options, structure=structure,
                                   model_dir=args.model)
    else:
        index = Index.build(pretrained, passages, options=options, structure=structure, batch_size=args.batch_size,
                            show_progress=not args.quiet and sys.stderr.isatty(), model_dir=args.model,
                            device=where.device, dtype=where.dtype)
    if args.kind == "hybrid":
        index = HybridIndex(index, SparseIndex.build(passages, options=bm25), fusion)
        index.save(args.out)
        print_result({"out": args.out, "kind": "hybrid", "passages": len(index), "dim": index.dense.dim,
                      "structure": structure.kind, "fusion": fusion.method})
        print(f"indexed {len(index)} passages (hybrid: {index.dense.dim} dimensions, {structure.kind}; bm25) in "
              f"{time.perf_counter() - started:.1f} s to {args.out}", file=sys.stderr)
        return 0
    index.save(args.out)
    print_result({"out": args.out, "kind": "dense", "passages": len(index), "dim": index.dim,
                  "structure": structure.kind})
    print(f"indexed {len(index)} passages ({index.dim} dimensions, {structure.kind}) in "
          f"{time.perf_counter() - started:.1f} s to {args.out}", file=sys.stderr)
    return 0
