"""``serve --kafka``: a fleet of members on a real Apache Kafka broker, runs
sent to random members, members killed -9, and exact books on the fake
platform: every acknowledged episode stored exactly once, each run created
once and finalized once with the right count, whichever member received its
spans and whichever delivered it."""

from __future__ import annotations

import os
import random
import re
import shutil
import signal
import time

import httpx
import pytest
from confluent_kafka.admin import AdminClient, NewPartitions  # type: ignore[attr-defined]
from kafka_fleet import Fleet, all_closed, assert_books, fleet, kafka, run_bodies, wait_for
from test_receiver import ServeProcess, episodes, post

from prime_runs_otel.collector import kafka_stages
from prime_runs_otel.testing.kafka_broker import Cluster

__all__ = ["fleet", "kafka"]  # the fixtures

#: The fleet tests share one broker per worker: they run on the same worker.
pytestmark = pytest.mark.xdist_group("kafka")


def test_runs_survive_members_killed_mid_run_exactly_once(fleet: Fleet) -> None:
    """Runs sent to random members; one member killed -9 for good while
    uploads are in flight on a slow platform, another killed -9 and started
    again under its name with its spool deleted. The members that take the
    partitions over send the begun uploads again (stored once), adopt the
    platform runs (created once) and close them (finalized once)."""
    fleet.add_many(2)
    lost_root = fleet.root / "lost"
    lost = fleet.add(name="lost", root=lost_root)
    rng = random.Random(5)
    runs = {f"kill-{n}": episodes(16, seed=500 + n) for n in range(6)}
    pieces = {key: run_bodies(recs, key, 4) for key, recs in runs.items()}
    for key in runs:
        for body in pieces[key][:2]:
            fleet.send(body, rng)
    wait_for(lambda: len(fleet.platform.runs()) == len(runs), 120, "every run to be created")
    # Uploads take a while now: the kill lands with some of them in flight.
    fleet.platform.set_latency(0.4)
    for key in runs:
        fleet.send(pieces[key][2], rng)
    time.sleep(1.0)  # not a wait for a condition: where the kill lands is the test's variable
    victim = rng.choice([member for member in fleet.alive() if member is not lost])
    victim.stop(signal.SIGKILL)
    killed_at = time.monotonic()
    lost.stop(signal.SIGKILL)
    fleet.members.remove(lost)
    shutil.rmtree(lost_root / "serve-spool")
    fleet.add(name="lost", root=lost_root)
    fleet.platform.set_latency(0)
    for key in runs:
        fleet.send(pieces[key][3], rng)
    wait_for(lambda: all_closed(fleet.platform, list(runs)), 180, "every run to close")
    print(f"every run closed {time.monotonic() - killed_at:.1f}s after the kills")
    assert_books(fleet.platform, runs)


def test_brokers_that_do_not_answer_are_overload_never_a_loss(fleet: Fleet, kafka: Cluster) -> None:
    """A request the brokers do not acknowledge in time is answered 503 with
    Retry-After (the client sends it again), and the run is whole once it is."""
    member = fleet.add()
    # The member delivers (it owns the partitions) before the brokers stop:
    # what is under test is an export the brokers do not acknowledge.
    warm = episodes(2, seed=899)
    (first,) = run_bodies(warm, "broker-there", 1)
    assert post(member.traces_url, first).status_code == 200
    wait_for(lambda: all_closed(fleet.platform, ["broker-there"]), 120, "a first run to close")
    records = episodes(6, seed=900)
    (body,) = run_bodies(records, "broker-away", 1)
    (node,) = kafka.nodes
    assert node.process is not None
    os.kill(node.process.pid, signal.SIGSTOP)
    try:
        answer = post(member.traces_url, body)
    finally:
        os.kill(node.process.pid, signal.SIGCONT)
    assert answer.status_code == 503, answer.text
    assert answer.headers.get("retry-after")
    fleet.send(body, random.Random(1))
    wait_for(lambda: all_closed(fleet.platform, ["broker-away"]), 300, "the run to close")
    assert_books(fleet.platform, {"broker-there": warm, "broker-away": records})


def _delivered_partitions(member: ServeProcess) -> set[int]:
    """Every partition the member's log says it took over."""
    found: set[int] = set()
    for listed in re.findall(r"now delivers partition\(s\) ([0-9, ]+)", member.log()):
        found |= {int(number) for number in listed.split(",")}
    return found


def test_a_member_takes_partitions_its_group_learns_of_from_a_metadata_refresh(
    fleet: Fleet, kafka: Cluster
) -> None:
    """The group consumer's next step waits for the metadata of its topic.

    A member whose metadata request was lost with the connection it went out
    on (the brokers froze while it joined) waited for librdkafka's periodic
    refresh, five minutes by default, without a partition. That race cannot
    be forced from outside; the state it ends in can: partitions added to the
    topic reach the group only through that refresh, so the member takes
    them within its bound, not minutes later."""
    member = fleet.add()
    wait_for(lambda: _delivered_partitions(member), 120, "the member to take its partitions")
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap})
    topic = f"{fleet.prefix}.episodes"
    added = fleet.partitions + 2
    admin.create_partitions([NewPartitions(topic, added)])[topic].result(30)
    wait_for(
        lambda: _delivered_partitions(member) >= set(range(added)),
        60,
        "the member to take the added partitions",
    )


def _stage_seconds(member: ServeProcess) -> dict[tuple[str, str], float]:
    """``/metrics``' ``kafka_request_stage_seconds``, by (stage, quantile)."""
    found = {}
    for line in httpx.get(f"{member.url}/metrics", timeout=30).text.splitlines():
        if line.startswith("prime_runs_otel_kafka_request_stage_seconds{"):
            labels, value = line.split("{", 1)[1].split("} ")
            pairs = dict(item.split("=", 1) for item in labels.split(","))
            found[(pairs["stage"].strip('"'), pairs["quantile"].strip('"'))] = float(value)
    return found


def test_a_members_metrics_split_an_acknowledgement_into_the_brokers_part_and_its_own(
    fleet: Fleet,
) -> None:
    """Each stage of a request appears on ``/metrics``, and the parts
    librdkafka measured (``broker_queue``: its queue, ``broker_rtt``: the
    round trip) come from the producer's statistics once a window is in."""
    member = fleet.add()
    records = episodes(9, seed=950)
    for body in run_bodies(records, "stages", 3):
        assert post(member.traces_url, body).status_code == 200
    # A window of statistics may hold a request's round trip and not its
    # records' queue (they were batched in the window before): both, then.
    found = wait_for(
        lambda: (
            all(((stage, "0.99") in seconds) for stage in kafka_stages.STAGES) and seconds
            if (seconds := _stage_seconds(member))
            else None
        ),
        60,
        "librdkafka's statistics on /metrics",
    )
    for stage in kafka_stages.STAGES:
        assert 0 <= found[(stage, "0.5")] <= found[(stage, "0.99")], stage
    assert 0 < found[("broker_rtt", "0.5")] < 10
    assert 0 < found[("broker_queue", "0.5")] < 10
    assert found[("total", "0.5")] > 0
    wait_for(lambda: all_closed(fleet.platform, ["stages"]), 300, "the run to close")
    assert_books(fleet.platform, {"stages": records})
