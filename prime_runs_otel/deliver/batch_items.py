"""A delivery's spans and batches, item by item: an episode read ahead of
the lock, which run a span names, and a run's batch taken apart into the
items the spool takes one by one when the whole cannot be stored."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .. import semconv
from .._text import shown
from ..read.checks import read_span
from ..read.episodes import CorruptEpisode, EpisodeArrival
from ..read.records import RunBatch
from ..read.spans import SpanView, with_prepared


def read_ahead(view: SpanView, lines: bool) -> SpanView:
    """``view`` with its episode already read, when it is an episode span
    carrying its record: reading one depends on nothing but the span, so
    it needs no lock. A span that cannot be read is left as it came, for
    :func:`group_by_run` to read again and refuse alone as it always does."""
    if view.prepared is not None:
        return view
    try:
        if not is_episode(view):
            return view
        item = read_span(view, lines=lines)
    except Exception:
        return view
    if isinstance(item, (EpisodeArrival, CorruptEpisode)):
        return with_prepared(view, item)
    return view


def is_episode(view: SpanView) -> bool:
    attributes = view.attributes
    return semconv.EPISODE_ID in attributes or semconv.EPISODE_EXAMPLE_ID in attributes


def run_key(resource: Mapping[str, Any]) -> str | None:
    key = resource.get(semconv.RUN_ID)
    return key if isinstance(key, str) and key else None


def items_of(batch: RunBatch) -> list[RunBatch]:
    """``batch`` as one batch per item, in the order the spool takes them."""
    identity = batch.identity
    items = [
        RunBatch(
            identity=identity,
            start=batch.start,
            corrupt=batch.corrupt,
            corrupt_metrics=batch.corrupt_metrics,
        )
    ]
    items += [RunBatch(identity=identity, episodes=[episode]) for episode in batch.episodes]
    items += [RunBatch(identity=identity, metrics=[metrics]) for metrics in batch.metrics]
    items += [RunBatch(identity=identity, samples=[table]) for table in batch.samples]
    if batch.end is not None:
        items.append(RunBatch(identity=identity, end=batch.end))
    return items


def item_count(batch: RunBatch) -> int:
    """The spans ``batch`` came from: one per item."""
    events = (batch.start is not None) + (batch.end is not None)
    corrupt = len(batch.corrupt) + len(batch.corrupt_metrics)
    return len(batch.episodes) + len(batch.metrics) + len(batch.samples) + corrupt + events


def describe(item: RunBatch) -> str:
    if item.episodes:
        return f"episode {shown(item.episodes[0].episode_id)}"
    if item.metrics:
        return f"the metrics of step {item.metrics[0].step}"
    if item.samples:
        return f"the sample table of step {item.samples[0].step}"
    if item.end is not None:
        return "the run's end"
    return "the run's start"
