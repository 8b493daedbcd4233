"""What a run reports besides its spans, and how its spans hang together:
step metrics and rewards as OpenTelemetry metrics (with exemplars pointing at
the spans behind them), the GenAI client histograms, the GenAI events on the
run's LoggerProvider, and links from every span of the run to its start.

Runs are real (``start_run``, local mode); metrics go through the SDK's
MeterProvider into an in-memory reader, or, configured by the environment,
over OTLP/HTTP to a receiver on loopback.
"""

from __future__ import annotations

import gzip
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from opentelemetry._logs import LogRecord
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import InMemoryLogRecordExporter, SimpleLogRecordProcessor
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from prime_runs_otel import semconv as sc
from prime_runs_otel import start_run
from prime_runs_otel.produce.synthetic import synthetic_episodes

STEPS = 3
PER_STEP = 4


@pytest.fixture(autouse=True)
def local(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PRIME_RUNS_MODE", "local")


def training_run(**providers: Any) -> tuple[Any, InMemorySpanExporter]:
    """A local training run of STEPS steps, its spans also in memory."""
    spans = InMemorySpanExporter()
    run = start_run(name="signals", kind="train", model="m", environments=["gsm8k"], **providers)
    run.tracer_provider.add_span_processor(SimpleSpanProcessor(spans))
    records = synthetic_episodes(STEPS * PER_STEP, seed=21)
    for step in range(STEPS):
        for _ in range(PER_STEP):
            record = next(records)
            record["run"] = {"type": "train", "id": "r", "work": {"type": "train", "step": step}}
            run.record_episode(record)
        run.log_metrics({"loss": 1.0 / (step + 1), "reward": {"mean": step / 10}}, step=step)
    return run, spans


def points(reader: InMemoryMetricReader) -> dict[str, list[Any]]:
    """Every data point of every metric, by metric name."""
    data = reader.get_metrics_data()
    assert data is not None
    found: dict[str, list[Any]] = {}
    for resource_metrics in data.resource_metrics:
        for scope_metrics in resource_metrics.scope_metrics:
            assert scope_metrics.scope.name == sc.INSTRUMENTATION_SCOPE
            assert scope_metrics.scope.schema_url == sc.SCHEMA_URL
            for metric in scope_metrics.metrics:
                found.setdefault(metric.name, []).extend(metric.data.data_points)
    return found


def span_ids(spans: InMemorySpanExporter, prefix: str) -> set[int]:
    return {
        span.context.span_id
        for span in spans.get_finished_spans()
        if span.context is not None and span.name.startswith(prefix)
    }


def test_step_metrics_and_rewards_are_metrics_with_exemplars() -> None:
    reader = InMemoryMetricReader()
    run, spans = training_run(meter_provider=MeterProvider(metric_readers=[reader]))
    run.wait_delivered(30)  # every episode handed over has become its spans (and metrics)
    # Read before finish(): it flushes the provider, and a collection takes the
    # exemplars with it, as an exporter's would.
    found = points(reader)
    run.finish()

    step = {dict(p.attributes)[sc.METRIC_NAME]: p for p in found[sc.METRIC_STEP]}
    assert set(step) == {"loss", "reward/mean"}
    assert step["loss"].value == pytest.approx(1.0 / STEPS)  # the last step's
    metrics_spans = span_ids(spans, sc.RUN_METRICS_SPAN)
    assert {e.span_id for e in step["loss"].exemplars} <= metrics_spans
    assert step["loss"].exemplars

    counted = {dict(p.attributes)[sc.EPISODE_OK]: p.value for p in found[sc.METRIC_EPISODES]}
    assert sum(counted.values()) == STEPS * PER_STEP and counted[True] > 0
    episode_spans = span_ids(spans, "episode")
    rewards = found[sc.METRIC_EPISODE_REWARD]
    assert sum(p.count for p in rewards) > 0
    exemplars = {e.span_id for p in rewards for e in p.exemplars}
    assert exemplars and exemplars <= episode_spans
    scores = {dict(p.attributes)[sc.REWARD_NAME] for p in found[sc.METRIC_EPISODE_SCORE]}
    assert {"correct", "format", "brevity"} <= scores


def test_model_calls_feed_the_genai_client_histograms() -> None:
    reader = InMemoryMetricReader()
    run, _ = training_run(meter_provider=MeterProvider(metric_readers=[reader]))
    run.finish()  # flushes the provider: the last of them are collected
    found = points(reader)

    usage = found[sc.GEN_AI_CLIENT_TOKEN_USAGE]
    assert {dict(p.attributes)[sc.GEN_AI_TOKEN_TYPE] for p in usage} == {"input", "output"}
    for point in usage:
        attributes = dict(point.attributes)
        assert attributes[sc.GEN_AI_OPERATION_NAME] == "chat"
        assert attributes[sc.GEN_AI_PROVIDER_NAME] == "openai"
        assert attributes[sc.GEN_AI_REQUEST_MODEL]
        assert sc.GEN_AI_RESPONSE_MODEL not in attributes
    durations = found[sc.GEN_AI_CLIENT_OPERATION_DURATION]
    assert sum(p.count for p in durations) > 0
    failed = [p for p in durations if sc.ERROR_TYPE in dict(p.attributes)]
    assert all(dict(p.attributes)[sc.ERROR_TYPE] == "ProviderTimeout" for p in failed)


def test_the_run_emits_evaluation_events_on_its_logger_provider() -> None:
    logs = InMemoryLogRecordExporter()
    provider = LoggerProvider()
    provider.add_log_record_processor(SimpleLogRecordProcessor(logs))
    run, spans = training_run(logger_provider=provider)
    run.finish()

    episode_spans = {
        (s.context.trace_id, s.context.span_id)
        for s in spans.get_finished_spans()
        if s.context is not None and s.name.startswith("episode")
    }
    events = [item.log_record for item in logs.get_finished_logs()]
    assert events and all(e.event_name == sc.GEN_AI_EVALUATION_EVENT for e in events)
    assert {(e.trace_id, e.span_id) for e in events} <= episode_spans
    # A provider the caller gave stays the caller's: flushed, not shut down.
    provider.get_logger("the-callers").emit(LogRecord(body="still open"))
    assert logs.get_finished_logs()[-1].log_record.body == "still open"


def test_without_exporters_configured_a_run_has_no_metrics_or_events() -> None:
    run = start_run(name="quiet", environments=["gsm8k"])
    assert run.meter_provider is None and run.logger_provider is None
    run.finish()


def test_every_span_of_the_run_links_to_its_start() -> None:
    spans = InMemorySpanExporter()
    run = start_run(name="linked", kind="train", model="m", environments=["gsm8k"])
    run.tracer_provider.add_span_processor(SimpleSpanProcessor(spans))
    for record in synthetic_episodes(3, seed=4):
        run.record_episode(record)
    run.log_metrics({"loss": 0.5}, step=0)
    run.finish()

    start = run.start_link
    assert start is not None and start.is_valid
    linked: list[ReadableSpan] = [
        s
        for s in spans.get_finished_spans()
        if s.name.startswith("episode") or s.name in (sc.RUN_METRICS_SPAN, sc.RUN_END_SPAN)
    ]
    assert len(linked) == 3 + 2
    for span in linked:
        assert [(link.context.trace_id, link.context.span_id) for link in span.links] == [
            (start.trace_id, start.span_id)
        ]
        # Each is still a trace of its own: a link, not a parent.
        assert span.context is not None and span.context.trace_id != start.trace_id


class OtlpHttpSink:
    """An OTLP/HTTP receiver on loopback that keeps the metrics and logs it gets."""

    def __init__(self) -> None:
        self.metrics: list[ExportMetricsServiceRequest] = []
        self.logs: list[ExportLogsServiceRequest] = []
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                if self.path == "/v1/metrics":
                    sink.metrics.append(ExportMetricsServiceRequest.FromString(body))
                elif self.path == "/v1/logs":
                    sink.logs.append(ExportLogsServiceRequest.FromString(body))
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                return None

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def sink() -> Iterator[OtlpHttpSink]:
    receiver = OtlpHttpSink()
    yield receiver
    receiver.close()


def test_otel_metrics_and_logs_exporter_send_them_over_otlp(
    monkeypatch: pytest.MonkeyPatch, sink: OtlpHttpSink
) -> None:
    monkeypatch.setenv("OTEL_METRICS_EXPORTER", "otlp")
    monkeypatch.setenv("OTEL_LOGS_EXPORTER", "otlp")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", sink.url)
    run, _ = training_run()
    assert run.meter_provider is not None and run.logger_provider is not None
    result = run.finish()  # the run's own providers are shut down: what they hold goes out
    assert result.closed

    names = {
        metric.name
        for request in sink.metrics
        for resource_metrics in request.resource_metrics
        for scope_metrics in resource_metrics.scope_metrics
        for metric in scope_metrics.metrics
    }
    assert {sc.METRIC_STEP, sc.METRIC_EPISODE_REWARD, sc.GEN_AI_CLIENT_TOKEN_USAGE} <= names
    resources = [
        {kv.key: kv.value.string_value for kv in resource_logs.resource.attributes}
        for request in sink.logs
        for resource_logs in request.resource_logs
    ]
    assert resources and all(r["prime.run.id"] == run.id for r in resources)
    events = [
        record.event_name
        for request in sink.logs
        for resource_logs in request.resource_logs
        for scope_logs in resource_logs.scope_logs
        for record in scope_logs.log_records
    ]
    assert events and set(events) == {sc.GEN_AI_EVALUATION_EVENT}


PROCESS_PROVIDERS = """
from opentelemetry import _logs, metrics
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import InMemoryLogRecordExporter, SimpleLogRecordProcessor
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

import prime_runs_otel as pro
from prime_runs_otel.produce.synthetic import synthetic_episodes

# What opentelemetry-instrument's configurator does: the process's providers.
reader = InMemoryMetricReader()
metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
logs = InMemoryLogRecordExporter()
logger_provider = LoggerProvider()
logger_provider.add_log_record_processor(SimpleLogRecordProcessor(logs))
_logs.set_logger_provider(logger_provider)

with pro.start_run(name="borrowed", environments=["gsm8k"]) as run:
    assert run.meter_provider is metrics.get_meter_provider()
    assert run.logger_provider is _logs.get_logger_provider()
    for record in synthetic_episodes(3, seed=1):
        run.record_episode(record)
data = reader.get_metrics_data()
names = {m.name for r in data.resource_metrics for s in r.scope_metrics for m in s.metrics}
assert "prime.run.episode.reward" in names, names
assert logs.get_finished_logs()
print("reported through the process's providers")
"""


def test_a_process_with_sdk_providers_gets_the_run_s_signals_through_them(
    tmp_path: Path,
) -> None:
    """Under opentelemetry-instrument the process has SDK providers built from
    the same variables: the run reports through them instead of opening a
    second pipeline to the same (here unreachable) endpoint."""
    script = tmp_path / "borrowed.py"
    script.write_text(PROCESS_PROVIDERS)
    done = subprocess.run(
        [sys.executable, str(script)],
        env={
            **os.environ,
            "PRIME_RUNS_MODE": "local",
            "PRIME_RUNS_OTEL_DIR": str(tmp_path / "spool"),
            "OTEL_METRICS_EXPORTER": "otlp",
            "OTEL_LOGS_EXPORTER": "otlp",
            "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9",
        },
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "reported through the process's providers" in done.stdout
    assert "Failed to export" not in done.stderr
