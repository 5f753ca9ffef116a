"""Generation in the service: continuous batching of every generation request into one running batch
(`bertology.generation.RunningBatch`) that requests join and leave between decoding steps, each step run on the
batcher's worker thread (so embedding batches and other model work go between steps), each token handed to its
request as soon as it is chosen.

    waiting requests --admit (their prompts read, caches joined)--> running batch --step--> a token per row
                                                                         |  finished, cancelled: leave
A request (`Job`) is one prompt's group of `n` rows. Its client reads `Job.events` (an asyncio queue of
`bertology.generation.Chosen`, then None when it is done); a client that goes away `cancel`s it and its rows leave
at the next step. `stop()` (the service's shutdown, after uvicorn has answered every request in flight) refuses
new jobs, finishes the running and waiting ones, then ends.

`Completion` turns a job's tokens into text for one choice: decoded incrementally, EOS not part of the text, cut
before the first `stop` string, and streamed without ever sending characters that a later token could change (a
possible start of a stop string, an incomplete UTF-8 sequence).
"""

from __future__ import annotations

import asyncio
import collections
import secrets
from dataclasses import dataclass, field
from typing import Any

import torch

from bertology.errors import BertologyError
from bertology.generation import Chosen, Group, RunningBatch, Settings, decode_limit, make_settings
from bertology.model import DECODER_ONLY, GENERATES, capabilities
from bertology.serve.limits import ServiceError

MAX_ROWS = 64  # rows decoded together at most; a request with more rows runs when the batch is empty
MAX_CHOICES = 128  # OpenAI's bound on n
MAX_STOP = 4  # OpenAI's bound on the stop strings
MAX_STOP_CHARS = 256
MAX_LOGPROBS = 5  # OpenAI's bound on the log-probabilities of the legacy completions
# Decoding steps one call on the worker thread runs at most (fewer when other work or a new request waits): a hop
# between the event loop and the worker per step costs more than a small model's step on a loaded CPU.
STEPS_PER_CALL = 16


@dataclass(eq=False)
class Job:
    """One prompt's rows in the running batch, and where its tokens go."""

    prompt: list[int]
    group: Group
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    peak_rows: int = 0  # the most rows it shared a step with (itself included)

    def cancel(self) -> None:
        self.group.cancelled = True


class Decoder:
    """The running batch of one service (see the module docstring). `max_rows`: rows decoded together at most."""

    def __init__(self, batcher: Any, pretrained: Any, observe: Any = None, max_rows: int = MAX_ROWS) -> None:
        self.batcher = batcher
        self.pretrained = pretrained
        self.observe = observe
        self.max_rows = max_rows
        self.missing = missing_generation(pretrained.model)
        self.batch = RunningBatch(pretrained.model) if self.missing is None else None
        self.waiting: collections.deque[Job] = collections.deque()
        self.running: dict[int, Job] = {}
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task | None = None
        self._stopping = False

    @property
    def rows(self) -> int:
        return self.batch.rows if self.batch is not None else 0

    def status(self) -> dict[str, int] | None:
        if self.batch is None:
            return None
        return {"running": len(self.running), "rows": self.rows, "waiting": len(self.waiting)}

    async def start(self) -> None:
        self._wake = asyncio.Event()
        self._stopping = False
        if self.batch is not None:
            self._task = asyncio.create_task(self._loop(), name="bertology-decoder")

    async def stop(self) -> None:
        self._stopping = True
        if self._wake is not None:
            self._wake.set()
        if self._task is not None:
            await self._task
            self._task = None

    def submit(self, prompt: list[int], group: Group, events: asyncio.Queue | None = None) -> Job:
        """Queue `prompt` for `group`; its outcomes (then None, or an exception) go to `events` (one queue may
        gather several jobs of a request)."""
        if self.batch is None:
            raise ServiceError(501, self.missing or "the model cannot generate")
        if self._task is None or self._stopping:
            raise ServiceError(503, "the service is shutting down; generation requests are no longer accepted")
        job = Job(list(prompt), group) if events is None else Job(list(prompt), group, events)
        self.waiting.append(job)
        assert self._wake is not None
        self._wake.set()
        return job

    async def _loop(self) -> None:
        assert self.batch is not None and self._wake is not None
        loop = asyncio.get_running_loop()
        while True:
            if not self.waiting and not len(self.batch):
                if self._stopping:
                    return
                self._wake.clear()
                await self._wake.wait()
                continue
            try:
                await self.batcher.run(self._steps, loop)
            except Exception as error:  # noqa: BLE001 - every running request fails; the loop goes on
                for job in self.running.values():
                    job.events.put_nowait(error)
                self.running.clear()
                self.batch = RunningBatch(self.pretrained.model)

    def _steps(self, loop: asyncio.AbstractEventLoop) -> None:
        """On the worker thread: admit the waiting jobs that fit, then decoding steps, each step's tokens handed
        to the event loop as soon as they are chosen, until the batch is empty, a job waits to join, other work
        waits for the thread, or STEPS_PER_CALL steps have run."""
        assert self.batch is not None
        batch = self.batch
        for _ in range(STEPS_PER_CALL):
            joining: list[Job] = []
            rows = batch.rows
            while self.waiting and (not rows or rows + self.waiting[0].group.rows <= self.max_rows):
                job = self.waiting.popleft()
                if job.group.cancelled:
                    loop.call_soon_threadsafe(job.events.put_nowait, None)
                    continue
                joining.append(job)
                rows += job.group.rows
            if joining:
                try:  # their prompts in one forward
                    batch.add_many([(job.prompt, job.group) for job in joining])
                except Exception:  # noqa: BLE001 - then one by one, so that the error is the request's own
                    for job in joining:
                        try:
                            batch.add(job.prompt, job.group)
                        except Exception as error:  # noqa: BLE001 - answered to that request; the others go on
                            loop.call_soon_threadsafe(job.events.put_nowait, error)
                            continue
                        loop.call_soon_threadsafe(self._admitted, job)
                else:
                    for job in joining:
                        loop.call_soon_threadsafe(self._admitted, job)
            if not len(batch):
                return
            rows = batch.rows
            chosen = batch.step()
            loop.call_soon_threadsafe(self._dispatch, chosen, rows)
            if not len(batch) or self.batcher.others_waiting() or (
                    self.waiting and batch.rows + self.waiting[0].group.rows <= self.max_rows):
                return

    def _admitted(self, job: Job) -> None:
        self.running[id(job.group)] = job

    def _dispatch(self, chosen: list[Chosen], rows: int) -> None:
        """On the event loop: one step's outcomes to their jobs; None to a job that has ended or left."""
        if self.observe is not None and chosen:
            self.observe.decode_step(rows=rows, tokens=sum(sum(c.live) for c in chosen))
        answered = set()
        for outcome in chosen:
            job = self.running.get(id(outcome.group))
            if job is None:
                continue
            answered.add(id(outcome.group))
            job.peak_rows = max(job.peak_rows, rows)
            job.events.put_nowait(outcome)
            if outcome.done:
                job.events.put_nowait(None)
                del self.running[id(outcome.group)]
        for key in [k for k, job in self.running.items() if job.group.cancelled and k not in answered]:
            self.running.pop(key).events.put_nowait(None)  # it left the batch (its client went away)


def missing_generation(model: Any) -> str | None:
    """Why `model` cannot generate (None: it can): it declares no `generates` capability, or lacks the
    language-model head generation reads."""
    from bertology.generation import generation_model

    if GENERATES not in capabilities(model):
        return (f"this model ({type(model).__name__}) cannot generate: it declares no '{GENERATES}' capability "
                "(generation needs a decoder or an encoder-decoder with a language-model head)")
    try:
        generation_model(model)
    except BertologyError as error:
        return f"this model cannot generate: {error}"
    return None


def sampling_settings(config: Any, *, max_new_tokens: int, temperature: float, top_p: float | None,
                      top_k: int | None = None, seed: int | None,
                      device: Any = "cpu") -> tuple[Settings, torch.Generator | None]:
    """`generate`'s settings for greedy decoding (temperature 0) or sampling, and the generator of the draws
    (seeded with `seed`, else with a fresh random seed)."""
    eos = config.eos_token_id
    eos_ids = [eos] if isinstance(eos, int) else list(eos or [])
    pad = config.pad_token_id if config.pad_token_id is not None else (eos_ids[0] if eos_ids else 0)
    if temperature == 0:
        return make_settings(config, max_new_tokens=max_new_tokens, pad_token_id=pad), None
    settings = make_settings(config, max_new_tokens=max_new_tokens, do_sample=True, temperature=temperature,
                             top_p=None if top_p is None or top_p == 1 else top_p, top_k=top_k, seed=seed,
                             pad_token_id=pad)
    generator = torch.Generator(device=device)  # where the model is, as generate's
    generator.manual_seed(seed if seed is not None else secrets.randbits(63))
    return settings, generator


def check_room(model: Any, prompt_tokens: int, max_new_tokens: int, field: str, prompt_field: str) -> None:
    """A 422 (OpenAI's routes: 400) naming the field when the prompt does not fit the model's positions or the generation its decoder."""
    config = model.config
    if prompt_tokens > config.max_length:
        raise ServiceError(422, f"{prompt_field}: {prompt_tokens} tokens; the model reads at most "
                                f"{config.max_length}", field=prompt_field)
    decoded = prompt_tokens if DECODER_ONLY in capabilities(model) else 1
    limit, what = decode_limit(config)
    if decoded + max_new_tokens > limit:
        raise ServiceError(422, f"{field}: {decoded} {'prompt' if decoded == prompt_tokens else 'start'} "
                                f"token(s) + {max_new_tokens} new tokens exceed {what} {limit} positions",
                           field=field)


class Completion:
    """One choice's text from its tokens (see the module docstring)."""

    def __init__(self, tokenizer: Any, stop: list[str], logprobs: int | None) -> None:
        self.tokenizer = tokenizer
        self.stop = stop
        self.ids: list[int] = []
        self.text = ""
        self.sent = 0  # characters streamed so far
        self.finish_reason: str | None = None
        self.tokens = 0  # tokens made for this choice (EOS and the one completing a stop string included)
        self.logprobs = logprobs
        self.token_strings: list[str] = []
        self.token_logprobs: list[float] = []
        self.top_logprobs: list[dict[str, float]] = []
        self.text_offset: list[int] = []
        self.sent_logprobs = 0

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def add(self, outcome: Chosen, row: int, last_step: bool) -> None:
        """The token `outcome` chose for `row` (ignored once this choice has finished)."""
        if self.finished or not outcome.live[row]:
            return
        self.tokens += 1
        token = outcome.tokens[row]
        if self.logprobs is not None and outcome.logprob is not None:
            self.text_offset.append(len(self.text))
            self.token_strings.append(self._piece(token))
            self.token_logprobs.append(outcome.logprob[row])
            if outcome.top is not None:
                self.top_logprobs.append({self._piece(t): v for t, v in outcome.top[row]})
        if outcome.ended[row]:
            self.finish_reason = "stop"
            return
        self.ids.append(token)
        self.text = self.tokenizer.decode(self.ids)
        cut = self._stop_at()
        if cut is not None:
            self.text, self.finish_reason = self.text[:cut], "stop"
        elif last_step:
            self.finish_reason = "length"

    def _piece(self, token: int) -> str:
        """A token's own string in the vocabulary (GPT-2's byte-level "Ġthe"): distinct for distinct ids, where
        decoding a lone byte-level piece may give the same replacement character for many."""
        piece = self.tokenizer.id_to_token(token)
        return piece if piece is not None else str(token)

    def _stop_at(self) -> int | None:
        found = [at for at in (self.text.find(s, max(0, self.sent - len(s))) for s in self.stop) if at >= 0]
        return min(found) if found else None

    def delta(self) -> str:
        """The text not streamed yet that no later token can change."""
        end = len(self.text)
        if not self.finished:
            while end > self.sent and self.text[end - 1] == "\ufffd":  # an incomplete UTF-8 sequence
                end -= 1
            for s in self.stop:  # the longest end of the text that may start a stop string
                for k in range(min(len(s) - 1, end - self.sent), 0, -1):
                    if self.text[end - k:end] == s[:k]:
                        end -= k
                        break
        out = self.text[self.sent:end] if end > self.sent else ""
        self.sent = max(self.sent, end)
        return out

    def logprobs_object(self, streamed: bool = False) -> dict[str, Any] | None:
        if self.logprobs is None:
            return None
        start = self.sent_logprobs if streamed else 0
        self.sent_logprobs = len(self.token_logprobs)
        return {"tokens": self.token_strings[start:], "token_logprobs": self.token_logprobs[start:],
                "top_logprobs": self.top_logprobs[start:] if self.logprobs > 0 else None,
                "text_offset": self.text_offset[start:]}


async def outcomes(jobs: list[Job], events: asyncio.Queue):
    """(job index, outcome) as the jobs sharing `events` get them, until each has ended; an error raises."""
    index = {id(job.group): k for k, job in enumerate(jobs)}
    left = len(jobs)
    while left:
        event = await events.get()
        if event is None:
            left -= 1
        elif isinstance(event, BaseException):
            if isinstance(event, BertologyError):
                raise ServiceError(400, str(event)) from None
            raise event
        else:
            yield index[id(event.group)], event


async def watch_disconnect(receive: Any, jobs: list[Job]) -> None:
    """Cancel `jobs` when the client goes away (the body is read already: the next message is the disconnect)."""
    while True:
        message = await receive()
        if message.get("type") == "http.disconnect":
            for job in jobs:
                job.cancel()
            return
