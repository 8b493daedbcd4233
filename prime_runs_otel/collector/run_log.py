"""The runs ``serve`` opens and closes, in its log: the operator of a
collector deployment sees runs come and go without querying anything.

Beside the receiver rather than in it: it reads the spool on a timer of its
own, so it sees every run whichever front its spans came through, and a
failure to read never touches what the receiver answers.
"""

from __future__ import annotations

import logging
import threading
import time

from ..config import Settings
from ..deliver.spool import RunRow, Spool

logger = logging.getLogger(__name__)

#: Seconds each look reaches back before the previous one: a run updated
#: while that look was reading (or by a clock a little behind) is read again
#: rather than missed; reading it twice only finds its state unchanged.
_OVERLAP = 2.0


class RunWatcher:
    """Logs each run ``serve`` opens and closes, read from the spool: the
    operator of a collector deployment sees runs come and go without
    querying anything.

    Each look reads only the runs changed since the one before (the first
    reads them all, quietly): with twenty thousand open runs, reading every
    row each second took most of a core while nothing happened.
    """

    def __init__(self, settings: Settings, interval: float = 1.0) -> None:
        self._settings = settings
        self._interval = interval
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._known: dict[str, str] = {}
        self._spool: Spool | None = None
        #: Epoch seconds from which the next look reads runs (0: all of them).
        self._since = 0.0

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="serve-run-watcher", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5.0)
        self.poll()
        if self._spool is not None:
            self._spool.close()
            self._spool = None

    def _loop(self) -> None:
        first = True
        while not self._stop.is_set():
            self.poll(quiet=first)
            first = False
            self._stop.wait(self._interval)

    def poll(self, *, quiet: bool = False) -> None:
        """One look at the spool; ``quiet`` records what exists without logging it."""
        path = self._settings.spool_path
        if not path.exists():
            return
        started = time.time()
        try:
            if self._spool is None:
                self._spool = Spool(path, max_bytes=self._settings.spool_max_bytes)
            rows = self._spool.reading.runs_changed_since(self._since)
        except Exception as exc:  # watching must never take serve down
            logger.debug("reading the spool for the run log failed: %s", exc)
            return
        self._since = started - _OVERLAP
        for row in rows:
            self._see(row, quiet)

    def _see(self, row: RunRow, quiet: bool) -> None:
        state = "closed" if row.settled or row.stopped else "open"
        before = self._known.get(row.local_id)
        self._known[row.local_id] = state
        if quiet or before == state:
            return
        if before is None:
            logger.info(
                "run %s opened: %s (%s, %s)",
                row.local_id,
                row.name or "unnamed",
                row.kind,
                ", ".join(row.identity.environments) or "no environment",
            )
        if state == "closed":
            logger.info(
                "run %s closed: %s, %d episode(s)%s",
                row.local_id,
                row.end_status or "stopped",
                row.episodes,
                f" — {row.last_error}" if row.stopped and row.last_error else "",
            )
