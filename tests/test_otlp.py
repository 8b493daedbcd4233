"""OTLP decoding: protobuf and OTLP/JSON requests become the same span views
the in-process exporter builds from SDK spans; malformed bodies of every kind
are answered with a 4xx, never a crash (fuzzed with hypothesis)."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import gzip
import json
import os
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
from google.protobuf import json_format
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Status, StatusCode

from prime_runs_otel import emit_run_end, emit_run_start, record_episode, run_resource
from prime_runs_otel.collector.http_front import OtlpHttpApp
from prime_runs_otel.collector.receiver import Receiver
from prime_runs_otel.collector.receiver_config import ReceiverConfig
from prime_runs_otel.config import resolve_settings
from prime_runs_otel.produce.synthetic import synthetic_episodes
from prime_runs_otel.read.episodes import EpisodeArrival
from prime_runs_otel.read.ingest import group_by_run
from prime_runs_otel.read.otlp import (
    OtlpDecodeError,
    any_value,
    decode_json,
    decode_protobuf,
    span_count,
    span_views,
)
from prime_runs_otel.read.records import RunEnd, RunStart
from prime_runs_otel.read.spans import SpanView, from_readable_span


def sdk_spans(records: Sequence[dict[str, Any]], run_id: str = "run-1") -> list[ReadableSpan]:
    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=run_resource(run_id=run_id, environments=["env"]))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("test")
    emit_run_start(tracer, {"lr": 0.1})
    for record in records:
        record_episode(tracer, record)
    with tracer.start_as_current_span(
        "mixed",
        attributes={
            "s": "text",
            "b": True,
            "i": -(2**62),
            "f": 0.25,
            "ss": ["a", "b"],
            "bs": [True, False],
            "is": [1, 2, 3],
            "fs": [0.5, 1.5],
        },
    ) as span:
        span.set_status(Status(StatusCode.ERROR, "it broke"))
    emit_run_end(tracer, "failed", "boom", episodes_recorded=len(records))
    provider.shutdown()
    return list(memory.get_finished_spans())


def hex_ids(request: ExportTraceServiceRequest) -> dict[str, Any]:
    document = json_format.MessageToDict(request)
    for resource_spans in document["resourceSpans"]:
        for scope_spans in resource_spans["scopeSpans"]:
            for span in scope_spans["spans"]:
                for key in ("traceId", "spanId", "parentSpanId"):
                    if key in span:
                        span[key] = base64.b64decode(span[key]).hex().upper()
    return document


@pytest.fixture(scope="module")
def spans() -> list[ReadableSpan]:
    return sdk_spans(list(synthetic_episodes(3, seed=5)))


def test_protobuf_views_equal_the_in_process_views(spans: list[ReadableSpan]) -> None:
    body = encode_spans(spans).SerializeToString()
    request = decode_protobuf(body)

    received = list(span_views(request))

    assert span_count(request) == len(spans) == len(received)
    expected = {view.span_id: view for view in map(from_readable_span, spans)}
    for view in received:
        assert not view.in_process, "a span that came over OTLP crossed a process boundary"
        assert plain(view) == {**plain(expected[view.span_id]), "in_process": False}


def plain(view: SpanView) -> dict[str, Any]:
    values = {field.name: getattr(view, field.name) for field in dataclasses.fields(view)}
    values["attributes"] = dict(view.attributes)
    values["resource"] = dict(view.resource)
    return values


def test_attribute_values_are_held_as_the_sdk_holds_them(spans: list[ReadableSpan]) -> None:
    received = {view.name: view for view in span_views(encode_spans(spans))}
    mixed = received["mixed"]
    assert dict(mixed.attributes) == {
        "s": "text",
        "b": True,
        "i": -(2**62),
        "f": 0.25,
        "ss": ("a", "b"),
        "bs": (True, False),
        "is": (1, 2, 3),
        "fs": (0.5, 1.5),
    }
    assert mixed.status_error and mixed.status_message == "it broke"
    assert mixed.parent_span_id is None
    assert received["prime.run.end"].resource["prime.run.id"] == "run-1"


def test_json_with_hex_ids_decodes_to_the_same_request(spans: list[ReadableSpan]) -> None:
    request = encode_spans(spans)
    body = json.dumps(hex_ids(request)).encode()

    assert decode_json(body) == request


def test_records_are_read_unchanged_from_received_spans(spans: list[ReadableSpan]) -> None:
    records = list(synthetic_episodes(3, seed=5))
    request = decode_json(json.dumps(hex_ids(encode_spans(spans))).encode())

    grouped = group_by_run(span_views(request))

    (batch,) = grouped.batches
    assert batch.identity.local_id == "run-1"
    assert isinstance(batch.start, RunStart) and batch.start.config == {"lr": 0.1}
    assert isinstance(batch.end, RunEnd) and batch.end.status == "failed"
    assert [episode.record for episode in batch.episodes] == records
    assert all(isinstance(episode, EpisodeArrival) for episode in batch.episodes)


def test_kvlist_bytes_and_empty_values() -> None:
    value = AnyValue()
    value.kvlist_value.values.append(KeyValue(key="k", value=AnyValue(bytes_value=b"\x00\x01")))
    value.kvlist_value.values.append(KeyValue(key="empty", value=AnyValue()))
    assert any_value(value) == {"k": b"\x00\x01"}
    array = AnyValue()
    array.array_value.values.extend([AnyValue(int_value=1), AnyValue(string_value="x")])
    assert any_value(array) == (1, "x")
    assert any_value(AnyValue()) is None


def test_spans_of_one_resource_share_one_resource_mapping() -> None:
    spans = sdk_spans([])
    views = list(span_views(encode_spans(spans)))
    assert len({id(view.resource) for view in views}) == 1


def one_span(span: dict[str, Any]) -> dict[str, Any]:
    return {"resourceSpans": [{"scopeSpans": [{"spans": [span]}]}]}


@pytest.mark.parametrize(
    ("document", "says"),
    [
        ({"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": "zz"}]}]}]}, "not a hex"),
        ({"resourceSpans": [{"scopeSpans": [{"spans": [{"spanId": "abc"}]}]}]}, "not a hex"),
        ({"resourceSpans": [{"scopeSpans": [{"spans": [{"name": 5}]}]}]}, "OTLP/JSON"),
        (
            {"resourceSpans": [{"scopeSpans": [{"spans": [{"startTimeUnixNano": "soon"}]}]}]},
            "OTLP/JSON",
        ),
    ],
)
def test_bad_json_is_a_decode_error(document: dict[str, Any], says: str) -> None:
    with pytest.raises(OtlpDecodeError, match=says):
        decode_json(json.dumps(document).encode())


def test_unknown_json_fields_are_ignored() -> None:
    document = {"resourceSpans": [], "futureField": {"x": 1}}
    assert decode_json(json.dumps(document).encode()) == ExportTraceServiceRequest()


def test_deeply_nested_inputs_are_decode_errors() -> None:
    with pytest.raises(OtlpDecodeError):
        decode_json(b"[" * 100_000 + b"]" * 100_000)
    # An attribute value nested 300 arrays deep, encoded by hand (protobuf
    # refuses to build it): AnyValue.array_value = 5, ArrayValue.values = 1.
    value = b""
    for _ in range(300):
        value = field(5, field(1, value))
    key_value = field(1, b"deep") + field(2, value)
    resource = field(1, key_value)  # Resource.attributes
    body = field(1, field(1, resource))  # request.resource_spans[].resource
    with pytest.raises(OtlpDecodeError):
        decode_protobuf(body)


def field(number: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field."""
    return bytes([number << 3 | 2]) + varint(len(payload)) + payload


def varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


# -- the HTTP front, fuzzed --------------------------------------------------------------


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OtlpHttpApp]:
    """The receiver's ASGI app over a real local-mode spool, called in process
    (no sockets are served) so thousands of bodies take seconds."""
    root = tmp_path_factory.mktemp("fuzz")
    settings_ = resolve_settings(mode="local", spool_dir=root)
    receiver = Receiver(
        ReceiverConfig(http_port=0, grpc_port=None, max_body_bytes=1024 * 1024), settings_
    )
    yield OtlpHttpApp(receiver)
    receiver.spool.close()


def answer(app: OtlpHttpApp, body: bytes, content_type: str, encoding: str = "") -> int:
    headers = [(b"content-type", content_type.encode())]
    if encoding:
        headers.append((b"content-encoding", encoding.encode()))
    scope = {"type": "http", "method": "POST", "path": "/v1/traces", "headers": headers}
    sent: list[dict[str, Any]] = []
    chunks = [body[: len(body) // 2], body[len(body) // 2 :]]

    async def receive() -> dict[str, Any]:
        chunk = chunks.pop(0) if chunks else b""
        return {"type": "http.request", "body": chunk, "more_body": bool(chunks)}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    asyncio.run(app(scope, receive, send))
    status: int = sent[0]["status"]
    return status


def json_values() -> st.SearchStrategy[Any]:
    scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20)
    return st.recursive(
        scalars,
        lambda inner: (
            st.lists(inner, max_size=4)
            | st.dictionaries(
                st.sampled_from(
                    [
                        "resourceSpans",
                        "scopeSpans",
                        "spans",
                        "attributes",
                        "resource",
                        "key",
                        "value",
                        "stringValue",
                        "intValue",
                        "arrayValue",
                        "kvlistValue",
                        "bytesValue",
                        "values",
                        "traceId",
                        "spanId",
                        "parentSpanId",
                        "links",
                        "status",
                        "code",
                        "name",
                        "startTimeUnixNano",
                    ]
                )
                | st.text(max_size=8),
                inner,
                max_size=4,
            )
        ),
        max_leaves=30,
    )


#: Bodies drawn per fuzz test and run of the suite: 300 reach every branch of
#: the decoders (each run draws new ones; the shrunk failure is what a bug
#: shows), at a fifth of the CPU 1,500 took on the two cores the suite shares.
#: `make soak-serve` draws thousands.
FUZZ_EXAMPLES = int(os.environ.get("PRIME_RUNS_OTEL_FUZZ_EXAMPLES", "300"))
FUZZ = settings(
    max_examples=FUZZ_EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)


@FUZZ
@given(body=st.binary(max_size=2048))
def test_fuzz_random_protobuf_bodies_never_crash(app: OtlpHttpApp, body: bytes) -> None:
    status = answer(app, body, "application/x-protobuf")
    try:
        decode_protobuf(body)
    except OtlpDecodeError:
        assert status == 400
    else:
        assert status in (200, 400)  # a valid request: accepted, or refused as orphaned


@FUZZ
@given(document=json_values())
def test_fuzz_json_documents_never_crash(app: OtlpHttpApp, document: Any) -> None:
    body = json.dumps(document).encode()
    status = answer(app, body, "application/json")
    try:
        decode_json(body)
    except OtlpDecodeError:
        assert status == 400
    else:
        assert status in (200, 400)


@FUZZ
@given(
    body=st.binary(max_size=1024),
    encoding=st.sampled_from(["gzip", "deflate", "zstd", "identity"]),
    content_type=st.sampled_from(["application/x-protobuf", "application/json", "text/plain"]),
    truncate=st.integers(min_value=0, max_value=64),
)
def test_fuzz_encoded_and_truncated_bodies_get_a_4xx(
    app: OtlpHttpApp, body: bytes, encoding: str, content_type: str, truncate: int
) -> None:
    payload = gzip.compress(body)[: -truncate or None] if encoding == "gzip" else body
    status = answer(app, payload, content_type, encoding)
    assert status in (200, 400, 413, 415)
    if content_type == "text/plain" or encoding == "zstd":
        assert status == 415
