"""Scaling: RSS and spool size as a run grows, and time per episode over the
run's life (it must stay flat: nothing may grow with the number of episodes).

One run in local mode (the whole pipeline except the network) records
episodes in one process; at each checkpoint it prints the episodes so far,
the time per episode over the last stretch, RSS, and the spool's size.

    python bench/scaling.py [--checkpoints 10000,100000,1000000] [--size 4000]
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from in_process import fresh_copy, machine


def rss_mb() -> float:
    with open("/proc/self/statm") as handle:
        pages = int(handle.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoints", default="10000,100000,1000000")
    parser.add_argument("--size", type=int, default=4000, help="bytes per episode record")
    args = parser.parse_args()
    checkpoints = sorted(int(value) for value in args.checkpoints.split(","))

    with tempfile.TemporaryDirectory() as spool_dir:
        os.environ["PRIME_RUNS_OTEL_DIR"] = spool_dir
        os.environ["PRIME_RUNS_MODE"] = "local"
        os.environ["PRIME_RUNS_OTEL_SPOOL_MAX_BYTES"] = str(64 * 2**30)
        import prime_runs_otel
        from prime_runs_otel.produce.synthetic import synthetic_episodes

        print(machine())
        pool = list(synthetic_episodes(1000, seed=2, target_bytes=args.size))
        run = prime_runs_otel.start_run(name="scaling", environments=["bench-env"])
        spool_path = os.path.join(spool_dir, "spool.sqlite3")
        print(f"\n{'episodes':>10} {'us/episode':>11} {'rss MiB':>8} {'spool MiB':>10}")
        rows = []
        done = 0
        for checkpoint in checkpoints:
            started = time.perf_counter()
            stretch = checkpoint - done
            while done < checkpoint:
                record = fresh_copy(pool[done % len(pool)], done)
                run.record_episode(record)
                done += 1
            run._provider.force_flush()
            per_episode = (time.perf_counter() - started) / stretch * 1e6
            spool_mb = (
                sum(
                    os.path.getsize(spool_path + suffix)
                    for suffix in ("", "-wal")
                    if os.path.exists(spool_path + suffix)
                )
                / 2**20
            )
            rows.append((checkpoint, per_episode, rss_mb(), spool_mb))
            print(f"{checkpoint:>10} {per_episode:>11.0f} {rows[-1][2]:>8.0f} {spool_mb:>10.0f}")
        run.finish(timeout=60)
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

    print()
    for checkpoint, per_episode, rss, spool_mb in rows:
        print(f"scaling.{checkpoint}.time_per_episode {per_episode:.1f} us")
        print(f"scaling.{checkpoint}.rss {rss:.1f} MiB")
        print(f"scaling.{checkpoint}.spool {spool_mb:.1f} MiB")
    print(f"scaling.peak_rss {peak:.1f} MiB")


if __name__ == "__main__":
    main()
