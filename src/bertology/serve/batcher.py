"""Dynamic batching for the service: requests that arrive within `max_wait_ms` of the oldest waiting one are
packed, up to `max_batch_tokens` real tokens, into one call of `bertology.embed` (one padding-free forward per
distinct set of options), which runs on one worker thread so the event loop keeps serving.

A request's texts are never split across batches, so its vectors come from one `embed` call with exactly the
semantics of `embed` (windows for long texts included); a request larger than the budget runs alone, in forwards
of at most `max_batch_tokens` real tokens each.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, TypeVar

import numpy as np
import torch

from bertology.device import place
from bertology.embeddings import Embeddings, Pieces, as_backbone, embed, plan_windows
from bertology.embeddings.elmo import MAX_WORDS
from bertology.embeddings.layers import Combine
from bertology.embeddings.result import Level, Pooling, SentencePooling
from bertology.errors import ConfigError
from bertology.model import Pretrained
from bertology.tokenization.words import WORD

T = TypeVar("T")
MAX_WAIT_MS = 10_000.0  # the longest a request may be held for others to join its batch


@dataclass(frozen=True)
class EmbedOptions:
    """The options of one embedding request, as `embed` takes them; requests with equal options share a forward.
    `layers` is a preset name or a tuple of hidden-state indices (hashable)."""

    level: Level = "sentence"
    layers: str | tuple[int, ...] = "last"
    combine: Combine | None = None
    pooling: Pooling = "mean"
    sentence: SentencePooling = "mean"
    # The sentence-vector options of the OpenAI- and TEI-compatible endpoints (`bertology.serve.compat`):
    # unit-norm sentence vectors, texts truncated to `max_length` tokens (None: the batcher's window) rather
    # than embedded in windows, and a sentence-transformers directory's own prompt and lower-casing.
    normalize: bool = False
    long_texts: str = "windows"
    truncation_side: str = "right"
    max_length: int | None = None
    model_settings: bool = False
    prompt_name: str | None = None


@dataclass(frozen=True)
class Cost:
    """What a request's texts cost a forward: real tokens (specials included, summed over windows), windows, and
    the longest window's length."""

    tokens: int
    windows: int
    longest: int
    content: int = 0  # content tokens of the texts, each counted once (what token-level vectors there will be)
    counts: tuple[int, ...] = ()  # each text's content tokens, before any truncation


@dataclass
class _Job:
    texts: list[str]
    options: EmbedOptions
    cost: Cost
    future: asyncio.Future
    arrived: float


class Batcher:
    """Packs concurrent embedding requests into shared forwards of `pretrained`'s encoder.

    `start()` inside the running event loop, then `await embed(texts, options)` from any number of request
    handlers; `await run(fn, ...)` runs other model work (fill-mask) on the same worker thread, so the model is
    used by one thread at a time. `stop()` finishes every request already submitted, then ends the worker.
    `observe` receives the batching measurements (see `bertology.serve.metrics.ServiceMetrics`).
    """

    def __init__(self, pretrained: Pretrained, *, max_batch_tokens: int = 8192, max_wait_ms: float = 5.0,
                 observe: Any = None, device: str | torch.device | None = None, dtype: str = "float32") -> None:
        if pretrained.tokenizer is None:
            raise ConfigError("the model has no tokenizer; the service needs one")
        # A bound, not just a sign: an infinite or huge wait would hold every request (and a SIGTERM drain) forever.
        if isinstance(max_wait_ms, bool) or not isinstance(max_wait_ms, (int, float)) \
                or not 0 <= max_wait_ms <= MAX_WAIT_MS:
            raise ConfigError(f"max_wait_ms must be a finite number of milliseconds from 0 to {MAX_WAIT_MS}, got "
                              f"{max_wait_ms!r}")
        self.pretrained = pretrained
        self.tokenizer = pretrained.tokenizer
        # The model is moved to `device` (None: it stays where it is); the forwards run in `dtype` there.
        self.placement = place(pretrained, device, dtype)
        # embed's own window length and default stride for this model, read from embed itself on an empty text.
        probe = embed(pretrained, [""], levels=("sentence",), model_settings=False, dtype=self.placement.dtype)
        self.window_length, self.stride = probe.window_length, probe.stride
        self.dim = probe.dim  # the width of a sentence vector of the last layer
        backbone = as_backbone(pretrained, None)
        self.specials = len(backbone.frame([]).ids)  # the specials around every window
        # ELMo reads words: its backbone splits them (the model's tokenizer is its softmax's word list).
        self.reads_words = bool(getattr(backbone, "reads_words", False))
        if isinstance(max_batch_tokens, bool) or not isinstance(max_batch_tokens, int):
            raise ConfigError(f"max_batch_tokens must be an integer, got {max_batch_tokens!r}")
        # A model without a position limit (ELMo's LSTMs: a window of 65,536 words; T5's and XLNet's relative
        # positions: 2**30) has a window that is only a bound: the service's windows are then the budget's.
        if backbone.max_length >= MAX_WORDS and self.specials < max_batch_tokens < self.window_length:
            probe = embed(pretrained, [""], levels=("sentence",), max_length=max_batch_tokens,
                          model_settings=False, dtype=self.placement.dtype)
            self.window_length, self.stride = probe.window_length, probe.stride
        if max_batch_tokens < self.window_length:
            raise ConfigError(f"max_batch_tokens must be an integer of at least the model's window of "
                              f"{self.window_length} tokens, got {max_batch_tokens!r}")
        self.max_batch_tokens = max_batch_tokens
        self.max_wait = max_wait_ms / 1000.0
        self.observe = observe
        self._pending: collections.deque[_Job] = collections.deque()
        self._queued = 0  # calls of `run` submitted and not started yet
        self._queued_lock = threading.Lock()
        self._arrived: asyncio.Event | None = None
        self._stopping = False
        self._loop_task: asyncio.Task | None = None
        self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="bertology-encoder")

    # ------------------------------------------------------------------------------------------------ public

    def cost(self, texts: Sequence[str], truncate_to: int | None = None) -> Cost:
        """Real tokens, windows and longest window of `texts` under embed's windowing (tokenises them); with
        `truncate_to`, each text is cut to its first tokens, `truncate_to` with the specials, in one window."""
        capacity = self.window_length - self.specials if truncate_to is None else truncate_to - self.specials
        tokens = windows = longest = content = 0
        counts = []
        for text in texts:
            n = (len(WORD.findall(text)) if self.reads_words  # the words ELMo's backbone splits, one token each
                 else len(self.tokenizer.encode(text, add_special_tokens=False).ids))
            counts.append(n)
            if truncate_to is not None:
                n = min(n, capacity)
            content += n
            for start, stop in plan_windows(n, capacity, self.stride if truncate_to is None else capacity):
                length = stop - start + self.specials
                tokens += length
                windows += 1
                longest = max(longest, length)
        return Cost(tokens, windows, longest, content, tuple(counts))

    async def start(self) -> None:
        self._arrived = asyncio.Event()
        self._stopping = False
        self._loop_task = asyncio.create_task(self._batch_loop(), name="bertology-batcher")

    async def stop(self) -> None:
        """Finish every submitted request, then end the batching task and the worker thread."""
        self._stopping = True
        if self._arrived is not None:
            self._arrived.set()
        if self._loop_task is not None:
            await self._loop_task
            self._loop_task = None
        self._executor.shutdown(wait=True)

    async def embed(self, texts: list[str], options: EmbedOptions, cost: Cost | None = None) -> Embeddings:
        """`embed(pretrained, texts, ...)` with `options`, batched with other requests."""
        if self._loop_task is None or self._stopping:
            raise RuntimeError("the batcher is not running")
        if cost is None:
            cost = await asyncio.to_thread(self.cost, texts)
        future = asyncio.get_running_loop().create_future()
        self._pending.append(_Job(texts, options, cost, future, time.perf_counter()))
        self._arrived.set()
        return await future

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """Run `fn(*args)` on the encoder's worker thread (between batches), under the model's autocast there."""
        with self._queued_lock:
            self._queued += 1
        return await asyncio.get_running_loop().run_in_executor(self._executor, self._started, fn, *args)

    def others_waiting(self) -> bool:
        """Whether other work waits for the worker thread: embedding requests queued, or calls of `run` not
        started yet (the generation loop, which runs several decoding steps per call, yields to them)."""
        return bool(self._pending) or self._queued > 0

    def _started(self, fn: Callable[..., T], *args: Any) -> T:
        with self._queued_lock:
            self._queued -= 1
        return self._placed(fn, *args)

    # ------------------------------------------------------------------------------------------------ internals

    async def _batch_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            while not self._pending:
                if self._stopping:
                    return
                self._arrived.clear()
                await self._arrived.wait()
            deadline = self._pending[0].arrived + self.max_wait
            # Wait for more requests until the oldest has waited max_wait or the budget is full.
            while not self._stopping and not self._budget_full():
                remaining = deadline - time.perf_counter()
                if remaining <= 0:
                    break
                self._arrived.clear()
                try:
                    await asyncio.wait_for(self._arrived.wait(), remaining)
                except asyncio.TimeoutError:
                    break
            batch = self._take()
            started = time.perf_counter()
            try:
                outcomes = await loop.run_in_executor(self._executor, self._forward, batch)
            except Exception as error:  # noqa: BLE001 - answer this batch's requests; the loop must go on
                outcomes = [error] * len(batch)
            finished = time.perf_counter()
            if self.observe is not None:
                self.observe.batch(requests=len(batch), texts=sum(len(job.texts) for job in batch),
                                   tokens=sum(job.cost.tokens for job in batch), seconds=finished - started,
                                   waits=[started - job.arrived for job in batch])
            for job, outcome in zip(batch, outcomes):
                if job.future.done():  # the client went away
                    continue
                if isinstance(outcome, BaseException):
                    job.future.set_exception(outcome)
                else:
                    job.future.set_result(outcome)

    def _placed(self, fn: Callable[..., T], *args: Any) -> T:
        with self.placement.autocast():  # autocast is per thread: entered on the worker itself
            return fn(*args)

    def _budget_full(self) -> bool:
        total = 0
        for job in self._pending:
            total += job.cost.tokens
            if total >= self.max_batch_tokens:
                return True
        return False

    def _take(self) -> list[_Job]:
        """The oldest requests whose tokens fit the budget together (at least one)."""
        batch = [self._pending.popleft()]
        total = batch[0].cost.tokens
        while self._pending and total + self._pending[0].cost.tokens <= self.max_batch_tokens:
            job = self._pending.popleft()
            batch.append(job)
            total += job.cost.tokens
        return batch

    def _forward(self, batch: list[_Job]) -> list[Embeddings | BaseException]:
        """One `embed` call per distinct set of options (in the worker thread); each job gets its own slice."""
        groups: dict[EmbedOptions, list[int]] = {}
        for i, job in enumerate(batch):
            groups.setdefault(job.options, []).append(i)
        outcomes: list[Embeddings | BaseException] = [RuntimeError("not run")] * len(batch)
        for options, members in groups.items():
            jobs = [batch[i] for i in members]
            texts = [text for job in jobs for text in job.texts]
            tokens = sum(job.cost.tokens for job in jobs)
            windows = sum(job.cost.windows for job in jobs)
            longest = max(job.cost.longest for job in jobs)
            # All windows in one forward when they fit the budget; otherwise forwards of at most the budget.
            batch_size = max(1, windows if tokens <= self.max_batch_tokens else self.max_batch_tokens // longest)
            layers = list(options.layers) if isinstance(options.layers, tuple) else options.layers
            try:
                result = embed(self.pretrained, texts, layers=layers, combine=options.combine,
                               pooling=options.pooling, sentence=options.sentence, levels=(options.level,),
                               batch_size=batch_size, long_texts=options.long_texts,
                               truncation_side=options.truncation_side,
                               model_settings=options.model_settings, normalize=options.normalize,
                               prompt_name=options.prompt_name,
                               max_length=options.max_length or self.window_length, dtype=self.placement.dtype)
            except Exception as error:  # noqa: BLE001 - handed to the requests of this group
                for i in members:
                    outcomes[i] = error
                continue
            start = 0
            for i, job in zip(members, jobs):
                outcomes[i] = slice_embeddings(result, start, start + len(job.texts))
                start += len(job.texts)
        return outcomes


def slice_embeddings(result: Embeddings, start: int, stop: int) -> Embeddings:
    """The part of `result` that belongs to texts start:stop, as `embed` would return it for those texts alone."""

    def part(pieces: Pieces | None) -> Pieces | None:
        if pieces is None:
            return None
        lo, hi = int(pieces.bounds[start]), int(pieces.bounds[stop])
        return Pieces(
            vectors=pieces.vectors[lo:hi],
            text_index=pieces.text_index[lo:hi] - start,
            index=pieces.index[lo:hi],
            word_index=pieces.word_index[lo:hi],
            start=pieces.start[lo:hi],
            end=pieces.end[lo:hi],
            strings=pieces.strings[lo:hi],
            ids=None if pieces.ids is None else pieces.ids[lo:hi],
            bounds=pieces.bounds[start: stop + 1] - lo,
        )

    sentences = None if result.sentences is None else np.ascontiguousarray(result.sentences[start:stop])
    return replace(result, texts=result.texts[start:stop], sentences=sentences, tokens=part(result.tokens),
                   words=part(result.words))
