"""OTLP log requests → the events they carry for spans.

The GenAI conventions define their events as log records emitted in the
context of the span they are about: ``gen_ai.evaluation.result`` is one, in
the context of the operation it scores. An episode whose record is built
from its spans (:mod:`~prime_runs_otel.read.synthesis`) reads those as it
reads span events, so each such record becomes a :class:`SpanEvent`: the
trace and span it names, and the event as a span event would hold it.

Only the events synthesis reads are kept; a log record without a span
context, or one that is not such an event, is no concern of a run's and is
passed over, not refused. Decoding is :mod:`.otlp`'s: protobuf or OTLP/JSON
with hex ids, and every malformed body an
:class:`~prime_runs_otel.read.otlp.OtlpDecodeError` with a message fit for
the client.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.logs.v1.logs_pb2 import LogRecord

from .. import semconv as sc
from .otlp import (
    attributes_of,
    json_field,
    json_objects,
    parse_json,
    parse_protobuf,
    rewrite_hex_ids,
)
from .spans import SpanEventView

__all__ = [
    "EVENTS_READ",
    "SpanEvent",
    "decode_logs_json",
    "decode_logs_protobuf",
    "log_record_count",
    "span_events",
]

#: The events a synthesised episode reads, whether on a span or as a log record.
EVENTS_READ = frozenset({sc.GEN_AI_EVALUATION_EVENT})
#: How log records named their event before ``event_name`` was a field.
_EVENT_NAME_ATTRIBUTE = "event.name"


@dataclass(frozen=True, slots=True)
class SpanEvent:
    """An event sent apart from its span, and the span it is about."""

    trace_id: int
    span_id: int
    event: SpanEventView


def decode_logs_protobuf(body: bytes) -> ExportLogsServiceRequest:
    """Parse a binary ``ExportLogsServiceRequest``."""
    return parse_protobuf(body, ExportLogsServiceRequest())


def decode_logs_json(body: bytes, max_objects: int | None = None) -> ExportLogsServiceRequest:
    """Parse an OTLP/JSON ``ExportLogsServiceRequest`` (hex ids, unknown
    fields ignored as the OTLP specification asks of receivers; more than
    ``max_objects`` JSON objects refused, see :func:`.otlp.parse_json`)."""
    return parse_json(
        body, ExportLogsServiceRequest(), "resourceLogs", _hex_ids_to_base64, max_objects
    )


def _hex_ids_to_base64(document: dict[str, Any]) -> None:
    for resource_logs in json_objects(json_field(document, "resourceLogs", "resource_logs")):
        for scope_logs in json_objects(json_field(resource_logs, "scopeLogs", "scope_logs")):
            for record in json_objects(json_field(scope_logs, "logRecords", "log_records")):
                rewrite_hex_ids(record)


def log_record_count(request: ExportLogsServiceRequest) -> int:
    return sum(
        len(scope_logs.log_records)
        for resource_logs in request.resource_logs
        for scope_logs in resource_logs.scope_logs
    )


def span_events(request: ExportLogsServiceRequest) -> Iterator[SpanEvent]:
    """The request's log records that are events for a span, in order."""
    for resource_logs in request.resource_logs:
        for scope_logs in resource_logs.scope_logs:
            for record in scope_logs.log_records:
                found = _span_event(record)
                if found is not None:
                    yield found


def _span_event(record: LogRecord) -> SpanEvent | None:
    trace_id = int.from_bytes(record.trace_id, "big")
    span_id = int.from_bytes(record.span_id, "big")
    if not trace_id or not span_id:
        return None  # no span to be an event of
    attributes = attributes_of(record.attributes)
    name = record.event_name or attributes.pop(_EVENT_NAME_ATTRIBUTE, None)
    if name not in EVENTS_READ:
        return None
    when = record.time_unix_nano or record.observed_time_unix_nano
    return SpanEvent(trace_id, span_id, SpanEventView(str(name), when, attributes))
