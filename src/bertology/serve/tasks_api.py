"""The library's own task endpoints beside the compatible APIs: `POST /v1/generate` (generation with beams, or
greedy and sampled through the running batch), `POST /v1/token-classification` (entities with character spans, the
token-classification pipeline's) and `POST /v1/question-answering` (extractive answers, the QA pipeline's). Errors
are the service's own `{"detail", "field"}`; a model without what an endpoint needs is answered 501 naming it.
"""

from __future__ import annotations

import asyncio
import functools
import re
from typing import Any, Literal, Union

import torch
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr

from bertology.errors import BertologyError
from bertology.generation import Group, generate, make_settings, output_text, token_ids
from bertology.model import DECODER_ONLY, capabilities
from bertology.serve import decoding
from bertology.serve.compat import ERRORS, INLINE_CHARS, ErrorResponse, Served
from bertology.serve.limits import ServiceError

TASK_PATHS = ("/v1/generate", "/v1/token-classification", "/v1/question-answering")
MAX_BEAMS = 16
Number = Union[StrictFloat, StrictInt]


class GenerateRequest(BaseModel):
    """Texts to continue (a decoder) or to transform (an encoder-decoder), with `bertology.generate`'s options."""

    model_config = ConfigDict(extra="forbid")

    texts: list[StrictStr] = Field(description="the prompts, one result list per text, in order")
    max_new_tokens: StrictInt = Field(20, ge=1, description="new tokens per output at most")
    num_beams: StrictInt = Field(1, ge=1, le=MAX_BEAMS, description="beam search with more than 1")
    num_return_sequences: StrictInt = Field(1, ge=1, le=MAX_BEAMS, description="outputs per text (beam search: "
                                            "its best finished hypotheses, at most num_beams)")
    do_sample: StrictBool = Field(False, description="sampling instead of the most probable tokens")
    temperature: Number = Field(1.0, description="sampling temperature (positive; 1 without sampling)")
    top_k: StrictInt | None = Field(None, description="sampling from the top_k most probable tokens")
    top_p: Number | None = Field(None, description="sampling from the most probable tokens reaching top_p")
    seed: StrictInt | None = Field(None, description="the seed of the draws (generate's with that seed)")
    length_penalty: Number = Field(1.0, description="beam search's length penalty")
    early_stopping: Union[StrictBool, Literal["never"]] = Field(False, description="beam search's stopping rule")


class GeneratedText(BaseModel):
    generated_text: str = Field(description="a decoder's prompt and its continuation; an encoder-decoder's output")
    token_ids: list[int] = Field(description="the new tokens (EOS included when said)")
    finish_reason: Literal["eos", "length"]


class GenerateResponse(BaseModel):
    model: str
    results: list[list[GeneratedText]]
    prompt_tokens: int
    generated_tokens: int


class TagRequest(BaseModel):
    """Texts whose entities are wanted (a token classifier's tags grouped into spans)."""

    model_config = ConfigDict(extra="forbid")

    texts: list[StrictStr]
    aggregation: Literal["none", "simple", "first", "average", "max"] = Field(
        "simple", description="none: every token not tagged O; simple: adjacent tokens of one type grouped; first, "
        "average, max: one label per word, then grouped")


class Entity(BaseModel):
    entity_group: str | None = None
    entity: str | None = None
    index: int | None = None
    score: float
    word: str = Field(description="text[start:end]")
    start: int = Field(description="offset of the entity's first character (Unicode code points)")
    end: int


class TagResponse(BaseModel):
    model: str
    results: list[list[Entity]]


class Question(BaseModel):
    model_config = ConfigDict(extra="forbid")

    question: StrictStr
    context: StrictStr


class QARequest(BaseModel):
    """Questions, each with the context its answer is extracted from."""

    model_config = ConfigDict(extra="forbid")

    inputs: list[Question]
    max_answer_length: StrictInt = Field(15, ge=1, le=512, description="tokens of an answer at most")
    doc_stride: StrictInt = Field(128, ge=1, le=4096, description="overlap of a long context's windows")


class Answer(BaseModel):
    answer: str = Field(description="context[start:end]; empty when no window holds a valid span")
    score: float = Field(description="start probability x end probability")
    start: int
    end: int


class QAResponse(BaseModel):
    model: str
    results: list[Answer]


def _errors() -> dict[int | str, dict[str, Any]]:
    return {**ERRORS, 501: {"model": ErrorResponse, "description": "the model lacks what the endpoint needs "
                                                                   "(named in the message)"}}


def router(served: Served, route_class: type) -> APIRouter:
    """The library's own task routes over `served`."""
    api = APIRouter(route_class=route_class, tags=["tasks"])
    pretrained, limits, name = served.pretrained, served.limits, served.model_name
    errors = _errors()
    pipelines: dict[str, Any] = {}

    def task_pipeline(task: str) -> Any:
        from bertology.pipelines import Pipeline

        if task not in pipelines:
            pipe = Pipeline(task, pretrained, served.batcher.placement, batch_size=32)
            try:
                pipe.check_model()
            except BertologyError as error:
                pipelines[task] = ServiceError(501, f"{name}: {task} is not available: {error}")
            else:
                pipelines[task] = pipe
        found = pipelines[task]
        if isinstance(found, ServiceError):
            raise found
        return found

    async def tokens_of(texts: list[str]) -> int:
        small = sum(map(len, texts)) <= INLINE_CHARS
        return (served.batcher.cost(texts) if small else await asyncio.to_thread(served.batcher.cost, texts)).tokens

    @api.post("/v1/token-classification", summary="entities with character spans (a token classifier)",
              response_model=TagResponse, responses=errors)
    async def tag(request: TagRequest) -> Response:
        pipe = task_pipeline("token-classification")
        texts = limits.check_texts(request.texts)
        limits.check("max_tokens", await tokens_of(texts), "the tokens of the texts", field="texts")
        results = await served.batcher.run(functools.partial(pipe.run, aggregation=request.aggregation),
                                           [{"text": t} for t in texts])
        return JSONResponse({"model": name, "results": results})

    @api.post("/v1/question-answering", summary="extractive answers: the span of the context that answers each "
              "question", response_model=QAResponse, responses=errors)
    async def answer(request: QARequest) -> Response:
        pipe = task_pipeline("question-answering")
        if not request.inputs:
            raise ServiceError(422, "inputs: the list is empty; send at least one question", field="inputs")
        for i, item in enumerate(request.inputs):
            for part in ("question", "context"):
                limits.check_texts([getattr(item, part)], field=f"inputs[{i}].{part}")
                if not getattr(item, part).strip():
                    raise ServiceError(422, f"inputs[{i}].{part}: empty", field=f"inputs[{i}].{part}")
        if len(request.inputs) > limits.max_texts:
            raise ServiceError(413, f"inputs: {len(request.inputs)} questions in one request; the limit is "
                                    f"{limits.max_texts} (--max-texts)", field="inputs")
        tokens = await tokens_of([t for item in request.inputs for t in (item.question, item.context)])
        limits.check("max_tokens", tokens, "the tokens of the questions and contexts", field="inputs")
        items = [{"question": item.question, "context": item.context} for item in request.inputs]
        try:
            results = await served.batcher.run(functools.partial(
                pipe.run, max_answer_length=request.max_answer_length, doc_stride=request.doc_stride), items)
        except BertologyError as error:
            raise ServiceError(422, str(error), field=_field_of(str(error), "inputs")) from None
        return JSONResponse({"model": name, "results": results})

    @api.post("/v1/generate", summary="generated texts: greedy, sampled or beam search (bertology.generate)",
              response_model=GenerateResponse, responses={**errors, 503: {"description": "shutting down"}})
    async def generate_route(request: GenerateRequest, http: Request) -> Response:
        decoder = served.decoder
        if decoder is None or decoder.missing is not None:
            raise ServiceError(501, f"{name}: {decoder.missing if decoder is not None else 'no generation'}")
        model = pretrained.model
        try:
            settings = make_settings(
                model.config, max_new_tokens=request.max_new_tokens, num_beams=request.num_beams,
                do_sample=request.do_sample, temperature=request.temperature, top_k=request.top_k,
                top_p=request.top_p, length_penalty=request.length_penalty, early_stopping=request.early_stopping,
                seed=request.seed, num_return_sequences=request.num_return_sequences,
                pad_token_id=_pad(model.config))
        except BertologyError as error:
            raise ServiceError(422, str(error), field=_field_of(str(error), "texts")) from None
        texts = limits.check_texts(request.texts)
        tokenizer = pretrained.tokenizer
        prompts = [tokenizer.encode(text).ids for text in texts]
        for i, prompt in enumerate(prompts):
            if not prompt:
                raise ServiceError(422, f"texts[{i}]: {texts[i]!r} has no tokens", field=f"texts[{i}]")
            decoding.check_room(model, len(prompt), request.max_new_tokens, "max_new_tokens", f"texts[{i}]")
        prompt_tokens = sum(map(len, prompts))
        limits.check("max_tokens", prompt_tokens, "the tokens of the texts", field="texts")
        limits.check("max_tokens", prompt_tokens + len(prompts) * request.max_new_tokens * request.num_beams
                     * request.num_return_sequences,
                     f"the work asked for ({prompt_tokens} prompt tokens + {len(prompts)} texts x max_new_tokens "
                     f"{request.max_new_tokens} x num_return_sequences {request.num_return_sequences} x num_beams "
                     f"{request.num_beams})", field="max_new_tokens")
        eos_ids = set(settings.eos_token_ids)
        decoder_only = DECODER_ONLY in capabilities(model)
        outputs: list[list[list[int]]]
        if request.num_beams > 1:  # beam search reorders its rows: one text at a time, between decoding steps
            outputs = []
            for prompt in prompts:
                ids = torch.tensor([prompt])
                rows = await served.batcher.run(_beams, model, ids, request)
                outputs.append([row[len(prompt):] if decoder_only else row[1:] for row in rows])
        else:
            outputs = await _running(served, decoder, prompts, settings, request.seed, http)
        results = []
        made = 0
        for prompt, rows in zip(prompts, outputs):
            out = []
            for new in rows:
                new = _until_eos(new, eos_ids, settings.pad_token_id)
                made += len(new)
                out.append({"generated_text": output_text(tokenizer, prompt, new, decoder_only, eos_ids),
                            "token_ids": new,
                            "finish_reason": "eos" if new and new[-1] in eos_ids else "length"})
            results.append(out)
        return JSONResponse({"model": name, "results": results, "prompt_tokens": prompt_tokens,
                             "generated_tokens": made})

    return api


def _pad(config: Any) -> int:
    if config.pad_token_id is not None:
        return config.pad_token_id
    eos = token_ids(config.eos_token_id, "eos_token_id") if config.eos_token_id is not None else ()
    return eos[0] if eos else 0


def _beams(model: Any, ids: torch.Tensor, request: GenerateRequest) -> list[list[int]]:
    device = model.embeddings.weight.device
    out = generate(model, ids.to(device), torch.ones_like(ids).to(device), max_new_tokens=request.max_new_tokens,
                   num_beams=request.num_beams, num_return_sequences=request.num_return_sequences,
                   length_penalty=request.length_penalty, early_stopping=request.early_stopping,
                   pad_token_id=_pad(model.config))
    return out.cpu().tolist()


async def _running(served: Served, decoder: Any, prompts: list[list[int]], settings: Any, seed: int | None,
                   http: Request) -> list[list[list[int]]]:
    """Greedy or sampled outputs of every prompt from the running batch (one row each)."""
    import asyncio as aio
    import secrets

    events: aio.Queue = aio.Queue()
    jobs = []
    try:
        for prompt in prompts:
            generator = None
            if settings.do_sample:
                generator = torch.Generator(device=served.batcher.placement.device)
                generator.manual_seed(seed if seed is not None else secrets.randbits(63))
            jobs.append(decoder.submit(prompt, Group(settings, rows=1, generator=generator), events))
        outputs: list[list[list[int]]] = [[[]] for _ in prompts]
        watcher = aio.create_task(decoding.watch_disconnect(http.receive, jobs))
        try:
            async for k, outcome in decoding.outcomes(jobs, events):
                if outcome.live[0]:
                    outputs[k][0].append(outcome.tokens[0])
        finally:
            watcher.cancel()
        return outputs
    finally:
        for job in jobs:
            job.cancel()


def _until_eos(new: list[int], eos_ids: set[int], pad: int) -> list[int]:
    """The new tokens up to and including the first EOS (beam search pads its shorter outputs after it)."""
    for k, token in enumerate(new):
        if token in eos_ids:
            return list(new[:k + 1])
    return list(new)


def _field_of(message: str, default: str) -> str:
    """The option a library error names first (`temperature must ...`, `top_p=0.5 applies ...`)."""
    found = re.match(r"[a-z_]+", message)
    known = {"max_new_tokens", "num_beams", "do_sample", "temperature", "top_k", "top_p", "length_penalty",
             "early_stopping", "seed", "num_return_sequences", "doc_stride", "max_answer_length"}
    return found.group(0) if found and found.group(0) in known else default
