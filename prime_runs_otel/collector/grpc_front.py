"""OTLP/gRPC: ``TraceService/Export`` answered after the spool commit, and
``LogsService/Export`` (the GenAI events of spans, see :mod:`.logs_intake`),
by a grpcio server of its own beside the HTTP one.

Everything about gRPC is here: the service over raw bytes, how a
:class:`.intake.Verdict` becomes a status code with rich details
(``RetryInfo``), and the server's options (message sizes, concurrency). The
front needs of the process behind it only what :class:`GrpcReceiver` names,
so it does not import :mod:`.receiver`.
"""

from __future__ import annotations

import collections
import logging
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

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

from ..errors import ConfigError
from ..read.otlp import OtlpDecodeError, decode_protobuf
from ..read.otlp_logs import decode_logs_protobuf
from .bodies import DecodeBudget, bearer_matches
from .intake import SpanIntake, Verdict, export_response, wire_text
from .logs_intake import GRPC_LOGS_SERVICE, LogIntake, logs_response
from .receiver_config import MiB, ReceiverConfig

logger = logging.getLogger(__name__)

GRPC_SERVICE = "opentelemetry.proto.collector.trace.v1.TraceService"


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


class OtlpGrpcService:
    """``TraceService/Export`` over raw bytes, so a malformed request is
    answered ``INVALID_ARGUMENT`` by this code rather than by the framework."""

    service = GRPC_SERVICE
    response_type: type[Any] = ExportTraceServiceResponse

    def __init__(self, receiver: GrpcReceiver) -> None:
        self._receiver = receiver

    def handler(self) -> grpc.GenericRpcHandler:
        return grpc.method_handlers_generic_handler(
            self.service,
            {
                "Export": grpc.unary_unary_rpc_method_handler(
                    self.export,
                    request_deserializer=None,
                    response_serializer=self.response_type.SerializeToString,
                )
            },
        )

    def respond(self, verdict: Verdict) -> Any:
        return export_response(verdict)

    def decode(self, body: bytes) -> Any:
        return decode_protobuf(body)

    def take(self, request: Any) -> Verdict:
        return self._receiver.intake.accept(request)

    def export(self, body: bytes, context: grpc.ServicerContext) -> Any:
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
            return self.respond(verdict)
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
                request = self.decode(body)
            except OtlpDecodeError as exc:
                return Verdict("invalid", str(exc))
            return self.take(request)


class OtlpGrpcLogsService(OtlpGrpcService):
    """``LogsService/Export``: the span events a logs request carries go to
    the span intake's buffer (:class:`.logs_intake.LogIntake`)."""

    service = GRPC_LOGS_SERVICE
    response_type = ExportLogsServiceResponse

    def respond(self, verdict: Verdict) -> Any:
        return logs_response(verdict)

    def decode(self, body: bytes) -> Any:
        return decode_logs_protobuf(body)

    def take(self, request: Any) -> Verdict:
        return self._receiver.logs.accept(request)


def grpc_server(
    receiver: GrpcReceiver, executor: ThreadPoolExecutor, port: int
) -> tuple[grpc.Server, int]:
    """The gRPC server of ``receiver`` on ``port`` (0: any free one), not yet
    started, and the port it is bound to."""
    config = receiver.config
    server = grpc.server(
        executor,
        handlers=[OtlpGrpcService(receiver).handler(), OtlpGrpcLogsService(receiver).handler()],
        options=[
            ("grpc.max_receive_message_length", config.max_body_bytes),
            ("grpc.max_send_message_length", 4 * MiB),
            ("grpc.so_reuseport", 0),
        ],
        maximum_concurrent_rpcs=config.workers * 4,
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
        raise ConfigError(
            f"cannot listen for OTLP/gRPC on {address}: {reason}. Pick another "
            "--grpc-port, or turn gRPC off with --no-grpc."
        )
    return server, bound
