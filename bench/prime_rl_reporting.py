"""The prime_rl instrumentation against prime-rl's own ``PrimeMonitor``: what
reporting costs the orchestrator per step.

Each side runs in its own fresh subprocess against one fake platform on
loopback, with the stand-in of prime-rl's monitors (``tests/prime_rl_standin``,
which follows prime-rl at the commit its README names) on ``PYTHONPATH``, and
makes the orchestrator's calls in its order, on one asyncio event loop: every
rollout as it arrives (``log([episode], step, "train", "all")``), then the
step's effective cohort and its metrics dict, and ``finalize`` at the end.

- prime:  prime-rl's ``PrimeMonitor`` (fire-and-forget httpx requests on the
          loop, the Parquet table of every 10th step in a worker thread)
- otel:   the ``prime_rl`` instrumentation (``OTEL_TRACES_EXPORTER=prime_runs``):
          every rollout an episode span, the rows and tables through the spool

Printed per side: CPU on the event-loop thread per step (``time.thread_time``
around the step's monitor calls: what the orchestrator's dispatch loop pays),
wall time of those calls per step, whole-process CPU per step from the first
step to the end of ``finalize`` (every thread: the monitor's, the SDK's, the
uploader's, httpx's), and what the platform stored; then ``name value unit``
lines. The rollouts are built before measuring and frozen out of the garbage
collector's view, as in ``instrumentation.py``.

    python bench/prime_rl_reporting.py [--rollouts 256] [--steps 11] [--rounds 2]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from in_process import CHILD_FLAG, machine, percentile, print_side_by_side, run_child

HERE = Path(__file__).resolve().parent
STANDIN = HERE.parent / "tests" / "prime_rl_standin"


# -- child side: one measured run ------------------------------------------------------


def build_rollouts(steps: int, count: int) -> list[list[Any]]:
    """``count`` verifiers Episodes per step, as the dispatcher hands them over."""
    from verifiers.v1 import WireEpisode

    from prime_runs_otel.produce.synthetic import synthetic_episodes

    batches = []
    for step in range(steps):
        batch = []
        for index, record in enumerate(synthetic_episodes(count, seed=step)):
            record["id"] = f"train-{step}-{index}"
            record["run"] = {
                "type": "train",
                "id": "bench",
                "work": {"type": "train", "step": step},
            }
            record["traces"][0]["info"]["advantage"] = 0.01 * (index % 50) - 0.25
            batch.append(WireEpisode.model_validate(record))
        batches.append(batch)
    return batches


async def orchestrate(batches: list[list[Any]], output_dir: Path) -> dict[str, Any]:
    from prime_rl import monitors
    from prime_rl.configs.monitors import OrchestratorMonitorsConfig, PrimeMonitorConfig
    from prime_rl.configs.orchestrator import EnvConfig, OrchestratorConfig, TrainConfig

    config = OrchestratorConfig(
        max_steps=len(batches),
        batch_size=len(batches[0]),
        group_size=8,
        output_dir=output_dir,
        train=TrainConfig(source=[EnvConfig(env_id="gsm8k-demo")]),
        monitors=OrchestratorMonitorsConfig(prime=PrimeMonitorConfig(name="bench"), file=None),
    )
    await monitors.setup(
        prime=config.monitors.prime, file=None, output_dir=output_dir, run_config=config
    )
    loop_cpu: list[float] = []
    loop_wall: list[float] = []
    process_start = time.process_time()
    wall_start = time.perf_counter()
    for step, batch in enumerate(batches):
        cpu, wall = time.thread_time(), time.perf_counter()
        for episode in batch:
            await monitors.log([episode], step, "train", "all")
        await monitors.log(batch[: len(batch) * 7 // 8], step, "train", "effective")
        metrics = {"train/agg/reward/mean/all": 0.5, "progress/rollouts": len(batch), "step": step}
        await monitors.log(metrics, step=step)
        loop_cpu.append(time.thread_time() - cpu)
        loop_wall.append(time.perf_counter() - wall)
        await asyncio.sleep(0)  # the loop turns between steps, as it does waiting for rollouts
    await monitors.finalize()
    return {
        "loop_cpu": loop_cpu,
        "loop_wall": loop_wall,
        "process_cpu": time.process_time() - process_start,
        "wall": time.perf_counter() - wall_start,
    }


def child_main(side: str, steps: int, rollouts: int) -> None:
    if side == "otel":
        from prime_runs_otel.instrumentation.prime_rl import _hook

        _hook.install()
    batches = build_rollouts(steps, rollouts)
    gc.collect()
    gc.freeze()
    import tempfile

    with tempfile.TemporaryDirectory() as output_dir:
        figures = asyncio.run(orchestrate(batches, Path(output_dir)))
    print(json.dumps(figures))


# -- parent side -------------------------------------------------------------------------


def run_side(side: str, args: argparse.Namespace, env: dict[str, str]) -> dict[str, Any]:
    return run_child(__file__, side, [str(args.steps), str(args.rollouts)], env)


def summarise(runs: list[dict[str, Any]], steps: int) -> dict[str, float]:
    loop_cpu = [value for run in runs for value in run["loop_cpu"]]
    loop_wall = [value for run in runs for value in run["loop_wall"]]
    return {
        "loop_cpu_ms_per_step": statistics.mean(loop_cpu) * 1000,
        "loop_cpu_ms_per_step_p99": percentile(loop_cpu, 0.99) * 1000,
        "loop_wall_ms_per_step": statistics.mean(loop_wall) * 1000,
        "process_cpu_ms_per_step": statistics.mean(run["process_cpu"] for run in runs)
        * 1000
        / steps,
        "wall_s_per_run": statistics.mean(run["wall"] for run in runs),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rollouts", type=int, default=256, help="rollouts per step")
    parser.add_argument("--steps", type=int, default=11, help="steps (tables at 0 and 10)")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()

    from prime_runs_otel.testing import FakePlatform

    print(machine())
    print(f"{args.rollouts} rollouts per step, {args.steps} steps, {args.rounds} round(s)")
    results: dict[str, list[dict[str, Any]]] = {"otel": [], "sdk": []}
    with FakePlatform() as platform:
        env = dict(os.environ)
        env.update(platform.client_env())
        env["PRIME_API_BASE"] = f"{platform.url}/api/v1/rft"
        env["PYTHONPATH"] = os.pathsep.join([str(STANDIN), str(HERE), env.get("PYTHONPATH", "")])
        env.update(
            OTEL_TRACES_EXPORTER="prime_runs",
            OTEL_METRICS_EXPORTER="none",
            OTEL_LOGS_EXPORTER="none",
        )
        for _ in range(args.rounds):
            for side in ("otel", "sdk"):
                results[side].append(run_side(side, args, env))
        stored = {
            run.id: (
                len(platform.episodes(run.id)),
                len(platform.training_metrics(run.id)),
                len(platform.training_samples(run.id)),
            )
            for run in platform.runs()
        }
    print("(sdk here is prime-rl's own PrimeMonitor)")
    figures = {side: summarise(runs, args.steps) for side, runs in results.items()}
    print_side_by_side("prime_rl", figures, lambda name: "s" if name.startswith("wall") else "ms")
    print("stored per run (episodes, metrics rows, sample tables):", sorted(stored.values()))


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == CHILD_FLAG:
        child_main(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    else:
        main()
