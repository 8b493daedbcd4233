"""The spool's size: its cap, and the room left on its disk.

Two limits refuse new episodes (counted on their run, in ``ingest``, unless
the batch is refused whole for its sender to retry): the
cap (``PRIME_RUNS_OTEL_SPOOL_MAX_BYTES``) on what the spool holds
(:meth:`SpoolSize.used_bytes`, its pages in use), and the disk's last
:meth:`SpoolSize.reserve_bytes`, which producers never take.

Bodies of delivered episodes kept for the local store
(``PRIME_RUNS_OTEL_KEEP_DELIVERED``) are the first to go at either limit:
the platform has them, so the oldest of them make room before a new episode,
whose only copy would be lost, is refused (``cap.py``),
and on a full disk before delivery would have to grow the file
(:meth:`SpoolSize.drop_kept_bodies`).

Why the disk matters to delivery: delivery writes to the spool too (the
lease, each upload's bytes before it is sent, every episode's state), and
SQLite's write-ahead log needs room before a checkpoint lets the file reuse
what delivered episodes freed. A spool whose disk is full cannot deliver
itself out of it, and nothing would ever free the room. So the room
delivery needs is kept twice: producers stop short of the disk's last
``reserve_bytes``, and a file of that size (``spool.sqlite3-reserve``) is
held beside the spool, once the disk has less than 64 reserves' worth free,
for when something else fills the disk. The process
that delivers releases it when the disk is (nearly) full, drains the spool
into it (each delivered upload frees the pages the next one reuses), and
takes it back once the disk has room again.

On a small disk the reserve shrinks with it (a 16th of the disk's size,
:func:`reserve_for`): a fixed 4 MiB would be the whole of a 4 MiB disk, and
every episode refused with nearly all of it free. Nothing about the disk
is remembered: its size and free room are read again at each check, so a
disk that grows (or that somebody else frees) is used at once, without a
restart.
"""

from __future__ import annotations

import errno
import logging
import os
import sqlite3
from contextlib import suppress
from pathlib import Path

from ..._text import human_bytes, shown
from . import files
from .core import SpoolFullError
from .files import disk_free
from .part import SpoolPart
from .rows import chunks, placeholders

logger = logging.getLogger(__name__)

#: Warn once the spool passes this share of its cap.
WARN_FRACTION = 0.8
#: The disk reserve is this share of the cap, within the bounds below: room
#: for a checkpoint of the write-ahead log and a few uploads.
RESERVE_FRACTION = 1 / 64
MIN_RESERVE_BYTES = 4 * 1024 * 1024
MAX_RESERVE_BYTES = 32 * 1024 * 1024
#: On a disk smaller than 16 full reserves, the reserve is this share of the
#: disk instead (256 KiB of a 4 MiB disk), and never less than the floor.
SMALL_DISK_SHARE = 1 / 16
SMALL_DISK_MIN_RESERVE = 64 * 1024
#: The reserve is taken (back) once the disk has this many reserves' worth
#: free, and not before it has fewer than ``TAKE_BELOW_RESERVES``: a disk
#: with gigabytes free needs none (nor do the thousands of spools of a test
#: suite), and one on its way to full gets it in time.
RETAKE_RESERVES = 3
TAKE_BELOW_RESERVES = 64


def disk_total(folder: Path) -> int | None:
    """The size of ``folder``'s disk, read now (a disk may grow)."""
    try:
        stat = os.statvfs(folder)
    except OSError:
        return None
    return stat.f_blocks * stat.f_frsize


def reserve_for(max_bytes: int, total: int | None) -> int:
    """The disk reserve of a spool capped at ``max_bytes`` on a disk of
    ``total`` bytes: a 64th of the cap within 4 and 32 MiB, and no more than
    a 16th of the disk (see the module's docstring)."""
    full = min(MAX_RESERVE_BYTES, max(MIN_RESERVE_BYTES, int(max_bytes * RESERVE_FRACTION)))
    if total is None:
        return full
    return min(full, max(SMALL_DISK_MIN_RESERVE, int(total * SMALL_DISK_SHARE)))


#: Runs whose delivery stopped (``RunRow.stopped``) take no room from the
#: cap of the runs still delivering: nothing frees what they hold until
#: somebody acts, and the others must keep room to stream through. New
#: episodes of theirs are taken while they hold less than this share of the
#: cap together. (So the file may hold up to the cap of delivering runs plus
#: what stopped runs held when they stopped; the disk's reserve still holds.)
STOPPED_SHARE = 0.5
#: What runs whose delivery stopped hold: their stored, undelivered episodes.
#: CROSS JOIN keeps SQLite's join order: the few stopped runs first (through
#: the ``runs_stopped`` index), then their episodes by ``episodes_by_state``,
#: never a scan of every episode.
STOPPED_HELD_SQL = (
    "SELECT COALESCE(SUM(e.size), 0) FROM runs r CROSS JOIN episodes e "
    "ON e.run_id = r.local_id "
    "WHERE (r.create_state = 'failed' OR r.close_state = 'gave_up') "
    "AND e.state IN ('pending', 'uploading', 'sending', 'failed')"
)
#: What counts against the cap (see :meth:`SpoolSize.used_bytes`), in one
#: statement rather than a pragma each: ``ingest`` asks it on every batch.
USED_BYTES_SQL = (
    "SELECT (page_count - freelist_count) * page_size "
    "FROM pragma_page_count(), pragma_freelist_count(), pragma_page_size()"
)
#: The kept bodies of delivered episodes, oldest first: what goes first at
#: the cap or on a full disk (the platform has them).
KEPT_BODIES_SQL = (
    "SELECT r.seq, e.size FROM records r JOIN episodes e ON e.seq = r.seq "
    "WHERE e.state = 'delivered' ORDER BY r.seq LIMIT ?"
)


class SpoolSize(SpoolPart):
    """The size cap and the disk's reserve (``housekeeping``; ``intake`` asks it too)."""

    def size_bytes(self) -> int:
        """The spool's files on disk (the database and its write-ahead log)."""
        total = 0
        for suffix in ("", "-wal"):
            with suppress(OSError):
                total += os.path.getsize(f"{self.path}{suffix}")
        return total

    def used_bytes(self) -> int:
        """What the spool holds, and what counts against the cap: its pages
        in use. The file does not shrink when bodies are dropped (delivered,
        pruned, or made room for), but their pages are reused before it
        grows, so that room counts at once; nor is the write-ahead log
        counted, whose pages are copies of the file's."""
        with suppress(Exception):
            ((used,),) = self._query(USED_BYTES_SQL)
            return int(used)
        return self.size_bytes()

    def stopped_runs_bytes(self) -> int:
        """What runs whose delivery stopped hold (see ``STOPPED_SHARE``)."""
        ((held,),) = self._query(STOPPED_HELD_SQL)
        return int(held)

    # -- the disk -------------------------------------------------------------

    @property
    def reserve_bytes(self) -> int:
        """Room on the disk kept for delivery (see the module's docstring),
        for the disk's size now."""
        return reserve_for(self.max_bytes, disk_total(self.path.parent))

    def small_disk_note(self) -> str | None:
        """A sentence for the log at start when the disk is too small for
        the full reserve, so the scaled-down one (and why episodes may be
        refused early) is no surprise; ``None`` on a disk of usual size."""
        total = disk_total(self.path.parent)
        reserve = reserve_for(self.max_bytes, total)
        full = reserve_for(self.max_bytes, None)
        if total is None or reserve >= full:
            return None
        return (
            f"The spool {shown(str(self.path))} is on a small disk ({human_bytes(total)}): "
            f"{human_bytes(reserve)} of it is kept for delivery (the spool's reserve; "
            f"{human_bytes(full)} on a disk of {human_bytes(16 * full)} or more). New episodes "
            "are refused, and counted, once less than that is free; room freed on the disk, "
            "or a larger disk, is used at once. A larger disk for PRIME_RUNS_OTEL_DIR holds more."
        )

    def room_problem(self) -> str | None:
        """Why new episodes would be refused now (the disk, or the cap), for
        an answer that says which; ``None`` when there is room."""
        left = self.disk_left_for_episodes()
        if left is not None and left <= 0:
            free = self.disk_free() or 0
            return (
                f"the disk holding the spool has {human_bytes(free)} free, short of the "
                f"{human_bytes(self.reserve_bytes)} kept for delivery: free space on it or move "
                "PRIME_RUNS_OTEL_DIR to a larger disk (room that appears is used at once)"
            )
        if self.has_room():
            return None
        return (
            f"the spool is at its cap of {self.max_bytes} bytes until delivery frees room "
            "(or raise PRIME_RUNS_OTEL_SPOOL_MAX_BYTES)"
        )

    @property
    def reserve_path(self) -> Path:
        return files.reserve_path(self.path)

    def disk_free(self) -> int | None:
        return disk_free(self.path.parent)

    def disk_left_for_episodes(self) -> int | None:
        """What producers may still add before the disk's last reserve;
        ``None`` when the disk cannot be asked. One ``statvfs`` gives both
        the room and the disk's size (``ingest`` asks on every batch)."""
        try:
            stat = os.statvfs(self.path.parent)
        except OSError:
            return None
        reserve = reserve_for(self.max_bytes, stat.f_blocks * stat.f_frsize)
        return stat.f_bavail * stat.f_frsize - reserve

    def has_room(self) -> bool:
        """Whether new episodes would be stored now: short of the disk's
        reserve, and under the cap, or at it with kept bodies of delivered
        episodes to make room with."""
        left = self.disk_left_for_episodes()
        if left is not None and left <= 0:
            return False
        held = self.used_bytes() - self.stopped_runs_bytes()
        return held < self.max_bytes or bool(self._query(KEPT_BODIES_SQL, (1,)))

    def keep_room(self) -> None:
        """Called by the process that delivers, before each pass: release
        the reserve file when the disk is (nearly) full, so that delivery
        can write; take it back once the disk has room again."""
        free = self.disk_free()
        if free is None:
            return
        reserve = self.reserve_bytes
        if free < reserve:
            self.release_reserve()
            self.drop_kept_bodies(reserve)
        elif RETAKE_RESERVES * reserve <= free < TAKE_BELOW_RESERVES * reserve:
            self.take_reserve()  # once: it is there already, or it is made now

    def drop_kept_bodies(self, wanted: int) -> int:
        """On a full disk: drop the bodies of delivered episodes kept for the
        local store (the platform has them), oldest first, up to ``wanted``
        bytes, so that delivery reuses their pages instead of needing the
        file to grow. Returns how many were dropped."""
        try:
            with self._transaction() as db:
                dropped, _ = drop_kept_bodies_in(db, wanted)
        except SpoolFullError:
            return 0  # not even that fits: delivery waits for room
        if dropped:
            logger.warning(
                "The disk holding the spool %s is full: dropped the kept bodies of %d delivered "
                "episode(s) (the platform has them) so that delivery can go on",
                shown(str(self.path)),
                dropped,
            )
        return dropped

    def release_reserve(self) -> bool:
        """Give the reserve's room to the spool's writes (the disk is full);
        ``False`` when there was none to give. Producers still stop short of
        the disk's last ``reserve_bytes``, so what it frees goes to delivery,
        and to the tiny writes that must never be lost (a run's end, the
        count of what was refused)."""
        return files.release_reserve(self.path)

    def take_reserve(self) -> None:
        """Create the reserve file, once, while the disk has room for it."""
        free = self.disk_free()
        if free is None or free < RETAKE_RESERVES * self.reserve_bytes:
            return
        try:
            fd = os.open(self.reserve_path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        except OSError:
            return  # there already, or the folder is not ours to write
        try:
            _allocate(fd, self.reserve_bytes)
        except OSError as exc:
            logger.debug("could not allocate the spool's disk reserve: %s", exc)
            with suppress(OSError):
                self.reserve_path.unlink()
        finally:
            os.close(fd)


def drop_kept_bodies_in(db: sqlite3.Connection, wanted: int) -> tuple[int, int]:
    """Drop kept bodies of delivered episodes, oldest first, until ``wanted``
    bytes are freed or none is left; returns how many went and their bytes."""
    freed = dropped = 0
    while freed < wanted:
        rows = db.execute(KEPT_BODIES_SQL, (1000,)).fetchall()
        if not rows:
            break
        taken = []
        for seq, size in rows:
            taken.append(seq)
            freed += size
            if freed >= wanted:
                break
        for chunk in chunks(taken):
            db.execute(f"DELETE FROM records WHERE seq IN ({placeholders(chunk)})", list(chunk))
        dropped += len(taken)
    return dropped, freed


def _allocate(fd: int, size: int) -> None:
    """Really take ``size`` bytes on the disk (a sparse file would take none)."""
    if hasattr(os, "posix_fallocate"):
        try:
            os.posix_fallocate(fd, 0, size)
            return
        except OSError as exc:
            if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL):  # write it out instead
                raise
    block = b"\0" * (1024 * 1024)
    written = 0
    while written < size:
        written += os.write(fd, block[: size - written])
    os.fsync(fd)
