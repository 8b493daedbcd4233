"""Span views → per-run spool batches.

The one step between "spans arrived" and "the spool commits them", shared by
the in-process exporter and the OTLP receiver so both treat the same spans
the same way: grouped by the Resource's run, run events and episode records
read off the spans, corrupted records and unattributable episodes counted.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field

from . import semconv
from .records import CorruptEpisode, EpisodeArrival, RunEnd, RunStart, read_span, run_identity
from .spans import SpanView
from .spool import RunBatch

logger = logging.getLogger(__name__)


@dataclass
class Grouped:
    batches: list[RunBatch] = field(default_factory=list)
    #: Episode spans whose Resource names no run (``prime.run.id`` missing).
    unattributed: int = 0


def group_by_run(views: Iterable[SpanView]) -> Grouped:
    """Group spans by run, keeping arrival order within each run."""
    grouped = Grouped()
    by_run: dict[str, RunBatch] = {}
    identities: dict[int, str | None] = {}
    for view in views:
        key = identities.get(id(view.resource), "")
        if key == "":
            identity = run_identity(view.resource)
            key = identity.local_id if identity is not None else None
            identities[id(view.resource)] = key
            if identity is not None and key not in by_run:
                by_run[identity.local_id] = RunBatch(identity=identity)
        item = read_span(view)
        if item is None:
            continue
        if key is None:
            if isinstance(item, (EpisodeArrival, CorruptEpisode)):
                grouped.unattributed += 1
            continue
        batch = by_run[key]
        if isinstance(item, EpisodeArrival):
            batch.episodes.append(item)
        elif isinstance(item, CorruptEpisode):
            logger.error(
                "Run %s: episode %s arrived damaged and is counted as lost: %s",
                key,
                item.episode_id or "(unknown id)",
                item.reason,
            )
            batch.corrupt.append(item)
        elif isinstance(item, RunStart):
            batch.start = item
        elif isinstance(item, RunEnd):
            batch.end = item
    if grouped.unattributed:
        logger.error(
            "%d episode span(s) carry no %s on their Resource and cannot be attributed to a "
            "run. Set it with prime_runs_otel.run_resource(...) or OTEL_RESOURCE_ATTRIBUTES.",
            grouped.unattributed,
            semconv.RUN_ID,
        )
    grouped.batches = list(by_run.values())
    return grouped
