"""A full disk: the spool delivers itself out of it, every episode that
could not be kept is counted on its run, and ``doctor`` says the disk is
full.

The disk is real: a small tmpfs mounted for the test (root only, as the CI
runs: see ``small_disks.py``), filled by the spool itself or by a file of
somebody else's.
"""

from __future__ import annotations

import errno
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from small_disks import tmpfs

import prime_runs_otel as pro
from prime_runs_otel.cli.doctor import run_checks
from prime_runs_otel.cli.main import main
from prime_runs_otel.config import resolve_settings
from prime_runs_otel.deliver.spool import Spool
from prime_runs_otel.produce.synthetic import synthetic_episodes
from prime_runs_otel.testing import FakePlatform

#: The spool's cap: its disk reserve is a 64th of it (4 MiB), scaled down to
#: a 16th of the 16 MiB disk (1 MiB).
SPOOL_CAP = 256 * 1024 * 1024


@pytest.fixture
def small_disk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A 16 MiB file system of its own, holding the spool."""
    with tmpfs(tmp_path / "disk", "16m") as disk:
        monkeypatch.setenv("PRIME_RUNS_OTEL_DIR", str(disk / "spool"))
        monkeypatch.setenv("PRIME_RUNS_OTEL_SPOOL_MAX_BYTES", str(SPOOL_CAP))
        yield disk


def _fill(disk: Path) -> Path:
    """Another program's file takes every byte left."""
    filler = disk / "filler"
    chunk = b"\0" * (64 * 1024)
    with open(filler, "wb", buffering=0) as out:
        while True:
            try:
                out.write(chunk)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC
                break
    for size in (4096, 512, 1):  # the last scraps too
        with open(filler, "ab", buffering=0) as out:
            try:
                while True:
                    out.write(b"\0" * size)
            except OSError:
                pass
    return filler


def _free(disk: Path) -> int:
    stat = os.statvfs(disk)
    return stat.f_bavail * stat.f_frsize


def test_the_spool_filling_its_disk_counts_every_episode_it_cannot_keep(
    online: FakePlatform, small_disk: Path
) -> None:
    total = 1500
    with online.outage():
        run = pro.start_run(name="fills-its-disk", environments=["gsm8k"], finish_timeout=60)
        for record in synthetic_episodes(total, seed=1):
            run.record_episode(record)
        run.wait_delivered(0)  # every episode recorded so far is committed or refused
    result = run.finish()

    assert result.closed and result.pending == 0
    [platform_run] = online.runs()
    delivered = len(online.episodes(platform_run.id))
    assert result.rejected > 0, "the disk was meant to fill up"
    assert delivered == result.episodes
    assert delivered + result.failed == total, "every episode delivered or counted"


def test_delivery_drains_a_spool_whose_disk_somebody_else_filled(
    online: FakePlatform, small_disk: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with online.outage():
        run = pro.start_run(name="disk-taken", environments=["gsm8k"], finish_timeout=60)
        for record in synthetic_episodes(100, seed=2):
            run.record_episode(record)
        run.wait_delivered(0)  # every episode recorded so far is committed or refused
        filler = _fill(small_disk)
        assert _free(small_disk) < 64 * 1024
        for record in synthetic_episodes(20, seed=3):
            run.record_episode(record)
        run.wait_delivered(0)  # every episode recorded so far is committed or refused

        checks = {check.name: check for check in run_checks()}
        assert checks["spool"].status == "fail" and "full" in checks["spool"].detail

    started = time.monotonic()
    result = run.finish()
    drained = time.monotonic() - started

    assert result.closed and result.pending == 0, result.describe()
    [platform_run] = online.runs()
    assert platform_run.status == "COMPLETED"
    assert len(online.episodes(platform_run.id)) == result.episodes
    assert result.episodes + result.failed == 120, "every episode delivered or counted"
    print(f"drained {result.episodes} episodes off a full disk in {drained:.1f}s")
    filler.unlink()


def test_push_all_drains_a_full_disk(
    online: FakePlatform, small_disk: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = pro.start_run(name="local", environments=["gsm8k"], mode="local")
    for record in synthetic_episodes(60, seed=4):
        run.record_episode(record)
    run.finish()
    _fill(small_disk)

    capsys.readouterr()
    code = main(["push", "--all", "--drop-local"])
    out, err = capsys.readouterr()

    assert code == 0, out + err
    [platform_run] = online.runs()
    assert platform_run.status == "COMPLETED"
    assert len(online.episodes(platform_run.id)) == 60


def test_a_full_disk_drops_kept_bodies_of_delivered_episodes_first(
    online: FakePlatform, small_disk: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A pushed local run keeps its bodies for `export`; on a full disk the
    platform's copy is enough, and their pages are what delivery reuses."""
    run = pro.start_run(name="kept", environments=["gsm8k"], mode="local")
    for record in synthetic_episodes(40, seed=6):
        run.record_episode(record)
    run.finish()
    assert main(["push", run.id]) == 0, capsys.readouterr()
    spool = Spool(resolve_settings().spool_path, max_bytes=SPOOL_CAP)
    kept = len(list(spool.reading.iter_episodes(run.id)))
    assert kept == 40

    _fill(small_disk)
    spool.housekeeping.keep_room()

    assert len(list(spool.reading.iter_episodes(run.id))) < kept
