"""The ``episodes`` table and the record bodies beside it (``records``):
one row per (run, episode id), whose state follows the episode to the
platform. Its body stays once the platform has acknowledged it when the run
keeps its bodies (the default: ``show``, ``ui`` and ``export`` read them; the
size cap and ``prune`` bound them), and is dropped then otherwise."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from .core import _GATE
from .part import SpoolPart
from .rows import for_seqs


@dataclass(frozen=True)
class EpisodeRow:
    seq: int
    episode_id: str
    rollout_number: int | None
    has_traces: bool
    record: bytes
    #: The training step the episode is training work of, if any.
    step: int | None = None


def drop_records(db: sqlite3.Connection, where: str, params: Sequence[Any]) -> None:
    """Delete the bodies of the episodes ``where`` selects: delivered, they
    are the platform's now (the episode row stays, for its state and counts).
    A run marked ``keep_records`` (started with
    ``PRIME_RUNS_OTEL_KEEP_DELIVERED`` on, the default, or pushed from the
    local store) keeps them: its owner still reads it locally."""
    db.execute(
        f"DELETE FROM records WHERE seq IN (SELECT seq FROM episodes WHERE ({where}) "
        "AND run_id NOT IN (SELECT local_id FROM runs WHERE keep_records = 1))",
        params,
    )


class EpisodeReads(SpoolPart):
    """What is stored of a run's episodes (``reading``)."""

    def pending_count(self, run_id: str) -> int:
        rows = self._query(
            "SELECT COUNT(*) FROM episodes WHERE run_id = ? "
            "AND state IN ('pending', 'uploading', 'sending')",
            (run_id,),
        )
        return int(rows[0][0])

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


class EpisodeDelivery(SpoolPart):
    """The episodes still to deliver, and what became of them (``delivery``)."""

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

    def fail_episodes(self, run_id: str, seqs: Sequence[int], reason: str) -> None:
        """A permanent refusal: counted on the run, body kept for inspection
        (``push`` gives them another chance once the cause is fixed)."""
        with self._transaction() as db:
            for_seqs(db, "UPDATE episodes SET state = 'failed' WHERE seq IN ({seqs})", seqs)
            # A closed run's pending episodes are late ones: refused, they are
            # late and undelivered.
            db.execute(
                "UPDATE runs SET failed = failed + ?, last_error = ?, late_refused = late_refused "
                "+ CASE WHEN close_state = 'closed' THEN ? ELSE 0 END WHERE local_id = ?",
                (len(seqs), reason, len(seqs), run_id),
            )
            # An upload none of whose episodes is still in it is over.
            db.execute(
                "UPDATE uploads SET state = 'failed', body = NULL WHERE run_id = ? "
                "AND state = 'pending' AND NOT EXISTS (SELECT 1 FROM episodes "
                "WHERE episodes.upload_id = uploads.upload_id AND episodes.state = 'uploading')",
                (run_id,),
            )

    def skip_episodes(self, seqs: Sequence[int]) -> None:
        """Episodes the sample table does not take (off the step cadence, or
        not training work). Not a loss: Prime Traces would have had them, and
        the legacy table never held them."""
        with self._transaction() as db:
            for_seqs(db, "DELETE FROM records WHERE seq IN ({seqs})", seqs)
            for_seqs(db, "UPDATE episodes SET state = 'skipped' WHERE seq IN ({seqs})", seqs)

    def deliver_without_request(self, seqs: Sequence[int]) -> None:
        """Episodes with nothing to send to the sample table (no traces)."""
        with self._transaction() as db:
            for_seqs(db, "DELETE FROM records WHERE seq IN ({seqs})", seqs)
            for_seqs(db, "UPDATE episodes SET state = 'delivered' WHERE seq IN ({seqs})", seqs)


class EpisodeBodies(SpoolPart):
    """The bodies kept of delivered episodes (``housekeeping``)."""

    def delivered_bodies(self, run_id: str) -> tuple[int, int]:
        """How many bodies of the run's delivered episodes are kept, and their bytes."""
        rows = self._query(
            "SELECT COUNT(*), COALESCE(SUM(e.size), 0) FROM episodes e "
            "JOIN records r ON r.seq = e.seq WHERE e.run_id = ? AND e.state = 'delivered'",
            (run_id,),
        )
        return int(rows[0][0]), int(rows[0][1])

    def drop_delivered_bodies(self, run_id: str) -> tuple[int, int]:
        """Drop the kept bodies of the run's delivered episodes (``prune
        --bodies``): the platform has them, and the run's rows, summary and
        views stay. Returns how many bodies went, and their bytes."""
        with self._transaction() as db:
            count, size = db.execute(
                "SELECT COUNT(*), COALESCE(SUM(e.size), 0) FROM episodes e "
                "JOIN records r ON r.seq = e.seq WHERE e.run_id = ? AND e.state = 'delivered'",
                (run_id,),
            ).fetchone()
            db.execute(
                "DELETE FROM records WHERE seq IN (SELECT seq FROM episodes "
                "WHERE run_id = ? AND state = 'delivered')",
                (run_id,),
            )
            return int(count), int(size)
