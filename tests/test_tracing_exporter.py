"""A tracing backend beside the platform exporter, in process: it gets the
whole run (episode, agent and model-call spans) without the record and config
blobs, in requests under the OTLP limits, while the platform gets every
episode. A real SDK pipeline, the real OTLP/HTTP exporter and a stand-in
backend on loopback that refuses oversized requests as a collector does."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Iterator, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

import prime_runs_otel as pro
from prime_runs_otel import semconv as sc
from prime_runs_otel.produce.synthetic import synthetic_episodes
from prime_runs_otel.tracing import DEFAULT_MAX_VALUE_CHARS, LEFT_OUT

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


class _Kept(SpanExporter):
    """The wrapped exporter: keeps each call's spans."""

    def __init__(self) -> None:
        self.calls: list[list[ReadableSpan]] = []

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.calls.append(list(spans))
        return SpanExportResult.SUCCESS


_VALUES = st.one_of(
    st.text(max_size=3000),
    st.integers(),
    st.floats(allow_nan=False),
    st.booleans(),
    st.lists(st.text(max_size=1500), max_size=4).map(tuple),
)
_KEYS = st.one_of(st.sampled_from(sorted(LEFT_OUT)), st.text(min_size=1, max_size=20))


@settings(max_examples=150, deadline=None)
@given(st.lists(st.dictionaries(_KEYS, _VALUES, max_size=8), max_size=30))
def test_no_span_is_lost_blobs_never_pass_and_batches_keep_the_budget(
    attribute_sets: list[dict[str, Any]],
) -> None:
    kept = _Kept()
    exporter = pro.TracingExporter(kept, max_batch_bytes=4000, max_value_chars=1000)
    spans = [
        ReadableSpan(name=f"s{index}", attributes=attributes, start_time=1, end_time=2)
        for index, attributes in enumerate(attribute_sets)
    ]
    assert exporter.export(spans) is SpanExportResult.SUCCESS

    sent = [span for call in kept.calls for span in call]
    assert [span.name for span in sent] == [span.name for span in spans]  # all, in order
    for call in kept.calls:
        assert call
        if len(call) > 1:  # only a span over the budget on its own goes alone
            assert sum(exporter._slim(span)[1] for span in call) <= 4000
    for original, out in zip(spans, sent, strict=True):
        given_attributes = dict(original.attributes or {})
        attributes = dict(out.attributes or {})
        assert not LEFT_OUT & set(attributes)
        assert set(attributes) == set(given_attributes) - LEFT_OUT
        for key, value in attributes.items():
            if isinstance(value, str):
                assert len(value) <= 1000 + len("…[truncated by prime-runs-otel]")
                assert given_attributes[key].startswith(value.split("…[truncated")[0])
            elif not isinstance(value, tuple):
                assert value == given_attributes[key]


EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def test_zero_code_names_a_backend_beside_the_platform(backend: _Backend) -> None:
    env = {
        **os.environ,
        "OTEL_TRACES_EXPORTER": "prime_runs,otlp_without_records",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": backend.endpoint,
        # opentelemetry-distro makes it grpc unless told: the backend speaks HTTP.
        "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
        "OTEL_METRICS_EXPORTER": "none",
        "OTEL_LOGS_EXPORTER": "none",
        "PRIME_RUNS_MODE": "local",
        "OTEL_RESOURCE_ATTRIBUTES": (
            "prime.run.id=zero-code-beside,prime.run.environments=gsm8k-demo"
        ),
    }
    done = subprocess.run(
        [
            str(Path(sys.executable).parent / "opentelemetry-instrument"),
            sys.executable,
            str(EXAMPLES / "zero_code.py"),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr
    episodes = [s for s in backend.spans if sc.EPISODE_ID in s["attributes"]]
    assert len(episodes) == 15
    for span in backend.spans:
        assert not LEFT_OUT & set(span["attributes"])
    assert any(s["attributes"].get("gen_ai.operation.name") == "chat" for s in backend.spans)


# -- otlp_without_records over gRPC, and the shutdown budget ---------------------------------


def test_otlp_without_records_speaks_grpc_when_the_protocol_says_so(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from test_otelcol import OtlpSink

    from prime_runs_otel.tracing import OTLPTracingExporter

    grpc_backend = OtlpSink()
    try:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{grpc_backend.port}")
        exporter = OTLPTracingExporter()
        with pro.start_run(name="grpc-beside", environments=["gsm8k"], mode="local") as run:
            run.add_exporter(exporter)
            for record in synthetic_episodes(3, seed=12):
                run.record_episode(record)
        names = [span.name for request in grpc_backend.requests for span in _spans_of(request)]
        assert sum(name.startswith("episode") for name in names) == 3
        assert "prime.run.end" in names
        assert not any(set(attributes) & LEFT_OUT for _, attributes in grpc_backend.spans())
    finally:
        grpc_backend.stop()


def _spans_of(request: ExportTraceServiceRequest) -> Iterator[Any]:
    for resource_spans in request.resource_spans:
        for scope_spans in resource_spans.scope_spans:
            yield from scope_spans.spans


def test_otlp_without_records_refuses_a_protocol_it_does_not_speak(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from prime_runs_otel.errors import ConfigError
    from prime_runs_otel.tracing import OTLPTracingExporter

    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/json")
    with pytest.raises(ConfigError, match="OTEL_EXPORTER_OTLP_TRACES_PROTOCOL='http/json'"):
        OTLPTracingExporter()


class _Budgeted(SpanExporter):
    """An exporter whose shutdown takes the SDK's budget, and says what it got."""

    def __init__(self) -> None:
        self.budgets: list[float | None] = []

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return SpanExportResult.SUCCESS

    def shutdown(self, timeout_millis: float | None = None) -> None:
        self.budgets.append(timeout_millis)


def test_shutdown_hands_the_sdk_budget_on() -> None:
    from prime_runs_otel.tracing import TracingExporter

    inner = _Budgeted()
    processor = BatchSpanProcessor(TracingExporter(inner))
    processor.shutdown()  # the SDK's batch processor passes what is left of its 30 s
    (budget,) = inner.budgets
    assert budget is not None and 0 < budget <= 30_000
