"""The spool on a real SQLite file: idempotent ingestion, the size cap, the
delivery lease between processes, and what a local run becomes on push."""

from __future__ import annotations

import json
import os
import socket
import sqlite3
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from prime_runs_otel.deliver.spool import (
    SCHEMA_VERSION,
    Spool,
    SpoolError,
    core,
    lease_owner,
    process_alive,
    process_start_token,
)
from prime_runs_otel.produce.synthetic import synthetic_episodes
from prime_runs_otel.read.episodes import EpisodeArrival
from prime_runs_otel.read.records import RunBatch, RunEnd, RunIdentity

BIG = 10**12


def _arrivals(count: int, seed: int = 0) -> list[EpisodeArrival]:
    arrivals = []
    for record in synthetic_episodes(count, seed=seed):
        raw = json.dumps(record).encode()
        arrivals.append(EpisodeArrival.of(record, raw))
    return arrivals


def _batch(episodes: list[EpisodeArrival], run: str = "run-1") -> RunBatch:
    return RunBatch(identity=RunIdentity(local_id=run, environments=("env-a",)), episodes=episodes)


@pytest.fixture
def spool(tmp_path: Path) -> Spool:
    return Spool(tmp_path / "spool.sqlite3", max_bytes=BIG)


def test_ingestion_is_idempotent_on_episode_id(spool: Spool) -> None:
    episodes = _arrivals(5)
    first = spool.intake.ingest([_batch(episodes)], mode="local")
    again = spool.intake.ingest(
        [_batch([episodes[1], episodes[4], *_arrivals(1, seed=9)])], mode="local"
    )

    assert (first.stored, first.duplicates) == (5, 0)
    assert (again.stored, again.duplicates) == (1, 2)
    run = spool.reading.run("run-1")
    assert run is not None and (run.episodes, run.duplicates) == (6, 2)
    assert spool.reading.pending_count("run-1") == 6


def test_size_cap_is_checked_per_episode_within_one_batch(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "spool.sqlite3", max_bytes=BIG)
    episodes = _arrivals(40)
    spool.max_bytes = spool.housekeeping.used_bytes() + sum(len(e.raw) for e in episodes[:10]) + 1

    outcome = spool.intake.ingest([_batch(episodes)], mode="local")

    assert outcome.stored == 10
    assert outcome.stored + outcome.rejected == 40
    run = spool.reading.run("run-1")
    assert run is not None and (run.episodes, run.rejected) == (outcome.stored, outcome.rejected)


def test_at_the_cap_a_duplicate_is_not_counted_as_lost_and_run_ends_still_land(
    tmp_path: Path,
) -> None:
    episodes = _arrivals(3)
    spool = Spool(tmp_path / "spool.sqlite3", max_bytes=BIG)
    spool.intake.ingest([_batch(episodes)], mode="local")
    full = Spool(spool.path, max_bytes=1)
    end = RunBatch(
        identity=RunIdentity(local_id="run-1"),
        episodes=[episodes[0], *_arrivals(1, seed=3)],
        end=RunEnd("completed", None, 4),
    )

    outcome = full.intake.ingest([end], mode="local")

    assert (outcome.stored, outcome.duplicates, outcome.rejected) == (0, 1, 1)
    run = full.reading.run("run-1")
    assert run is not None and run.end_status == "completed"


def test_lease_one_holder_at_a_time(spool: Spool) -> None:
    first, second = lease_owner(), lease_owner()

    assert spool.delivery.acquire_lease(first, ttl=30)
    assert not spool.delivery.acquire_lease(second, ttl=30)
    assert spool.delivery.acquire_lease(first, ttl=30), "the holder renews"
    spool.delivery.release_lease(first)
    assert spool.delivery.acquire_lease(second, ttl=30)


def test_lease_of_an_expired_holder_elsewhere_is_taken_over(spool: Spool) -> None:
    elsewhere = f"another-host:1:1:{uuid.uuid4().hex}"
    assert spool.delivery.acquire_lease(elsewhere, ttl=0.0)

    assert spool.delivery.acquire_lease(lease_owner(), ttl=30)


def test_lease_of_a_live_holder_elsewhere_is_kept(spool: Spool) -> None:
    assert spool.delivery.acquire_lease(f"another-host:1:1:{uuid.uuid4().hex}", ttl=30)

    assert not spool.delivery.acquire_lease(lease_owner(), ttl=30)


def test_lease_of_a_dead_process_on_this_host_is_taken_over_at_once(spool: Spool) -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait(timeout=30)
    dead = f"{socket.gethostname()}:{child.pid}:0:{uuid.uuid4().hex}"
    assert spool.delivery.acquire_lease(dead, ttl=30)

    assert spool.delivery.acquire_lease(lease_owner(), ttl=30)


def test_a_zombie_producer_is_dead() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        # Not reaped yet: the pid exists, as a zombie, until wait().
        os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)
        assert not process_alive(child.pid, "")
    finally:
        child.wait(timeout=30)
    assert process_alive(os.getpid(), process_start_token(os.getpid()))
    assert not process_alive(os.getpid(), "not-my-start-time")


def test_a_local_run_taken_online_is_reopened(spool: Spool) -> None:
    end = RunBatch(
        identity=RunIdentity(local_id="run-1", environments=("env-a",)),
        episodes=_arrivals(2),
        end=RunEnd("completed", None, 2),
    )
    spool.intake.ingest([end], mode="local")
    spool.delivery.update_run("run-1", close_state="closed")

    spool.delivery.set_mode("run-1", "online")

    run = spool.reading.run("run-1")
    assert run is not None and (run.mode, run.close_state) == ("online", "open")
    assert spool.reading.pending_count("run-1") == 2
    spool.delivery.update_run("run-1", close_state="closed")
    spool.delivery.set_mode("run-1", "online")
    closed = spool.reading.run("run-1")
    assert closed is not None and closed.closed, "an online run stays as it is"


def _as_schema_1(path: Path) -> None:
    """Rewrite a spool the way schema 1 kept it: bodies inside ``episodes``."""
    db = sqlite3.connect(path)
    with db:
        db.execute(
            "UPDATE episodes SET record = (SELECT body FROM records r WHERE r.seq = episodes.seq)"
        )
        db.execute("DELETE FROM records")
        db.execute("UPDATE meta SET value = '1' WHERE key = 'schema_version'")
    db.close()


def test_a_schema_1_spool_is_migrated_on_open_and_loses_no_body(tmp_path: Path) -> None:
    path = tmp_path / "spool.sqlite3"
    episodes = _arrivals(4)
    Spool(path, max_bytes=BIG).intake.ingest([_batch(episodes)], mode="local")
    _as_schema_1(path)

    reopened = Spool(path, max_bytes=BIG)

    bodies = [row.record for row in reopened.delivery.pending_episodes("run-1", max_bytes=BIG)]
    assert bodies == [episode.raw for episode in episodes]
    db = sqlite3.connect(path)
    try:
        assert db.execute("SELECT COUNT(*) FROM episodes WHERE record IS NOT NULL").fetchone() == (
            0,
        )
        assert db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone() == (
            str(SCHEMA_VERSION),
        )
    finally:
        db.close()


def test_a_spool_from_a_newer_release_is_refused_untouched(tmp_path: Path) -> None:
    path = tmp_path / "spool.sqlite3"
    Spool(path, max_bytes=BIG).intake.ingest([_batch(_arrivals(2))], mode="local")
    db = sqlite3.connect(path)
    with db:
        db.execute("UPDATE meta SET value = '99' WHERE key = 'schema_version'")
    db.close()

    with pytest.raises(SpoolError, match="newer prime-runs-otel"):
        Spool(path, max_bytes=BIG)

    db = sqlite3.connect(path)
    try:
        assert db.execute("SELECT COUNT(*) FROM records").fetchone() == (2,)
    finally:
        db.close()


def test_a_spool_folder_it_creates_is_private(tmp_path: Path) -> None:
    folder = tmp_path / "new" / "spool"
    Spool(folder / "spool.sqlite3", max_bytes=BIG)

    assert folder.stat().st_mode & 0o777 == 0o700


def test_a_spool_without_the_later_columns_tables_and_triggers_is_upgraded_in_place(
    tmp_path: Path,
) -> None:
    """A spool an earlier release wrote: no run owner, late counts or storing
    time, no per-state counts (or their triggers), no index of stopped runs.
    Opened, it gains them all, with the counts of what it holds."""
    path = tmp_path / "spool.sqlite3"
    spool = Spool(path, max_bytes=BIG)
    spool.intake.ingest([_batch(_arrivals(6), run="older")], mode="online")
    delivered = [row.seq for row in spool.delivery.pending_episodes("older", max_bytes=BIG)][:2]
    spool.delivery.begin_traces_upload("older", delivered, "up-older", b"...", encoding="gzip")
    spool.delivery.commit_traces_upload("older", "up-older")
    spool.close()
    db = sqlite3.connect(path)
    with db:
        for trigger in ("insert", "update", "delete"):
            db.execute(f"DROP TRIGGER episode_states_{trigger}")
        db.execute("DROP TABLE episode_states")
        db.execute("DROP INDEX runs_stopped")
        for table, column in (
            ("runs", "owner_id"),
            ("runs", "late"),
            ("runs", "late_refused"),
            ("episodes", "stored_at"),
        ):
            db.execute(f"ALTER TABLE {table} DROP COLUMN {column}")
    db.close()

    upgraded = Spool(path, max_bytes=BIG)
    try:
        assert upgraded.housekeeping.counts().episodes == {"pending": 4, "delivered": 2}
        identity = RunIdentity(local_id="older", environments=("env-a",))
        end = RunEnd("completed", None, 6, producer="someone-else")
        outcome = upgraded.intake.ingest(
            [RunBatch(identity=identity, end=end)], mode="online", check_owner=True
        )
        assert outcome.foreign_ends == ()  # the first end claims a run nobody owned
        upgraded.intake.ingest([_batch(_arrivals(1, seed=5), run="older")], mode="online")
        assert upgraded.housekeeping.counts().episodes == {"pending": 5, "delivered": 2}
        run = upgraded.reading.run("older")
        assert run is not None and (run.end_status, run.late, run.episodes) == ("completed", 0, 7)
    finally:
        upgraded.close()
    db = sqlite3.connect(path)
    try:
        index = "SELECT 1 FROM sqlite_master WHERE type = 'index' AND name = 'runs_stopped'"
        assert db.execute(index).fetchone()
        owner = db.execute("SELECT owner_id FROM runs WHERE local_id = 'older'").fetchone()
        assert owner == ("someone-else",)
    finally:
        db.close()


def test_an_identical_metrics_row_changes_nothing_and_a_new_value_is_added(
    tmp_path: Path,
) -> None:
    """A collector's retry of a delivered row leaves it delivered; another
    row of the same step adds its values and makes the row pending again."""
    from prime_runs_otel.deliver.spool.steps import insert_metrics
    from prime_runs_otel.read.records import RunMetrics

    spool = Spool(tmp_path / "spool.sqlite3", max_bytes=10**9)
    first = RunMetrics(3, {"loss": 1.0, "lr": 1e-06}, 5.0)
    with spool._transaction() as db:
        insert_metrics(db, "run", [first], 5.0)
    [row] = spool.steps.pending_metrics("run")
    assert spool.steps.end_metrics("run", row, "delivered")
    with spool._transaction() as db:
        insert_metrics(db, "run", [first], 6.0)
    assert spool.steps.metrics_counts("run") == {"delivered": 1}
    with spool._transaction() as db:
        insert_metrics(db, "run", [RunMetrics(3, {"eval/reward": 0.5}, 7.0)], 7.0)
    [row] = spool.steps.pending_metrics("run")
    assert json.loads(row.row) == {
        "loss": 1.0,
        "lr": 1e-06,
        "eval/reward": 0.5,
        "step": 3,
        "_timestamp": 7.0,
    }


def test_rows_posted_as_logged_stay_rows_of_their_own_in_order(tmp_path: Path) -> None:
    """prime-rl's train row of step 10 and its eval row (``"step": 10.0``)
    are two rows, in the order logged, each stored as its text says (the
    float a float, the keys in their order, no ``_timestamp``); a copy of
    a span (same key) changes nothing; beside them a step row of the SDK
    keeps its own form."""
    from prime_runs_otel.deliver.spool.steps import insert_metrics
    from prime_runs_otel.read.records import RunMetrics

    spool = Spool(tmp_path / "spool.sqlite3", max_bytes=10**9)
    train = RunMetrics(10, {"loss": 0.5, "step": 10}, 5.0, verbatim=True, key="a")
    evaluation = RunMetrics(10, {"eval/r": 0.75, "step": 10.0}, 6.0, verbatim=True, key="b")
    later = RunMetrics(11, {"step": 11, "loss": 0.25}, 7.0, verbatim=True, key="c")
    sdk = RunMetrics(12, {"lr": 1e-06}, 8.0)
    with spool._transaction() as db:
        insert_metrics(db, "run", [train, evaluation, later], 5.0)
        insert_metrics(db, "run", [evaluation, sdk], 6.0)  # a collector's retry, and the SDK's
    rows = spool.steps.pending_metrics("run")
    assert [row.row for row in rows] == [
        '{"loss":0.5,"step":10}',
        '{"eval/r":0.75,"step":10.0}',
        '{"step":11,"loss":0.25}',
        '{"_timestamp": 8.0, "lr": 1e-06, "step": 12}',
    ]
    assert [(row.step, row.verbatim) for row in rows] == [
        (10, True),
        (10, True),
        (11, True),
        (12, False),
    ]
    assert spool.steps.end_metrics("run", rows[1], "delivered")
    assert [row.row for row in spool.steps.pending_metrics("run")][:2] == [rows[0].row, rows[2].row]
    assert [row.seq for row in spool.reading.metrics_rows("run")] == [row.seq for row in rows]


def test_a_schema_2_metrics_table_is_rebuilt_with_its_rows(tmp_path: Path) -> None:
    """Schema 2 kept one metrics row per step (its key the step): opened, the
    table takes rows posted as logged beside them, its rows kept in step
    order and state."""
    from prime_runs_otel.deliver.spool.steps import insert_metrics
    from prime_runs_otel.read.records import RunMetrics

    path = tmp_path / "spool.sqlite3"
    Spool(path, max_bytes=BIG).close()
    db = sqlite3.connect(path)
    with db:
        db.execute("DROP TABLE metrics")
        db.execute(
            "CREATE TABLE metrics (run_id TEXT NOT NULL, step INTEGER NOT NULL, row TEXT NOT "
            "NULL, state TEXT NOT NULL DEFAULT 'pending', updated_at REAL NOT NULL, "
            "PRIMARY KEY (run_id, step))"
        )
        db.executemany(
            "INSERT INTO metrics VALUES ('run', ?, ?, ?, 1.0)",
            [(2, '{"step": 2}', "pending"), (1, '{"step": 1}', "delivered")],
        )
        db.execute("UPDATE meta SET value = '2' WHERE key = 'schema_version'")
    db.close()

    reopened = Spool(path, max_bytes=BIG)
    assert [(row.step, row.row) for row in reopened.reading.metrics_rows("run")] == [
        (1, '{"step": 1}'),
        (2, '{"step": 2}'),
    ]
    assert reopened.steps.metrics_counts("run") == {"pending": 1, "delivered": 1}
    with reopened._transaction() as db:
        insert_metrics(db, "run", [RunMetrics(2, {"step": 2.0}, 1.0, verbatim=True, key="k")], 2)
    assert [row.row for row in reopened.steps.pending_metrics("run")] == [
        '{"step": 2}',
        '{"step":2.0}',
    ]
    db = sqlite3.connect(path)
    try:
        version = db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        assert version == (str(SCHEMA_VERSION),)
    finally:
        db.close()


def test_an_upload_of_more_episodes_than_one_statement_holds_claims_and_delivers_them_all(
    spool: Spool,
) -> None:
    # Claims go a chunk of seqs per statement: an upload past one chunk
    # (500) must claim, count and deliver every one of its episodes.
    episodes = _arrivals(1100)
    spool.intake.ingest([_batch(episodes)], mode="online")
    rows = spool.delivery.pending_episodes("run-1", max_bytes=BIG)
    seqs = [row.seq for row in rows]
    assert len(seqs) == 1100

    spool.delivery.begin_traces_upload("run-1", seqs[:1050], "upload-1", b"body", encoding="gzip")

    assert spool.delivery.upload_episode_seqs("upload-1") == seqs[:1050]
    assert [row.seq for row in spool.delivery.pending_episodes("run-1", max_bytes=BIG)] == seqs[
        1050:
    ]
    assert spool.delivery.commit_traces_upload("run-1", "upload-1") == sum(
        e.digest.has_traces for e in episodes[:1050]
    )
    assert spool.reading.pending_count("run-1") == 50
    by_state = spool.housekeeping.counts().episodes
    assert {state: count for state, count in by_state.items() if count} == {
        "pending": 50,
        "delivered": 1050,
    }


def _synchronous_at_each_commit(db: sqlite3.Connection) -> list[str]:
    """The ``synchronous`` level each COMMIT of ``db`` runs under, from here on."""
    level = db.execute("PRAGMA synchronous").fetchone()[0]
    levels = {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}
    current = [levels[level]]
    commits: list[str] = []

    def seen(statement: str) -> None:
        if statement.upper().startswith("PRAGMA SYNCHRONOUS="):
            current[0] = statement.split("=", 1)[1].strip().upper()
        elif statement.upper() == "COMMIT":
            commits.append(current[0])

    db.set_trace_callback(seen)
    return commits


def test_an_uploads_receipt_is_committed_without_an_fsync_and_its_begin_with_one(
    spool: Spool,
) -> None:
    """The receipt's commit need not wait for the disk: lost to a power cut,
    the upload is open again with its stored bytes and key, and sending them
    again is answered with the receipt of the stored one. The episodes'
    commit and the upload's begin (its bytes and key, before the request
    leaves) still wait for it, and the connection goes back to FULL."""
    db = spool._writer_connection()
    commits = _synchronous_at_each_commit(db)
    spool.intake.ingest([_batch(_arrivals(3))], mode="online")
    seqs = [row.seq for row in spool.delivery.pending_episodes("run-1", max_bytes=BIG)]
    spool.delivery.begin_traces_upload("run-1", seqs, "upload-1", b"body", encoding="gzip")
    spool.delivery.commit_traces_upload("run-1", "upload-1")
    spool.intake.ingest([_batch(_arrivals(1, seed=5))], mode="online")
    db.set_trace_callback(None)

    assert commits == ["FULL", "FULL", "NORMAL", "FULL"]
    assert db.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
    assert spool.housekeeping.counts().episodes["delivered"] == 3


_KILLED_AFTER_RECEIPT = """
import json, os, signal, sys
from prime_runs_otel.deliver.spool import Spool
from prime_runs_otel.produce.synthetic import synthetic_episodes
from prime_runs_otel.read.episodes import EpisodeArrival
from prime_runs_otel.read.records import RunBatch, RunIdentity

spool = Spool(sys.argv[1], max_bytes=10**12)
records = list(synthetic_episodes(2, seed=3))
arrivals = [EpisodeArrival.of(record, json.dumps(record).encode()) for record in records]
spool.intake.ingest([RunBatch(RunIdentity("run-1"), episodes=arrivals)], mode="online")
seqs = [row.seq for row in spool.delivery.pending_episodes("run-1", max_bytes=10**12)]
spool.delivery.begin_traces_upload("run-1", seqs, "upload-1", b"body", encoding="gzip")
spool.delivery.commit_traces_upload("run-1", "upload-1")
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_receipt_committed_without_an_fsync_outlives_the_process_killed_after_it(
    tmp_path: Path,
) -> None:
    """``kill -9`` right after the receipt's commit: the write-ahead log holds
    it, and the next process finds the upload over and its episodes delivered."""
    path = tmp_path / "spool.sqlite3"
    done = subprocess.run(
        [sys.executable, "-c", _KILLED_AFTER_RECEIPT, str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == -9, done.stderr

    reopened = Spool(path, max_bytes=BIG)
    assert reopened.delivery.open_uploads("run-1") == []
    by_state = reopened.housekeeping.counts().episodes
    assert {state: count for state, count in by_state.items() if count} == {"delivered": 2}


def _checkpoints(spool: Spool, *, paced: list[bool]) -> int:
    """How many of the checkpoints asked for (``paced`` or plain) were made."""
    statements: list[str] = []
    spool._connection().set_trace_callback(statements.append)
    try:
        for each in paced:
            spool.checkpoint(paced=each)
    finally:
        spool._connection().set_trace_callback(None)
    return sum("wal_checkpoint" in statement for statement in statements)


def test_a_paced_checkpoint_waits_its_pace_and_a_plain_one_never_does(
    spool: Spool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The uploader checkpoints at most once per ``CHECKPOINT_PACE``: a
    checkpoint waits for the disk twice, and the next upload waited for it."""
    spool.intake.ingest([_batch(_arrivals(1))], mode="local")
    monkeypatch.setattr(core, "CHECKPOINT_PACE", 3600.0)
    # The first paced one of this process goes, the next within the pace
    # does not; one asked for plainly always goes.
    assert _checkpoints(spool, paced=[True, True, False]) == 2
    monkeypatch.setattr(core, "CHECKPOINT_PACE", 0.0)
    assert _checkpoints(spool, paced=[True, True]) == 2


def test_on_a_disk_short_of_room_every_paced_checkpoint_goes(
    spool: Spool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A checkpoint lets the log start over: on a disk nearly full, the log
    must not grow for a pace into the room episodes need."""
    spool.intake.ingest([_batch(_arrivals(1))], mode="local")
    monkeypatch.setattr(core, "CHECKPOINT_PACE", 3600.0)
    monkeypatch.setattr(core, "CHECKPOINT_PACED_ROOM", 2**62)
    assert _checkpoints(spool, paced=[True, True, True]) == 3
