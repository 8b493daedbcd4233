"""The delivery lease as the uploader holds it: renewed often by the code
(every pass, every upload), written to the spool only when its last renewal
is a quarter of its life old, and never kept by a holder that gave it up."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import pytest

from prime_runs_otel.deliver.lease import Lease
from prime_runs_otel.deliver.spool import Spool

BIG = 1 << 40


@pytest.fixture
def spool(tmp_path: Path) -> Spool:
    return Spool(tmp_path / "spool.sqlite3", max_bytes=BIG)


def _expires(spool: Spool) -> float | None:
    """The lease's expiry as the spool file holds it (read by another
    connection, as another process would)."""
    with sqlite3.connect(spool.path) as db:
        row = db.execute("SELECT expires FROM lease WHERE name = 'uploader'").fetchone()
    return None if row is None else float(row[0])


def test_renewals_soon_after_the_last_write_nothing(spool: Spool) -> None:
    lease = Lease(spool, ttl=600)
    assert lease.acquire()
    written = _expires(spool)
    assert written is not None
    for _ in range(5):
        lease.renew()
        assert lease.acquire()
    assert _expires(spool) == written, "a renewal within a quarter of the ttl wrote the spool"


def test_a_renewal_a_quarter_of_the_ttl_later_is_written(spool: Spool) -> None:
    lease = Lease(spool, ttl=0.4)
    assert lease.acquire()
    written = _expires(spool)
    assert written is not None
    deadline = time.monotonic() + 30
    while _expires(spool) == written and time.monotonic() < deadline:
        time.sleep(0.02)
        lease.renew()
    renewed = _expires(spool)
    assert renewed is not None and renewed > written


def test_a_released_lease_is_asked_for_again_not_assumed(spool: Spool) -> None:
    first, second = Lease(spool, ttl=600), Lease(spool, ttl=600)
    assert first.acquire()
    assert not second.acquire()
    first.release()
    assert second.acquire()
    assert not first.acquire(), "a holder that let go still believed it held the lease"
