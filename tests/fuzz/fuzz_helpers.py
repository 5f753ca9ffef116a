"""The fuzz suite's shared pieces: damaged copies of a valid file (truncated, bit-flipped, bytes spliced in, a
length field inflated, or random bytes), the check that a call ends normally or with bertology's own error, a
memory bound, and a count of the inputs each reader was given."""

from __future__ import annotations

import collections
import contextlib
import resource
import struct

from hypothesis import strategies as st

TRIED: collections.Counter = collections.Counter()


@st.composite
def damaged(draw, valid: bytes, header: int = 4096) -> bytes:
    """A damaged copy of `valid`. `header`: where length fields may sit (an inflated int32 or int64 is written at
    a random offset below it)."""
    kind = draw(st.sampled_from(("truncate", "flip", "splice", "inflate", "random", "empty")))
    data = bytearray(valid)
    if kind == "truncate" and data:
        return bytes(data[:draw(st.integers(0, len(data) - 1))])
    if kind == "flip" and data:
        for _ in range(draw(st.integers(1, 8))):
            i = draw(st.integers(0, len(data) - 1))
            data[i] ^= 1 << draw(st.integers(0, 7))
        return bytes(data)
    if kind == "splice":
        i = draw(st.integers(0, len(data)))
        return bytes(data[:i]) + draw(st.binary(min_size=1, max_size=64)) + bytes(data[i:])
    if kind == "inflate" and len(data) >= 8:
        i = draw(st.integers(0, max(0, min(header, len(data)) - 8)))
        value = draw(st.one_of(st.integers(2 ** 31, 2 ** 62), st.integers(-2 ** 40, -1), st.integers(0, 2 ** 20)))
        wide = draw(st.booleans())
        data[i:i + (8 if wide else 4)] = struct.pack("<q" if wide else "<i", value if wide else
                                                     max(-2 ** 31, min(2 ** 31 - 1, value)))
        return bytes(data)
    if kind == "empty":
        return b""
    return draw(st.binary(max_size=512))


def only_our_errors(name: str, call, *, names: str | tuple[str, ...] | None = None):
    """Call `call()`; it may return or raise a BertologyError (whose message names one of `names`, when given:
    the file, or the directory it belongs to), nothing else. Counts the input under `name`."""
    from bertology.errors import BertologyError

    TRIED[name] += 1
    try:
        return call()
    except BertologyError as error:
        if names is not None:
            wanted = (names,) if isinstance(names, str) else names
            assert any(w in str(error) for w in wanted), f"{name}: the error names none of {wanted}: {error}"
        return error


@contextlib.contextmanager
def bounded_memory(limit_mb: int = 1024):
    """The process's peak memory grows by less than `limit_mb` inside the block (no allocation of what a damaged
    length field claims)."""
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    yield
    grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert grown < limit_mb, f"peak memory grew by {grown:.0f} MB"
