"""`make bench`: every benchmark, one after the other, figures on stdout
and in `bench/results/<commit>.json` (see results.py; `make bench-compare
BASE=<commit>` then prints what moved).

Quick mode (`--quick`) shortens each run for a smoke check; the figures in
docs/performance.md come from a full run. `--only NAME[,NAME]` runs only the
scripts of those names (`--only in_process`), and still writes the file.
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys

import results

HERE = os.path.dirname(os.path.abspath(__file__))

FIGURES: dict[str, tuple[float, str]] = {}
LOADS: list[float] = []
ONLY: set[str] = set()


def run(script: str, *args: str) -> None:
    """Run one benchmark, its output shown as it comes, its figures kept
    under a label naming the run (``in_process[--rate 400]/...``)."""
    name = script.removesuffix(".py")
    if ONLY and name not in ONLY:
        return
    label = f"{name}[{' '.join(args)}]" if args else name
    LOADS.append(os.getloadavg()[0])
    print(f"\n=== {script} {' '.join(args)} (load {LOADS[-1]:.2f})", flush=True)
    process = subprocess.Popen(
        [sys.executable, os.path.join(HERE, script), *args], stdout=subprocess.PIPE, text=True
    )
    assert process.stdout is not None
    output = []
    for line in process.stdout:
        sys.stdout.write(line)
        sys.stdout.flush()
        output.append(line)
    if process.wait() != 0:
        raise SystemExit(f"{script} failed (exit {process.returncode})")
    for figure, value in results.figures_in("".join(output)).items():
        FIGURES[f"{label}/{figure}"] = value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="short runs, for a smoke check")
    parser.add_argument("--only", default="", help="scripts to run, by name: in_process,collector")
    args = parser.parse_args()
    ONLY.update(name for name in args.only.split(",") if name)
    measured = results.commit()  # before the runs: a commit made meanwhile is not theirs
    benchmarks(args.quick)
    LOADS.append(os.getloadavg()[0])
    command = shlex.join(["bench/run_all.py", *sys.argv[1:]])
    path = results.write(measured, FIGURES, LOADS, command)
    print(f"\n{len(FIGURES)} figures written to {os.path.relpath(path)}")


def benchmarks(quick: bool) -> None:
    if quick:
        run("in_process.py", "--episodes", "300", "--rounds", "1")
        run("in_process.py", "--episodes", "300", "--rounds", "1", "--rate", "400")
        run("floor.py", "--episodes", "300", "--rounds", "1")
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
        # What each stage the design requires costs at the least, beside the pipeline.
        run("floor.py", "--episodes", "2000", "--rounds", "4")
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
