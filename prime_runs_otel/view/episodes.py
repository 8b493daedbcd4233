"""A run's episodes as a table: sorted and filtered by the facts the spool
keeps on each episode's row, a page at a time. One episode whole (its
record read into its conversation) is ``episode_detail.py``; its names are
still importable from here.

Every parameter of the table's address is checked before the spool is
asked, and a bad one is a :class:`QueryError` that says what to pass.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from ..deliver.spool import SORTS, EpisodeFactsRow, EpisodeFilter, RunRow, Spool
from .episode_detail import (
    MAX_BODY_BYTES,
    MORE_BUDGET,
    PAGE_BUDGET,
    EpisodeDetail,
    Message,
    TraceView,
    episode_detail,
)

__all__ = [
    "MAX_BODY_BYTES",
    "MORE_BUDGET",
    "PAGE_BUDGET",
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
#: The largest whole number a filter takes (SQLite's integers are 64-bit).
MAX_WHOLE = 2**63 - 1


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
        step=_whole(values, "step", low=0),
        min_reward=_number(values, "min_reward"),
        max_reward=_number(values, "max_reward"),
        error=error,
        min_tokens=_whole(values, "min_tokens"),
        max_tokens=_whole(values, "max_tokens"),
        min_duration=_number(values, "min_duration"),
        max_duration=_number(values, "max_duration"),
        example=values.get("example"),
    )
    page = _whole(values, "page", low=1)
    return TableQuery(where, sort, order == "desc", 1 if page is None else page)


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


def _whole(values: Mapping[str, str], name: str, *, low: int = -MAX_WHOLE) -> int | None:
    if name not in values:
        return None
    text = values[name]
    if len(text) > 20 or not text.lstrip("+-").isdigit() or not text.isascii():
        raise QueryError(f"{name}={text[:40]!r} is not a whole number")
    number = int(text)
    if not low <= number <= MAX_WHOLE:
        raise QueryError(f"{name}={number} is out of range: {low} to {MAX_WHOLE}")
    return number


@dataclass(frozen=True)
class EpisodeTable:
    query: TableQuery
    rows: list[EpisodeFactsRow]
    total: int
    pages: int
    error_types: list[str]
    #: Each row's place in the run's arrival order (its "#"), by ``seq``.
    positions: dict[int, int] = field(default_factory=dict)
    #: Said when the page asked for was past the last (the last is shown).
    clamped: str = ""


def episode_table(spool: Spool, run: RunRow, query: TableQuery) -> EpisodeTable:
    if (query.page - 1) * PAGE_SIZE > MAX_OFFSET:
        raise QueryError(f"page {query.page} is too deep: narrow the table with a filter")
    plan = _plan(spool, run, query)
    total = plan.total
    if total is None:
        total = spool.reading.episode_count(
            run.local_id, query.where, sort=query.sort, index=plan.count_index
        )
    pages = max(1, -(-total // PAGE_SIZE))
    clamped = ""
    if query.page > pages:
        clamped = (
            f"There is no page {query.page}: the table has {pages} page(s) "
            "with these filters, and this is the last."
        )
        query = replace(query, page=pages)
    offset = (query.page - 1) * PAGE_SIZE
    rows = spool.reading.episode_rows(
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
        pages=pages,
        error_types=[group.error_type for group in spool.reading.error_groups(run.local_id)],
        positions=spool.reading.episode_positions(
            run.local_id, [row.seq for row in rows], rows=run.episodes
        ),
        clamped=clamped,
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
    if where.step is not None:  # a step's episodes arrive together: along the sort's index
        return _Plan(sort_index, sort_index)
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
            counted = sum(count for _, count in spool.reading.histogram(run.local_id, query.sort))
        if where.error == "none":  # the others, less the failures (and those without facts)
            counted -= spool.reading.episode_count(
                run.local_id,
                EpisodeFilter(error="any"),
                sort=query.sort,
                index="episodes_failed",
            )
            if query.sort == "arrival":
                counted -= sum(spool.reading.facts_missing(run.local_id))
        return _Plan(sort_index, sort_index, max(0, counted))
    for name, (low, high) in ranges.items():
        if _share(spool.reading.histogram(run.local_id, name), low, high) < _NARROW:
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
