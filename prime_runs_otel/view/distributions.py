"""Distributions and series as pages and ``show`` draw them, from the
aggregates the spool keeps (``deliver/spool/views.py``).

The spool counts values in buckets of three significant digits and sums
rewards and metrics per block of episodes or per training step; here those
few thousand rows at most become a handful of equal-width bins, percentiles,
and a series of a few hundred points, whatever the run's length.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from ..deliver.spool import SeriesPoint

__all__ = ["Bin", "Distribution", "Series", "distribution", "series_of"]

#: Bars of a distribution, and points of a series, at most.
BINS = 20
MAX_POINTS = 400


@dataclass(frozen=True)
class Bin:
    low: float
    high: float
    count: int


@dataclass(frozen=True)
class Distribution:
    """A distribution's bars and the figures a reader asks first."""

    count: int
    low: float
    high: float
    mean: float
    p50: float
    p90: float
    p99: float
    bins: tuple[Bin, ...]


def distribution(
    buckets: Sequence[tuple[float, int]],
    bins: int = BINS,
    *,
    span: tuple[float, float] | None = None,
) -> Distribution | None:
    """``(value, count)`` buckets, in value order, as ``bins`` equal-width
    bars from the lowest value to the highest, or over ``span`` (to draw
    several runs on one scale; one bar when all are equal); ``None`` for no
    value at all."""
    buckets = [(value, count) for value, count in buckets if count > 0]
    if not buckets:
        return None
    total = sum(count for _, count in buckets)
    low, high = span if span is not None else (buckets[0][0], buckets[-1][0])
    mean = sum(value * count for value, count in buckets) / total
    if high == low:
        bars: tuple[Bin, ...] = (Bin(low, high, total),)
    else:
        width = (high - low) / bins
        counts = [0] * bins
        for value, count in buckets:
            counts[min(max(int((value - low) / width), 0), bins - 1)] += count
        bars = tuple(
            Bin(low + index * width, low + (index + 1) * width, count)
            for index, count in enumerate(counts)
        )
    return Distribution(
        total,
        buckets[0][0],
        buckets[-1][0],
        mean,
        _percentile(buckets, total, 0.5),
        _percentile(buckets, total, 0.9),
        _percentile(buckets, total, 0.99),
        bars,
    )


def _percentile(buckets: Sequence[tuple[float, int]], total: int, share: float) -> float:
    wanted = share * total
    seen = 0
    for value, count in buckets:
        seen += count
        if seen >= wanted:
            return value
    return buckets[-1][0]


@dataclass(frozen=True)
class Series:
    """Rewards and metrics over a run: at ``x[i]`` (the last episode's
    number, from 1, or the step) the mean of each, over the episodes since
    the previous point. ``None`` where no episode there had the value."""

    axis: str
    x: tuple[int, ...]
    episodes: tuple[int, ...]
    reward: tuple[float | None, ...]
    error_rate: tuple[float, ...]
    metrics: dict[str, tuple[float | None, ...]] = field(default_factory=dict)
    #: When each point's last episode arrived (epoch seconds).
    time: tuple[float, ...] = ()


def series_of(points: Sequence[SeriesPoint], *, block: int, max_points: int = MAX_POINTS) -> Series:
    """``points`` of one axis (``block`` episodes each, 0: by step), merged
    into at most ``max_points``."""
    groups = _merge(points, max_points)
    names = sorted({name for point in points for name in point.metrics})
    x = []
    for group in groups:
        last = group[-1]
        x.append(last.point if block == 0 else (last.point + 1) * block)
    if block and groups:
        # The last block is still filling: it ends at the last episode.
        x[-1] = groups[-1][-1].point * block + groups[-1][-1].episodes
    return Series(
        axis="step" if block == 0 else "episodes",
        x=tuple(x),
        time=tuple(max(p.last_seen for p in group) for group in groups),
        episodes=tuple(sum(p.episodes for p in group) for group in groups),
        reward=tuple(
            _mean(sum(p.reward_sum for p in g), sum(p.rewarded for p in g)) for g in groups
        ),
        error_rate=tuple(
            sum(p.failed for p in group) / max(1, sum(p.episodes for p in group))
            for group in groups
        ),
        metrics={
            name: tuple(
                _mean(
                    sum(p.metrics.get(name, (0.0, 0))[0] for p in group),
                    sum(p.metrics.get(name, (0.0, 0))[1] for p in group),
                )
                for group in groups
            )
            for name in names
        },
    )


def _merge(points: Sequence[SeriesPoint], max_points: int) -> list[list[SeriesPoint]]:
    per_group = max(1, -(-len(points) // max_points))
    return [list(points[start : start + per_group]) for start in range(0, len(points), per_group)]


def _mean(total: float, count: int) -> float | None:
    return total / count if count else None
