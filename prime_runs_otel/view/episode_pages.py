"""A run's episode pages: the table of its episodes (filters, sort links,
pager) and one episode whole (its facts, traces and messages), from the
data ``episodes`` and ``episode_detail`` read.

Apart from ``pages.py`` because these answer "how does an episode show",
the largest pages of the viewer; like every page, a function of its data
with no spool access.
"""

from __future__ import annotations

from typing import Any

from ..deliver.spool import EpisodeFactsRow, EpisodeFilter, RunRow
from .episode_detail import EpisodeDetail, Message
from .episodes import PAGE_SIZE, EpisodeTable, TableQuery
from .html import DASH, number, qs, render, url
from .page_parts import NEXT, PREVIOUS, crumbs, example_label, run_label
from .runs import episode_delivery

__all__ = ["episode_page", "episodes_page"]

#: The table's columns: each header, and the sort it links to (if any).
_HEADERS = (
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
)


def episodes_page(
    run: RunRow, table_data: EpisodeTable, params: dict[str, str], *, clamped: str = ""
) -> str:
    episodes_url = f"{url('runs', run.local_id)}/episodes"
    query = table_data.query
    offset = (query.page - 1) * PAGE_SIZE
    rows = [_episode_row(run, row, table_data.positions) for row in table_data.rows]
    sort_links, arrows = _sort_links(episodes_url, query, params)
    return render(
        "episodes.html",
        title=f"episodes of {run_label(run)}",
        crumbs=crumbs(run, (episodes_url, "episodes")),
        live="",
        label=run_label(run),
        episodes_url=episodes_url,
        fields=_filter_fields(query.where),
        error=query.where.error or "",
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
        pager=_pager(episodes_url, query.page, table_data.pages, params),
        jump=[(name, value) for name, value in params.items() if name != "page" and value],
        rows=rows,
        headers=list(_HEADERS),
        sort_links=sort_links,
        arrows=arrows,
    )


def _filter_fields(where: EpisodeFilter) -> list[dict[str, Any]]:
    """The filter form's inputs, each with the value the table is filtered by."""
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
    return [
        {
            "name": name,
            "label": name.replace("_", " "),
            "value": "" if value is None else value,
            "hint": hint,
        }
        for name, value, hint in fields
    ]


def _sort_links(
    episodes_url: str, query: TableQuery, params: dict[str, str]
) -> tuple[dict[str, str], dict[str, str]]:
    """Each sortable column's link (the same filters, that sort, the other
    order when it is the current one) and the arrow of the current sort."""
    kept = {name: value for name, value in params.items() if name not in ("sort", "order", "page")}
    sort_links: dict[str, str] = {}
    arrows: dict[str, str] = {}
    for key in ("arrival", "reward", "tokens", "duration"):
        descending = not (query.sort == key and query.descending)
        sort_links[key] = qs(
            episodes_url, {**kept, "sort": key, "order": "desc" if descending else "asc"}
        )
        if query.sort == key:
            arrows[key] = " \u25bc" if query.descending else " \u25b2"
    return sort_links, arrows


def _pager(
    episodes_url: str, page: int, pages: int, params: dict[str, str]
) -> list[tuple[str, str]]:
    """Links to the page before and after this one, where there is one."""
    pager = []
    if page > 1:
        pager.append((qs(episodes_url, {**params, "page": page - 1}), PREVIOUS))
    if page < pages:
        pager.append((qs(episodes_url, {**params, "page": page + 1}), NEXT))
    return pager


def _episode_row(run: RunRow, row: EpisodeFactsRow, positions: dict[int, int]) -> dict[str, Any]:
    ok = {1: "ok", 0: "failed", -1: "?"}.get(row.ok if row.ok is not None else -2, "…")
    return {
        "number": positions.get(row.seq),
        "episode_id": row.episode_id,
        "href": url("runs", run.local_id, "episodes", row.episode_id),
        "example": example_label(row.example),
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


def episode_page(run: RunRow, detail: EpisodeDetail, *, more: bool = False) -> str:
    runs_url = url("runs", run.local_id)
    row = detail.row
    here = url("runs", run.local_id, "episodes", row.episode_id)
    outcome = DASH if row.ok is None else {1: "ok", 0: "failed"}.get(row.ok, DASH)
    facts: list[tuple[str, object]] = [
        ("episode", row.episode_id),
        ("example", example_label(row.example)),
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
        crumbs=crumbs(run, (f"{runs_url}/episodes", "episodes"), (here, row.episode_id[:12])),
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
