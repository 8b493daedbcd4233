"""Each page of the viewer as HTML, from the data ``run_data``,
``episodes`` and ``compare`` read: runs, a run, its episodes, one episode,
runs side by side, and the page that says what went wrong.

Values go in through :func:`.html.text` (escaped) only; charts come from
:mod:`.charts`. A page is a function of its data: no spool access here.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from ..deliver.spool import EpisodeFactsRow, RunRow
from . import charts
from .compare import CompareData
from .distributions import Bin, Distribution
from .episodes import PAGE_SIZE, EpisodeDetail, EpisodeTable, Message, TraceView
from .html import (
    DASH,
    NEXT,
    PREVIOUS,
    Html,
    join,
    link,
    notice,
    page,
    pct,
    qs,
    seconds,
    table,
    text,
    url,
)
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


def _run_label(run: RunRow) -> str:
    return run.name or run.local_id[:12]


def _status(view: dict[str, Any]) -> Html:
    return Html(
        f'<span class="status status-{text(view["status"])}" data-field="status">'
        f"{text(view['status'])}</span> "
        f'<span class="state" data-field="state">{text(view["state"])}</span>'
    )


# -- runs --------------------------------------------------------------------------


def runs_page(
    views: Sequence[dict[str, Any]], filters: dict[str, str], *, reading: str | None
) -> Html:
    """Every run, newest first, filtered as ``runs`` filters; tick two or
    more to compare them."""
    options = "".join(
        f'<option value="{text(value)}"{" selected" if filters.get("status") == value else ""}>'
        f"{text(value)}</option>"
        for value in ("", *STATUSES, *STATES)
    )
    kinds = "".join(
        f'<option value="{value}"{" selected" if filters.get("kind") == value else ""}>'
        f"{value or 'any kind'}</option>"
        for value in ("", "eval", "train")
    )
    form = (
        '<form class="filters" method="get" action="/">'
        f'<label>status <select name="status">{options}</select></label>'
        f'<label>kind <select name="kind">{kinds}</select></label>'
        f'<label>name <input name="name" value="{text(filters.get("name", ""))}"></label>'
        f'<label>since <input name="since" placeholder="7d, 2026-01-31" '
        f'value="{text(filters.get("since", ""))}"></label>'
        '<button type="submit">filter</button></form>'
    )
    if not views:
        body = form + notice(
            "No runs here yet. Record one (`make demo`, or `prime-runs-otel demo`), "
            "or widen the filters."
            if filters
            else "No runs in the local store yet: `prime-runs-otel demo` records one."
        )
        return page("runs", Html(body))
    rows = []
    for view in views:
        summary = view["summary"]
        reward = summary.get("avg_reward")
        rows.append(
            f'<tr data-run="{text(view["id"])}">'
            f'<td><input type="checkbox" name="run" value="{text(view["id"])}" form="compare" '
            f'aria-label="compare {text(view["id"])}"></td>'
            f"<td>{link(url('runs', view['id']), view['id'][:12], css='mono')}</td>"
            f"<td>{text(view['name'])}</td><td>{text(view['kind'])}</td>"
            f"<td>{_status(view)}</td>"
            f'<td class="num" data-field="episodes">{view["episodes"]}</td>'
            f'<td class="num" data-field="pending">{view["pending"] or view["not_pushed"]}</td>'
            f'<td class="num">{text(_number(reward))}</td>'
            f'<td class="num">{pct(summary.get("avg_error"))}</td>'
            f"<td>{text(view['model'])}</td><td>{text(view['created_at'][:16])}</td></tr>"
        )
    reading_note = (
        notice(f"Reading the episodes of run {reading[:12]} stored by an earlier release.")
        if reading
        else ""
    )
    body = (
        f"<h1>Runs</h1>{form}{reading_note}"
        '<form id="compare" method="get" action="/compare"></form>'
        '<table class="runs"><thead><tr><th></th><th>id</th><th>name</th><th>kind</th>'
        "<th>status</th><th>episodes</th><th>pending</th><th>reward</th><th>errors</th>"
        f"<th>model</th><th>created</th></tr></thead><tbody>{''.join(rows)}</tbody></table>"
        '<p><button type="submit" form="compare">compare the ticked runs</button></p>'
    )
    return page("runs", Html(body), live="/api/runs")


def _number(value: Any) -> str | None:
    return None if not isinstance(value, (int, float)) else f"{value:.4f}"


# -- a run -------------------------------------------------------------------------


def run_page(data: RunData, *, live_part: bool = False) -> Html:
    """A run: what it is, where it is, its distributions, errors and
    series. With ``live_part`` only the part a live page swaps in."""
    run, view = data.run, data.view
    runs_url = url("runs", run.local_id)
    episodes_url = f"{runs_url}/episodes"
    parts: list[str] = []
    if data.unread:
        parts.append(
            notice(
                f"{data.unread} episode(s) were stored by an earlier release and are being read "
                "into these views; the page fills in as they are."
            )
        )
    if data.bodiless:
        parts.append(
            notice(
                f"{data.bodiless} episode(s) were delivered and their bodies dropped before this "
                "release kept them: they are counted, but not in the distributions below."
            )
        )
    parts.append(_summary(data))
    parts.append(_distributions(data.distributions, episodes_url))
    parts.append(_errors(data, episodes_url))
    parts.append(_series(data))
    live = join(parts)
    if live_part:
        return live
    head = (
        f"<h1>{text(_run_label(run))}</h1>"
        f'<p class="about">{text(run_about(run))} · {_status(view)} · '
        f'<span data-field="episodes">{view["episodes"]}</span> episodes · '
        f"{link(episodes_url, 'browse the episodes')}</p>"
    )
    body = Html(head + f'<div id="live-part">{live}</div>')
    recording = view["state"] == "recording"
    return page(
        _run_label(run),
        body,
        crumbs=[(runs_url, run.local_id[:12])],
        live=f"/api/runs/{run.local_id}/status" if recording else "",
    )


def _summary(data: RunData) -> Html:
    view = data.view
    summary = view["summary"]
    facts = [
        ("run id", view["id"]),
        ("status", f"{view['status']}, {view['state']}"),
        ("episodes", view["episodes"]),
        ("pending", view["pending"]),
        ("not pushed", view["not_pushed"]),
        ("failed / uncertain", f"{view['failed']} / {view['uncertain']}"),
        ("corrupt / duplicates", f"{view['corrupt']} / {view['duplicates']}"),
        ("mean reward", _number(summary.get("avg_reward"))),
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
    rows = "".join(f"<tr><th>{text(name)}</th><td>{text(value)}</td></tr>" for name, value in facts)
    metrics = summary.get("avg_metrics") or {}
    metric_rows = "".join(
        f"<tr><th>{text(name)}</th><td class='num'>{text(_number(value))}</td></tr>"
        for name, value in sorted(metrics.items())
    )
    metric_table = (
        f'<table class="facts"><caption>mean metrics</caption>{metric_rows}</table>'
        if metric_rows
        else ""
    )
    return Html(
        f'<section class="summary"><table class="facts">{rows}</table>{metric_table}</section>'
    )


_DISTRIBUTIONS = (
    ("reward", "reward per episode", "", "reward"),
    ("tokens", "tokens per episode", "", "tokens"),
    ("duration", "episode duration", " s", "duration"),
    ("call_latency", "model call latency", " s", None),
)


def _distributions(shapes: dict[str, Distribution | None], episodes_url: str) -> Html:
    cells = []
    for name, label, unit, column in _DISTRIBUTIONS:
        shape = shapes.get(name)
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
        figures = (
            f"{shape.count} · mean {charts.number(shape.mean)}{unit} · "
            f"p50 {charts.number(shape.p50)}{unit} · p90 {charts.number(shape.p90)}{unit} · "
            f"p99 {charts.number(shape.p99)}{unit}"
        )
        cells.append(
            f'<figure data-chart="{text(name)}"><figcaption>{text(label)}</figcaption>{chart}'
            f'<p class="figures">{text(figures)}</p></figure>'
        )
    if not cells:
        return notice("No episode with a reward, tokens or times yet.")
    return Html(f'<section class="charts"><h2>Distributions</h2>{"".join(cells)}</section>')


def _bound(value: float) -> str:
    return f"{value:.6g}"


def _errors(data: RunData, episodes_url: str) -> Html:
    if not data.errors:
        return Html("")
    rows = []
    for group in data.errors:
        example = url("runs", data.run.local_id, "episodes", group.example_id)
        rows.append(
            "<tr>"
            f"<td>{link(qs(episodes_url, {'error': group.error_type}), group.error_type)}</td>"
            f'<td class="num">{group.count}</td>'
            f"<td>{link(example, group.example_id[:16], css='mono')}</td>"
            f'<td class="message">{text(group.example_message)}</td></tr>'
        )
    return Html(
        '<section class="errors"><h2>Errors by type</h2><table><thead><tr><th>type</th>'
        "<th>episodes</th><th>example</th><th>its message</th></tr></thead>"
        f"<tbody>{''.join(rows)}</tbody></table></section>"
    )


def _series(data: RunData) -> Html:
    cells = []
    series = data.series
    if series is not None and series.x:
        x_label = "step" if series.axis == "step" else "episodes (arrival order)"
        over = "over steps" if series.axis == "step" else "over the run"
        cells.append(_line_figure(f"reward {over}", series.x, [("reward", series.reward)], x_label))
        cells.append(
            _line_figure(
                f"error rate {over}", series.x, [("error rate", series.error_rate)], x_label
            )
        )
        for name, values in series.metrics.items():
            cells.append(_line_figure(f"{name} {over}", series.x, [(name, values)], x_label))
    for name, points in data.step_metrics.items():
        steps = [step for step, _ in points]
        row_values: list[float | None] = [value for _, value in points]
        cells.append(_line_figure(f"{name} (metrics row)", steps, [(name, row_values)], "step"))
    if not cells:
        return Html("")
    title = "Over steps" if data.run.kind == "train" else "Over the run"
    return Html(f'<section class="charts"><h2>{title}</h2>{"".join(cells)}</section>')


def _line_figure(
    label: str,
    x: Sequence[float],
    series: Sequence[tuple[str, Sequence[float | None]]],
    x_label: str,
) -> str:
    chart = charts.lines(x, series, label=label, x_label=x_label)
    return (
        f'<figure data-chart="{text(label)}"><figcaption>{text(label)}</figcaption>{chart}</figure>'
    )


# -- episodes ------------------------------------------------------------------------


_SORTABLE = (("reward", "reward"), ("tokens", "tokens"), ("duration", "duration"))


def episodes_page(run: RunRow, table_data: EpisodeTable, params: dict[str, str]) -> Html:
    runs_url = url("runs", run.local_id)
    episodes_url = f"{runs_url}/episodes"
    query = table_data.query
    where = query.where
    error_options = "".join(
        f'<option value="{text(value)}"{" selected" if where.error == value else ""}>'
        f"{text(label)}</option>"
        for value, label in (
            ("", "any"),
            ("none", "ok only"),
            ("any", "failed only"),
            *((kind, kind) for kind in table_data.error_types),
        )
    )

    def field(name: str, value: object, hint: str = "") -> str:
        shown = "" if value is None else value
        return (
            f'<label>{text(name.replace("_", " "))} <input name="{name}" size="7" '
            f'placeholder="{text(hint)}" value="{text(shown)}"></label>'
        )

    form = (
        f'<form class="filters" method="get" action="{text(episodes_url)}">'
        + field("min_reward", where.min_reward)
        + field("max_reward", where.max_reward)
        + f'<label>error <select name="error">{error_options}</select></label>'
        + field("min_tokens", where.min_tokens)
        + field("max_tokens", where.max_tokens)
        + field("min_duration", where.min_duration, "s")
        + field("max_duration", where.max_duration, "s")
        + field("example", where.example)
        + f'<input type="hidden" name="sort" value="{text(query.sort)}">'
        + f'<input type="hidden" name="order" value="{"desc" if query.descending else "asc"}">'
        + '<button type="submit">filter</button> '
        + link(episodes_url, "clear")
        + "</form>"
    )
    kept = {name: value for name, value in params.items() if name not in ("sort", "order", "page")}

    def header(label: str, key: str) -> str:
        descending = not (query.sort == key and query.descending)
        arrow = ""
        if query.sort == key:
            arrow = " \u25bc" if query.descending else " \u25b2"
        href = qs(episodes_url, {**kept, "sort": key, "order": "desc" if descending else "asc"})
        return f"<th>{link(href, label + arrow)}</th>"

    heads = (
        f"{header('#', 'arrival')}<th>episode</th><th>example</th>"
        f"<th>step</th><th>ok</th>{header('reward', 'reward')}<th>error</th>"
        f"{header('tokens', 'tokens')}{header('duration', 'duration')}<th>turns</th><th>state</th>"
    )
    rows = [_episode_row(run, row) for row in table_data.rows]
    offset = (query.page - 1) * PAGE_SIZE
    shown = f"{offset + 1}-{offset + len(rows)}" if rows else "none"
    pager = []
    if query.page > 1:
        pager.append(link(qs(episodes_url, {**params, "page": query.page - 1}), PREVIOUS))
    if query.page < table_data.pages:
        pager.append(link(qs(episodes_url, {**params, "page": query.page + 1}), NEXT))
    # Sorted by a value, the episodes without one are not in the order.
    with_value = "" if query.sort == "arrival" else f" with a {query.sort}"
    body = (
        f"<h1>Episodes of {text(_run_label(run))}</h1>{form}"
        f'<p class="count">{table_data.total} episode(s) match{with_value} · showing {shown} · '
        f"page {query.page} of {table_data.pages} {' '.join(pager)}</p>"
        f'<table class="episodes"><thead><tr>{heads}</tr></thead>'
        f"<tbody>{''.join(rows)}</tbody></table>"
        f'<p class="pager">{" ".join(pager)}</p>'
    )
    return page(
        f"episodes of {_run_label(run)}",
        Html(body),
        crumbs=[(runs_url, run.local_id[:12]), (episodes_url, "episodes")],
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


def _episode_row(run: RunRow, row: EpisodeFactsRow) -> str:
    href = url("runs", run.local_id, "episodes", row.episode_id)
    ok = {1: "ok", 0: "failed", -1: "?"}.get(row.ok if row.ok is not None else -2, "…")
    example = _example(row.example)
    example_link = (
        link(qs(url("runs", run.local_id, "episodes"), {"example": row.example}), example)
        if row.example is not None
        else text(None)
    )
    return (
        f"<tr><td class='num'>{row.seq}</td>"
        f"<td>{link(href, row.episode_id[:24], css='mono')}</td><td>{example_link}</td>"
        f"<td class='num'>{text(row.step)}</td><td>{ok}</td>"
        f"<td class='num'>{text(_number(row.reward))}</td><td>{text(row.error_type)}</td>"
        f"<td class='num'>{text(row.tokens)}</td><td class='num'>{seconds(row.duration)}</td>"
        f"<td class='num'>{text(row.turns)}</td><td>{text(row.state)}</td></tr>"
    )


# -- one episode ---------------------------------------------------------------------


def episode_page(run: RunRow, detail: EpisodeDetail) -> Html:
    runs_url = url("runs", run.local_id)
    row = detail.row
    here = url("runs", run.local_id, "episodes", row.episode_id)
    facts = [
        ("episode", row.episode_id),
        ("example", _example(row.example)),
        ("step", row.step),
        ("outcome", {1: "ok", 0: "failed"}.get(row.ok or 0, DASH) if row.ok is not None else DASH),
        ("reward", _number(row.reward)),
        ("error", row.error_type),
        ("tokens (in / out)", f"{text(row.input_tokens)} / {text(row.output_tokens)}"),
        ("duration", seconds(row.duration)),
        ("model calls", row.turns),
        ("delivery", row.state),
        ("record", f"{detail.size} bytes" if detail.size else None),
    ]
    rows = "".join(f"<tr><th>{text(name)}</th><td>{text(value)}</td></tr>" for name, value in facts)
    steps = []
    if detail.previous:
        steps.append(link(url("runs", run.local_id, "episodes", detail.previous), PREVIOUS))
    if detail.following:
        steps.append(link(url("runs", run.local_id, "episodes", detail.following), NEXT))
    parts = [
        f"<h1>Episode {text(row.episode_id[:24])}</h1>",
        f'<p class="pager">{" ".join(steps)}</p>',
        f'<table class="facts">{rows}</table>',
    ]
    if detail.task:
        parts.append(f'<h2>Task</h2><pre class="task">{text(detail.task)}</pre>')
    if detail.problem:
        parts.append(notice(f"This episode cannot be shown whole: {detail.problem}", css="problem"))
    for trace in detail.traces:
        parts.append(_trace(trace))
    return page(
        f"episode {row.episode_id[:16]}",
        Html("".join(parts)),
        crumbs=[
            (runs_url, run.local_id[:12]),
            (f"{runs_url}/episodes", "episodes"),
            (here, row.episode_id[:12]),
        ],
    )


def _trace(trace: TraceView) -> str:
    badge = "trainable" if trace.trainable else "not trainable"
    head = (
        f'<section class="trace"><h2>{text(trace.name)} <small>{text(trace.model)} · '
        f"{badge} · {'ok' if trace.ok else 'failed'} · reward {text(_number(trace.reward))}"
        "</small></h2>"
    )
    scores = (
        table(("reward", "score (weight)"), sorted(trace.rewards.items()), css="facts")
        if trace.rewards
        else ""
    )
    metrics = (
        table(("metric", "value"), sorted(trace.metrics.items()), css="facts")
        if (trace.metrics)
        else ""
    )
    tools = notice("tools offered: " + ", ".join(trace.tools)) if trace.tools else ""
    errors = "".join(notice(f"error: {error}", css="problem") for error in trace.errors)
    failed = "".join(
        notice(f"failed model call: {error}", css="problem") for error in trace.failed_calls
    )
    messages = "".join(_message(message) for message in trace.messages)
    more = (
        notice(f"{trace.more_messages} more message(s) not shown: export the episode to read them.")
        if trace.more_messages
        else ""
    )
    return (
        f'{head}<div class="scores">{scores}{metrics}</div>{tools}{errors}'
        f'<div class="conversation">{messages}</div>{more}{failed}</section>'
    )


def _message(message: Message) -> str:
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
    parts = [f'<div class="message role-{role}"><div class="meta">{text(" · ".join(meta))}</div>']
    if message.reasoning:
        parts.append(
            f"<details class='reasoning'><summary>reasoning</summary>"
            f"<pre>{text(message.reasoning)}</pre></details>"
        )
    if message.content:
        parts.append(f"<pre>{text(message.content)}</pre>")
    for name, arguments in message.tool_calls:
        parts.append(f'<pre class="tool-call">&rarr; {text(name)}({text(arguments)})</pre>')
    if message.cut:
        parts.append(notice(f"{message.cut} more character(s) not shown."))
    parts.append("</div>")
    return "".join(parts)


# -- compare -------------------------------------------------------------------------


def compare_page(data: CompareData) -> Html:
    names = [_run_label(run) for run in data.runs]
    headers = ["", *(link(url("runs", run.local_id), _run_label(run)) for run in data.runs)]
    lines: list[tuple[str, list[object]]] = [
        ("kind", [view["kind"] for view in data.views]),
        ("model", [view["model"] for view in data.views]),
        ("status", [f"{view['status']}, {view['state']}" for view in data.views]),
        ("episodes", [view["episodes"] for view in data.views]),
        ("mean reward", [_number(view["summary"].get("avg_reward")) for view in data.views]),
        ("error rate", [pct(view["summary"].get("avg_error")) for view in data.views]),
    ]
    for name in data.metric_names:
        lines.append(
            (
                name,
                [
                    _number((view["summary"].get("avg_metrics") or {}).get(name))
                    for view in data.views
                ],
            )
        )
    summary = table(headers, [(label, *values) for label, values in lines], css="compare")
    legend = "".join(
        f'<span class="swatch swatch-{index % len(charts.PALETTE)}">{text(name)}</span>'
        for index, name in enumerate(names)
    )
    rewards = charts.grouped_bars(data.rewards, label="reward per episode", names=names)
    parts = [
        "<h1>Compare runs</h1>",
        summary,
        f'<section><h2>Reward distributions</h2><p class="legend">{legend}</p>'
        f'<figure data-chart="rewards">{rewards}</figure></section>',
    ]
    first = data.runs[0]
    for comparison in data.examples:
        other = comparison.other
        parts.append(
            f"<section><h2>Per example: {text(_run_label(first))} and "
            f"{text(_run_label(other))}</h2>"
            + (
                f"<p class='note'>Compared on one in {comparison.every} of the examples (a "
                "sample spread over the run): these runs have too many to join at once.</p>"
                if comparison.every > 1
                else ""
            )
            + f"<p>{comparison.shared} example(s) rewarded in both · "
            f"{text(_run_label(other))} higher on {comparison.higher}, lower on "
            f"{comparison.lower}</p>"
        )
        if comparison.sample:
            parts.append(
                '<figure data-chart="examples">'
                + charts.scatter(
                    comparison.sample,
                    label="mean reward per example",
                    x_label=_run_label(first),
                    y_label=_run_label(other),
                    link=_example_link(first),
                )
                + "</figure>"
            )
        if comparison.top:
            rows = [
                (
                    link(
                        qs(url("runs", first.local_id, "episodes"), {"example": key}),
                        _example(key),
                    ),
                    _number(a),
                    _number(b),
                    _number(b - a),
                    link(qs(url("runs", other.local_id, "episodes"), {"example": key}), "episodes"),
                )
                for key, a, b in comparison.top
            ]
            parts.append(
                table(
                    ("example", _run_label(first), _run_label(other), "difference", ""),
                    rows,
                    css="compare",
                )
            )
        parts.append("</section>")
    return page("compare", Html("".join(parts)), crumbs=[("/compare", "compare")])


def _example_link(run: RunRow) -> Callable[[str], str]:
    def address(key: str) -> str:
        return qs(url("runs", run.local_id, "episodes"), {"example": key})

    return address


# -- when something is wrong ---------------------------------------------------------


def problem_page(title: str, message: str, *, hint: str = "") -> Html:
    body = f"<h1>{text(title)}</h1>" + notice(message, css="problem")
    if hint:
        body += notice(hint)
    body += f"<p>{link('/', 'back to the runs')}</p>"
    return page(title, Html(body))
