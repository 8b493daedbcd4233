"""The ``runs`` table: one row per producer run key (``prime.run.id``):
identity, config, platform id once created, lifecycle state, the running
summary (aggregated incrementally, never recomputed from a list of episodes)
and loss counters."""

from __future__ import annotations

import json
import logging
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..._text import shown
from ...read.projection import SummaryAccumulator
from ...read.records import RunBatch, RunEnd, RunIdentity, RunStart
from .core import SpoolError
from .part import SpoolPart

logger = logging.getLogger(__name__)


class DamagedRunError(SpoolError):
    """One run's row cannot be read back (damaged on disk, or written by
    hand). It costs only that run: every listing and every delivery pass
    leaves it out and names it, and the other runs go on."""

    def __init__(self, path: Path, local_id: str, detail: str) -> None:
        super().__init__(
            f"run {shown(local_id)} in the spool {str(path)!r} cannot be read back "
            f"({shown(detail)}): its row is damaged. Every other run is unaffected. Keep the "
            f"spool for inspection, or remove the run (its episodes go with it): "
            f"`prime-runs-otel rm --force {shown(local_id)}`"
        )
        self.local_id = local_id


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
    #: The producer's own summary, which replaces the aggregated one.
    end_summary: dict[str, Any] | None = None
    #: Episodes the producer could not encode (reported with the run's end).
    unencodable: int = 0
    #: Episodes that arrived after the run was closed, and of those the ones
    #: the platform refused (late and undelivered).
    late: int = 0
    late_refused: int = 0

    @property
    def closed(self) -> bool:
        """Closed where it lives: on the platform, or in the local store."""
        return self.close_state == "closed"

    @property
    def settled(self) -> bool:
        """Nothing more will happen without help: closed, or given up on
        (``prime-runs-otel push`` tries again)."""
        return self.close_state in ("closed", "gave_up")

    @property
    def stopped(self) -> bool:
        """Delivery stopped on a permanent refusal (a credential refused, an
        environment that does not exist): retrying cannot help, so nobody
        should wait for it; ``push`` tries again once the cause is fixed."""
        return self.close_state == "gave_up" or self.create_state == "failed"


@dataclass(frozen=True)
class RunAtIngest:
    """What ``ingest`` needs of a run's row, read once per batch: its running
    summary, and whether its delivery stopped (``RunRow.stopped``: its
    episodes take room from the stopped runs' share)."""

    summary: SummaryAccumulator
    stopped: bool = False


def ensure_run(
    db: sqlite3.Connection,
    identity: RunIdentity,
    *,
    mode: str,
    now: float,
    keep_records: bool = True,
) -> RunAtIngest:
    """The run as ``ingest`` needs it, creating it on first sight (an
    attached run starts as created: the platform already has it), keeping
    its bodies after delivery or not (``keep_records``). One read of the
    row per batch: the summary and the stop come together."""
    row = db.execute(
        "SELECT summary_state, create_state = 'failed' OR close_state = 'gave_up' "
        "FROM runs WHERE local_id = ?",
        (identity.local_id,),
    ).fetchone()
    if row is not None:
        state, stopped = row
        return RunAtIngest(SummaryAccumulator.from_state(json.loads(state)), bool(stopped))
    summary = SummaryAccumulator()
    db.execute(
        "INSERT INTO runs (local_id, kind, name, identity, mode, created_at, updated_at, "
        "summary_state, last_seen, platform_id, create_state, keep_records) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
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
            int(keep_records),
        ),
    )
    return RunAtIngest(summary)


def record_start(
    db: sqlite3.Connection, identity: RunIdentity, start: RunStart, *, claim: bool
) -> None:
    """The run's identity and config, from its owner's start until it is
    registered (from its first start while no owner's came); and its owner,
    the producer of its first owning start, when ``claim`` (``check_owner``).

    The run is opened by whichever spans arrive first, and a worker's name
    and config only what a worker knows (a prime-rl trainer: its model and
    the launch's run key, no steps or environments). The run must register
    with what its owner says, as it would have alone, so the owner's start
    replaces both as long as nothing has been sent with them: once the
    create went out (``create_state`` past 'pending') the platform has the
    run as it was, and the spool keeps what was sent. An owner's config that
    arrived damaged (sent as ``{}``) replaces nothing: it says nothing."""
    local_id = identity.local_id
    if start.owner:
        db.execute(
            "UPDATE runs SET identity = ?, name = ?, kind = ? "
            "WHERE local_id = ? AND create_state = 'pending'",
            (identity.to_json(), identity.name, identity.kind, local_id),
        )
    if start.owner and start.corrupt_reason is None:
        db.execute(
            "UPDATE runs SET config = ? WHERE local_id = ? AND create_state = 'pending'",
            (json.dumps(start.config), local_id),
        )
    db.execute(
        "UPDATE runs SET config = ? WHERE local_id = ? AND config IS NULL",
        (json.dumps(start.config), local_id),
    )
    if claim and start.owner:
        claim_owner(db, local_id, start.producer)


def count_batch(
    db: sqlite3.Connection,
    local_id: str,
    batch: RunBatch,
    summary: SummaryAccumulator,
    added: int,
    refused: int,
    now: float,
) -> None:
    """What one batch brought, counted on its run with the running summary.
    Episodes stored after the run was closed are counted late: the uploader
    still delivers them, to the closed run."""
    db.execute(
        "UPDATE runs SET summary_state = ?, episodes = episodes + ?, "
        "late = late + CASE WHEN close_state = 'closed' AND mode = 'online' "
        "THEN ? ELSE 0 END, "
        "duplicates = duplicates + ?, corrupt = corrupt + ?, rejected = rejected + ?, "
        "updated_at = ?, last_seen = ? WHERE local_id = ?",
        (
            json.dumps(summary.to_state()),
            added,
            added,
            len(batch.episodes) - added - refused,
            len(batch.corrupt) + len(batch.corrupt_metrics),
            refused,
            now,
            now,
            local_id,
        ),
    )


def record_end(db: sqlite3.Connection, local_id: str, end: RunEnd, now: float) -> None:
    """The run's end, unless one is recorded already (the first wins)."""
    db.execute(
        "UPDATE runs SET end_status = ?, end_error = ?, end_expected = ?, "
        "unencodable = ?, ended_at = ?, end_summary = ? "
        "WHERE local_id = ? AND end_status IS NULL",
        (
            end.status,
            end.error,
            end.episodes_recorded,
            end.episodes_unencodable,
            now,
            None if end.summary is None else json.dumps(end.summary),
            local_id,
        ),
    )


def claim_owner(db: sqlite3.Connection, run_id: str, producer: str | None) -> None:
    """Make ``producer`` the run's owner unless it has one."""
    db.execute(
        "UPDATE runs SET owner_id = ? WHERE local_id = ? AND owner_id IS NULL",
        (producer or "", run_id),
    )


def owned_by(db: sqlite3.Connection, run_id: str, producer: str | None) -> bool:
    """Whether ``producer`` owns the run, claiming it when nobody does yet
    (an end that arrives before its run's start, or a run without one)."""
    claim_owner(db, run_id, producer)
    (owner,) = db.execute("SELECT owner_id FROM runs WHERE local_id = ?", (run_id,)).fetchone()
    return bool(owner == (producer or ""))


class _RunRows(SpoolPart):
    """Runs read back from their rows, shared by the facets that read runs."""

    _RUN_COLUMNS = (
        "local_id, kind, name, identity, mode, config, created_at, platform_id, url, "
        "create_state, create_started, sink, traces_written, end_status, end_error, "
        "end_expected, ended_at, close_state, summary_state, episodes, duplicates, corrupt, "
        "rejected, uncertain, failed, last_error, last_seen, end_summary, unencodable, late, "
        "late_refused"
    )

    def _run_from_row(self, row: tuple[Any, ...]) -> RunRow:
        values = list(row)
        try:
            values[3] = RunIdentity.from_json(values[3])
            values[5] = json.loads(values[5]) if values[5] else None
            values[18] = json.loads(values[18])
            values[27] = json.loads(values[27]) if values[27] else None
        except (ValueError, TypeError, KeyError, AttributeError, RecursionError) as exc:
            raise DamagedRunError(self.path, str(values[0]), str(exc)) from None
        return RunRow(*values)

    def _readable_runs(self, rows: list[Any]) -> list[RunRow]:
        """The runs of ``rows`` that can be read; a damaged one is left out,
        and said so once per process."""
        runs = []
        for row in rows:
            try:
                runs.append(self._run_from_row(row))
            except DamagedRunError as exc:
                if exc.local_id not in self._reported_damaged:
                    self._reported_damaged.add(exc.local_id)
                    logger.error("%s", exc)
        return runs


class RunReads(_RunRows):
    """Which runs there are, and each one's row (``reading``)."""

    def run(self, local_id: str) -> RunRow | None:
        rows = self._query(f"SELECT {self._RUN_COLUMNS} FROM runs WHERE local_id = ?", (local_id,))
        return self._run_from_row(rows[0]) if rows else None

    def find_run(self, key: str) -> RunRow | None:
        """A run by its local key, its platform id, or a unique prefix of either."""
        exact = self.run(key)
        if exact is not None:
            return exact
        # A prefix, literally: '%' and '_' in a key match only themselves.
        prefix = key.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
        rows = self._query(
            f"SELECT {self._RUN_COLUMNS} FROM runs WHERE platform_id = ? "
            "OR local_id LIKE ? ESCAPE '\\' OR platform_id LIKE ? ESCAPE '\\'",
            (key, prefix, prefix),
        )
        return self._run_from_row(rows[0]) if len(rows) == 1 else None

    def runs(self) -> list[RunRow]:
        """Every readable run, newest first (see :meth:`damaged_runs`)."""
        rows = self._query(f"SELECT {self._RUN_COLUMNS} FROM runs ORDER BY created_at DESC")
        return self._readable_runs(rows)

    def damaged_runs(self) -> list[DamagedRunError]:
        """The runs whose rows cannot be read back, each with what to do."""
        damaged = []
        for row in self._query(f"SELECT {self._RUN_COLUMNS} FROM runs ORDER BY created_at DESC"):
            try:
                self._run_from_row(row)
            except DamagedRunError as exc:
                damaged.append(exc)
        return damaged

    def runs_changed_since(self, when: float) -> list[RunRow]:
        """Runs created or updated at ``when`` (epoch seconds) or later:
        every change of a run's state goes through ``updated_at``, so a
        watcher of many runs reads the few that changed, not all of them."""
        rows = self._query(
            f"SELECT {self._RUN_COLUMNS} FROM runs WHERE updated_at >= ? ORDER BY created_at",
            (when,),
        )
        return self._readable_runs(rows)


class RunDelivery(_RunRows):
    """A run's delivery state, as the uploader and ``push`` record it (``delivery``)."""

    def runs_to_deliver_or_close(self) -> list[RunRow]:
        """Runs not yet closed: online ones to deliver, local ones to close
        when their producer ends (or dies); and closed online runs that late
        episodes (arrived after the close) are still pending for. A damaged
        one is left out: it cannot be delivered, and must not hold up the
        others."""
        rows = self._query(
            f"SELECT {self._RUN_COLUMNS} FROM runs "
            "WHERE close_state NOT IN ('closed', 'gave_up') "
            "OR (close_state = 'closed' AND mode = 'online' AND late > 0 AND EXISTS ("
            "SELECT 1 FROM episodes e WHERE e.run_id = runs.local_id AND e.state = 'pending')) "
            "ORDER BY created_at"
        )
        return self._readable_runs(rows)

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

    def mark_closed(self, local_id: str) -> None:
        """The run is closed on the platform. Episodes still pending arrived
        after the check that let it close (during the finalize call): they
        are late, as if they had come after it, and are delivered to the
        closed run like any late episode."""
        now = time.time()
        with self._transaction() as db:
            db.execute(
                "UPDATE runs SET close_state = 'closed', closed_at = ?, updated_at = ?, "
                "late = late + CASE WHEN mode = 'online' THEN (SELECT COUNT(*) FROM episodes e "
                "WHERE e.run_id = runs.local_id AND e.state = 'pending') ELSE 0 END "
                "WHERE local_id = ?",
                (now, now, local_id),
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

    def keep_records(self, local_id: str, keep: bool) -> None:
        """Whether the run's record bodies outlive their delivery."""
        self.update_run(local_id, keep_records=1 if keep else 0)

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


class RunEnds(SpoolPart):
    """What a run's producer records of it beyond its episodes (``intake``)."""

    def count_rejected(self, local_id: str, count: int) -> None:
        """Episodes of the run that could not be stored (the spool's disk was
        full even for them), counted as refused at the spool."""
        with self._transaction() as db:
            db.execute(
                "UPDATE runs SET rejected = rejected + ? WHERE local_id = ?", (count, local_id)
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

    def close_local_run(self, local_id: str) -> bool:
        """Close a local run whose end is recorded, as the uploader's next
        pass would: for the process ending it, which may not see that pass.
        ``False`` when there is nothing to close (not local, not ended, or
        closed already)."""
        now = time.time()
        with self._transaction() as db:
            cursor = db.execute(
                "UPDATE runs SET close_state = 'closed', closed_at = ?, updated_at = ? "
                "WHERE local_id = ? AND mode = 'local' AND end_status IS NOT NULL "
                "AND close_state != 'closed'",
                (now, now, local_id),
            )
            return cursor.rowcount == 1

    def reopen_run(self, local_id: str) -> bool:
        """Take back a run's end so that its producer can finish it again
        (a replay run again after it was interrupted). Only while the end is
        the spool's alone: a local run, or an online one not yet closed on
        the platform (a closed platform run is never reopened). ``False``
        when the run cannot be reopened."""
        with self._transaction() as db:
            cursor = db.execute(
                "UPDATE runs SET end_status = NULL, end_error = NULL, ended_at = NULL, "
                "end_expected = NULL, end_summary = NULL, close_state = 'open', "
                "closed_at = NULL, updated_at = ? WHERE local_id = ? "
                "AND end_status IS NOT NULL AND (mode = 'local' OR close_state = 'open')",
                (time.time(), local_id),
            )
            if cursor.rowcount != 1:
                return False
            # The processes that fed it before ended it: the one reopening it
            # registers itself, and theirs must not mark it crashed again.
            db.execute("DELETE FROM producers WHERE run_id = ?", (local_id,))
            return True


class RunRemoval(SpoolPart):
    """Removing a run (``housekeeping``)."""

    def delete_run(self, local_id: str) -> int:
        """Remove a run and everything stored for it (``prime-runs-otel rm``);
        returns how many episodes went with it. The platform is not touched."""
        with self._transaction() as db:
            (count,) = db.execute(
                "SELECT COUNT(*) FROM episodes WHERE run_id = ?", (local_id,)
            ).fetchone()
            db.execute(
                "DELETE FROM records WHERE seq IN (SELECT seq FROM episodes WHERE run_id = ?)",
                (local_id,),
            )
            for table in (
                "episodes",
                "episode_states",
                "rollouts",
                "uploads",
                "metrics",
                "producers",
                "run_histograms",
                "run_errors",
                "run_series",
                "run_folds",
            ):
                db.execute(f"DELETE FROM {table} WHERE run_id = ?", (local_id,))
            db.execute("DELETE FROM runs WHERE local_id = ?", (local_id,))
            return int(count)
