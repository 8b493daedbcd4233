"""What ``ingest`` does at the spool's limits (see ``size.py``): make room
at the cap with the kept bodies of delivered episodes, warn as the cap
nears, and say why episodes were refused. Only ``ingest`` asks, inside its
transaction, so these are its own share and no facet's question."""

from __future__ import annotations

import logging
import sqlite3

from .part import SpoolPart
from .size import STOPPED_SHARE, WARN_FRACTION, drop_kept_bodies_in

logger = logging.getLogger(__name__)


class IngestCap(SpoolPart):
    """The cap as ``ingest`` meets it."""

    def _make_room(self, db: sqlite3.Connection, needed: int) -> int:
        """At the cap (inside ``ingest``'s transaction): drop the kept bodies
        of delivered episodes, oldest first, until ``needed`` bytes are free
        or none is left; returns the bytes freed."""
        dropped, freed = drop_kept_bodies_in(db, needed)
        if dropped:
            logger.warning(
                "The spool %s reached its %d-byte cap: the kept bodies of %d delivered "
                "episode(s) were dropped to make room (the platform has them; `prime-runs-otel "
                "prune` frees space ahead of time)",
                self.path,
                self.max_bytes,
                dropped,
            )
        return freed

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

    def _report_refused(
        self, rejected: int, *, disk_full: bool = False, stopped: bool = False
    ) -> None:
        if not rejected:
            return
        if stopped:
            logger.error(
                "%d episode(s) of runs whose delivery stopped were refused: such runs may hold "
                "%.0f%% of the spool's cap together, so that they cannot take the room the "
                "others need. They are counted on their run; fix the cause and deliver them "
                "(`prime-runs-otel show RUN` says what to do), or remove them (`rm`).",
                rejected,
                100 * STOPPED_SHARE,
            )
            return
        if disk_full:
            logger.error(
                "The disk holding the spool %s is full: %d episode(s) refused. They are "
                "counted on their run; free space on the disk (delivery frees what it "
                "delivers) or move PRIME_RUNS_OTEL_DIR to a larger disk.",
                self.path,
                rejected,
            )
            return
        logger.error(
            "The spool %s is full (cap %d bytes): %d episode(s) refused. They are counted "
            "on their run; free space by delivering (`prime-runs-otel push`) or raise "
            "PRIME_RUNS_OTEL_SPOOL_MAX_BYTES.",
            self.path,
            self.max_bytes,
            rejected,
        )
