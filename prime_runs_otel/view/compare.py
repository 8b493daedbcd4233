"""Two or more runs side by side: their reward distributions on one scale,
their summaries and metrics, and the rewards of the examples they share
(each run against the first), from the aggregates the spool keeps."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..deliver.spool import RunRow, Spool
from .distributions import Distribution, distribution
from .runs import run_view

__all__ = ["CompareData", "ExampleComparison", "compare_data"]

#: Examples listed (those that differ most), and points of the scatter.
TOP_EXAMPLES = 20
SCATTER_POINTS = 1000


@dataclass(frozen=True)
class ExampleComparison:
    """One run's examples against the first run's."""

    other: RunRow
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
    buckets = [spool.histogram(run.local_id, "reward") for run in runs]
    values = [value for found in buckets for value, count in found if count]
    span = (min(values), max(values)) if values else None
    views = [run_view(spool, run) for run in runs]
    names = sorted({name for view in views for name in (view["summary"].get("avg_metrics") or {})})
    first = runs[0]
    examples = []
    for other in runs[1:]:
        (shared, higher, lower), top = spool.shared_examples(
            first.local_id, other.local_id, limit=TOP_EXAMPLES
        )
        sample = spool.example_sample(first.local_id, other.local_id, limit=SCATTER_POINTS)
        examples.append(ExampleComparison(other, shared, higher, lower, top, sample))
    return CompareData(
        runs=runs,
        views=views,
        rewards=[distribution(found, span=span) for found in buckets],
        metric_names=names,
        examples=examples,
    )
