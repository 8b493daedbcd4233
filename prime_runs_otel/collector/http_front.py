"""OTLP/HTTP: ``POST /v1/traces`` answered after the spool commit,
``POST /v1/logs`` (the GenAI events of spans, see :mod:`.logs_intake`), and
the health checks, served by uvicorn on the socket bound at start-up.

Everything about HTTP is here: the routes, how a body is read (its limits
and deadline), how a refused one is drained, how a :class:`.intake.Verdict`
becomes a status code and headers (``Retry-After``), and the server around
the app. The front needs of the process behind it only what
:class:`HttpReceiver` names, so it does not import :mod:`.receiver`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import signal
import socket
import threading
import time
from collections.abc import Awaitable, Callable, Iterator, MutableMapping
from typing import Any, Protocol

import uvicorn
from google.protobuf import json_format
from google.rpc import (  # type: ignore[import-untyped]  # ships .pyi without py.typed
    code_pb2,
    status_pb2,
)

from .._net import bind_socket
from .._text import shown
from ..errors import ConfigError
from .admission import OVERLOAD_RETRY_AFTER, overload_message
from .bodies import JSON_TYPE, BodyError, DecodeBudget, decompress, media_type, too_large
from .calls import SLOW_BODY_RETRY_AFTER, ExportCalls, Signal
from .http_connections import (
    KEEP_ALIVE_TIMEOUT,
    OVER_CAP,
    guarded_connection,
    quiet_accept_errors,
)
from .intake import SpanIntake, Verdict, wire_text
from .logs_intake import LOGS_PATH, LogIntake
from .receiver_config import DEFAULT_READ_TIMEOUT, TOKEN_ENV, TRACES_PATH, MiB, ReceiverConfig

logger = logging.getLogger(__name__)

#: serve's own figures, in the Prometheus text format (no token, as /healthz).
METRICS_PATH = "/metrics"
METRICS_TYPE = "text/plain; version=0.0.4; charset=utf-8"

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


class HttpReceiver(Protocol):
    """What the HTTP front uses of the process behind it
    (:class:`.receiver.Receiver`), named here so the front need not import it."""

    config: ReceiverConfig
    memory: DecodeBudget
    intake: SpanIntake
    logs: LogIntake
    #: OTLP/HTTP requests being read or committed (shown on /healthz).
    in_flight: int

    def not_ready_reason(self) -> str | None: ...

    def metrics_text(self) -> str: ...

    def note_stages(self, received: float, stamps: tuple[float, ...], answered: float) -> None: ...

    def begin_stop(self) -> threading.Event: ...

    async def run_blocking(self, function: Callable[..., Verdict], *args: Any) -> Verdict: ...


_GRPC_CODE_OF_STATUS = {
    400: code_pb2.INVALID_ARGUMENT,
    401: code_pb2.UNAUTHENTICATED,
    404: code_pb2.NOT_FOUND,
    405: code_pb2.UNIMPLEMENTED,
    408: code_pb2.DEADLINE_EXCEEDED,
    413: code_pb2.RESOURCE_EXHAUSTED,
    415: code_pb2.INVALID_ARGUMENT,
    503: code_pb2.UNAVAILABLE,
}


class OtlpHttpApp:
    """A minimal ASGI app: ``POST /v1/traces``, ``POST /v1/logs``,
    ``GET /healthz``, ``GET /readyz``, ``GET /metrics``.

    Request bodies are read and decoded off the event loop (decoding a large
    batch is CPU-bound, the commit is blocking SQLite), so health checks stay
    responsive while a 64 MiB episode is being committed.
    """

    def __init__(self, receiver: HttpReceiver) -> None:
        self._receiver = receiver
        self._config = receiver.config
        #: Authentication, admission and decoding, as every front does them.
        self._calls = ExportCalls(receiver, "OTLP/HTTP")
        #: The signal of each path.
        self._routes: dict[str, Signal] = {
            TRACES_PATH: self._calls.traces,
            LOGS_PATH: self._calls.logs,
        }

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        path = scope["path"].rstrip("/") or "/"
        method = scope["method"]
        # A connection past the cap gets its health check (and metrics)
        # answered, an export told to come back, and is closed either way.
        over_cap = bool(scope.get("state", {}).get(OVER_CAP))
        close = {"connection": "close"} if over_cap else {}
        if path in ("/healthz", "/readyz", METRICS_PATH):
            if method not in ("GET", "HEAD"):
                await _send_json(send, 405, {"error": "use GET"}, allow="GET", **close)
                return
            if path == METRICS_PATH:
                await self._metrics(send, **close)
            else:
                await self._health(send, ready=path == "/readyz", **close)
            return
        if over_cap:
            self._receiver.intake.counters.add("requests_total", outcome="overloaded")
            await _send_status(
                send,
                503,
                "serve has as many connections open as it takes; retry shortly (or raise "
                "serve's --max-connections, or keep fewer connections to it)",
                None,
                retry_after=str(OVERLOAD_RETRY_AFTER),
                **close,
            )
            return
        signal = self._routes.get(path)
        if signal is None:
            await _send_status(
                send,
                404,
                f"no such endpoint {path!r}; OTLP traces go to POST {TRACES_PATH}, "
                f"logs to POST {LOGS_PATH}",
                None,
            )
            return
        if method != "POST":
            await _send_status(send, 405, f"{path} takes POST", None, allow="POST")
            return
        self._receiver.in_flight += 1
        try:
            await self._export(scope, receive, send, signal)
        finally:
            self._receiver.in_flight -= 1

    async def _metrics(self, send: Send, **headers: str) -> None:
        """The Prometheus text format; read off the event loop (the spool's
        counts are SQLite reads)."""
        text = await asyncio.to_thread(self._receiver.metrics_text)
        await _send(send, 200, text.encode(), METRICS_TYPE, **headers)

    async def _health(self, send: Send, *, ready: bool, **headers: str) -> None:
        if not ready:
            state = {"status": "ok", "in_flight": self._receiver.in_flight}
            await _send_json(send, 200, state, **headers)
            return
        problem = self._receiver.not_ready_reason()
        if problem is None:
            await _send_json(send, 200, {"status": "ready"}, **headers)
        else:
            await _send_json(send, 503, {"status": "not ready", "reason": problem}, **headers)

    async def _export(self, scope: Scope, receive: Receive, send: Send, signal: Signal) -> None:
        headers = _headers(scope)
        content_type = media_type(headers.get("content-type", ""))
        if not self._calls.authenticated(headers.get("authorization")):
            await _drain(receive, self._config.max_body_bytes)
            await _send_status(
                send,
                401,
                "missing or wrong bearer token: send 'Authorization: Bearer <token>' with the "
                f"token serve was started with (--token or {TOKEN_ENV})",
                content_type,
                www_authenticate='Bearer realm="prime-runs-otel"',
            )
            return
        if content_type is None:
            await _drain(receive, self._config.max_body_bytes)
            await _send_status(
                send,
                415,
                f"Content-Type {headers.get('content-type', '(none)')!r} is not OTLP; send "
                "application/x-protobuf or application/json",
                None,
            )
            return
        if not self._calls.admits(self._receiver.in_flight - 1):
            # Refused before its body is read: waiting, it would hold its
            # memory and its connection for nothing.
            await _drain(receive, self._config.max_body_bytes)
            await _send_status(
                send,
                503,
                overload_message(self._calls.limit),
                content_type,
                retry_after=str(OVERLOAD_RETRY_AFTER),
            )
            return
        try:
            body = await _read_body(
                receive, headers, self._config.max_body_bytes, self._config.read_timeout
            )
            received = time.monotonic()
            verdict = await self._receiver.run_blocking(
                self._take, signal, body, headers.get("content-encoding", ""), content_type
            )
        except BodyError as exc:
            logger.warning("Refused an OTLP/HTTP request: %s", exc.message)
            retry = {} if exc.retry_after is None else {"retry_after": str(exc.retry_after)}
            await _send_status(send, exc.status, exc.message, content_type, **retry)
            return
        await _send_verdict(send, verdict, content_type, signal.respond)
        if verdict.stamps:
            self._receiver.note_stages(received, verdict.stamps, time.monotonic())

    def _take(self, signal: Signal, body: bytes, encoding: str, content_type: str) -> Verdict:
        """Decompress one OTLP/HTTP body and have it taken (on a worker thread)."""
        data = decompress(body, encoding, self._config.max_body_bytes)
        return self._calls.take(signal, data, content_type)


def _headers(scope: Scope) -> dict[str, str]:
    return {
        name.decode("latin-1").lower(): value.decode("latin-1")
        for name, value in scope.get("headers", [])
    }


async def _read_body(
    receive: Receive, headers: dict[str, str], limit: int, timeout: float = DEFAULT_READ_TIMEOUT
) -> bytes:
    """The whole body, refused as soon as it is known to be too large (from
    ``Content-Length`` before a byte of it is read), and given ``timeout``
    seconds in all: a client that trickles a body in holds its memory and
    connection, so it does not get to hold them for ever."""
    declared = headers.get("content-length")
    if declared is not None:
        if "transfer-encoding" in headers:
            raise BodyError(
                400, "the request has both Content-Length and Transfer-Encoding; send one"
            )
        if not (declared.isascii() and declared.isdigit()):
            raise BodyError(400, f"Content-Length {shown(declared, 40)!r} is not a number")
        if int(declared) > limit:
            raise too_large(limit, "request")
    try:
        return await asyncio.wait_for(_read_chunks(receive, limit), timeout)
    except asyncio.TimeoutError:
        # 503, not 408: OTLP clients drop a batch answered 408, and a body
        # that is merely slow (a congested link) is still to be delivered.
        raise BodyError(
            503,
            f"the body did not arrive within {timeout:g}s; send it at once (or raise "
            "serve's --read-timeout, or send smaller batches over a slow link)",
            retry_after=SLOW_BODY_RETRY_AFTER,
        ) from None


async def _read_chunks(receive: Receive, limit: int) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise BodyError(400, "the client went away before sending the whole body")
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise too_large(limit, "request")
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


_DRAIN_BYTES = 4 * MiB
_DRAIN_SECONDS = 5.0


async def _drain(receive: Receive, limit: int) -> None:
    """Read (and drop) what is left of a refused body, so the client reads the
    answer instead of a connection reset mid-upload; past a small budget (or
    a few seconds) the connection is closed on it instead: a refused client
    gets no more of the receiver's time than it takes to tell it why."""
    budget = min(4 * limit, _DRAIN_BYTES)
    while budget > 0:
        try:
            message = await asyncio.wait_for(receive(), _DRAIN_SECONDS)
        except asyncio.TimeoutError:
            return
        if message["type"] != "http.request" or not message.get("more_body", False):
            return
        budget -= len(message.get("body", b""))


async def _send_verdict(
    send: Send, verdict: Verdict, content_type: str, respond: Callable[[Verdict], Any]
) -> None:
    if verdict.outcome == "accepted":
        response = respond(verdict)
        await _send(send, 200, _encode(response, content_type), content_type)
        return
    if verdict.outcome == "invalid":
        logger.warning("Refused an OTLP/HTTP request: %s", verdict.message)
        await _send_status(send, 400, verdict.message, content_type)
        return
    await _send_status(
        send, 503, verdict.message, content_type, retry_after=str(verdict.retry_after or 1)
    )


async def _send_status(
    send: Send,
    status: int,
    message: str,
    content_type: str | None,
    **extra_headers: str,
) -> None:
    """An OTLP error answer: a ``google.rpc.Status`` in the request's encoding."""
    body_type = content_type or JSON_TYPE
    payload = status_pb2.Status(
        code=_GRPC_CODE_OF_STATUS.get(status, 2), message=wire_text(message)
    )
    await _send(send, status, _encode(payload, body_type), body_type, **extra_headers)


async def _send_json(send: Send, status: int, payload: Any, **extra_headers: str) -> None:
    await _send(send, status, json.dumps(payload).encode(), JSON_TYPE, **extra_headers)


async def _send(
    send: Send, status: int, body: bytes, content_type: str, **extra_headers: str
) -> None:
    headers = [
        (b"content-type", content_type.encode()),
        (b"content-length", str(len(body)).encode()),
    ]
    headers += [
        (name.replace("_", "-").encode(), value.encode()) for name, value in extra_headers.items()
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def _encode(message: Any, content_type: str) -> bytes:
    if content_type == JSON_TYPE:
        return json_format.MessageToJson(message, indent=None).encode()
    data: bytes = message.SerializeToString()
    return data


# -- the server --------------------------------------------------------------------------


def http_server(receiver: HttpReceiver, connection_cap: int, descriptors: int) -> HttpServer:
    """uvicorn serving :class:`OtlpHttpApp` for ``receiver``, on the socket
    :func:`listen` bound (given to :meth:`HttpServer.serve`), with at most
    ``connection_cap`` connections open at once (see :mod:`.http_connections`)."""
    config = receiver.config
    return HttpServer(
        uvicorn.Config(
            OtlpHttpApp(receiver),
            http=guarded_connection(connection_cap, config.header_timeout),
            log_level="warning",
            access_log=False,
            lifespan="off",
            ws="none",
            timeout_keep_alive=int(KEEP_ALIVE_TIMEOUT),
            timeout_graceful_shutdown=int(config.shutdown_grace),
            server_header=False,
        ),
        receiver,
        descriptors,
    )


class HttpServer(uvicorn.Server):
    """uvicorn, with the receiver's own shutdown steps around its drain."""

    def __init__(self, config: uvicorn.Config, receiver: HttpReceiver, descriptors: int) -> None:
        super().__init__(config)
        self._receiver = receiver
        self._descriptors = descriptors

    async def serve(self, sockets: list[socket.socket] | None = None) -> None:
        quiet_accept_errors(asyncio.get_running_loop(), self._descriptors)
        await super().serve(sockets)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        grpc_stopped = self._receiver.begin_stop()
        await super().shutdown(sockets)
        await asyncio.to_thread(grpc_stopped.wait, self._receiver.config.shutdown_grace + 1)

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        """Stop on SIGINT/SIGTERM like uvicorn, without re-raising the signal
        afterwards: the receiver still has its uploader to stop."""
        with contextlib.ExitStack() as restore:
            if threading.current_thread() is threading.main_thread():
                for sig in (signal.SIGINT, signal.SIGTERM):
                    previous = signal.signal(sig, self.handle_exit)
                    restore.callback(signal.signal, sig, previous)
            yield


def listen(host: str, port: int) -> socket.socket:
    """Bind the HTTP socket up front, so a port in use is a clear error at
    start-up, and port 0 gives a known port before serving."""
    try:
        return bind_socket(host, port, backlog=2048)
    except OSError as exc:
        raise ConfigError(
            f"cannot listen for OTLP/HTTP on {host}:{port}: {exc}. Pick another --http-port."
        ) from None
