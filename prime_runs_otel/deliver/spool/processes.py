"""Which processes feed a run (``producers``), to tell a crashed producer
from a slow one, and which process delivers (``lease``), so two processes
never send the same record. A process is named by host, pid and start time:
the start time tells a live process from a new one that reused a dead one's
pid."""

from __future__ import annotations

import functools
import os
import socket
import sqlite3
import time
import uuid

from .part import SpoolPart


def lease_owner() -> str:
    """A lease holder's name: host, pid and process start time say whether
    it is still alive (see :meth:`Spool.acquire_lease`), the random part
    tells two uploaders of one process apart."""
    host, pid, start = this_producer()
    return f"{host}:{pid}:{start}:{uuid.uuid4().hex}"


def _on_this_host(owner: str) -> bool:
    parts = owner.split(":")
    return len(parts) == 4 and parts[0] == socket.gethostname() and parts[1].isdigit()


def _holder_alive(owner: str) -> bool:
    """``False`` only when the holder is known dead: a process on this host
    that is gone. Holders elsewhere keep the lease until it expires."""
    parts = owner.split(":")
    if len(parts) != 4 or parts[0] != socket.gethostname() or not parts[1].isdigit():
        return True
    return process_alive(int(parts[1]), parts[2])


def this_producer() -> tuple[str, int, str]:
    """(host, pid, process start time): the start time tells a live process
    from a new one that reused a dead producer's pid."""
    return _producer(os.getpid())


@functools.cache
def _producer(pid: int) -> tuple[str, int, str]:
    # Per pid, so a forked child gets its own; read once, not on every export.
    return socket.gethostname(), pid, process_start_token(pid)


def _proc_stat(pid: int) -> list[str]:
    """The fields of ``/proc/PID/stat`` after the command name (empty where
    there is no procfs)."""
    # Read as bytes: a text codec lookup may import, and an import in a
    # forked child can find its module lock held by a thread of the parent.
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            return handle.read().rsplit(b")", 1)[1].decode("ascii", "replace").split()
    except (OSError, IndexError):
        return []


def process_start_token(pid: int) -> str:
    fields = _proc_stat(pid)
    return fields[19] if len(fields) > 19 else ""


def process_alive(pid: int, start_token: str) -> bool:
    """A zombie counts as dead: a producer killed with ``kill -9`` stays one
    until its parent reaps it, and it will never write again."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    fields = _proc_stat(pid)
    if fields and fields[0] in ("Z", "X"):
        return False
    current = fields[19] if len(fields) > 19 else ""
    return not start_token or not current or current == start_token


def register_producer(db: sqlite3.Connection, run_id: str, *, owns_run: bool, now: float) -> None:
    """Record this process as feeding ``run_id`` (see ``Spool.ingest``)."""
    host, pid, start = this_producer()
    db.execute(
        "INSERT INTO producers (run_id, host, pid, pid_start, last_seen, owner) "
        "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT DO UPDATE SET "
        "last_seen = excluded.last_seen, owner = excluded.owner",
        (run_id, host, pid, start, now, int(owns_run)),
    )


class ProcessDelivery(SpoolPart):
    """Which processes feed a run, and the delivery lease (``delivery``)."""

    def producers(
        self, run_id: str, *, owners_only: bool = False
    ) -> list[tuple[str, int, str, float]]:
        """Processes feeding the run; ``owners_only``: those whose exit ends it."""
        rows = self._query(
            "SELECT host, pid, pid_start, last_seen FROM producers WHERE run_id = ?"
            + (" AND owner = 1" if owners_only else ""),
            (run_id,),
        )
        return [(host, pid, start, seen) for host, pid, start, seen in rows]

    def acquire_lease(self, owner: str, ttl: float) -> bool:
        """At most one process delivers from a spool at a time. A holder
        gives the lease up when it stops; one that died without doing so
        loses it at once when it ran on this host (its pid is gone), else
        after ``ttl`` seconds. ``owner`` comes from :func:`lease_owner`."""
        now = time.time()
        with self._transaction() as db:
            row = db.execute("SELECT owner, expires FROM lease WHERE name = 'uploader'").fetchone()
            if row is not None and row[0] != owner and row[1] > now and _holder_alive(row[0]):
                return False
            db.execute(
                "INSERT INTO lease (name, owner, expires) VALUES ('uploader', ?, ?) "
                "ON CONFLICT DO UPDATE SET owner = excluded.owner, expires = excluded.expires",
                (owner, now + ttl),
            )
            return True

    def open_runs_fed_in_process(self) -> list[str]:
        """Open runs without a recorded end that processes of their own feed
        (and own), not ``serve``: the runs whose producers' deaths mean a
        crash (:func:`~prime_runs_otel.deliver.crashed.end_runs_of_dead_producers`).
        A run claimed through ``serve`` (its ``owner_id``) is never one."""
        rows = self._query(
            "SELECT local_id FROM runs WHERE end_status IS NULL AND close_state = 'open' "
            "AND COALESCE(owner_id, '') = '' AND EXISTS (SELECT 1 FROM producers p "
            "WHERE p.run_id = runs.local_id AND p.owner = 1)"
        )
        return [local_id for (local_id,) in rows]

    def release_lease(self, owner: str) -> None:
        with self._transaction() as db:
            db.execute("DELETE FROM lease WHERE name = 'uploader' AND owner = ?", (owner,))


class ProcessReads(SpoolPart):
    """Whether anybody delivers from this spool now (``reading``)."""

    def delivery_alive(self) -> bool:
        """Whether a process delivers from this spool now: the lease is held
        by a live process on this host (renewed or not), or by one elsewhere
        whose lease has not expired. A delivering process holds the lease
        from its first pass until it stops, so ``False`` means a run still
        pending waits for somebody to deliver it (``push``)."""
        rows = self._query("SELECT owner, expires FROM lease WHERE name = 'uploader'")
        if not rows:
            return False
        owner, expires = rows[0]
        if _on_this_host(owner):
            return _holder_alive(owner)
        return bool(expires > time.time())
