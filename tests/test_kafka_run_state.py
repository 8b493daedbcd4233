"""A run's state in Kafka across owners, at the state and spool level (real
SQLite spools, no broker: the broker only carries the state between them).

Episodes counted uncertain (a legacy sample request that may have stored
them) in records an owner finished are never read again by the next owner,
which skips the run's records up to the state's ``through``: the state
carries their count, so the run's final count holds every one, once. A
state an older member wrote (the layout before that count) is read with the
missing fields defaulted, as during a rolling upgrade. A run's start (its
first record, done only once the run is closed) does not hold ``through``
back: the state lists it to be read again, and stays the size of what is in
flight rather than of the whole run.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from prime_runs_otel.collector.kafka_books import Record, RunBook, RunBooks
from prime_runs_otel.config import DEFAULT_SPOOL_MAX_BYTES
from prime_runs_otel.deliver.kafka.owner import FleetOwnership
from prime_runs_otel.deliver.kafka.spool import FleetSpool
from prime_runs_otel.deliver.kafka.state import VERSION, RunState
from prime_runs_otel.deliver.spool import SpoolDelivery
from prime_runs_otel.produce.synthetic import synthetic_episodes
from prime_runs_otel.read.episodes import EpisodeArrival
from prime_runs_otel.read.projection.summary import digest_episode
from prime_runs_otel.read.records import RunBatch, RunIdentity

RUN = "uncertain-across-owners"


class Member:
    """One member's side of a run: its spool, its ownership and its books."""

    def __init__(self, root: Path, name: str) -> None:
        self.ownership = FleetOwnership()
        self.spool = FleetSpool(
            root / f"{name}.sqlite3", self.ownership, max_bytes=DEFAULT_SPOOL_MAX_BYTES
        )
        self.books = RunBooks(self.spool, self.ownership)
        self.book: RunBook | None = None

    def take_over(self, state: RunState | None) -> None:
        self.book = self.books.book(RUN, 0, {RUN: state} if state else {})

    def take(self, offset: int, *episode_ids: str, control: bool = False) -> None:
        """A record of the run, as the consumer loop takes it (skipped up to
        ``through`` but for the state's ``controls``, as the loop skips it)."""
        assert self.book is not None
        if self.book.skips(offset):
            return
        batch = RunBatch(RunIdentity(local_id=RUN), episodes=[_arrival(i) for i in episode_ids])
        self.spool.intake.ingest([batch], mode="online", register_producer=False)
        self.book.records.append(Record(offset, frozenset(episode_ids), control=control))
        self.books.adopt(RUN, self.book)

    def samples_uncertain(self, *episode_ids: str) -> None:
        """A legacy sample request of these episodes whose answer was lost:
        they are counted uncertain (the gate to Kafka is the broker's part)."""
        seqs = self.spool.handover.pending_in_order(RUN, episode_ids)
        delivery = self.spool.delivery
        upload = SpoolDelivery.begin_samples_request(delivery, RUN, [row.seq for row in seqs])
        assert delivery.end_samples_request(RUN, upload, "uncertain") == len(episode_ids)

    def deliver(self, *episode_ids: str) -> None:
        self.spool.handover.delivered_elsewhere(RUN, set(episode_ids))

    def state(self) -> RunState:
        assert self.book is not None
        state = self.books.settle(RUN, self.book, set())
        # As the next owner reads it from <prefix>.runs.
        return RunState.decode(state.encode())

    def uncertain(self) -> int:
        run = self.spool.reading.run(RUN)
        assert run is not None
        return run.uncertain


def _arrival(episode_id: str) -> EpisodeArrival:
    record = next(synthetic_episodes(1, seed=sum(map(ord, episode_id))))
    record["id"] = episode_id
    return EpisodeArrival(episode_id, json.dumps(record).encode(), digest_episode(record), None)


@pytest.fixture
def members(tmp_path: Path) -> Iterator[list[Member]]:
    made = [Member(tmp_path, name) for name in ("a", "b", "c")]
    try:
        yield made
    finally:
        for member in made:
            member.spool.close()


def _records(member: Member) -> None:
    member.take(0, "e1", "e2")
    member.take(1, "e3")
    member.take(2, "e4", "e5")


def test_every_episode_counted_uncertain_by_any_owner_is_in_the_final_count_once(
    members: list[Member],
) -> None:
    a, b, c = members
    a.take_over(None)
    _records(a)
    a.samples_uncertain("e1", "e2")  # record 0 is done: the next owner skips it
    first = a.state()
    assert first.through == 0

    b.take_over(first)
    _records(b)
    assert b.uncertain() == 2, "the earlier owner's uncertain, from records it finished"
    b.samples_uncertain("e3")  # record 1 done
    b.samples_uncertain("e5")  # record 2 is not done (e4 waits): e5 is read again
    second = b.state()
    assert second.through == 1
    assert second.uncertain == ["e5"]

    c.take_over(second)
    _records(c)
    c.deliver("e4")
    # e1, e2 (the first owner), e3 (the second), e5 (the second, counted here again
    # from the state's list, as the record that carries it is read again): 4, once each.
    assert c.uncertain() == 4
    assert c.state().through == 2


def test_a_runs_start_does_not_hold_through_back_and_a_new_owner_reads_it_again(
    members: list[Member],
) -> None:
    a, b, _ = members
    a.take_over(None)
    a.take(0, "e1", "e2", control=True)  # the run's start, with its first episodes
    a.take(1, "e3")
    a.take(2, "e4", "e5")
    a.deliver("e1", "e2", "e3", "e4")
    first = a.state()
    assert (first.through, first.controls) == (1, [0])
    # The start is read again: its episodes go in the state; e3's record is done.
    assert first.delivered == ["e1", "e2", "e4"]

    b.take_over(first)
    b.take(0, "e1", "e2", control=True)
    b.take(1, "e3")
    b.take(2, "e4", "e5")
    states = b.spool.handover.stored_ids(RUN, ["e1", "e2", "e3", "e4", "e5"])
    assert states == {"e1": "delivered", "e2": "delivered", "e4": "delivered", "e5": "pending"}
    second = b.state()
    assert (second.through, second.controls, second.delivered) == (1, [0], ["e1", "e2", "e4"])

    b.deliver("e5")
    b.spool.adopt(RUN, close_state="closed")
    closed = b.state()
    assert (closed.through, closed.controls, closed.delivered) == (2, [], [])


def test_a_state_of_the_layout_before_is_read_with_the_missing_fields_defaulted() -> None:
    """During a rolling upgrade the next owner may be of the new version and
    the state of the old: read, never refused (refused, the run would be taken
    over as if nobody had delivered it: created again, its uploads lost)."""
    written = {"v": 1, "run": "r", "partition": 2, "through": 41, "platform_id": "p-1"}
    state = RunState.decode(json.dumps(written).encode())
    assert state == RunState("r", 2, through=41, platform_id="p-1")
    assert (state.uncertain, state.uncertain_before, state.finalizing) == ([], 0, False)
    assert state.controls == []


def test_a_state_of_a_newer_version_is_refused_saying_what_to_do() -> None:
    with pytest.raises(ValueError, match="Upgrade this member"):
        RunState.decode(json.dumps({"v": VERSION + 1, "run": "r", "partition": 0}).encode())
