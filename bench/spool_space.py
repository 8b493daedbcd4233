"""What ``rm`` and ``compact`` give back, and how long they take.

Two runs of ``--episodes`` synthetic episodes each are stored in a fresh
spool; one is removed. A spool created by this release gives the removed
run's pages back at once (incremental auto-vacuum); one created by an
earlier release (rewritten here without auto-vacuum) keeps them as free
pages until ``compact``. Prints the file's size (with its write-ahead log)
and the time of each step.

    python bench/spool_space.py [--episodes 20000]
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import tempfile
import time
from pathlib import Path

from prime_runs_otel.deliver.spool import Spool
from prime_runs_otel.produce.synthetic import synthetic_episodes
from prime_runs_otel.read.episodes import EpisodeArrival
from prime_runs_otel.read.records import RunBatch, RunIdentity

MiB = 1 << 20


def on_disk(path: Path) -> float:
    wal = Path(f"{path}-wal")
    return (path.stat().st_size + (wal.stat().st_size if wal.exists() else 0)) / MiB


def filled(path: Path, episodes: int, *, older_release: bool) -> Spool:
    records = list(synthetic_episodes(episodes, seed=3))
    arrivals = [EpisodeArrival.of(record, json.dumps(record).encode()) for record in records]
    spool = Spool(path, max_bytes=1 << 40)
    for run_id in ("kept", "removed"):
        identity = RunIdentity(local_id=run_id, environments=("env",))
        for start in range(0, len(arrivals), 500):
            batch = RunBatch(identity=identity, episodes=arrivals[start : start + 500])
            spool.intake.ingest([batch], mode="local")
    spool.close()
    if older_release:
        with sqlite3.connect(path) as db:
            db.executescript("PRAGMA auto_vacuum = NONE; VACUUM")
    spool = Spool(path, max_bytes=1 << 40)
    with sqlite3.connect(path) as db:
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return spool


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=20000, help="episodes per run")
    args = parser.parse_args()
    for older in (False, True):
        with tempfile.TemporaryDirectory() as folder:
            path = Path(folder) / "spool.sqlite3"
            spool = filled(path, args.episodes, older_release=older)
            before = on_disk(path)
            started = time.perf_counter()
            spool.housekeeping.delete_run("removed")
            spool.housekeeping.give_back_space()
            took = time.perf_counter() - started
            kind = "earlier release" if older else "this release"
            print(
                f"{kind}: {before:.0f} MiB; rm of one run {took:.2f} s -> {on_disk(path):.0f} MiB "
                f"on disk, {spool.housekeeping.free_bytes() / MiB:.0f} MiB free pages"
            )
            if older:
                started = time.perf_counter()
                spool.housekeeping.compact()
                took = time.perf_counter() - started
                print(f"  compact {took:.2f} s -> {on_disk(path):.0f} MiB on disk")
            spool.close()


if __name__ == "__main__":
    main()
