"""HTTP plumbing for the fake platform: one request/response model, routes,
the error shapes the platform's two services answer with, and a threaded
server whose connections can be cut.

Kept apart from the platform's behaviour so that a route handler reads as
"what the platform does" and never as socket handling.
"""

from __future__ import annotations

import contextlib
import json
import re
import socket
import socketserver
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Literal, cast
from urllib.parse import parse_qs, urlsplit

from prime_traces.models import ErrorCode

JSONObject = dict[str, Any]
MIB = 1024 * 1024
#: Anything larger is refused before it is read, so a runaway client cannot
#: exhaust the test process's memory (the largest legal request is a 256 MiB upload).
MAX_REQUEST_BYTES = 320 * MIB


@dataclass(frozen=True)
class Request:
    """One request, read whole; header names are lower-cased."""

    method: str
    path: str
    query: str
    headers: dict[str, str]
    body: bytes

    def header(self, name: str) -> str | None:
        return self.headers.get(name.lower())

    def param(self, name: str) -> str | None:
        values = parse_qs(self.query).get(name)
        return values[0] if values else None

    def json_object(self) -> JSONObject:
        if not self.body:
            raise unprocessable("the request body must be a JSON object; it was empty")
        try:
            value = strict_json(self.body)
        except (UnicodeDecodeError, ValueError) as exc:
            raise unprocessable(f"the request body is not valid JSON: {exc}") from exc
        if not isinstance(value, dict):
            raise unprocessable("the request body must be a JSON object")
        return value


@dataclass(frozen=True)
class Response:
    status: int
    body: bytes = b""
    content_type: str = "application/json"
    headers: dict[str, str] = field(default_factory=dict)


RouteHandler = Callable[[Request, "re.Match[str]"], Response]
#: Which part of the platform a route belongs to (and how it authenticates).
Service = Literal["api", "traces", "storage", "dashboard"]


@dataclass(frozen=True)
class Route:
    method: str
    pattern: re.Pattern[str]
    handle: RouteHandler
    #: ``api`` answers auth failures in the platform API's shape, ``traces`` in
    #: the service envelope; ``storage`` is the presigned-URL bucket (no token).
    service: Service = "api"


#: A run id in a route's path, captured as ``run_id``.
RUN_ID = r"(?P<run_id>[^/]+)"


def route(method: str, pattern: str, handle: RouteHandler, service: Service = "api") -> Route:
    """A route for requests whose whole path matches ``pattern``."""
    return Route(method, re.compile(f"^{pattern}$"), handle, service)


class Reject(Exception):
    """Unwinds a handler with the error response the platform would give."""

    def __init__(self, response: Response) -> None:
        super().__init__(response.status)
        self.response = response


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def strict_json(data: bytes | str) -> Any:
    """JSON as the platform parses it: a bare ``NaN`` or ``Infinity`` is an error,
    so a client that leaks one is caught here rather than in production."""
    return json.loads(data, parse_constant=_refuse_constant)


def json_response(status: int, payload: Any, headers: dict[str, str] | None = None) -> Response:
    return Response(status, json.dumps(payload).encode("utf-8"), headers=dict(headers or {}))


def detail(status: int, message: str) -> Reject:
    """The platform API's (FastAPI) error shape."""
    return Reject(json_response(status, {"detail": message}))


def coded(status: int, code: ErrorCode, message: str) -> Reject:
    """The Prime Traces service's error envelope; clients branch on ``code``."""
    return Reject(json_response(status, {"error": {"code": code.value, "message": message}}))


def unprocessable(message: str) -> Reject:
    return detail(422, message)


def not_found(what: str) -> Reject:
    return detail(404, f"{what} not found")


class Server(ThreadingHTTPServer):
    """Tracks open connections so an outage can cut keep-alive sockets too: a
    pooled connection that kept working through an "outage" would hide exactly
    the reconnect path a test wants to exercise."""

    daemon_threads = True
    block_on_close = False
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], serve: Callable[[Request], Response]) -> None:
        self.serve = serve
        self._connections: set[socket.socket] = set()
        self._connections_lock = threading.Lock()
        super().__init__(address, _Handler)

    def server_bind(self) -> None:
        # HTTPServer.server_bind resolves the host's FQDN, which can stall on a
        # machine without working reverse DNS; loopback needs no name.
        socketserver.TCPServer.server_bind(self)
        host, port = self.server_address[:2]
        self.server_name = str(host)
        self.server_port = int(port)

    def track(self, connection: socket.socket) -> None:
        with self._connections_lock:
            self._connections.add(connection)

    def untrack(self, connection: socket.socket) -> None:
        with self._connections_lock:
            self._connections.discard(connection)

    def drop_connections(self) -> None:
        with self._connections_lock:
            connections = list(self._connections)
        for connection in connections:
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)

    def handle_error(self, request: Any, client_address: Any) -> None:
        # Clients vanishing mid-response (timeouts, outages) are routine here.
        if isinstance(sys.exc_info()[1], OSError):
            return
        super().handle_error(request, client_address)


class _BadBody(Exception):
    """The request body cannot be read; the connection is closed after answering."""

    status = 400


class _BodyTooLarge(_BadBody):
    status = 413

    def __init__(self) -> None:
        super().__init__("the request body is too large")


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "FakePrimePlatform/1"

    def setup(self) -> None:
        super().setup()
        self._fake_server().track(self.connection)

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            self._fake_server().untrack(self.connection)

    def do_GET(self) -> None:
        self._serve()

    def do_POST(self) -> None:
        self._serve()

    def do_PUT(self) -> None:
        self._serve()

    def do_DELETE(self) -> None:
        self._serve()

    def do_PATCH(self) -> None:
        self._serve()

    def log_message(self, format: str, *args: Any) -> None:
        """Silent: every request is recorded on the platform instead."""

    def _fake_server(self) -> Server:
        return cast(Server, self.server)

    def _serve(self) -> None:
        try:
            body = self._read_body()
        except _BadBody as exc:
            self.close_connection = True
            self._write(json_response(exc.status, {"detail": str(exc)}), close=True)
            return
        target = urlsplit(self.path)
        request = Request(
            method=self.command.upper(),
            path=target.path,
            query=target.query,
            headers={name.lower(): value for name, value in self.headers.items()},
            body=body,
        )
        self._write(self._fake_server().serve(request))

    def _read_body(self) -> bytes:
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            return self._read_chunked()
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            raise _BadBody("Content-Length is not an integer") from None
        if length > MAX_REQUEST_BYTES:
            raise _BodyTooLarge
        return self.rfile.read(length) if length else b""

    def _read_chunked(self) -> bytes:
        chunks: list[bytes] = []
        total = 0
        while True:
            try:
                size = int(self.rfile.readline().split(b";", 1)[0].strip() or b"0", 16)
            except ValueError:
                raise _BadBody("a chunk size is not hexadecimal") from None
            if size == 0:
                while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                    pass  # trailers
                return b"".join(chunks)
            total += size
            if total > MAX_REQUEST_BYTES:
                raise _BodyTooLarge
            chunks.append(self.rfile.read(size))
            self.rfile.readline()

    def _write(self, response: Response, *, close: bool = False) -> None:
        self.send_response(response.status)
        self.send_header("Content-Type", response.content_type)
        self.send_header("Content-Length", str(len(response.body)))
        for name, value in response.headers.items():
            self.send_header(name, value)
        if close:
            self.send_header("Connection", "close")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(response.body)
