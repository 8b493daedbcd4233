"""Folding a run's new episodes into what the viewer shows of it
(``views.py``'s aggregates), when a view asks for them rather than as each
episode is stored.

Why on view: folding in the commit that stores an episode cost every
``export()`` about a fifth of its commit's CPU (histogram and series
upserts, docs/performance.md), for aggregates most runs are never viewed
by, and those viewed are viewed long after most of their episodes came in.
A fold of thousands of episodes at once also writes each histogram bucket
and series point once, where the commits wrote them once per batch.

How far a run is folded is the seq of the last episode folded in
(``run_folds``): the episodes above it are folded in seq order (their
arrival order), a chunk per write transaction, each chunk moving the
aggregates and the mark together, so a fold cut short (a crash, a full
disk) leaves both where its last chunk did, and another process folding
the same run meanwhile finds the mark moved and folds only what is left.
A run still being written gets its new episodes above the mark, for the
next view.

Above the mark, an episode without ``view_facts`` was folded as it was
stored (an earlier release writing this spool) or has no facts yet (stored
before they were kept, read by ``SpoolViews.read_stored``, which folds it
then): it is passed over but still counts for the ordinals. The ordinal of
the first episode above the mark is the run's count of episodes less those
above it: the place the commit would have given it. (A run an earlier
release removed leaves its mark behind, harmless: a seq is never given
twice, and the ordinals come from the run's count.)

A store this user cannot write (or whose fold fails) is folded in memory:
this connection's temporary tables of the same names, which SQLite reads
before the file's, hold a copy of each run's aggregates as the file has
them, folded on from the file's mark. Every read of the aggregates folds its
run first, so a run is copied before anything of it is read there.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..._text import shown
from .core import SpoolError
from .part import SpoolPart
from .schema import VIEW_TABLES
from .views import ViewEpisode, add_to_views, from_view_facts

logger = logging.getLogger(__name__)

#: Episodes folded per write transaction: a producer writing the same spool
#: waits for one chunk at most.
FOLD_CHUNK = 5000
#: The same for a fold ahead of the pages (``ViewFolds.fold_ahead``), and
#: its pause after each chunk, in seconds: about 7 ms of folding, then room
#: for the pages.
AHEAD_CHUNK = 500
AHEAD_PAUSE = 0.02
#: How many unfolded episodes the delivery of a run lets pile up before it
#: folds them (``ViewFolds.fold_behind``): a view then folds a few thousand
#: at most, whatever the run's length.
FOLD_BEHIND = 5000
#: Episodes per write transaction of that fold: about 7 ms of the writer
#: lock and of the interpreter, which an ``export()`` waits for at most.
BEHIND_CHUNK = 500

_ROW = (
    "seq, episode_id, step, ok, reward, tokens, duration, error_type, example, stored_at, "
    "view_facts"
)


@dataclass(frozen=True)
class FoldMark:
    """How far a run is folded: its last episode folded in, and the ordinal
    of the next one."""

    seq: int
    ordinal: int


def fold_chunk(
    db: sqlite3.Connection, run_id: str, carried: FoldMark | None, limit: int = FOLD_CHUNK
) -> tuple[int, FoldMark]:
    """Fold up to ``limit`` of the run's episodes above its mark, inside the
    caller's transaction; returns how many were passed (folded or not) and
    the new mark. ``carried``: the mark the previous chunk of this fold
    left, which saves counting the episodes above it again, unless another
    fold moved it meanwhile."""
    mark = _mark(db, run_id, carried)
    rows = db.execute(
        f"SELECT {_ROW} FROM episodes INDEXED BY episodes_by_run "
        "WHERE run_id = ? AND seq > ? ORDER BY seq LIMIT ?",
        (run_id, mark.seq, limit),
    ).fetchall()
    if not rows:
        return 0, mark
    add_to_views(db, run_id, _episodes(rows, mark.ordinal))
    last = rows[-1][0]
    db.execute(
        "INSERT INTO run_folds (run_id, seq) VALUES (?, ?) "
        "ON CONFLICT (run_id) DO UPDATE SET seq = excluded.seq",
        (run_id, last),
    )
    return len(rows), FoldMark(last, mark.ordinal + len(rows))


#: Whether a run has episodes above its mark (its id twice): two index seeks.
UNFOLDED_SQL = (
    "SELECT 1 FROM episodes INDEXED BY episodes_by_run WHERE run_id = ? "
    "AND seq > (SELECT COALESCE(MAX(seq), 0) FROM run_folds WHERE run_id = ?) LIMIT 1"
)


#: Whether a run has more than a given number of episodes above its mark
#: (its id twice, then the number): an index range of that many entries.
UNFOLDED_BEYOND_SQL = (
    "SELECT 1 FROM episodes INDEXED BY episodes_by_run WHERE run_id = ? "
    "AND seq > (SELECT COALESCE(MAX(seq), 0) FROM run_folds WHERE run_id = ?) "
    "ORDER BY seq LIMIT 1 OFFSET ?"
)


def _folded_to(db: sqlite3.Connection, run_id: str) -> int:
    row = db.execute("SELECT seq FROM run_folds WHERE run_id = ?", (run_id,)).fetchone()
    return int(row[0]) if row else 0


def _mark(db: sqlite3.Connection, run_id: str, carried: FoldMark | None) -> FoldMark:
    seq = _folded_to(db, run_id)
    if carried is not None and carried.seq == seq:
        return carried
    row = db.execute("SELECT episodes FROM runs WHERE local_id = ?", (run_id,)).fetchone()
    (above,) = db.execute(
        "SELECT COUNT(*) FROM episodes INDEXED BY episodes_by_run WHERE run_id = ? AND seq > ?",
        (run_id, seq),
    ).fetchone()
    return FoldMark(seq, max(0, (int(row[0]) if row else 0) - int(above)))


def _episodes(rows: Sequence[Sequence[Any]], ordinal: int) -> list[ViewEpisode]:
    """The rows (``_ROW``) with ``view_facts`` as episodes to fold, the
    first at ``ordinal``; one loop, no call per episode but the tuple's."""
    episodes = []
    for index, row in enumerate(rows):
        _, episode_id, step, ok, reward, tokens, duration, error, example, stored_at, text = row
        if text is None:
            continue  # folded as it was stored, or read later (see the module's docstring)
        latencies, metrics, message = from_view_facts(text)
        episodes.append(
            ViewEpisode(
                ordinal + index,
                episode_id,
                step,
                ok == 1,
                reward,
                tokens,
                duration,
                error,
                example,
                stored_at or 0.0,
                latencies,
                metrics,
                message,
            )
        )
    return episodes


def copy_to_memory(db: sqlite3.Connection, run_id: str) -> None:
    """This connection's temporary view tables, with the run's rows as the
    file has them, unless they hold the run already (a row in ``run_folds``)."""
    db.execute("PRAGMA temp_store = MEMORY")
    for statement in VIEW_TABLES.values():
        db.execute(statement.replace("CREATE TABLE", "CREATE TEMP TABLE", 1))
    if db.execute("SELECT 1 FROM temp.run_folds WHERE run_id = ?", (run_id,)).fetchone():
        return
    for name in VIEW_TABLES:
        # By name: a column added in place may sit elsewhere in the file's
        # table. rollouts keeps its rowids: the compare page samples by them.
        columns = ", ".join(row[1] for row in db.execute(f"PRAGMA temp.table_info({name})"))
        if name == "rollouts":
            columns = f"rowid, {columns}"
        db.execute(
            f"INSERT INTO temp.{name} ({columns}) SELECT {columns} FROM main.{name} "
            "WHERE run_id = ?",
            (run_id,),
        )
    db.execute("INSERT OR IGNORE INTO temp.run_folds (run_id, seq) VALUES (?, 0)", (run_id,))


class ViewFolds(SpoolPart):
    """Folding a run's new episodes before its aggregates are read (``reading``)."""

    def fold_ahead(self, stop: threading.Event) -> int:
        """Fold every run with new episodes into the file, the run written
        last first, until ``stop`` is set: what ``ui`` does while it serves,
        so that a run's first page finds its episodes folded. Nothing in a
        store folded in memory (each reading connection holds its own
        copy). Returns how many runs were folded.

        In small chunks with a pause after each (:data:`AHEAD_CHUNK`,
        :data:`AHEAD_PAUSE`): a fold is Python from end to end, and a page
        served by the same process meanwhile would wait a switch interval
        (5 ms) for the interpreter at each of its SQLite calls."""
        if not self._core.views_folded_on_view() or self._core.views_in_memory:
            return 0
        folded = 0
        for (run_id,) in self._query("SELECT local_id FROM runs ORDER BY updated_at DESC"):
            if stop.is_set() or self._core.views_in_memory:
                break
            if self._query(UNFOLDED_SQL, (run_id, run_id)):
                self._fold_in_file(run_id, AHEAD_CHUNK, lambda: stop.wait(AHEAD_PAUSE))
                folded += 1
        return folded

    def fold_behind(
        self, run_id: str, behind: int = FOLD_BEHIND, between: Callable[[], bool] = lambda: False
    ) -> bool:
        """Fold the run into the file once it has ``behind`` episodes or more
        above its mark (0: any), all of them, :data:`BEHIND_CHUNK` per
        transaction, calling ``between`` between chunks (True stops): what
        the process delivering a run does as it goes and at the run's end,
        so a view never has more than ``behind`` to fold. Returns whether
        it folded. Never raises: a fold that fails (a full disk) is left to
        the view, and the delivery goes on."""
        if not self._core.views_folded_on_view() or self._core.views_in_memory:
            return False
        try:
            if not self._query(UNFOLDED_BEYOND_SQL, (run_id, run_id, max(0, behind - 1))):
                return False
            self._fold_chunks(run_id, BEHIND_CHUNK, between)
        except (SpoolError, sqlite3.Error) as exc:
            logger.debug("run %s: not folded ahead of its views (%s)", run_id, shown(str(exc)))
            return False
        return True

    def _folded(self, *run_ids: str) -> None:
        """Bring the aggregates of ``run_ids`` up to their last episode."""
        if not self._core.views_folded_on_view():
            return  # a store written before folds: every episode folded as stored
        for run_id in run_ids:
            if self._core.views_in_memory:
                self._fold_in_memory(run_id)
            elif self._query(UNFOLDED_SQL, (run_id, run_id)):
                self._fold_in_file(run_id)

    def _fold_in_file(
        self,
        run_id: str,
        limit: int = FOLD_CHUNK,
        stopped_between: Callable[[], bool] = lambda: False,
    ) -> None:
        """Fold ``run_id`` a chunk of ``limit`` episodes per transaction;
        ``stopped_between`` is called between chunks (a pause), and stops
        the fold when it answers True."""
        try:
            self._fold_chunks(run_id, limit, stopped_between)
        except (SpoolError, sqlite3.Error) as exc:
            logger.warning(
                "could not fold the new episodes of run %s into what the viewer shows of it "
                "(%s): this process folds them in memory from now on (the same figures, "
                "folded again at each start)",
                run_id,
                shown(str(exc)),
            )
            self._core.views_in_memory = True
            self._fold_in_memory(run_id)

    def _fold_chunks(self, run_id: str, limit: int, stopped_between: Callable[[], bool]) -> None:
        carried: FoldMark | None = None
        while True:
            with self._transaction() as db:
                passed, carried = fold_chunk(db, run_id, carried, limit)
            if passed < limit or stopped_between():
                return

    def _fold_in_memory(self, run_id: str) -> None:
        with self._core.private_transaction() as db:
            copy_to_memory(db, run_id)
            carried: FoldMark | None = None
            while True:
                passed, carried = fold_chunk(db, run_id, carried)
                if passed < FOLD_CHUNK:
                    return
