"""Request bodies before they are decoded: encodings, media types, the
bearer token, and the memory decoding may take.

Each guard here refuses a body as cheaply as it can be told apart: an
oversized one from its length, a decompression bomb at the limit, a gzip
body of many members in time linear in its size, a body of millions of
tiny values from a count taken off the wire before it is decoded, a
request that would not fit beside the others in memory by waiting its turn.
"""

from __future__ import annotations

import contextlib
import hmac
import re
import threading
import zlib
from collections.abc import Iterator
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from ..read.otlp import decode_json, decode_protobuf

#: What decoding a request takes in memory: per byte of its body (the body,
#: protobuf's copy of its strings, their Python strings, a record joined from
#: its chunks), and per value in it (a span, an attribute, an array element:
#: protobuf's message and the span view's key and value; measured at about
#: 60 + 150 bytes). Per byte alone, a body of two-byte empty attributes
#: would take 30 times its size, an ordinary one 2-3.
BYTE_COST = 4
VALUE_COST = 256
_PROTOBUF_TYPES = ("application/x-protobuf", "application/protobuf")
JSON_TYPE = "application/json"


# -- request bodies ---------------------------------------------------------------------


class BodyError(Exception):
    """A request the HTTP front refuses before decoding it; ``retry_after``
    (seconds) for a refusal the client is to retry (a 503)."""

    def __init__(self, status: int, message: str, retry_after: int | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.retry_after = retry_after


def decompress(body: bytes, encoding: str, limit: int) -> bytes:
    """Undo ``Content-Encoding``, refusing to inflate past ``limit`` bytes
    (a small gzip body can expand to gigabytes)."""
    encoding = encoding.strip().lower()
    if encoding in ("", "identity"):
        return body
    if encoding == "gzip":
        return _inflate(body, 16 + zlib.MAX_WBITS, limit, "gzip")
    if encoding == "deflate":
        # "deflate" is zlib-wrapped by the HTTP spec; some clients send it raw.
        try:
            return _inflate(body, zlib.MAX_WBITS, limit, "deflate")
        except BodyError as exc:
            if exc.status == 413:
                raise
            return _inflate(body, -zlib.MAX_WBITS, limit, "deflate")
    raise BodyError(
        415,
        f"Content-Encoding {encoding!r} is not supported; send gzip, deflate or no encoding",
    )


def _inflate(body: bytes, wbits: int, limit: int, name: str) -> bytes:
    """Inflate every member of ``body`` in time linear in its length.

    zlib hands back what follows a finished member as a copy
    (``unused_data``); fed the whole rest of the body, a body of many tiny
    members would be copied once per member. So input is fed in pieces that
    start small and grow only while one member goes on: a member costs its
    own length plus one small piece.
    """
    out = bytearray()
    view = memoryview(body)
    position = 0
    members = wbits > zlib.MAX_WBITS  # gzip allows several; a zlib stream ends once
    while position < len(body):
        inflater = zlib.decompressobj(wbits)
        piece = _FIRST_PIECE
        while not inflater.eof:
            if position >= len(body):
                raise BodyError(400, f"the {name} body is truncated")
            chunk = view[position : position + piece]
            position += len(chunk)
            try:
                out += inflater.decompress(chunk, limit + 1 - len(out))
            except zlib.error as exc:
                raise BodyError(400, f"the {name} body cannot be decompressed ({exc})") from None
            if len(out) > limit or inflater.unconsumed_tail:
                raise too_large(limit, "decompressed")
            piece = min(piece * 2, _LAST_PIECE)
        position -= len(inflater.unused_data)
        if not members:
            break
        padding_end = _NOT_NUL.search(body, position)  # zeros may pad between members
        position = padding_end.start() if padding_end else len(body)
    return bytes(out)


_NOT_NUL = re.compile(rb"[^\0]")
_FIRST_PIECE = 256
_LAST_PIECE = 1024 * 1024


def too_large(limit: int, what: str) -> BodyError:
    return BodyError(
        413,
        f"the {what} body is over the receiver's limit of {limit} bytes; raise "
        "`serve --max-body-mib`, or lower the collector's batch size",
    )


def too_many_values(limit: int) -> BodyError:
    return BodyError(
        413,
        f"the body holds more than {limit} values (spans, attributes, array elements); send "
        "smaller batches, or raise serve's --max-values",
    )


def decode_body(body: bytes, content_type: str, max_values: int) -> ExportTraceServiceRequest:
    if content_type == JSON_TYPE:
        return decode_json(body, max_objects=max_values)
    return decode_protobuf(body)


def values_bound(
    body: bytes, content_type: str, limit: int, layout: WireLayout | None = None
) -> int:
    """The values decoding ``body`` makes, at most: counted off the wire for
    protobuf (more than ``limit`` is refused here, before any memory is
    spent), bounded by the size for JSON (every object takes two bytes; the
    parser itself stops at ``limit``). ``layout``: :data:`LOGS_REQUEST` for
    a logs request, else a trace request's."""
    if content_type == JSON_TYPE:
        return min(len(body) // 2, limit)
    values = count_values(body, limit, layout)
    if values > limit:
        raise too_many_values(limit)
    return values


def decode_cost(size: int, values: int) -> int:
    """Memory decoding a body of ``size`` bytes and ``values`` values takes."""
    return size * BYTE_COST + values * VALUE_COST


# -- values, counted off the wire ------------------------------------------------------

# Which length-delimited fields of each OTLP message are messages that become
# values of their own, by field number (opentelemetry-proto trace/v1, logs/v1,
# common/v1, resource/v1); everything else is skipped whole.
WireLayout = dict[int, Any]
_KEY_VALUE: WireLayout = {}
_ANY_VALUE: dict[int, Any] = {}
_KEY_VALUE[2] = _ANY_VALUE  # KeyValue.value
_ANY_VALUE[5] = {1: _ANY_VALUE}  # AnyValue.array_value -> ArrayValue.values
_ANY_VALUE[6] = {1: _KEY_VALUE}  # AnyValue.kvlist_value -> KeyValueList.values
_SPAN = {
    9: _KEY_VALUE,  # attributes
    11: {3: _KEY_VALUE},  # events -> Event.attributes
    13: {4: _KEY_VALUE},  # links -> Link.attributes
}
_REQUEST = {
    1: {  # ExportTraceServiceRequest.resource_spans
        1: {1: _KEY_VALUE},  # ResourceSpans.resource -> Resource.attributes
        2: {  # ResourceSpans.scope_spans
            1: {3: _KEY_VALUE},  # ScopeSpans.scope -> InstrumentationScope.attributes
            2: _SPAN,  # ScopeSpans.spans
        },
    }
}
#: An ``ExportLogsServiceRequest`` (``/v1/logs``, ``LogsService/Export``).
LOGS_REQUEST: WireLayout = {
    1: {  # ExportLogsServiceRequest.resource_logs
        1: {1: _KEY_VALUE},  # ResourceLogs.resource -> Resource.attributes
        2: {  # ResourceLogs.scope_logs
            1: {3: _KEY_VALUE},  # ScopeLogs.scope -> InstrumentationScope.attributes
            2: {5: _ANY_VALUE, 6: _KEY_VALUE},  # ScopeLogs.log_records -> body, attributes
        },
    }
}


def count_values(body: bytes, limit: int, layout: WireLayout | None = None) -> int:
    """How many messages (spans, events, attributes, array elements, ...) a
    protobuf ``ExportTraceServiceRequest`` holds (or a request of another
    ``layout``, such as :data:`LOGS_REQUEST`), read off the wire without
    decoding it; counting stops past ``limit``.

    Each such message costs protobuf and the span view a few hundred bytes
    however short it is on the wire (an empty attribute takes two bytes), so
    their number, not the body's size, is what bounds decoding. Strings are
    skipped whole: an ordinary body (a few large records) takes a few
    hundred steps. A body that is not valid protobuf is counted as far as it
    goes; the parser then says what is wrong with it.
    """
    count = 0
    position = 0
    fields: WireLayout = layout or _REQUEST
    end = len(body)
    stack: list[tuple[WireLayout, int]] = []
    # One loop, one-byte varints read inline: an OTLP body's tags and lengths
    # nearly all fit in a byte, and a call per varint was most of the cost.
    try:
        while True:
            if position >= end:
                if not stack:
                    return count
                fields, end = stack.pop()
                continue
            tag = body[position]
            if tag < 0x80:
                position += 1
            else:
                tag, position = _varint(body, position)
            wire_type = tag & 7
            if wire_type == 2:
                length = body[position]
                if length < 0x80:
                    position += 1
                else:
                    length, position = _varint(body, position)
                inner = fields.get(tag >> 3)
                if inner is None:
                    position += length
                elif position + length > end:
                    return count  # truncated: the parser says so
                else:
                    count += 1
                    if count > limit:
                        return count
                    stack.append((fields, end))
                    fields, end = inner, position + length
            elif wire_type == 0:
                _, position = _varint(body, position)
            elif wire_type == 1 or wire_type == 5:
                position += 8 if wire_type == 1 else 4
            else:
                return count  # groups or garbage: the parser says so
    except IndexError:
        return count  # truncated in a varint


def _varint(data: bytes, position: int) -> tuple[int, int]:
    byte = data[position]
    if byte < 0x80:
        return byte, position + 1
    value, shift = byte & 0x7F, 7
    while True:
        position += 1
        byte = data[position]
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, position + 1
        shift += 7
        if shift > 63:
            raise IndexError("a varint longer than ten bytes")


def media_type(header: str) -> str | None:
    """``application/x-protobuf`` or ``application/json``, or ``None``."""
    value = header.split(";", 1)[0].strip().lower()
    if value in _PROTOBUF_TYPES:
        return _PROTOBUF_TYPES[0]
    if value == JSON_TYPE:
        return JSON_TYPE
    return None


def bearer_matches(header: str | None, token: str | None) -> bool:
    if not token:
        return True
    if header is None:
        return False
    scheme, _, value = header.strip().partition(" ")
    # As bytes: compare_digest refuses text that is not ASCII, and a header
    # is whatever the client sent.
    given = value.strip().encode("utf-8", "surrogatepass")
    return scheme.lower() == "bearer" and hmac.compare_digest(given, token.encode("utf-8"))


# -- memory ------------------------------------------------------------------------------


class DecodeBudget:
    """Admits requests to decoding while their memory fits.

    A decoded request takes :func:`decode_cost` (every tiny attribute
    becomes objects of its own), so four workers at the body cap could want
    gigabytes at once. Each request reserves its cost before it is decoded
    and waits while the others' reservations leave no room; a request alone
    is always admitted, so one larger than the whole budget still goes
    through, only never beside another (the values limit bounds it).
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._reserved = 0
        self._admitted = 0
        self._room = threading.Condition()

    @contextlib.contextmanager
    def reserve(self, need: int) -> Iterator[None]:
        with self._room:
            while self._admitted and self._reserved + need > self.limit:
                self._room.wait()
            self._reserved += need
            self._admitted += 1
        try:
            yield
        finally:
            with self._room:
                self._reserved -= need
                self._admitted -= 1
                self._room.notify_all()
