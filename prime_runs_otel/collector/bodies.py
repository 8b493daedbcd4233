"""Request bodies before they are decoded: encodings, media types, the
bearer token, and the memory decoding may take.

Each guard here refuses a body as cheaply as it can be told apart: an
oversized one from its length, a decompression bomb at the limit, a gzip
body of many members in time linear in its size, a request that would not
fit beside the others in memory by waiting its turn.
"""

from __future__ import annotations

import contextlib
import hmac
import re
import threading
import zlib
from collections.abc import Iterator

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from ..read.otlp import decode_json, decode_protobuf

#: What a decoded request takes in memory, at most, per byte of its body:
#: measured at up to 19 for bodies of nothing but tiny attributes (protobuf
#: and OTLP/JSON alike, message and span views together); an ordinary body,
#: mostly long strings, takes 2-3.
DECODE_EXPANSION = 20
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


def decode_body(body: bytes, content_type: str) -> ExportTraceServiceRequest:
    if content_type == JSON_TYPE:
        return decode_json(body)
    return decode_protobuf(body)


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
    """Admits requests to decoding while their worst-case memory fits.

    A decoded request takes up to :data:`DECODE_EXPANSION` times its body
    (every tiny attribute becomes an object of its own), so four workers at
    the body cap could want gigabytes at once. Each request reserves its
    worst case before it is decoded and waits while the others' reservations
    leave no room; a request alone is always admitted, so one larger than the
    whole budget still goes through, only never beside another.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._reserved = 0
        self._admitted = 0
        self._room = threading.Condition()

    @contextlib.contextmanager
    def reserve(self, body_bytes: int) -> Iterator[None]:
        need = body_bytes * DECODE_EXPANSION
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
