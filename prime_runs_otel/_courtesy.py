"""Giving the GIL to ``export()`` while it runs, and only then; and a fleet
member's delivery standing back for its request threads on the cores.

Python's sqlite3 lets go of the GIL on every statement, and a thread that
wants it back waits until the thread holding it gives it up: at the latest
after the switch interval (5 ms), when that thread computes and never blocks.
A run's producer thread and its uploader compute for long stretches, so an
``export()`` of a dozen statements would wait a dozen switch intervals
behind them: its p99 was 290 ms. Giving the GIL up once per episode
(``time.sleep(0)``) brings it under 25 ms, but a switch costs CPU on every
side: done for every episode, it was a fifth of the process's CPU. So the
export raises a flag while it runs, and the others give the GIL up once per
episode only while the flag is up.

``serve`` has no such flag: its intake threads commit at any moment. There
the uploader gives the GIL up at most once a millisecond
(:class:`PacedGiveWay`): a commit waits about a millisecond behind it, not a
switch interval, and the uploader is not starved in turn. Given up once per
episode, every return to the uploader waited for a busy intake thread's full
switch interval, and delivery fell behind the intake (serve fed by four
senders: the run closed 0.65-0.89 s after its last request, 0.43-0.50 s
paced).

A ``serve --kafka`` member answers a request once the brokers have its
records; its delivery (the consumer loop reading records into the spool,
the uploader) can wait. On cores it shares with the brokers and others,
the request threads and librdkafka's threads waited for a core behind that
delivery, so the delivery threads lower their own CPU priority
(:func:`stand_back`): they still take every core left idle.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["ExportRunning", "PacedGiveWay", "stand_back"]

logger = logging.getLogger(__name__)

#: How much lower a fleet member's delivery threads run than its request
#: threads: ``nice`` 10 above them, about a tenth of their CPU share when
#: both wait for a core.
STAND_BACK_NICENESS = 10


def stand_back() -> None:
    """Lower the calling thread's CPU priority by :data:`STAND_BACK_NICENESS`
    (threads it starts inherit it). Linux only: there a thread has a
    priority of its own, elsewhere it is the whole process's; where the
    system refuses, the thread runs on as it was."""
    if sys.platform != "linux":
        return
    thread = threading.get_native_id()
    try:
        niceness = os.getpriority(os.PRIO_PROCESS, thread) + STAND_BACK_NICENESS
        os.setpriority(os.PRIO_PROCESS, thread, min(niceness, 19))
    except OSError as exc:
        logger.debug("Could not lower thread %d's CPU priority: %s", thread, exc)


class ExportRunning:
    """Up while an ``export()`` runs; :meth:`give_way` yields the GIL then."""

    __slots__ = ("_lock", "_running")

    def __init__(self) -> None:
        self._running = 0
        self._lock = threading.Lock()

    @contextmanager
    def up(self) -> Iterator[None]:
        """Raise the flag for the length of the block (exports may overlap)."""
        with self._lock:
            self._running += 1
        try:
            yield
        finally:
            with self._lock:
                self._running -= 1

    def give_way(self) -> None:
        """Let a running export have the GIL; nothing when none runs."""
        if self._running:
            time.sleep(0)

    def after_fork(self) -> None:
        """In a forked child no export runs, and the lock may be held."""
        self._lock = threading.Lock()
        self._running = 0


class PacedGiveWay:
    """Yields the GIL when at least ``interval`` seconds passed since it last
    did; for the one thread that calls it (the uploader's)."""

    __slots__ = ("_interval", "_last")

    def __init__(self, interval: float = 0.001) -> None:
        self._interval = interval
        self._last = 0.0

    def __call__(self) -> None:
        now = time.perf_counter()
        if now - self._last >= self._interval:
            self._last = now
            time.sleep(0)
