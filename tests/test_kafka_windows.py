"""The Kafka fleet's narrow windows, on a real broker and the fake platform:
a member killed -9 while a legacy sample request (which the platform cannot
make idempotent) is on its way, a broker that stops answering while a
member's transactions are in flight, and two members under one name."""

from __future__ import annotations

import os
import random
import signal
import sqlite3
from collections import Counter
from typing import Any

import httpx
import pytest
from kafka_fleet import Fleet, all_closed, assert_books, fleet, kafka, run_bodies, wait_for
from test_receiver import ServeProcess, episodes, post

from prime_runs_otel.testing.kafka_broker import Cluster

__all__ = ["fleet", "kafka"]  # the fixtures

#: The fleet tests share one broker per worker: they run on the same worker.
pytestmark = pytest.mark.xdist_group("kafka")


def _spool_rows(member: ServeProcess, sql: str) -> list[Any]:
    path = member.root / "serve-spool" / "spool.sqlite3"
    if not path.exists():
        return []
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10)
    try:
        return db.execute(sql).fetchall()
    except sqlite3.OperationalError:  # the schema not created yet
        return []
    finally:
        db.close()


def _sending_samples(members: list[ServeProcess]) -> tuple[ServeProcess, str, int] | None:
    """A member with a legacy sample request on its way: the member, the run, its episodes."""
    for member in members:
        rows = _spool_rows(
            member,
            "SELECT run_id, episodes FROM uploads WHERE kind = 'samples' AND state = 'sending'",
        )
        if rows:
            return member, str(rows[0][0]), int(rows[0][1])
    return None


def test_a_sample_request_in_flight_when_its_member_dies_is_never_sent_twice(
    fleet: Fleet,
) -> None:
    """The account is not on Prime Traces, so runs go to the legacy sample
    table, which appends. A member is killed -9 while one of its sample
    requests is on its way (and is stored by the platform after the kill).
    The member that takes the run over finds the request in the run's state
    in Kafka, counts its episodes uncertain and does not send them again:
    every episode's row is on the platform once, each run created and
    finalized once."""
    fleet.platform.service_not_enabled = True
    fleet.add_many(2)
    rng = random.Random(11)
    runs = {f"samples-{n}": episodes(8, seed=700 + n) for n in range(4)}
    pieces = {key: run_bodies(recs, key, 2) for key, recs in runs.items()}
    for key in runs:
        fleet.send(pieces[key][0], rng)
    wait_for(
        lambda: (
            len(fleet.platform.runs()) == len(runs)
            and all(len(fleet.platform.samples(r.id)) == 4 for r in fleet.platform.runs())
        ),
        180,
        "the first halves in the sample table",
    )
    # Requests take seconds now: the kill lands with a sample request on its way.
    fleet.platform.set_latency(3.0)
    for key in runs:
        fleet.send(pieces[key][1], rng)
    found: list[tuple[ServeProcess, str, int]] = []

    def on_its_way() -> bool:
        hit = _sending_samples(fleet.alive())
        if hit is not None:
            found.append(hit)
        return hit is not None

    wait_for(on_its_way, 120, "a sample request on its way")
    victim, run_key, in_flight = found[0]
    victim.stop(signal.SIGKILL)
    fleet.platform.set_latency(0)
    wait_for(lambda: all_closed(fleet.platform, list(runs)), 240, "every run to close")
    for platform_run in fleet.platform.runs():
        assert platform_run.finalize_calls == 1, platform_run.id
        assert platform_run.status == "COMPLETED", platform_run.error_message
        rows = Counter(row["sample_id"] for row in fleet.platform.samples(platform_run.id))
        twice = {sample: n for sample, n in rows.items() if n > 1}
        assert not twice, f"rows stored more than once: {twice}"
        key = platform_run.metadata.get("prime_runs_otel", {}).get("run_key")
        assert sorted(rows) == sorted(record["id"] for record in runs[key]), key
    assert len(fleet.platform.runs()) == len(runs), "each run created once"
    (survivor,) = fleet.alive()
    counted = _spool_rows(survivor, f"SELECT uncertain FROM runs WHERE local_id = '{run_key}'")
    assert counted == [(in_flight,)], "the request's episodes counted uncertain by the new owner"


def test_a_broker_stopped_mid_transaction_holds_delivery_for_a_bounded_time(
    fleet: Fleet, kafka: Cluster
) -> None:
    """The broker stops answering while the member's uploads wait for their
    transactions: each transaction fails within its budget (the loop is
    not held), is aborted, and once the broker answers again the member
    recovers and every run is whole, created and finalized once."""
    member = fleet.add()
    runs = {f"stalled-{n}": episodes(12, seed=800 + n) for n in range(3)}
    rng = random.Random(12)
    # Calls take a while: the stop lands with creates and uploads (each behind
    # a transaction) still to come.
    fleet.platform.set_latency(1.0)
    for key, records in runs.items():
        for body in run_bodies(records, key, 3):
            fleet.send(body, rng)
    wait_for(lambda: len(fleet.platform.runs()) >= 1, 120, "a run to be created")
    (node,) = kafka.nodes
    assert node.process is not None
    failed_before = member.log().count("committing to Kafka failed")
    os.kill(node.process.pid, signal.SIGSTOP)
    try:
        wait_for(
            lambda: member.log().count("committing to Kafka failed") > failed_before,
            120,
            "a transaction to fail while the broker does not answer",
        )
    finally:
        os.kill(node.process.pid, signal.SIGCONT)
    fleet.platform.set_latency(0)
    wait_for(lambda: all_closed(fleet.platform, list(runs)), 240, "every run to close")
    assert_books(fleet.platform, runs)


def test_a_second_member_under_the_same_name_stops_the_first_cleanly(fleet: Fleet) -> None:
    """Two ``serve`` under one ``--kafka-member``: the second takes the name
    (its group membership and transactional id fence the first's), and the
    first stops delivering at once, says so on /readyz, and never fences the
    second back: the runs are delivered once, by the second."""
    first = fleet.add(name="twin")
    rng = random.Random(13)
    before = {"twin-before": episodes(6, seed=950)}
    (body,) = run_bodies(before["twin-before"], "twin-before", 1)
    fleet.send(body, rng)
    wait_for(lambda: all_closed(fleet.platform, list(before)), 180, "the first run to close")
    second = fleet.add(name="twin", root=fleet.root / "twin-2")
    wait_for(lambda: "stops delivering" in first.log(), 120, "the first member to stop delivering")
    answer = httpx.get(f"{first.url}/readyz", timeout=30)
    assert answer.status_code == 503 and "fenced" in answer.text, answer.text
    after = {"twin-after": episodes(6, seed=951)}
    (body,) = run_bodies(after["twin-after"], "twin-after", 1)
    assert post(second.traces_url, body).status_code == 200
    wait_for(lambda: all_closed(fleet.platform, list(after)), 180, "the second run to close")
    assert "stops delivering" not in second.log()
    assert_books(fleet.platform, {**before, **after})
