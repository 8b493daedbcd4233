"""The spool's core: where its connections come from, how a write becomes
one transaction, and the fork gate that keeps SQLite safe across ``fork()``.

Why SQLite: ``export()`` must commit a batch durably in one transaction and
return, several processes (forked workers, a second producer, ``push``) may
write the same file at once, and a process killed with ``kill -9`` must leave
nothing half-written. WAL mode gives all three with no server.

Every other module of the spool reads through :meth:`SpoolCore._query` and
writes through :meth:`SpoolCore._transaction`, and nothing else touches a
connection.
"""

from __future__ import annotations

import logging
import math
import os
import sqlite3
import threading
import time
import urllib.parse
import weakref
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from ..._text import shown
from ...errors import PrimeRunsOtelError
from . import files, schema

logger = logging.getLogger(__name__)

#: The page size of a spool created here (an existing file keeps its own:
#: in WAL mode SQLite cannot change it). An episode of ~8 KB then fits in
#: one page instead of a leaf and a chain of overflow pages, so a commit
#: writes about half as many frames to the write-ahead log, each a write of
#: its own: ``bench/spool_ingest.py``, 64 episodes of ~8 KB per commit, took
#: 0.174 ms of CPU per episode instead of 0.188 with 4 KiB pages (medians of
#: 8 interleaved rounds; 16 KiB pages did not pay).
PAGE_SIZE = 8192

#: Bytes of write-ahead log after which a commit checkpoints by itself (set
#: in pages of the file's own size). The uploader checkpoints between its
#: uploads, at most once a second (``CHECKPOINT_PACE``), so this is the
#: fallback for a spool nobody delivers from; at
#: SQLite's 1,000 pages the commits of export() kept doing the copying
#: (100-300 ms each at 1,400 episodes/s).
AUTOCHECKPOINT_BYTES = 256 * 1024 * 1024
#: The same in pages of a spool created here.
AUTOCHECKPOINT_PAGES = AUTOCHECKPOINT_BYTES // PAGE_SIZE

#: The uploader checkpoints at most once in this many seconds (``checkpoint``
#: with ``paced``). A checkpoint waits for the disk twice (the log, then the
#: database), and one between every two uploads held up the next one: at a
#: steady pace an episode committed meanwhile waited for it. Skipping some
#: loses nothing (the log holds every commit; a checkpoint only copies it
#: into the database), and a second's commits keep the log short, far
#: below ``AUTOCHECKPOINT_BYTES``.
CHECKPOINT_PACE = 1.0
#: Paced only while the disk has this much free: a checkpoint lets the log
#: start over instead of growing, and on a disk nearly full (a small one, or
#: one that filled up) the log would grow into the room that episodes and
#: the spool's next opening need. Below it every checkpoint goes.
CHECKPOINT_PACED_ROOM = AUTOCHECKPOINT_BYTES


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
            # A thread inside already goes deeper: the fork waits for it to
            # leave anyway, and holding it here would wait for the fork.
            while self._closed_by is not None and self._closed_by != me and me not in self._inside:
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


class SpoolFullError(SpoolError):
    """A write refused because the spool's disk is full (see ``size.py``)."""


@contextmanager
def _synchronous(db: sqlite3.Connection, fsync: bool) -> Iterator[None]:
    """The writer's ``synchronous`` for one transaction: FULL (``fsync``),
    or NORMAL and FULL again after it.

    NORMAL (in WAL mode): the commit does not wait for the disk. A process
    that crashes still leaves it in the spool (the write-ahead log is
    written, the file system holds it); a power cut may take it back, and
    only with what came after it, as the log is replayed in order and the
    next commit that waits for the disk makes it durable too. Only for a
    write whose loss the next process makes good by itself.
    """
    if fsync:
        yield
        return
    db.execute("PRAGMA synchronous=NORMAL")
    try:
        yield
    finally:
        db.execute("PRAGMA synchronous=FULL")


_Spool = TypeVar("_Spool", bound="SpoolCore")


class SpoolCore:
    """Connections, transactions and the schema of one spool file.

    Thread-safe (a connection per thread) and process-safe (SQLite locking).
    """

    #: Opened with :meth:`open_read_only`: nothing is created, nothing written.
    _read_only = False

    def __init__(
        self, path: str | os.PathLike[str], *, max_bytes: int, keep_delivered: bool = True
    ) -> None:
        """``keep_delivered``: whether the runs this process starts keep their
        episode bodies once delivered (``PRIME_RUNS_OTEL_KEEP_DELIVERED``),
        for ``show``, ``ui`` and ``export`` to read; at the size cap the
        oldest of them make room before any new episode is refused."""
        self.path = Path(path)
        self.max_bytes = max_bytes
        self.keep_delivered = keep_delivered
        self._local = threading.local()
        self._warned_full = False  # see size.py
        self._reported_damaged: set[str] = set()  # see runs.py
        self._indexes_usable: dict[str, bool] = {}  # see index_made
        #: The viewer's aggregates folded in memory, not in the file (folds.py).
        self.views_in_memory = False
        self._folds_stored: bool | None = None  # see views_folded_on_view
        try:
            # Private when created here: records hold prompts and completions.
            self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as exc:
            raise SpoolError(
                f"cannot create the spool folder {str(self.path.parent)!r}: {exc}. "
                "Set PRIME_RUNS_OTEL_DIR to a writable folder."
            ) from exc
        files.warn_if_shared(self.path.parent)
        _refuse_unsafe(self.path)
        try:
            files.create_private(self.path)
        except OSError as exc:
            raise SpoolError(
                f"cannot create the spool {str(self.path)!r}: {exc}. Check that the folder is "
                "writable, or set PRIME_RUNS_OTEL_DIR to another one."
            ) from exc
        self._writer_db: sqlite3.Connection | None = None
        self._writer_pid = 0
        #: When this process last checkpointed (monotonic), for ``paced``.
        self._checkpointed_at = -math.inf
        self._init_schema()
        _refuse_unsafe(self.path)  # again, with the companions SQLite made by now

    @property
    def read_only(self) -> bool:
        """Whether this spool was opened with :meth:`open_read_only`."""
        return self._read_only

    @classmethod
    def open_read_only(cls: type[_Spool], path: str | os.PathLike[str]) -> _Spool:
        """An existing spool opened for reading only: a store this user may
        read but not write (a shared results folder, a mounted backup, a
        read-only file system). Nothing is created or tightened, the schema
        is not migrated, and a write raises :class:`SpoolError` naming the
        folder (see :func:`_open_read_only`)."""
        spool = cls.__new__(cls)
        spool.path = Path(path)
        spool.max_bytes = 0
        spool.keep_delivered = True
        spool._local = threading.local()
        spool._warned_full = False
        spool._reported_damaged = set()
        spool._indexes_usable = {}
        spool.views_in_memory = True
        spool._folds_stored = None
        spool._writer_db = None
        spool._writer_pid = 0
        spool._checkpointed_at = -math.inf
        spool._read_only = True
        try:
            version = schema.stored_version(spool._connection())
        except sqlite3.DatabaseError as exc:
            raise SpoolError(f"cannot read the spool {str(spool.path)!r}: {exc}") from exc
        if version != schema.SCHEMA_VERSION:
            raise SpoolError(
                f"the spool {str(spool.path)!r} was written by "
                f"{'a newer' if version > schema.SCHEMA_VERSION else 'an earlier'} "
                f"prime-runs-otel (schema {version}, this release reads "
                f"{schema.SCHEMA_VERSION}), and this user cannot write it to bring it up to "
                "date: read it with the release that wrote it, or copy the folder somewhere "
                "writable and point PRIME_RUNS_OTEL_DIR at the copy"
            )
        return spool

    def read_only_error(self) -> SpoolError:
        """The error for a write to a spool opened with :meth:`open_read_only`."""
        return SpoolError(
            f"this needs to write to the local store in {str(self.path.parent)!r}, which this "
            "user cannot write: run it as the store's owner, or copy the folder somewhere "
            "writable and point PRIME_RUNS_OTEL_DIR (or --spool-dir) at the copy"
        )

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
        if self._read_only:
            return _open_read_only(self.path, check_same_thread=check_same_thread)
        try:
            return self._connect(check_same_thread)
        except sqlite3.Error as exc:
            if not self._reserve_released_to_open(exc):
                raise self._open_error(exc) from exc
        try:
            return self._connect(check_same_thread)
        except sqlite3.Error as exc:
            raise self._open_error(exc) from exc

    def _connect(self, check_same_thread: bool) -> sqlite3.Connection:
        db = sqlite3.connect(
            self.path,
            timeout=60.0,
            isolation_level=None,
            factory=_Connection,
            check_same_thread=check_same_thread,
        )
        try:
            # Only a new, empty file takes these (before its first page is
            # written); an existing one keeps its own (see space.py).
            db.execute(f"PRAGMA page_size = {PAGE_SIZE}")
            db.execute("PRAGMA auto_vacuum = INCREMENTAL")
            _enable_wal(db)
            db.execute("PRAGMA synchronous=FULL")
            db.execute("PRAGMA busy_timeout=60000")
            # Some builds (Debian's) default to secure_delete=ON, which zeroes
            # every freed page: dropping a delivered body then costs as much
            # as writing it. FAST zeroes only pages written anyway; a freed
            # body may linger in free pages until reused, as the live ones
            # sit in the clear: the spool's folder is what keeps them private.
            db.execute("PRAGMA secure_delete=FAST")
            # The uploader checkpoints between passes (see checkpoint());
            # SQLite's own, in whatever commit crosses this, is the fallback.
            (page_size,) = db.execute("PRAGMA page_size").fetchone()
            db.execute(f"PRAGMA wal_autocheckpoint={AUTOCHECKPOINT_BYTES // page_size}")
        except BaseException:
            db.close()
            raise
        _open_connections.add(db)
        return db

    def _reserve_released_to_open(self, exc: sqlite3.Error) -> bool:
        """On a full disk a connection cannot be opened: the write-ahead
        log's files need room before the first read. The disk's reserve is
        kept for delivery to drain the spool by, and opening is the first
        step of it (``push`` after another program filled the disk): it is
        released here, as for any write the full disk refuses (``size.py``).
        Whether it was (then try again)."""
        full = _is_full(exc) or "unable to open database file" in str(exc)
        return full and files.release_reserve(self.path)

    def _open_error(self, exc: sqlite3.Error) -> SpoolError:
        return SpoolError(
            f"cannot open the spool {str(self.path)!r}: {exc}. Check that the folder is "
            "writable and its disk has room, or set PRIME_RUNS_OTEL_DIR to another one."
        )

    @contextmanager
    def _transaction(self, *, fsync: bool = True) -> Iterator[sqlite3.Connection]:
        """One write transaction. ``fsync=False``: its commit does not wait
        for the disk (:func:`_synchronous`)."""
        if self._read_only:
            raise self.read_only_error()
        with _WRITER, _GATE:
            db = self._writer_connection()
            with _synchronous(db, fsync), self._committed(db):
                yield db

    @contextmanager
    def _committed(self, db: sqlite3.Connection) -> Iterator[None]:
        """BEGIN, then COMMIT, or ROLLBACK on the way out of an exception."""
        db.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException as exc:
            # SQLite rolls back by itself on some errors (a full disk):
            # a second rollback would hide the error that explains it.
            if db.in_transaction:
                db.execute("ROLLBACK")
            if _is_damage(exc):
                raise self.damaged(str(exc)) from exc
            if _is_full(exc):
                raise self.full() from exc
            raise
        else:
            try:
                db.execute("COMMIT")
            except sqlite3.OperationalError as exc:
                if db.in_transaction:
                    db.execute("ROLLBACK")
                if _is_full(exc):
                    raise self.full() from exc
                raise

    def checkpoint(self, *, paced: bool = False) -> None:
        """Copy committed pages from the write-ahead log into the database
        without waiting for anyone (PASSIVE: writers carry on meanwhile).
        Best effort: on a full disk it waits for the next one (a file size
        limit makes SQLite say "disk I/O error" there; the log keeps the pages
        either way). ``paced``: nothing when this process checkpointed less
        than ``CHECKPOINT_PACE`` ago, on a disk with room for the log to grow."""
        now = time.monotonic()
        if paced and now - self._checkpointed_at < CHECKPOINT_PACE and self._room_for_log():
            return
        self._checkpointed_at = now
        with _GATE:
            try:
                self._connection().execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
            except sqlite3.OperationalError as exc:
                if not (_is_full(exc) or "disk I/O error" in str(exc)):
                    raise
                logger.debug("checkpointing the spool %s waits for room: %s", self.path, exc)

    def _room_for_log(self) -> bool:
        """Whether the spool's disk has ``CHECKPOINT_PACED_ROOM`` free."""
        free = files.disk_free(self.path.parent)
        return free is not None and free >= CHECKPOINT_PACED_ROOM

    def full(self) -> SpoolFullError:
        """The error for a write refused because the spool's disk is full."""
        return SpoolFullError(
            f"the disk holding the spool {str(self.path)!r} is full. Free space on it, or "
            "move PRIME_RUNS_OTEL_DIR to a larger disk; nothing stored is lost, and delivery "
            "frees room as it goes"
        )

    def _query(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        """Every row of one read, fetched whole so no statement stays open."""
        with _GATE:
            try:
                return self._connection().execute(sql, params).fetchall()
            except sqlite3.DatabaseError as exc:
                if _is_damage(exc):
                    raise self.damaged(str(exc)) from exc
                raise

    def damaged(self, detail: str) -> SpoolError:
        """The error for a spool file damaged on disk: which file, and what to do."""
        return SpoolError(
            f"the spool {str(self.path)!r} is damaged ({shown(detail)}). Stop every process "
            f"using it, move it aside (mv {self.path} {self.path}.damaged) and keep it for "
            "inspection: a new spool is created in its place. `sqlite3 <file> .recover` may "
            "save what is still readable"
        )

    def _init_schema(self) -> None:
        try:
            with _WRITER, _GATE:
                schema.create_tables(self._writer_connection())
            with self._transaction() as db:
                version = schema.stored_version(db)
                if version > schema.SCHEMA_VERSION:
                    raise SpoolError(
                        f"the spool was written by a newer prime-runs-otel (schema {version}, "
                        f"this release reads {schema.SCHEMA_VERSION}): upgrade prime-runs-otel, "
                        "or point PRIME_RUNS_OTEL_DIR at another folder"
                    )
                schema.migrate(db, version)
        except sqlite3.Error as exc:
            raise SpoolError(f"cannot initialise the spool {str(self.path)!r}: {exc}") from exc

    def index_made(self, name: str) -> bool:
        """Whether the index ``name`` (one of ``schema.MADE_ON_FIRST_USE``)
        is there to read through, made now if it is not: asked once per
        index and process, so only the first page that needs it pays.

        It is made in one write transaction, which waits its turn behind a
        run being written (the busy timeout) and holds the next commit back
        while it is built. Where it cannot be made (a store this user cannot
        write, a full disk) it is said once in the log and ``False`` is the
        answer: the caller reads without it, the same rows, slower."""
        usable = self._indexes_usable.get(name)
        if usable is None:
            usable = self._make_index(name)
            self._indexes_usable[name] = usable
        return usable

    def _make_index(self, name: str) -> bool:
        present = self._query(
            "SELECT 1 FROM sqlite_master WHERE type = 'index' AND name = ?", (name,)
        )
        if present:
            return True
        if self._read_only:
            logger.warning(
                "the store %s has no index %s and this user cannot write it: pages sorted by "
                "its value are read without it (the same rows, slower on a large run)",
                self.path.parent,
                name,
            )
            return False
        started = time.monotonic()
        try:
            with self._transaction() as db:
                db.execute(schema.index_on_first_use(name))
        except (SpoolError, sqlite3.Error) as exc:
            logger.warning(
                "could not make the index %s of the spool %s (%s): pages sorted by its value "
                "are read without it (the same rows, slower on a large run)",
                name,
                self.path,
                shown(str(exc)),
            )
            return False
        logger.info("made the index %s in %.1f s", name, time.monotonic() - started)
        return True

    def views_folded_on_view(self) -> bool:
        """Whether this spool's episodes may wait to be folded into the
        viewer's aggregates (``folds.py``): not in a store an earlier
        release wrote and this user cannot bring up to date (no
        ``view_facts``: every episode was folded as it was stored)."""
        if self._folds_stored is None:
            columns = self._query("PRAGMA table_info(episodes)")
            self._folds_stored = any(column[1] == "view_facts" for column in columns)
        return self._folds_stored

    @contextmanager
    def private_transaction(self) -> Iterator[sqlite3.Connection]:
        """This thread's reading connection in a transaction, for writes to
        its own temporary tables (``folds.py``), which no other connection
        sees and a read-only store takes: the file itself is only read."""
        with _GATE:
            db = self._connection()
            db.execute("BEGIN")
            try:
                yield db
            except BaseException:
                if db.in_transaction:
                    db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")

    def _run_script(self, sql: str) -> None:
        """Statements run to their end outside any transaction, on the
        writer (a ``VACUUM``, a ``PRAGMA`` that works a step at a time)."""
        with _WRITER, _GATE:
            self._writer_connection().executescript(sql)

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


def _open_read_only(path: Path, *, check_same_thread: bool) -> sqlite3.Connection:
    """A connection that never writes: SQLite's read-only mode, or, where the
    write-ahead log's index cannot be created or written beside the file (a
    folder this user cannot write), the file as it is on disk (``immutable``:
    no locks; a log left by a writer that was killed is then not read)."""
    uri = "file:" + urllib.parse.quote(str(path)) + "?mode=ro"
    for flags in ("", "&immutable=1"):
        try:
            db = sqlite3.connect(
                uri + flags,
                uri=True,
                timeout=60.0,
                isolation_level=None,
                factory=_Connection,
                check_same_thread=check_same_thread,
            )
        except sqlite3.Error as exc:
            raise SpoolError(f"cannot open the spool {str(path)!r} to read it: {exc}") from exc
        try:
            db.execute("PRAGMA busy_timeout=60000")
            db.execute("SELECT count(*) FROM sqlite_master").fetchall()
        except sqlite3.OperationalError as exc:
            db.close()
            if flags:
                raise SpoolError(f"cannot read the spool {str(path)!r}: {exc}") from exc
            continue
        _open_connections.add(db)
        return db
    raise AssertionError("not reached")


def _is_damage(exc: BaseException) -> bool:
    """Whether a SQLite error means the file is damaged (not busy, not full)."""
    if type(exc) is sqlite3.DatabaseError:  # "malformed", "not a database"
        return True
    return isinstance(exc, sqlite3.OperationalError) and "Could not decode" in str(exc)


#: SQLite's result code for a full disk (or a file at its page limit).
_SQLITE_FULL = 13


def _is_full(exc: BaseException) -> bool:
    """Whether a SQLite error means the disk (or the file's page limit) is full."""
    if not isinstance(exc, sqlite3.OperationalError):
        return False
    code = getattr(exc, "sqlite_errorcode", None)
    return code == _SQLITE_FULL or "database or disk is full" in str(exc)


def _refuse_unsafe(path: Path) -> None:
    """Stop before writing a store file that is not this user's alone
    (another user's, writable by others, a link): see ``files.py``."""
    problem = files.store_problem(path)
    if problem is not None:
        raise SpoolError(problem)


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
