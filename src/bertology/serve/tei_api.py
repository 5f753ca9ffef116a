"""text-embeddings-inference-compatible endpoints: `POST /embed`, `/tokenize`, `/predict` (a fine-tuned sequence
classifier), `/rerank` (a cross-encoder) and `GET /info`. Errors are TEI's `{"error", "error_type"}` objects
(`bertology.serve.compat.tei_error`); a model without the head an endpoint needs answers 501 naming it.
"""

from __future__ import annotations

import asyncio
import json
from typing import Annotated, Any, Literal, Union

import numpy as np
from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictStr, WithJsonSchema

from bertology.errors import BertologyError
from bertology.pipelines import CLASSIFIER, label_names, pipeline
from bertology.serve.compat import INLINE_CHARS, Served
from bertology.serve.limits import ServiceError

Direction = Literal["Right", "Left", "right", "left"]  # a truncated text keeps its first tokens, or its last
PairDirection = Literal["Right", "right"]  # a pair is truncated longest first from the right (Left: not yet)


class TEIEmbedRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    inputs: Union[StrictStr, list[StrictStr]] = Field(description="a text or a list of texts")
    normalize: StrictBool = Field(True, description="scale each vector to unit L2 norm")
    truncate: StrictBool | None = Field(False, description="false: a text over max_input_length tokens is a 413; "
                                        "true: its first max_input_length tokens are embedded")
    truncation_direction: Direction = Field("Right", description="with truncate, Right keeps a text's first "
                                            "tokens, Left its last (after a prompt's, which stay)")
    prompt_name: StrictStr | None = Field(None, description="one of a sentence-transformers directory's prompts")


class TEITokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    inputs: Union[StrictStr, list[StrictStr]]
    add_special_tokens: StrictBool = True
    prompt_name: StrictStr | None = Field(None, description="one of a sentence-transformers directory's prompts, "
                                          "tokenised before the text")


class TEIToken(BaseModel):
    id: int
    text: str
    special: bool
    start: int | None = Field(description="offset of the token's first character in the input, in Unicode code "
                              "points (null for a special token)")
    stop: int | None


PREDICT_SCHEMA = {"anyOf": [
    {"type": "string"}, {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 2},
    {"type": "array", "items": {"anyOf": [{"type": "string"},
                                          {"type": "array", "items": {"type": "string"}, "minItems": 1,
                                           "maxItems": 2}]}}]}


class TEIPredictRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    inputs: Annotated[Any, WithJsonSchema(PREDICT_SCHEMA)] = Field(
        description='a text, a pair ["a", "b"], or a batch of them: [["a"], ["b", "c"], "d"]')
    raw_scores: StrictBool = Field(False, description="the logits instead of probabilities")
    truncate: StrictBool | None = Field(False, description="false: an input over max_input_length tokens is a "
                                        "413; true: it is truncated (longest first)")
    truncation_direction: PairDirection = Field("Right", description="Right only, for now")


class TEIPrediction(BaseModel):
    score: float
    label: str


class TEIRerankRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    query: StrictStr
    texts: list[StrictStr]
    raw_scores: StrictBool = Field(False, description="the logit (two outputs: their difference) instead of the "
                                   "probability of relevance")
    return_text: StrictBool = False
    truncate: StrictBool | None = False
    truncation_direction: PairDirection = Field("Right", description="Right only, for now")


class TEIRank(BaseModel):
    index: int
    score: float
    text: str | None = None


class TEIError(BaseModel):
    error: str
    error_type: str


ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": TEIError, "description": text}
    for code, text in ((400, "malformed JSON, or an empty list of inputs (error_type Empty)"),
                       (401, "missing or wrong API key (when the service has one)"),
                       (413, "an input over max_input_length without truncate, or over the service's limits"),
                       (422, "a field of the wrong type or value (named in the message)"))
}
NEEDS_HEAD = {501: {"model": TEIError, "description": "the model has no sequence-classification head"}}


def router(served: Served, route_class: type) -> APIRouter:
    """The TEI-compatible routes over `served`."""
    api = APIRouter(route_class=route_class, tags=["text-embeddings-inference-compatible"])
    pretrained, limits, batcher = served.pretrained, served.limits, served.batcher
    tokenizer = pretrained.tokenizer
    classifier = pipeline("text-classification", pretrained, dtype=batcher.placement.dtype) \
        if CLASSIFIER in pretrained.model.heads else None
    labels = label_names(pretrained, CLASSIFIER) if classifier is not None else []
    pair_length = int(pretrained.model.config.max_length)

    @api.get("/info", summary="the served model, as text-embeddings-inference describes it")
    async def info() -> dict[str, Any]:
        if classifier is None:
            model_type: dict[str, Any] = {"embedding": {"pooling": served.sentence}}
        else:
            id2label = {str(i): name for i, name in enumerate(labels)}
            model_type = {"reranker" if len(labels) == 1 else "classifier": {"id2label": id2label}}
        return {"model_id": served.model_name, "model_sha": None, "model_dtype": served.dtype,
                "model_type": model_type,
                "max_input_length": served.max_input_length if classifier is None else pair_length,
                "max_batch_tokens": batcher.max_batch_tokens, "max_client_batch_size": limits.max_texts,
                "max_concurrent_requests": None, "max_batch_requests": None, "auto_truncate": False,
                "tokenization_workers": 1, "prompts": dict(served.settings.prompts) if served.settings else None,
                "default_prompt_name": served.settings.default_prompt if served.settings else None,
                "version": _version(), "sha": None, "docker_label": None}

    @api.post("/embed", summary="sentence vectors (text-embeddings-inference's /embed)",
              response_model=list[list[float]], responses=ERRORS)
    async def embed(request: TEIEmbedRequest) -> Response:
        texts = _texts(request.inputs)
        vectors, _ = await served.sentence_vectors(
            texts, long_texts="truncate" if request.truncate else "error", normalize=request.normalize,
            prompt_name=request.prompt_name, truncation_side=request.truncation_direction.lower(), field="inputs")
        body = json.dumps(vectors.tolist(), allow_nan=False, separators=(",", ":")).encode("utf-8") \
            if len(texts) <= 8 else await asyncio.to_thread(_dump, vectors)
        return Response(body, media_type="application/json")

    @api.post("/tokenize", summary="the model's tokens of each input, with their character offsets",
              response_model=list[list[TEIToken]], responses=ERRORS)
    async def tokenize(request: TEITokenizeRequest) -> Response:
        texts = limits.check_texts(_texts(request.inputs), field="inputs")
        prompt = served.prompt(request.prompt_name)
        if sum(map(len, texts)) <= INLINE_CHARS:
            result = _tokens(tokenizer, texts, prompt, served, request.add_special_tokens)
        else:
            result = await asyncio.to_thread(_tokens, tokenizer, texts, prompt, served, request.add_special_tokens)
        limits.check("max_tokens", sum(map(len, result)), "the tokens of the inputs", field="inputs")
        return JSONResponse(result)

    @api.post("/predict", summary="a fine-tuned sequence classifier's labels and scores, best first",
              response_model=Union[list[TEIPrediction], list[list[TEIPrediction]]], responses={**ERRORS, **NEEDS_HEAD})
    async def predict(request: TEIPredictRequest) -> Response:
        if classifier is None:
            raise _no_classifier(served.model_name, "/predict")
        single, items = _predict_items(request.inputs)
        if len(items) > limits.max_texts:
            raise ServiceError(413, f"inputs: {len(items)} inputs in one request; the limit is {limits.max_texts} "
                                    "(--max-texts)", field="inputs")
        for i, item in enumerate(items):  # characters and Unicode of each text, named inputs[i][k]
            limits.check_texts([t for t in (item["text"], item["text_pair"]) if t is not None],
                               field="inputs" if single else f"inputs[{i}]")
        await _check_lengths(tokenizer, items, pair_length, request.truncate, limits, "inputs")
        logits = await batcher.run(classifier.logits, items)
        results = []
        for row in logits.astype(np.float64):
            scores = row if request.raw_scores else _probabilities(row)
            order = np.argsort(-scores, kind="stable")
            results.append([{"score": float(scores[k]), "label": labels[k]} for k in order])
        return JSONResponse(results[0] if single else results)

    @api.post("/rerank", summary="a cross-encoder's relevance of each text to the query, best first",
              response_model=list[TEIRank], responses={**ERRORS, **NEEDS_HEAD})
    async def rerank(request: TEIRerankRequest) -> Response:
        if classifier is None:
            raise _no_classifier(served.model_name, "/rerank")
        if len(labels) not in (1, 2):
            raise ServiceError(501, f"/rerank needs a cross-encoder (a sequence classifier with one output, or two "
                                    f"whose last is the relevant class); {served.model_name}'s classifier has "
                                    f"{len(labels)} outputs ({', '.join(labels)}): use /predict", field=None)
        limits.check_texts([request.query], field="query")
        texts = limits.check_texts(request.texts, field="texts")
        items = [{"text": request.query, "text_pair": text} for text in texts]
        await _check_lengths(tokenizer, items, pair_length, request.truncate, limits, "texts")
        logits = (await batcher.run(classifier.logits, items)).astype(np.float64)
        raw = logits[:, 0] if logits.shape[1] == 1 else logits[:, 1] - logits[:, 0]
        # softmax's last class over two outputs is the sigmoid of their difference
        scores = raw if request.raw_scores else 1.0 / (1.0 + np.exp(-raw))
        order = np.argsort(-scores, kind="stable")
        ranks = []
        for k in order:
            rank: dict[str, Any] = {"index": int(k), "score": float(scores[k])}
            if request.return_text:
                rank["text"] = texts[k]
            ranks.append(rank)
        return JSONResponse(ranks)

    return api


def _texts(inputs: str | list[str]) -> list[str]:
    texts = [inputs] if isinstance(inputs, str) else inputs
    if not texts:
        raise ServiceError(400, "inputs: the list is empty; send at least one text", field="inputs", kind="Empty")
    return texts


def _dump(vectors: np.ndarray) -> bytes:
    return json.dumps(vectors.tolist(), allow_nan=False, separators=(",", ":")).encode("utf-8")


def _tokens(tokenizer: Any, texts: list[str], prompt: str, served: Served,
            add_special_tokens: bool) -> list[list[dict[str, Any]]]:
    """Each text's tokens as the encoder reads it (the prompt first, lower-cased where the directory says so);
    offsets index the text as sent (a prompt's tokens have none)."""
    result = []
    for text in texts:
        run = served.run_text(text, prompt)
        encoding = tokenizer.encode(run, add_special_tokens=add_special_tokens)
        tokens = []
        for token_id, token, (start, stop), special in zip(encoding.ids, encoding.tokens, encoding.offsets,
                                                           encoding.special_tokens_mask):
            if special or stop <= len(prompt):
                tokens.append({"id": token_id, "text": token, "special": bool(special), "start": None,
                               "stop": None})
            else:
                start, stop = max(start - len(prompt), 0), stop - len(prompt)
                tokens.append({"id": token_id, "text": text[start:stop], "special": False, "start": start,
                               "stop": stop})
        result.append(tokens)
    return result


def _predict_items(inputs: Any) -> tuple[bool, list[dict[str, Any]]]:
    """(a single input?, the inputs as the pipeline's items)."""

    def sequence(value: Any, where: str) -> dict[str, Any]:
        if isinstance(value, str):
            return {"text": value, "text_pair": None}
        if isinstance(value, list) and 1 <= len(value) <= 2 and all(isinstance(v, str) for v in value):
            return {"text": value[0], "text_pair": value[1] if len(value) == 2 else None}
        raise ServiceError(422, f"{where}: expected a text or a list of one or two texts (a pair), got "
                                f"{json.dumps(value)[:80]}", field=where)

    if isinstance(inputs, str):
        return True, [sequence(inputs, "inputs")]
    if not isinstance(inputs, list):
        raise ServiceError(422, f"inputs: expected a text, a pair or a list of them, got {json.dumps(inputs)[:80]}",
                           field="inputs")
    if not inputs:
        raise ServiceError(400, "inputs: the list is empty; send at least one text", field="inputs", kind="Empty")
    if all(isinstance(v, str) for v in inputs):  # TEI's reading: a list of strings is one input (a pair)
        if len(inputs) > 2:
            raise ServiceError(422, f"inputs: a list of {len(inputs)} texts; one input is a text or a pair "
                                    '["a", "b"], a batch is a list of them: [["a"], ["b"], ["c"]]', field="inputs")
        return True, [sequence(inputs, "inputs")]
    return False, [sequence(value, f"inputs[{i}]") for i, value in enumerate(inputs)]


async def _check_lengths(tokenizer: Any, items: list[dict[str, Any]], max_length: int, truncate: bool | None,
                         limits: Any, field: str) -> None:
    """Without `truncate`, an input whose tokens (specials included) pass the model's positions is a 413 naming
    it; the tokens of all inputs are bounded by --max-tokens either way."""

    def lengths() -> list[int]:
        return [len(tokenizer.encode(item["text"], item["text_pair"]).ids) for item in items]

    try:
        counts = lengths() if sum(len(i["text"]) + len(i["text_pair"] or "") for i in items) <= INLINE_CHARS \
            else await asyncio.to_thread(lengths)
    except BertologyError as error:
        raise ServiceError(422, f"{field}: {error}", field=field) from None
    if not truncate:
        for i, n in enumerate(counts):
            if n > max_length:
                where = f"{field}[{i}]" if len(items) > 1 or field == "texts" else field
                raise ServiceError(413, f"{where}: {n} tokens (specials included); the model reads at most "
                                        f"{max_length} (send truncate: true to truncate it)", field=where)
    limits.check("max_tokens", sum(min(n, max_length) for n in counts), "the tokens the inputs cost the encoder",
                 field=field)


def _probabilities(row: np.ndarray) -> np.ndarray:
    if len(row) == 1:  # one output: the sigmoid, as text-embeddings-inference scores it
        return 1.0 / (1.0 + np.exp(-row))
    exp = np.exp(row - row.max())
    return exp / exp.sum()


def _no_classifier(model_name: str, endpoint: str) -> ServiceError:
    return ServiceError(501, f"{endpoint} needs a sequence-classification head ('classifier'); {model_name} has "
                             "none (fine-tune it for the task first, `bertology finetune`)")


def _version() -> str:
    from bertology import __version__

    return __version__
