"""What one request may ask for (body size, texts per request, characters per text), the API key file, and the
error response that names the field at fault."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from fastapi import HTTPException

from bertology.errors import ConfigError


class ServiceError(HTTPException):
    """An error response (`{"detail": ..., "field": ...}`) naming the request field at fault."""

    def __init__(self, status_code: int, detail: str, field: str | None = None,
                 headers: dict[str, str] | None = None, kind: str | None = None) -> None:
        super().__init__(status_code, detail, headers)
        self.field = field
        self.kind = kind  # the API's own error code where it has one (OpenAI's `code`, TEI's `error_type`)


# The option that sets each limit, named in the 413 answers.
OPTIONS = {"max_body_bytes": "--max-body-bytes", "max_texts": "--max-texts", "max_chars": "--max-chars",
           "max_tokens": "--max-tokens", "max_values": "--max-values", "max_outputs": "--max-outputs",
           "max_generated": "--max-generated"}


@dataclass(frozen=True)
class Limits:
    """Per-request bounds: over any of them the request is answered 413 with a message naming the limit.

    The size of the body, of each text and of the list bound what is read; `max_tokens` bounds the work (real
    tokens the texts cost the encoder, specials and window overlaps included); `max_values` bounds an embedding
    response (numbers returned: vectors x their width; at word and token level the content tokens count, an upper
    bound of the words); `max_outputs` bounds a fill-mask response (masks x top_k candidates, each repeating its
    filled text) and a search response (queries x k passages); `max_generated` bounds an encoder-decoder's
    fill-mask work as `max_tokens` bounds the encoder's: the decoder steps of its beam search, texts x beams
    (`bertology.objectives.fill_mask.span_search_beams`: 7 x max(top_k, 4), its searches for distinct fillings) x
    max_new_tokens, summed over the request."""

    max_body_bytes: int = 4 * 1024 * 1024
    max_texts: int = 256
    max_chars: int = 20_000
    max_tokens: int = 16_384
    max_values: int = 1_048_576
    max_outputs: int = 2048
    max_generated: int = 4096

    def __post_init__(self) -> None:
        for name in OPTIONS:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{name} must be a positive integer, got {value!r}")

    def check(self, name: str, value: int, what: str, field: str | None = None) -> None:
        """A 413 naming the limit `name` (and its option) when `value` passes it."""
        limit = getattr(self, name)
        if value > limit:
            raise ServiceError(413, f"{field + ': ' if field else ''}{what} is {value}; the limit is {limit} "
                                    f"({OPTIONS[name]})", field=field)

    def check_texts(self, texts: list[str], field: str = "texts") -> list[str]:
        """`texts` if within the limits and valid Unicode, else a ServiceError naming the field."""
        if not texts:
            raise ServiceError(422, f"{field}: the list is empty; send at least one text", field=field)
        if len(texts) > self.max_texts:
            raise ServiceError(413, f"{field}: {len(texts)} texts in one request; the limit is {self.max_texts} "
                                    "(--max-texts)", field=field)
        for i, text in enumerate(texts):
            if len(text) > self.max_chars:
                raise ServiceError(413, f"{field}[{i}]: {len(text)} characters; the limit is {self.max_chars} "
                                        "(--max-chars)", field=f"{field}[{i}]")
            try:
                text.encode("utf-8")
            except UnicodeEncodeError as error:  # JSON's \ud800 escapes decode to lone surrogates
                raise ServiceError(422, f"{field}[{i}]: character {error.start} is a lone surrogate "
                                        f"(U+{ord(text[error.start]):04X}), which is not Unicode text",
                                   field=f"{field}[{i}]") from None
        return texts


class BodyLimit:
    """Answers 413 to a request body over `max_bytes`, by its Content-Length or, when streamed, as soon as the
    bytes received pass the limit (an ASGI middleware; Starlette's own gives no message naming the limit)."""

    def __init__(self, app: Any, max_bytes: int,
                 shape: Callable[[str, int, str], dict[str, Any]] | None = None) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.shape = shape  # (path, status, message) -> the error body of the API the path belongs to

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    await self._reject(send, "Content-Length is not a number", 400, scope)
                    return
                if declared > self.max_bytes:
                    await self._reject(send, f"the request body is {declared} bytes; the limit is "
                                             f"{self.max_bytes} (--max-body-bytes)", 413, scope)
                    return
        received = 0
        started = False

        async def limited_receive() -> dict:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise _TooLarge(self.max_bytes)
            return message

        async def tracking_send(message: dict) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, limited_receive, tracking_send)
        except _TooLarge as error:
            if started:
                raise
            await self._reject(send, error.detail, 413, scope)

    async def _reject(self, send: Callable, message: str, status: int, scope: dict) -> None:
        shaped = self.shape(scope.get("path", ""), status, message) if self.shape is not None else None
        body = json.dumps(shaped if shaped is not None else {"detail": message}).encode()
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                                (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": body})


class _TooLarge(ServiceError):
    """Raised from `receive`: an HTTPException, so that FastAPI answers it as it is (not as a parse error)."""

    def __init__(self, max_bytes: int) -> None:
        super().__init__(413, f"the request body passed {max_bytes} bytes (--max-body-bytes)")


def read_api_key(path: str | Path) -> str:
    """The key in `path` (surrounding whitespace and the final newline stripped)."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as error:
        raise ConfigError(f"--api-key-file {path}: cannot read it ({error.strerror or error})") from None
    try:
        key = raw.decode("utf-8").strip()
    except UnicodeDecodeError as error:
        raise ConfigError(f"--api-key-file {path}: not UTF-8 at byte offset {error.start}") from None
    if not key:
        raise ConfigError(f"--api-key-file {path}: the file is empty")
    if any(c.isspace() or not c.isprintable() for c in key):
        raise ConfigError(f"--api-key-file {path}: the key contains whitespace or control characters; an "
                          "Authorization header cannot carry it")
    return key
