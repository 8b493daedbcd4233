"""Each page of the viewer, from the data ``run_data``, ``episodes`` and
``compare`` read: runs, a run, its episodes, one episode, runs side by
side, and the page that says what went wrong.

Here each page's data becomes what its template (``templates/``) shows:
addresses, labels and rows. The templates escape every value; charts come
from :mod:`.charts` as markup built from escaped parts. A page is a
function of its data: no spool access here.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from ..deliver.spool import EpisodeFactsRow, RunRow
from . import charts
from .compare import CompareData
from .distributions import Bin, Distribution
from .episodes import PAGE_SIZE, EpisodeDetail, EpisodeTable, Message
from .html import DASH, Markup, number, pct, qs, render, url
from .run_data import RunData
from .runs import STATES, STATUSES, episode_delivery, run_about

__all__ = [
    "compare_page",
    "episode_page",
    "episodes_page",
    "problem_page",
    "run_page",
    "runs_page",
]

PREVIOUS = "\u2039 previous"
NEXT = "next \u203a"


def _run_label(run: RunRow) -> str:
    return run.name or run.local_id[:12]


def _crumbs(run: RunRow, *more: tuple[str, str]) -> list[tuple[str, str]]:
    return [(url("runs", run.local_id), _run_label(run)), *more]


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
        title=_run_label(run),
        crumbs=_crumbs(run),
        live=f"{url('api', 'runs', run.local_id)}/status" if recording else "",
        label=_run_label(run),
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


# -- episodes ------------------------------------------------------------------------


def episodes_page(
    run: RunRow, table_data: EpisodeTable, params: dict[str, str], *, clamped: str = ""
) -> str:
    runs_url = url("runs", run.local_id)
    episodes_url = f"{runs_url}/episodes"
    query = table_data.query
    where = query.where
    fields = [
        ("step", where.step, ""),
        ("min_reward", where.min_reward, ""),
        ("max_reward", where.max_reward, ""),
        ("min_tokens", where.min_tokens, ""),
        ("max_tokens", where.max_tokens, ""),
        ("min_duration", where.min_duration, "s"),
        ("max_duration", where.max_duration, "s"),
        ("example", where.example, ""),
    ]
    kept = {name: value for name, value in params.items() if name not in ("sort", "order", "page")}
    sort_links, arrows = {}, {}
    for key in ("arrival", "reward", "tokens", "duration"):
        descending = not (query.sort == key and query.descending)
        sort_links[key] = qs(
            episodes_url, {**kept, "sort": key, "order": "desc" if descending else "asc"}
        )
        if query.sort == key:
            arrows[key] = " \u25bc" if query.descending else " \u25b2"
    offset = (query.page - 1) * PAGE_SIZE
    rows = [_episode_row(run, row, table_data.positions) for row in table_data.rows]
    pager = []
    if query.page > 1:
        pager.append((qs(episodes_url, {**params, "page": query.page - 1}), PREVIOUS))
    if query.page < table_data.pages:
        pager.append((qs(episodes_url, {**params, "page": query.page + 1}), NEXT))
    return render(
        "episodes.html",
        title=f"episodes of {_run_label(run)}",
        crumbs=_crumbs(run, (episodes_url, "episodes")),
        live="",
        label=_run_label(run),
        episodes_url=episodes_url,
        fields=[
            {
                "name": name,
                "label": name.replace("_", " "),
                "value": "" if value is None else value,
                "hint": hint,
            }
            for name, value, hint in fields
        ],
        error=where.error or "",
        error_options=[
            ("", "any"),
            ("none", "ok only"),
            ("any", "failed only"),
            *((kind, kind) for kind in table_data.error_types),
        ],
        sort=query.sort,
        order="desc" if query.descending else "asc",
        clamped=clamped,
        total=table_data.total,
        # Sorted by a value, the episodes without one are not in the order.
        with_value="" if query.sort == "arrival" else f" with a {query.sort}",
        shown=f"{offset + 1}-{offset + len(rows)}" if rows else "none",
        page=query.page,
        pages=table_data.pages,
        pager=pager,
        jump=[(name, value) for name, value in params.items() if name != "page" and value],
        rows=rows,
        headers=[
            ("#", "arrival"),
            ("episode", None),
            ("example", None),
            ("step", None),
            ("ok", None),
            ("reward", "reward"),
            ("error", None),
            ("tokens", "tokens"),
            ("duration", "duration"),
            ("turns", None),
            ("delivery", None),
        ],
        sort_links=sort_links,
        arrows=arrows,
    )


def _example(key: str | None) -> str | None:
    """An example key (the JSON of its idx) as the reader knows it."""
    if key is None:
        return None
    try:
        value = json.loads(key)
    except ValueError:
        return key
    return value if isinstance(value, str) else key


def _episode_row(run: RunRow, row: EpisodeFactsRow, positions: dict[int, int]) -> dict[str, Any]:
    ok = {1: "ok", 0: "failed", -1: "?"}.get(row.ok if row.ok is not None else -2, "…")
    return {
        "number": positions.get(row.seq),
        "episode_id": row.episode_id,
        "href": url("runs", run.local_id, "episodes", row.episode_id),
        "example": _example(row.example),
        "example_href": (
            qs(url("runs", run.local_id, "episodes"), {"example": row.example})
            if row.example is not None
            else None
        ),
        "step": row.step,
        "ok": ok,
        "reward": row.reward,
        "error_type": row.error_type,
        "tokens": row.tokens,
        "duration": row.duration,
        "turns": row.turns,
        "state": episode_delivery(run, row.state),
    }


# -- one episode ---------------------------------------------------------------------


def episode_page(run: RunRow, detail: EpisodeDetail, *, more: bool = False) -> str:
    runs_url = url("runs", run.local_id)
    row = detail.row
    here = url("runs", run.local_id, "episodes", row.episode_id)
    outcome = DASH if row.ok is None else {1: "ok", 0: "failed"}.get(row.ok, DASH)
    facts: list[tuple[str, object]] = [
        ("episode", row.episode_id),
        ("example", _example(row.example)),
        ("step", row.step),
        ("outcome", outcome),
        ("reward", number(row.reward)),
        ("error", row.error_type),
        ("tokens (in / out)", f"{_dash(row.input_tokens)} / {_dash(row.output_tokens)}"),
        ("duration", _seconds(row.duration)),
        ("model calls", row.turns),
        ("delivery", episode_delivery(run, row.state)),
        ("record", f"{detail.size} bytes" if detail.size else None),
    ]
    steps = []
    if detail.previous:
        steps.append((url("runs", run.local_id, "episodes", detail.previous), PREVIOUS))
    if detail.following:
        steps.append((url("runs", run.local_id, "episodes", detail.following), NEXT))
    return render(
        "episode.html",
        title=f"episode {row.episode_id[:16]}",
        crumbs=_crumbs(run, (f"{runs_url}/episodes", "episodes"), (here, row.episode_id[:12])),
        live="",
        episode_id=row.episode_id,
        steps=steps,
        facts=facts,
        record_href=f"{here}/record" if detail.size else "",
        task=detail.task,
        problem=detail.problem,
        traces=[_trace(trace) for trace in detail.traces],
        more_traces=detail.more_traces,
        over_budget=detail.over_budget,
        budget_kib=detail.budget // 1024,
        more_href="" if more else qs(here, {"more": "1"}),
        export=f"prime-runs-otel export {run.local_id[:12]} --what episodes",
    )


def _dash(value: object) -> object:
    return DASH if value is None else value


def _seconds(value: float | None) -> str:
    if value is None:
        return DASH
    return f"{value:.2f} s" if value < 100 else f"{value:.0f} s"


def _trace(trace: Any) -> dict[str, Any]:
    return {
        "name": trace.name,
        "model": trace.model,
        "trainable": trace.trainable,
        "ok": trace.ok,
        "reward": trace.reward,
        "rewards": trace.rewards,
        "metrics": trace.metrics,
        "tools": trace.tools,
        "errors": trace.errors,
        "failed_calls": trace.failed_calls,
        "messages": [_message(message) for message in trace.messages],
        "more_messages": trace.more_messages,
    }


def _message(message: Message) -> dict[str, Any]:
    role = message.role if message.role in ("system", "user", "assistant", "tool") else "other"
    meta = [f"#{message.index}", message.role]
    if message.parent is not None and message.parent != message.index - 1:
        meta.append(f"after #{message.parent}")
    if message.tool_call_id:
        meta.append(f"answers {message.tool_call_id}")
    if message.usage:
        meta.append(
            ", ".join(f"{key.replace('_', ' ')} {value}" for key, value in message.usage.items())
        )
    if message.finish_reason:
        meta.append(f"finish: {message.finish_reason}")
    return {
        "css": role,
        "meta": " · ".join(meta),
        "reasoning": message.reasoning,
        "content": message.content,
        "tool_calls": message.tool_calls,
        "more_calls": message.more_calls,
        "cut": message.cut,
    }


# -- compare -------------------------------------------------------------------------


def compare_page(data: CompareData) -> str:
    names = [_run_label(run) for run in data.runs]
    first = data.runs[0]
    rewards = charts.grouped_bars(data.rewards, label="reward per episode", names=names)
    examples = []
    for comparison in data.examples:
        other = comparison.other
        chart = (
            charts.scatter(
                comparison.sample,
                label="mean reward per example",
                x_label=_run_label(first),
                y_label=_run_label(other),
                link=lambda key: qs(url("runs", first.local_id, "episodes"), {"example": key}),
            )
            if comparison.sample
            else ""
        )
        examples.append(
            {
                "label": _run_label(other),
                "every": comparison.every,
                "shared": comparison.shared,
                "higher": comparison.higher,
                "lower": comparison.lower,
                "chart": Markup(chart),
                "top": [
                    {
                        "example": _example(key),
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
        column = {"label": _run_label(run), "id": run.local_id, "href": url("runs", run.local_id)}
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
