"""The Kafka fleet's parts that need no broker: a run's handover record, the
gate in front of the platform calls, the client settings a user passes
through, and how a request is cut into records."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans

from prime_runs_otel import semconv
from prime_runs_otel.collector import kafka_ingest, kafka_stages
from prime_runs_otel.deliver.kafka.owner import CREATE_GRACE, FleetOwnership, NotOwned
from prime_runs_otel.deliver.kafka.settings import parse_client_config
from prime_runs_otel.deliver.kafka.state import RunState
from prime_runs_otel.errors import ConfigError

texts = st.text(min_size=1, max_size=20)


@given(
    run=texts,
    partition=st.integers(0, 1000),
    through=st.integers(-1, 10**12),
    delivered=st.lists(texts, max_size=5),
    sending=st.lists(st.tuples(texts, st.lists(texts, max_size=4)), max_size=3),
    finalizing=st.booleans(),
)
def test_a_run_state_reads_back_as_written(
    run: str,
    partition: int,
    through: int,
    delivered: list[str],
    sending: list[tuple[str, list[str]]],
    finalizing: bool,
) -> None:
    state = RunState(
        run, partition, through, "p-1", None, False, 3, delivered, sending, 1.5, finalizing
    )
    assert RunState.decode(state.encode()) == state


def test_a_state_of_another_version_is_refused() -> None:
    with pytest.raises(ValueError, match="version"):
        RunState.decode(b'{"v": 99, "run": "r", "partition": 0}')


def test_an_intent_waits_for_its_commit_and_is_refused_without_the_partition() -> None:
    owner = FleetOwnership()
    owner.bind("run-a", 3)
    with pytest.raises(NotOwned):  # assigned, not caught up yet
        owner.record("run-a", "create")
    owner.ready(3)
    done: list[str] = []

    def upload() -> None:
        owner.record("run-a", "upload", "sha256:x", ["e1", "e2"])
        done.append("sent")

    thread = threading.Thread(target=upload)
    thread.start()
    assert owner.wanted.wait(10)
    (intent,) = owner.take_intents()
    assert (intent.kind, intent.upload_id, intent.episode_ids) == (
        "upload",
        "sha256:x",
        ["e1", "e2"],
    )
    assert not done  # nothing goes out before the commit
    intent.done.set()
    thread.join(10)
    assert done == ["sent"]
    assert owner.revoke(3) == ["run-a"]
    assert not owner.owns("run-a")


def test_a_create_another_member_may_have_sent_waits_before_the_lookup() -> None:
    owner = FleetOwnership()
    owner.inherit(RunState("run-b", 0, creating_at=time.time()))
    assert owner.hold_create("run-b")
    owner.inherit(RunState("run-b", 0, creating_at=time.time() - CREATE_GRACE - 1))
    assert not owner.hold_create("run-b")
    owner.inherit(RunState("run-b", 0, platform_id="p-9", creating_at=time.time()))
    assert not owner.hold_create("run-b")  # created: adopted, never looked up


def test_client_settings_from_a_file_and_the_command_line(tmp_path: Path) -> None:
    properties = tmp_path / "kafka.properties"
    properties.write_text(
        "# a comment\nsecurity.protocol=SASL_SSL\nsasl.mechanism = PLAIN\n\nsasl.password=a=b\n"
    )
    config = parse_client_config(["sasl.mechanism=SCRAM-SHA-512"], [str(properties)])
    assert config == {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.password": "a=b",
    }
    with pytest.raises(ConfigError, match="KEY=VALUE"):
        parse_client_config(["no-equals-sign"])
    with pytest.raises(ConfigError, match="cannot read"):
        parse_client_config([], [str(tmp_path / "missing")])


@given(sizes=st.lists(st.integers(1, 30_000), min_size=1, max_size=30))
def test_a_runs_spans_are_cut_into_records_that_keep_every_span(sizes: list[int]) -> None:
    target = kafka_ingest.RECORD_TARGET_BYTES
    kafka_ingest.RECORD_TARGET_BYTES = 50_000  # small records: the cut is what is tested
    try:
        _cut_and_check(sizes)
    finally:
        kafka_ingest.RECORD_TARGET_BYTES = target


def _cut_and_check(sizes: list[int]) -> None:
    resource_spans = ResourceSpans()
    pair = resource_spans.resource.attributes.add()
    pair.key, pair.value.string_value = semconv.RUN_ID, "run-c"
    scope = resource_spans.scope_spans.add()
    for index, size in enumerate(sizes):
        span = scope.spans.add()
        span.name = f"span-{index}"
        span.trace_id = index.to_bytes(16, "big")
        attribute = span.attributes.add()
        attribute.key, attribute.value.string_value = "blob", "x" * size
    values, oversized = kafka_ingest._records_of([resource_spans])
    assert oversized == 0
    names = []
    for value in values:
        request = ExportTraceServiceRequest.FromString(value)
        for part in request.resource_spans:
            assert part.resource == resource_spans.resource
            names += [span.name for scopes in part.scope_spans for span in scopes.spans]
        if len(values) > 1:
            assert len(value) <= kafka_ingest.RECORD_TARGET_BYTES + max(sizes) + 1024
    assert names == [f"span-{index}" for index in range(len(sizes))]


def test_a_requests_stages_add_up_to_its_time_and_the_window_keeps_the_last() -> None:
    stages = kafka_stages.Stages()
    for n in range(kafka_stages.STAGE_WINDOW + 10):
        slow = 1.0 if n < 10 else 0.0  # the oldest requests, out of the window
        # received 0; handed off, produced, acknowledged, resumed; answered
        stages.observe(0.0, (0.001, 0.002 + slow, 0.030 + slow, 0.031 + slow), 0.035 + slow)
    found = stages.quantiles()
    assert found[("broker_ack", "0.99")] == pytest.approx(0.028)
    assert found[("total", "0.5")] == pytest.approx(0.035)
    parts = sum(found[(stage, "0.5")] for stage in kafka_stages.REQUEST_STAGES if stage != "total")
    assert parts == pytest.approx(found[("total", "0.5")])
    assert ("broker_rtt", "0.5") not in found  # no statistics from librdkafka yet


def _histogram(p50_us: int, p99_us: int, count: int) -> dict[str, int]:
    """A latency histogram as librdkafka's statistics give it (microseconds)."""
    return {
        "min": p50_us // 2, "max": p99_us * 2, "avg": p50_us, "cnt": count, "p50": p50_us,
        "p75": p50_us, "p90": p50_us, "p95": p50_us, "p99": p99_us, "p99_99": p99_us * 2,
    }  # fmt: skip


def _statistics(rtt_p99_us: int, count: int = 200) -> str:
    """A statistics window of librdkafka's, shaped as the producer emits it:
    the bootstrap entry sent nothing, the broker took ``count`` records."""
    return json.dumps(
        {
            "name": "rdkafka#producer-1",
            "replyq": 0,
            "brokers": {
                "127.0.0.1:9092/bootstrap": {"rtt": {"cnt": 0}, "int_latency": {"cnt": 0}},
                "127.0.0.1:9092/1": {
                    "int_latency": _histogram(2000, 3000, count),
                    "outbuf_latency": _histogram(50, 400, count),
                    "rtt": _histogram(3000, rtt_p99_us, count),
                },
            },
        }
    )


def test_the_brokers_part_of_an_acknowledgement_is_librdkafkas_own_measure() -> None:
    """``broker_queue`` adds librdkafka's queue and output buffer point by
    point, ``broker_rtt`` is its round trip; windows of statistics are
    merged by their counts."""
    stages = kafka_stages.Stages()
    stages.observe(time.monotonic(), (0.001, 0.002, 0.050, 0.051), 0.052)
    stages.librdkafka_statistics(_statistics(rtt_p99_us=7000))
    found = stages.quantiles()
    assert found[("broker_queue", "0.5")] == pytest.approx(0.00205, abs=1e-6)
    assert found[("broker_queue", "0.99")] == pytest.approx(0.0034, abs=1e-6)
    assert found[("broker_rtt", "0.5")] == pytest.approx(0.003, abs=1e-6)
    assert found[("broker_rtt", "0.99")] == pytest.approx(0.007, abs=1e-6)
    # A second window like the first leaves the quantiles as they were; one
    # with a stalled round trip raises the p99 of both together, not the p50.
    stages.librdkafka_statistics(_statistics(rtt_p99_us=7000))
    assert stages.quantiles()[("broker_rtt", "0.99")] == pytest.approx(0.007, abs=1e-6)
    stages.librdkafka_statistics(_statistics(rtt_p99_us=200000, count=400))
    found = stages.quantiles()
    assert found[("broker_rtt", "0.5")] == pytest.approx(0.003, abs=1e-6)
    assert 0.007 < found[("broker_rtt", "0.99")] < 0.2
    assert found[("broker_queue", "0.99")] == pytest.approx(0.0034, abs=1e-6)
    # A window that sent nothing is no window.
    assert kafka_stages.broker_windows(json.loads(_statistics(7000, count=0))) == []
