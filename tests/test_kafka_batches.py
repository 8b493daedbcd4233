"""A fleet member takes the records one read of a partition returned into
its spool in one intake pass (one transaction), not one per record; a
damaged record among them costs itself only; and a member killed -9 after
such a pass, before its records were committed as done, leaves the next
owner to deliver each episode exactly once.

Each test produces a backlog of several runs to a fleet of one partition
through the ingest's own producer before a member reads it, so that the
member's first read returns every record of it at once (one fetch)."""

from __future__ import annotations

import itertools
import signal
import time
from collections.abc import Mapping, Sequence
from typing import Any

import httpx
import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka import TopicPartition as Partition
from kafka_fleet import Fleet, all_closed, assert_books, kafka, run_bodies, wait_for
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from test_receiver import ServeProcess, episodes

from prime_runs_otel.collector.kafka_ingest import KIND_HEADER, TRACES, KafkaIngest
from prime_runs_otel.collector.kafka_records import MAX_PASS_BYTES
from prime_runs_otel.collector.kafka_table import ensure_topics
from prime_runs_otel.deliver.kafka.settings import KafkaSettings
from prime_runs_otel.testing import FakePlatform
from prime_runs_otel.testing.kafka_broker import Cluster

__all__ = ["kafka"]  # the fixture

#: The fleet tests share one broker per worker: they run on the same worker.
pytestmark = pytest.mark.xdist_group("kafka")

#: Not a request: a length-delimited field that runs past the end.
DAMAGED = b"\x0a\xff\x01"


def _settings(fleet: Fleet) -> KafkaSettings:
    return KafkaSettings(fleet.cluster.bootstrap, fleet.prefix, partitions=fleet.partitions)


def _backlog(fleet: Fleet, runs: Mapping[str, Sequence[dict[str, Any]]], pieces: int) -> int:
    """Every run's requests produced (interleaved, each run's in order) as
    the ingest produces them; how many records that made."""
    settings = _settings(fleet)
    ensure_topics(settings)
    bodies = {key: run_bodies(records, key, pieces) for key, records in runs.items()}
    size = sum(len(body) for parts in bodies.values() for body in parts)
    assert size < MAX_PASS_BYTES, "the backlog must fit in one pass: make it smaller"
    ingest = KafkaIngest(settings)
    try:
        for index in range(pieces):
            for key in runs:
                request = ExportTraceServiceRequest.FromString(bodies[key][index])
                assert ingest.hand_off(request).outcome == "accepted"
    finally:
        ingest.close()
    return pieces * len(runs)


def _produce_raw(fleet: Fleet, key: str, value: bytes) -> None:
    producer = Producer(_settings(fleet).common())
    producer.produce(
        _settings(fleet).episodes_topic, value, key.encode(), headers=[(KIND_HEADER, TRACES)]
    )
    assert producer.flush(30) == 0


def _metrics(member: ServeProcess) -> dict[str, float]:
    found = {}
    for line in httpx.get(f"{member.url}/metrics", timeout=30).text.splitlines():
        if line.startswith("prime_runs_otel_kafka_"):
            name, value = line.rsplit(" ", 1)
            found[name.removeprefix("prime_runs_otel_")] = float(value)
    return found


def _taken(member: ServeProcess, records: int) -> dict[str, float]:
    """/metrics once ``records`` records were read into the spool."""
    return wait_for(
        lambda: (
            found
            if (found := _metrics(member)).get('kafka_records_total{outcome="taken"}', 0) >= records
            else None
        ),
        120,
        f"{records} records taken into the member's spool",
    )


def _committed(fleet: Fleet) -> int:
    """The offset the fleet's group committed for its one partition."""
    settings = _settings(fleet)
    consumer = Consumer({**settings.common(), "group.id": settings.group})
    try:
        (done,) = consumer.committed([Partition(settings.episodes_topic, 0)], timeout=30)
    finally:
        consumer.close()
    return int(done.offset)


@pytest.fixture
def fleet(tmp_path: Any, kafka: Cluster) -> Any:
    with FakePlatform() as platform:
        members = Fleet(tmp_path, kafka, platform, partitions=1)
        try:
            yield members
        finally:
            members.stop_all()


def test_records_of_several_runs_read_together_go_into_the_spool_in_one_pass(
    fleet: Fleet,
) -> None:
    runs = {f"batch-{n}": episodes(8, seed=1100 + n) for n in range(3)}
    records = _backlog(fleet, runs, pieces=4)
    member = fleet.add()
    found = _taken(member, records)
    assert found['kafka_records_total{outcome="taken"}'] == records
    assert found["kafka_intakes_total"] == 1, found
    wait_for(lambda: all_closed(fleet.platform, list(runs)), 180, "every run to close")
    assert_books(fleet.platform, runs)
    assert _metrics(member)["kafka_loop_cpu_seconds_total"] > 0


def test_a_damaged_record_among_good_ones_costs_itself_only(fleet: Fleet) -> None:
    first = {f"hurt-{n}": episodes(6, seed=1200 + n) for n in range(2)}
    records = _backlog(fleet, first, pieces=2)
    _produce_raw(fleet, "hurt-0", DAMAGED)
    later = {f"after-{n}": episodes(6, seed=1300 + n) for n in range(2)}
    records += _backlog(fleet, later, pieces=2)
    member = fleet.add()
    found = _taken(member, records)
    assert found['kafka_records_total{outcome="damaged"}'] == 1
    assert found['kafka_records_total{outcome="taken"}'] == records
    assert found["kafka_intakes_total"] == 1, found
    runs = {**first, **later}
    wait_for(lambda: all_closed(fleet.platform, list(runs)), 180, "every run to close")
    assert_books(fleet.platform, runs)
    assert "cannot be read and is let go" in member.log()


def test_a_member_killed_after_a_pass_before_its_commit_leaves_each_episode_once(
    fleet: Fleet,
) -> None:
    """The pass is in the killed member's spool and partly delivered, its
    records not committed as done: the next owner reads them again from the
    committed offset, skips what the run states say is done, marks what was
    delivered, and sends the rest (each episode stored once, each run
    created and finalized once)."""
    runs = {f"kill-{n}": episodes(8, seed=1400 + n) for n in range(3)}
    records = _backlog(fleet, runs, pieces=4)
    fleet.platform.set_latency(0.5)  # the kill lands with the delivery under way
    first = fleet.add()
    found = _taken(first, records)
    assert found["kafka_intakes_total"] == 1, found
    wait_for(
        lambda: any(fleet.platform.episodes(run.id) for run in fleet.platform.runs()),
        120,
        "the first episodes on the platform",
    )
    first.stop(signal.SIGKILL)
    assert not all_closed(fleet.platform, list(runs))
    # The pass's records are not all committed as done: the next owner reads some again.
    assert _committed(fleet) < records
    fleet.platform.set_latency(0)
    fleet.add()
    wait_for(lambda: all_closed(fleet.platform, list(runs)), 240, "every run to close")
    assert_books(fleet.platform, runs)


def _refused_full(member: ServeProcess) -> float:
    """How many consumed records the member's spool refused as full."""
    for line in httpx.get(f"{member.url}/metrics", timeout=30).text.splitlines():
        if line.startswith('prime_runs_otel_requests_total{outcome="full"}'):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_a_member_whose_spool_is_full_reads_again_once_a_second_and_loses_nothing(
    fleet: Fleet,
) -> None:
    """Records the spool refuses wait a second before they are read again
    (not the next poll's 10 ms), and a member that never has room hands
    them whole to the next owner."""
    runs = {"full-0": episodes(6, seed=1500)}
    records = _backlog(fleet, runs, pieces=2)
    full = fleet.add(env={"PRIME_RUNS_OTEL_SPOOL_MAX_BYTES": "1"})
    wait_for(lambda: _refused_full(full) >= records, 120, "the full spool's first refusal")
    # When each refusal is seen, over a window (a loaded machine refuses
    # less often; it never refuses sooner than the pause).
    seen: list[float] = []
    count = _refused_full(full)
    last = time.monotonic()
    while len(seen) < 4:
        now, refused = time.monotonic(), _refused_full(full)
        if refused > count:
            seen.append(now)
            count, last = refused, now
        assert now - last < 60, "the member stopped reading its records"
        time.sleep(0.02)
    gaps = [later - earlier for earlier, later in itertools.pairwise(seen)]
    assert min(gaps) >= 0.8, f"refused records read again after {min(gaps):.2f}s: {gaps}"
    assert not fleet.platform.runs()
    full.stop(signal.SIGTERM)
    fleet.add()
    wait_for(lambda: all_closed(fleet.platform, list(runs)), 180, "the run to close")
    assert_books(fleet.platform, runs)
