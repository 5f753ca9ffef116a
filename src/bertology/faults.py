"""Fault points: named moments at which a test can have the process killed, to check that a killed run recovers.

Code marks a moment with ``point("phase", "target")`` (the point's name is ``phase:target``, e.g.
``dir-renamed:step-0000004``). Nothing happens unless the environment variable ``BERTOLOGY_FAULT`` names the point:

* ``BERTOLOGY_FAULT=dir-renamed:step-0000004``: the process SIGKILLs itself the first time it reaches the point;
* ``BERTOLOGY_FAULT=write-written:tokenizer.json@3``: ... the third time.

``BERTOLOGY_FAULT_LOG=FILE`` appends the name of every point reached, a line each (to list the points a run passes,
e.g. to kill a run at each of them in turn).

Both variables are read once, at import; with neither set, ``point`` returns at once and builds no string.
"""

from __future__ import annotations

import os
import signal

ENV = "BERTOLOGY_FAULT"
LOG_ENV = "BERTOLOGY_FAULT_LOG"


def _parse(spec: str | None) -> tuple[str, int] | None:
    if not spec:
        return None
    name, sep, count = spec.rpartition("@")
    if sep and count.isdigit() and name:
        return name, max(int(count), 1)
    return spec, 1


_TARGET = _parse(os.environ.get(ENV))
_LOG = os.environ.get(LOG_ENV) or None
ACTIVE = _TARGET is not None or _LOG is not None
_hits: dict[str, int] = {}


def point(phase: str, target: str = "") -> None:
    """Mark the moment ``phase:target``; kill the process here if ``BERTOLOGY_FAULT`` says so."""
    if not ACTIVE:
        return
    name = f"{phase}:{target}" if target else phase
    if _LOG is not None:
        with open(_LOG, "a", encoding="utf-8") as handle:
            handle.write(name + "\n")
    if _TARGET is None or _TARGET[0] != name:
        return
    _hits[name] = _hits.get(name, 0) + 1
    if _hits[name] == _TARGET[1]:
        kill()


def kill() -> None:
    """Die at once, as a power cut or the OOM killer would do: no cleanup, no ``finally``, no buffered output."""
    sigkill = getattr(signal, "SIGKILL", None)
    if sigkill is not None:
        os.kill(os.getpid(), sigkill)
    os._exit(137)  # pragma: no cover - where there is no SIGKILL
