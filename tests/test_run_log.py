"""``serve``'s run log: each run opening and closing is logged once, and a
look at a spool where nothing changed reads no run (with twenty thousand
open runs, reading every row each second took most of a core)."""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from prime_runs_otel.collector.run_log import RunWatcher
from prime_runs_otel.config import DEFAULT_SPOOL_MAX_BYTES, resolve_settings
from prime_runs_otel.deliver.spool import Spool, SpoolReading
from prime_runs_otel.read.records import RunBatch, RunEnd, RunIdentity


@pytest.fixture
def spool(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Spool]:
    monkeypatch.setenv("PRIME_RUNS_MODE", "local")
    opened = Spool(tmp_path / "spool" / "spool.sqlite3", max_bytes=DEFAULT_SPOOL_MAX_BYTES)
    try:
        yield opened
    finally:
        opened.close()


def _open_runs(spool: Spool, count: int) -> None:
    batches = [
        RunBatch(identity=RunIdentity(local_id=f"run-{n}", name=f"n{n}")) for n in range(count)
    ]
    spool.intake.ingest(batches, mode="local", register_producer=False)


def _age_every_run(spool: Spool, seconds: float) -> None:
    """As if the runs were last touched ``seconds`` ago."""
    with sqlite3.connect(spool.path) as db:
        db.execute("UPDATE runs SET updated_at = updated_at - ?", (seconds,))


def _watcher(tmp_path: Path) -> RunWatcher:
    return RunWatcher(resolve_settings(spool_dir=str(tmp_path / "spool")))


def test_runs_opening_and_closing_are_logged_once(
    tmp_path: Path, spool: Spool, caplog: pytest.LogCaptureFixture
) -> None:
    _open_runs(spool, 3)
    watcher = _watcher(tmp_path)
    watcher.poll(quiet=True)
    caplog.set_level(logging.INFO, logger="prime_runs_otel.collector.run_log")
    spool.intake.ingest(
        [RunBatch(identity=RunIdentity(local_id="late", name="late one"))],
        mode="local",
        register_producer=False,
    )
    end = RunEnd(status="completed", error=None, episodes_recorded=0)
    spool.intake.ingest([RunBatch(RunIdentity(local_id="run-1"), end=end)], mode="local")
    spool.delivery.update_run("run-1", close_state="closed")
    watcher.poll()
    watcher.poll()
    messages = sorted(record.getMessage() for record in caplog.records)
    assert messages == [
        "run late opened: late one (eval, no environment)",
        "run run-1 closed: completed, 0 episode(s)",
    ]
    watcher.stop()


def test_a_look_at_an_unchanged_spool_reads_no_run(
    tmp_path: Path, spool: Spool, monkeypatch: pytest.MonkeyPatch
) -> None:
    _open_runs(spool, 2000)
    _age_every_run(spool, 60)
    watcher = _watcher(tmp_path)
    watcher.poll(quiet=True)
    read: list[str] = []
    original = SpoolReading._run_from_row

    def counted(self: SpoolReading, row: tuple[Any, ...]) -> Any:
        read.append(row[0])
        return original(self, row)

    monkeypatch.setattr(SpoolReading, "_run_from_row", counted)
    watcher.poll()
    assert read == []
    spool.delivery.update_run("run-7", close_state="closed")
    watcher.poll()
    assert read == ["run-7"]
    watcher.stop()
