"""Two or more runs side by side: their reward distributions on one scale,
their summaries and metrics, and the rewards of the examples they share
(each run against the first), from the aggregates the spool keeps.

Examples are compared one by one (a run's mean reward on each against the
first run's), which is a join over every example the runs share: for runs
of more than :data:`MAX_EXAMPLES` examples, on a sample of them spread over
the run (one in every few), and the page says so.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Any

from ..deliver.spool import RunRow, Spool
from .distributions import Distribution, distribution
from .runs import run_view

__all__ = ["CompareData", "ExampleComparison", "compare_data"]

#: Examples listed (those that differ most), and points of the scatter.
TOP_EXAMPLES = 20
SCATTER_POINTS = 1000
#: Examples compared at most; past it, a sample of about this many.
MAX_EXAMPLES = 50_000


@dataclass(frozen=True)
class ExampleComparison:
    """One run's examples against the first run's."""

    other: RunRow
    #: One in ``every`` of the first run's examples was compared (1: all).
    every: int
    shared: int
    #: Examples on which ``other`` did better, and worse, on average.
    higher: int
    lower: int
    #: ``(example, first run's mean reward, other's)``, those that differ most first.
    top: list[tuple[str, float, float]]
    sample: list[tuple[str, float, float]]


@dataclass(frozen=True)
class CompareData:
    runs: list[RunRow]
    views: list[dict[str, Any]]
    rewards: list[Distribution | None]
    metric_names: list[str]
    examples: list[ExampleComparison]


def compare_data(spool: Spool, runs: list[RunRow]) -> CompareData:
    buckets = [spool.reading.histogram(run.local_id, "reward") for run in runs]
    values = [value for found in buckets for value, count in found if count]
    span = (min(values), max(values)) if values else None
    views = [run_view(spool, run) for run in runs]
    names = sorted({name for view in views for name in (view["summary"].get("avg_metrics") or {})})
    first = runs[0]
    every = max(1, -(-spool.reading.example_count(first.local_id) // MAX_EXAMPLES))
    examples = [
        _examples(
            other, spool.reading.example_pairs(first.local_id, other.local_id, every=every), every
        )
        for other in runs[1:]
    ]
    return CompareData(
        runs=runs,
        views=views,
        rewards=[distribution(found, span=span) for found in buckets],
        metric_names=names,
        examples=examples,
    )


def _examples(
    other: RunRow, pairs: list[tuple[str, float, float]], every: int
) -> ExampleComparison:
    higher = sum(1 for _, mine, theirs in pairs if theirs > mine)
    lower = sum(1 for _, mine, theirs in pairs if theirs < mine)
    top = heapq.nlargest(TOP_EXAMPLES, pairs, key=lambda pair: (abs(pair[2] - pair[1]), pair[0]))
    step = max(1, -(-len(pairs) // SCATTER_POINTS))
    return ExampleComparison(other, every, len(pairs), higher, lower, top, pairs[::step])
