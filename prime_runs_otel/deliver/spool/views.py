"""What the local viewer and ``show`` read of a run, folded from its
episodes' rows, so that no page reads every body at view time.

Each stored episode gets its facts in its own row of ``episodes`` (reward,
error, tokens, duration, model calls, example: what the episode table sorts
and filters by), and what only the aggregates need (its model calls'
latencies, its metrics, its error's message) as ``view_facts``. The first
view of a run after new episodes folds them into the run's aggregates
(``folds.py``): distributions (``run_histograms``), failures by error type
with an example (``run_errors``), rewards and metrics by training step and
by blocks of episodes (``run_series``), and per-example rewards
(``rollouts``). A page then reads a few hundred rows whether the run holds a
hundred episodes or a million, and the commit that stores an episode writes
its row and its body only.

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
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import orjson

from ..._json import loads as fast_loads
from ...read.projection import EpisodeDigest
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


class ViewEpisode(NamedTuple):
    """One episode as :func:`add_to_views` folds it in: its row of
    ``episodes`` and its ``view_facts`` (:func:`view_facts_text`), or the
    same read from its digest (an episode stored by an earlier release).
    A named tuple: a fold makes one per episode, and a tuple is made several
    times faster than a frozen dataclass."""

    #: Its place among the run's episodes in arrival order, from 0.
    ordinal: int
    episode_id: str
    step: int | None
    ok: bool
    reward: float | None
    tokens: int | None
    duration: float | None
    error_type: str | None
    #: The example its rollouts are numbered under; None without traces.
    example: str | None
    #: When it was stored (``episodes.stored_at``).
    stored_at: float
    call_latencies: Sequence[float] = ()
    #: ``(name, value)`` pairs (lists, as read back from ``view_facts``).
    metrics: Sequence[Sequence[Any]] = ()
    error_message: str | None = None


def view_episode(
    ordinal: int, episode_id: str, step: int | None, digest: EpisodeDigest, stored_at: float
) -> ViewEpisode:
    """An episode as its digest says it, for :func:`add_to_views`."""
    facts = digest.facts
    return ViewEpisode(
        ordinal,
        episode_id,
        step,
        digest.ok,
        facts.reward,
        facts.tokens,
        facts.duration,
        facts.error_type,
        digest.rollout_key if digest.has_traces else None,
        stored_at,
        facts.call_latencies,
        facts.metrics,
        facts.error_message,
    )


def view_facts_text(digest: EpisodeDigest) -> str:
    """What the aggregates need of an episode beyond its row's columns, as
    stored in ``episodes.view_facts``: ``[latencies, metrics, message]``.

    Its being there (never NULL for an episode stored by this release) is
    also what tells the fold an episode is still to be folded: an earlier
    release folds its own episodes as it stores them, and leaves it NULL.
    Non-finite latencies are left out (no distribution counts them)."""
    facts = digest.facts
    latencies = [value for value in facts.call_latencies if math.isfinite(value)]
    value = [latencies, facts.metrics, facts.error_message]
    try:
        return orjson.dumps(value).decode()
    except TypeError:  # a name orjson cannot write (a lone surrogate)
        return json.dumps(value)


#: What :func:`view_facts_text` keeps: latencies, metrics, error message.
ViewFacts = tuple[Sequence[float], Sequence[Sequence[Any]], str | None]


def from_view_facts(text: str) -> ViewFacts:
    """``(latencies, metrics, message)`` from :func:`view_facts_text`'s text
    (nothing of a text that is not its shape). Its values are taken as
    written there, finite numbers, not checked one by one: a fold reads
    every episode's."""
    try:
        latencies, metrics, message = fast_loads(text)
    except (ValueError, TypeError):
        return (), (), None
    if type(latencies) is not list or type(metrics) is not list:
        return (), (), None
    return latencies, metrics, message if isinstance(message, str) else None


def add_to_views(db: sqlite3.Connection, run_id: str, episodes: Sequence[ViewEpisode]) -> None:
    """Fold episodes, in arrival order, into their run's aggregates, inside
    the caller's transaction: a fixed handful of statements per call."""
    if not episodes:
        return
    _add_histograms(db, run_id, episodes)
    _add_errors(db, run_id, episodes)
    _add_series(db, run_id, episodes)
    _add_examples(db, run_id, episodes)


def _add_histograms(db: sqlite3.Connection, run_id: str, episodes: Sequence[ViewEpisode]) -> None:
    # Each value counted first (Counter counts in C), then each distinct
    # value put in its bucket once: most values repeat (rewards, tokens).
    values: Counter[tuple[str, Any]] = Counter()
    values.update(("reward", episode.reward) for episode in episodes)
    values.update(("tokens", episode.tokens) for episode in episodes)
    values.update(("duration", episode.duration) for episode in episodes)
    values.update(
        ("call_latency", latency) for episode in episodes for latency in episode.call_latencies
    )
    counts: dict[tuple[str, float], int] = {}
    isfinite = math.isfinite
    for (name, value), number in values.items():
        if value is not None and isfinite(value):
            key = (name, float(f"{value:.3g}"))  # bucket_of, inline
            counts[key] = counts.get(key, 0) + number
    insert_rows(
        db,
        "run_histograms (run_id, name, bucket, count)",
        [(run_id, name, bucket, number) for (name, bucket), number in counts.items()],
        suffix="ON CONFLICT (run_id, name, bucket) DO UPDATE SET count = count + excluded.count",
    )


def _add_errors(db: sqlite3.Connection, run_id: str, episodes: Sequence[ViewEpisode]) -> None:
    groups: dict[str, list[Any]] = {}
    for episode in episodes:
        error_type = episode.error_type
        if error_type is None:
            continue
        group = groups.setdefault(
            error_type, [run_id, error_type, 0, episode.episode_id, episode.error_message]
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
    #: When its first and last episodes were stored.
    first_seen: float = math.inf
    last_seen: float = -math.inf

    @classmethod
    def of(cls, episodes: Sequence[ViewEpisode]) -> _Point:
        """The point of ``episodes`` alone: one loop over them, locals only
        (a fold runs it over every episode of the run)."""
        metrics: dict[str, list[float]] = {}
        failed = rewarded = 0
        reward_sum = 0.0
        for episode in episodes:
            failed += not episode.ok
            reward = episode.reward
            if reward is not None:
                rewarded += 1
                reward_sum += reward
            for name, value in episode.metrics:
                total = metrics.get(name)
                if total is None:
                    metrics[name] = [0.0 + value, 1]
                else:
                    total[0] += value
                    total[1] += 1
        seen = [episode.stored_at for episode in episodes]
        return cls(len(episodes), failed, rewarded, reward_sum, metrics, min(seen), max(seen))

    def merge(self, other: _Point) -> None:
        """Add the episodes of ``other`` (a block inside this one)."""
        self.episodes += other.episodes
        self.failed += other.failed
        self.rewarded += other.rewarded
        self.reward_sum += other.reward_sum
        self.first_seen = min(self.first_seen, other.first_seen)
        self.last_seen = max(self.last_seen, other.last_seen)
        for name, (total, number) in other.metrics.items():
            mine = self.metrics.get(name)
            if mine is None:
                self.metrics[name] = [total, number]
            else:
                mine[0] += total
                mine[1] += number


def _add_series(db: sqlite3.Connection, run_id: str, episodes: Sequence[ViewEpisode]) -> None:
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
        metrics_text, first_seen = stored.get((axis, point), ("{}", added.first_seen))
        # The earlier of the two: an earlier release writing the same run
        # folds its episodes as it stores them, before older ones are folded.
        first_seen = min(first_seen, added.first_seen)
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
                added.last_seen,
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
        "first_seen = excluded.first_seen, last_seen = MAX(last_seen, excluded.last_seen)",
    )


def _points(episodes: Sequence[ViewEpisode]) -> dict[tuple[int, int], _Point]:
    """What ``episodes`` add to each point of the run's series.

    The episodes are summed once per block of the finest axis and step
    (the episodes of one block are mostly of one step), and each such part
    added to its block and to its step; the coarser blocks are sums of the
    finer ones (each axis's block size divides the next), not a second and
    third pass over the episodes."""
    finest, *coarser = EPISODE_AXES
    parts: dict[tuple[int, int | None], list[ViewEpisode]] = {}
    for episode in episodes:
        parts.setdefault((episode.ordinal // finest, episode.step), []).append(episode)
    points: dict[tuple[int, int], _Point] = {}
    for (number, step), members in parts.items():
        part = _Point.of(members)
        _point_at(points, (finest, number)).merge(part)
        if step is not None:
            _point_at(points, (STEP_AXIS, step)).merge(part)
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


def _add_examples(db: sqlite3.Connection, run_id: str, episodes: Sequence[ViewEpisode]) -> None:
    """Per-example rewards, on the example's ``rollouts`` row (whose count
    the rollout numbering keeps)."""
    sums: dict[str, list[Any]] = {}
    for episode in episodes:
        example = episode.example
        if example is None:
            continue
        row = sums.setdefault(example, [run_id, example, 0, 0.0, 0, 0])
        if episode.reward is not None:
            row[3] += episode.reward
            row[4] += 1
        row[5] += not episode.ok
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
