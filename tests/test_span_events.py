"""Span events survive every way spans reach the consumer: SDK spans in
process, OTLP protobuf and OTLP/JSON behind a collector. Synthesis reads
evaluation results and exceptions off them, so each path must carry them
alike."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
from google.protobuf import json_format
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from prime_runs_otel import run_resource
from prime_runs_otel import semconv as sc
from prime_runs_otel.produce.traced_episode import episode_span, score_episode
from prime_runs_otel.read.checks import run_identity
from prime_runs_otel.read.otlp import decode_json, decode_protobuf, span_views
from prime_runs_otel.read.spans import SpanEventView, SpanView, from_readable_span
from prime_runs_otel.read.synthesis import synthesize_record

EVALUATION: dict[str, Any] = {
    sc.GEN_AI_EVALUATION_NAME: "relevance",
    sc.GEN_AI_EVALUATION_SCORE: 0.75,
    "gen_ai.evaluation.score.label": "relevant",
    "tags": ("a", "b"),
}
AT = 1_767_225_600_123_456_789


def produced_spans() -> list[ReadableSpan]:
    """An episode that failed after a scored model call, and a span without events."""
    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=run_resource(run_id="events", environments=["arith"]))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("test")
    with pytest.raises(ValueError), episode_span(tracer, example_id=3, env="arith") as episode:
        score_episode(episode, 0.5)
        with tracer.start_as_current_span(
            "chat policy",
            attributes={
                sc.GEN_AI_OPERATION_NAME: "chat",
                sc.GEN_AI_INPUT_MESSAGES: json.dumps(
                    [{"role": "user", "parts": [{"type": "text", "content": "2+2?"}]}]
                ),
                sc.GEN_AI_OUTPUT_MESSAGES: json.dumps(
                    [{"role": "assistant", "parts": [{"type": "text", "content": "4"}]}]
                ),
            },
        ) as call:
            call.add_event(sc.GEN_AI_EVALUATION_EVENT, EVALUATION, timestamp=AT)
        with tracer.start_as_current_span("plain"):
            pass
        raise ValueError("the grader crashed")
    provider.shutdown()
    return list(memory.get_finished_spans())


@pytest.fixture(scope="module")
def sdk_spans() -> list[ReadableSpan]:
    return produced_spans()


def by_name(views: Any) -> dict[str, SpanView]:
    return {view.name: view for view in views}


def plain_events(view: SpanView) -> list[tuple[str, int, dict[str, Any]]]:
    return [(event.name, event.time_ns, dict(event.attributes)) for event in view.events]


def test_sdk_events_are_on_the_view(sdk_spans: list[ReadableSpan]) -> None:
    views = by_name(map(from_readable_span, sdk_spans))

    [evaluation] = views["chat policy"].events
    assert evaluation == SpanEventView(sc.GEN_AI_EVALUATION_EVENT, AT, EVALUATION)
    [exception] = views["episode arith"].events
    assert exception.name == "exception" and exception.time_ns > 0
    assert exception.attributes["exception.type"] == "ValueError"
    assert exception.attributes["exception.message"] == "the grader crashed"
    assert "Traceback" in exception.attributes["exception.stacktrace"]
    assert views["plain"].events == ()


def otlp_json(spans: list[ReadableSpan]) -> bytes:
    """OTLP/JSON as a collector writes it: camelCase, hex ids, string nanos."""
    document = json_format.MessageToDict(encode_spans(spans))
    for resource_spans in document["resourceSpans"]:
        for scope_spans in resource_spans["scopeSpans"]:
            for span in scope_spans["spans"]:
                for key in ("traceId", "spanId", "parentSpanId"):
                    if key in span:
                        span[key] = base64.b64decode(span[key]).hex()
    return json.dumps(document).encode()


@pytest.mark.parametrize("encoding", ["protobuf", "json"])
def test_otlp_events_equal_the_sdk_events(sdk_spans: list[ReadableSpan], encoding: str) -> None:
    if encoding == "protobuf":
        request = decode_protobuf(encode_spans(sdk_spans).SerializeToString())
    else:
        request = decode_json(otlp_json(sdk_spans))

    received = by_name(span_views(request))

    expected = by_name(map(from_readable_span, sdk_spans))
    assert received.keys() == expected.keys()
    for name, view in received.items():
        assert plain_events(view) == plain_events(expected[name]), name
    assert received["chat policy"].events[0].attributes["tags"] == ("a", "b")


def test_synthesis_reads_events_from_received_spans(sdk_spans: list[ReadableSpan]) -> None:
    request = decode_protobuf(encode_spans(sdk_spans).SerializeToString())
    views = by_name(span_views(request))
    root = views.pop("episode arith")

    record = synthesize_record(root, list(views.values()), run_identity(root.resource))

    [trace] = record["traces"]
    assert record["ok"] is False
    [error] = record["errors"]
    assert error["type"] == "ValueError"
    assert "Traceback" in error["traceback"]
    # The episode's reward is the total; the evaluation event travels as a metric.
    assert trace["rewards"] == {"reward": {"score": 0.5, "weight": 1.0}}
    assert trace["metrics"]["relevance"] == 0.75
