"""What the local viewer and ``show`` read of a run, kept up to date as its
episodes are stored, so that no page reads every body at view time.

Each stored episode gets its facts in its own row of ``episodes`` (reward,
error, tokens, duration, model calls, example: what the episode table sorts
and filters by), and the same transaction folds them into the run's
aggregates: distributions (``run_histograms``), failures by error type with
an example (``run_errors``), rewards and metrics by training step and by
blocks of episodes (``run_series``), and per-example rewards (``rollouts``).
A page then reads a few hundred rows whether the run holds a hundred
episodes or a million.

Episodes stored by an earlier release have no facts yet (``ok IS NULL``):
``view_reads.py``'s :meth:`SpoolViews.read_stored` reads their bodies once, a chunk per
transaction, and folds them in the same way; an episode whose body was no
longer kept is marked ``ok = -1`` and counted as such.

What ``view/`` and ``cli/`` read of them (plain rows, no presentation) is
in ``view_reads.py``.
"""

from __future__ import annotations

import json
import math
import sqlite3
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ...read.projection import EpisodeDigest
from ...read.projection.facts import EpisodeFacts
from .rows import aggregate, insert_rows

#: The distributions kept per run, by name.
HISTOGRAMS = ("reward", "tokens", "duration", "call_latency")
#: Block sizes of the arrival-order axes: a chart picks the finest one that
#: still has few enough points, so a run of any length draws from at most a
#: few thousand rows.
EPISODE_AXES = (8, 256, 8192)
#: The axis of a training run's steps.
STEP_AXIS = 0
#: The columns of ``episodes`` filled from :class:`EpisodeFacts` (in order).
FACT_COLUMNS = (
    "ok",
    "reward",
    "error_type",
    "tokens",
    "input_tokens",
    "output_tokens",
    "duration",
    "turns",
    "example",
)
#: The indexes a page of episodes may be read through (see ``schema.INDEXES``).
EPISODE_INDEXES = (
    "episodes_by_run",
    "episodes_by_reward",
    "episodes_by_tokens",
    "episodes_by_duration",
    "episodes_failed",
    "episodes_by_example",
)
#: The index that orders a run's episodes by each sortable column.
SORT_INDEXES = {
    "seq": "episodes_by_run",
    "reward": "episodes_by_reward",
    "tokens": "episodes_by_tokens",
    "duration": "episodes_by_duration",
}
#: Sort keys of the episode table, and the column each sorts by.
SORTS = {
    "arrival": "seq",
    "reward": "reward",
    "tokens": "tokens",
    "duration": "duration",
}


def fact_values(digest: EpisodeDigest) -> tuple[Any, ...]:
    """The :data:`FACT_COLUMNS` of an episode, from its digest."""
    facts = digest.facts
    return (
        int(digest.ok),
        facts.reward,
        facts.error_type,
        facts.tokens,
        facts.input_tokens,
        facts.output_tokens,
        facts.duration,
        facts.turns,
        digest.rollout_key if digest.has_traces else None,
    )


def bucket_of(value: float) -> float:
    """A value to three significant digits: a histogram of any range in at
    most a few thousand buckets per run, re-binned for display."""
    return float(f"{value:.3g}")


@dataclass(frozen=True)
class StoredEpisode:
    """One episode as :func:`add_to_views` folds it in."""

    seq: int
    #: Its place among the run's episodes in arrival order, from 0.
    ordinal: int
    episode_id: str
    step: int | None
    digest: EpisodeDigest


def add_to_views(db: sqlite3.Connection, run_id: str, episodes: Sequence[StoredEpisode]) -> None:
    """Fold newly stored episodes into their run's aggregates, inside the
    caller's transaction: a fixed handful of statements per call."""
    if not episodes:
        return
    now = time.time()
    _add_histograms(db, run_id, [episode.digest.facts for episode in episodes])
    _add_errors(db, run_id, episodes)
    _add_series(db, run_id, episodes, now)
    _add_examples(db, run_id, episodes)


def _add_histograms(db: sqlite3.Connection, run_id: str, facts: Sequence[EpisodeFacts]) -> None:
    # Inline rather than a helper per value: export() runs this for every
    # stored episode, and a call per value was most of its Python time.
    counts: dict[tuple[str, float], int] = {}
    isfinite = math.isfinite
    for fact in facts:
        for name, value in (
            ("reward", fact.reward),
            ("tokens", fact.tokens),
            ("duration", fact.duration),
            *(("call_latency", latency) for latency in fact.call_latencies),
        ):
            if value is not None and isfinite(value):
                key = (name, float(f"{value:.3g}"))  # bucket_of, inline
                counts[key] = counts.get(key, 0) + 1
    insert_rows(
        db,
        "run_histograms (run_id, name, bucket, count)",
        [(run_id, name, bucket, number) for (name, bucket), number in counts.items()],
        suffix="ON CONFLICT (run_id, name, bucket) DO UPDATE SET count = count + excluded.count",
    )


def _add_errors(db: sqlite3.Connection, run_id: str, episodes: Sequence[StoredEpisode]) -> None:
    groups: dict[str, list[Any]] = {}
    for episode in episodes:
        facts = episode.digest.facts
        if facts.error_type is None:
            continue
        group = groups.setdefault(
            facts.error_type, [run_id, facts.error_type, 0, episode.episode_id, facts.error_message]
        )
        group[2] += 1
    insert_rows(
        db,
        "run_errors (run_id, error_type, count, example_id, example_message)",
        [tuple(group) for group in groups.values()],
        suffix="ON CONFLICT (run_id, error_type) DO UPDATE SET count = count + excluded.count",
    )


@dataclass
class _Point:
    episodes: int = 0
    failed: int = 0
    rewarded: int = 0
    reward_sum: float = 0.0
    #: ``{name: [sum, count]}``
    metrics: dict[str, list[float]] = field(default_factory=dict)

    def add(self, digest: EpisodeDigest) -> None:
        facts = digest.facts
        metrics = self.metrics
        self.episodes += 1
        self.failed += not digest.ok
        if facts.reward is not None:
            self.rewarded += 1
            self.reward_sum += facts.reward
        for name, value in facts.metrics:
            total = metrics.get(name)
            if total is None:
                metrics[name] = [0.0 + value, 1]
            else:
                total[0] += value
                total[1] += 1

    def merge(self, other: _Point) -> None:
        """Add the episodes of ``other`` (a block inside this one)."""
        self.episodes += other.episodes
        self.failed += other.failed
        self.rewarded += other.rewarded
        self.reward_sum += other.reward_sum
        for name, (total, number) in other.metrics.items():
            mine = self.metrics.get(name)
            if mine is None:
                self.metrics[name] = [total, number]
            else:
                mine[0] += total
                mine[1] += number


def _add_series(
    db: sqlite3.Connection, run_id: str, episodes: Sequence[StoredEpisode], now: float
) -> None:
    points = _points(episodes)
    stored: dict[tuple[int, int], tuple[str, float]] = {}
    for axis in {axis for axis, _ in points}:
        chosen = [point for each, point in points if each == axis]
        for found in aggregate(
            db,
            "json_group_array(json_array(point, metrics, first_seen))",
            "run_series",
            run_id,
            "point",
            chosen,
            where=f"axis = {int(axis)}",
        ):
            for point, metrics, first_seen in found:
                stored[(axis, point)] = (metrics, first_seen)
    rows = []
    for (axis, point), added in points.items():
        metrics_text, first_seen = stored.get((axis, point), ("{}", now))
        metrics = json_object(metrics_text)
        for name, (total, number) in added.metrics.items():
            before = metrics.get(name, [0.0, 0])
            merged = before[0] + total
            # A sum past the float range says nothing: the metric starts over.
            metrics[name] = [merged, before[1] + number] if math.isfinite(merged) else [0.0, 0]
        rows.append(
            (
                run_id,
                axis,
                point,
                added.episodes,
                added.failed,
                added.rewarded,
                added.reward_sum,
                json.dumps(metrics, allow_nan=False),
                first_seen,
                now,
            )
        )
    insert_rows(
        db,
        "run_series (run_id, axis, point, episodes, failed, rewarded, reward_sum, metrics, "
        "first_seen, last_seen)",
        rows,
        suffix="ON CONFLICT (run_id, axis, point) DO UPDATE SET "
        "episodes = episodes + excluded.episodes, failed = failed + excluded.failed, "
        "rewarded = rewarded + excluded.rewarded, "
        "reward_sum = reward_sum + excluded.reward_sum, metrics = excluded.metrics, "
        "last_seen = excluded.last_seen",
    )


def _points(episodes: Sequence[StoredEpisode]) -> dict[tuple[int, int], _Point]:
    """What ``episodes`` add to each point of the run's series.

    Each episode is added once to its block of the finest axis and to its
    step; the coarser blocks are sums of the finer ones (each axis's block
    size divides the next), not a second and third pass over the episodes."""
    finest, *coarser = EPISODE_AXES
    points: dict[tuple[int, int], _Point] = {}
    for episode in episodes:
        _point_at(points, (finest, episode.ordinal // finest)).add(episode.digest)
        if episode.step is not None:
            _point_at(points, (STEP_AXIS, episode.step)).add(episode.digest)
    blocks = [(number, block) for (axis, number), block in points.items() if axis == finest]
    for axis in coarser:
        for number, block in blocks:
            _point_at(points, (axis, number * finest // axis)).merge(block)
    return points


def _point_at(points: dict[tuple[int, int], _Point], key: tuple[int, int]) -> _Point:
    point = points.get(key)
    if point is None:
        point = _Point()
        points[key] = point
    return point


def _add_examples(db: sqlite3.Connection, run_id: str, episodes: Sequence[StoredEpisode]) -> None:
    """Per-example rewards, on the example's ``rollouts`` row (whose count
    the rollout numbering keeps)."""
    sums: dict[str, list[Any]] = {}
    for episode in episodes:
        digest = episode.digest
        if not digest.has_traces:
            continue
        row = sums.setdefault(digest.rollout_key, [run_id, digest.rollout_key, 0, 0.0, 0, 0])
        if digest.facts.reward is not None:
            row[3] += digest.facts.reward
            row[4] += 1
        row[5] += not digest.ok
    insert_rows(
        db,
        "rollouts (run_id, example_key, count, reward_sum, rewarded, failed)",
        [tuple(row) for row in sums.values()],
        suffix="ON CONFLICT (run_id, example_key) DO UPDATE SET "
        "reward_sum = reward_sum + excluded.reward_sum, "
        "rewarded = rewarded + excluded.rewarded, failed = failed + excluded.failed",
    )


# -- what the viewer reads ----------------------------------------------------------


def json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}
