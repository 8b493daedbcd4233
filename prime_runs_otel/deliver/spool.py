"""The spool: a SQLite file that holds every run, episode and upload until the
platform has acknowledged it, and that doubles as the local store.

Why SQLite: ``export()`` must commit a batch durably in one transaction and
return, several processes (forked workers, a second producer, ``push``) may
write the same file at once, and a process killed with ``kill -9`` must leave
nothing half-written. WAL mode gives all three with no server.

What lives here:
- ``runs``: one row per producer run key (``prime.run.id``): identity, config,
  platform id once created, lifecycle state, the running summary (aggregated
  incrementally, never recomputed from a list of episodes) and loss counters.
- ``episodes``: one row per (run, episode id); the UNIQUE key is what makes
  ingestion idempotent against collector retries and replays. The record body
  is dropped once the platform has acknowledged it, so the file stays bounded
  by what is still pending.
- ``uploads``: the exact bytes of each Prime Traces upload with its
  idempotency key, persisted before the first attempt so a restart replays the
  same request; and a marker per legacy sample request, so a request that may
  have acted is never replayed.
- ``producers``: which processes feed a run, to tell a crashed producer from a
  slow one.
- ``lease``: which process's uploader delivers, so two processes never send
  the same record.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import socket
import sqlite3
import threading
import time
import uuid
import weakref
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import PrimeRunsOtelError
from ..read.projection import SummaryAccumulator
from ..read.records import (
    EpisodeArrival,
    RunBatch,
    RunIdentity,
    RunMetrics,
)

logger = logging.getLogger(__name__)

#: 2: record bodies moved out of ``episodes`` into ``records`` (see ``_SCHEMA``).
SCHEMA_VERSION = 2
#: WAL pages (4 KiB; 256 MiB) after which a commit checkpoints by itself.
#: The uploader checkpoints after every upload, so this is the fallback for a
#: spool nobody delivers from; at SQLite's 1,000 the commits of export()
#: kept doing the copying (100-300 ms each at 1,400 episodes/s).
AUTOCHECKPOINT_PAGES = 65536
#: Warn once the spool passes this share of its cap.
WARN_FRACTION = 0.8

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS runs (
    local_id TEXT PRIMARY KEY,
    kind TEXT NOT NULL,
    name TEXT,
    identity TEXT NOT NULL,
    mode TEXT NOT NULL,
    config TEXT,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL,
    platform_id TEXT,
    url TEXT,
    create_state TEXT NOT NULL DEFAULT 'pending',
    create_started REAL,
    sink TEXT NOT NULL DEFAULT 'traces',
    traces_written INTEGER NOT NULL DEFAULT 0,
    end_status TEXT,
    end_error TEXT,
    end_expected INTEGER,
    ended_at REAL,
    close_state TEXT NOT NULL DEFAULT 'open',
    closed_at REAL,
    summary_state TEXT NOT NULL,
    episodes INTEGER NOT NULL DEFAULT 0,
    duplicates INTEGER NOT NULL DEFAULT 0,
    corrupt INTEGER NOT NULL DEFAULT 0,
    rejected INTEGER NOT NULL DEFAULT 0,
    uncertain INTEGER NOT NULL DEFAULT 0,
    failed INTEGER NOT NULL DEFAULT 0,
    last_error TEXT,
    last_seen REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS episodes (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id TEXT NOT NULL,
    episode_id TEXT NOT NULL,
    rollout_number INTEGER,
    has_traces INTEGER NOT NULL,
    size INTEGER NOT NULL,
    record BLOB,
    state TEXT NOT NULL DEFAULT 'pending',
    upload_id TEXT,
    step INTEGER,
    UNIQUE (run_id, episode_id)
);
CREATE INDEX IF NOT EXISTS episodes_by_state ON episodes (run_id, state, seq);
CREATE INDEX IF NOT EXISTS episodes_by_upload ON episodes (upload_id) WHERE upload_id IS NOT NULL;
-- The record bodies, apart from the small rows whose state changes: SQLite
-- rewrites a whole row on every update, and an episode's state changes two
-- or three times on its way to the platform. (episodes.record is where
-- schema version 1 kept them; it is moved here on open and stays NULL.)
CREATE TABLE IF NOT EXISTS records (seq INTEGER PRIMARY KEY, body BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS rollouts (
    run_id TEXT NOT NULL,
    example_key TEXT NOT NULL,
    count INTEGER NOT NULL,
    PRIMARY KEY (run_id, example_key)
);
CREATE TABLE IF NOT EXISTS uploads (
    upload_id TEXT PRIMARY KEY,
    run_id TEXT NOT NULL,
    kind TEXT NOT NULL,
    body BLOB,
    episodes INTEGER NOT NULL,
    state TEXT NOT NULL,
    created_at REAL NOT NULL,
    step INTEGER,
    sample_offset INTEGER,
    object_url TEXT,
    object_key TEXT
);
CREATE TABLE IF NOT EXISTS metrics (
    run_id TEXT NOT NULL,
    step INTEGER NOT NULL,
    row TEXT NOT NULL,
    state TEXT NOT NULL DEFAULT 'pending',
    updated_at REAL NOT NULL,
    PRIMARY KEY (run_id, step)
);
CREATE TABLE IF NOT EXISTS producers (
    run_id TEXT NOT NULL,
    host TEXT NOT NULL,
    pid INTEGER NOT NULL,
    pid_start TEXT NOT NULL,
    last_seen REAL NOT NULL,
    owner INTEGER NOT NULL DEFAULT 1,
    PRIMARY KEY (run_id, host, pid, pid_start)
);
CREATE TABLE IF NOT EXISTS lease (
    name TEXT PRIMARY KEY,
    owner TEXT NOT NULL,
    expires REAL NOT NULL
);
"""

#: Columns added after the first release, added in place to an older spool
#: file so that an upgrade never needs the spool emptied first.
_ADDED_COLUMNS = {
    "episodes": (("step", "INTEGER"),),
    "producers": (("owner", "INTEGER NOT NULL DEFAULT 1"),),
    "uploads": (
        ("step", "INTEGER"),
        ("sample_offset", "INTEGER"),
        ("object_url", "TEXT"),
        ("object_key", "TEXT"),
        # 'gzip' for a Prime Traces body stored as it is sent; NULL: stored plain.
        ("body_encoding", "TEXT"),
    ),
}


class _Connection(sqlite3.Connection):
    """A plain connection that can be weakly referenced (see ``_before_fork``)."""


#: Every connection open in this process, so a fork can hold on to them.
_open_connections: weakref.WeakSet[_Connection] = weakref.WeakSet()


class _ForkGate:
    """Many threads inside SQLite at once; a fork waits until none is.

    A child must never start with a SQLite mutex, file lock or transaction
    that belonged to a thread of its parent (it would hang on the mutex, or
    act on a lock it does not really hold). So every SQLite call happens
    inside the gate, and ``fork()`` closes the gate and waits for it to
    empty. Threads do not exclude each other here: each has its own
    connection, and in WAL mode readers and the writer run side by side.
    """

    def __init__(self) -> None:
        self._state = threading.Condition(threading.Lock())
        self._inside: dict[int, int] = {}  # thread id -> depth (entries nest)
        self._closed_by: int | None = None

    def __enter__(self) -> None:
        me = threading.get_ident()
        with self._state:
            while self._closed_by is not None and self._closed_by != me:
                self._state.wait()
            self._inside[me] = self._inside.get(me, 0) + 1

    def __exit__(self, *exc: object) -> None:
        me = threading.get_ident()
        with self._state:
            depth = self._inside[me] - 1
            if depth:
                self._inside[me] = depth
            else:
                del self._inside[me]
                self._state.notify_all()

    def close_for_fork(self) -> None:
        """Bar new entries and wait until only this thread (if it) is inside."""
        me = threading.get_ident()
        self._state.acquire()
        self._closed_by = me
        while any(thread != me for thread in self._inside):
            self._state.wait()

    def reopen(self, *, in_child: bool) -> None:
        if in_child:  # the other threads did not survive the fork
            me = threading.get_ident()
            self._inside = {me: self._inside[me]} if me in self._inside else {}
        self._closed_by = None
        self._state.notify_all()
        self._state.release()


_GATE = _ForkGate()
#: One writer at a time in this process. SQLite would serialise writers by
#: itself, but its busy handler sleeps in steps of up to 100 ms; a lock
#: hands over the moment the other transaction ends.
_WRITER = threading.Lock()
#: In a forked child: the connections inherited from the parent, referenced
#: forever so they are never closed here. SQLite forbids using a connection
#: across ``fork()``, and closing one counts.
_inherited_connections: list[_Connection] = []
#: Filled just before a fork, so the child's copy holds every connection
#: even as the interpreter drops the other threads' state in the child.
_held_for_fork: list[_Connection] = []


def _before_fork() -> None:
    _GATE.close_for_fork()
    while True:
        try:
            _held_for_fork[:] = list(_open_connections)
            return
        except RuntimeError:  # a weak reference died while copying
            continue


def _after_fork_in_parent() -> None:
    _held_for_fork.clear()
    _GATE.reopen(in_child=False)


def _after_fork_in_child() -> None:
    global _WRITER
    _inherited_connections.extend(_held_for_fork)
    _held_for_fork.clear()
    _WRITER = threading.Lock()  # a parent's thread may have held it: not ours
    _GATE.reopen(in_child=True)


os.register_at_fork(
    before=_before_fork,
    after_in_parent=_after_fork_in_parent,
    after_in_child=_after_fork_in_child,
)


class SpoolError(PrimeRunsOtelError):
    """The spool cannot be opened or written (permissions, disk, corruption)."""


@dataclass(frozen=True)
class IngestOutcome:
    stored: int = 0
    duplicates: int = 0
    corrupt: int = 0
    rejected: int = 0


@dataclass(frozen=True)
class RunRow:
    """A run as the spool knows it; see the ``runs`` table for the meaning."""

    local_id: str
    kind: str
    name: str | None
    identity: RunIdentity
    mode: str
    config: dict[str, Any] | None
    created_at: float
    platform_id: str | None
    url: str | None
    create_state: str
    create_started: float | None
    sink: str
    traces_written: int
    end_status: str | None
    end_error: str | None
    end_expected: int | None
    ended_at: float | None
    close_state: str
    summary_state: dict[str, Any]
    episodes: int
    duplicates: int
    corrupt: int
    rejected: int
    uncertain: int
    failed: int
    last_error: str | None
    last_seen: float

    @property
    def closed(self) -> bool:
        """Closed where it lives: on the platform, or in the local store."""
        return self.close_state == "closed"

    @property
    def settled(self) -> bool:
        """Nothing more will happen without help: closed, or given up on
        (``prime-runs-otel push`` tries again)."""
        return self.close_state in ("closed", "gave_up")


@dataclass(frozen=True)
class EpisodeRow:
    seq: int
    episode_id: str
    rollout_number: int | None
    has_traces: bool
    record: bytes
    #: The training step the episode is training work of, if any.
    step: int | None = None


@dataclass(frozen=True)
class MetricsRow:
    """One training step's metrics row, as stored (``row`` is its JSON)."""

    step: int
    row: str


@dataclass(frozen=True)
class StepUpload:
    """One Parquet object of a training step's legacy sample table."""

    upload_id: str
    step: int
    sample_offset: int
    body: bytes | None
    url: str | None
    key: str | None


@dataclass(frozen=True)
class UploadRow:
    upload_id: str
    run_id: str
    kind: str
    body: bytes | None
    episodes: int
    state: str
    body_encoding: str | None = None


def lease_owner() -> str:
    """A lease holder's name: host, pid and process start time say whether
    it is still alive (see :meth:`Spool.acquire_lease`), the random part
    tells two uploaders of one process apart."""
    host, pid, start = this_producer()
    return f"{host}:{pid}:{start}:{uuid.uuid4().hex}"


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


class Spool:
    """Thread-safe (a connection per thread) and process-safe (SQLite locking)."""

    def __init__(self, path: str | os.PathLike[str], *, max_bytes: int) -> None:
        self.path = Path(path)
        self.max_bytes = max_bytes
        self._local = threading.local()
        self._warned_full = False
        try:
            # Private when created here: records hold prompts and completions.
            self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as exc:
            raise SpoolError(
                f"cannot create the spool folder {str(self.path.parent)!r}: {exc}. "
                "Set PRIME_RUNS_OTEL_DIR to a writable folder."
            ) from exc
        self._writer_db: sqlite3.Connection | None = None
        self._writer_pid = 0
        self._init_schema()

    # -- connections ---------------------------------------------------------

    def _connection(self) -> sqlite3.Connection:
        """For reads: one connection per thread and per process (a connection
        inherited across ``fork()`` must never be used by the child)."""
        pid = os.getpid()
        db: sqlite3.Connection | None = getattr(self._local, "db", None)
        if db is not None and getattr(self._local, "pid", None) == pid:
            return db
        db = self._open()
        self._local.db = db
        self._local.pid = pid
        return db

    def _writer_connection(self) -> sqlite3.Connection:
        """For writes, with ``_WRITER`` held: one connection per process, open
        from the start. Every thread writes through it, so no export() ever
        opens a connection or meets another connection's write lock."""
        pid = os.getpid()
        if self._writer_db is None or self._writer_pid != pid:
            self._writer_db = self._open(check_same_thread=False)
            self._writer_pid = pid
        return self._writer_db

    def _open(self, *, check_same_thread: bool = True) -> sqlite3.Connection:
        try:
            db = sqlite3.connect(
                self.path,
                timeout=60.0,
                isolation_level=None,
                factory=_Connection,
                check_same_thread=check_same_thread,
            )
            _open_connections.add(db)
            _enable_wal(db)
            db.execute("PRAGMA synchronous=FULL")
            db.execute("PRAGMA busy_timeout=60000")
            # Some builds (Debian's) default to secure_delete=ON, which zeroes
            # every freed page: dropping a delivered body then costs as much
            # as writing it. FAST zeroes only pages written anyway; a freed
            # body may linger in free pages until reused, as the live ones
            # sit in the clear: the spool's folder is what keeps them private.
            db.execute("PRAGMA secure_delete=FAST")
            # The uploader checkpoints after every pass (see checkpoint());
            # SQLite's own, in whatever commit crosses this, is the fallback.
            db.execute(f"PRAGMA wal_autocheckpoint={AUTOCHECKPOINT_PAGES}")
        except sqlite3.Error as exc:
            raise SpoolError(
                f"cannot open the spool {str(self.path)!r}: {exc}. Check that the folder is "
                "writable, or set PRIME_RUNS_OTEL_DIR to another one."
            ) from exc
        return db

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        with _WRITER, _GATE:
            db = self._writer_connection()
            db.execute("BEGIN IMMEDIATE")
            try:
                yield db
            except BaseException:
                db.execute("ROLLBACK")
                raise
            else:
                db.execute("COMMIT")

    def checkpoint(self) -> None:
        """Copy committed pages from the write-ahead log into the database
        without waiting for anyone (PASSIVE: writers carry on meanwhile)."""
        with _GATE:
            self._connection().execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()

    def _query(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        """Every row of one read, fetched whole so no statement stays open."""
        with _GATE:
            return self._connection().execute(sql, params).fetchall()

    def _init_schema(self) -> None:
        try:
            with _WRITER, _GATE:
                db = self._writer_connection()
                db.executescript(_SCHEMA)
                self._add_missing_columns(db)
            with self._transaction() as db:
                self._migrate(db)
        except sqlite3.Error as exc:
            raise SpoolError(f"cannot initialise the spool {str(self.path)!r}: {exc}") from exc

    @staticmethod
    def _migrate(db: sqlite3.Connection) -> None:
        """Bring a spool written by an earlier release to this schema (inside
        one transaction); refuse one written by a later release."""
        row = db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        version = int(row[0]) if row else SCHEMA_VERSION
        if version > SCHEMA_VERSION:
            raise SpoolError(
                f"the spool was written by a newer prime-runs-otel (schema {version}, this "
                f"release reads {SCHEMA_VERSION}): upgrade prime-runs-otel, or point "
                "PRIME_RUNS_OTEL_DIR at another folder"
            )
        if version < 2:
            db.execute(
                "INSERT OR IGNORE INTO records (seq, body) "
                "SELECT seq, record FROM episodes WHERE record IS NOT NULL"
            )
            db.execute("UPDATE episodes SET record = NULL WHERE record IS NOT NULL")
        db.execute(
            "INSERT INTO meta (key, value) VALUES ('schema_version', ?) "
            "ON CONFLICT DO UPDATE SET value = excluded.value",
            (str(SCHEMA_VERSION),),
        )

    @staticmethod
    def _add_missing_columns(db: sqlite3.Connection) -> None:
        for table, columns in _ADDED_COLUMNS.items():
            present = {row[1] for row in db.execute(f"PRAGMA table_info({table})")}
            for name, kind in columns:
                if name not in present:
                    with suppress(sqlite3.OperationalError):  # another process added it
                        db.execute(f"ALTER TABLE {table} ADD COLUMN {name} {kind}")

    def close(self) -> None:
        """Close this thread's reading connection and the process's writer."""
        with _WRITER, _GATE:
            db: sqlite3.Connection | None = getattr(self._local, "db", None)
            if db is not None and getattr(self._local, "pid", None) == os.getpid():
                db.close()
            self._local = threading.local()
            if self._writer_db is not None and self._writer_pid == os.getpid():
                self._writer_db.close()
            self._writer_db = None

    # -- size ----------------------------------------------------------------

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

    # -- ingestion (export()) -------------------------------------------------

    def ingest(
        self,
        batches: Sequence[RunBatch],
        *,
        mode: str,
        register_producer: bool = True,
        owns_runs: bool = True,
    ) -> IngestOutcome:
        """Commit a whole export batch in one transaction.

        ``register_producer``: record this process as feeding the runs, so its
        death without an end span marks them crashed. A receiver behind a
        collector passes ``False``: its runs are fed by remote producers, whose
        silence (an idle timeout) is what tells a crash. ``owns_runs=False``
        registers a process that feeds runs somebody else owns (a worker of a
        training run): its exit says nothing about whether the run crashed.

        Idempotent: an episode already in the spool for its run is counted as
        a duplicate and changes nothing, so collector retries and replays are
        stored once. At the size cap new episodes are refused and counted on
        their run; run events are always accepted (they are tiny, and losing
        a run's end would leave it open).
        """
        # The cap is checked per episode against the file size plus what this
        # batch adds, since one export batch can carry thousands of episodes.
        size = self.size_bytes()
        host, pid, start = this_producer()
        now = time.time()
        stored = duplicates = corrupt = rejected = 0
        with self._transaction() as db:
            for batch in batches:
                local_id = batch.identity.local_id
                summary = self._ensure_run(db, batch.identity, mode=mode, now=now)
                if register_producer:
                    db.execute(
                        "INSERT INTO producers (run_id, host, pid, pid_start, last_seen, owner) "
                        "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT DO UPDATE SET "
                        "last_seen = excluded.last_seen, owner = excluded.owner",
                        (local_id, host, pid, start, now, int(owns_runs)),
                    )
                if batch.start is not None:
                    db.execute(
                        "UPDATE runs SET config = ? WHERE local_id = ? AND config IS NULL",
                        (json.dumps(batch.start.config), local_id),
                    )
                added, refused, size = self._insert_episodes(
                    db, local_id, batch.episodes, summary, size
                )
                stored += added
                rejected += refused
                duplicates += len(batch.episodes) - added - refused
                corrupt += len(batch.corrupt) + len(batch.corrupt_metrics)
                self._insert_metrics(db, local_id, batch.metrics, now)
                db.execute(
                    "UPDATE runs SET summary_state = ?, episodes = episodes + ?, "
                    "duplicates = duplicates + ?, corrupt = corrupt + ?, rejected = rejected + ?, "
                    "updated_at = ?, last_seen = ? WHERE local_id = ?",
                    (
                        json.dumps(summary.to_state()),
                        added,
                        len(batch.episodes) - added - refused,
                        len(batch.corrupt) + len(batch.corrupt_metrics),
                        refused,
                        now,
                        now,
                        local_id,
                    ),
                )
                if batch.end is not None:
                    db.execute(
                        "UPDATE runs SET end_status = ?, end_error = ?, end_expected = ?, "
                        "ended_at = ? WHERE local_id = ? AND end_status IS NULL",
                        (
                            batch.end.status,
                            batch.end.error,
                            batch.end.episodes_recorded,
                            now,
                            local_id,
                        ),
                    )
        self._warn_near_cap(size)
        if rejected:
            logger.error(
                "The spool %s is full (cap %d bytes): %d episode(s) refused. They are counted "
                "on their run; free space by delivering (`prime-runs-otel push`) or raise "
                "PRIME_RUNS_OTEL_SPOOL_MAX_BYTES.",
                self.path,
                self.max_bytes,
                rejected,
            )
        return IngestOutcome(stored, duplicates, corrupt, rejected)

    def _ensure_run(
        self, db: sqlite3.Connection, identity: RunIdentity, *, mode: str, now: float
    ) -> SummaryAccumulator:
        row = db.execute(
            "SELECT summary_state FROM runs WHERE local_id = ?", (identity.local_id,)
        ).fetchone()
        if row is not None:
            return SummaryAccumulator.from_state(json.loads(row[0]))
        summary = SummaryAccumulator()
        db.execute(
            "INSERT INTO runs (local_id, kind, name, identity, mode, created_at, updated_at, "
            "summary_state, last_seen, platform_id, create_state) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                identity.local_id,
                identity.kind,
                identity.name,
                identity.to_json(),
                mode,
                now,
                now,
                json.dumps(summary.to_state()),
                now,
                identity.attach,
                "created" if identity.attach else "pending",
            ),
        )
        return summary

    def _insert_episodes(
        self,
        db: sqlite3.Connection,
        run_id: str,
        episodes: Sequence[EpisodeArrival],
        summary: SummaryAccumulator,
        size: int,
    ) -> tuple[int, int, int]:
        """Store the new episodes of one run from one batch; returns how many
        were added and refused, and the spool's size after them.

        A fixed handful of statements whatever the batch size, rather than a
        few per episode: Python's sqlite3 lets go of the GIL on every
        statement, and taking it back can cost a switch interval (5 ms) while
        a producer thread computes, which made ``export()`` wait far longer
        than it worked. So duplicates (stored before, or twice in the batch)
        are found in one read, rollout numbers in another, and rows and
        bodies go in as multi-row inserts. At the cap a new episode is
        refused; one already stored is still a duplicate, not a loss.
        """
        ids = [episode.episode_id for episode in episodes]
        known: set[str] = set()
        for stored in _aggregate(
            db, "json_group_array(episode_id)", "episodes", run_id, "episode_id", ids
        ):
            known.update(stored)
        fresh: list[EpisodeArrival] = []
        refused = 0
        for episode in episodes:
            if episode.episode_id in known:
                continue
            if size + len(episode.raw) > self.max_bytes:
                refused += 1
                continue
            known.add(episode.episode_id)
            fresh.append(episode)
            size += len(episode.raw)
        if not fresh:
            return 0, refused, size
        numbers = self._number_rollouts(db, run_id, fresh)
        _insert_rows(
            db,
            "episodes (run_id, episode_id, has_traces, size, step, rollout_number)",
            [
                (run_id, e.episode_id, int(e.digest.has_traces), len(e.raw), e.step, number)
                for e, number in zip(fresh, numbers, strict=True)
            ],
        )
        seqs: dict[str, int] = {}
        fresh_ids = [episode.episode_id for episode in fresh]
        for found in _aggregate(
            db, "json_group_object(episode_id, seq)", "episodes", run_id, "episode_id", fresh_ids
        ):
            seqs.update(found)
        _insert_rows(db, "records (seq, body)", [(seqs[e.episode_id], e.raw) for e in fresh])
        for episode in fresh:
            summary.add_digest(episode.digest)
        return len(fresh), refused, size

    @staticmethod
    def _number_rollouts(
        db: sqlite3.Connection, run_id: str, episodes: Sequence[EpisodeArrival]
    ) -> list[int | None]:
        """Each episode's number among the rollouts of its example, in arrival
        order, continuing the run's counts; None for an episode without traces."""
        keys = list({e.digest.rollout_key for e in episodes if e.digest.has_traces})
        counts: dict[str, int] = {}
        for found in _aggregate(
            db, "json_group_object(example_key, count)", "rollouts", run_id, "example_key", keys
        ):
            counts.update(found)
        numbers: list[int | None] = []
        for episode in episodes:
            if not episode.digest.has_traces:
                numbers.append(None)
                continue
            key = episode.digest.rollout_key
            counts[key] = counts.get(key, 0) + 1
            numbers.append(counts[key])
        if keys:
            _insert_rows(
                db,
                "rollouts (run_id, example_key, count)",
                [(run_id, key, counts[key]) for key in keys],
                suffix="ON CONFLICT (run_id, example_key) DO UPDATE SET count = excluded.count",
            )
        return numbers

    @staticmethod
    def _insert_metrics(
        db: sqlite3.Connection, run_id: str, metrics: Sequence[RunMetrics], now: float
    ) -> None:
        """One row per step, as the platform keeps them: a step logged again
        replaces its row (and is sent again); an identical copy (a collector's
        retry) changes nothing."""
        for item in metrics:
            db.execute(
                "INSERT INTO metrics (run_id, step, row, state, updated_at) "
                "VALUES (?, ?, ?, 'pending', ?) ON CONFLICT (run_id, step) DO UPDATE SET "
                "row = excluded.row, state = 'pending', updated_at = excluded.updated_at "
                "WHERE metrics.row != excluded.row",
                (run_id, item.step, json.dumps(item.row(), sort_keys=True), now),
            )

    # -- reads ---------------------------------------------------------------

    _RUN_COLUMNS = (
        "local_id, kind, name, identity, mode, config, created_at, platform_id, url, "
        "create_state, create_started, sink, traces_written, end_status, end_error, "
        "end_expected, ended_at, close_state, summary_state, episodes, duplicates, corrupt, "
        "rejected, uncertain, failed, last_error, last_seen"
    )

    def _run_from_row(self, row: tuple[Any, ...]) -> RunRow:
        values = list(row)
        values[3] = RunIdentity.from_json(values[3])
        values[5] = json.loads(values[5]) if values[5] else None
        values[18] = json.loads(values[18])
        return RunRow(*values)

    def run(self, local_id: str) -> RunRow | None:
        rows = self._query(f"SELECT {self._RUN_COLUMNS} FROM runs WHERE local_id = ?", (local_id,))
        return self._run_from_row(rows[0]) if rows else None

    def find_run(self, key: str) -> RunRow | None:
        """A run by its local key, its platform id, or a unique prefix of either."""
        exact = self.run(key)
        if exact is not None:
            return exact
        rows = self._query(
            f"SELECT {self._RUN_COLUMNS} FROM runs WHERE platform_id = ? "
            "OR local_id LIKE ? OR platform_id LIKE ?",
            (key, f"{key}%", f"{key}%"),
        )
        return self._run_from_row(rows[0]) if len(rows) == 1 else None

    def runs(self) -> list[RunRow]:
        rows = self._query(f"SELECT {self._RUN_COLUMNS} FROM runs ORDER BY created_at DESC")
        return [self._run_from_row(row) for row in rows]

    def runs_to_deliver_or_close(self) -> list[RunRow]:
        """Runs not yet closed: online ones to deliver, local ones to close
        when their producer ends (or dies)."""
        rows = self._query(
            f"SELECT {self._RUN_COLUMNS} FROM runs "
            "WHERE close_state NOT IN ('closed', 'gave_up') ORDER BY created_at"
        )
        return [self._run_from_row(row) for row in rows]

    def upload_episode_seqs(self, upload_id: str) -> list[int]:
        rows = self._query("SELECT seq FROM episodes WHERE upload_id = ?", (upload_id,))
        return [seq for (seq,) in rows]

    def pending_count(self, run_id: str) -> int:
        rows = self._query(
            "SELECT COUNT(*) FROM episodes WHERE run_id = ? "
            "AND state IN ('pending', 'uploading', 'sending')",
            (run_id,),
        )
        return int(rows[0][0])

    def pending_episodes(
        self, run_id: str, *, max_bytes: int, max_count: int = 100_000
    ) -> list[EpisodeRow]:
        """The oldest pending episodes, at least one, up to a byte budget: the
        uploader never holds more than one request's worth in memory."""
        rows: list[EpisodeRow] = []
        total = 0
        with _GATE:
            cursor = self._connection().execute(
                "SELECT e.seq, episode_id, rollout_number, has_traces, r.body, size, step "
                "FROM episodes e LEFT JOIN records r ON r.seq = e.seq "
                "WHERE run_id = ? AND state = 'pending' ORDER BY e.seq",
                (run_id,),
            )
            try:
                for seq, episode_id, number, has_traces, record, size, step in cursor:
                    if rows and (total + size > max_bytes or len(rows) >= max_count):
                        break
                    rows.append(EpisodeRow(seq, episode_id, number, bool(has_traces), record, step))
                    total += size
            finally:
                cursor.close()
        return rows

    def iter_episodes(self, run_id: str) -> Iterator[EpisodeRow]:
        """Every stored episode body of a run, oldest first, a page at a time."""
        last = 0
        while True:
            page = self._query(
                "SELECT e.seq, episode_id, rollout_number, has_traces, r.body, step "
                "FROM episodes e JOIN records r ON r.seq = e.seq "
                "WHERE run_id = ? AND e.seq > ? ORDER BY e.seq LIMIT 200",
                (run_id, last),
            )
            if not page:
                return
            for seq, episode_id, number, has_traces, record, step in page:
                yield EpisodeRow(seq, episode_id, number, bool(has_traces), record, step)
            last = page[-1][0]

    def open_uploads(self, run_id: str) -> list[UploadRow]:
        rows = self._query(
            "SELECT upload_id, run_id, kind, body, episodes, state, body_encoding FROM uploads "
            "WHERE run_id = ? AND state IN ('pending', 'sending') ORDER BY created_at",
            (run_id,),
        )
        return [UploadRow(*row) for row in rows]

    def pending_metrics(self, run_id: str, *, limit: int = 500) -> list[MetricsRow]:
        """Metrics rows not yet acknowledged, oldest step first."""
        rows = self._query(
            "SELECT step, row FROM metrics WHERE run_id = ? AND state = 'pending' "
            "ORDER BY step LIMIT ?",
            (run_id, limit),
        )
        return [MetricsRow(step, row) for step, row in rows]

    def metrics_counts(self, run_id: str) -> dict[str, int]:
        """Metrics rows by state: pending, delivered, failed."""
        rows = self._query(
            "SELECT state, COUNT(*) FROM metrics WHERE run_id = ? GROUP BY state", (run_id,)
        )
        return {state: count for state, count in rows}

    def step_upload(self, upload_id: str) -> StepUpload | None:
        rows = self._query(
            "SELECT upload_id, step, sample_offset, body, object_url, object_key FROM uploads "
            "WHERE upload_id = ? AND kind = 'steps'",
            (upload_id,),
        )
        return StepUpload(*rows[0]) if rows else None

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

    # -- lifecycle writes (uploader) -----------------------------------------

    def update_run(self, local_id: str, **values: Any) -> None:
        """Set run columns; the column names come from this package, never input."""
        if not values:
            return
        assignments = ", ".join(f"{name} = ?" for name in values)
        with self._transaction() as db:
            db.execute(
                f"UPDATE runs SET {assignments}, updated_at = ? WHERE local_id = ?",
                (*values.values(), time.time(), local_id),
            )

    def claim_create(self, local_id: str) -> bool:
        """Mark the create as in flight before sending it, so a crash between
        the request and its answer is recovered by lookup, not by a second run."""
        with self._transaction() as db:
            cursor = db.execute(
                "UPDATE runs SET create_state = 'creating', create_started = ? "
                "WHERE local_id = ? AND create_state = 'pending'",
                (time.time(), local_id),
            )
            return cursor.rowcount == 1

    def begin_traces_upload(
        self, run_id: str, seqs: Sequence[int], upload_id: str, body: bytes, *, encoding: str
    ) -> bool:
        """Persist an upload's bytes and claim its episodes in one transaction.

        ``body`` is stored as it will be sent (``encoding`` ``"gzip"``): a
        few times smaller than the lines, and a replay sends it unchanged.
        ``False`` when this exact upload already exists (same bytes were
        claimed before): the caller then just sends it again.
        """
        with self._transaction() as db:
            exists = db.execute(
                "SELECT 1 FROM uploads WHERE upload_id = ?", (upload_id,)
            ).fetchone()
            if exists:
                return False
            db.execute(
                "INSERT INTO uploads (upload_id, run_id, kind, body, episodes, state, created_at, "
                "body_encoding) VALUES (?, ?, 'traces', ?, ?, 'pending', ?, ?)",
                (upload_id, run_id, body, len(seqs), time.time(), encoding),
            )
            db.executemany(
                "UPDATE episodes SET state = 'uploading', upload_id = ? "
                "WHERE seq = ? AND state = 'pending'",
                [(upload_id, seq) for seq in seqs],
            )
            return True

    def commit_traces_upload(self, run_id: str, upload_id: str) -> int:
        """The receipt arrived: the episodes are delivered and their bodies
        dropped. Returns how many of them carried traces."""
        with self._transaction() as db:
            written = db.execute(
                "SELECT COUNT(*) FROM episodes WHERE upload_id = ? AND has_traces = 1 "
                "AND state = 'uploading'",
                (upload_id,),
            ).fetchone()[0]
            _commit_upload(db, upload_id)
            db.execute(
                "UPDATE runs SET traces_written = traces_written + ? WHERE local_id = ?",
                (written, run_id),
            )
            return int(written)

    def abandon_traces_uploads(self, run_id: str, *, sink: str) -> None:
        """Prime Traces is not enabled for the account: every claimed episode
        goes back to pending, for the legacy sample table (``sink``)."""
        with self._transaction() as db:
            db.execute(
                "UPDATE episodes SET state = 'pending', upload_id = NULL "
                "WHERE run_id = ? AND state = 'uploading'",
                (run_id,),
            )
            db.execute(
                "UPDATE uploads SET state = 'abandoned', body = NULL "
                "WHERE run_id = ? AND kind = 'traces' AND state = 'pending'",
                (run_id,),
            )
            db.execute("UPDATE runs SET sink = ? WHERE local_id = ?", (sink, run_id))

    def release_traces_upload(self, upload_id: str) -> None:
        """An upload the service refused whole (nothing of it stored): its
        episodes go back to pending, to be sent again in smaller uploads."""
        with self._transaction() as db:
            db.execute(
                "UPDATE episodes SET state = 'pending', upload_id = NULL "
                "WHERE upload_id = ? AND state = 'uploading'",
                (upload_id,),
            )
            db.execute(
                "UPDATE uploads SET state = 'abandoned', body = NULL WHERE upload_id = ?",
                (upload_id,),
            )

    def fail_episodes(self, run_id: str, seqs: Sequence[int], reason: str) -> None:
        """A permanent refusal: counted on the run, body kept for inspection
        (``push`` gives them another chance once the cause is fixed)."""
        with self._transaction() as db:
            db.executemany(
                "UPDATE episodes SET state = 'failed' WHERE seq = ?", [(seq,) for seq in seqs]
            )
            db.execute(
                "UPDATE runs SET failed = failed + ?, last_error = ? WHERE local_id = ?",
                (len(seqs), reason, run_id),
            )
            # An upload none of whose episodes is still in it is over.
            db.execute(
                "UPDATE uploads SET state = 'failed', body = NULL WHERE run_id = ? "
                "AND state = 'pending' AND NOT EXISTS (SELECT 1 FROM episodes "
                "WHERE episodes.upload_id = uploads.upload_id AND episodes.state = 'uploading')",
                (run_id,),
            )

    def begin_samples_request(self, run_id: str, seqs: Sequence[int]) -> str:
        """Mark episodes as *sending* before their rows go out. Should the
        process die before the answer, the next one finds them still sending
        and counts them uncertain instead of appending the rows twice."""
        upload_id = f"samples:{uuid.uuid4().hex}"
        with self._transaction() as db:
            db.execute(
                "INSERT INTO uploads (upload_id, run_id, kind, body, episodes, state, created_at) "
                "VALUES (?, ?, 'samples', NULL, ?, 'sending', ?)",
                (upload_id, run_id, len(set(seqs)), time.time()),
            )
            db.executemany(
                "UPDATE episodes SET state = 'sending', upload_id = ? WHERE seq = ?",
                [(upload_id, seq) for seq in set(seqs)],
            )
        return upload_id

    def end_samples_request(self, run_id: str, upload_id: str, outcome: str) -> int:
        """``outcome``: delivered, uncertain (may have acted) or pending (did
        not act; retried). Returns the number of episodes it touched."""
        with self._transaction() as db:
            if outcome == "delivered":
                _drop_records(db, "upload_id = ? AND state = 'sending'", (upload_id,))
            cursor = db.execute(
                "UPDATE episodes SET state = ?, "
                "upload_id = CASE WHEN ? = 'pending' THEN NULL ELSE upload_id END "
                "WHERE upload_id = ? AND state = 'sending'",
                (outcome, outcome, upload_id),
            )
            count = cursor.rowcount
            upload_state = {"delivered": "committed", "pending": "abandoned"}.get(outcome, outcome)
            db.execute(
                "UPDATE uploads SET state = ? WHERE upload_id = ?", (upload_state, upload_id)
            )
            if outcome == "uncertain":
                db.execute(
                    "UPDATE runs SET uncertain = uncertain + ? WHERE local_id = ?",
                    (count, run_id),
                )
            return count

    def end_metrics(self, run_id: str, row: MetricsRow, state: str) -> bool:
        """Record what became of a metrics row that was sent: ``delivered``
        or ``failed``. ``False`` when the step was logged again meanwhile (the
        newer row is still to be sent)."""
        with self._transaction() as db:
            cursor = db.execute(
                "UPDATE metrics SET state = ?, updated_at = ? "
                "WHERE run_id = ? AND step = ? AND row = ?",
                (state, time.time(), run_id, row.step, row.row),
            )
            return cursor.rowcount == 1

    def step_upload_count(self, run_id: str, step: int) -> int:
        """How many objects of ``step`` were begun: the next one's index."""
        rows = self._query(
            "SELECT COUNT(*) FROM uploads WHERE run_id = ? AND kind = 'steps' AND step = ?",
            (run_id, step),
        )
        return int(rows[0][0])

    def begin_step_upload(
        self, run_id: str, step: int, seqs: Sequence[int], body: bytes, sample_offset: int
    ) -> str:
        """Persist one Parquet object of ``step`` and claim its episodes, so a
        restart sends these very bytes again rather than a second object."""
        upload_id = f"steps:{uuid.uuid4().hex}"
        with self._transaction() as db:
            db.execute(
                "INSERT INTO uploads (upload_id, run_id, kind, body, episodes, state, created_at, "
                "step, sample_offset) VALUES (?, ?, 'steps', ?, ?, 'pending', ?, ?, ?)",
                (upload_id, run_id, body, len(seqs), time.time(), step, sample_offset),
            )
            db.executemany(
                "UPDATE episodes SET state = 'uploading', upload_id = ? "
                "WHERE seq = ? AND state = 'pending'",
                [(upload_id, seq) for seq in seqs],
            )
        return upload_id

    def set_step_object(self, upload_id: str, url: str | None, key: str | None) -> None:
        """Where the object goes once presigned (``None`` to presign again)."""
        with self._transaction() as db:
            db.execute(
                "UPDATE uploads SET object_url = ?, object_key = ? WHERE upload_id = ?",
                (url, key, upload_id),
            )

    def commit_step_upload(self, upload_id: str) -> None:
        """The object is confirmed: its episodes are delivered."""
        with self._transaction() as db:
            _commit_upload(db, upload_id)

    def skip_episodes(self, seqs: Sequence[int]) -> None:
        """Episodes the sample table does not take (off the step cadence, or
        not training work). Not a loss: Prime Traces would have had them, and
        the legacy table never held them."""
        with self._transaction() as db:
            db.executemany("DELETE FROM records WHERE seq = ?", [(seq,) for seq in seqs])
            db.executemany(
                "UPDATE episodes SET state = 'skipped' WHERE seq = ?", [(seq,) for seq in seqs]
            )

    def deliver_without_request(self, seqs: Sequence[int]) -> None:
        """Episodes with nothing to send to the sample table (no traces)."""
        with self._transaction() as db:
            db.executemany("DELETE FROM records WHERE seq = ?", [(seq,) for seq in seqs])
            db.executemany(
                "UPDATE episodes SET state = 'delivered' WHERE seq = ?", [(seq,) for seq in seqs]
            )

    def end_run(self, local_id: str, status: str, error: str | None) -> bool:
        """Record a run's end unless one is already recorded (the first wins)."""
        with self._transaction() as db:
            cursor = db.execute(
                "UPDATE runs SET end_status = ?, end_error = ?, ended_at = ? "
                "WHERE local_id = ? AND end_status IS NULL",
                (status, error, time.time(), local_id),
            )
            return cursor.rowcount == 1

    def set_mode(self, local_id: str, mode: str) -> None:
        """Switch where a run goes. A local run taken online (``push``) is
        reopened: being closed in the local store says nothing about the
        platform, which has not seen the run yet."""
        with self._transaction() as db:
            db.execute(
                "UPDATE runs SET close_state = CASE WHEN mode = 'local' AND ? = 'online' "
                "THEN 'open' ELSE close_state END, mode = ?, updated_at = ? WHERE local_id = ?",
                (mode, mode, time.time(), local_id),
            )

    def reopen_failed(self, local_id: str) -> int:
        """Give refused episodes and a failed create another chance (``push``)."""
        with self._transaction() as db:
            cursor = db.execute(
                "UPDATE episodes SET state = 'pending', upload_id = NULL "
                "WHERE run_id = ? AND state = 'failed' "
                "AND EXISTS (SELECT 1 FROM records r WHERE r.seq = episodes.seq)",
                (local_id,),
            )
            db.execute(
                "UPDATE runs SET failed = MAX(0, failed - ?), "
                "create_state = CASE WHEN create_state = 'failed' THEN 'pending' "
                "ELSE create_state END, "
                "close_state = CASE WHEN close_state = 'gave_up' THEN 'open' "
                "ELSE close_state END WHERE local_id = ?",
                (cursor.rowcount, local_id),
            )
            db.execute(
                "UPDATE metrics SET state = 'pending' WHERE run_id = ? AND state = 'failed'",
                (local_id,),
            )
            return cursor.rowcount

    # -- the delivery lease --------------------------------------------------

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

    def release_lease(self, owner: str) -> None:
        with self._transaction() as db:
            db.execute("DELETE FROM lease WHERE name = 'uploader' AND owner = ?", (owner,))


def _enable_wal(db: sqlite3.Connection, timeout: float = 60.0) -> None:
    """Put the spool in WAL mode, waiting out another process doing the same.

    Switching a new database to WAL takes an exclusive lock, and SQLite
    answers "database is locked" at once (its busy handler is not asked)
    to a second process that opens the file meanwhile."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            db.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.01)


def _commit_upload(db: sqlite3.Connection, upload_id: str) -> None:
    """An upload the platform confirmed: its episodes are delivered, and
    neither their bodies nor the upload's are kept."""
    _drop_records(db, "upload_id = ? AND state = 'uploading'", (upload_id,))
    db.execute(
        "UPDATE episodes SET state = 'delivered' WHERE upload_id = ? AND state = 'uploading'",
        (upload_id,),
    )
    db.execute(
        "UPDATE uploads SET state = 'committed', body = NULL WHERE upload_id = ?", (upload_id,)
    )


def _drop_records(db: sqlite3.Connection, where: str, params: Sequence[Any]) -> None:
    """Delete the bodies of the episodes ``where`` selects: delivered, they
    are the platform's now (the episode row stays, for its state and counts)."""
    db.execute(f"DELETE FROM records WHERE seq IN (SELECT seq FROM episodes WHERE {where})", params)


#: Rows per multi-row statement: well inside SQLite's 32,766 bound variables.
_ROWS_PER_STATEMENT = 500


def _chunks(items: Sequence[Any], size: int = _ROWS_PER_STATEMENT) -> Iterator[Sequence[Any]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def _aggregate(
    db: sqlite3.Connection,
    aggregate: str,
    table: str,
    run_id: str,
    column: str,
    values: Sequence[Any],
) -> Iterator[Any]:
    """``aggregate`` (a ``json_group_*`` expression) over the rows of a run
    whose ``column`` is among ``values``, parsed, one statement per chunk:
    a read costs one statement however many rows it covers."""
    for chunk in _chunks(values):
        marks = ", ".join("?" * len(chunk))
        (text,) = db.execute(
            f"SELECT {aggregate} FROM {table} WHERE run_id = ? AND {column} IN ({marks})",
            (run_id, *chunk),
        ).fetchone()
        yield json.loads(text)


def _insert_rows(
    db: sqlite3.Connection, target: str, rows: Sequence[tuple[Any, ...]], *, suffix: str = ""
) -> None:
    """``INSERT INTO target VALUES (...), (...), ...`` in as few statements as fit."""
    if not rows:
        return
    width = len(rows[0])
    row_marks = "(" + ", ".join("?" * width) + ")"
    for chunk in _chunks(rows):
        values = ", ".join([row_marks] * len(chunk))
        flat = [value for row in chunk for value in row]
        db.execute(f"INSERT INTO {target} VALUES {values} {suffix}", flat)
