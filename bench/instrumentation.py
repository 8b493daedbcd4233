"""The prime_runs instrumentation against prime-runs itself, on the same eval.

Each side runs in its own fresh subprocess against one fake platform on
loopback, interleaved over rounds, and makes vf-eval's calls: ``init``, then
``log_episodes([episode])`` for each finished verifiers ``Episode``, then
``finish(metrics.from_episodes(...))``:

- sdk:   prime-runs 0.1.4 as it is (queue on the caller's thread, upload on
         its worker thread)
- otel:  the same calls with ``PrimeRunsInstrumentor`` on
         (``OTEL_TRACES_EXPORTER=prime_runs``): spans, exporter, spool and
         uploader in the process

Printed per side: the cost of ``log_episodes`` on the caller's thread (CPU
per episode; wall time per call, p50 and p99), whole-process CPU per episode
from ``init`` to the end of ``finish`` (and without ``init``, which is paid
once per run), ``init``'s CPU, the garbage collector's CPU per episode and
its full collections per run, episodes per second, and what the platform
stored; then ``name value unit`` lines.

The episodes are built before measuring and frozen out of the garbage
collector's view (``gc.freeze()``) on both sides. Held as verifiers
``Episode`` objects they are over half a million tracked objects, and one
full collection walks them all: about 0.4 ms per episode of 1,000, as much
as prime-runs' whole cost. Whether that collection fell inside a side's
measured window or just outside it depended on what the process had
allocated before (the instrumentation imports its pipeline in ``init``), and
it alone moved the whole-process ratio between about 1.0x and 1.9x on the
same code. Frozen, a full collection costs each side what its own objects
cost, and the count of full collections shows which side provokes more.

This package's own modules are compiled to bytecode before the first round,
as pip does for prime-runs, verifiers and every other installed package: a
checkout run with ``PYTHONDONTWRITEBYTECODE`` set would otherwise compile
them afresh in every measured ``init``, some 50 ms of CPU only this side pays.

    python bench/instrumentation.py [--episodes 1000] [--rounds 3] [--size 8000]
"""

from __future__ import annotations

import argparse
import compileall
import gc
import json
import os
import resource
import statistics
import sys
import threading
import time
from typing import Any

from in_process import CHILD_FLAG, machine, percentile, print_side_by_side, run_child


def child_main(side: str, count: int, size: int, seed: int) -> None:
    import prime_runs
    from verifiers.v1 import WireEpisode

    from prime_runs_otel.produce.synthetic import synthetic_episodes

    if side == "otel":
        from prime_runs_otel.instrumentation.prime_runs import PrimeRunsInstrumentor

        PrimeRunsInstrumentor().instrument()
    # Episode objects, as vf-eval hands them over; built before measuring.
    episodes = [
        WireEpisode.model_validate(record)
        for record in synthetic_episodes(count, seed=seed, target_bytes=size)
    ]
    gc.collect()
    gc.freeze()
    collector = _CollectorClock()
    gc.callbacks.append(collector)
    call_wall: list[float] = []
    cpu0, wall0 = time.process_time(), time.perf_counter()
    run = prime_runs.init(
        mode="online",
        name=f"bench-{side}",
        model="bench/model",
        environments=["bench-env"],
        framework="verifiers",
    )
    init_cpu = time.process_time() - cpu0
    caller_cpu = 0.0
    for episode in episodes:
        started, thread_cpu = time.perf_counter(), time.thread_time()
        run.log_episodes([episode])
        caller_cpu += time.thread_time() - thread_cpu
        call_wall.append(time.perf_counter() - started)
    run.finish(prime_runs.metrics.from_episodes(episodes), timeout=600)
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    gc.callbacks.remove(collector)
    print(
        json.dumps(
            {
                "cpu": cpu,
                "wall": wall,
                "init_cpu": init_cpu,
                "gc_cpu": collector.cpu,
                "full_collections": collector.full,
                "caller_cpu": caller_cpu,
                "call_wall_ms": [1000 * value for value in call_wall],
                "run_id": run.id,
                "errors": list(run.errors),
                "maxrss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
            }
        )
    )


class _CollectorClock:
    """A ``gc.callbacks`` entry: the collector's CPU, on whichever thread it
    runs, and how many of its collections were full ones."""

    def __init__(self) -> None:
        self.cpu = 0.0
        self.full = 0
        self._started: dict[int, float] = {}

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        thread = threading.get_ident()
        if phase == "start":
            self._started[thread] = time.thread_time()
            return
        started = self._started.pop(thread, None)
        if started is not None:
            self.cpu += time.thread_time() - started
        if info["generation"] == 2:
            self.full += 1


def run_side(side: str, args: argparse.Namespace, env: dict[str, str], seed: int) -> dict[str, Any]:
    return run_child(__file__, side, [str(args.episodes), str(args.size), str(seed)], env)


def summarize(fake: Any, samples: list[dict[str, Any]], episodes: int) -> dict[str, float]:
    calls = [value for sample in samples for value in sample["call_wall_ms"]]
    mean = statistics.mean
    return {
        "log_episodes_cpu_ms_per_episode": mean(1000 * s["caller_cpu"] / episodes for s in samples),
        "log_episodes_wall_p50_ms": percentile(calls, 0.5),
        "log_episodes_wall_p99_ms": percentile(calls, 0.99),
        "process_cpu_ms_per_episode": mean(1000 * s["cpu"] / episodes for s in samples),
        "process_cpu_after_init_ms_per_episode": mean(
            1000 * (s["cpu"] - s["init_cpu"]) / episodes for s in samples
        ),
        "init_cpu_ms": mean(1000 * s["init_cpu"] for s in samples),
        "gc_cpu_ms_per_episode": mean(1000 * s["gc_cpu"] / episodes for s in samples),
        "full_collections_per_run": mean(s["full_collections"] for s in samples),
        "episodes_per_s": mean(episodes / s["wall"] for s in samples),
        "stored_per_run": mean(len(fake.episodes(s["run_id"])) for s in samples),
        "peak_rss_mb": max(s["maxrss_kb"] for s in samples) / 1024,
    }


UNITS = {
    "episodes_per_s": "episodes/s",
    "peak_rss_mb": "MiB",
    "stored_per_run": "episodes",
    "full_collections_per_run": "collections",
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--size", type=int, default=8000, help="bytes per episode record")
    args = parser.parse_args()

    import prime_runs_otel
    from prime_runs_otel.testing import FakePlatform

    compileall.compile_dir(os.path.dirname(prime_runs_otel.__file__), quiet=1)
    print(machine())
    print(f"work: {args.episodes} episodes of ~{args.size} bytes, {args.rounds} interleaved rounds")
    with FakePlatform() as fake:
        env = {
            **{k: v for k, v in os.environ.items() if not k.startswith(("PRIME_", "OTEL_"))},
            **fake.client_env(),
        }
        results: dict[str, list[dict[str, Any]]] = {"otel": [], "sdk": []}
        for round_number in range(args.rounds):
            for side in ("otel", "sdk") if round_number % 2 == 0 else ("sdk", "otel"):
                sample = run_side(side, args, env, seed=round_number)
                if sample["errors"]:
                    raise SystemExit(f"{side} run reported errors: {sample['errors']}")
                results[side].append(sample)
                print(f"  round {round_number + 1}: {side} done", file=sys.stderr)
        figures = {
            side: summarize(fake, samples, args.episodes) for side, samples in results.items()
        }

    print_side_by_side("instrumentation", figures, lambda name: UNITS.get(name, "ms"))


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == CHILD_FLAG:
        child_main(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]))
    else:
        main()
