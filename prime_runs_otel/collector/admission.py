"""How many export calls each front takes at once, how the rest are told to
come back, and a log that says so without flooding.

A collector sends as many calls at once as it has queue consumers (40 is not
unusual). ``serve`` decodes and commits ``--workers`` of them at a time; a
few more may wait their turn, the rest are refused at once with an answer
every OTLP client retries: 503 with ``Retry-After`` over HTTP, ``UNAVAILABLE``
with ``RetryInfo`` over gRPC (the OTLP specification's throttling answers).
``RESOURCE_EXHAUSTED`` without ``RetryInfo``, what grpcio's own limit sends,
is permanent by that specification: the collector drops the batch.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

logger = logging.getLogger(__name__)

#: Export calls admitted per worker: one being decoded and committed, the
#: others waiting their turn (each front counts its own).
CALLS_PER_WORKER = 4
#: The retry hint of an overload refusal: a worker frees up within about a
#: commit, so a second is long enough and short enough.
OVERLOAD_RETRY_AFTER = 1


def admitted_calls(workers: int) -> int:
    """Export calls one front takes at once for ``workers`` workers."""
    return workers * CALLS_PER_WORKER


def overload_message(limit: int) -> str:
    return (
        f"serve is taking {limit} export calls at once (--workers x {CALLS_PER_WORKER}); "
        f"retry in {OVERLOAD_RETRY_AFTER}s, or give the collector at most {limit} queue "
        "consumers (sending_queue.num_consumers)"
    )


class QuietLog:
    """One log line per ``interval`` seconds for a condition that may repeat
    thousands of times a second (refused calls, a full descriptor table),
    with the count of what happened since the last line."""

    def __init__(
        self,
        log: Callable[[int], None],
        interval: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._log = log
        self._interval = interval
        self._clock = clock
        self._lock = threading.Lock()
        self._count = 0
        self._next = 0.0

    def happened(self) -> None:
        with self._lock:
            self._count += 1
            now = self._clock()
            if now < self._next:
                return
            count, self._count = self._count, 0
            self._next = now + self._interval
        self._log(count)


def overload_log(front: str, limit: int) -> QuietLog:
    """The log of one front's overload refusals."""

    def log(count: int) -> None:
        logger.warning(
            "%s: refused %d export call(s) past the %d taken at once; the client retries "
            "them (more consumers than that in a collector only adds refusals)",
            front,
            count,
            limit,
        )

    return QuietLog(log)
