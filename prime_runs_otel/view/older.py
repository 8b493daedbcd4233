"""Runs stored by an earlier release: their episodes have no facts yet, so
the views the spool keeps (``deliver/spool/views.py``) miss them until their
bodies are read once.

``show`` reads a run's before printing it; ``ui`` reads every such run on a
thread of its own while it serves, and its pages say how far it got. The
reading is the spool's (``Spool.read_stored``): a chunk of episodes per
transaction, so a producer writing the same spool meanwhile waits for one
chunk at most. It changes no run: it fills in what later releases compute
as episodes are stored. The same thread then folds every run's new
episodes into what its pages show (``deliver/spool/folds.py``), the run
written last first, a chunk per transaction as well.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from ..deliver.spool import Spool, SpoolError

__all__ = ["OlderRunsReader", "read_older_episodes"]

logger = logging.getLogger(__name__)

Progress = Callable[[int, int], None]


def read_older_episodes(spool: Spool, run_id: str, progress: Progress | None = None) -> int:
    """Read every episode of ``run_id`` not read yet; returns how many."""
    total = spool.reading.unread_count(run_id)
    done = 0
    while done < total:
        read = spool.reading.read_stored(run_id)
        if not read:
            break
        done += read
        if progress is not None:
            progress(min(done, total), total)
    return done


class OlderRunsReader:
    """Reads every run with unread episodes, one after the other, on a
    daemon thread; :attr:`reading` names the run it is on. Then folds the
    runs' new episodes into what their pages show (``Spool.fold_ahead``),
    so that the first page of a long run does not wait for it."""

    def __init__(self, spool: Spool) -> None:
        self._spool = spool
        self._stopping = threading.Event()
        self._thread = threading.Thread(
            target=self._read_all, name="prime-runs-otel-ui-reader", daemon=True
        )
        self.reading: str | None = None
        self.failed: str | None = None

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        self._thread.join(timeout=10)

    def _read_all(self) -> None:
        try:
            for run_id in self._spool.reading.runs_with_unread():
                self.reading = run_id
                while not self._stopping.is_set() and self._spool.reading.read_stored(run_id):
                    pass
                if self._stopping.is_set():
                    return
            self.reading = None
            self._spool.reading.fold_ahead(self._stopping)
        except SpoolError as exc:
            self.failed = str(exc)
            logger.error("Reading runs stored by an earlier release stopped: %s", exc)
        finally:
            self.reading = None
