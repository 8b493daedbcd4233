"""Every shipped collector config on the real OpenTelemetry Collector (the
distribution of collector-config/builder.yaml, ``OTELCOL_BIN``), end to end:
producers → collector(s) → ``serve`` → the fake platform, with kills.

- gateway.yaml: ``serve`` killed -9 mid-run, then the collector killed -9
  while its disk queue holds what ``serve`` has not taken; both restarted.
- agent.yaml → gateway.yaml: the gateway killed -9 while the agent queues,
  then the agent killed -9 with its disk queue full; both restarted.
- fanout-jaeger.yaml: a second OTLP receiver standing in for Jaeger gets the
  spans without record blobs; the platform gets every episode whole.

Each collector runs the shipped file as it is; the tests set the variables it
reads (addresses, queue folder) and add one overlay file only where the
shipped value is about production pace (retry intervals), and one that moves the
collector's own metrics off port 8888 so several run on one machine.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator, Sequence
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
import yaml
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from test_collector import Producer, resource
from test_collector_config import CONFIG_DIR, otelcol_bin
from test_receiver import (
    ServeProcess,
    assert_delivered_once,
    closed_run,
    free_port,
    serve_env,
    wait_for,
)

from prime_runs_otel import emit_run_end, emit_run_start
from prime_runs_otel.config import DEFAULT_SPOOL_MAX_BYTES
from prime_runs_otel.deliver.spool import Spool
from prime_runs_otel.produce.synthetic import synthetic_episodes
from prime_runs_otel.testing import FakePlatform

TOKEN = "collector-test-token"


class Otelcol:
    """One collector process on free loopback ports, restartable on the same
    ports and queue folder (as a supervisor would bring it back)."""

    def __init__(self, root: Path, name: str, configs: Sequence[Path], env: dict[str, str]) -> None:
        self.binary = otelcol_bin()
        self.name = name
        self.grpc_port = free_port()
        self.http_port = free_port()
        self.health_port = free_port()
        self.queue_dir = root / f"{name}-queue"
        # The collector's own metrics listen on :8888 unless told otherwise;
        # several collectors on one machine each need their own port.
        metrics = {
            "readers": [
                {"pull": {"exporter": {"prometheus": {"host": "127.0.0.1", "port": free_port()}}}}
            ]
        }
        telemetry = overlay(
            root, f"{name}-telemetry", {"service": {"telemetry": {"metrics": metrics}}}
        )
        self.configs = [*configs, telemetry]
        self.log_path = root / f"{name}.log"
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(("PRIME_", "OTEL_"))}
        self.env.update(
            PRIME_RUNS_OTEL_OTLP_GRPC_ENDPOINT=self.endpoint,
            PRIME_RUNS_OTEL_OTLP_HTTP_ENDPOINT=f"127.0.0.1:{self.http_port}",
            PRIME_RUNS_OTEL_HEALTH_ENDPOINT=f"127.0.0.1:{self.health_port}",
            PRIME_RUNS_OTEL_QUEUE_DIR=str(self.queue_dir),
            **env,
        )
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def start(self) -> Otelcol:
        command = [self.binary, *(f"--config={path}" for path in self.configs)]
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(command, env=self.env, stdout=log, stderr=log)
        wait_for(self._healthy, 60, f"{self.name} to be healthy:\n{self.log()}")
        return self

    def _healthy(self) -> bool:
        assert self.process is not None
        assert self.process.poll() is None, f"{self.name} exited:\n{self.log()}"
        try:
            return httpx.get(f"http://127.0.0.1:{self.health_port}/", timeout=1).is_success
        except httpx.HTTPError:
            return False

    def kill(self) -> None:
        """SIGKILL: no shutdown, no flush; only what is on disk survives."""
        assert self.process is not None
        self.process.kill()
        self.process.wait(timeout=30)
        self.process = None

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=30)
        self.process = None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


def overlay(root: Path, name: str, document: dict[str, Any]) -> Path:
    """A second --config file merged over the shipped one."""
    path = root / f"{name}-overlay.yaml"
    path.write_text(yaml.safe_dump(document))
    return path


def fast_retries(root: Path, name: str, exporter: str) -> Path:
    """Retry every 100 ms to 1 s instead of up to 30 s: the outages here last
    seconds. The queue and its unlimited retrying stay as shipped."""
    retry = {"initial_interval": "100ms", "max_interval": "1s"}
    return overlay(root, name, {"exporters": {exporter: {"retry_on_failure": retry}}})


@pytest.fixture
def cleanup() -> Iterator[list[Any]]:
    """Everything started in a test, stopped at its end (collectors first)."""
    started: list[Any] = []
    yield started
    for thing in reversed(started):
        if isinstance(thing, Otelcol):
            thing.stop()
        elif isinstance(thing, ServeProcess) and thing.process is not None:
            thing.stop(signal.SIGKILL)


def start_serve(root: Path, platform: FakePlatform, cleanup: list[Any]) -> ServeProcess:
    root.mkdir(parents=True, exist_ok=True)
    serve = ServeProcess(root, serve_env(root, platform), "--token", TOKEN).start()
    cleanup.append(serve)
    return serve


def gateway(root: Path, name: str, serve: ServeProcess, cleanup: list[Any]) -> Otelcol:
    collector = Otelcol(
        root,
        name,
        [CONFIG_DIR / "gateway.yaml", fast_retries(root, name, "otlphttp/serve")],
        {"PRIME_RUNS_OTEL_SERVE_URL": serve.url, "PRIME_RUNS_OTEL_SERVE_TOKEN": TOKEN},
    )
    cleanup.append(collector)
    return collector.start()


def queue_bytes(collector: Otelcol) -> int:
    return sum(path.stat().st_size for path in collector.queue_dir.rglob("*") if path.is_file())


def run_keys(serve: ServeProcess) -> set[str]:
    """The runs one serve instance holds in its spool."""
    spool = Spool(serve.root / "serve-spool" / "spool.sqlite3", max_bytes=DEFAULT_SPOOL_MAX_BYTES)
    try:
        return {run.local_id for run in spool.reading.runs()}
    finally:
        spool.close()


# -- gateway.yaml --------------------------------------------------------------------------


def test_gateway_survives_serve_and_itself_killed(
    tmp_path: Path, platform: FakePlatform, cleanup: list[Any]
) -> None:
    serve = start_serve(tmp_path / "serve", platform, cleanup)
    collector = gateway(tmp_path, "gateway", serve, cleanup)
    records = list(synthetic_episodes(60, seed=31))
    producer = Producer(collector.endpoint, resource("through-gateway"))
    emit_run_start(producer.tracer, {"collector": "gateway"})
    producer.episodes(records[:20])
    wait_for(platform.runs, 60, "the run to be created")

    # serve dies mid-run: the gateway keeps what it accepts on disk.
    serve.stop(signal.SIGKILL)
    producer.episodes(records[20:40])
    # The gateway answered only after its disk queue took the spans, so
    # killing it now loses nothing: they are read back on restart.
    collector.kill()
    assert queue_bytes(collector) > 0
    collector.start()
    producer.episodes(records[40:])
    emit_run_end(producer.tracer, "completed", episodes_recorded=len(records))
    producer.close()
    serve.start()

    run = closed_run(platform, "through-gateway", timeout=180)
    assert run.status == "COMPLETED"
    assert len(platform.runs()) == 1
    assert run.metadata["collector"] == "gateway"
    assert_delivered_once(platform, run, records)


# -- agent.yaml → gateway.yaml -----------------------------------------------------------


def test_agent_to_gateway_with_both_killed(
    tmp_path: Path, platform: FakePlatform, cleanup: list[Any]
) -> None:
    serve = start_serve(tmp_path / "serve", platform, cleanup)
    hub = gateway(tmp_path, "gateway", serve, cleanup)
    agent = Otelcol(
        tmp_path,
        "agent",
        [CONFIG_DIR / "agent.yaml", fast_retries(tmp_path, "agent", "otlp/gateway")],
        {"PRIME_RUNS_OTEL_GATEWAY": hub.endpoint, "PRIME_RUNS_OTEL_GATEWAY_INSECURE": "true"},
    )
    cleanup.append(agent)
    agent.start()
    records = list(synthetic_episodes(60, seed=37))
    producer = Producer(agent.endpoint, resource("through-agent"))
    emit_run_start(producer.tracer, {"collector": "agent"})
    producer.episodes(records[:20])
    wait_for(platform.runs, 60, "the run to be created")

    hub.kill()  # the gateway is gone; the agent queues on its disk
    producer.episodes(records[20:40])
    agent.kill()
    assert queue_bytes(agent) > 0
    agent.start()
    producer.episodes(records[40:])
    emit_run_end(producer.tracer, "completed", episodes_recorded=len(records))
    producer.close()
    hub.start()

    run = closed_run(platform, "through-agent", timeout=180)
    assert run.status == "COMPLETED"
    assert len(platform.runs()) == 1
    assert_delivered_once(platform, run, records)


# -- fanout-jaeger.yaml --------------------------------------------------------------------


class OtlpSink:
    """An OTLP/gRPC trace receiver that keeps every request: Jaeger's place."""

    def __init__(self) -> None:
        self.requests: list[ExportTraceServiceRequest] = []
        #: The protobuf size of each request, as Jaeger's 4 MiB limit counts it.
        self.sizes: list[int] = []
        self.port = free_port()
        self.server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=2),
            options=[("grpc.max_receive_message_length", 256 * 1024 * 1024)],
        )
        handler = grpc.unary_unary_rpc_method_handler(
            self._export,
            request_deserializer=ExportTraceServiceRequest.FromString,
            response_serializer=ExportTraceServiceResponse.SerializeToString,
        )
        self.server.add_generic_rpc_handlers(
            (
                grpc.method_handlers_generic_handler(
                    "opentelemetry.proto.collector.trace.v1.TraceService", {"Export": handler}
                ),
            )
        )
        self.server.add_insecure_port(f"127.0.0.1:{self.port}")
        self.server.start()

    def _export(
        self, request: ExportTraceServiceRequest, context: Any
    ) -> ExportTraceServiceResponse:
        self.requests.append(request)
        self.sizes.append(request.ByteSize())
        return ExportTraceServiceResponse()

    def spans(self) -> list[tuple[dict[str, Any], dict[str, Any]]]:
        """(resource attributes, span attributes) of every span received."""
        found = []
        for request in list(self.requests):
            for resource_spans in request.resource_spans:
                owner = {a.key: a.value for a in resource_spans.resource.attributes}
                for scope_spans in resource_spans.scope_spans:
                    for span in scope_spans.spans:
                        found.append((owner, {a.key: a.value for a in span.attributes}))
        return found

    def stop(self) -> None:
        self.server.stop(grace=None)


def test_fanout_sends_jaeger_spans_without_records_and_serve_everything(
    tmp_path: Path, platform: FakePlatform, cleanup: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Message content on the model-call spans: what Jaeger gets runs to megabytes.
    monkeypatch.setenv("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "span_only")
    jaeger = OtlpSink()
    try:
        serve = start_serve(tmp_path / "serve", platform, cleanup)
        collector = Otelcol(
            tmp_path,
            "fanout",
            [CONFIG_DIR / "fanout-jaeger.yaml"],
            {
                "PRIME_RUNS_OTEL_SERVE_URL": serve.url,
                "PRIME_RUNS_OTEL_SERVE_TOKEN": TOKEN,
                "JAEGER_OTLP_GRPC": f"127.0.0.1:{jaeger.port}",
            },
        )
        cleanup.append(collector)
        collector.start()
        records = list(synthetic_episodes(30, seed=53, target_bytes=100_000))
        producer = Producer(collector.endpoint, resource("fanout"))
        emit_run_start(producer.tracer, {"collector": "fanout"})
        producer.episodes(records)
        emit_run_end(producer.tracer, "completed", episodes_recorded=len(records))
        producer.close()

        run = closed_run(platform, "fanout", timeout=120)
        assert run.status == "COMPLETED"
        assert run.metadata["collector"] == "fanout"
        assert_delivered_once(platform, run, records)

        def episode_spans() -> list[dict[str, Any]]:
            return [attrs for _, attrs in jaeger.spans() if "prime.episode.id" in attrs]

        wait_for(lambda: len(episode_spans()) >= len(records), 60, "Jaeger to get the episodes")
        seen = episode_spans()
        assert sorted(a["prime.episode.id"].string_value for a in seen) == sorted(
            r["id"] for r in records
        )
        for owner, attrs in jaeger.spans():
            assert owner["prime.run.id"].string_value
            blobs = [k for k in attrs if k.startswith(("prime.episode.record", "prime.run.config"))]
            assert not blobs, blobs
        # Batched by bytes under Jaeger's 4 MiB gRPC limit, though all of it is more.
        assert sum(jaeger.sizes) > 4 * 1024 * 1024
        assert max(jaeger.sizes) <= 3 * 1024 * 1024
    finally:
        jaeger.stop()
