"""A run's episodes: the table (sorted and filtered by the facts the spool
keeps on each episode's row, a page at a time) and one episode whole (its
stored record read into its conversation, rewards and metrics).

Records come from producers and may hold anything: every field is taken
only in the shape expected and shown as text otherwise, a record that does
not parse says so, and a huge one is cut to what a page can hold, with the
command that gives it whole.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from .._json import loads as fast_loads
from ..deliver.spool import SORTS, EpisodeFactsRow, EpisodeFilter, RunRow, Spool

__all__ = [
    "PAGE_SIZE",
    "EpisodeDetail",
    "EpisodeTable",
    "Message",
    "TraceView",
    "episode_detail",
    "episode_table",
    "table_query",
]

PAGE_SIZE = 50
#: The deepest page offered: past it, a filter finds an episode faster.
MAX_OFFSET = 1_000_000
#: Records larger than this are not read into a page.
MAX_BODY_BYTES = 16 * 1024 * 1024
#: Characters of one message shown; the rest is cut, and said so.
MAX_TEXT_CHARS = 20_000
#: Messages of one trace shown.
MAX_MESSAGES = 500


class QueryError(ValueError):
    """A parameter of the table's address that cannot be used (said how)."""


@dataclass(frozen=True)
class TableQuery:
    where: EpisodeFilter = field(default_factory=EpisodeFilter)
    sort: str = "arrival"
    descending: bool = False
    page: int = 1


def table_query(params: Mapping[str, str]) -> TableQuery:
    """The table's filters, sort and page from its address's parameters
    (empty ones are ignored); :class:`QueryError` names a bad one."""
    values = {name: value.strip() for name, value in params.items() if value.strip()}
    sort = values.get("sort", "arrival")
    if sort not in SORTS:
        raise QueryError(f"sort={sort!r}: sort by one of {', '.join(SORTS)}")
    order = values.get("order", "desc" if sort != "arrival" else "asc")
    if order not in ("asc", "desc"):
        raise QueryError(f"order={order!r}: asc or desc")
    error = values.get("error")
    where = EpisodeFilter(
        min_reward=_number(values, "min_reward"),
        max_reward=_number(values, "max_reward"),
        error=error,
        min_tokens=_whole(values, "min_tokens"),
        max_tokens=_whole(values, "max_tokens"),
        min_duration=_number(values, "min_duration"),
        max_duration=_number(values, "max_duration"),
        example=values.get("example"),
    )
    page = _whole(values, "page")
    page = 1 if page is None else page
    if page < 1:
        raise QueryError("page must be 1 or more")
    return TableQuery(where, sort, order == "desc", page)


def _number(values: Mapping[str, str], name: str) -> float | None:
    if name not in values:
        return None
    try:
        number = float(values[name])
    except ValueError:
        raise QueryError(f"{name}={values[name]!r} is not a number") from None
    if not math.isfinite(number):
        raise QueryError(f"{name} must be a finite number")
    return number


def _whole(values: Mapping[str, str], name: str) -> int | None:
    if name not in values:
        return None
    try:
        return int(values[name])
    except ValueError:
        raise QueryError(f"{name}={values[name]!r} is not a whole number") from None


@dataclass(frozen=True)
class EpisodeTable:
    query: TableQuery
    rows: list[EpisodeFactsRow]
    total: int
    pages: int
    error_types: list[str]


def episode_table(spool: Spool, run: RunRow, query: TableQuery) -> EpisodeTable:
    offset = (query.page - 1) * PAGE_SIZE
    if offset > MAX_OFFSET:
        raise QueryError(f"page {query.page} is too deep: narrow the table with a filter")
    plan = _plan(spool, run, query)
    total = plan.total
    if total is None:
        total = spool.episode_count(
            run.local_id, query.where, sort=query.sort, index=plan.count_index
        )
    rows = spool.episode_rows(
        run.local_id,
        query.where,
        sort=query.sort,
        descending=query.descending,
        offset=offset,
        limit=PAGE_SIZE,
        index=plan.index,
    )
    return EpisodeTable(
        query=query,
        rows=rows,
        total=total,
        pages=max(1, -(-total // PAGE_SIZE)),
        error_types=[group.error_type for group in spool.error_groups(run.local_id)],
    )


@dataclass(frozen=True)
class _Plan:
    #: The index the page is found through, and the one its count is.
    index: str
    count_index: str
    #: The count when the kept views give it without counting.
    total: int | None = None


_INDEX_OF = {
    "arrival": "episodes_by_run",
    "reward": "episodes_by_reward",
    "tokens": "episodes_by_tokens",
    "duration": "episodes_by_duration",
}
#: A range keeping less than this share of a run is read through its own
#: index (then sorted); a wider one is checked along the sort's index.
_NARROW = 0.05


def _plan(spool: Spool, run: RunRow, query: TableQuery) -> _Plan:
    """Which index to read a page of the table through, and its count when
    the kept distributions already say it.

    SQLite has no statistics about a run's values, and guessing wrong costs
    a walk over a million rows; the run's distributions say how many
    episodes a filter keeps, so the choice is made here: a few rows of an
    example or of failures through their own index; a range that keeps few
    episodes through its column's index; anything else along the sort's
    index, which finds a page's worth of matches within a few hundred rows.
    """
    where = query.where
    sort_index = _INDEX_OF[query.sort]
    if where.example is not None:
        return _Plan("episodes_by_example", "episodes_by_example")
    if where.error is not None and where.error != "none":
        return _Plan("episodes_failed", "episodes_failed")
    ranges = {
        name: (low, high)
        for name, low, high in (
            ("reward", where.min_reward, where.max_reward),
            ("tokens", where.min_tokens, where.max_tokens),
            ("duration", where.min_duration, where.max_duration),
        )
        if low is not None or high is not None
    }
    if not ranges:
        if query.sort == "arrival":
            counted = run.episodes
        else:
            counted = sum(count for _, count in spool.histogram(run.local_id, query.sort))
        if where.error == "none":  # the others, less the failures (and those without facts)
            counted -= spool.episode_count(
                run.local_id,
                EpisodeFilter(error="any"),
                sort=query.sort,
                index="episodes_failed",
            )
            if query.sort == "arrival":
                counted -= sum(spool.facts_missing(run.local_id))
        return _Plan(sort_index, sort_index, max(0, counted))
    for name, (low, high) in ranges.items():
        if _share(spool.histogram(run.local_id, name), low, high) < _NARROW:
            return _Plan(_INDEX_OF[name], _INDEX_OF[name])
    counter = _INDEX_OF[next(iter(ranges))] if ranges else sort_index
    return _Plan(sort_index, counter)


def _share(buckets: list[tuple[float, int]], low: float | None, high: float | None) -> float:
    total = sum(count for _, count in buckets)
    if not total:
        return 0.0
    kept = sum(
        count
        for value, count in buckets
        if (low is None or value >= low) and (high is None or value <= high)
    )
    return kept / total


# -- one episode ----------------------------------------------------------------------


@dataclass(frozen=True)
class Message:
    """One node of a trace's conversation, as text to show."""

    index: int
    parent: int | None
    role: str
    content: str
    reasoning: str = ""
    #: ``(name, arguments)`` of each tool call the message makes.
    tool_calls: tuple[tuple[str, str], ...] = ()
    #: For a tool's answer: the call it answers.
    tool_call_id: str = ""
    sampled: bool = False
    #: The model call that wrote it: prompt, completion and cached tokens.
    usage: dict[str, int] = field(default_factory=dict)
    finish_reason: str = ""
    cut: int = 0  # characters left out


@dataclass(frozen=True)
class TraceView:
    name: str
    model: str
    trainable: bool
    ok: bool
    reward: float | None
    rewards: dict[str, str]
    metrics: dict[str, str]
    messages: list[Message]
    #: Model calls that wrote no message (a failed call): their error.
    failed_calls: list[str]
    errors: list[str]
    tools: list[str]
    more_messages: int = 0


@dataclass(frozen=True)
class EpisodeDetail:
    row: EpisodeFactsRow
    #: Why the record cannot be shown, if it cannot (with what to do).
    problem: str | None = None
    traces: list[TraceView] = field(default_factory=list)
    task: str = ""
    previous: str | None = None
    following: str | None = None
    size: int = 0


def episode_detail(spool: Spool, run: RunRow, episode_id: str) -> EpisodeDetail | None:
    """``None`` when the run has no such episode."""
    found = spool.episode(run.local_id, episode_id)
    if found is None:
        return None
    row, body = found
    previous, following = spool.episode_neighbours(run.local_id, row.seq)
    detail = EpisodeDetail(row=row, previous=previous, following=following)
    export = f"prime-runs-otel export {run.local_id[:12]} --what episodes"
    if body is None:
        return replace(
            detail,
            problem="its record is no longer kept in the local store: it was delivered and its "
            "body dropped (PRIME_RUNS_OTEL_KEEP_DELIVERED off, `prune --bodies`, or the size "
            "cap made room). Its facts above are all that is left here; the platform has it.",
        )
    detail = replace(detail, size=len(body))
    if len(body) > MAX_BODY_BYTES:
        return replace(
            detail,
            problem=f"its record is {len(body) / 2**20:.1f} MiB, more than a page shows "
            f"({MAX_BODY_BYTES // 2**20} MiB). Read it with `{export}`.",
        )
    try:
        record = fast_loads(body)
    except (ValueError, RecursionError) as exc:
        return replace(detail, problem=f"its stored record is damaged and cannot be read ({exc}).")
    if not isinstance(record, dict):
        return replace(detail, problem="its stored record is not a JSON object.")
    traces = [_trace(item, index) for index, item in enumerate(_list(record.get("traces")))]
    return replace(detail, traces=traces, task=_task(record))


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _map(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list):  # content parts
        parts = []
        for part in value:
            part_map = _map(part)
            if isinstance(part_map.get("text"), str):
                parts.append(part_map["text"])
            else:
                parts.append(_json(part))
        return "\n".join(parts)
    return _json(value)


def _json(value: Any) -> str:
    try:
        return json.dumps(value, ensure_ascii=False, default=str)
    except (TypeError, ValueError, RecursionError):
        return repr(value)


def _cut(text: str) -> tuple[str, int]:
    if len(text) <= MAX_TEXT_CHARS:
        return text, 0
    return text[:MAX_TEXT_CHARS], len(text) - MAX_TEXT_CHARS


def _task(record: Mapping[str, Any]) -> str:
    traces = _list(record.get("traces"))
    task = _map(record.get("task")) or (_map(_map(traces[0]).get("task")) if traces else {})
    data = _map(task.get("data"))
    shown = {key: data[key] for key in ("idx", "prompt", "answer") if key in data}
    return _cut(_json(shown or data))[0] if (shown or data) else ""


def _trace(item: Any, index: int) -> TraceView:
    trace = _map(item)
    agent = _map(trace.get("agent"))
    config = _map(agent.get("config"))
    nodes = _list(trace.get("nodes"))
    produced: dict[int, Mapping[str, Any]] = {}
    failed_calls = []
    for call in _list(trace.get("calls")):
        call_map = _map(call)
        node = call_map.get("node")
        if isinstance(node, int) and not isinstance(node, bool):
            produced[node] = call_map
        elif call_map.get("error") is not None:
            failed_calls.append(_error_text(call_map.get("error")))
    messages = [
        _message(position, _map(node), produced.get(position))
        for position, node in enumerate(nodes[:MAX_MESSAGES])
    ]
    rewards = {
        str(name): (
            "did not run"
            if reward is None
            else f"{_map(reward).get('score')} (weight {_map(reward).get('weight', 1.0)})"
        )
        for name, reward in _map(trace.get("rewards")).items()
    }
    metrics = {str(name): _json(value) for name, value in _map(trace.get("metrics")).items()}
    tools = [
        str(_map(tool).get("name") or _map(_map(tool).get("function")).get("name") or "?")
        for tool in _list(trace.get("tools"))
    ]
    return TraceView(
        name=str(agent.get("name") or f"trace {index + 1}"),
        model=str(config.get("model") or ""),
        trainable=bool(agent.get("trainable", True)),
        ok=trace.get("ok", True) is True,
        reward=_reward(trace),
        rewards=rewards,
        metrics=metrics,
        messages=messages,
        failed_calls=failed_calls,
        errors=[_error_text(error) for error in _list(trace.get("errors"))],
        tools=tools,
        more_messages=max(0, len(nodes) - MAX_MESSAGES),
    )


def _reward(trace: Mapping[str, Any]) -> float | None:
    total = 0.0
    for reward in _map(trace.get("rewards")).values():
        if reward is None:
            continue
        try:
            score, weight = _map(reward).get("score"), _map(reward).get("weight", 1.0)
            total += float(score) * float(weight)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            return None
    return total if math.isfinite(total) else None


def _error_text(error: Any) -> str:
    error_map = _map(error)
    if not error_map:
        return _text(error)
    kind = error_map.get("type")
    message = error_map.get("message")
    return ": ".join(str(part) for part in (kind, message) if part) or _json(error)


def _message(position: int, node: Mapping[str, Any], call: Mapping[str, Any] | None) -> Message:
    message = _map(node.get("message"))
    content, cut = _cut(_text(message.get("content")))
    reasoning, more = _cut(_text(message.get("reasoning_content") or message.get("reasoning")))
    calls = []
    for tool_call in _list(message.get("tool_calls")):
        tool_map = _map(tool_call)
        function = _map(tool_map.get("function"))
        name = tool_map.get("name") or function.get("name") or "?"
        arguments = tool_map.get("arguments", function.get("arguments", ""))
        calls.append((str(name), _cut(_text(arguments))[0]))
    usage = {
        str(key): value
        for key, value in _map(_map(call).get("usage")).items()
        if isinstance(value, int) and not isinstance(value, bool)
    }
    parent = node.get("parent")
    return Message(
        index=position,
        parent=parent if isinstance(parent, int) and not isinstance(parent, bool) else None,
        role=str(message.get("role") or "?"),
        content=content,
        reasoning=reasoning,
        tool_calls=tuple(calls),
        tool_call_id=str(message.get("tool_call_id") or ""),
        sampled=node.get("sampled") is True,
        usage=usage,
        finish_reason=str(_map(call).get("finish_reason") or ""),
        cut=cut + more,
    )
