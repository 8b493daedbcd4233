"""OTLP/gRPC: ``TraceService/Export`` answered after the spool commit, and
``LogsService/Export`` (the GenAI events of spans, see :mod:`.logs_intake`),
by a grpcio server of its own beside the HTTP one.

Everything about gRPC is here: the service over raw bytes, how a
:class:`.intake.Verdict` becomes a status code with rich details
(``RetryInfo``), the calls taken at once (the rest refused with a status
clients retry, see :mod:`.admission`), and the server's options (message
sizes, idle and silent connections). The front needs of the process behind
it only what :class:`GrpcReceiver` names, so it does not import
:mod:`.receiver`.
"""

from __future__ import annotations

import collections
import logging
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol, TypeAlias

import grpc
from google.protobuf.any_pb2 import Any as AnyProto
from google.protobuf.duration_pb2 import Duration
from google.rpc import (  # type: ignore[import-untyped]  # ships .pyi without py.typed
    error_details_pb2,
    status_pb2,
)
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceResponse
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceResponse,
)

from .._net import bind_socket
from ..errors import ConfigError
from .admission import OVERLOAD_RETRY_AFTER, overload_message
from .bodies import BodyError, DecodeBudget
from .calls import ExportCalls, Signal
from .intake import SpanIntake, Verdict, wire_text
from .logs_intake import GRPC_LOGS_SERVICE, LogIntake
from .receiver_config import MiB, ReceiverConfig

logger = logging.getLogger(__name__)

GRPC_SERVICE = "opentelemetry.proto.collector.trace.v1.TraceService"
#: A connection that has not finished its HTTP/2 preface by then is closed
#: (grpcio's default is 120 s: a silent connection holds a descriptor).
HANDSHAKE_TIMEOUT_MS = 10_000
#: An open connection without a call for this long is sent GOAWAY; clients
#: reconnect when they next send.
MAX_CONNECTION_IDLE_MS = 300_000
#: Clients are pinged after this long without traffic, and a connection whose
#: peer does not answer within the timeout is closed (a host that vanished).
KEEPALIVE_TIME_MS = 60_000
KEEPALIVE_TIMEOUT_MS = 20_000


class GrpcReceiver(Protocol):
    """What the gRPC front uses of the process behind it
    (:class:`.receiver.Receiver`), named here so the front need not import it."""

    config: ReceiverConfig
    memory: DecodeBudget
    intake: SpanIntake
    logs: LogIntake


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


_Handler: TypeAlias = "grpc.RpcMethodHandler[bytes, Any]"


#: The content type of every gRPC request body: OTLP protobuf.
PROTOBUF = "application/x-protobuf"


class OtlpGrpcService:
    """One OTLP service's ``Export`` over raw bytes, so a malformed request is
    answered ``INVALID_ARGUMENT`` by this code rather than by the framework."""

    def __init__(
        self, calls: ExportCalls, signal: Signal, service: str, response_type: type[Any]
    ) -> None:
        self._calls = calls
        self._signal = signal
        self.service = service
        self.response_type = response_type

    @property
    def method(self) -> str:
        """The full method name grpcio asks the handlers about."""
        return f"/{self.service}/Export"

    def handler(self) -> _Handler:
        return grpc.unary_unary_rpc_method_handler(
            self.export,
            request_deserializer=None,
            response_serializer=self.response_type.SerializeToString,
        )

    def export(self, body: bytes, context: grpc.ServicerContext) -> Any:
        header = dict(context.invocation_metadata()).get("authorization")
        if not self._calls.authenticated(header if isinstance(header, str) else None):
            context.abort_with_status(
                _grpc_status(
                    grpc.StatusCode.UNAUTHENTICATED,
                    "missing or wrong bearer token in the 'authorization' metadata",
                    None,
                )
            )
        verdict = self._take(body)
        if verdict.outcome == "accepted":
            return self._signal.respond(verdict)
        code = {
            "invalid": grpc.StatusCode.INVALID_ARGUMENT,
            "full": grpc.StatusCode.RESOURCE_EXHAUSTED,
            "unavailable": grpc.StatusCode.UNAVAILABLE,
        }[verdict.outcome]
        if verdict.outcome == "invalid":
            logger.warning("Refused an OTLP/gRPC request: %s", verdict.message)
        context.abort_with_status(_grpc_status(code, verdict.message, verdict.retry_after))
        raise AssertionError("abort_with_status() returns only by raising")

    def _take(self, body: bytes) -> Verdict:
        """The body taken as every front takes one; a body refused before it
        is taken is retried only when the cause is this process's (a 503)."""
        try:
            return self._calls.take(self._signal, body, PROTOBUF)
        except BodyError as exc:
            if exc.status == 503:
                return Verdict("unavailable", exc.message, retry_after=exc.retry_after)
            return Verdict("invalid", exc.message)


class _CountingPool(ThreadPoolExecutor):
    """The workers' pool, counting the calls it holds (waiting or running):
    grpcio submits each admitted call here, from its one serving thread."""

    def __init__(self, workers: int) -> None:
        super().__init__(workers, thread_name_prefix="otlp-grpc")
        self._lock = threading.Lock()
        self.held = 0

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        with self._lock:
            self.held += 1
        try:
            future = super().submit(fn, *args, **kwargs)
        except BaseException:
            self._release(None)
            raise
        future.add_done_callback(self._release)
        return future

    def _release(self, _: Future[Any] | None) -> None:
        with self._lock:
            self.held -= 1


class _Refusal:
    """The answer to a call past the limit: ``UNAVAILABLE`` with ``RetryInfo``.

    A stream handler (grpcio hands it the request unread), on a small pool of
    its own (``experimental_thread_pool``, which grpcio looks for on the
    handler): refusing a 256 MiB body costs nothing, and the refusal never
    waits behind the calls it refuses.
    """

    def __init__(self, limit: int) -> None:
        self.status = _grpc_status(
            grpc.StatusCode.UNAVAILABLE, overload_message(limit), OVERLOAD_RETRY_AFTER
        )
        self.experimental_thread_pool = ThreadPoolExecutor(
            2, thread_name_prefix="otlp-grpc-refusal"
        )

    def __call__(self, requests: Iterator[bytes], context: grpc.ServicerContext) -> None:
        context.abort_with_status(self.status)


class _Admission(grpc.GenericRpcHandler):
    """Each service's ``Export`` while the workers' pool holds fewer than
    ``limit`` calls (traces and logs together), else :class:`_Refusal`.

    grpcio's own limit (``maximum_concurrent_rpcs``) answers
    ``RESOURCE_EXHAUSTED`` without ``RetryInfo``, which OTLP clients must
    treat as permanent, so the limit is kept here instead. grpcio asks this
    handler and then submits the call to the pool from its one serving
    thread, so the count it reads is exact.
    """

    def __init__(
        self, services: list[OtlpGrpcService], pool: _CountingPool, calls: ExportCalls
    ) -> None:
        self._pool = pool
        self._calls = calls
        self._refuse = _Refusal(calls.limit)
        #: By full method name: the call's handler, and its refusal.
        self._handlers: dict[str, tuple[_Handler, _Handler]] = {
            service.method: (
                service.handler(),
                grpc.stream_unary_rpc_method_handler(
                    self._refuse,
                    request_deserializer=None,
                    response_serializer=service.response_type.SerializeToString,
                ),
            )
            for service in services
        }

    def service(self, details: grpc.HandlerCallDetails) -> _Handler | None:
        handlers = self._handlers.get(details.method)
        if handlers is None:
            return None
        export, refusal = handlers
        return export if self._calls.admits(self._pool.held) else refusal

    def shutdown(self) -> None:
        self._refuse.experimental_thread_pool.shutdown(wait=True)


@dataclass
class GrpcFront:
    """The gRPC server of a receiver, not yet started, with its pools."""

    server: grpc.Server
    port: int
    _pool: _CountingPool
    _admission: _Admission

    def shutdown_pools(self) -> None:
        """Let the calls still in the pools finish (after the server stopped)."""
        self._pool.shutdown(wait=True)
        self._admission.shutdown()


def grpc_server(receiver: GrpcReceiver, port: int) -> GrpcFront:
    """The gRPC front of ``receiver`` on ``port`` (0: any free one)."""
    config = receiver.config
    _refuse_taken_port(config.host, port)
    pool = _CountingPool(config.intake_threads)
    calls = ExportCalls(receiver, "OTLP/gRPC")
    services = [
        OtlpGrpcService(calls, calls.traces, GRPC_SERVICE, ExportTraceServiceResponse),
        OtlpGrpcService(calls, calls.logs, GRPC_LOGS_SERVICE, ExportLogsServiceResponse),
    ]
    admission = _Admission(services, pool, calls)
    server = grpc.server(
        pool,
        handlers=[admission],
        options=[
            ("grpc.max_receive_message_length", config.max_body_bytes),
            ("grpc.max_send_message_length", 4 * MiB),
            ("grpc.so_reuseport", 0),
            ("grpc.server_handshake_timeout_ms", HANDSHAKE_TIMEOUT_MS),
            ("grpc.max_connection_idle_ms", MAX_CONNECTION_IDLE_MS),
            ("grpc.keepalive_time_ms", KEEPALIVE_TIME_MS),
            ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
        ],
    )
    host = config.host
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        bound = server.add_insecure_port(address)
    except RuntimeError as exc:
        bound = 0
        reason = str(exc)
    else:
        reason = "the address is in use or not available"
    if not bound:
        pool.shutdown(wait=False)
        admission.shutdown()
        raise ConfigError(
            f"cannot listen for OTLP/gRPC on {address}: {reason.rstrip('. ')}. Pick another "
            "--grpc-port, or turn gRPC off with --no-grpc."
        )
    return GrpcFront(server, bound, pool, admission)


def _refuse_taken_port(host: str, port: int) -> None:
    """A port already taken is refused here, in one line, before gRPC tries
    it: gRPC's C core would first log its own ``add_port.cc`` error line."""
    if port == 0:
        return
    try:
        bind_socket(host, port, backlog=1).close()
    except OSError as exc:
        address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        raise ConfigError(
            f"cannot listen for OTLP/gRPC on {address}: {exc.strerror or exc}. Pick another "
            "--grpc-port, or turn gRPC off with --no-grpc."
        ) from None
