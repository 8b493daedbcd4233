"""Each page of the viewer, from the data ``run_data``, ``episodes`` and
``compare`` read: runs, a run and the page that says what went wrong here;
a run's episodes and one episode in ``episode_pages``, runs side by side in
``compare_page`` (all importable from here).

Here each page's data becomes what its template (``templates/``) shows:
addresses, labels and rows. The templates escape every value; charts come
from :mod:`.charts` as markup built from escaped parts. A page is a
function of its data: no spool access here.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from ..deliver.spool import RunRow
from . import charts
from .compare_page import compare_page
from .distributions import Bin, Distribution
from .episode_pages import episode_page, episodes_page
from .html import Markup, number, pct, qs, render, url
from .page_parts import crumbs, run_label
from .run_data import RunData
from .runs import STATES, STATUSES, run_about

__all__ = [
    "compare_page",
    "episode_page",
    "episodes_page",
    "problem_page",
    "run_page",
    "runs_page",
]


def platform_url(address: str | None) -> str | None:
    """The run's address on the platform, when it is a web address."""
    if address and address.startswith(("https://", "http://")):
        return address
    return None


# -- runs --------------------------------------------------------------------------

_RUN_FILTERS = ("status", "kind", "name", "since")


#: The runs list's sorts: each a key of a run's view, and its first order.
RUN_SORTS: dict[str, tuple[Callable[[dict[str, Any]], Any], str]] = {
    "start": (lambda view: view["created_at"], "desc"),
    "name": (lambda view: (view["name"] or view["id"]).lower(), "asc"),
    "status": (lambda view: (view["status"], view["state"]), "asc"),
    "reward": (lambda view: view["summary"].get("avg_reward"), "desc"),
}


def sort_runs(views: list[dict[str, Any]], sort: str, order: str) -> list[dict[str, Any]]:
    """``views`` by one of :data:`RUN_SORTS`; runs without a value last."""
    key, _ = RUN_SORTS[sort]
    valued = [view for view in views if key(view) is not None]
    without = [view for view in views if key(view) is None]
    return sorted(valued, key=key, reverse=order == "desc") + without


def runs_page(
    views: Sequence[dict[str, Any]],
    filters: dict[str, str],
    *,
    reading: str | None,
    spool: str = "",
    empty_store: bool = False,
    sort: str = "start",
    order: str = "desc",
) -> str:
    """Every run, newest first (or as sorted), filtered as ``runs`` filters;
    tick two or more to compare them."""
    shown = [
        {
            **view,
            "label": view["name"] or view["id"][:12],
            "url": platform_url(view["url"]),
        }
        for view in views
    ]
    kept = {key: filters.get(key) for key in _RUN_FILTERS}
    sort_links, arrows = {}, {}
    for key, (_, first) in RUN_SORTS.items():
        again = "asc" if order == "desc" else "desc"
        sort_links[key] = qs("/", {**kept, "sort": key, "order": again if key == sort else first})
        if key == sort:
            arrows[key] = " \u25bc" if order == "desc" else " \u25b2"
    return render(
        "runs.html",
        title="runs",
        crumbs=[],
        live=qs("/api/runs", {key: filters.get(key) for key in _RUN_FILTERS}),
        views=shown,
        filters=filters,
        filtered=any(filters.get(key) for key in _RUN_FILTERS),
        empty_store=empty_store,
        spool=spool,
        reading=reading,
        status_options=[("", "any status"), *((value, value) for value in (*STATUSES, *STATES))],
        kind_options=[("", "any kind"), ("eval", "eval"), ("train", "train")],
        sort=sort,
        order=order,
        columns=[
            ("run", "name"),
            ("kind", None),
            ("status", "status"),
            ("episodes", None),
            ("pending", None),
            ("not pushed", None),
            ("reward", "reward"),
            ("errors", None),
            ("model", None),
            ("started", "start"),
            ("platform", None),
        ],
        sort_links=sort_links,
        arrows=arrows,
    )


# -- a run -------------------------------------------------------------------------


def run_page(data: RunData, *, live_part: bool = False) -> str:
    """A run: what it is, where it is, its distributions, errors and
    series. With ``live_part`` only the part a live page swaps in."""
    run, view = data.run, data.view
    runs_url = url("runs", run.local_id)
    episodes_url = f"{runs_url}/episodes"
    context = {
        "unread": data.unread,
        "bodiless": data.bodiless,
        "training": run.kind == "train",
        "facts": _facts(view),
        "metrics": sorted((view["summary"].get("avg_metrics") or {}).items()),
        "config": _config(run),
        "distributions": _distributions(data, episodes_url),
        "errors": [
            {
                "error_type": group.error_type,
                "count": group.count,
                "example_id": group.example_id,
                "example_message": group.example_message,
                "href": qs(episodes_url, {"error": group.error_type}),
                "example_href": url("runs", run.local_id, "episodes", group.example_id),
            }
            for group in data.errors
        ],
        "charts_url": f"{url('api', 'runs', run.local_id)}/charts" if _has_curves(data) else "",
        "series_title": "Over steps" if run.kind == "train" else "Over the run",
        "axis": "step" if run.kind == "train" else "episode",
    }
    if live_part:
        return render("run_live.html", **context)
    recording = view["state"] == "recording"
    return render(
        "run.html",
        charts=bool(context["charts_url"]),
        title=run_label(run),
        crumbs=crumbs(run),
        live=f"{url('api', 'runs', run.local_id)}/status" if recording else "",
        label=run_label(run),
        about=run_about(run),
        view=view,
        episodes_url=episodes_url,
        platform_url=platform_url(view["url"]),
        **context,
    )


def _facts(view: dict[str, Any]) -> list[tuple[str, object]]:
    summary = view["summary"]
    facts: list[tuple[str, object]] = [
        ("run id", view["id"]),
        ("status", f"{view['status']}, {view['state']}"),
        ("episodes", view["episodes"]),
        ("pending", view["pending"]),
        ("not pushed", view["not_pushed"]),
        ("delivery failed / uncertain", f"{view['failed']} / {view['uncertain']}"),
        ("corrupt / duplicates", f"{view['corrupt']} / {view['duplicates']}"),
        ("mean reward", number(summary.get("avg_reward"))),
        ("error rate", pct(summary.get("avg_error"))),
        ("created", view["created_at"]),
        ("ended", view["ended_at"]),
        ("platform", view["platform_id"]),
    ]
    if view["error"]:
        facts.append(("ended with", view["error"]))
    if view["last_error"]:
        facts.append(("delivery error", view["last_error"]))
    if view["next_step"]:
        facts.append(("next", view["next_step"]))
    return facts


#: The config shown on a run page, at most (the rest is cut, and said so).
MAX_CONFIG_CHARS = 20_000


def _config(run: RunRow) -> str:
    if not run.config:
        return ""
    shown = json.dumps(run.config, indent=2, sort_keys=True, ensure_ascii=False, default=str)
    if len(shown) > MAX_CONFIG_CHARS:
        return shown[:MAX_CONFIG_CHARS] + f"\n… {len(shown) - MAX_CONFIG_CHARS} more characters"
    return shown


def _has_curves(data: RunData) -> bool:
    return bool(data.run.episodes) or data.run.kind == "train"


_DISTRIBUTIONS = (
    ("reward", "reward per episode", "", "reward"),
    ("tokens", "tokens per episode", "", "tokens"),
    ("duration", "episode duration", " s", "duration"),
    ("call_latency", "model call latency", " s", None),
)


def _distributions(data: RunData, episodes_url: str) -> list[dict[str, Any]]:
    figures = []
    for name, label, unit, column in _DISTRIBUTIONS:
        shape = data.distributions.get(name)
        if shape is None:
            continue

        def bar_link(item: Bin, column: str | None = column) -> str:
            return qs(
                episodes_url,
                {f"min_{column}": _bound(item.low), f"max_{column}": _bound(item.high)},
            )

        chart = charts.bars(
            shape, label=label, link=bar_link if column else None, unit=unit.strip()
        )
        figures.append(
            {
                "name": name,
                "label": label,
                "chart": Markup(chart),
                "figures": _figures(shape, unit),
            }
        )
    return figures


def _figures(shape: Distribution, unit: str) -> str:
    return (
        f"{shape.count} · mean {charts.number(shape.mean)}{unit} · "
        f"p50 {charts.number(shape.p50)}{unit} · p90 {charts.number(shape.p90)}{unit} · "
        f"p99 {charts.number(shape.p99)}{unit}"
    )


def _bound(value: float) -> str:
    return f"{value:.6g}"


# -- when something is wrong ---------------------------------------------------------


def problem_page(
    title: str, message: str, *, hint: str = "", links: Sequence[tuple[str, str]] = ()
) -> str:
    return render(
        "problem.html",
        title=title,
        crumbs=[],
        live="",
        message=message,
        hint=hint,
        links=list(links),
    )
