"""The spool's commit path alone: what ``export()`` costs once its spans are read.

``--batches`` batches of ``--per-batch`` episodes (made and digested before
the clock starts) are committed into a fresh spool, one ``ingest`` call per
batch, as the in-process exporter makes them: the run registered with this
process as its producer, online, bodies kept after delivery. Nothing
delivers, so every batch lands in a growing run, as during a real run before
the uploader catches up.

The run is keyed as ``start_run`` keys one (32 hex digits): every index of
``episodes`` leads with the run's key, so a shorter one makes each index
entry, and so each commit, cheaper than a real run's. Runs longer than
``POOL`` episodes reuse a pool of that many records under fresh episode ids
(a run of 20,000 then needs no gigabyte of records made beforehand).

Printed per round: CPU time per episode (user + system of the process, from
``getrusage``: what the commit costs whatever else runs on the machine), the
same over the first and the last tenth of the batches (thread CPU of the
commits alone: how the cost grows with the run, whose random index inserts
dirty more pages per commit as the indexes grow), and wall time per batch
(mostly the fsync of each commit).

``--against DIR`` runs the same measurement with the package found in DIR
(a checkout of another version, e.g. ``git archive main | tar -x -C DIR``)
interleaved with this one, round by round, and prints the minimum and the
median of each side, so a change is judged on the same machine at the same
moments.

    python bench/spool_ingest.py [--batches 100] [--per-batch 64] [--rounds 5]
    python bench/spool_ingest.py --batches 320 --rounds 3   # a run of 20,480 episodes
    python bench/spool_ingest.py --against ../main-copy --rounds 7
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

CHILD_FLAG = "--child"
#: Distinct records made for a round; a longer run reuses them under fresh ids.
POOL = 2000


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def measure(batches: int, per_batch: int, size: int) -> dict[str, Any]:
    """One round in this process: a fresh spool, ``batches`` commits."""
    from prime_runs_otel.deliver.spool import Spool
    from prime_runs_otel.produce.synthetic import synthetic_episodes
    from prime_runs_otel.read.episodes import EpisodeArrival
    from prime_runs_otel.read.records import RunBatch, RunIdentity

    run_key = uuid.uuid4().hex  # as start_run keys a run
    identity = RunIdentity(local_id=run_key, environments=("env",))
    count = batches * per_batch
    pool = [
        EpisodeArrival.of(record, json.dumps(record).encode())
        for record in synthetic_episodes(min(count, POOL), seed=7, target_bytes=size)
    ]
    arrivals = [
        pool[number] if number < len(pool) else _renamed(pool[number % len(pool)], number)
        for number in range(count)
    ]
    work = [
        [RunBatch(identity=identity, episodes=arrivals[start : start + per_batch])]
        for start in range(0, len(arrivals), per_batch)
    ]
    commit_cpu: list[float] = []
    with tempfile.TemporaryDirectory() as folder:
        spool = Spool(Path(folder) / "spool.sqlite3", max_bytes=1 << 40)
        cpu, wall = _cpu_seconds(), time.perf_counter()
        for batch in work:
            started = time.thread_time()
            spool.intake.ingest(batch, mode="online")
            commit_cpu.append(time.thread_time() - started)
        cpu, wall = _cpu_seconds() - cpu, time.perf_counter() - wall
        run = spool.reading.run(run_key)
        stored = run.episodes if run is not None else 0
        spool.close()
    tenth = max(1, len(work) // 10)
    return {
        "cpu_ms_per_episode": 1000 * cpu / len(arrivals),
        "first_tenth_ms_per_episode": 1000 * sum(commit_cpu[:tenth]) / (tenth * per_batch),
        "last_tenth_ms_per_episode": 1000 * sum(commit_cpu[-tenth:]) / (tenth * per_batch),
        "wall_ms_per_batch": 1000 * wall / len(work),
        "stored": stored,
        "episodes": len(arrivals),
        "package": str(Path(sys.modules["prime_runs_otel"].__file__ or "").parent),
    }


def _renamed(arrival: Any, number: int) -> Any:
    """A pooled episode under a fresh id: a run never holds one id twice."""
    return dataclasses.replace(arrival, episode_id=f"{arrival.episode_id}-{number}")


def run_child(args: argparse.Namespace, pythonpath: str | None) -> dict[str, Any]:
    env = dict(os.environ)
    if pythonpath is not None:
        env["PYTHONPATH"] = pythonpath
    command = [
        sys.executable,
        __file__,
        CHILD_FLAG,
        "--batches",
        str(args.batches),
        "--per-batch",
        str(args.per_batch),
        "--size",
        str(args.size),
    ]
    result = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
    figures: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    return figures


def summary(name: str, rounds: list[dict[str, Any]]) -> str:
    cpu = [r["cpu_ms_per_episode"] for r in rounds]
    first = [r["first_tenth_ms_per_episode"] for r in rounds]
    last = [r["last_tenth_ms_per_episode"] for r in rounds]
    wall = [r["wall_ms_per_batch"] for r in rounds]
    return (
        f"{name:>8}: CPU/episode min {min(cpu):.4f} median {statistics.median(cpu):.4f} ms "
        f"(first / last tenth of the run, medians: {statistics.median(first):.4f} / "
        f"{statistics.median(last):.4f} ms); "
        f"wall/batch min {min(wall):.2f} median {statistics.median(wall):.2f} ms "
        f"({rounds[0]['package']})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--batches", type=int, default=100)
    parser.add_argument("--per-batch", type=int, default=64)
    parser.add_argument("--size", type=int, default=8000, help="bytes per episode, about")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--against", help="a folder holding another prime_runs_otel to compare")
    parser.add_argument(CHILD_FLAG, action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.batches, args.per_batch, args.size)))
        return
    sides: dict[str, list[dict[str, Any]]] = {"this": []}
    if args.against:
        sides["against"] = []
    for number in range(args.rounds):
        for name in sides:
            figures = run_child(args, args.against if name == "against" else None)
            sides[name].append(figures)
            print(
                f"round {number + 1} {name}: {figures['cpu_ms_per_episode']:.4f} ms CPU/episode "
                f"(first / last tenth {figures['first_tenth_ms_per_episode']:.4f} / "
                f"{figures['last_tenth_ms_per_episode']:.4f}), "
                f"{figures['wall_ms_per_batch']:.2f} ms/batch",
                flush=True,
            )
    print(f"load average {os.getloadavg()[0]:.2f}")
    for name, rounds in sides.items():
        print(summary(name, rounds))


if __name__ == "__main__":
    main()
