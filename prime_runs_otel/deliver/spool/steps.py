"""Training steps: their metrics rows (``metrics``: one per step as the
platform keeps them, or, for a source that posts its rows as logged, one per
post) and the Parquet objects of a step's legacy sample table (``uploads``
of kind ``steps``), persisted before they are sent so a restart sends the
same object again rather than a second one."""

from __future__ import annotations

import json
import sqlite3
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

from ...read.records import RunMetrics, RunSamples
from .part import SpoolPart
from .rows import for_seqs
from .uploads import commit_upload


@dataclass(frozen=True)
class MetricsRow:
    """One metrics row, as stored (``row`` is its JSON). ``verbatim``: a row
    posted exactly as logged (``RunMetrics.verbatim``), sent as it is;
    ``seq`` orders the rows as they were stored."""

    step: int
    row: str
    seq: int = 0
    verbatim: bool = False


@dataclass(frozen=True)
class StepUpload:
    """One Parquet object of a training step's legacy sample table."""

    upload_id: str
    step: int
    sample_offset: int
    body: bytes | None
    url: str | None
    key: str | None


def insert_metrics(
    db: sqlite3.Connection, run_id: str, metrics: Sequence[RunMetrics], now: float
) -> None:
    """One row per step, as the platform keeps them: a step logged again adds
    its values to the row, a name logged again taking the new value (and the
    row is sent again, whole); an identical copy (a collector's retry)
    changes nothing. Added, not replaced: several rows of one step are
    usual (prime-rl's eval row after its train row, a trainer's rows beside
    the orchestrator's), and the platform keeps one row per step, so a
    replacement would lose the earlier row's values."""
    for item in metrics:
        if item.verbatim:
            _insert_verbatim(db, run_id, item, now)
            continue
        db.execute(
            "INSERT INTO metrics (run_id, step, row, state, updated_at) "
            "VALUES (?, ?, ?, 'pending', ?) ON CONFLICT (run_id, step, post) DO UPDATE SET "
            "row = json_patch(metrics.row, excluded.row), state = 'pending', "
            "updated_at = excluded.updated_at "
            # json(): the stored text minified, as json_patch writes it, so an
            # identical copy compares equal whatever spacing the row was stored in.
            "WHERE json(metrics.row) != json_patch(metrics.row, excluded.row)",
            (run_id, item.step, json.dumps(item.row(), sort_keys=True), now),
        )


def _insert_verbatim(db: sqlite3.Connection, run_id: str, item: RunMetrics, now: float) -> None:
    """A row posted as logged: stored as its text says it, keys in their
    order and ``10.0`` still a float (Python's ``json`` writes both back
    as they were read), never patched into another row; a copy of its span
    (same ``key``) changes nothing."""
    text = json.dumps(item.row(), ensure_ascii=False, separators=(",", ":"))
    db.execute(
        "INSERT INTO metrics (run_id, step, post, row, state, updated_at) "
        "VALUES (?, ?, ?, ?, 'pending', ?) ON CONFLICT (run_id, step, post) DO NOTHING",
        (run_id, item.step, item.key, text, now),
    )


def insert_step_tables(
    db: sqlite3.Connection, run_id: str, tables: Sequence[RunSamples], now: float
) -> None:
    """Sample-table objects a producer wrote (``prime.run.samples`` spans),
    kept to be sent as they are (the run's id filled in then); a copy of a
    span (same ``key``: a collector's retry) is stored once."""
    for table in tables:
        db.execute(
            "INSERT OR IGNORE INTO uploads (upload_id, run_id, kind, body, episodes, state, "
            "created_at, step, sample_offset) VALUES (?, ?, 'steps', ?, 0, 'pending', ?, ?, 0)",
            (f"steps:{table.key}", run_id, table.body, now, table.step),
        )


_ROW_COLUMNS = "step, row, seq, post"


def _metrics_row(step: int, row: str, seq: int, post: str) -> MetricsRow:
    return MetricsRow(step, row, seq, verbatim=post != "")


class StepDelivery(SpoolPart):
    """A training run's step metrics and sample-table objects, as its
    uploader sends them (``steps``)."""

    def pending_metrics(self, run_id: str, *, limit: int = 500) -> list[MetricsRow]:
        """Metrics rows not yet acknowledged, in the order they were stored
        (a step's one row where it was first logged)."""
        rows = self._query(
            f"SELECT {_ROW_COLUMNS} FROM metrics WHERE run_id = ? AND state = 'pending' "
            "ORDER BY seq LIMIT ?",
            (run_id, limit),
        )
        return [_metrics_row(*row) for row in rows]

    def metrics_counts(self, run_id: str) -> dict[str, int]:
        """Metrics rows by state: pending, delivered, failed."""
        rows = self._query(
            "SELECT state, COUNT(*) FROM metrics WHERE run_id = ? GROUP BY state", (run_id,)
        )
        return {state: count for state, count in rows}

    def begin_metrics(self, run_id: str, row: MetricsRow) -> bool:
        """Mark a pending row ``sending`` before its request (rows posted as
        logged, which are sent at most once); ``False`` if it was not pending."""
        with self._transaction() as db:
            cursor = db.execute(
                "UPDATE metrics SET state = 'sending', updated_at = ? "
                "WHERE run_id = ? AND seq = ? AND state = 'pending'",
                (time.time(), run_id, row.seq),
            )
            return cursor.rowcount == 1

    def end_metrics(self, run_id: str, row: MetricsRow, state: str) -> bool:
        """Record what became of a metrics row that was sent: ``delivered``,
        ``failed``, ``uncertain`` (may have reached the platform), or back to
        ``pending``. ``False`` when the step was logged again meanwhile (the
        newer row is still to be sent)."""
        with self._transaction() as db:
            cursor = db.execute(
                "UPDATE metrics SET state = ?, updated_at = ? "
                "WHERE run_id = ? AND seq = ? AND row = ?",
                (state, time.time(), run_id, row.seq, row.row),
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
            for_seqs(
                db,
                "UPDATE episodes SET state = 'uploading', upload_id = ? "
                "WHERE seq IN ({seqs}) AND state = 'pending'",
                seqs,
                (upload_id,),
            )
        return upload_id

    def set_step_object(self, upload_id: str, url: str | None, key: str | None) -> None:
        """Where the object goes once presigned (``None`` to presign again)."""
        with self._transaction() as db:
            db.execute(
                "UPDATE uploads SET object_url = ?, object_key = ? WHERE upload_id = ?",
                (url, key, upload_id),
            )

    def step_upload(self, upload_id: str) -> StepUpload | None:
        rows = self._query(
            "SELECT upload_id, step, sample_offset, body, object_url, object_key FROM uploads "
            "WHERE upload_id = ? AND kind = 'steps'",
            (upload_id,),
        )
        return StepUpload(*rows[0]) if rows else None

    def commit_step_upload(self, upload_id: str) -> None:
        """The object is confirmed: its episodes are delivered."""
        with self._transaction() as db:
            commit_upload(db, upload_id)


class StepReads(SpoolPart):
    """A training run's stored step metrics (``reading``)."""

    def metrics_rows(self, run_id: str) -> list[MetricsRow]:
        """Every metrics row of a run, whatever its delivery state, in the
        order they are sent (``prime-runs-otel export --what metrics``)."""
        rows = self._query(
            f"SELECT {_ROW_COLUMNS} FROM metrics WHERE run_id = ? ORDER BY seq", (run_id,)
        )
        return [_metrics_row(*row) for row in rows]
