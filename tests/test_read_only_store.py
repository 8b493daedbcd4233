"""A store this user may read but not write (a shared results folder, a
mounted backup): ``runs``, ``show``, ``export`` and ``ui`` read it as it is;
``rm``, ``prune`` and ``compact`` say at once that they would need to write
it, naming the folder. Nothing in the store changes.

The store is made read-only as a user meets it: without write bits on the
folder and its files, or, for root (whom no permission bit stops), bind
mounted read-only, as a backup is.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

import prime_runs_otel as pro
from prime_runs_otel.produce.synthetic import synthetic_episodes

TIMEOUT = 180


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "prime_runs_otel.cli", *args],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )


def _digest(folder: Path) -> dict[str, str]:
    return {
        path.name: hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(folder.iterdir())
    }


@pytest.fixture
def read_only_store(tmp_path: Path) -> Iterator[tuple[Path, str]]:
    """A store with one closed run, that this process cannot write."""
    run = pro.start_run(name="shared-results", model="m", environments=["env-a"])
    for record in synthetic_episodes(8, seed=4):
        run.record_episode(record)
    local_id = run.finish(timeout=60).local_id
    store = Path(os.environ["PRIME_RUNS_OTEL_DIR"])
    if os.getuid() != 0:
        for path in store.iterdir():
            path.chmod(0o444)
        store.chmod(0o555)
        try:
            yield store, local_id
        finally:
            store.chmod(0o700)
        return
    mounted = tmp_path / "backup"
    mounted.mkdir()
    bind = subprocess.run(["mount", "--bind", str(store), str(mounted)], capture_output=True)
    # Root writes through any mode bits: only a read-only mount keeps it out.
    assert bind.returncode == 0, f"root cannot bind mount the store here: {bind.stderr!r}"
    try:
        remount = subprocess.run(
            ["mount", "-o", "remount,bind,ro", str(mounted)], capture_output=True, check=False
        )
        assert remount.returncode == 0, remount.stderr
        yield mounted, local_id
    finally:
        subprocess.run(["umount", str(mounted)], check=True)


def test_a_store_that_cannot_be_written_is_read_as_it_is(
    read_only_store: tuple[Path, str],
) -> None:
    store, local_id = read_only_store
    before = _digest(store)
    listed = _cli("runs", "--spool-dir", str(store), "--json")
    assert listed.returncode == 0, listed.stderr
    (row,) = json.loads(listed.stdout)
    assert row["id"] == local_id and row["episodes"] == 8
    assert "cannot write the store" in listed.stderr and str(store) in listed.stderr
    table = _cli("runs", "--spool-dir", str(store))
    assert table.returncode == 0 and "shared-results" in table.stdout, table.stderr
    shown = _cli("show", local_id[:8], "--spool-dir", str(store))
    assert shown.returncode == 0 and "shared-results" in shown.stdout, shown.stderr
    as_json = _cli("show", local_id, "--spool-dir", str(store), "--json")
    assert as_json.returncode == 0 and json.loads(as_json.stdout)["episodes"] == 8
    exported = _cli("export", local_id, "--what", "samples", "--spool-dir", str(store))
    assert exported.returncode == 0, exported.stderr
    assert len(exported.stdout.splitlines()) == 8
    for done in (listed, table, shown, as_json, exported):
        assert "Traceback" not in done.stderr
    assert _digest(store) == before


@pytest.mark.parametrize(
    "args",
    [["rm", "RUN"], ["prune", "--older-than", "0s"], ["compact"]],
    ids=["rm", "prune", "compact"],
)
def test_changing_a_store_that_cannot_be_written_says_so(
    read_only_store: tuple[Path, str], args: list[str]
) -> None:
    store, local_id = read_only_store
    before = _digest(store)
    done = _cli(*[local_id if arg == "RUN" else arg for arg in args], "--spool-dir", str(store))
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"`prime-runs-otel {args[0]}` needs to write to the local store in {store}" in (
        done.stderr
    )
    assert "Traceback" not in done.stderr
    assert _digest(store) == before


@contextmanager
def _viewer(store: Path) -> Iterator[tuple[str, list[str]]]:
    """``prime-runs-otel ui`` on the store: its address (without the final
    slash), and a list that holds what it logged once it has stopped."""
    command = ["ui", "--no-browser", "--port", "0", "--spool-dir", str(store)]
    viewer = subprocess.Popen(
        [sys.executable, "-m", "prime_runs_otel.cli", *command],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    logged: list[str] = []
    try:
        assert viewer.stdout is not None
        first = viewer.stdout.readline()
        assert first.startswith("viewer of "), first + viewer.stderr.read()
        yield first.rsplit(": ", 1)[1].strip().rstrip("/"), logged
    finally:
        viewer.terminate()
        logged.append(viewer.communicate(timeout=60)[1])


def test_the_viewer_serves_a_store_that_cannot_be_written(
    read_only_store: tuple[Path, str],
) -> None:
    store, local_id = read_only_store
    with _viewer(store) as (url, _):
        page = httpx.get(url, timeout=60)
        assert page.status_code == 200 and "shared-results" in page.text
        run_page = httpx.get(f"{url}/runs/{local_id}", timeout=60)
        assert run_page.status_code == 200, run_page.text[:500]


def test_the_viewer_sorts_a_store_that_cannot_be_written_without_making_an_index(
    read_only_store: tuple[Path, str],
) -> None:
    """A store written by this release has no index by reward or tokens
    until someone sorts by them, and here nobody can make one: the pages
    are read without it, the same episodes in the same order."""
    store, local_id = read_only_store
    # Read where the run was written: SQLite keeps a file it closes open while
    # another connection of this process holds the same file (the run's), and
    # the mount of a store of root's could not be taken away.
    written = Path(os.environ["PRIME_RUNS_OTEL_DIR"]) / "spool.sqlite3"
    db = sqlite3.connect(f"file:{written}?mode=ro", uri=True)
    stored = db.execute(
        "SELECT episode_id, seq, reward, tokens FROM episodes WHERE run_id = ?", (local_id,)
    ).fetchall()
    db.close()
    before = _digest(store)
    with _viewer(store) as (url, logged):
        for sort, column in (("reward", 2), ("tokens", 3), ("reward", 2)):
            page = httpx.get(f"{url}/runs/{local_id}/episodes?sort={sort}&order=desc", timeout=60)
            assert page.status_code == 200, page.text[:500]
            listed = re.findall(rf'href="/runs/{local_id}/episodes/([^"/?]+)"', page.text)
            ordered = sorted(
                (row for row in stored if row[column] is not None),
                key=lambda row: (row[column], row[1]),
                reverse=True,
            )
            assert listed == [row[0] for row in ordered], sort
    (errors,) = logged
    assert "Traceback" not in errors
    assert errors.count("has no index episodes_by_reward") == 1, errors
    assert errors.count("has no index episodes_by_tokens") == 1, errors
    assert _digest(store) == before
