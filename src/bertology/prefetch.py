"""One background-thread prefetcher, for the training loop's batches and the corpus reader."""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from typing import Any, TypeVar

T = TypeVar("T")


def prefetched(items: Iterator[T], depth: int = 2, name: str = "prefetch") -> Iterator[T]:
    """Yield ``items`` produced by a background thread up to ``depth`` ahead, so that producing (Python, or Rust
    that releases the GIL) overlaps consuming. A producer error is re-raised in the consumer; closing the generator
    stops the producer and joins it (a thread left running inside torch at interpreter exit aborts the process)."""
    slots: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def put(entry: tuple[bool, Any]) -> bool:
        while not stop.is_set():
            try:
                slots.put(entry, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        try:
            for item in items:
                if not put((True, item)):
                    return
            put((False, None))
        except BaseException as error:  # handed to the consumer, which re-raises it
            put((False, error))

    thread = threading.Thread(target=produce, name=name, daemon=True)
    thread.start()
    try:
        while True:
            more, value = slots.get()
            if not more:
                if value is not None:
                    raise value
                return
            yield value
    finally:
        stop.set()
        thread.join()
