"""OpenAI-compatible endpoints: `POST /v1/embeddings` and `GET /v1/models` (`GET /v1/models/{model}`), so that
the `openai` client and what is built on it embed with the served model. Errors are OpenAI's error objects
(`bertology.serve.compat.openai_error`); completions are not served yet.
"""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Annotated, Any, Literal

import numpy as np
from fastapi import APIRouter
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr, WithJsonSchema

from bertology.errors import BertologyError
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

    return api


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

