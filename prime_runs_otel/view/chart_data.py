"""The numbers behind a run page's curves, as the JSON its charts script
draws (``/api/runs/{run}/charts``): the reward, the error rate and every
metric over the run (by blocks of episodes for an eval, by step for a
training run), and a training run's metrics rows, one chart each.

Each chart has its x axis both ways, by step (or episode) and by time, so
the page can switch between them without asking again; every series is
already reduced on the server to at most :data:`MAX_POINTS` points,
whatever the run's length, so the page stays as fast on a million episodes
as on a hundred.
"""

from __future__ import annotations

import math
from typing import Any

from .._json import loads
from ..deliver.spool import EPISODE_AXES, STEP_AXIS, RunRow, Spool
from .distributions import series_of
from .run_data import MAX_SERIES_ROWS

__all__ = ["MAX_POINTS", "chart_data"]

#: Points of one chart at most (the server merges or thins the rest).
MAX_POINTS = 1000


def chart_data(spool: Spool, run: RunRow) -> dict[str, Any]:
    """``{"axis": "step" | "episodes", "charts": [...]}``; each chart:
    ``{"id", "title", "x", "time", "series": [{"label", "values"}]}``."""
    charts: list[dict[str, Any]] = []
    axis = "step" if run.kind == "train" else "episodes"
    if run.kind == "train":
        charts += _metrics_rows(spool, run.local_id)
    charts += _episode_series(spool, run)
    return {"axis": axis, "charts": charts}


def _episode_series(spool: Spool, run: RunRow) -> list[dict[str, Any]]:
    if run.kind == "train" and spool.reading.has_series(run.local_id, STEP_AXIS):
        series = series_of(
            spool.reading.series(run.local_id, STEP_AXIS), block=0, max_points=MAX_POINTS
        )
    elif run.episodes:
        block = next(
            (axis for axis in EPISODE_AXES if run.episodes / axis <= MAX_SERIES_ROWS),
            EPISODE_AXES[-1],
        )
        points = spool.reading.series(run.local_id, block)
        if not points:
            return []
        series = series_of(points, block=block, max_points=MAX_POINTS)
    else:
        return []
    over = "over steps" if series.axis == "step" else "over the run"
    x, time = list(series.x), list(series.time)
    charts = [
        _chart("reward", f"reward {over}", x, time, [("reward", series.reward)]),
        _chart("error_rate", f"error rate {over}", x, time, [("error rate", series.error_rate)]),
    ]
    charts += [
        _chart(f"episodes:{name}", f"{name} {over}", x, time, [(name, values)])
        for name, values in series.metrics.items()
    ]
    return charts


def _metrics_rows(spool: Spool, run_id: str) -> list[dict[str, Any]]:
    """Every numeric value of the run's metrics rows by step (every n-th row
    past :data:`MAX_POINTS` rows, the last one always), with its time."""
    rows = spool.reading.metrics_rows(run_id)
    every = max(1, -(-len(rows) // MAX_POINTS))
    steps: list[int] = []
    times: list[float | None] = []
    found: dict[str, dict[int, float]] = {}
    for index, row in enumerate(rows):
        if index % every and index != len(rows) - 1:
            continue
        try:
            values = loads(row.row)
        except ValueError:
            continue
        if not isinstance(values, dict):
            continue
        stamp = values.get("_timestamp")
        steps.append(row.step)
        times.append(_value(stamp))
        for name, value in values.items():
            if name not in ("step", "_timestamp") and _finite(value):
                found.setdefault(name, {})[len(steps) - 1] = float(value)
    return [
        _chart(
            f"metrics:{name}",
            f"{name} (metrics row)",
            steps,
            times,
            [(name, [points.get(index) for index in range(len(steps))])],
        )
        for name, points in sorted(found.items())
    ]


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _chart(
    key: str,
    title: str,
    x: list[int],
    time: list[float] | list[float | None],
    series: list[tuple[str, Any]],
) -> dict[str, Any]:
    return {
        "id": key,
        "title": title,
        "x": x,
        "time": time if time and all(stamp is not None for stamp in time) else None,
        "series": [
            {"label": label, "values": [_value(value) for value in values]}
            for label, values in series
        ],
    }


def _value(value: Any) -> float | None:
    return float(value) if _finite(value) else None
