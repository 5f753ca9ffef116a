"""`bertology serve`: contextual embeddings and fill-mask over HTTP, with dynamic batching."""

from __future__ import annotations

import argparse

from bertology.device import add_device_arguments, placement_from_args


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "serve",
        help="serve embeddings and fill-mask over HTTP (FastAPI on uvicorn)",
        description="POST /v1/embed, POST /v1/fill-mask, GET /health, GET /metrics (Prometheus), the OpenAPI "
        "schema at /openapi.json. Embedding requests arriving within --max-wait-ms are packed into one "
        "padding-free forward of up to --max-batch-tokens real tokens. Binds to loopback unless --host says "
        "otherwise; with --index, POST /v1/search answers queries against a dense index; SIGTERM stops accepting, answers every request in flight, then exits. See docs/SERVING.md.",
    )
    parser.add_argument("--model", required=True, metavar="DIR", help="model directory with its tokenizer")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1, loopback only)")
    parser.add_argument("--port", type=int, default=8080, help="port (default: 8080)")
    parser.add_argument("--max-batch-tokens", type=int, default=8192, metavar="N",
                        help="real tokens per forward, specials included (default: 8192)")
    parser.add_argument("--max-wait-ms", type=float, default=5.0, metavar="M",
                        help="how long the oldest waiting request may wait for others to join its batch "
                        "(default: 5)")
    parser.add_argument("--api-key-file", metavar="FILE", default=None,
                        help="file holding the API key; requests then need 'Authorization: Bearer <key>'")
    parser.add_argument("--max-body-bytes", type=int, default=4 * 1024 * 1024, metavar="N",
                        help="largest request body (default: 4 MiB)")
    parser.add_argument("--max-texts", type=int, default=256, metavar="N",
                        help="texts per request (default: 256)")
    parser.add_argument("--max-chars", type=int, default=20_000, metavar="N",
                        help="characters per text (default: 20000; longer texts than the model's positions are "
                        "embedded in windows)")
    parser.add_argument("--max-tokens", type=int, default=16_384, metavar="N",
                        help="tokens one request may cost the encoder, specials and window overlaps included "
                        "(default: 16384)")
    parser.add_argument("--max-values", type=int, default=1_048_576, metavar="N",
                        help="numbers one /v1/embed response may hold: vectors x their width; at word and token "
                        "level the texts' tokens count (default: 1048576)")
    parser.add_argument("--max-outputs", type=int, default=2048, metavar="N",
                        help="fill-mask candidates (masks x top_k) or search hits (queries x k) per request "
                        "(default: 2048)")
    parser.add_argument("--max-generated", type=int, default=4096, metavar="N",
                        help="an encoder-decoder's fill-mask work per request: texts x beams (7 x max(top_k, 4), its "
                        "searches for distinct fillings) x max_new_tokens decoder steps (default: 4096)")
    add_device_arguments(parser, int8=True, int8_help="the encoder's linear layers in int8 "
                         "(bertology.model.quantize): faster on CPU, vectors close to but not equal to float32's")
    parser.add_argument("--index", metavar="DIR", default=None,
                        help="an index directory from `bertology index build` with this model: adds POST /v1/search")
    parser.add_argument("--threads", type=int, default=None, metavar="N",
                        help="torch intra-op threads for the encoder (default: torch's)")
    parser.add_argument("--log-level", default="info", choices=("critical", "error", "warning", "info", "debug"))
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import torch

    from bertology.errors import ConfigError
    from bertology.serve import serve

    import math

    where = placement_from_args(args, int8=True)
    if not math.isfinite(args.max_wait_ms):
        raise ConfigError(f"--max-wait-ms must be a finite number, got {args.max_wait_ms}")
    if not 0 <= args.port <= 65535:
        raise ConfigError(f"--port must be between 0 and 65535, got {args.port}")
    if args.threads is not None:
        if args.threads < 1:
            raise ConfigError(f"--threads must be at least 1, got {args.threads}")
        torch.set_num_threads(args.threads)
    serve(args.model, host=args.host, port=args.port, log_level=args.log_level,
          max_batch_tokens=args.max_batch_tokens, max_wait_ms=args.max_wait_ms, api_key_file=args.api_key_file,
          max_body_bytes=args.max_body_bytes, max_texts=args.max_texts, max_chars=args.max_chars,
          max_tokens=args.max_tokens, max_values=args.max_values, max_outputs=args.max_outputs,
          max_generated=args.max_generated, dtype=where.dtype,
          index=args.index, device=where.device)
    return 0
