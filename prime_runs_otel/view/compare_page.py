"""The page of runs side by side, from ``compare``'s data: a column per
run with its difference from the first, the rewards as grouped bars, and
for each other run its examples against the first's.

Apart from ``pages.py`` because it answers "how do these runs differ", a
question of its own with its own cells (signed differences); a function
of its data, with no spool access.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from . import charts
from .compare import CompareData
from .html import DASH, Markup, number, pct, qs, render, url
from .page_parts import example_label, run_label

__all__ = ["compare_page"]


def compare_page(data: CompareData) -> str:
    names = [run_label(run) for run in data.runs]
    first = data.runs[0]
    rewards = charts.grouped_bars(data.rewards, label="reward per episode", names=names)
    examples = []
    for comparison in data.examples:
        other = comparison.other
        chart = (
            charts.scatter(
                comparison.sample,
                label="mean reward per example",
                x_label=run_label(first),
                y_label=run_label(other),
                link=lambda key: qs(url("runs", first.local_id, "episodes"), {"example": key}),
            )
            if comparison.sample
            else ""
        )
        examples.append(
            {
                "label": run_label(other),
                "every": comparison.every,
                "shared": comparison.shared,
                "higher": comparison.higher,
                "lower": comparison.lower,
                "chart": Markup(chart),
                "top": [
                    {
                        "example": example_label(key),
                        "href": qs(url("runs", first.local_id, "episodes"), {"example": key}),
                        "other_href": qs(url("runs", other.local_id, "episodes"), {"example": key}),
                        "first": a,
                        "other": b,
                        "delta": b - a,
                    }
                    for key, a, b in comparison.top
                ],
            }
        )
    return render(
        "compare.html",
        title="compare",
        crumbs=[("/compare", "compare")],
        live="",
        first_label=names[0],
        columns=_compare_columns(data),
        lines=_compare_lines(data),
        names=names,
        palette=len(charts.PALETTE),
        rewards=Markup(rewards),
        examples=examples,
    )


def _compare_columns(data: CompareData) -> list[dict[str, Any]]:
    """Each run's column in the order given, and after each but the first,
    its difference from the first."""
    columns = []
    for index, run in enumerate(data.runs):
        column = {"label": run_label(run), "id": run.local_id, "href": url("runs", run.local_id)}
        columns.append({**column, "delta": False})
        if index:
            columns.append({**column, "delta": True})
    return columns


def _compare_lines(data: CompareData) -> list[tuple[str, list[object]]]:
    views = data.views

    def text(values: list[object]) -> list[object]:
        return [values[0], *(cell for value in values[1:] for cell in (value, ""))]

    def numbers(values: list[float | None], shown: Callable[[float | None], str]) -> list[object]:
        first = values[0]
        cells: list[object] = [shown(first)]
        for value in values[1:]:
            delta = None if value is None or first is None else value - first
            cells += [shown(value), _signed(delta, shown)]
        return cells

    summaries = [view["summary"] for view in views]
    lines: list[tuple[str, list[object]]] = [
        ("kind", text([view["kind"] for view in views])),
        ("model", text([view["model"] for view in views])),
        ("status", text([f"{view['status']}, {view['state']}" for view in views])),
        ("episodes", numbers([view["episodes"] for view in views], _count)),
        ("mean reward", numbers([summary.get("avg_reward") for summary in summaries], number)),
        ("error rate", numbers([summary.get("avg_error") for summary in summaries], pct)),
    ]
    for name in data.metric_names:
        values = [(summary.get("avg_metrics") or {}).get(name) for summary in summaries]
        lines.append((name, numbers(values, number)))
    return lines


def _count(value: float | None) -> str:
    return DASH if value is None else f"{value:,.0f}"


def _signed(delta: float | None, shown: Callable[[float | None], str]) -> str:
    if delta is None:
        return DASH
    written = shown(abs(delta))
    return f"+{written}" if delta > 0 else f"\u2212{written}" if delta < 0 else f"\u00b1{written}"
