"""``serve --kafka``: a fleet of members on a real Apache Kafka broker, runs
sent to random members, members killed -9, and exact books on the fake
platform: every acknowledged episode stored exactly once, each run created
once and finalized once, whichever member received its spans and whichever
delivered it."""

from __future__ import annotations

import random
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kafka_fleet import Fleet, all_closed, assert_books, kafka, run_bodies, wait_for
from test_receiver import episodes

from prime_runs_otel.testing import FakePlatform
from prime_runs_otel.testing.kafka_broker import Cluster

__all__ = ["kafka"]  # the fixture

#: The fleet tests share one broker per worker: they run on the same worker.
pytestmark = pytest.mark.xdist_group("kafka")


@pytest.fixture
def fleet(tmp_path: Path, kafka: Cluster) -> Iterator[Fleet]:
    with FakePlatform() as platform:
        members = Fleet(tmp_path, kafka, platform)
        try:
            yield members
        finally:
            members.stop_all()


def test_runs_sent_to_random_members_are_each_delivered_once(fleet: Fleet) -> None:
    fleet.add()
    fleet.add()
    rng = random.Random(3)
    runs = {f"spread-{n}": episodes(15, seed=300 + n) for n in range(4)}
    bodies = [(key, body) for key, recs in runs.items() for body in run_bodies(recs, key, 5)]
    for _key, body in bodies:
        fleet.send(body, rng)
    wait_for(lambda: all_closed(fleet.platform, list(runs)), 120, "every run to close")
    assert_books(fleet.platform, runs)


def test_a_killed_members_runs_are_resumed_by_another_exactly_once(fleet: Fleet) -> None:
    """kill -9 of a member while its runs are half delivered, with uploads
    in flight on a slow platform: the member that takes its partitions over
    sends the same uploads again (stored once), adopts the platform runs
    (created once) and closes them (finalized once)."""
    first, second, third = fleet.add(), fleet.add(), fleet.add()
    rng = random.Random(5)
    runs = {f"kill-{n}": episodes(20, seed=500 + n) for n in range(6)}
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
    victim = rng.choice([first, second, third])
    victim.stop(signal.SIGKILL)
    killed_at = time.monotonic()
    fleet.platform.set_latency(0)
    for key in runs:
        fleet.send(pieces[key][3], rng)
    wait_for(lambda: all_closed(fleet.platform, list(runs)), 180, "every run to close")
    print(f"every run closed {time.monotonic() - killed_at:.1f}s after the kill")
    assert_books(fleet.platform, runs)


def test_a_member_restarted_with_its_spool_deleted_loses_nothing(fleet: Fleet) -> None:
    """The spool is only the working store: a member killed -9 and started
    again under the same name with an empty disk takes its partitions back
    (static membership) and finishes its runs from Kafka."""
    fleet.add(name="steady")
    lost_root = fleet.root / "lost"
    lost = fleet.add(name="lost", root=lost_root)
    rng = random.Random(7)
    runs = {f"disk-{n}": episodes(12, seed=700 + n) for n in range(4)}
    pieces = {key: run_bodies(recs, key, 3) for key, recs in runs.items()}
    for key in runs:
        fleet.send(pieces[key][0], rng)
    wait_for(lambda: len(fleet.platform.runs()) == len(runs), 120, "every run to be created")
    lost.stop(signal.SIGKILL)
    fleet.members.remove(lost)
    import shutil

    shutil.rmtree(lost_root / "serve-spool")
    fleet.add(name="lost", root=lost_root)
    for key in runs:
        for body in pieces[key][1:]:
            fleet.send(body, rng)
    wait_for(lambda: all_closed(fleet.platform, list(runs)), 180, "every run to close")
    assert_books(fleet.platform, runs)
