"""``export()``'s write: a whole batch of runs, episodes, metrics and run
events committed in one transaction, idempotently (an episode already stored
for its run is a duplicate and changes nothing) and within the size cap.
It touches several tables at once, so it has a module of its own."""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from ...read.episodes import EpisodeArrival
from ...read.projection import LineTemplate, SummaryAccumulator
from ...read.records import RunBatch
from .core import SpoolFullError
from .processes import register_producer as register_producer_row
from .runs import ensure_run
from .size import STOPPED_HELD_SQL, STOPPED_SHARE, SpoolSize
from .steps import insert_metrics


@dataclass(frozen=True)
class IngestOutcome:
    stored: int = 0
    duplicates: int = 0
    corrupt: int = 0
    rejected: int = 0
    #: ``(seq, line template)`` of the stored episodes that came with one
    #: (``EpisodeArrival.line``), for the uploader's ``LineCache``.
    lines: tuple[tuple[int, LineTemplate], ...] = ()


class SpoolIngest(SpoolSize):
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
        stored once. At the size cap, and short of the disk's reserve, new
        episodes are refused and counted on their run; run events are always
        accepted (they are tiny, and losing a run's end would leave it open):
        on a full disk the reserve is released for them (``size.py``).
        """
        try:
            return self._ingest(batches, mode, register_producer, owns_runs)
        except SpoolFullError:
            if not self.release_reserve():
                raise
            return self._ingest(batches, mode, register_producer, owns_runs)

    def _ingest(
        self, batches: Sequence[RunBatch], mode: str, register_producer: bool, owns_runs: bool
    ) -> IngestOutcome:
        # The cap and the disk are checked per episode against what this
        # batch adds, since one export batch can carry thousands of episodes.
        size = self.size_bytes()
        now = time.time()
        stored = duplicates = corrupt = rejected = 0
        lines: list[tuple[int, LineTemplate]] = []
        with self._transaction() as db:
            room = _Room(
                size,
                db.execute(STOPPED_HELD_SQL).fetchone()[0],
                self.max_bytes,
                self.disk_left_for_episodes(),
            )
            for batch in batches:
                local_id = batch.identity.local_id
                summary = ensure_run(db, batch.identity, mode=mode, now=now)
                if register_producer:
                    register_producer_row(db, local_id, owns_run=owns_runs, now=now)
                if batch.start is not None:
                    db.execute(
                        "UPDATE runs SET config = ? WHERE local_id = ? AND config IS NULL",
                        (json.dumps(batch.start.config), local_id),
                    )
                added, refused = self._insert_episodes(
                    db, local_id, batch.episodes, summary, room, lines
                )
                stored += added
                rejected += refused
                duplicates += len(batch.episodes) - added - refused
                corrupt += len(batch.corrupt) + len(batch.corrupt_metrics)
                insert_metrics(db, local_id, batch.metrics, now)
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
                        "unencodable = ?, ended_at = ?, end_summary = ? "
                        "WHERE local_id = ? AND end_status IS NULL",
                        (
                            batch.end.status,
                            batch.end.error,
                            batch.end.episodes_recorded,
                            batch.end.episodes_unencodable,
                            now,
                            None if batch.end.summary is None else json.dumps(batch.end.summary),
                            local_id,
                        ),
                    )
        self._warn_near_cap(room.size)
        self._report_refused(rejected - room.disk_refused - room.stopped_refused)
        self._report_refused(room.disk_refused, disk_full=True)
        self._report_refused(room.stopped_refused, stopped=True)
        return IngestOutcome(stored, duplicates, corrupt, rejected, tuple(lines))

    def _insert_episodes(
        self,
        db: sqlite3.Connection,
        run_id: str,
        episodes: Sequence[EpisodeArrival],
        summary: SummaryAccumulator,
        room: _Room,
        lines: list[tuple[int, LineTemplate]],
    ) -> tuple[int, int]:
        """Store the new episodes of one run from one batch, as far as
        ``room`` goes; returns how many were added and refused. The line
        templates of those stored go to ``lines`` under their ``seq``.

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
        stopped = bool(episodes) and _stopped(db, run_id)
        for episode in episodes:
            if episode.episode_id in known:
                continue
            if not room.take(len(episode.raw), stopped=stopped):
                refused += 1
                continue
            known.add(episode.episode_id)
            fresh.append(episode)
        if not fresh:
            return 0, refused
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
        lines.extend((seqs[e.episode_id], e.line) for e in fresh if e.line is not None)
        for episode in fresh:
            summary.add_digest(episode.digest)
        return len(fresh), refused

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


def _stopped(db: sqlite3.Connection, local_id: str) -> bool:
    """Whether the run's delivery stopped (``RunRow.stopped``)."""
    row = db.execute(
        "SELECT create_state = 'failed' OR close_state = 'gave_up' FROM runs WHERE local_id = ?",
        (local_id,),
    ).fetchone()
    return bool(row and row[0])


@dataclass
class _Room:
    """What one ingest may still add. Runs still delivering share the cap
    (``size`` less what stopped runs hold); runs whose delivery stopped
    share ``STOPPED_SHARE`` of it among themselves, and never take the
    others' room; nobody takes the disk's reserve (``disk_left``; ``None``
    when the disk cannot be asked). A byte costs the disk twice until the
    next checkpoint (the write-ahead log, then the file)."""

    size: int
    stopped_held: int
    cap: int
    disk_left: int | None
    disk_refused: int = 0
    stopped_refused: int = 0

    def take(self, length: int, *, stopped: bool) -> bool:
        if stopped:
            if self.stopped_held + length > self.cap * STOPPED_SHARE:
                self.stopped_refused += 1
                return False
        elif self.size - self.stopped_held + length > self.cap:
            return False
        if self.disk_left is not None:
            if self.disk_left < 2 * length:
                self.disk_refused += 1
                return False
            self.disk_left -= 2 * length
        self.size += length
        if stopped:
            self.stopped_held += length
        return True


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
