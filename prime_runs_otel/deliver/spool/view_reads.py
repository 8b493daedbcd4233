"""What the local viewer and ``show`` read of a run: the facts and
aggregates of ``views.py``, as plain rows (no presentation), each aggregate
folded up to the run's last episode first (``folds.py``), and the other
write the viewer asks for, reading the episodes stored by an earlier
release into them (:meth:`SpoolViews.read_stored`)."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ..._json import loads as fast_loads
from ...read.projection import EpisodeDigest, digest_episode
from .folds import ViewFolds
from .runs import RunRow
from .schema import MADE_ON_FIRST_USE
from .views import (
    EPISODE_INDEXES,
    FACT_COLUMNS,
    SORT_INDEXES,
    SORTS,
    ViewEpisode,
    add_to_views,
    fact_values,
    json_object,
    view_episode,
)


@dataclass(frozen=True)
class ErrorGroup:
    error_type: str
    count: int
    example_id: str
    example_message: str | None


@dataclass(frozen=True)
class SeriesPoint:
    point: int
    episodes: int
    failed: int
    rewarded: int
    reward_sum: float
    #: ``{name: (sum, count)}``
    metrics: dict[str, tuple[float, int]]
    first_seen: float
    last_seen: float


@dataclass(frozen=True)
class EpisodeFactsRow:
    """One row of the episode table (no body)."""

    seq: int
    episode_id: str
    step: int | None
    state: str
    ok: int | None
    reward: float | None
    error_type: str | None
    tokens: int | None
    input_tokens: int | None
    output_tokens: int | None
    duration: float | None
    turns: int | None
    example: str | None
    has_body: bool


@dataclass(frozen=True)
class EpisodeFilter:
    """Which of a run's episodes the episode table shows; ``None``: any."""

    min_reward: float | None = None
    max_reward: float | None = None
    #: An error type, ``"any"`` for every failed episode, ``"none"`` for the ok ones.
    error: str | None = None
    min_tokens: int | None = None
    max_tokens: int | None = None
    min_duration: float | None = None
    max_duration: float | None = None
    #: An example key as stored (the JSON of its ``task.data.idx``).
    example: str | None = None
    #: A training step.
    step: int | None = None

    def where(self, *, having: str = "seq") -> tuple[str, list[Any]]:
        """SQL conditions on ``e`` (``episodes``), and their parameters;
        ``having``: a column the episodes must have a value of."""
        clauses: list[str] = [] if having == "seq" else [f"e.{having} IS NOT NULL"]
        params: list[Any] = []
        for column, low, high in (
            ("reward", self.min_reward, self.max_reward),
            ("tokens", self.min_tokens, self.max_tokens),
            ("duration", self.min_duration, self.max_duration),
        ):
            if low is not None:
                clauses.append(f"e.{column} >= ?")
                params.append(low)
            if high is not None:
                clauses.append(f"e.{column} <= ?")
                params.append(high)
        if self.error == "any":
            clauses.append("e.error_type IS NOT NULL")
        elif self.error == "none":
            clauses.append("e.ok = 1")
        elif self.error is not None:
            clauses.append("e.error_type = ?")
            params.append(self.error)
        if self.example is not None:
            clauses.append("e.example = ?")
            params.append(self.example)
        if self.step is not None:
            clauses.append("e.step = ?")
            params.append(self.step)
        return "".join(f" AND {clause}" for clause in clauses), params


_FACT_ROW_COLUMNS = (
    "e.seq, e.episode_id, e.step, e.state, e.ok, e.reward, e.error_type, e.tokens, "
    "e.input_tokens, e.output_tokens, e.duration, e.turns, e.example, "
    "EXISTS (SELECT 1 FROM records r WHERE r.seq = e.seq)"
)

#: Episodes read per transaction when reading the stored bodies of older runs.
READ_STORED_CHUNK = 2000


class SpoolViews(ViewFolds):
    """What the local viewer and ``show`` read of a run (``reading``)."""

    def histogram(self, run_id: str, name: str) -> list[tuple[float, int]]:
        """``(bucket, count)`` of one of :data:`HISTOGRAMS`, by bucket."""
        self._folded(run_id)
        rows = self._query(
            "SELECT bucket, count FROM run_histograms WHERE run_id = ? AND name = ? "
            "ORDER BY bucket",
            (run_id, name),
        )
        return [(float(bucket), int(count)) for bucket, count in rows]

    def error_groups(self, run_id: str) -> list[ErrorGroup]:
        """Failed episodes by error type, most frequent first."""
        self._folded(run_id)
        rows = self._query(
            "SELECT error_type, count, example_id, example_message FROM run_errors "
            "WHERE run_id = ? ORDER BY count DESC, error_type",
            (run_id,),
        )
        return [ErrorGroup(*row) for row in rows]

    def has_series(self, run_id: str, axis: int) -> bool:
        self._folded(run_id)
        rows = self._query(
            "SELECT 1 FROM run_series WHERE run_id = ? AND axis = ? LIMIT 1", (run_id, axis)
        )
        return bool(rows)

    def series(self, run_id: str, axis: int) -> list[SeriesPoint]:
        self._folded(run_id)
        rows = self._query(
            "SELECT point, episodes, failed, rewarded, reward_sum, metrics, first_seen, "
            "last_seen FROM run_series WHERE run_id = ? AND axis = ? ORDER BY point",
            (run_id, axis),
        )
        points = []
        for point, episodes, failed, rewarded, reward_sum, metrics, first, last in rows:
            sums = {
                name: (float(pair[0]), int(pair[1])) for name, pair in json_object(metrics).items()
            }
            points.append(
                SeriesPoint(point, episodes, failed, rewarded, reward_sum, sums, first, last)
            )
        return points

    def episode_rows(
        self,
        run_id: str,
        where: EpisodeFilter,
        *,
        sort: str = "arrival",
        descending: bool = False,
        offset: int = 0,
        limit: int = 50,
        index: str | None = None,
    ) -> list[EpisodeFactsRow]:
        """One page of the run's episodes, filtered and sorted. Sorted by a
        value, only the episodes that have it are in the order (so that the
        page is read straight off that value's index). ``index`` (one of
        :data:`EPISODE_INDEXES`) is the one to find the page's episodes
        through: the caller knows how many each filter keeps, SQLite does
        not. The page's seqs are found first, its rows read after."""
        column = SORTS[sort]
        clauses, params = where.where(having=column)
        direction = "DESC" if descending else "ASC"
        order = f"{column} {direction}, seq {direction}"
        rows = self._query(
            f"SELECT {_FACT_ROW_COLUMNS} FROM episodes e WHERE e.seq IN "
            f"(SELECT e.seq FROM episodes e{self._indexed_by(index)} WHERE e.run_id = ?{clauses} "
            f"ORDER BY e.{order} LIMIT ? OFFSET ?) ORDER BY e.{order}",
            (run_id, *params, limit, offset),
        )
        return [_fact_row(row) for row in rows]

    def episode_count(
        self, run_id: str, where: EpisodeFilter, *, sort: str = "arrival", index: str | None = None
    ) -> int:
        """How many episodes :meth:`episode_rows` pages through, counted
        through ``index``. Through another index than the sort's, those
        matching are counted there, less the few without the sort's value
        (found at the head of the sort's own index): never a row lookup per
        episode."""
        column = SORTS[sort]
        own = SORT_INDEXES[column]
        if index is None or index == own or column == "seq":
            clauses, params = where.where(having=column)
            return self._count(run_id, index, clauses, params)
        clauses, params = where.where()
        matching = self._count(run_id, index, clauses, params)
        return matching - self._count(run_id, own, f" AND e.{column} IS NULL{clauses}", params)

    def _count(self, run_id: str, index: str | None, clauses: str, params: list[Any]) -> int:
        rows = self._query(
            f"SELECT COUNT(*) FROM episodes e{self._indexed_by(index)} WHERE e.run_id = ?{clauses}",
            (run_id, *params),
        )
        return int(rows[0][0])

    def _indexed_by(self, index: str | None) -> str:
        """The clause that reads through ``index``; one made on first use is
        made now, and where it cannot be, the clause is left out (naming a
        missing index is an error): SQLite then finds the run's episodes
        through another index and sorts them itself."""
        if index is None:
            return ""
        if index not in EPISODE_INDEXES:
            raise ValueError(f"no index {index!r} to read episodes through")
        if index in MADE_ON_FIRST_USE and not self._core.index_made(index):
            return ""
        return f" INDEXED BY {index}"

    def waiting_count(self, run: RunRow) -> int:
        """Episodes not yet delivered (pending, or on their way): of a local
        run, all but the few that ever left that state, counted through
        those; of an online one, those still in it."""
        if run.mode != "local":
            rows = self._query(
                "SELECT COUNT(*) FROM episodes WHERE run_id = ? "
                "AND state IN ('pending', 'uploading', 'sending')",
                (run.local_id,),
            )
            return int(rows[0][0])
        rows = self._query(
            "SELECT COUNT(*) FROM episodes WHERE run_id = ? "
            "AND state IN ('delivered', 'failed', 'skipped', 'uncertain')",
            (run.local_id,),
        )
        return max(0, run.episodes - int(rows[0][0]))

    def episode(self, run_id: str, episode_id: str) -> tuple[EpisodeFactsRow, bytes | None] | None:
        """One episode's row and its stored body (``None`` when not kept)."""
        rows = self._query(
            f"SELECT {_FACT_ROW_COLUMNS}, r.body FROM episodes e "
            "LEFT JOIN records r ON r.seq = e.seq WHERE e.run_id = ? AND e.episode_id = ?",
            (run_id, episode_id),
        )
        if not rows:
            return None
        *row, body = rows[0]
        return _fact_row(tuple(row)), body

    def episode_positions(
        self, run_id: str, seqs: list[int], *, rows: int | None = None
    ) -> dict[int, int]:
        """Each of ``seqs``' place in its run's arrival order (from 1).

        ``rows``, the run's count of episodes: when its first and last
        episodes are that many apart, nothing else was stored between them,
        and a place is the distance from the first. Otherwise the run's rows
        are counted from one to the next along its own index, a walk up to
        the furthest of them, once."""
        if rows:
            # Two queries: SQLite finds one MIN or one MAX through the index,
            # but scans the run for both at once.
            (first,) = self._query("SELECT MIN(seq) FROM episodes WHERE run_id = ?", (run_id,))[0]
            (last,) = self._query("SELECT MAX(seq) FROM episodes WHERE run_id = ?", (run_id,))[0]
            if first is not None and last - first + 1 == rows:
                return {seq: seq - first + 1 for seq in seqs}
        positions: dict[int, int] = {}
        below, reached = 0, -1
        for seq in sorted(set(seqs)):
            below += int(
                self._query(
                    "SELECT COUNT(*) FROM episodes INDEXED BY episodes_by_run "
                    "WHERE run_id = ? AND seq > ? AND seq <= ?",
                    (run_id, reached, seq),
                )[0][0]
            )
            positions[seq] = below
            reached = seq
        return positions

    def episode_neighbours(self, run_id: str, seq: int) -> tuple[str | None, str | None]:
        """The ids of the episodes stored just before and just after ``seq``."""
        before = self._query(
            "SELECT episode_id FROM episodes WHERE run_id = ? AND seq < ? ORDER BY seq DESC "
            "LIMIT 1",
            (run_id, seq),
        )
        after = self._query(
            "SELECT episode_id FROM episodes WHERE run_id = ? AND seq > ? ORDER BY seq LIMIT 1",
            (run_id, seq),
        )
        return (before[0][0] if before else None), (after[0][0] if after else None)

    def example_count(self, run_id: str) -> int:
        """Examples of the run with a reward."""
        self._folded(run_id)
        rows = self._query(
            "SELECT COUNT(*) FROM rollouts WHERE run_id = ? AND rewarded > 0", (run_id,)
        )
        return int(rows[0][0])

    def example_pairs(
        self, run_id: str, other_id: str, *, every: int = 1
    ) -> list[tuple[str, float, float]]:
        """``(example, mean reward in run_id, in other_id)`` of the examples
        both runs rewarded; with ``every`` > 1, of about one in ``every`` of
        the run's examples only (a sample spread over them, for runs with
        hundreds of thousands)."""
        self._folded(run_id, other_id)
        rows = self._query(
            "SELECT a.example_key, a.reward_sum / a.rewarded, b.reward_sum / b.rewarded "
            "FROM rollouts a JOIN rollouts b ON b.run_id = ? AND b.example_key = a.example_key "
            "AND b.rewarded > 0 WHERE a.run_id = ? AND a.rewarded > 0 AND a.rowid % ? = 0",
            (other_id, run_id, every),
        )
        return [(key, float(mine), float(theirs)) for key, mine, theirs in rows]

    def unread_count(self, run_id: str) -> int:
        """Episodes of the run stored by an earlier release and not yet read."""
        return self.facts_missing(run_id)[0]

    def facts_missing(self, run_id: str) -> tuple[int, int]:
        """Episodes of the run without facts: not read yet (stored by an
        earlier release), and those whose body was gone when they were."""
        rows = self._query(
            "SELECT ok IS NULL, COUNT(*) FROM episodes INDEXED BY episodes_without_facts "
            "WHERE run_id = ? AND (ok IS NULL OR ok < 0) GROUP BY 1",
            (run_id,),
        )
        counts = {bool(unread): int(count) for unread, count in rows}
        return counts.get(True, 0), counts.get(False, 0)

    def runs_with_unread(self) -> list[str]:
        rows = self._query(
            "SELECT DISTINCT run_id FROM episodes INDEXED BY episodes_without_facts "
            "WHERE (ok IS NULL OR ok < 0) AND ok IS NULL"
        )
        return [run_id for (run_id,) in rows]

    def read_stored(self, run_id: str, *, limit: int = READ_STORED_CHUNK) -> int:
        """Read the facts of up to ``limit`` episodes of the run stored by an
        earlier release, oldest first, and fold them into the run's views in
        one transaction; returns how many were read (0: none is left)."""
        with self._transaction() as db:
            rows = db.execute(
                "SELECT e.seq, e.episode_id, e.step, e.stored_at, r.body "
                "FROM episodes e INDEXED BY episodes_without_facts "
                "LEFT JOIN records r ON r.seq = e.seq WHERE e.run_id = ? "
                "AND (e.ok IS NULL OR e.ok < 0) AND e.ok IS NULL "
                "ORDER BY e.seq LIMIT ?",
                (run_id, limit),
            ).fetchall()
            if not rows:
                return 0
            ordinals = _ordinals(db, run_id, rows[0][0], rows[-1][0])
            read: list[ViewEpisode] = []
            updates: list[tuple[Any, ...]] = []
            now = time.time()
            for seq, episode_id, step, stored_at, body in rows:
                digest = _digest_of(body)
                if digest is None:
                    updates.append((-1, *([None] * (len(FACT_COLUMNS) - 1)), seq))
                    continue
                updates.append((*fact_values(digest), seq))
                read.append(view_episode(ordinals[seq], episode_id, step, digest, stored_at or now))
            assignments = ", ".join(f"{column} = ?" for column in FACT_COLUMNS)
            db.executemany(f"UPDATE episodes SET {assignments} WHERE seq = ?", updates)
            add_to_views(db, run_id, read)
            return len(rows)


def _digest_of(body: bytes | None) -> EpisodeDigest | None:
    if body is None:
        return None
    try:
        record = fast_loads(body)
        return digest_episode(record) if isinstance(record, dict) else None
    except (ValueError, TypeError, RecursionError):
        return None


def _ordinals(db: sqlite3.Connection, run_id: str, first: int, last: int) -> dict[int, int]:
    """Each episode's place in its run's arrival order, for seqs first..last."""
    (before,) = db.execute(
        "SELECT COUNT(*) FROM episodes WHERE run_id = ? AND seq < ?", (run_id, first)
    ).fetchone()
    seqs = db.execute(
        "SELECT seq FROM episodes WHERE run_id = ? AND seq BETWEEN ? AND ? ORDER BY seq",
        (run_id, first, last),
    ).fetchall()
    return {seq: before + index for index, (seq,) in enumerate(seqs)}


def _fact_row(row: Iterable[Any]) -> EpisodeFactsRow:
    values = list(row)
    values[-1] = bool(values[-1])
    return EpisodeFactsRow(*values)
