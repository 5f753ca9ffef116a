"""An HTTP service for contextual embeddings and fill-mask, with dynamic batching (`bertology serve`).

FastAPI on uvicorn: an ASGI stack whose request models give typed validation errors naming the field and an
OpenAPI schema for free, and whose server drains in-flight requests on SIGTERM. Both are imported only here
(`pip install "bertology[serve]"`).

    from bertology.serve import create_app
    app = create_app("path/to/model")            # then any ASGI server, or:
    from bertology.serve import serve
    serve("path/to/model", host="127.0.0.1", port=8080)
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bertology.errors import BertologyError, CheckpointError, ConfigError

if TYPE_CHECKING:
    from fastapi import FastAPI

    from bertology.model import Pretrained

LOOPBACK = ("127.0.0.1", "::1", "localhost")


def _require(module: str) -> None:
    import importlib

    try:
        importlib.import_module(module)
    except ImportError:
        raise BertologyError(f"the service needs {module}: pip install \"bertology[serve]\" "
                             "(fastapi, uvicorn, prometheus-client)") from None


def load_for_serving(model: str | os.PathLike) -> Pretrained:
    """Load a model directory with its tokenizer, or fail with an error naming the directory and what is wrong."""
    from bertology.model import load

    directory = Path(model)
    if not directory.exists():
        raise CheckpointError(f"--model {directory}: no such directory")
    if not directory.is_dir():
        raise CheckpointError(f"--model {directory}: a file, not a model directory")
    try:
        pretrained = load(directory)
    except BertologyError as error:
        raise CheckpointError(f"--model {directory} is not a model directory: {error}") from None
    if pretrained.tokenizer is None:
        raise CheckpointError(f"--model {directory}: no tokenizer files next to the model; the service needs one")
    return pretrained


def create_app(model: str | os.PathLike | Pretrained, *, model_name: str | None = None, device: Any = None,
               max_batch_tokens: int = 8192, max_wait_ms: float = 5.0, api_key: str | None = None,
               api_key_file: str | os.PathLike | None = None, max_body_bytes: int = 4 * 1024 * 1024,
               max_texts: int = 256, max_chars: int = 20_000, max_tokens: int = 16_384,
               max_values: int = 1_048_576, max_outputs: int = 2048, max_generated: int = 4096,
               dtype: str = "float32",
               index: str | os.PathLike | None = None) -> FastAPI:
    """The service's ASGI app for a model directory (or a loaded `Pretrained`).

    Requests to `POST /v1/embed` that arrive within `max_wait_ms` of the oldest waiting one are embedded together,
    up to `max_batch_tokens` real tokens per forward. With `api_key` (or `api_key_file`), every endpoint but
    `/health`, `/docs` and `/openapi.json` needs `Authorization: Bearer <key>`. Every request is bounded
    (`bertology.serve.limits.Limits`: body, texts, characters, tokens of work, numbers returned, candidates, an
    encoder-decoder's generation steps);
    over a bound it is answered 413 naming the option. `dtype="int8"` quantizes the
    encoder's linear layers (`bertology.model.quantize`). With `index` (a directory of `bertology index build`),
    `POST /v1/search` answers queries against it; an index built with another model is refused here (the check
    runs on the float32 model, so an int8 service embeds its queries in int8 against float32 passages).
    `device` ("auto", "cpu", "cuda", "cuda:N"; None: where a loaded model is, the CPU for a directory) is where the
    model runs; `dtype` "float16" and "bfloat16" run its forwards under autocast on a GPU, "int8" on the CPU only
    (`bertology.device`).
    """
    _require("fastapi")
    _require("prometheus_client")
    from bertology.model import Pretrained
    from bertology.serve.app import build_app, model_name_of
    from bertology.serve.limits import Limits, read_api_key

    from bertology.device import model_device, placement
    from bertology.model.quantize import check_dtype, quantize

    if dtype not in ("float16", "bfloat16"):
        dtype = check_dtype(dtype)  # "fp32" is float32 here, as before
    where = placement(device, dtype, int8=True,  # checked before a model directory is loaded
                      current=model_device(model) if isinstance(model, Pretrained) else None)
    if api_key is not None and api_key_file is not None:
        raise ConfigError("give api_key or api_key_file, not both")
    if api_key_file is not None:
        api_key = read_api_key(api_key_file)
    if api_key is not None and not api_key:
        raise ConfigError("api_key is empty")
    limits = Limits(max_body_bytes=max_body_bytes, max_texts=max_texts, max_chars=max_chars, max_tokens=max_tokens,
                    max_values=max_values, max_outputs=max_outputs, max_generated=max_generated)
    if isinstance(model, Pretrained):
        pretrained, name = model, model_name or "model"
        if pretrained.tokenizer is None:
            raise CheckpointError("the model has no tokenizer; the service needs one")
    else:
        pretrained, name = load_for_serving(model), model_name or model_name_of(model)
    pretrained.model.eval()
    loaded_index, index_name = None, None
    if index is not None:
        from bertology.retrieval import Index

        loaded_index = Index.load(index, model=pretrained)  # IndexMismatchError unless this model built it
        index_name = Path(index).resolve().name
    if dtype == "int8":
        pretrained = quantize(pretrained, inplace=True)  # in place: the index embeds its queries with it too
    if loaded_index is not None:
        loaded_index.dtype = where.float_dtype  # it embeds queries with the served model, as the service does
    return build_app(pretrained, model_name=name, limits=limits, max_batch_tokens=max_batch_tokens,
                     max_wait_ms=max_wait_ms, api_key=api_key, index=loaded_index, index_name=index_name,
                     dtype=dtype, device=where.device)


def serve(model: str | os.PathLike | Pretrained, *, host: str = "127.0.0.1", port: int = 8080,
          log_level: str = "info", **options: Any) -> None:
    """Run the service with uvicorn until SIGINT or SIGTERM; on either it stops accepting connections, answers
    every request already received, then returns. `options` are `create_app`'s."""
    _require("uvicorn")
    import logging
    import sys

    import uvicorn

    app = create_app(model, **options)
    if host not in LOOPBACK and options.get("api_key") is None and options.get("api_key_file") is None:
        logging.getLogger("bertology.serve").warning("listening on %s without an API key: anyone who can reach "
                                                     "this address can use the service", host)
        print(f"warning: listening on {host} without --api-key-file", file=sys.stderr)
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, access_log=False,
                            timeout_graceful_shutdown=None, lifespan="on")
    uvicorn.Server(config).run()
