"""The spool's size cap: how big the file is, and saying so before and
when the cap refuses episodes (the refusals themselves are counted where
episodes are stored, in ``ingest``)."""

from __future__ import annotations

import logging
import os
from contextlib import suppress

from .core import SpoolCore

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
