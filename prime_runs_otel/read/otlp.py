"""OTLP trace requests → :class:`~prime_runs_otel.read.spans.SpanView`.

Behind a collector, spans arrive as an OTLP ``ExportTraceServiceRequest``,
encoded as protobuf (OTLP/gRPC and OTLP/HTTP) or as OTLP/JSON. This module
turns either into the same span views the in-process exporter builds from SDK
spans, with attribute values as the SDK would have held them (strings, bools,
ints, floats, tuples of those), so record extraction runs unchanged.

OTLP/JSON is protobuf's JSON mapping with one exception: trace and span ids
are hex strings, where the mapping expects base64 for ``bytes`` fields. They
are rewritten before parsing, otherwise a valid id would either fail to
parse or, worse, decode to different bytes.

Every way a body can be wrong raises :class:`OtlpDecodeError` with a message
fit to send back to the client, never a stray parser exception: a receiver
must answer bad input with a 4xx, not die or answer 500.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, TypeVar

from google.protobuf import json_format
from google.protobuf.message import DecodeError, Message
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

from ..errors import PrimeRunsOtelError
from .spans import SpanEventView, SpanView

__all__ = [
    "OtlpDecodeError",
    "OtlpTooManyValues",
    "any_value",
    "attributes_of",
    "decode_json",
    "decode_protobuf",
    "parse_json",
    "parse_protobuf",
    "span_count",
    "span_views",
]

#: Fields of a span (and of its links, and of a log record) that OTLP/JSON
#: writes as hex.
_HEX_ID_FIELDS = ("traceId", "spanId", "parentSpanId", "trace_id", "span_id", "parent_span_id")


class OtlpDecodeError(PrimeRunsOtelError):
    """The body is not a valid OTLP trace request; the message says why."""


class OtlpTooManyValues(OtlpDecodeError):
    """The body holds more JSON objects than the caller takes in one request."""


def decode_protobuf(body: bytes) -> ExportTraceServiceRequest:
    """Parse a binary ``ExportTraceServiceRequest``."""
    return parse_protobuf(body, ExportTraceServiceRequest())


def decode_json(body: bytes, max_objects: int | None = None) -> ExportTraceServiceRequest:
    """Parse an OTLP/JSON ``ExportTraceServiceRequest`` (hex ids, unknown
    fields ignored as the OTLP specification asks of receivers).

    ``max_objects``: see :func:`parse_json`.
    """
    return parse_json(
        body, ExportTraceServiceRequest(), "resourceSpans", _hex_ids_to_base64, max_objects
    )


_Request = TypeVar("_Request", bound=Message)


def parse_protobuf(body: bytes, request: _Request) -> _Request:
    """``request`` (an empty OTLP export request) parsed from ``body``."""
    try:
        request.ParseFromString(body)
    except (DecodeError, RecursionError, ValueError) as exc:
        name = request.DESCRIPTOR.name
        raise OtlpDecodeError(
            f"the body is not a valid OTLP protobuf {name} ({exc}); "
            "send application/x-protobuf bodies encoded by an OTLP exporter"
        ) from None
    return request


def parse_json(
    body: bytes,
    request: _Request,
    top: str,
    hex_ids_to_base64: Callable[[dict[str, Any]], None],
    max_objects: int | None = None,
) -> _Request:
    """``request`` parsed from OTLP/JSON ``body`` (a JSON object with a
    ``top`` array), its hex ids rewritten first by ``hex_ids_to_base64``.

    ``max_objects``: refuse (:class:`OtlpTooManyValues`) a body of more JSON
    objects than that, as soon as the parser meets one too many: a body of
    ``{}`` takes some hundred bytes of memory per two bytes of body.
    """
    count = 0

    def counted(obj: dict[str, Any]) -> dict[str, Any]:
        nonlocal count
        count += 1
        if max_objects is not None and count > max_objects:
            raise OtlpTooManyValues(
                f"the body holds more than {max_objects} JSON objects (spans, attributes, "
                "values); send smaller batches"
            )
        return obj

    try:
        document = json.loads(body, object_hook=counted if max_objects is not None else None)
    except (ValueError, RecursionError) as exc:
        raise OtlpDecodeError(f"the body is not valid JSON ({exc})") from None
    if not isinstance(document, dict):
        raise OtlpDecodeError(
            f"an OTLP/JSON body is a JSON object with a '{top}' array, "
            f"not a {type(document).__name__}"
        )
    hex_ids_to_base64(document)
    try:
        json_format.ParseDict(document, request, ignore_unknown_fields=True)
    except (json_format.ParseError, ValueError, TypeError, RecursionError) as exc:
        raise OtlpDecodeError(
            f"the body is not a valid OTLP/JSON {request.DESCRIPTOR.name}: {exc}"
        ) from None
    return request


def span_count(request: ExportTraceServiceRequest) -> int:
    return sum(
        len(scope_spans.spans)
        for resource_spans in request.resource_spans
        for scope_spans in resource_spans.scope_spans
    )


def span_views(request: ExportTraceServiceRequest) -> Iterator[SpanView]:
    """The request's spans, in order, as span views.

    Spans of one ``ResourceSpans`` share one resource mapping, as SDK spans of
    one provider share one Resource: grouping by run reads each Resource once.
    """
    for resource_spans in request.resource_spans:
        resource = attributes_of(resource_spans.resource.attributes)
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                yield _view(span, resource)


def attributes_of(pairs: Iterable[KeyValue]) -> dict[str, Any]:
    """OTLP key-values as an attribute mapping; a later duplicate key wins and
    an empty value is left out, as the SDK does with ``None``."""
    attributes: dict[str, Any] = {}
    for pair in pairs:
        value = any_value(pair.value)
        if value is not None:
            attributes[pair.key] = value
    return attributes


def any_value(value: AnyValue) -> Any:
    """One ``AnyValue`` as a Python value: arrays become tuples (the SDK's
    form for sequence attributes), key-value lists become dicts."""
    kind = value.WhichOneof("value")
    if kind == "string_value":  # most attributes: first, and without getattr
        return value.string_value
    if kind is None:
        return None
    if kind == "array_value":
        return tuple(any_value(item) for item in value.array_value.values)
    if kind == "kvlist_value":
        return attributes_of(value.kvlist_value.values)
    return getattr(value, kind)


def _view(span: Span, resource: Mapping[str, Any]) -> SpanView:
    return SpanView(
        name=span.name,
        trace_id=int.from_bytes(span.trace_id, "big"),
        span_id=int.from_bytes(span.span_id, "big"),
        parent_span_id=int.from_bytes(span.parent_span_id, "big") if span.parent_span_id else None,
        start_ns=span.start_time_unix_nano,
        end_ns=span.end_time_unix_nano,
        attributes=attributes_of(span.attributes),
        resource=resource,
        status_error=span.status.code == Status.STATUS_CODE_ERROR,
        status_message=span.status.message or None,
        events=tuple(_event_view(event) for event in span.events) if span.events else (),
    )


def _event_view(event: Span.Event) -> SpanEventView:
    return SpanEventView(
        name=event.name,
        time_ns=event.time_unix_nano,
        attributes=attributes_of(event.attributes),
    )


def _hex_ids_to_base64(document: dict[str, Any]) -> None:
    """Rewrite the hex ids of every span and link in place.

    Only the places OTLP puts ids are touched; a shape that does not match is
    left for the protobuf parser to reject with its own message.
    """
    for resource_spans in json_objects(json_field(document, "resourceSpans", "resource_spans")):
        for scope_spans in json_objects(json_field(resource_spans, "scopeSpans", "scope_spans")):
            for span in json_objects(scope_spans.get("spans")):
                rewrite_hex_ids(span)
                for link in json_objects(span.get("links")):
                    rewrite_hex_ids(link)


def rewrite_hex_ids(holder: dict[str, Any]) -> None:
    """The hex trace and span ids of one OTLP/JSON object, as protobuf's
    JSON mapping reads ``bytes``."""
    for key in _HEX_ID_FIELDS:
        value = holder.get(key)
        if isinstance(value, str):
            holder[key] = _hex_to_base64(key, value)


def _hex_to_base64(key: str, value: str) -> str:
    try:
        raw = binascii.unhexlify(value)
    except (binascii.Error, ValueError):
        raise OtlpDecodeError(
            f"{key} {value[:40]!r} is not a hex string; OTLP/JSON writes trace and span "
            "ids as hex, not base64"
        ) from None
    return base64.b64encode(raw).decode("ascii")


def json_field(holder: dict[str, Any], camel: str, snake: str) -> Any:
    """A field of an OTLP/JSON object, in either spelling."""
    return holder.get(camel, holder.get(snake))


def json_objects(value: Any) -> Iterator[dict[str, Any]]:
    """The objects of an OTLP/JSON array (anything else in it is left for
    the protobuf parser to refuse)."""
    if isinstance(value, list):
        yield from (item for item in value if isinstance(item, dict))
