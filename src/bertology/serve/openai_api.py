"""OpenAI-compatible endpoints: `POST /v1/embeddings`, `POST /v1/completions` (a decoder's or an encoder-decoder's
generation through the service's running batch, `bertology.serve.decoding`; streamed as server-sent events) and
`GET /v1/models` (`GET /v1/models/{model}`), so that the `openai` client and what is built on it embed and generate
with the served model. Errors are OpenAI's error objects (`bertology.serve.compat.openai_error`).
"""

from __future__ import annotations

import asyncio
import base64
import json
import math
import time
import uuid
from typing import Annotated, Any, Literal, Union

import numpy as np
from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr, WithJsonSchema

from bertology.errors import BertologyError
from bertology.generation import Group
from bertology.serve import decoding
from bertology.serve.compat import Served, unit_rows
from bertology.serve.limits import ServiceError

INPUT_SCHEMA = {"anyOf": [
    {"type": "string"}, {"type": "array", "items": {"type": "string"}},
    {"type": "array", "items": {"type": "integer"}},
    {"type": "array", "items": {"type": "array", "items": {"type": "integer"}}}]}


class EmbeddingsRequest(BaseModel):
    """OpenAI's embeddings request. `input`: a text, a list of texts, one list of token ids, or a list of them
    (ids of this model's tokenizer, without special tokens)."""

    model_config = ConfigDict(extra="forbid")

    input: Annotated[Any, WithJsonSchema(INPUT_SCHEMA)] = Field(
        description="a text, a list of texts, a list of token ids, or a list of lists of token ids")
    model: StrictStr = Field(description="the served model's name (GET /v1/models); any other is 404")
    encoding_format: Literal["float", "base64"] = Field(
        "float", description="float: lists of numbers; base64: each vector's little-endian float32 bytes")
    dimensions: StrictInt | None = Field(None, description="keep the first `dimensions` numbers of each vector, "
                                         "then scale it to unit norm again (at most the model's width)")
    user: StrictStr | None = Field(None, description="accepted and ignored")


Number = Union[StrictFloat, StrictInt]


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    include_usage: StrictBool = Field(False, description="a last chunk with the usage counts (and no choices)")


class CompletionRequest(BaseModel):
    """OpenAI's (legacy) completions request. `prompt`: a text, a list of texts, one list of token ids, or a list of
    them; each prompt gets `n` choices (choice index = prompt index x n + k)."""

    model_config = ConfigDict(extra="forbid")

    model: StrictStr = Field(description="the served model's name (GET /v1/models); any other is 404")
    prompt: Annotated[Any, WithJsonSchema(INPUT_SCHEMA)] = Field(
        description="a text, a list of texts, a list of token ids, or a list of lists of token ids")
    max_tokens: StrictInt | None = Field(16, description="new tokens per choice at most (null: 16)")
    temperature: Number | None = Field(1.0, description="0: the most probable token at every step (greedy); "
                                       "above 0, up to 2: sampling at this temperature")
    top_p: Number | None = Field(1.0, description="sampling from the most probable tokens whose probability "
                                 "reaches top_p, in (0, 1]")
    n: StrictInt | None = Field(1, description=f"choices per prompt, 1 to {decoding.MAX_CHOICES}")
    stop: StrictStr | list[StrictStr] | None = Field(
        None, description=f"up to {decoding.MAX_STOP} strings; a choice ends before the first one it makes")
    seed: StrictInt | None = Field(None, description="the seed of the draws: the same seed gives "
                                   "bertology.generate's draws with that seed")
    logprobs: StrictInt | None = Field(None, description=f"the log-probability of each token chosen and of the "
                                       f"0 to {decoding.MAX_LOGPROBS} most probable tokens at its step")
    stream: StrictBool | None = Field(False, description="server-sent events, one chunk per piece of text, ending "
                                      "'data: [DONE]'")
    stream_options: StreamOptions | None = None
    echo: StrictBool | None = Field(False, description="not supported: only false")
    best_of: StrictInt | None = Field(None, description="not supported: only null or n")
    presence_penalty: Number | None = Field(0, description="not supported: only 0")
    frequency_penalty: Number | None = Field(0, description="not supported: only 0")
    logit_bias: dict[str, Any] | None = Field(None, description="not supported: only null or {}")
    suffix: StrictStr | None = Field(None, description="not supported: only null")
    user: StrictStr | None = Field(None, description="accepted and ignored")


class CompletionLogprobs(BaseModel):
    tokens: list[str]
    token_logprobs: list[float]
    top_logprobs: list[dict[str, float]] | None = None
    text_offset: list[int]


class CompletionChoice(BaseModel):
    text: str
    index: int
    logprobs: CompletionLogprobs | None = None
    finish_reason: Literal["stop", "length"] | None = None


class CompletionUsage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: CompletionUsage | None = None


class Embedding(BaseModel):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str


class Usage(BaseModel):
    prompt_tokens: int = Field(description="real tokens the inputs cost the encoder, specials included")
    total_tokens: int


class EmbeddingsResponse(BaseModel):
    object: Literal["list"] = "list"
    data: list[Embedding]
    model: str
    usage: Usage


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class OpenAIErrorBody(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class OpenAIError(BaseModel):
    error: OpenAIErrorBody


ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": OpenAIError, "description": text}
    for code, text in ((400, "malformed JSON, or a field of the wrong type or value (named in `param`)"),
                       (401, "missing or wrong API key (when the service has one)"),
                       (404, "a model that is not the one served"),
                       (413, "body, inputs, a text's length, tokens or numbers returned over the service's limits"))
}
COMPLETION_ERRORS: dict[int | str, dict[str, Any]] = {
    **ERRORS, 413: {"model": OpenAIError, "description": "body, prompts, a prompt's length, or the work asked for "
                    "(prompt tokens + max_tokens x n) over the service's limits"},
    501: {"model": OpenAIError, "description": "a model that cannot generate (the message says what it lacks)"},
    503: {"model": OpenAIError, "description": "the service is shutting down"}}


def router(served: Served, route_class: type) -> APIRouter:
    """The OpenAI-compatible routes over `served`."""
    api = APIRouter(route_class=route_class, tags=["OpenAI-compatible"])
    name = served.model_name

    def card() -> dict[str, Any]:
        return {"id": name, "object": "model", "created": served.created, "owned_by": "bertology"}

    @api.get("/v1/models", summary="the served model, as OpenAI lists models", response_model=ModelList,
             responses={401: ERRORS[401]})
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [card()]}

    @api.get("/v1/models/{model}", summary="the served model's card", response_model=ModelCard,
             responses={401: ERRORS[401], 404: ERRORS[404]})
    async def model_card(model: str) -> dict[str, Any]:
        check_model(model, name)
        return card()

    @api.post("/v1/embeddings", summary="OpenAI-compatible embeddings: unit-norm sentence vectors",
              response_model=EmbeddingsResponse, responses=ERRORS)
    async def embeddings(request: EmbeddingsRequest) -> Response:
        check_model(request.model, name)
        if request.dimensions is not None and not 1 <= request.dimensions <= served.dim:
            raise ServiceError(400, f"dimensions: {request.dimensions} is not between 1 and {name}'s "
                                    f"{served.dim} dimensions", field="dimensions")
        texts = await read_input(served, request.input)
        vectors, cost = await served.sentence_vectors(texts, long_texts=served.default_long_texts, normalize=True)
        arguments = (vectors, request.dimensions, request.encoding_format, name, cost.tokens)
        body = (response_body(*arguments) if len(texts) <= 8
                else await asyncio.to_thread(response_body, *arguments))
        return Response(body, media_type="application/json")

    @api.post("/v1/completions", summary="OpenAI-compatible completions: generation by the running batch, "
              "streamed as server-sent events with stream: true", response_model=CompletionResponse,
              responses={**COMPLETION_ERRORS, 200: {"content": {"text/event-stream": {}}}})
    async def completions(request: CompletionRequest, http: Request) -> Response:
        check_model(request.model, name)
        decoder = served.decoder
        if decoder is None or decoder.missing is not None:
            raise ServiceError(501, f"{name}: {decoder.missing if decoder is not None else 'no generation'}")
        options = completion_options(request)
        prompts = read_prompts(served, request.prompt)
        model = served.pretrained.model
        n, max_tokens = options["n"], options["max_tokens"]
        for i, prompt in enumerate(prompts):
            decoding.check_room(model, len(prompt), max_tokens, "max_tokens",
                                "prompt" if len(prompts) == 1 and not isinstance(request.prompt, list)
                                else f"prompt[{i}]")
        prompt_tokens = sum(map(len, prompts))
        served.limits.check("max_tokens", prompt_tokens, "the prompts' tokens", field="prompt")
        served.limits.check("max_tokens", prompt_tokens + len(prompts) * max_tokens * n,
                            f"the work asked for ({prompt_tokens} prompt tokens + {len(prompts)} prompts x "
                            f"max_tokens {max_tokens} x n {n})", field="max_tokens")
        events: asyncio.Queue = asyncio.Queue()
        jobs = []
        try:
            for prompt in prompts:
                settings, generator = decoding.sampling_settings(
                    model.config, max_new_tokens=max_tokens, temperature=options["temperature"],
                    top_p=options["top_p"], seed=request.seed, device=served.batcher.placement.device)
                jobs.append(decoder.submit(prompt, Group(settings, rows=n, generator=generator,
                                                         logprobs=request.logprobs), events))
        except BertologyError as error:
            for job in jobs:
                job.cancel()
            raise ServiceError(400, str(error), field=str(error).split(" ")[0]) from None
        except BaseException:
            for job in jobs:
                job.cancel()
            raise
        tokenizer = served.pretrained.tokenizer
        choices = [[decoding.Completion(tokenizer, options["stop"], request.logprobs) for _ in range(n)]
                   for _ in prompts]
        head = {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
                "model": name}
        if request.stream:
            usage = bool(request.stream_options and request.stream_options.include_usage)
            return StreamingResponse(stream_completions(jobs, events, choices, head, prompt_tokens, usage),
                                     media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        watcher = asyncio.create_task(decoding.watch_disconnect(http.receive, jobs))
        try:
            async for k, outcome in decoding.outcomes(jobs, events):
                feed(jobs[k], outcome, choices[k])
        finally:
            watcher.cancel()
            for job in jobs:
                job.cancel()  # rows still running for choices already stopped leave at the next step
        body = {**head, "choices": [
            {"text": c.text, "index": k * n + j, "logprobs": c.logprobs_object(), "finish_reason": c.finish_reason}
            for k, row in enumerate(choices) for j, c in enumerate(row)],
            "usage": usage_counts(prompt_tokens, choices)}
        return Response(json.dumps(body, ensure_ascii=False, allow_nan=False, separators=(",", ":")),
                        media_type="application/json")

    return api


def completion_options(request: CompletionRequest) -> dict[str, Any]:
    """The request's generation options, checked (400 naming the field)."""

    def bad(field: str, message: str) -> ServiceError:
        return ServiceError(400, f"{field}: {message}", field=field)

    max_tokens = 16 if request.max_tokens is None else request.max_tokens
    if max_tokens < 1:
        raise bad("max_tokens", f"{max_tokens}; at least 1 new token")
    n = 1 if request.n is None else request.n
    if not 1 <= n <= decoding.MAX_CHOICES:
        raise bad("n", f"{n} is not between 1 and {decoding.MAX_CHOICES}")
    temperature = 1.0 if request.temperature is None else float(request.temperature)
    if not math.isfinite(temperature) or not 0 <= temperature <= 2:
        raise bad("temperature", f"{temperature!r} is not a number from 0 to 2")
    top_p = 1.0 if request.top_p is None else float(request.top_p)
    if not math.isfinite(top_p) or not 0 < top_p <= 1:
        raise bad("top_p", f"{top_p!r} is not a number in (0, 1]")
    stop = [] if request.stop is None else [request.stop] if isinstance(request.stop, str) else list(request.stop)
    if len(stop) > decoding.MAX_STOP:
        raise bad("stop", f"{len(stop)} stop strings; at most {decoding.MAX_STOP}")
    for i, text in enumerate(stop):
        where = "stop" if isinstance(request.stop, str) else f"stop[{i}]"
        if not text:
            raise bad(where, "an empty string")
        if len(text) > decoding.MAX_STOP_CHARS:
            raise bad(where, f"{len(text)} characters; at most {decoding.MAX_STOP_CHARS}")
    if request.seed is not None and not 0 <= request.seed < 2**63:
        raise bad("seed", f"{request.seed} is not an integer in [0, 2**63)")
    if request.logprobs is not None and not 0 <= request.logprobs <= decoding.MAX_LOGPROBS:
        raise bad("logprobs", f"{request.logprobs} is not between 0 and {decoding.MAX_LOGPROBS}")
    for field, value, default in (("echo", request.echo, False), ("presence_penalty", request.presence_penalty, 0),
                                  ("frequency_penalty", request.frequency_penalty, 0), ("suffix", request.suffix,
                                                                                        None)):
        if value is not None and value != default:
            raise bad(field, f"{value!r} is not supported here (only {json.dumps(default)})")
    if request.best_of is not None and request.best_of != n:
        raise bad("best_of", f"{request.best_of} is not supported here (only null or n)")
    if request.logit_bias:
        raise bad("logit_bias", "not supported here (only null or {})")
    return {"max_tokens": max_tokens, "n": n, "temperature": temperature, "top_p": top_p, "stop": stop}


def read_prompts(served: Served, value: Any) -> list[list[int]]:
    """Each prompt's token ids: a text tokenised as `bertology.generate_texts` does (the tokenizer's framing), or
    token ids of this model's vocabulary as they are."""
    tokenizer = served.pretrained.tokenizer
    if isinstance(value, str):
        items: list[Any] = [value]
    elif isinstance(value, list) and value and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        items = [value]
    elif isinstance(value, list):
        items = value
    else:
        raise ServiceError(400, f"prompt: expected a string, a list of strings or a list of token-id lists, got "
                                f"{_kind(value)}", field="prompt")
    if not items:
        raise ServiceError(400, "prompt: the list is empty; send at least one prompt", field="prompt")
    if len(items) > served.limits.max_texts:
        raise ServiceError(413, f"prompt: {len(items)} prompts in one request; the limit is "
                                f"{served.limits.max_texts} (--max-texts)", field="prompt")
    prompts = []
    for i, item in enumerate(items):
        where = f"prompt[{i}]" if len(items) > 1 or not isinstance(value, str) else "prompt"
        if isinstance(item, str):
            served.limits.check_texts([item], field="prompt")
            if not item:
                raise ServiceError(400, f"{where}: an empty string; every prompt must hold text", field=where)
            ids = tokenizer.encode(item).ids
            if not ids:
                raise ServiceError(400, f"{where}: {item!r} has no tokens", field=where)
        elif isinstance(item, list):
            if not item:
                raise ServiceError(400, f"{where}: an empty list of token ids", field=where)
            if len(item) > served.limits.max_chars:
                raise ServiceError(413, f"{where}: {len(item)} token ids; the limit is {served.limits.max_chars} "
                                        "(--max-chars)", field=where)
            for k, token in enumerate(item):
                if isinstance(token, bool) or not isinstance(token, int) or not 0 <= token < tokenizer.vocab_size:
                    raise ServiceError(400, f"{where}[{k}]: {token!r} is not a token id of {served.model_name} "
                                            f"(integers from 0 to {tokenizer.vocab_size - 1})", field=f"{where}[{k}]")
            ids = list(item)
        else:
            raise ServiceError(400, f"{where}: expected a string or a list of token ids, got {_kind(item)}",
                               field=where)
        prompts.append(ids)
    return prompts


def feed(job: decoding.Job, outcome: Any, choices: list[decoding.Completion]) -> None:
    last = outcome.made >= job.group.settings.max_new_tokens
    for row, choice in enumerate(choices):
        choice.add(outcome, row, last)
    if all(c.finished for c in choices):
        job.cancel()  # every choice has ended (a stop string): the rows still running leave


def usage_counts(prompt_tokens: int, choices: list[list[decoding.Completion]]) -> dict[str, int]:
    made = sum(c.tokens for row in choices for c in row)
    return {"prompt_tokens": prompt_tokens, "completion_tokens": made, "total_tokens": prompt_tokens + made}


async def stream_completions(jobs: list[decoding.Job], events: asyncio.Queue,
                             choices: list[list[decoding.Completion]], head: dict[str, Any], prompt_tokens: int,
                             include_usage: bool):
    """Server-sent events in OpenAI's chunk format: a chunk whenever a choice has new text (or log-probabilities,
    or has finished), then the usage chunk when asked for, then `data: [DONE]`. A client that goes away closes
    this generator, which cancels the jobs: their rows leave at the next step."""

    def event(body: dict[str, Any]) -> bytes:
        return b"data: " + json.dumps(body, ensure_ascii=False, allow_nan=False,
                                      separators=(",", ":")).encode("utf-8") + b"\n\n"

    n = len(choices[0])
    reported = [[False] * n for _ in choices]
    try:
        try:
            async for k, outcome in decoding.outcomes(jobs, events):
                feed(jobs[k], outcome, choices[k])
                parts = []
                for j, choice in enumerate(choices[k]):
                    if reported[k][j]:
                        continue
                    text = choice.delta()
                    logprobs = choice.logprobs_object(streamed=True) if choice.logprobs is not None else None
                    fresh = logprobs is not None and logprobs["tokens"]
                    if text or choice.finished or fresh:
                        reported[k][j] = choice.finished
                        parts.append({"text": text, "index": k * n + j, "logprobs": logprobs,
                                      "finish_reason": choice.finish_reason})
                if parts:
                    yield event({**head, "choices": parts})
        except ServiceError as error:
            from bertology.serve.compat import openai_error

            yield event(openai_error(error.status_code, str(error.detail), error.field))
            yield b"data: [DONE]\n\n"
            return
        if include_usage:
            yield event({**head, "choices": [], "usage": usage_counts(prompt_tokens, choices)})
        yield b"data: [DONE]\n\n"
    finally:
        for job in jobs:
            job.cancel()


def check_model(model: str, served_name: str) -> None:
    if model != served_name:
        raise ServiceError(404, f"model: the model {model!r} does not exist here; this service serves "
                                f"{served_name!r} (GET /v1/models)", field="model")


async def read_input(served: Served, value: Any) -> list[str]:
    """The texts of `input`; token ids are decoded to the text they re-encode from exactly (checked)."""
    if isinstance(value, str):
        items: list[Any] = [value]
    elif isinstance(value, list) and value and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        items = [value]  # one tokenised input
    elif isinstance(value, list):
        items = value
    else:
        raise ServiceError(400, f"input: expected a string, a list of strings or a list of token-id lists, got "
                                f"{_kind(value)}", field="input")
    if not items:
        raise ServiceError(400, "input: the list is empty; send at least one text", field="input")
    if len(items) > served.limits.max_texts:  # before any is decoded
        raise ServiceError(413, f"input: {len(items)} inputs in one request; the limit is {served.limits.max_texts} "
                                "(--max-texts)", field="input")
    texts = []
    for i, item in enumerate(items):
        where = f"input[{i}]" if len(items) > 1 or not isinstance(value, str) else "input"
        if isinstance(item, str):
            if not item:
                raise ServiceError(400, f"{where}: an empty string; every input must hold text", field=where)
            texts.append(item)
        elif isinstance(item, list):
            texts.append(_decode(served, item, where))
        else:
            raise ServiceError(400, f"{where}: expected a string or a list of token ids, got {_kind(item)}",
                               field=where)
    return texts


def _decode(served: Served, ids: list[Any], where: str) -> str:
    tokenizer = served.pretrained.tokenizer
    if not ids:
        raise ServiceError(400, f"{where}: an empty list of token ids", field=where)
    if len(ids) > served.limits.max_chars:
        raise ServiceError(413, f"{where}: {len(ids)} token ids; the limit is {served.limits.max_chars} "
                                "(--max-chars)", field=where)
    for k, token in enumerate(ids):
        if isinstance(token, bool) or not isinstance(token, int) or not 0 <= token < tokenizer.vocab_size:
            raise ServiceError(400, f"{where}[{k}]: {token!r} is not a token id of {served.model_name} (integers "
                                    f"from 0 to {tokenizer.vocab_size - 1})", field=f"{where}[{k}]")
    try:
        text = tokenizer.decode(ids, skip_special_tokens=False)
        again = tokenizer.encode(text, add_special_tokens=False).ids
    except BertologyError as error:
        raise ServiceError(400, f"{where}: {error}", field=where) from None
    if again != ids:
        raise ServiceError(400, f"{where}: these token ids do not come back from {served.model_name}'s tokenizer "
                                "(decoded to text, it encodes them otherwise); send the ids it gives for a text, "
                                "without special tokens, or the text itself", field=where)
    return text


def response_body(vectors: np.ndarray, dimensions: int | None, encoding_format: str, model: str,
                  tokens: int) -> bytes:
    if dimensions is not None:
        vectors = unit_rows(vectors[:, :dimensions])
    rows: list[Any]
    if encoding_format == "base64":
        rows = [base64.b64encode(np.ascontiguousarray(row, dtype="<f4").tobytes()).decode("ascii")
                for row in vectors]
    else:
        rows = vectors.astype(np.float32).tolist()
    body = {"object": "list", "data": [{"object": "embedding", "index": i, "embedding": row}
                                       for i, row in enumerate(rows)],
            "model": model, "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}
    return json.dumps(body, allow_nan=False, separators=(",", ":")).encode("utf-8")


def _kind(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(value), f"a {type(value).__name__}")

