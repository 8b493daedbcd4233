"""One view of a finished span, whatever it arrived as.

Spans reach the consumer either as SDK ``ReadableSpan`` objects (exporter in
the producer's process) or as OTLP protobuf/JSON (behind a collector). Every
step after this one reads :class:`SpanView` only, so record extraction and
projection are written and tested once, and stay free of SDK types.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import StatusCode


@dataclass(frozen=True, slots=True)
class SpanView:
    """The parts of a span the consumer needs, as plain values.

    ``attributes`` and ``resource`` hold OpenTelemetry attribute values
    (str, bool, int, float, or sequences of one of those). Ids are the
    integers OpenTelemetry uses; ``parent_span_id`` is ``None`` for a root.
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


_EMPTY: Mapping[str, Any] = {}


def from_readable_span(span: ReadableSpan) -> SpanView:
    """View an SDK span without copying its attributes.

    An ended span's attributes are immutable, so sharing them is safe and
    keeps a 20 MB record from being copied once more on the export path.
    """
    context = span.context
    parent = span.parent
    status = span.status
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
    )
