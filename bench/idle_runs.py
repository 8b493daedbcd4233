"""An idle ``serve`` with many open runs: the CPU it takes doing nothing.

A spool is filled with ``--runs`` open runs (no episodes, no end), then
``serve`` is started on it and left alone: after a warm-up, its CPU time
over ``--seconds`` is the cost of watching those runs (the run log, the
delivery loop) while nothing happens.

    python bench/idle_runs.py [--runs 20000] [--seconds 10]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from collector import cpu_seconds
from hostile import start_serve

from prime_runs_otel.config import DEFAULT_SPOOL_MAX_BYTES
from prime_runs_otel.deliver.spool import Spool
from prime_runs_otel.read.records import RunBatch, RunIdentity, RunStart


def fill(spool_dir: Path, runs: int) -> None:
    spool_dir.mkdir(parents=True, mode=0o700)
    spool = Spool(spool_dir / "spool.sqlite3", max_bytes=DEFAULT_SPOOL_MAX_BYTES)
    try:
        for first in range(0, runs, 1000):
            batches = [
                RunBatch(
                    identity=RunIdentity(local_id=f"idle-{n}", name=f"idle {n}"),
                    start=RunStart({"n": n}),
                )
                for n in range(first, min(first + 1000, runs))
            ]
            spool.intake.ingest(batches, mode="local", register_producer=False)
    finally:
        spool.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20_000)
    parser.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as root:
        spool_dir = Path(root) / "spool"
        fill(spool_dir, args.runs)
        # The last --spool-dir given wins: the one filled above.
        serve, _ = start_serve(root, "--spool-dir", str(spool_dir))
        try:
            time.sleep(3.0)  # past start-up and the first look at every run
            before = cpu_seconds(serve.pid)  # type: ignore[attr-defined]
            time.sleep(args.seconds)
            used = cpu_seconds(serve.pid) - before  # type: ignore[attr-defined]
        finally:
            serve.terminate()  # type: ignore[attr-defined]
            serve.wait()  # type: ignore[attr-defined]
    print(f"serve_idle_cpu_{args.runs}_open_runs {used / args.seconds:.3f} cores")


if __name__ == "__main__":
    main()
