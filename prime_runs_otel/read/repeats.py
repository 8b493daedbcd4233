"""One log line per window for a problem that repeats, not one per copy.

Spans reach ``serve`` from collectors that retry and duplicate, and from
anyone who can reach its port: 2,000 copies of one damaged episode span are
2,000 identical problems. Each is still counted where it is counted (the
run's ``corrupt``, ``/metrics``); the log is for a person, who learns
nothing from the second copy that the first did not say and loses the lines
around them. So the first occurrence of a kind is logged in full, as it
always was, and the ones after it within :attr:`RepeatedLines.interval` are
counted and summed up in one line ("N more like it in the last M s") when
the window closes (:meth:`RepeatedLines.flush`, called between requests and
at shutdown) or when the next one arrives after it.

A kind is what the problem is and which run it hit, so two runs' problems
are both named; past :data:`MAX_KINDS` open windows (a client that makes up
a run key per span) the rest share one window per problem, and the log stays
bounded whatever arrives.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["MAX_KINDS", "RepeatedLines"]

#: Open windows kept apart by run; past this, a problem's further runs share one.
MAX_KINDS = 256


@dataclass
class _Window:
    opened: float
    label: str
    level: int
    more: int = 0


class RepeatedLines:
    """Logs the first problem of a kind in full, then at most one summary
    line per :attr:`interval` for the copies that followed it."""

    def __init__(
        self,
        logger: logging.Logger,
        interval: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.logger = logger
        self.interval = interval
        self._clock = clock
        self._open: dict[tuple[str, str], _Window] = {}

    def log(self, level: int, problem: str, run: str, message: str, *args: object) -> None:
        """Log ``message % args`` unless a problem of the same kind (``problem``
        on run ``run``) was logged within the interval; then count it.
        ``problem`` names the kind in the summary line, after the run."""
        now = self._clock()
        key = (problem, run)
        if key not in self._open and len(self._open) >= MAX_KINDS:
            key = (problem, "")
        window = self._open.get(key)
        if window is not None and now - window.opened >= self.interval:
            self._close(key, now)
            window = None
        if window is not None:
            window.more += 1
            return
        label = f"Run {run}: {problem}" if key[1] else f"Other runs: {problem}"
        self._open[key] = _Window(now, label, level)
        self.logger.log(level, message, *args)

    def flush(self, *, everything: bool = False) -> None:
        """Sum up the windows that closed (``everything``: all of them, the
        process is stopping), so no count waits for a next occurrence."""
        now = self._clock()
        for key, window in list(self._open.items()):
            if everything or now - window.opened >= self.interval:
                self._close(key, now)

    def _close(self, key: tuple[str, str], now: float) -> None:
        window = self._open.pop(key)
        if window.more:
            self.logger.log(
                window.level,
                "%s: %d more like it in the last %.0f s, each counted on its run",
                window.label,
                window.more,
                max(1.0, now - window.opened),
            )
