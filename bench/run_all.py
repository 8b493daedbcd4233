"""`make bench`: every benchmark, one after the other, figures on stdout.

Quick mode (`--quick`) shortens each run for a smoke check; the figures in
docs/performance.md come from a full run.
"""

from __future__ import annotations

import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def run(script: str, *args: str) -> None:
    print(f"\n=== {script} {' '.join(args)}", flush=True)
    subprocess.run([sys.executable, os.path.join(HERE, script), *args], check=True)


def main() -> None:
    quick = "--quick" in sys.argv
    if quick:
        run("in_process.py", "--episodes", "300", "--rounds", "1")
        run("in_process.py", "--episodes", "300", "--rounds", "1", "--rate", "400")
        run("instrumentation.py", "--episodes", "200", "--rounds", "1")
        run("prime_rl_reporting.py", "--rollouts", "64", "--steps", "3", "--rounds", "1")
        run("offered_load.py", "--rates", "500,2000", "--duration", "5")
        run("collector.py", "--episodes", "500")
        run("hostile.py", "--mib", "2", "--episodes", "1000", "--bodies", "2")
        run("idle_runs.py", "--runs", "2000", "--seconds", "3")
        run("scaling.py", "--checkpoints", "2000,10000")
    else:
        run("in_process.py", "--episodes", "2000", "--rounds", "3")
        # Latency as the pipeline adds it: episodes at a pace both sides keep up with.
        run("in_process.py", "--episodes", "2000", "--rounds", "3", "--rate", "400")
        for size, count in (
            ("4000", "2000"),
            ("65536", "500"),
            ("1048576", "60"),
            ("20971520", "4"),
        ):
            run("in_process.py", "--episodes", count, "--rounds", "1", "--size", size)
        run("instrumentation.py", "--episodes", "1000", "--rounds", "3")
        run("prime_rl_reporting.py", "--rollouts", "256", "--steps", "11", "--rounds", "2")
        run("offered_load.py", "--rates", "500,2000,8000", "--duration", "30")
        run("collector.py", "--rounds", "3")
        run("hostile.py")
        run("idle_runs.py")
        # Last: the longest (a million episodes take a while on two cores).
        run("scaling.py", "--checkpoints", "10000,100000,1000000")


if __name__ == "__main__":
    main()
