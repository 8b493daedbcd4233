"""The retry policy: how long a run waits after a failure that may succeed later.

Failures that may pass (an outage, 429, 503) pause only the run they hit,
with exponential backoff and jitter, honouring the server's Retry-After, for
as long as it takes: no retry budget runs out, so a run is never given up
because the platform was away. Whatever raises :class:`Backoff` (a request
refused for now, a missing credential) asks for such a pause; this module
decides its length and says so in the log, and the delivery loop skips the run
until it is due again.
"""

from __future__ import annotations

import logging
import random
import time

from .._text import shown
from .platform.http import PlatformError
from .spool import RunRow

logger = logging.getLogger(__name__)

BACKOFF_BASE = 0.5
#: A server's Retry-After is obeyed even past the backoff cap (the server
#: knows when it will take work again), up to this bound against a bogus value.
RETRY_AFTER_CAP = 60.0


class Backoff(Exception):
    """Pause this run; try again after ``delay`` seconds."""

    def __init__(self, cause: PlatformError, delay: float | None = None) -> None:
        super().__init__(str(cause))
        self.cause = cause
        self.delay = delay


class Pauses:
    """Which runs wait, until when, and after how many failed attempts in a row.

    Kept in memory: a process that starts over tries every run at once, which
    is what a restart is for.
    """

    def __init__(self, max_delay: float) -> None:
        """``max_delay`` caps the backoff (the ``retry_max_delay`` setting)."""
        self._max_delay = max_delay
        self._not_before: dict[str, float] = {}
        self._failures: dict[str, int] = {}

    def waiting(self, run_id: str) -> bool:
        """Whether the run is paused still."""
        return time.monotonic() < self._not_before.get(run_id, 0.0)

    def failures(self, run_id: str) -> int:
        """Failed attempts in a row so far."""
        return self._failures.get(run_id, 0)

    def clear(self, run_id: str) -> None:
        """The run got through: its next failure starts the backoff over."""
        self._failures.pop(run_id, None)
        self._not_before.pop(run_id, None)

    def pause(self, run: RunRow, pause: Backoff) -> None:
        failures = self._failures.get(run.local_id, 0) + 1
        self._failures[run.local_id] = failures
        delay = self._delay(pause, failures)
        self._not_before[run.local_id] = time.monotonic() + delay
        level = logging.WARNING if failures in (1, 5) or failures % 50 == 0 else logging.DEBUG
        logger.log(
            level,
            "Run %s: delivery paused for %.1fs after %d failed attempt(s): %s. "
            "Nothing is dropped; it resumes by itself.",
            shown(run.local_id),
            delay,
            failures,
            pause.cause,
        )

    def _delay(self, pause: Backoff, failures: int) -> float:
        cap = max(self._max_delay, 0.0)
        if pause.delay is not None:
            return min(pause.delay, cap)
        if pause.cause.retry_after is not None:
            return min(max(pause.cause.retry_after, 0.0), max(RETRY_AFTER_CAP, cap))
        backoff = min(cap, BACKOFF_BASE * 2 ** min(failures - 1, 20))
        delay: float = min(backoff * (0.5 + random.random()), cap)
        return delay
