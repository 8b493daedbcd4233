"""Giving the spool file's free pages back to the disk.

SQLite keeps the pages a removed run (``rm``, ``prune``) or a dropped body
leaves behind as free pages inside the file and reuses them before the file
grows, so the file never shrinks by itself. A new spool is created with
incremental auto-vacuum, so ``rm`` and ``prune`` hand the free pages back
at once (:meth:`SpoolSpace.give_back_space`); a spool created by an earlier
release, without it, is rewritten once by ``prime-runs-otel compact``
(:meth:`SpoolSpace.compact`), which also switches it to incremental
auto-vacuum for next time.
"""

from __future__ import annotations

import logging
import sqlite3
from contextlib import suppress

from .part import SpoolPart

logger = logging.getLogger(__name__)

#: ``PRAGMA auto_vacuum``'s value for incremental: free pages are given back
#: when asked (``PRAGMA incremental_vacuum``), never in the middle of a commit.
INCREMENTAL = 2


class SpoolSpace(SpoolPart):
    """Giving the file's free pages back to the disk (``housekeeping``)."""

    def free_bytes(self) -> int:
        """The file's free pages: room it reuses before growing, but that the
        disk does not get back until they are given back."""
        ((free,),) = self._query("PRAGMA freelist_count")
        ((page_size,),) = self._query("PRAGMA page_size")
        return int(free * page_size)

    def gives_back_space(self) -> bool:
        """Whether removing runs shrinks the file (incremental auto-vacuum);
        a spool from an earlier release needs ``compact`` once."""
        ((mode,),) = self._query("PRAGMA auto_vacuum")
        return int(mode) == INCREMENTAL

    def give_back_space(self) -> None:
        """Hand the free pages back to the disk, when the spool can do it in
        place (see :meth:`gives_back_space`). Best effort: the pages stay
        reusable inside the file whatever happens here."""
        if not self.gives_back_space():
            return
        try:
            # A script, stepped to its end: a single step frees one page.
            self._run_script("PRAGMA incremental_vacuum")
            self._run_script("PRAGMA wal_checkpoint(TRUNCATE)")
        except sqlite3.Error as exc:
            logger.debug("giving the free pages of %s back waits: %s", self.path, exc)

    def compact(self) -> None:
        """Rewrite the file without its free pages (SQLite's VACUUM), and
        switch it to incremental auto-vacuum so ``rm`` and ``prune`` give
        space back by themselves from then on. Writers wait meanwhile: the
        caller makes sure no process is recording or delivering."""
        self._run_script("PRAGMA auto_vacuum = INCREMENTAL; VACUUM")
        with suppress(sqlite3.Error):  # a reader holding the log only delays the shrink
            self._run_script("PRAGMA wal_checkpoint(TRUNCATE)")
