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
from .processes import register_producer as register_producer_row
from .runs import ensure_run
from .size import SpoolSize
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
        stored once. At the size cap new episodes are refused and counted on
        their run; run events are always accepted (they are tiny, and losing
        a run's end would leave it open).
        """
        # The cap is checked per episode against the file size plus what this
        # batch adds, since one export batch can carry thousands of episodes.
        size = self.size_bytes()
        now = time.time()
        stored = duplicates = corrupt = rejected = 0
        lines: list[tuple[int, LineTemplate]] = []
        with self._transaction() as db:
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
                added, refused, size = self._insert_episodes(
                    db, local_id, batch.episodes, summary, size, lines
                )
                stored += added
                rejected += refused
                duplicates += len(batch.episodes) - added - refused
                corrupt += len(batch.corrupt) + len(batch.corrupt_metrics)
                insert_metrics(db, local_id, batch.metrics, now)
                # Episodes stored after the run was closed are counted late:
                # the uploader still delivers them, to the closed run.
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
        self._warn_near_cap(size)
        self._report_refused(rejected)
        return IngestOutcome(stored, duplicates, corrupt, rejected, tuple(lines))

    def _insert_episodes(
        self,
        db: sqlite3.Connection,
        run_id: str,
        episodes: Sequence[EpisodeArrival],
        summary: SummaryAccumulator,
        size: int,
        lines: list[tuple[int, LineTemplate]],
    ) -> tuple[int, int, int]:
        """Store the new episodes of one run from one batch; returns how many
        were added and refused, and the spool's size after them. The line
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
        now = time.time()
        _insert_rows(
            db,
            "episodes (run_id, episode_id, has_traces, size, step, rollout_number, stored_at)",
            [
                (run_id, e.episode_id, int(e.digest.has_traces), len(e.raw), e.step, number, now)
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
