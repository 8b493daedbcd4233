"""A tracing backend beside the platform exporter, in process: it gets the
whole run (episode, agent and model-call spans) without the record and config
blobs, in requests under the OTLP limits, while the platform gets every
episode. A real SDK pipeline, the real OTLP/HTTP exporter and a stand-in
backend on loopback that refuses oversized requests as a collector does."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace.export import BatchSpanProcessor

import prime_runs_otel as pro
from prime_runs_otel import semconv as sc
from prime_runs_otel.produce.synthetic import synthetic_episodes
from prime_runs_otel.tracing import DEFAULT_MAX_VALUE_CHARS

#: The stand-in backend refuses larger requests (a collector's gRPC receiver
#: stops at 4 MiB by default; its HTTP receiver has a limit of its own).
BACKEND_LIMIT = 5 * 1024 * 1024
EPISODES = 8
RECORD_BYTES = 1024 * 1024


class _Backend(ThreadingHTTPServer):
    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.spans: list[dict[str, Any]] = []
        self.accepted: list[int] = []
        self.refused: list[int] = []
        self.lock = threading.Lock()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/v1/traces"


class _Handler(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        server: _Backend = self.server  # type: ignore[assignment]
        length = int(self.headers["Content-Length"])
        body = self.rfile.read(length)
        if length > BACKEND_LIMIT:
            with server.lock:
                server.refused.append(length)
            self._reply(413)
            return
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        with server.lock:
            server.accepted.append(length)
            for resource_spans in request.resource_spans:
                for scope_spans in resource_spans.scope_spans:
                    for span in scope_spans.spans:
                        server.spans.append(
                            {
                                "name": span.name,
                                "attributes": {kv.key: _value(kv.value) for kv in span.attributes},
                            }
                        )
        self._reply(200)

    def _reply(self, status: int) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass


def _value(value: Any) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [_value(item) for item in value.array_value.values]
    return getattr(value, kind) if kind else None


@pytest.fixture
def backend() -> Iterator[_Backend]:
    server = _Backend()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def _large_run(monkeypatch: pytest.MonkeyPatch) -> tuple[pro.Run, list[dict[str, Any]]]:
    # Content capture on: every model-call span carries the padded prompt too.
    monkeypatch.setenv(sc.CAPTURE_MESSAGE_CONTENT_ENV, "span_only")
    run = pro.start_run(
        name="large",
        environments=["gsm8k-demo"],
        mode="local",
        config={"note": "x" * 100_000},
    )
    records = list(synthetic_episodes(EPISODES, seed=5, target_bytes=RECORD_BYTES))
    return run, records


def test_a_backend_gets_the_run_without_records_in_requests_under_the_limit(
    backend: _Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    run, records = _large_run(monkeypatch)
    run.add_exporter(OTLPSpanExporter(endpoint=backend.endpoint))
    for record in records:
        run.record_episode(record)
    result = run.finish()

    assert result.episodes == EPISODES  # the platform side (the local store) has them all
    assert backend.refused == []
    assert len(backend.accepted) > 1 and max(backend.accepted) <= BACKEND_LIMIT
    names = [span["name"] for span in backend.spans]
    # The run-start span went out before the exporter was added; the rest follows.
    assert names.count("prime.run.end") == 1
    episodes = [s for s in backend.spans if sc.EPISODE_ID in s["attributes"]]
    assert sorted(s["attributes"][sc.EPISODE_ID] for s in episodes) == sorted(
        record["id"] for record in records
    )
    # Adding an exporter turned the rollout's child spans on.
    chats = [s for s in backend.spans if s["attributes"].get("gen_ai.operation.name") == "chat"]
    assert len(chats) >= EPISODES
    left_out = {
        sc.EPISODE_RECORD,
        sc.blob_size_key(sc.EPISODE_RECORD),
        sc.blob_sha256_key(sc.EPISODE_RECORD),
        sc.RUN_CONFIG,
        sc.blob_size_key(sc.RUN_CONFIG),
        sc.blob_sha256_key(sc.RUN_CONFIG),
    }
    for span in backend.spans:
        assert not left_out & set(span["attributes"])
    # The padded prompts were cut to a bound, and say so.
    inputs = [
        c["attributes"][sc.GEN_AI_INPUT_MESSAGES]
        for c in chats
        if sc.GEN_AI_INPUT_MESSAGES in c["attributes"]
    ]
    assert inputs and max(map(len, inputs)) <= DEFAULT_MAX_VALUE_CHARS + 100
    assert any(text.endswith("[truncated by prime-runs-otel]") for text in inputs)
    for episode in episodes:  # what a backend shows for the episode stays
        assert episode["attributes"][sc.OPENINFERENCE_SPAN_KIND] == "CHAIN"
        assert 0 < len(episode["attributes"][sc.INPUT_VALUE]) <= DEFAULT_MAX_VALUE_CHARS + 100


def test_a_plain_otlp_exporter_beside_it_loses_the_run(
    backend: _Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Why the wrapper exists: the same run through the bare exporter."""
    run, records = _large_run(monkeypatch)
    run.tracer_provider.add_span_processor(
        BatchSpanProcessor(OTLPSpanExporter(endpoint=backend.endpoint))
    )
    for record in records:
        run.record_episode(record)
    result = run.finish()

    assert result.episodes == EPISODES
    assert backend.refused
    received = {s["attributes"].get(sc.EPISODE_ID) for s in backend.spans}
    assert not {record["id"] for record in records} <= received


def test_the_limits_must_be_positive() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        pro.TracingExporter(OTLPSpanExporter(), max_batch_bytes=0)
