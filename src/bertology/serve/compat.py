"""What the OpenAI- and text-embeddings-inference-compatible endpoints share (`bertology.serve.openai_api`,
`bertology.serve.tei_api`): the served model's sentence vectors, computed through the service's batcher, with a
sentence-transformers directory's own pooling, normalisation, prompts, lower-casing and maximum length
(`bertology.embeddings.sentence_config`), and the error shapes of each API.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel

from bertology.embeddings.sentence_config import SentenceConfig, read_sentence_config
from bertology.errors import ConfigError
from bertology.model import Pretrained
from bertology.serve.batcher import Batcher, Cost, EmbedOptions
from bertology.serve.limits import Limits, ServiceError

INLINE_CHARS = 2000  # requests up to this many characters are tokenised on the event loop (well under a millisecond)

# What a text longer than the model's input length gets: embed's overlapping windows (all of it is read), its
# first tokens (truncate), or a 413 naming the text (error: text-embeddings-inference without `truncate`).
LongTexts = Literal["windows", "truncate", "error"]


@dataclass
class Served:
    """The served model and the service's machinery, as the API routers use them."""

    pretrained: Pretrained
    batcher: Batcher
    limits: Limits
    model_name: str
    dtype: str
    created: int  # when the service started (Unix seconds): OpenAI's `created` of the model
    decoder: Any = None  # the running generation batch (`bertology.serve.decoding.Decoder`)
    settings: SentenceConfig | None = field(init=False)
    unsupported: str | None = field(init=False)  # why the directory's sentence settings cannot be followed

    def __post_init__(self) -> None:
        # A sentence-transformers directory whose modules bertology does not reproduce (a Dense projection, ...)
        # is still served by /v1/embed; the sentence-vector endpoints refuse it (501) rather than answer vectors
        # that differ from the directory's own.
        self.unsupported = None
        try:
            self.settings = read_sentence_config(self.pretrained.directory)
        except ConfigError as error:
            self.settings, self.unsupported = None, str(error)

    @property
    def dim(self) -> int:
        return int(self.batcher.dim)

    @property
    def sentence(self) -> str:
        """The sentence pooling: a sentence-transformers directory's own, else mean (specials included)."""
        return self.settings.sentence if self.settings is not None else "mean"

    @property
    def max_input_length(self) -> int:
        """The most tokens (specials included) one text is read in without windows: a sentence-transformers
        directory's ``max_seq_length`` within the model's positions, else the batcher's window."""
        window = self.batcher.window_length
        if self.settings is not None and self.settings.max_length is not None:
            return min(self.settings.max_length, window)
        return window

    @property
    def default_long_texts(self) -> LongTexts:
        """`bertology.embed`'s default: truncation at ``max_seq_length`` in a sentence-transformers directory that
        has one (what ``SentenceTransformer.encode`` does), windows elsewhere."""
        return "truncate" if self.settings is not None and self.settings.max_length is not None else "windows"

    def prompt(self, prompt_name: str | None) -> str:
        """The prompt's text (None: the directory's default prompt, or none), a 422 naming `prompt_name`."""
        if prompt_name is None:
            return self.settings.prompt(None) if self.settings is not None else ""
        if self.settings is None or not self.settings.prompts:
            raise ServiceError(422, f"prompt_name: {prompt_name!r}: {self.model_name} has no named prompts (it is "
                                    "not a sentence-transformers directory with prompts)", field="prompt_name")
        try:
            return self.settings.prompt(prompt_name)
        except ConfigError as error:
            raise ServiceError(422, str(error), field="prompt_name") from None

    def run_text(self, text: str, prompt: str) -> str:
        """The text the encoder reads, as `embed` makes it: the prompt first, lower-cased where the directory
        says so."""
        joined = prompt + text
        return joined.lower() if self.settings is not None and self.settings.lower_case else joined

    async def sentence_vectors(self, texts: list[str], *, long_texts: LongTexts, normalize: bool,
                               prompt_name: str | None = None, truncation_side: str = "right",
                               field: str = "input") -> tuple[np.ndarray, Cost]:
        """The sentence vectors of `texts` (float32, one row a text) from one batched `embed` call, and what they
        cost. Limits are checked before anything is queued; errors name `field` (and the text's index). A text
        truncated keeps its first tokens (`truncation_side` "left": the prompt's, then its last ones)."""
        if self.unsupported is not None:
            raise ServiceError(501, f"{self.model_name}'s sentence vectors cannot be computed as its directory "
                                    f"defines them: {self.unsupported}")
        texts = self.limits.check_texts(texts, field=field)
        prompt = self.prompt(prompt_name)
        runs = [self.run_text(text, prompt) for text in texts]
        truncate_to = None if long_texts == "windows" else self.max_input_length
        small = sum(map(len, runs)) <= INLINE_CHARS
        cost = self.batcher.cost(runs, truncate_to) if small else await asyncio.to_thread(
            self.batcher.cost, runs, truncate_to)
        if long_texts == "error":
            capacity = self.max_input_length - self.batcher.specials
            for i, n in enumerate(cost.counts):
                if n > capacity:
                    raise ServiceError(413, f"{field}[{i}]: {n + self.batcher.specials} tokens (specials "
                                            f"included{', the prompt too' if prompt else ''}); the model reads at "
                                            f"most {self.max_input_length} (send truncate: true to keep the first "
                                            f"{self.max_input_length})", field=f"{field}[{i}]")
        self.limits.check("max_tokens", cost.tokens, "the tokens the texts cost the encoder", field=field)
        self.limits.check("max_values", len(texts) * self.dim, f"the numbers in the response ({len(texts)} vectors "
                          f"of {self.dim})", field=field)
        options = EmbedOptions(
            level="sentence", sentence=self.sentence, normalize=normalize,
            long_texts="windows" if long_texts == "windows" else "truncate", truncation_side=truncation_side,
            max_length=None if long_texts == "windows" else self.max_input_length,
            model_settings=self.settings is not None, prompt_name=prompt_name)
        result = await self.batcher.embed(texts, options, cost)
        return result.sentences, cost


def unit_rows(vectors: np.ndarray) -> np.ndarray:
    """Each row scaled to unit L2 norm (computed in float64; a zero row stays zero), as float32."""
    norms = np.linalg.norm(vectors.astype(np.float64), axis=1, keepdims=True)
    return (vectors / np.maximum(norms, 1e-12)).astype(np.float32)


# ----------------------------------------------------------------------------------------- error shapes

OPENAI_PATHS = ("/v1/embeddings", "/v1/models", "/v1/completions")
TEI_PATHS = ("/embed", "/tokenize", "/info", "/predict", "/rerank")


def openai_error(status: int, message: str, param: str | None, kind: str | None = None) -> dict[str, Any]:
    """OpenAI's error object: `{"error": {"message", "type", "param", "code"}}`."""
    code = kind or {401: "invalid_api_key", 404: "model_not_found", 413: "request_too_large"}.get(status)
    kind_of = "server_error" if status >= 500 else "invalid_request_error"
    return {"error": {"message": message, "type": kind_of, "param": param, "code": code}}


def tei_error(status: int, message: str, param: str | None, kind: str | None = None) -> dict[str, Any]:
    """text-embeddings-inference's error object: `{"error": message, "error_type": ...}`."""
    kind = kind or {401: "Unauthorized", 404: "NotFound", 429: "Overloaded", 501: "Backend"}.get(
        status, "Backend" if status >= 500 else "Validation")
    return {"error": message, "error_type": kind}


def error_shape(path: str):
    """The error body maker of the API `path` belongs to; None: the service's own `{"detail", "field"}`."""
    if path in OPENAI_PATHS or (path.startswith("/v1/models/") and path.count("/") == 3):
        return openai_error
    if path in TEI_PATHS:
        return tei_error
    return None


# Error bodies of bertology's own routes (app.py and tasks_api.py), in the OpenAPI schema.
class ErrorResponse(BaseModel):
    detail: str
    field: str | None = None


ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorResponse, "description": text}
    for code, text in ((400, "malformed JSON, or a body that is not UTF-8"),
                       (401, "missing or wrong API key (when the service has one)"),
                       (413, "body, number of texts, a text's length, tokens, numbers returned or candidates "
                             "over the service's limits (the message names the option)"),
                       (422, "a field of the wrong type or value (named in `field`)"))
}
