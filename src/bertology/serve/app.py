"""The HTTP service: a FastAPI app over one loaded model (see `bertology.serve.create_app`).

Endpoints: `POST /v1/embed`, `POST /v1/fill-mask` (a masked-LM's tokens, XLNet's through its permutation mask, an
encoder-decoder's generated spans), `GET /health`, `GET /metrics` (Prometheus text format), and
FastAPI's OpenAPI schema at `/openapi.json` (interactive at `/docs`); beside them OpenAI's embeddings API
(`bertology.serve.openai_api`) and text-embeddings-inference's (`bertology.serve.tei_api`). Every response of the
service's own endpoints that is not a success is a JSON object `{"detail": message}` (plus `"field"` when one field
of the request is at fault); the compatible APIs answer in their own error shapes (`bertology.serve.compat`).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, Literal, Union

import numpy as np
from fastapi import Depends, FastAPI, HTTPException, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr

from bertology.embeddings import Embeddings, Pieces, parse_layers, select_layers
from bertology.errors import BertologyError
from bertology.model import ENCODER_DECODER, Pretrained, capabilities
from bertology.model.heads import head_reads
from bertology.model.protocol import PERMUTATION_LM
from bertology.objectives.fill_mask import fill_mask, span_search_beams, span_widths
from bertology.serve import openai_api, tasks_api, tei_api
from bertology.serve.compat import ERRORS, ErrorResponse  # noqa: F401  (re-exported)
from bertology.serve.batcher import Batcher, EmbedOptions
from bertology.serve.decoding import MAX_ROWS, Decoder
from bertology.serve.compat import INLINE_CHARS, OPENAI_PATHS, TEI_PATHS, Served, error_shape, openai_error
from bertology.serve.docs_page import add_docs
from bertology.serve.limits import BodyLimit, Limits, ServiceError
from bertology.serve.metrics import ServiceMetrics

ENDPOINTS = ("/v1/embed", "/v1/fill-mask", "/v1/search", "/health", "/metrics", "/openapi.json", "/docs",
             *OPENAI_PATHS, *TEI_PATHS, *tasks_api.TASK_PATHS)


# ----------------------------------------------------------------------------------------- request and response


class EmbedRequest(BaseModel):
    """Texts to embed and how; the options are `bertology.embed`'s (and `bertology embed`'s)."""

    model_config = ConfigDict(extra="forbid")

    texts: list[StrictStr] = Field(description="the texts, one vector (sentence level) or one list of vectors "
                                   "(word and token level) per text, in order")
    level: Literal["sentence", "word", "token"] = "sentence"
    layers: Union[StrictStr, StrictInt, list[StrictInt]] = Field(
        "last", description="last, sum-last-four, mean, concat, mix (the model's scalar mix), a hidden-state index "
        "(0 = embedding output, -1 = "
        "last layer), a list of indices, or comma-separated indices as in `bertology embed --layers`")
    combine: Literal["sum", "mean", "concat"] | None = Field(
        None, description="how a list of layer indices is combined (default: mean)")
    pooling: Literal["first", "mean", "last"] = Field("mean", description="subword pooling for word vectors")
    sentence: Literal["mean", "cls"] = Field(
        "mean", description="sentence vector: mean of all tokens, specials included, or the first token")
    normalize: StrictBool = Field(False, description="scale every vector to unit L2 norm")


class EmbedResponse(BaseModel):
    """Sentence level: `vectors[i]` is text i's vector. Word and token level: `vectors[i]`, `strings[i]` and
    `spans[i]` list text i's words or tokens (spans are [start, end) offsets in Unicode code points of the text
    as sent), and token level adds the vocabulary `ids`."""

    model: str
    level: str
    dim: int
    layers: list[int]
    tokens: int = Field(description="real tokens the texts cost, specials included, summed over windows")
    vectors: list[list[float]] | list[list[list[float]]]
    strings: list[list[str]] | None = None
    spans: list[list[tuple[int, int]]] | None = None
    ids: list[list[int]] | None = None


class FillMaskRequest(BaseModel):
    """Texts with the model's mask token ([MASK] for BERT, <mask> for RoBERTa) where a word is to be predicted; for
    an encoder-decoder, T5's sentinels (<extra_id_0>, ...) or BART's <mask> where a span is to be generated."""

    model_config = ConfigDict(extra="forbid")

    texts: list[StrictStr]
    top_k: StrictInt = Field(5, ge=1, le=100, description="predictions per mask")
    max_new_tokens: StrictInt = Field(20, ge=1, le=512, description="an encoder-decoder's longest generation")


class FillMaskCandidate(BaseModel):
    token: str
    token_id: int
    probability: float
    sequence: str


class FillMaskResponse(BaseModel):
    """`results[i][m]` holds the candidates for mask m of text i, most probable first."""

    model: str
    results: list[list[list[FillMaskCandidate]]]


class SearchRequest(BaseModel):
    """Queries against the service's index (started with `--index`), embedded as the index's passages were."""

    model_config = ConfigDict(extra="forbid")

    queries: list[StrictStr]
    k: StrictInt = Field(10, ge=1, le=1000, description="passages per query")


class SearchHit(BaseModel):
    id: str
    score: float = Field(description="inner product of normalised vectors (cosine similarity)")
    text: str


class SearchResponse(BaseModel):
    """`results[i]` holds query i's best passages, best first."""

    model: str
    index: str
    results: list[list[SearchHit]]


# ----------------------------------------------------------------------------------------- app


class _StrictJSONRequest(Request):
    """A request whose JSON body must be UTF-8 (RFC 8259), not any encoding `json.loads` would guess."""

    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            body = await self.body()
            try:
                text = body.decode("utf-8")
            except UnicodeDecodeError as error:
                raise ServiceError(400, f"the request body is not UTF-8: byte 0x{body[error.start]:02x} at byte "
                                        f"offset {error.start} ({error.reason})") from None
            try:
                self._json = json.loads(text)  # a JSONDecodeError becomes FastAPI's json_invalid, answered below
            except RecursionError:
                raise ServiceError(400, "malformed JSON: arrays or objects nested too deeply") from None
        return self._json


class _StrictJSONRoute(APIRoute):
    def get_route_handler(self) -> Callable:
        handler = super().get_route_handler()

        async def strict(request: Request) -> Response:
            return await handler(_StrictJSONRequest(request.scope, request.receive))

        return strict


def build_app(pretrained: Pretrained, *, model_name: str, limits: Limits, max_batch_tokens: int,
              max_wait_ms: float, api_key: str | None, index: Any = None, index_name: str | None = None,
              dtype: str = "float32", device: Any = None, max_decode_rows: int = MAX_ROWS) -> FastAPI:
    """The app (see `bertology.serve.create_app`, which loads the model and checks the arguments). `dtype` is the
    served one (int8: the model is quantized already), `device` where the model runs (None: where it is)."""
    metrics = ServiceMetrics()
    forward_dtype = "float32" if dtype == "int8" else dtype
    batcher = Batcher(pretrained, max_batch_tokens=max_batch_tokens, max_wait_ms=max_wait_ms, observe=metrics,
                      device=device, dtype=forward_dtype)
    where = str(batcher.placement.device)
    num_layers = pretrained.model.config.num_layers
    hidden_size = pretrained.model.config.hidden_size
    has_mlm = can_fill(pretrained.model)
    decoder = Decoder(batcher, pretrained, observe=metrics, max_rows=max_decode_rows)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await batcher.start()
        await decoder.start()
        try:
            yield
        finally:
            # uvicorn calls this after every in-flight request has been answered: the decoder finishes what it
            # still holds (nothing, unless a request was left behind), then the batcher's worker stops.
            await decoder.stop()
            await batcher.stop()

    app = FastAPI(title="bertology", version=_version(), lifespan=lifespan, docs_url=None, redoc_url=None,
                  description=f"Contextual embeddings and fill-mask from {model_name}.")
    add_docs(app, f"bertology: {model_name}")  # Swagger UI from local files: renders offline
    app.router.route_class = _StrictJSONRoute
    app.state.batcher = batcher
    app.state.decoder = decoder
    app.state.metrics = metrics
    app.state.limits = limits
    app.add_middleware(BodyLimit, max_bytes=limits.max_body_bytes, shape=_shaped)
    app.add_middleware(_Metered, metrics=metrics)  # added last, so outermost: it counts the 413s BodyLimit answers

    bearer = HTTPBearer(auto_error=False, description="the service's API key, when it was started with one")
    expected = api_key.encode("utf-8") if api_key is not None else None

    async def authorized(credentials: HTTPAuthorizationCredentials | None = Depends(bearer)) -> None:
        if expected is None:
            return
        given = credentials.credentials.encode("utf-8") if credentials is not None else b""
        # compare_digest takes time independent of where the strings differ (no timing oracle on the key).
        if credentials is None or not hmac.compare_digest(given, expected):
            what = "no Authorization: Bearer header" if credentials is None else "wrong API key"
            raise ServiceError(401, f"{what}; send 'Authorization: Bearer <key>'",
                               headers={"WWW-Authenticate": "Bearer"})

    guarded = [Depends(authorized)]

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, error: HTTPException) -> JSONResponse:
        field = getattr(error, "field", None)
        shape = error_shape(request.url.path)
        if shape is not None:
            status = _status(shape, error.status_code)
            return JSONResponse(shape(status, str(error.detail), field, getattr(error, "kind", None)),
                                status_code=status, headers=error.headers)
        body = {"detail": str(error.detail)}
        if field is not None:
            body["field"] = field
        return JSONResponse(body, status_code=error.status_code, headers=error.headers)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, error: RequestValidationError) -> JSONResponse:
        response = _validation_response(error)
        shape = error_shape(request.url.path)
        if shape is None:
            return response
        body = json.loads(response.body)
        status = _status(shape, response.status_code)
        return JSONResponse(shape(status, body["detail"], body.get("field")), status_code=status)

    @app.get("/health", summary="liveness and the model served")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "model": model_name, "dtype": dtype, "device": where,
                "dim": pretrained.model.config.hidden_size,
                "layers": num_layers, "window": batcher.window_length, "fill_mask": has_mlm,
                "index": None if index is None else {"name": index_name, "passages": len(index)},
                "generation": decoder.status()}

    @app.get("/metrics", summary="Prometheus metrics (text format)", dependencies=guarded,
             response_class=Response, responses={200: {"content": {"text/plain": {}}}})
    async def prometheus() -> Response:
        body, content_type = metrics.exposition()
        return Response(body, media_type=content_type)

    @app.post("/v1/embed", summary="contextual sentence, word or token vectors", dependencies=guarded,
              response_model=EmbedResponse, responses=ERRORS)
    async def embed_texts(request: EmbedRequest) -> Response:
        texts = limits.check_texts(request.texts)
        options, width = _options(request, num_layers, hidden_size)
        # Small requests are tokenised and encoded right here: a hop to a thread costs more than the work.
        small = sum(map(len, texts)) <= INLINE_CHARS
        cost = batcher.cost(texts) if small else await asyncio.to_thread(batcher.cost, texts)
        # The work and the response are bounded before anything is queued.
        limits.check("max_tokens", cost.tokens, "the tokens the texts cost the encoder", field="texts")
        vectors = len(texts) if request.level == "sentence" else cost.content
        limits.check("max_values", vectors * width, f"the numbers in the response ({vectors} "
                     f"{'' if request.level == 'sentence' else 'content-token '}vectors of {width})", field="level"
                     if request.level != "sentence" else "texts")
        result = await batcher.embed(texts, options, cost)
        arguments = (result, model_name, request.level, request.normalize, cost.tokens)
        small = small and request.level == "sentence" and len(texts) <= 8
        body = _embed_body(*arguments) if small else await asyncio.to_thread(_embed_body, *arguments)
        return Response(body, media_type="application/json")

    @app.post("/v1/fill-mask", summary="the most probable tokens at each mask token (an encoder-decoder: the "
              "generated spans)", dependencies=guarded, response_model=FillMaskResponse,
              responses={**ERRORS, 501: {"model": ErrorResponse, "description": "no masked-LM head"}})
    async def fill_masks(request: FillMaskRequest) -> Response:
        if not has_mlm:
            raise ServiceError(501, f"{model_name} has no masked-LM head (nor an encoder-decoder's language-model "
                               "head), so fill-mask is not available")
        texts = limits.check_texts(request.texts)
        small = sum(map(len, texts)) <= INLINE_CHARS
        masks, tokens = _mask_counts(pretrained, texts) if small else await asyncio.to_thread(
            _mask_counts, pretrained, texts)
        limits.check("max_tokens", tokens, "the tokens of the texts", field="texts")
        limits.check("max_outputs", sum(masks) * request.top_k, f"the candidates asked for ({sum(masks)} masks x "
                     f"top_k {request.top_k})", field="top_k")
        if ENCODER_DECODER in capabilities(pretrained.model):  # generated spans: bounded by the steps they cost
            beams, widths = span_search_beams(request.top_k), " + ".join(map(str, span_widths(request.top_k)))
            limits.check("max_generated", len(texts) * beams * request.max_new_tokens,
                         f"the generation asked for ({len(texts)} texts x {beams} beams (top_k {request.top_k}: "
                         f"{widths}, the searches for distinct fillings) x max_new_tokens "
                         f"{request.max_new_tokens})", field="max_new_tokens")
        # One text at a time on the encoder's thread: embedding batches run between them, so a small request
        # never waits for all of a large one.
        results = [await batcher.run(_fill_mask, pretrained, i, text, request.top_k, request.max_new_tokens)
                   for i, text in enumerate(texts)]
        return JSONResponse({"model": model_name, "results": results})

    served = Served(pretrained, batcher, limits, model_name, dtype, int(time.time()), decoder)
    app.include_router(openai_api.router(served, _StrictJSONRoute), dependencies=guarded)
    app.include_router(tei_api.router(served, _StrictJSONRoute), dependencies=guarded)
    app.include_router(tasks_api.router(served, _StrictJSONRoute), dependencies=guarded)

    if index is not None:
        @app.post("/v1/search", summary="the index's passages nearest to each query", dependencies=guarded,
                  response_model=SearchResponse, responses=ERRORS)
        async def search(request: SearchRequest) -> Response:
            queries = limits.check_texts(request.queries, field="queries")
            limits.check("max_outputs", len(queries) * request.k, f"the passages asked for ({len(queries)} queries "
                         f"x k {request.k})", field="k")
            small = sum(map(len, queries)) <= INLINE_CHARS
            _, tokens = _mask_counts(pretrained, queries) if small else await asyncio.to_thread(
                _mask_counts, pretrained, queries)
            limits.check("max_tokens", tokens, "the tokens of the queries", field="queries")
            hits = await batcher.run(index.search, queries, request.k)
            return JSONResponse({"model": model_name, "index": index_name, "results": [
                [{"id": hit.id, "score": hit.score, "text": hit.text} for hit in row] for row in hits]})

    return app


def _shaped(path: str, status: int, message: str) -> dict[str, Any] | None:
    """The error body of the API `path` belongs to (None: the service's own), for BodyLimit's answers."""
    shape = error_shape(path)
    return None if shape is None else shape(_status(shape, status), message, None)


def _status(shape: Callable, status: int) -> int:
    """OpenAI answers every invalid request 400 (the service's own endpoints and TEI's: 422 for a field)."""
    return 400 if shape is openai_error and status == 422 else status


def can_fill(model: Any) -> bool:
    """A masked-LM head, XLNet's language-model head (through the permutation mask), or an encoder-decoder whose
    first head is a language model (it generates the spans)."""
    can = capabilities(model)
    if "mlm" in model.heads or (PERMUTATION_LM in can and "lm" in model.heads):
        return True
    return ENCODER_DECODER in can and bool(model.head_specs) \
        and head_reads(model.head_specs[0].kind) == "masked_positions"


def _mask_counts(pretrained: Pretrained, texts: list[str]) -> tuple[list[int], int]:
    """The groups of candidates fill-mask gives for each text (one per mask token; an encoder-decoder one per T5
    sentinel, or one for BART's whole text) and the tokens of all the texts (specials included), as fill-mask and
    search read them."""
    tokenizer = pretrained.tokenizer
    framing = tokenizer.framing
    seq2seq = ENCODER_DECODER in capabilities(pretrained.model)
    marks = set(framing.sentinels) if seq2seq and framing.layout.sentinels is not None else {tokenizer.mask_id}
    masks, tokens = [], 0
    for text in texts:
        ids = tokenizer.encode(text).ids
        found = sum(1 for i in ids if i in marks)
        masks.append(min(found, 1) if seq2seq and framing.layout.sentinels is None else found)
        tokens += len(ids)
    return masks, tokens


def _fill_mask(pretrained: Pretrained, i: int, text: str, top_k: int,
               max_new_tokens: int = 20) -> list[list[dict[str, Any]]]:
    try:
        predictions = fill_mask(pretrained.model, pretrained.tokenizer, text, top_k=top_k,
                                max_new_tokens=max_new_tokens)
    except BertologyError as error:
        raise ServiceError(422, f"texts[{i}]: {error}", field=f"texts[{i}]") from None
    return [[{"token": p.token, "token_id": p.token_id, "probability": p.probability, "sequence": p.sequence}
             for p in mask] for mask in predictions]


def _options(request: EmbedRequest, num_layers: int, hidden_size: int) -> tuple[EmbedOptions, int]:
    """The request's embed options, checked here so that a bad value is answered before any work is queued."""
    layers: Any = request.layers
    try:
        if isinstance(layers, str):
            layers = parse_layers(layers)
        selection = select_layers(layers, request.combine, num_layers)
    except BertologyError as error:
        field = "combine" if "combine" in str(error).split(":")[0] else "layers"
        raise ServiceError(422, str(error), field=field) from None
    width = selection.width(hidden_size)
    return EmbedOptions(level=request.level, layers=layers if isinstance(layers, str) else tuple(layers)
                        if isinstance(layers, list) else (layers,), combine=request.combine,
                        pooling=request.pooling, sentence=request.sentence), width


def _embed_body(result: Embeddings, model_name: str, level: str, normalize: bool, tokens: int) -> bytes:
    body: dict[str, Any] = {"model": model_name, "level": level, "dim": result.dim, "layers": list(result.layers),
                            "tokens": tokens}
    if level == "sentence":
        body["vectors"] = _rows(result.sentences, normalize)
    else:
        pieces: Pieces = result.words if level == "word" else result.tokens
        vectors = _rows(pieces.vectors, normalize)
        spans = np.stack([pieces.start, pieces.end], axis=1).tolist()
        per_text = [pieces.rows(i) for i in range(len(result))]
        body["vectors"] = [vectors[rows] for rows in per_text]
        body["strings"] = [pieces.strings[rows] for rows in per_text]
        body["spans"] = [spans[rows] for rows in per_text]
        if level == "token":
            ids = pieces.ids.tolist()
            body["ids"] = [ids[rows] for rows in per_text]
    return json.dumps(body, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode("utf-8")


def _rows(vectors: np.ndarray, normalize: bool) -> list[list[float]]:
    if normalize:
        norms = np.linalg.norm(vectors.astype(np.float64), axis=1, keepdims=True)
        vectors = (vectors / np.maximum(norms, 1e-12)).astype(np.float32)  # a zero vector stays zero
    return vectors.tolist()


def _validation_response(error: RequestValidationError) -> JSONResponse:
    problems = error.errors()
    for problem in problems:
        if problem.get("type") == "json_invalid":
            position = problem["loc"][-1] if problem.get("loc") else 0
            document = error.body if isinstance(error.body, str) else ""
            line = document.count("\n", 0, position) + 1
            column = position - (document.rfind("\n", 0, position) + 1) + 1
            message = problem.get("ctx", {}).get("error", "invalid JSON")
            return JSONResponse({"detail": f"malformed JSON: {message} at line {line}, column {column} "
                                           f"(character {position})"}, status_code=400)
    fields = [_field(problem.get("loc", ())) for problem in problems]
    # A union (layers: str | int | list[int]) fails once per member: keep the deepest, e.g. layers[1] over layers.
    deepest = [i for i, f in enumerate(fields)
               if not any(g != f and (g.startswith(f + "[") or g.startswith(f + ".")) for g in fields)]
    problems, fields = [problems[i] for i in deepest], [fields[i] for i in deepest]
    messages = [f"{field or 'request body'}: {_message(problem)}" for field, problem in zip(fields, problems)]
    return JSONResponse({"detail": "; ".join(messages), "field": fields[0] if fields and fields[0] else None,
                         "errors": [{"field": f, "message": _message(p)} for f, p in zip(fields, problems)]},
                        status_code=422)


def _field(loc: tuple) -> str:
    """('body', 'texts', 3) -> 'texts[3]'. Union members that pydantic adds to the path are dropped."""
    out = ""
    for part in loc[1:] if loc and loc[0] == "body" else loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part in ("str", "int", "list[int]") or "[" in str(part) or part.startswith("function-"):
            continue
        else:
            out += f".{part}" if out else str(part)
    return out


def _message(problem: dict) -> str:
    if problem.get("type") == "missing" and len(problem.get("loc", ())) <= 1:
        return "missing: expected a JSON object"
    if problem.get("type") == "extra_forbidden":
        return "unknown field"
    return str(problem.get("msg", "invalid"))


class _Metered:
    """Counts every HTTP request by endpoint and status and times it (an ASGI middleware)."""

    def __init__(self, app: Any, metrics: ServiceMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500
        self.metrics.in_flight.inc()

        async def sending(message: dict) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            self.metrics.in_flight.dec()
            path = scope.get("path", "")
            endpoint = path if path in ENDPOINTS else "other"  # unknown paths share a label: bounded cardinality
            self.metrics.request(endpoint, scope.get("method", ""), status, time.perf_counter() - started)


def _version() -> str:
    from bertology import __version__

    return __version__


def model_name_of(directory: str | Path) -> str:
    """The name the service reports: an installed model's or its model card's, else the directory's."""
    from bertology.model.local import display_name

    return display_name(directory)
