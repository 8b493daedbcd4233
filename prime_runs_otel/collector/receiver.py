"""The OTLP receiver behind ``prime-runs-otel serve``: OTLP/HTTP and OTLP/gRPC
in front of the same exporter core, spool and uploader as the in-process path.

A collector only forgets a batch once the receiver has answered it, so the
answer is sent after the spool commit and never before: a batch that was not
committed is answered with a retryable status (503 / ``UNAVAILABLE`` or
``RESOURCE_EXHAUSTED`` with a retry hint) and the collector keeps it in its
queue. Ingestion is idempotent on episode id, so the retries and duplicates a
collector produces are stored once.

Bad input is answered with a 4xx (``INVALID_ARGUMENT`` over gRPC) saying what
is wrong, because a collector drops a batch answered that way instead of
retrying it forever. Spans of a request that are fine are kept even when
others in it are not: those are reported as ``partial_success``.

This module is the two fronts and the process around them; what a body must
be before it is decoded is :mod:`.bodies`, what becomes of a decoded request
is :mod:`.intake`.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import ipaddress
import json
import logging
import signal
import socket
import threading
from collections.abc import Awaitable, Callable, Iterator, MutableMapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import grpc
import uvicorn
from google.protobuf import json_format
from google.protobuf.any_pb2 import Any as AnyProto
from google.protobuf.duration_pb2 import Duration
from google.rpc import (  # type: ignore[import-untyped]  # ships .pyi without py.typed
    code_pb2,
    error_details_pb2,
    status_pb2,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceResponse,
)

from .._text import shown
from ..config import Settings
from ..deliver.spool import Spool
from ..deliver.uploader import Uploader
from ..errors import ConfigError
from ..read.otlp import OtlpDecodeError, decode_protobuf
from .bodies import (
    JSON_TYPE,
    BodyError,
    DecodeBudget,
    bearer_matches,
    decode_body,
    decompress,
    media_type,
    too_large,
)
from .intake import (
    DEFAULT_MAX_HELD_SPANS,
    DEFAULT_SETTLE_SECONDS,
    SpanIntake,
    Verdict,
    export_response,
    wire_text,
)

#: With the names of the modules it was split into (intake, bodies) that
#: callers import from here.
__all__ = [
    "DEFAULT_IDLE_TIMEOUT",
    "DEFAULT_MAX_BODY_BYTES",
    "DEFAULT_MEMORY_BYTES",
    "DEFAULT_READ_TIMEOUT",
    "DEFAULT_SHUTDOWN_GRACE",
    "DEFAULT_WORKERS",
    "GRPC_SERVICE",
    "TOKEN_ENV",
    "TRACES_PATH",
    "BodyError",
    "DecodeBudget",
    "MiB",
    "OtlpGrpcService",
    "OtlpHttpApp",
    "Receiver",
    "ReceiverConfig",
    "SpanIntake",
    "Verdict",
    "bearer_matches",
    "decode_body",
    "decompress",
    "export_response",
    "is_loopback",
    "media_type",
    "run_receiver",
]

logger = logging.getLogger(__name__)

MiB = 1024 * 1024
#: Room for one 64 MiB episode record (the Prime Traces line limit) with its
#: OTLP framing and JSON escaping, plus a few ordinary spans beside it.
DEFAULT_MAX_BODY_BYTES = 256 * MiB
#: A producer that sends nothing for this long and never sent its end span
#: is taken to have crashed. Long enough for slow rollouts between episodes.
DEFAULT_IDLE_TIMEOUT = 3600.0
#: Memory the requests being decoded may take together, estimated as
#: :data:`DECODE_EXPANSION` times each decompressed body (see :class:`DecodeBudget`).
DEFAULT_MEMORY_BYTES = 2048 * MiB
#: How long a request body may take to arrive, from its first byte to its last.
DEFAULT_READ_TIMEOUT = 120.0
#: How long in-flight requests may take to finish after a stop signal.
DEFAULT_SHUTDOWN_GRACE = 30.0
#: Requests decoded and committed at once; the rest wait their turn. Spool
#: commits serialise anyway, and each large request holds its body in memory.
DEFAULT_WORKERS = 4
TOKEN_ENV = "PRIME_RUNS_OTEL_SERVE_TOKEN"
TRACES_PATH = "/v1/traces"
GRPC_SERVICE = "opentelemetry.proto.collector.trace.v1.TraceService"

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


# -- configuration ----------------------------------------------------------------


@dataclass(frozen=True)
class ReceiverConfig:
    """How ``serve`` listens. ``grpc_port=None`` turns gRPC off; port 0 picks
    a free port (read it back from :attr:`Receiver.http_port`)."""

    host: str = "127.0.0.1"
    http_port: int = 4318
    grpc_port: int | None = 4317
    token: str | None = None
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    idle_timeout: float = DEFAULT_IDLE_TIMEOUT
    shutdown_grace: float = DEFAULT_SHUTDOWN_GRACE
    workers: int = DEFAULT_WORKERS
    memory_bytes: int = DEFAULT_MEMORY_BYTES
    read_timeout: float = DEFAULT_READ_TIMEOUT
    settle_seconds: float = DEFAULT_SETTLE_SECONDS
    max_held_spans: int = DEFAULT_MAX_HELD_SPANS

    def validate(self) -> None:
        """Refuse settings that would expose the spool or cannot work."""
        if not self.token and not is_loopback(self.host):
            raise ConfigError(
                f"serve listens on {self.host}, beyond this machine, so it needs a bearer "
                f"token: pass --token or set {TOKEN_ENV} (collectors then send "
                "'Authorization: Bearer <token>'), or listen on 127.0.0.1"
            )
        if self.max_body_bytes < 1024:
            raise ConfigError(f"the body limit {self.max_body_bytes} bytes is too small to work")
        if self.idle_timeout <= 0:
            raise ConfigError("the idle timeout must be a positive number of seconds")
        if self.workers < 1:
            raise ConfigError("serve needs at least one worker")
        if self.memory_bytes < 1:
            raise ConfigError("serve needs some memory to decode requests in")
        if self.read_timeout <= 0:
            raise ConfigError("the time a request body may take must be positive")
        if self.settle_seconds < 0:
            raise ConfigError("the wait for an episode's spans cannot be negative")
        if self.max_held_spans < 1:
            raise ConfigError("serve must be able to hold at least one span for synthesis")


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


# -- OTLP/HTTP ---------------------------------------------------------------------------

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
    """A minimal ASGI app: ``POST /v1/traces``, ``GET /healthz``, ``GET /readyz``.

    Request bodies are read and decoded off the event loop (decoding a large
    batch is CPU-bound, the commit is blocking SQLite), so health checks stay
    responsive while a 64 MiB episode is being committed.
    """

    def __init__(self, receiver: Receiver) -> None:
        self._receiver = receiver
        self._config = receiver.config

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        path = scope["path"].rstrip("/") or "/"
        method = scope["method"]
        if path in ("/healthz", "/readyz"):
            if method not in ("GET", "HEAD"):
                await _send_json(send, 405, {"error": "use GET"}, allow="GET")
                return
            await self._health(send, ready=path == "/readyz")
            return
        if path != TRACES_PATH:
            await _send_status(
                send, 404, f"no such endpoint {path!r}; OTLP traces go to POST {TRACES_PATH}", None
            )
            return
        if method != "POST":
            await _send_status(send, 405, f"{TRACES_PATH} takes POST", None, allow="POST")
            return
        self._receiver.in_flight += 1
        try:
            await self._export(scope, receive, send)
        finally:
            self._receiver.in_flight -= 1

    async def _health(self, send: Send, *, ready: bool) -> None:
        if not ready:
            await _send_json(send, 200, {"status": "ok", "in_flight": self._receiver.in_flight})
            return
        problem = self._receiver.not_ready_reason()
        if problem is None:
            await _send_json(send, 200, {"status": "ready"})
        else:
            await _send_json(send, 503, {"status": "not ready", "reason": problem})

    async def _export(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = _headers(scope)
        content_type = media_type(headers.get("content-type", ""))
        if not bearer_matches(headers.get("authorization"), self._config.token):
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
        try:
            body = await _read_body(
                receive, headers, self._config.max_body_bytes, self._config.read_timeout
            )
            verdict = await self._receiver.run_blocking(
                self._receiver.handle_http_body,
                body,
                headers.get("content-encoding", ""),
                content_type,
            )
        except BodyError as exc:
            logger.warning("Refused an OTLP/HTTP request: %s", exc.message)
            await _send_status(send, exc.status, exc.message, content_type)
            return
        await _send_verdict(send, verdict, content_type)


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
        raise BodyError(
            408, f"the body did not arrive within {timeout:g}s; send it at once"
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


async def _send_verdict(send: Send, verdict: Verdict, content_type: str) -> None:
    if verdict.outcome == "accepted":
        response = export_response(verdict)
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


# -- OTLP/gRPC ---------------------------------------------------------------------------


class _GrpcStatus(
    collections.namedtuple("_GrpcStatus", ("code", "details", "trailing_metadata")),
    grpc.Status,
):
    """A gRPC status with rich details (``RetryInfo``), without grpcio-status."""


def _grpc_status(code: grpc.StatusCode, message: str, retry_after: int | None) -> _GrpcStatus:
    message = wire_text(message)
    details = status_pb2.Status(code=code.value[0], message=message)
    if retry_after is not None:
        hint = AnyProto()
        hint.Pack(error_details_pb2.RetryInfo(retry_delay=Duration(seconds=retry_after)))
        details.details.append(hint)
    metadata = (("grpc-status-details-bin", details.SerializeToString()),)
    return _GrpcStatus(code, message, metadata)


class OtlpGrpcService:
    """``TraceService/Export`` over raw bytes, so a malformed request is
    answered ``INVALID_ARGUMENT`` by this code rather than by the framework."""

    def __init__(self, receiver: Receiver) -> None:
        self._receiver = receiver

    def handler(self) -> grpc.GenericRpcHandler:
        return grpc.method_handlers_generic_handler(
            GRPC_SERVICE,
            {
                "Export": grpc.unary_unary_rpc_method_handler(
                    self.export,
                    request_deserializer=None,
                    response_serializer=ExportTraceServiceResponse.SerializeToString,
                )
            },
        )

    def export(self, body: bytes, context: grpc.ServicerContext) -> ExportTraceServiceResponse:
        token = self._receiver.config.token
        metadata = dict(context.invocation_metadata())
        header = metadata.get("authorization")
        if not bearer_matches(header if isinstance(header, str) else None, token):
            context.abort_with_status(
                _grpc_status(
                    grpc.StatusCode.UNAUTHENTICATED,
                    "missing or wrong bearer token in the 'authorization' metadata",
                    None,
                )
            )
        verdict = self._accept(body)
        if verdict.outcome == "accepted":
            return export_response(verdict)
        code = {
            "invalid": grpc.StatusCode.INVALID_ARGUMENT,
            "full": grpc.StatusCode.RESOURCE_EXHAUSTED,
            "unavailable": grpc.StatusCode.UNAVAILABLE,
        }[verdict.outcome]
        if verdict.outcome == "invalid":
            logger.warning("Refused an OTLP/gRPC request: %s", verdict.message)
        context.abort_with_status(_grpc_status(code, verdict.message, verdict.retry_after))
        raise AssertionError("abort_with_status() returns only by raising")

    def _accept(self, body: bytes) -> Verdict:
        with self._receiver.memory.reserve(len(body)):
            try:
                request = decode_protobuf(body)
            except OtlpDecodeError as exc:
                return Verdict("invalid", str(exc))
            return self._receiver.intake.accept(request)


# -- the server ------------------------------------------------------------------------------


class _HttpServer(uvicorn.Server):
    """uvicorn, with the receiver's own shutdown steps around its drain."""

    def __init__(self, config: uvicorn.Config, receiver: Receiver) -> None:
        super().__init__(config)
        self._receiver = receiver

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


class Receiver:
    """One ``serve`` process: spool, uploader, HTTP and gRPC fronts."""

    def __init__(self, config: ReceiverConfig, settings: Settings) -> None:
        config.validate()
        if settings.mode == "disabled":
            raise ConfigError(
                "serve cannot run with PRIME_RUNS_MODE=disabled: it would accept spans and "
                "drop them. Use online (with an API key) or local."
            )
        self.config = config
        self.settings = settings
        self.spool = Spool(settings.spool_path, max_bytes=settings.spool_max_bytes)
        self.uploader = Uploader(self.spool, settings, idle_timeout=config.idle_timeout)
        self.intake = SpanIntake(
            self.spool,
            settings,
            self.uploader,
            settle_seconds=config.settle_seconds,
            max_held_spans=config.max_held_spans,
        )
        self.memory = DecodeBudget(config.memory_bytes)
        self._releasing = threading.Event()
        self._releaser = threading.Thread(
            target=self._release_loop, name="otlp-synthesis", daemon=True
        )
        self._executor = ThreadPoolExecutor(config.workers, thread_name_prefix="otlp-intake")
        self._http_socket = _listen(config.host, config.http_port)
        self.http_port: int = self._http_socket.getsockname()[1]
        self.grpc_port: int | None = None
        self._grpc: grpc.Server | None = None
        self._grpc_executor = ThreadPoolExecutor(config.workers, thread_name_prefix="otlp-grpc")
        if config.grpc_port is not None:
            self._grpc, self.grpc_port = self._grpc_server(config.grpc_port)
        self._stopped: threading.Event | None = None
        #: OTLP/HTTP requests being read or committed (shown on /healthz).
        self.in_flight = 0
        self._server = _HttpServer(
            uvicorn.Config(
                OtlpHttpApp(self),
                log_level="warning",
                access_log=False,
                lifespan="off",
                ws="none",
                timeout_graceful_shutdown=int(config.shutdown_grace),
                server_header=False,
            ),
            self,
        )

    def _grpc_server(self, port: int) -> tuple[grpc.Server, int]:
        server = grpc.server(
            self._grpc_executor,
            handlers=[OtlpGrpcService(self).handler()],
            options=[
                ("grpc.max_receive_message_length", self.config.max_body_bytes),
                ("grpc.max_send_message_length", 4 * MiB),
                ("grpc.so_reuseport", 0),
            ],
            maximum_concurrent_rpcs=self.config.workers * 4,
        )
        host = self.config.host
        address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        try:
            bound = server.add_insecure_port(address)
        except RuntimeError as exc:
            bound = 0
            reason = str(exc)
        else:
            reason = "the address is in use or not available"
        if not bound:
            self._http_socket.close()
            raise ConfigError(
                f"cannot listen for OTLP/gRPC on {address}: {reason}. Pick another "
                "--grpc-port, or turn gRPC off with --no-grpc."
            )
        return server, bound

    # -- running ------------------------------------------------------------------

    async def serve(self) -> None:
        """Serve until SIGINT/SIGTERM or :meth:`stop`, then drain and stop."""
        self.uploader.start()
        self._releaser.start()
        if self._grpc is not None:
            self._grpc.start()
        logger.info(
            "prime-runs-otel serve: OTLP/HTTP on http://%s:%d%s%s; runs go to %s (spool %s)",
            self.config.host,
            self.http_port,
            TRACES_PATH,
            f", OTLP/gRPC on {self.config.host}:{self.grpc_port}" if self.grpc_port else "",
            "the platform" if self.settings.mode == "online" else "the local store",
            self.spool.path,
        )
        try:
            await self._server.serve(sockets=[self._http_socket])
        finally:
            # Each step on its own: whatever went wrong while serving, the
            # held episodes are still committed and the spool still closed.
            for step in (
                lambda: self.begin_stop().wait(self.config.shutdown_grace + 1),
                lambda: self._executor.shutdown(wait=True),
                lambda: self._grpc_executor.shutdown(wait=True),
                self._stop_releasing,
                self.intake.flush,
                lambda: self.uploader.stop(timeout=self.config.shutdown_grace),
                self._http_socket.close,
                self.spool.close,
            ):
                try:
                    step()
                except Exception as exc:
                    logger.error(
                        "Stopping: a step failed (%s: %s); going on", type(exc).__name__, shown(exc)
                    )

    def stop(self) -> None:
        """Ask a running :meth:`serve` to drain and return (thread-safe)."""
        self._server.should_exit = True

    def begin_stop(self) -> threading.Event:
        """Stop taking new requests; returns an event set once gRPC is drained."""
        if self._stopped is None:
            if self._grpc is None:
                self._stopped = threading.Event()
                self._stopped.set()
            else:
                self._stopped = self._grpc.stop(self.config.shutdown_grace)
        return self._stopped

    def _release_loop(self) -> None:
        """Let settled episodes go between requests: a trace's last spans may
        be the last thing a producer ever sends."""
        interval = min(1.0, max(0.05, self.config.settle_seconds / 4))
        while not self._releasing.wait(interval):
            try:
                self.intake.release_settled()
            except Exception:  # the loop must outlive any one bad tree
                logger.exception("Releasing held episodes failed; trying again")

    def _stop_releasing(self) -> None:
        self._releasing.set()
        if self._releaser.is_alive():
            self._releaser.join()

    def not_ready_reason(self) -> str | None:
        if self._stopped is not None:
            return "shutting down"
        if not self.uploader.running:
            return "the uploader is not running"
        if self.intake.commit_problem is not None:
            return self.intake.commit_problem
        if not self.intake.has_room():
            return "the spool is at its cap; delivery has to free room first"
        return None

    async def run_blocking(self, function: Callable[..., Verdict], *args: Any) -> Verdict:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, function, *args)

    def handle_http_body(self, body: bytes, encoding: str, content_type: str) -> Verdict:
        """Decompress, decode and commit one OTLP/HTTP body (on a worker thread)."""
        data = decompress(body, encoding, self.config.max_body_bytes)
        with self.memory.reserve(len(data)):
            try:
                request = decode_body(data, content_type)
            except OtlpDecodeError as exc:
                raise BodyError(400, str(exc)) from None
            del data
            return self.intake.accept(request)


def _listen(host: str, port: int) -> socket.socket:
    """Bind the HTTP socket up front, so a port in use is a clear error at
    start-up, and port 0 gives a known port before serving."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        sock = socket.socket(family, kind, proto)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(2048)
    except OSError as exc:
        raise ConfigError(
            f"cannot listen for OTLP/HTTP on {host}:{port}: {exc}. Pick another --http-port."
        ) from None
    sock.setblocking(False)
    return sock


def run_receiver(config: ReceiverConfig, settings: Settings) -> None:
    """Run ``serve`` in this thread until a stop signal."""
    receiver = Receiver(config, settings)
    asyncio.run(receiver.serve())
