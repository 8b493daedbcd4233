"""What the run page (and ``show``) shows of one run, read from the
aggregates the spool keeps: a few hundred rows whatever the run's length.

- the run's description (:func:`~.runs.run_view`: status, counts, summary);
- distributions of rewards, tokens, episode durations and model-call
  latencies;
- failures by error type, each with a count and an example episode;
- rewards and metrics over the run: by blocks of episodes for an eval, by
  step for a training run, whose metrics rows are charted one per metric.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

from ..deliver.spool import EPISODE_AXES, HISTOGRAMS, STEP_AXIS, ErrorGroup, RunRow, Spool
from .distributions import MAX_POINTS, Distribution, Series, distribution, series_of
from .runs import run_view

__all__ = ["RunData", "run_data", "run_distributions", "step_metrics"]

#: A series axis is read whole when it has at most this many points.
MAX_SERIES_ROWS = 5000


@dataclass(frozen=True)
class RunData:
    run: RunRow
    view: dict[str, Any]
    distributions: dict[str, Distribution | None]
    errors: list[ErrorGroup]
    series: Series | None
    #: A training run's metrics rows: ``{metric: ((step, value), ...)}``.
    step_metrics: dict[str, tuple[tuple[int, float], ...]] = field(default_factory=dict)
    #: Episodes stored by an earlier release and not yet read into the views.
    unread: int = 0
    #: Episodes whose body was gone before their facts could be read.
    bodiless: int = 0


def run_distributions(spool: Spool, run_id: str) -> dict[str, Distribution | None]:
    return {name: distribution(spool.reading.histogram(run_id, name)) for name in HISTOGRAMS}


def run_data(spool: Spool, run: RunRow, *, with_series: bool = True) -> RunData:
    """``with_series``: also the series over the run (the run page reads
    them from its charts' own address instead)."""
    unread, bodiless = spool.reading.facts_missing(run.local_id)
    return RunData(
        run=run,
        view=run_view(spool, run),
        distributions=run_distributions(spool, run.local_id),
        errors=spool.reading.error_groups(run.local_id),
        series=run_series(spool, run) if with_series else None,
        step_metrics=step_metrics(spool, run.local_id)
        if with_series and run.kind == "train"
        else {},
        unread=unread,
        bodiless=bodiless,
    )


def run_series(spool: Spool, run: RunRow) -> Series | None:
    """By step for a training run whose episodes name their step, else by
    the finest blocks of episodes that keep the read small (a run of N
    episodes has about N / block points on each axis)."""
    if run.kind == "train" and spool.reading.has_series(run.local_id, STEP_AXIS):
        return series_of(spool.reading.series(run.local_id, STEP_AXIS), block=0)
    if not run.episodes:
        return None
    block = next(
        (axis for axis in EPISODE_AXES if run.episodes / axis <= MAX_SERIES_ROWS),
        EPISODE_AXES[-1],
    )
    points = spool.reading.series(run.local_id, block)
    return series_of(points, block=block) if points else None


def step_metrics(
    spool: Spool, run_id: str, max_points: int = MAX_POINTS
) -> dict[str, tuple[tuple[int, float], ...]]:
    """Every numeric value of the run's metrics rows, by step: every n-th
    row past ``max_points`` rows (the last one always)."""
    rows = spool.reading.metrics_rows(run_id)
    every = max(1, -(-len(rows) // max_points))
    chosen = [row for index, row in enumerate(rows) if index % every == 0 or index == len(rows) - 1]
    found: dict[str, list[tuple[int, float]]] = {}
    for row in chosen:
        try:
            values = json.loads(row.row)
        except ValueError:
            continue
        if not isinstance(values, dict):
            continue
        for name, value in values.items():
            if name in ("step", "_timestamp") or isinstance(value, bool):
                continue
            if isinstance(value, (int, float)) and math.isfinite(value):
                found.setdefault(name, []).append((row.step, float(value)))
    return {name: tuple(points) for name, points in sorted(found.items())}
