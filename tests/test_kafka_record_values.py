"""What a member produces to ``<prefix>.episodes`` for an OTLP request: a
request of one run's spans goes as the bytes it came in (here: sent to a
member's OTLP/HTTP front), not encoded again; spans of no run beside a
run's stay out of its record.

The records are read back from a real broker with a plain consumer."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from confluent_kafka import Consumer
from confluent_kafka import TopicPartition as Partition
from google.protobuf.internal.encoder import _VarintBytes
from kafka_fleet import Fleet, kafka, run_bodies
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans
from test_receiver import episodes, post

from prime_runs_otel.collector.kafka_ingest import KafkaIngest
from prime_runs_otel.collector.kafka_table import ensure_topics
from prime_runs_otel.deliver.kafka.settings import KafkaSettings
from prime_runs_otel.testing import FakePlatform
from prime_runs_otel.testing.kafka_broker import Cluster

__all__ = ["kafka"]  # the fixture

pytestmark = pytest.mark.xdist_group("kafka")


@pytest.fixture
def settings(kafka: Cluster) -> KafkaSettings:
    """A fleet's topics of one partition, on the shared broker."""
    found = KafkaSettings(kafka.bootstrap, f"t{uuid.uuid4().hex[:10]}", partitions=1)
    ensure_topics(found)
    return found


def _record_values(settings: KafkaSettings, count: int) -> list[bytes]:
    """The first ``count`` records of the fleet's one partition, read back."""
    consumer = Consumer(
        {**settings.common(), "group.id": f"check-{uuid.uuid4().hex}", "enable.auto.commit": False}
    )
    consumer.assign([Partition(settings.episodes_topic, 0, 0)])
    values: list[bytes] = []
    try:
        for _ in range(600):
            if len(values) >= count:
                break
            message = consumer.poll(0.1)
            if message is not None and message.error() is None:
                values.append(message.value())
    finally:
        consumer.close()
    assert len(values) == count, f"{len(values)} of {count} records read back"
    return values


def _hand_off(settings: KafkaSettings, request: ExportTraceServiceRequest, wire: bytes) -> None:
    ingest = KafkaIngest(settings)
    try:
        assert ingest.hand_off(request, wire).outcome == "accepted"
    finally:
        ingest.close()


def _reordered(request: ExportTraceServiceRequest) -> bytes:
    """``request`` encoded with each Resource after its spans: the same
    request to a reader, other bytes than protobuf's own encoding of it."""
    body = b""
    for resource_spans in request.resource_spans:
        spans_first = (
            ResourceSpans(scope_spans=resource_spans.scope_spans).SerializeToString()
            + ResourceSpans(resource=resource_spans.resource).SerializeToString()
        )
        body += b"\x0a" + _VarintBytes(len(spans_first)) + spans_first
    return body


def test_a_request_of_one_run_is_produced_as_the_bytes_it_came_in(
    tmp_path: Path, kafka: Cluster
) -> None:
    (body,) = run_bodies(episodes(3, seed=1500), "as-sent", 1)
    request = ExportTraceServiceRequest.FromString(body)
    wire = _reordered(request)
    assert ExportTraceServiceRequest.FromString(wire) == request
    assert wire != request.SerializeToString()  # so a request encoded again shows
    with FakePlatform() as platform:
        fleet = Fleet(tmp_path, kafka, platform, partitions=1)
        try:
            member = fleet.add()
            answer = post(member.traces_url, wire)
            assert answer.status_code == 200, answer.text
            settings = KafkaSettings(kafka.bootstrap, fleet.prefix, partitions=1)
            assert _record_values(settings, 1) == [wire]
        finally:
            fleet.stop_all()


def test_spans_of_no_run_stay_out_of_the_record_of_the_run_beside_them(
    settings: KafkaSettings,
) -> None:
    (body,) = run_bodies(episodes(2, seed=1600), "beside", 1)
    run = ExportTraceServiceRequest.FromString(body)
    keyless = ResourceSpans()
    keyless.scope_spans.add().spans.add(name="no run's", trace_id=b"\x01" * 16, span_id=b"\x02" * 8)
    request = ExportTraceServiceRequest(resource_spans=[*run.resource_spans, keyless])
    _hand_off(settings, request, _reordered(request))
    (value,) = _record_values(settings, 1)
    assert ExportTraceServiceRequest.FromString(value) == run
