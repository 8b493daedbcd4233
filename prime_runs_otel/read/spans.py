"""One view of a finished span, whatever it arrived as.

Spans reach the consumer either as SDK ``ReadableSpan`` objects (exporter in
the producer's process) or as OTLP protobuf/JSON (behind a collector). Every
step after this one reads :class:`SpanView` only, so record extraction and
projection are written and tested once, and stay free of SDK types.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.trace import StatusCode

from .episodes import CorruptEpisode, EpisodeArrival


@dataclass(frozen=True, slots=True)
class SpanEventView:
    """One event of a span, as plain values.

    Events carry what attributes cannot: evaluation results
    (``gen_ai.evaluation.result``) and the exception that failed a span, both
    read when an episode record is synthesised from a span tree.
    """

    name: str
    time_ns: int
    attributes: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class SpanView:
    """The parts of a span the consumer needs, as plain values.

    ``attributes`` and ``resource`` hold OpenTelemetry attribute values
    (str, bool, int, float, or sequences of one of those). Ids are the
    integers OpenTelemetry uses; ``parent_span_id`` is ``None`` for a root.
    ``events`` are in the order the span recorded them. ``in_process`` is
    true for a span read straight from the SDK that made it: its attributes
    never crossed a process boundary, so only an attribute limit (which
    shortens, and is caught by a blob's size) can have changed them.
    ``prepared`` is the episode already read off this span's record, ahead
    of the lock the grouping runs under (``deliver/delivery.py``), so it is
    not read again.
    """

    name: str
    trace_id: int
    span_id: int
    parent_span_id: int | None
    start_ns: int
    end_ns: int
    attributes: Mapping[str, Any]
    resource: Mapping[str, Any]
    status_error: bool
    status_message: str | None
    events: tuple[SpanEventView, ...] = ()
    in_process: bool = False
    prepared: EpisodeArrival | CorruptEpisode | None = None


_EMPTY: Mapping[str, Any] = {}


def with_prepared(view: SpanView, item: EpisodeArrival | CorruptEpisode) -> SpanView:
    """``view`` with its episode read already: a copy written out field by
    field, several times cheaper than ``dataclasses.replace`` once a span."""
    return SpanView(
        view.name,
        view.trace_id,
        view.span_id,
        view.parent_span_id,
        view.start_ns,
        view.end_ns,
        view.attributes,
        view.resource,
        view.status_error,
        view.status_message,
        view.events,
        view.in_process,
        item,
    )


def from_readable_span(span: ReadableSpan) -> SpanView:
    """View an SDK span without copying its attributes.

    An ended span's attributes are immutable, so sharing them is safe and
    keeps a 20 MB record from being copied once more on the export path.
    Most spans have no events; those cost nothing more than the check.
    """
    context = span.context
    parent = span.parent
    status = span.status
    events = span.events
    return SpanView(
        name=span.name,
        trace_id=context.trace_id if context is not None else 0,
        span_id=context.span_id if context is not None else 0,
        parent_span_id=parent.span_id if parent is not None else None,
        start_ns=span.start_time or 0,
        end_ns=span.end_time or 0,
        attributes=span.attributes if span.attributes is not None else _EMPTY,
        resource=span.resource.attributes,
        status_error=status.status_code is StatusCode.ERROR,
        status_message=status.description,
        events=_event_views(events) if events else (),
        in_process=True,
    )


def _event_views(events: Sequence[Event]) -> tuple[SpanEventView, ...]:
    return tuple(
        SpanEventView(
            name=event.name,
            time_ns=event.timestamp,
            attributes=event.attributes if event.attributes is not None else _EMPTY,
        )
        for event in events
    )
