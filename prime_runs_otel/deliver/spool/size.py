"""The spool's size cap: how big the file is, and saying so before and
when the cap refuses episodes (the refusals themselves are counted where
episodes are stored, in ``ingest``).

Bodies of delivered episodes kept for the local store
(``PRIME_RUNS_OTEL_KEEP_DELIVERED``) are the first to go at the cap: the
platform has them, so the oldest of them make room before a new episode,
whose only copy would be lost, is refused.
"""

from __future__ import annotations

import logging
import os
import sqlite3
from contextlib import suppress

from .core import SpoolCore
from .rows import chunks

logger = logging.getLogger(__name__)

#: Warn once the spool passes this share of its cap.
WARN_FRACTION = 0.8


class SpoolSize(SpoolCore):
    def size_bytes(self) -> int:
        total = 0
        for suffix in ("", "-wal"):
            with suppress(OSError):
                total += os.path.getsize(f"{self.path}{suffix}")
        return total

    def used_bytes(self) -> int:
        """The file's size less its free pages (left by dropped bodies, and
        reused before the file grows): what counts against the cap."""
        with suppress(sqlite3.Error):
            rows = self._query("PRAGMA freelist_count")
            free = int(rows[0][0]) * int(self._query("PRAGMA page_size")[0][0])
            return max(0, self.size_bytes() - free)
        return self.size_bytes()

    def _make_room(self, db: sqlite3.Connection, size: int, needed: int) -> int:
        """Drop the kept bodies of delivered episodes, oldest first, until
        ``needed`` bytes are free or none is left; returns the size after."""
        freed = dropped = 0
        while freed < needed:
            rows = db.execute(
                "SELECT r.seq, e.size FROM records r JOIN episodes e ON e.seq = r.seq "
                "WHERE e.state = 'delivered' ORDER BY r.seq LIMIT 1000"
            ).fetchall()
            if not rows:
                break
            taken = []
            for seq, body_size in rows:
                taken.append(seq)
                freed += body_size
                if freed >= needed:
                    break
            for chunk in chunks(taken):
                marks = ", ".join("?" * len(chunk))
                db.execute(f"DELETE FROM records WHERE seq IN ({marks})", list(chunk))
            dropped += len(taken)
        if dropped:
            logger.warning(
                "The spool %s reached its %d-byte cap: the kept bodies of %d delivered "
                "episode(s) were dropped to make room (the platform has them; `prime-runs-otel "
                "prune` frees space ahead of time)",
                self.path,
                self.max_bytes,
                dropped,
            )
        return max(0, size - freed)

    def _warn_near_cap(self, size: int) -> None:
        if size < WARN_FRACTION * self.max_bytes or self._warned_full:
            return
        self._warned_full = True
        logger.warning(
            "The spool %s is at %.0f%% of its %d-byte cap. Episodes are refused (and "
            "counted) at the cap: check that delivery is progressing "
            "(`prime-runs-otel runs`) or raise PRIME_RUNS_OTEL_SPOOL_MAX_BYTES.",
            self.path,
            100.0 * min(size, self.max_bytes) / self.max_bytes,
            self.max_bytes,
        )

    def _report_refused(self, rejected: int) -> None:
        if not rejected:
            return
        logger.error(
            "The spool %s is full (cap %d bytes): %d episode(s) refused. They are counted "
            "on their run; free space by delivering (`prime-runs-otel push`) or raise "
            "PRIME_RUNS_OTEL_SPOOL_MAX_BYTES.",
            self.path,
            self.max_bytes,
            rejected,
        )
