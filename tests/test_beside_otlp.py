"""The exporter beside an OTLP exporter (to Jaeger, Tempo, Langfuse, Phoenix):
both receive the same spans, and the gen_ai spans look right to a GenAI-aware
backend (attribute names and message JSON of the GenAI conventions)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

import prime_runs_otel as pro
from prime_runs_otel.produce.synthetic import synthetic_episodes
from prime_runs_otel.testing import FakePlatform


class _Collector(ThreadingHTTPServer):
    """A stand-in tracing backend: an OTLP/HTTP endpoint that keeps what it gets."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.spans: list[dict[str, Any]] = []


class _Handler(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        server: _Collector = self.server  # type: ignore[assignment]
        for resource_spans in request.resource_spans:
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    server.spans.append(
                        {
                            "name": span.name,
                            "attributes": {kv.key: _value(kv.value) for kv in span.attributes},
                        }
                    )
        self.send_response(200)
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
def backend() -> Iterator[_Collector]:
    server = _Collector()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def test_both_exporters_get_the_same_spans(
    online: FakePlatform, backend: _Collector, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "true")
    resource = pro.run_resource(name="beside", environments=["gsm8k-demo"], model="demo/m")
    provider = TracerProvider(resource=resource)
    ours = pro.PrimeRunsSpanExporter()
    provider.add_span_processor(BatchSpanProcessor(ours))
    endpoint = f"http://127.0.0.1:{backend.server_address[1]}/v1/traces"
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
    tracer = provider.get_tracer("beside")
    records = list(synthetic_episodes(8, seed=12))
    pro.emit_run_start(tracer, {})
    for record in records:
        pro.record_episode(tracer, record)
    pro.emit_run_end(tracer, "completed", episodes_recorded=len(records))
    provider.force_flush()
    run = ours.wait_closed(str(resource.attributes["prime.run.id"]), 60)
    provider.shutdown()

    assert run is not None and run.closed
    assert len(online.episodes(run.platform_id or "")) == len(records)

    names = [span["name"] for span in backend.spans]
    assert names.count("prime.run.start") == 1 and names.count("prime.run.end") == 1
    episode_spans = [s for s in backend.spans if "prime.episode.id" in s["attributes"]]
    assert sorted(s["attributes"]["prime.episode.id"] for s in episode_spans) == sorted(
        record["id"] for record in records
    )

    chats = [s for s in backend.spans if s["attributes"].get("gen_ai.operation.name") == "chat"]
    agents = [
        s for s in backend.spans if s["attributes"].get("gen_ai.operation.name") == "invoke_agent"
    ]
    assert chats and agents
    for chat in chats:
        attributes = chat["attributes"]
        assert chat["name"] == f"chat {attributes['gen_ai.request.model']}"
        assert isinstance(attributes["gen_ai.usage.input_tokens"], int)
        assert isinstance(attributes["gen_ai.usage.output_tokens"], int)
        assert isinstance(attributes["gen_ai.response.finish_reasons"], list)
        for key in ("gen_ai.input.messages", "gen_ai.output.messages"):
            messages = json.loads(attributes[key])
            assert messages and all(
                message["role"] and isinstance(message["parts"], list) for message in messages
            )
            for message in messages:
                for part in message["parts"]:
                    assert part["type"] in {
                        "text",
                        "tool_call",
                        "tool_call_response",
                        "reasoning",
                        "uri",
                        "blob",
                    }
    for agent in agents:
        assert agent["name"] == f"invoke_agent {agent['attributes']['gen_ai.agent.name']}"
