"""``serve`` takes OTLP logs (``POST /v1/logs``, ``LogsService/Export``) for
the GenAI events they carry: a ``gen_ai.evaluation.result`` log record in a
span's context scores that span, and an episode synthesised from its spans
reads it as a reward, whether it arrives before its span, after it, or over
the other transport.

The waiting rules are driven in process with a hand-wound clock; the whole
path runs once for real: the SDK's OTLP span and log exporters (HTTP and
gRPC) against a ``serve`` process and the fake platform.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from opentelemetry import trace as trace_api
from opentelemetry._logs import LogRecord
from opentelemetry.exporter.otlp.proto.common._log_encoder import encode_logs
from opentelemetry.exporter.otlp.proto.grpc._log_exporter import (
    OTLPLogExporter as GrpcLogExporter,
)
from opentelemetry.exporter.otlp.proto.http._log_exporter import (
    OTLPLogExporter as HttpLogExporter,
)
from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
    OTLPSpanExporter as HttpSpanExporter,
)
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.sdk._logs import LoggerProvider, ReadableLogRecord
from opentelemetry.sdk._logs.export import InMemoryLogRecordExporter, SimpleLogRecordProcessor
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from test_receiver import ServeProcess, closed_run, serve_env
from test_synthesis_serve import Clock, intake_of, request, stored

from prime_runs_otel import emit_run_end, emit_run_start, run_resource
from prime_runs_otel import semconv as sc
from prime_runs_otel.collector.logs_intake import LogIntake
from prime_runs_otel.deliver.spool import Spool
from prime_runs_otel.produce.episode import record_episode
from prime_runs_otel.produce.synthetic import synthetic_episode
from prime_runs_otel.produce.traced_episode import episode_span
from prime_runs_otel.testing import FakePlatform


def evaluation(name: str, score: float, context: Any) -> LogRecord:
    return LogRecord(
        event_name=sc.GEN_AI_EVALUATION_EVENT,
        context=context,
        attributes={sc.GEN_AI_EVALUATION_NAME: name, sc.GEN_AI_EVALUATION_SCORE: score},
    )


class Producer:
    """A record-less episode and its evaluation, as spans and log records in memory."""

    def __init__(self, run_id: str) -> None:
        resource = run_resource(run_id=run_id, environments=["arith"])
        self.spans = InMemorySpanExporter()
        self.tracer_provider = TracerProvider(resource=resource)
        self.tracer_provider.add_span_processor(SimpleSpanProcessor(self.spans))
        self.tracer = self.tracer_provider.get_tracer("rl")
        self.logs = InMemoryLogRecordExporter()
        self.logger_provider = LoggerProvider(resource=resource)
        self.logger_provider.add_log_record_processor(SimpleLogRecordProcessor(self.logs))
        self.logger = self.logger_provider.get_logger("an-evaluator")

    def episode(self, example: int) -> None:
        with episode_span(self.tracer, example_id=example, env="arith") as episode:
            with self.tracer.start_as_current_span(
                "chat policy",
                attributes={sc.GEN_AI_OPERATION_NAME: "chat", sc.GEN_AI_REQUEST_MODEL: "policy"},
            ):
                pass
            self.logger.emit(evaluation("accuracy", 0.75, trace_api.set_span_in_context(episode)))

    def split(self) -> tuple[list[ReadableSpan], list[ReadableLogRecord]]:
        return list(self.spans.get_finished_spans()), list(self.logs.get_finished_logs())


@pytest.fixture
def spool(tmp_path: Path) -> Iterator[Spool]:
    opened = Spool(tmp_path / "spool.sqlite3", max_bytes=1 << 30)
    yield opened
    opened.close()


def logs_request(records: list[ReadableLogRecord]) -> ExportLogsServiceRequest:
    return encode_logs(records)


def rewards(spool: Spool, run_id: str) -> list[dict[str, Any]]:
    return [record["traces"][0]["rewards"] for record in stored(spool, run_id)]


@pytest.mark.parametrize("logs_first", [True, False], ids=["logs-first", "spans-first"])
def test_an_evaluation_log_record_scores_its_episode_in_either_order(
    spool: Spool, logs_first: bool
) -> None:
    clock = Clock()
    intake = intake_of(spool, clock)
    logs = LogIntake(intake)
    producer = Producer("either-order")
    producer.episode(0)
    spans, records = producer.split()

    if logs_first:
        assert logs.accept(logs_request(records)).outcome == "accepted"
        assert intake.accept(request(spans)).outcome == "accepted"
    else:
        assert intake.accept(request(spans)).outcome == "accepted"
        clock.now += 1.0  # within the settle time
        assert logs.accept(logs_request(records)).outcome == "accepted"
    clock.now += 10.0
    intake.release_settled()

    assert rewards(spool, "either-order") == [{"accuracy": {"score": 0.75, "weight": 1.0}}]
    assert intake.trees.stats.late_events == 0


def test_an_evaluation_after_its_episode_was_synthesised_is_counted_late(spool: Spool) -> None:
    clock = Clock()
    intake = intake_of(spool, clock)
    producer = Producer("late")
    producer.episode(0)
    spans, records = producer.split()
    intake.accept(request(spans))
    clock.now += 10.0
    intake.release_settled()

    LogIntake(intake).accept(logs_request(records))

    assert rewards(spool, "late") == [{}]
    assert intake.trees.stats.late_events == 1


def test_events_of_native_episodes_and_other_logs_are_passed_over(spool: Spool) -> None:
    clock = Clock()
    intake = intake_of(spool, clock)
    producer = Producer("native")
    record = synthetic_episode(0, seed=3)
    record_episode(producer.tracer, record, child_spans=False)
    (native,) = producer.split()[0]
    producer.logger.emit(evaluation("correct", 0.0, trace_api.set_span_in_context(_span(native))))
    producer.logger.emit(LogRecord(body="an application's own log line"))
    intake.accept(request([native]))
    LogIntake(intake).accept(logs_request(producer.split()[1]))
    clock.now += 10.0
    intake.release_settled()

    # The record keeps its own rewards; nothing was counted lost.
    assert rewards(spool, "native") == [record["traces"][0]["rewards"]]
    stats = intake.trees.stats
    assert (stats.late_events, stats.unclaimed_events) == (0, 0)


def _span(readable: ReadableSpan) -> trace_api.Span:
    assert readable.context is not None
    return trace_api.NonRecordingSpan(readable.context)


# -- the whole path, over both transports ------------------------------------------------


def test_serve_reads_evaluations_sent_over_otlp_http_and_grpc(
    tmp_path: Path, platform: FakePlatform
) -> None:
    serve = ServeProcess(tmp_path, serve_env(tmp_path, platform), "--settle-seconds", "2").start()
    try:
        resource = run_resource(run_id="scored", name="scored", environments=["arith"])
        tracer_provider = TracerProvider(resource=resource)
        tracer_provider.add_span_processor(
            SimpleSpanProcessor(HttpSpanExporter(endpoint=serve.traces_url))
        )
        logger_provider = LoggerProvider(resource=resource)
        for exporter in (
            HttpLogExporter(endpoint=f"{serve.url}/v1/logs"),
            GrpcLogExporter(endpoint=f"127.0.0.1:{serve.grpc_port}", insecure=True),
        ):
            logger_provider.add_log_record_processor(SimpleLogRecordProcessor(exporter))
        tracer = tracer_provider.get_tracer("rl")
        logger = logger_provider.get_logger("an-evaluator")
        emit_run_start(tracer, {})
        for example in range(2):
            with episode_span(tracer, example_id=example, env="arith") as episode:
                with tracer.start_as_current_span(
                    "chat policy", attributes={sc.GEN_AI_OPERATION_NAME: "chat"}
                ) as call:
                    pass
                # Before the episode span is sent, for the call...
                logger.emit(evaluation("format", 1.0, trace_api.set_span_in_context(call)))
            # ...and after it, for the episode.
            logger.emit(evaluation("accuracy", 0.5, trace_api.set_span_in_context(episode)))
        emit_run_end(tracer, "completed", episodes_recorded=2)
        tracer_provider.shutdown()
        logger_provider.shutdown()

        run = closed_run(platform, "scored")
        episodes = platform.episodes(run.id)
        assert len(episodes) == 2
        for stored_episode in episodes:
            # Each record went through both transports: the same scores, not doubled.
            assert stored_episode["traces"][0]["rewards"] == {
                "format": {"score": 1.0, "weight": 1.0},
                "accuracy": {"score": 0.5, "weight": 1.0},
            }
    finally:
        serve.stop()


def test_serve_names_the_logs_path_and_refuses_a_bad_logs_body(tmp_path: Path) -> None:
    serve = ServeProcess(tmp_path, serve_env(tmp_path, None)).start()
    try:
        missing = httpx.post(f"{serve.url}/v1/metrics", content=b"")
        assert missing.status_code == 404 and "/v1/logs" in missing.text
        bad = httpx.post(
            f"{serve.url}/v1/logs",
            content=json.dumps({"resourceLogs": "nope"}).encode(),
            headers={"content-type": "application/json"},
        )
        assert bad.status_code == 400
        empty = httpx.post(
            f"{serve.url}/v1/logs",
            content=ExportLogsServiceRequest().SerializeToString(),
            headers={"content-type": "application/x-protobuf"},
        )
        assert empty.status_code == 200
    finally:
        serve.stop()
