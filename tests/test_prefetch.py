"""The background prefetcher: items in order, producer errors re-raised in the consumer, closing joins the thread."""

from __future__ import annotations

import threading

import pytest

from bertology.errors import DataError
from bertology.prefetch import prefetched


def test_prefetched_keeps_order_reraises_and_stops() -> None:
    def numbers():
        yield from range(3)
        raise DataError("boom at line 4")

    reader = prefetched(numbers(), name="test-reader")
    assert [next(reader) for _ in range(3)] == [0, 1, 2]
    with pytest.raises(DataError, match="boom at line 4"):
        next(reader)
    endless = prefetched(iter(range(10**9)), depth=3, name="test-endless")
    assert [next(endless) for _ in range(5)] == [0, 1, 2, 3, 4]
    endless.close()  # the producer is told to stop and joined
    assert not any(t.name.startswith("test-") and t.is_alive() for t in threading.enumerate())
    assert list(prefetched(iter([]))) == []
