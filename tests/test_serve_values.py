"""What decoding a request may cost ``serve``: a body is weighed by the values
in it (spans, attributes, array elements), counted off the wire before it
is decoded, not only by its size. A few KiB of gzip can inflate to millions
of two-byte empty attributes, each of which takes protobuf and the span
view a few hundred bytes: such a body is refused with 413 before any of
that memory is spent."""

from __future__ import annotations

import gzip
import json
import signal
from collections.abc import Iterator
from typing import Any

import grpc
import httpx
import pytest
from google.protobuf.message import Message
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import (
    ExportLogsServiceRequest,
    ExportLogsServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span
from test_receiver import ServeProcess, otlp_json, protobuf_body, run_spans, serve_env

from prime_runs_otel.collector.bodies import LOGS_REQUEST, count_values
from prime_runs_otel.produce.synthetic import synthetic_episodes
from prime_runs_otel.read.otlp import OtlpTooManyValues, decode_json, decode_protobuf

LIMIT = 5_000


def _empty_attributes(count: int) -> ExportTraceServiceRequest:
    request = ExportTraceServiceRequest()
    scope = request.resource_spans.add().scope_spans.add()
    span = scope.spans.add(name="bomb", trace_id=b"\x01" * 16, span_id=b"\x02" * 8)
    span.attributes.extend(KeyValue() for _ in range(count))
    return request


def _empty_log_attributes(count: int) -> ExportLogsServiceRequest:
    request = ExportLogsServiceRequest()
    scope = request.resource_logs.add().scope_logs.add()
    record = scope.log_records.add(trace_id=b"\x01" * 16, span_id=b"\x02" * 8)
    record.attributes.extend(KeyValue() for _ in range(count))
    return request


@pytest.fixture(scope="module")
def serve(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    root = tmp_path_factory.mktemp("values")
    process = ServeProcess(root, serve_env(root, None), "--max-values", str(LIMIT)).start()
    try:
        yield process
    finally:
        process.stop(signal.SIGKILL)


def test_a_gzip_body_of_tiny_values_is_refused_with_413(serve: ServeProcess) -> None:
    body = gzip.compress(_empty_attributes(LIMIT * 10).SerializeToString())
    answer = httpx.post(
        serve.traces_url,
        content=body,
        headers={"content-type": "application/x-protobuf", "content-encoding": "gzip"},
        timeout=60,
    )
    assert answer.status_code == 413, answer.text
    assert "--max-values" in answer.text


def test_an_otlp_json_body_of_tiny_values_is_refused_with_413(serve: ServeProcess) -> None:
    document = {"resourceSpans": [{"scopeSpans": [{"spans": [{"attributes": [{}] * LIMIT}]}]}]}
    answer = httpx.post(
        serve.traces_url,
        content=json.dumps(document).encode(),
        headers={"content-type": "application/json"},
        timeout=60,
    )
    assert answer.status_code == 413, answer.text


def _grpc_export(serve: ServeProcess, service: str, body: Message, answer: type[Message]) -> Any:
    """One ``service/Export`` call of ``body``; its answer, or the RpcError."""
    with grpc.insecure_channel(f"127.0.0.1:{serve.grpc_port}") as channel:
        export = channel.unary_unary(
            f"/opentelemetry.proto.collector.{service}/Export",
            request_serializer=None,
            response_deserializer=answer.FromString,
        )
        try:
            return export(body.SerializeToString(), timeout=60)
        except grpc.RpcError as exc:
            return exc


def test_grpc_refuses_a_body_of_tiny_values_as_invalid(serve: ServeProcess) -> None:
    refused = _grpc_export(
        serve,
        "trace.v1.TraceService",
        _empty_attributes(LIMIT * 10),
        ExportTraceServiceResponse,
    )
    assert isinstance(refused, grpc.RpcError)
    assert refused.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "--max-values" in (refused.details() or "")


def test_logs_bodies_are_weighed_the_same_way(serve: ServeProcess) -> None:
    body = gzip.compress(_empty_log_attributes(LIMIT * 10).SerializeToString())
    answer = httpx.post(
        f"{serve.url}/v1/logs",
        content=body,
        headers={"content-type": "application/x-protobuf", "content-encoding": "gzip"},
        timeout=60,
    )
    assert answer.status_code == 413, answer.text
    document = {"resourceLogs": [{"scopeLogs": [{"logRecords": [{"attributes": [{}] * LIMIT}]}]}]}
    answer = httpx.post(
        f"{serve.url}/v1/logs",
        content=json.dumps(document).encode(),
        headers={"content-type": "application/json"},
        timeout=60,
    )
    assert answer.status_code == 413, answer.text
    service = "logs.v1.LogsService"
    refused = _grpc_export(
        serve, service, _empty_log_attributes(LIMIT * 10), ExportLogsServiceResponse
    )
    assert isinstance(refused, grpc.RpcError)
    assert refused.code() == grpc.StatusCode.INVALID_ARGUMENT
    taken = _grpc_export(serve, service, _empty_log_attributes(10), ExportLogsServiceResponse)
    assert isinstance(taken, ExportLogsServiceResponse)


def test_an_ordinary_request_under_the_limit_is_taken(serve: ServeProcess) -> None:
    spans = run_spans(list(synthetic_episodes(3, seed=4)), run_id="ordinary")
    answer = httpx.post(
        serve.traces_url,
        content=protobuf_body(spans),
        headers={"content-type": "application/x-protobuf"},
        timeout=60,
    )
    assert answer.status_code == 200
    assert not ExportTraceServiceResponse.FromString(answer.content).partial_success.rejected_spans


# -- the count itself ------------------------------------------------------------------


def _walked(message: Message) -> int:
    """The messages under ``message`` that become values, by walking the
    decoded tree: what count_values must find without decoding."""
    counted = 0
    for field, value in message.ListFields():
        if field.message_type is None or field.message_type.name == "Status":
            continue
        children = value if field.is_repeated else [value]
        for child in children:
            counted += 1 + _walked(child)
    return counted


def _nested_request() -> ExportTraceServiceRequest:
    request = ExportTraceServiceRequest()
    resource_spans = request.resource_spans.add()
    resource_spans.resource.attributes.add(key="prime.run.id", value=AnyValue(string_value="r"))
    scope_spans = resource_spans.scope_spans.add()
    scope_spans.scope.attributes.add(key="scope", value=AnyValue(int_value=1))
    span = Span(name="s", trace_id=b"\x01" * 16, span_id=b"\x02" * 8)
    array = AnyValue()
    array.array_value.values.extend([AnyValue(string_value="x" * 100_000), AnyValue(), AnyValue()])
    nested = AnyValue()
    nested.kvlist_value.values.add(key="in", value=array)
    span.attributes.extend([KeyValue(key="a", value=array), KeyValue(key="b", value=nested)])
    span.events.add(name="e").attributes.add(key="c", value=AnyValue(bool_value=True))
    span.links.add(trace_id=b"\x03" * 16).attributes.add(key="d", value=AnyValue())
    span.status.message = "ok"
    scope_spans.spans.extend([span, span])
    return request


def test_the_count_off_the_wire_is_the_decoded_tree() -> None:
    request = _nested_request()
    body = request.SerializeToString()
    assert count_values(body, 10**9) == _walked(request)
    records = ExportTraceServiceRequest.FromString(
        protobuf_body(run_spans(list(synthetic_episodes(5, seed=2)), run_id="walk"))
    )
    assert count_values(records.SerializeToString(), 10**9) == _walked(records)


def _any_values() -> st.SearchStrategy[AnyValue]:
    """AnyValues of every kind, nested, with strings long enough for
    lengths of two and three varint bytes."""
    leaves = st.one_of(
        st.text(max_size=3).map(lambda text: AnyValue(string_value=text)),
        st.integers(0, 20_000).map(lambda size: AnyValue(string_value="x" * size)),
        st.integers(-(2**63), 2**63 - 1).map(lambda number: AnyValue(int_value=number)),
        st.floats(allow_nan=False).map(lambda number: AnyValue(double_value=number)),
        st.booleans().map(lambda flag: AnyValue(bool_value=flag)),
        st.just(AnyValue()),
    )

    def nest(children: st.SearchStrategy[AnyValue]) -> st.SearchStrategy[AnyValue]:
        def array(values: list[AnyValue]) -> AnyValue:
            value = AnyValue()
            value.array_value.values.extend(values)
            return value

        def kvlist(values: list[AnyValue]) -> AnyValue:
            value = AnyValue()
            for index, item in enumerate(values):
                value.kvlist_value.values.add(key=f"k{index}", value=item)
            return value

        listed = st.lists(children, max_size=4)
        return st.one_of(listed.map(array), listed.map(kvlist))

    return st.recursive(leaves, nest, max_leaves=12)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(_any_values(), max_size=6), min_size=1, max_size=4))
def test_any_request_is_counted_as_its_decoded_tree(spans: list[list[AnyValue]]) -> None:
    """Counting reads one-byte varints inline and longer ones apart: every
    kind of value, nested, and lengths of one to three bytes count alike."""
    request = ExportTraceServiceRequest()
    scope_spans = request.resource_spans.add().scope_spans.add()
    for index, values in enumerate(spans):
        span = scope_spans.spans.add(name=f"s{index}", start_time_unix_nano=2**62 + index)
        for number, value in enumerate(values):
            span.attributes.add(key=f"a{number}", value=value)
        if values:
            span.events.add(name="e").attributes.add(key="v", value=values[0])
    assert count_values(request.SerializeToString(), 10**9) == _walked(request)


def test_a_logs_request_is_counted_by_its_own_layout() -> None:
    request = _empty_log_attributes(3)
    resource = request.resource_logs[0]
    resource.resource.attributes.add(key="prime.run.id", value=AnyValue(string_value="r"))
    resource.scope_logs[0].scope.attributes.add(key="scope", value=AnyValue(int_value=1))
    record = resource.scope_logs[0].log_records[0]
    record.body.kvlist_value.values.add(key="in", value=AnyValue(string_value="x"))
    record.event_name = "gen_ai.evaluation.result"
    assert count_values(request.SerializeToString(), 10**9, LOGS_REQUEST) == _walked(request)


def test_the_count_stops_past_the_limit_and_never_raises() -> None:
    body = _empty_attributes(1000).SerializeToString()
    assert count_values(body, 10) == 11
    for cut in (1, 7, len(body) // 2, len(body) - 1):
        count_values(body[:cut], 10**9)  # truncated: counted as far as it goes
    count_values(b"\xff" * 64, 10**9)
    count_values(b"\x0b\x0c", 10**9)  # a group: not OTLP
    with pytest.raises(Exception, match="not a valid"):
        decode_protobuf(b"\x0a\xff\xff\xff\xff\x0f")


def test_otlp_json_stops_at_the_limit() -> None:
    document: Any = otlp_json(_empty_attributes(50))
    decode_json(json.dumps(document).encode(), max_objects=100)
    with pytest.raises(OtlpTooManyValues):
        decode_json(json.dumps(document).encode(), max_objects=20)
