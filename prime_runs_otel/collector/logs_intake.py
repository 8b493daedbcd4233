"""Log export requests → events for the spans they are about: the part of
``serve`` that takes OTLP logs (``POST /v1/logs``, ``LogsService/Export``).

The GenAI conventions send their events as log records in the context of
the span they concern; ``gen_ai.evaluation.result`` scores the operation of
that span, and an episode whose record is built from its spans reads it as a
reward. So each such record joins its span in the span intake's buffer
(:meth:`.intake.SpanIntake.add_span_events`), whichever of the two arrives
first. Records that are not such events (an application's own logs, events
of native episodes, whose records hold their rewards already) are accepted
and passed over: nothing in them is refused, so nothing is retried.
"""

from __future__ import annotations

from collections.abc import Callable

from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import (
    ExportLogsPartialSuccess,
    ExportLogsServiceRequest,
    ExportLogsServiceResponse,
)

from ..read.otlp_logs import decode_logs_json, decode_logs_protobuf, span_events
from .bodies import JSON_TYPE
from .intake import SpanIntake, Verdict, wire_text

__all__ = ["LOGS_PATH", "LogIntake", "decode_logs_body", "logs_response"]

LOGS_PATH = "/v1/logs"
GRPC_LOGS_SERVICE = "opentelemetry.proto.collector.logs.v1.LogsService"


class LogIntake:
    """Log export requests → the span intake's buffer."""

    def __init__(
        self,
        spans: SpanIntake,
        handoff: Callable[[ExportLogsServiceRequest, bytes | None], Verdict] | None = None,
    ) -> None:
        self._spans = spans
        #: In a Kafka fleet: where requests go instead (see :mod:`.kafka_ingest`).
        self._handoff = handoff

    def accept(
        self, request: ExportLogsServiceRequest, *, owned: bool = False, wire: bytes | None = None
    ) -> Verdict:
        """Hand the events to the span buffer (in a fleet: to Kafka, unless
        ``owned``: read back from Kafka by the member of the run); ``wire``:
        the request's own protobuf encoding, when it came as one."""
        if self._handoff is not None and not owned:
            return self._handoff(request, wire)
        self._spans.add_span_events(span_events(request))
        return Verdict("accepted")


def decode_logs_body(body: bytes, content_type: str, max_values: int) -> ExportLogsServiceRequest:
    if content_type == JSON_TYPE:
        return decode_logs_json(body, max_objects=max_values)
    return decode_logs_protobuf(body)


def logs_response(verdict: Verdict) -> ExportLogsServiceResponse:
    """The OTLP answer to an accepted request (``partial_success`` only when
    records were refused)."""
    if not verdict.rejected:
        return ExportLogsServiceResponse()
    return ExportLogsServiceResponse(
        partial_success=ExportLogsPartialSuccess(
            rejected_log_records=verdict.rejected, error_message=wire_text(verdict.message)
        )
    )
