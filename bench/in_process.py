"""In-process benchmark, side by side with the prime-runs SDK on the same work.

Each side runs in its own fresh subprocess (so CPU time and peak RSS are its
own) against one fake platform on loopback, interleaved over several rounds:

- otel:  start_run → record_episode → the run's producer thread (spans, and
         their batches to the exporter) → spool → uploader → platform, then
         finish()
- sdk:   prime_runs.init → log_episodes → finish (the direct path)

Printed: a table per side, the ratio otel/sdk of every figure, the machine,
and one closing line per figure: ``name value unit``. CPU figures are the
rounds' mean, and also their minimum and median (``..._min``, ``..._median``).

    python bench/in_process.py [--episodes 2000] [--rounds 3] [--size 8000] [--rate 0]

By default each side records as fast as it can (a burst): the latency is then
mostly time queued behind the slower stages, and each side queues in its own
place (prime-runs blocks the caller once 256 records wait; prime-runs-otel
commits them to its spool and lets the caller go on). ``--rate N`` records N
episodes per second instead, below both sides' capacity, so the latency is
what the pipeline itself adds.
"""

from __future__ import annotations

import argparse
import compileall
import gc
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from importlib import metadata
from typing import Any

CHILD_FLAG = "--child"


# -- child side: one measured run -------------------------------------------


def paced(episodes: list[dict[str, Any]], rate: float) -> Any:
    """The episodes, one every ``1/rate`` seconds (all at once when ``rate`` is 0)."""
    if rate <= 0:
        yield from episodes
        return
    start = time.perf_counter()
    for number, episode in enumerate(episodes):
        delay = start + number / rate - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        yield episode


def child_otel(episodes: list[dict[str, Any]], rate: float) -> dict[str, Any]:
    import prime_runs_otel
    from prime_runs_otel.deliver.uploader import Uploader
    from prime_runs_otel.exporter import PrimeRunsSpanExporter
    from prime_runs_otel.run import Run

    export_times: list[float] = []
    stage_cpu = {"build": 0.0, "export": 0.0, "deliver": 0.0}
    original_export = PrimeRunsSpanExporter.export
    original_deliver = Uploader.deliver_once
    original_produce = Run._produce

    def timed_produce(self: Run, item: Any) -> None:
        cpu = time.thread_time()
        try:
            original_produce(self, item)
        finally:
            stage_cpu["build"] += time.thread_time() - cpu

    def timed_export(self: PrimeRunsSpanExporter, spans: Any) -> Any:
        started, cpu = time.perf_counter(), time.thread_time()
        try:
            return original_export(self, spans)
        finally:
            export_times.append(time.perf_counter() - started)
            stage_cpu["export"] += time.thread_time() - cpu

    def timed_deliver(self: Uploader, *args: Any, **kwargs: Any) -> None:
        cpu = time.thread_time()
        try:
            original_deliver(self, *args, **kwargs)
        finally:
            stage_cpu["deliver"] += time.thread_time() - cpu

    # Stage CPU is summed inside the calls themselves, on whichever thread
    # makes them: the worker threads are gone by the time the run is finished.
    PrimeRunsSpanExporter.export = timed_export  # type: ignore[method-assign]
    Uploader.deliver_once = timed_deliver  # type: ignore[method-assign]
    Run._produce = timed_produce  # type: ignore[method-assign]
    recorded_at: dict[str, float] = {}
    cpu0 = time.process_time()
    wall0 = time.perf_counter()
    run = prime_runs_otel.start_run(
        name="bench-otel", model="bench/model", environments=["bench-env"], framework="bench"
    )
    caller_cpu0 = time.thread_time()
    for episode in paced(episodes, rate):
        recorded_at[episode["id"]] = time.time()
        run.record_episode(episode)
    caller_cpu = time.thread_time() - caller_cpu0
    record_wall = time.perf_counter() - wall0
    result = run.finish(timeout=600)
    wall = time.perf_counter() - wall0
    cpu = time.process_time() - cpu0
    return {
        "wall": wall,
        "record_wall": record_wall,
        "cpu": cpu,
        "caller_cpu": caller_cpu,
        "build_cpu": stage_cpu["build"],
        "exporter_cpu": stage_cpu["export"],
        "uploader_cpu": stage_cpu["deliver"],
        "export_ms": [t * 1000 for t in export_times],
        "stored": result.episodes,
        "closed": result.closed,
        "platform_id": result.platform_id,
        "recorded_at": recorded_at,
        "maxrss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
    }


def child_sdk(episodes: list[dict[str, Any]], rate: float) -> dict[str, Any]:
    import prime_runs

    recorded_at: dict[str, float] = {}
    cpu0 = time.process_time()
    wall0 = time.perf_counter()
    run = prime_runs.init(
        name="bench-sdk", model="bench/model", environments=["bench-env"], framework="bench"
    )
    caller_cpu0 = time.thread_time()
    for episode in paced(episodes, rate):
        recorded_at[episode["id"]] = time.time()
        run.log_episodes([episode])
    caller_cpu = time.thread_time() - caller_cpu0
    record_wall = time.perf_counter() - wall0
    run.finish()
    wall = time.perf_counter() - wall0
    cpu = time.process_time() - cpu0
    return {
        "wall": wall,
        "record_wall": record_wall,
        "cpu": cpu,
        "caller_cpu": caller_cpu,
        "build_cpu": 0.0,
        "exporter_cpu": 0.0,
        "uploader_cpu": cpu - caller_cpu,
        "export_ms": [],
        "stored": len(episodes),
        "closed": True,
        "platform_id": run.id,
        "recorded_at": recorded_at,
        "maxrss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
    }


def child_main(side: str, count: int, size: int, seed: int, rate: float) -> None:
    from prime_runs_otel.produce.synthetic import synthetic_episodes

    episodes = list(synthetic_episodes(count, seed=seed, target_bytes=size))
    # Out of the collector's view on both sides: a full collection walking the
    # prepared records would land in whichever side's window it happens to.
    gc.collect()
    gc.freeze()
    measure = child_otel if side == "otel" else child_sdk
    print(json.dumps(measure(episodes, rate)))


# -- parent side -------------------------------------------------------------------


def fresh_copy(record: dict[str, Any], number: int) -> dict[str, Any]:
    """A pooled record under new episode and trace ids: the service refuses
    a trace id twice in one upload, and real episodes never share them."""
    copy = dict(record)
    copy["id"] = f"{record['id']}-{number}"
    copy["traces"] = [
        {**trace, "id": f"{trace.get('id')}-{number}"} for trace in record.get("traces", [])
    ]
    return copy


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


def run_side(side: str, args: argparse.Namespace, env: dict[str, str], seed: int) -> dict[str, Any]:
    if args.export_batch:
        env = {**env, "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": str(args.export_batch)}
    child_args = (args.episodes, args.size, seed, args.rate)
    return run_child(__file__, side, [str(value) for value in child_args], env)


def run_child(script: str, side: str, child_args: list[str], env: dict[str, str]) -> dict[str, Any]:
    """One measured run of ``side`` in a fresh process, with a spool of its
    own; what it printed last, as JSON."""
    with tempfile.TemporaryDirectory() as spool:
        done = subprocess.run(
            [sys.executable, script, CHILD_FLAG, side, *child_args],
            env={**env, "PRIME_RUNS_OTEL_DIR": spool},
            capture_output=True,
            text=True,
            timeout=1800,
            check=False,
        )
    if done.returncode != 0:
        raise SystemExit(f"{side} run failed:\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def latencies(fake: Any, measured: dict[str, Any]) -> list[float]:
    """record_episode → the platform's receipt of the upload holding it."""
    received: dict[str, float] = {}
    uploads = fake.uploads() if callable(fake.uploads) else fake.uploads
    for upload in uploads:
        if measured["platform_id"] not in upload.run_ids:
            continue
        for episode_id in upload.record_ids:
            received.setdefault(episode_id, upload.received_at)
    return [
        received[episode_id] - at
        for episode_id, at in measured["recorded_at"].items()
        if episode_id in received
    ]


def summarize(fake: Any, samples: list[dict[str, Any]], episodes: int) -> dict[str, float]:
    lat = [value for sample in samples for value in latencies(fake, sample)]
    exports = [value for sample in samples for value in sample["export_ms"]]
    mean = statistics.mean
    return {
        "episodes_per_s": mean(episodes / s["wall"] for s in samples),
        "cpu_ms_per_episode": mean(1000 * s["cpu"] / episodes for s in samples),
        # The caller's thread: CPU spent in record_episode / log_episodes.
        "caller_cpu_ms_per_episode": mean(1000 * s["caller_cpu"] / episodes for s in samples),
        # The run's producer thread: spans built and records encoded.
        "build_cpu_ms_per_episode": mean(1000 * s["build_cpu"] / episodes for s in samples),
        "exporter_cpu_ms_per_episode": mean(1000 * s["exporter_cpu"] / episodes for s in samples),
        "uploader_cpu_ms_per_episode": mean(1000 * s["uploader_cpu"] / episodes for s in samples),
        "export_p50_ms": percentile(exports, 0.5),
        "export_p99_ms": percentile(exports, 0.99),
        "export_max_ms": max(exports) if exports else float("nan"),
        "dropped": mean(episodes - s["stored"] for s in samples),
        "peak_rss_mb": max(s["maxrss_kb"] for s in samples) / 1024,
        "latency_p50_ms": 1000 * percentile(lat, 0.5),
        "latency_p99_ms": 1000 * percentile(lat, 0.99),
        **_spread(samples, episodes),
    }


#: Per-round CPU figures also read as minimum and median over the rounds:
#: on a shared machine the mean carries whatever load one round met.
SPREAD = ("cpu", "caller_cpu", "build_cpu", "exporter_cpu", "uploader_cpu")


def _spread(samples: list[dict[str, Any]], episodes: int) -> dict[str, float]:
    """``<figure>_ms_per_episode_min`` and ``_median`` of the rounds' CPU figures."""
    figures: dict[str, float] = {}
    for name in SPREAD:
        per_round = [1000 * sample[name] / episodes for sample in samples]
        figures[f"{name}_ms_per_episode_min"] = min(per_round)
        figures[f"{name}_ms_per_episode_median"] = statistics.median(per_round)
    return figures


UNITS = {
    "episodes_per_s": "episodes/s",
    "peak_rss_mb": "MiB",
    "dropped": "episodes",
}


def machine() -> str:
    versions = []
    for package in ("prime-runs-otel", "prime-runs", "prime-traces", "opentelemetry-sdk"):
        try:
            versions.append(f"{package}=={metadata.version(package)}")
        except metadata.PackageNotFoundError:
            versions.append(f"{package} (not installed)")
    return (
        f"machine: {os.cpu_count()} cores, Python {platform.python_version()}, "
        f"{platform.system()} {platform.machine()}; " + ", ".join(versions)
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--size", type=int, default=8000, help="bytes per episode record")
    parser.add_argument(
        "--rate", type=float, default=0.0, help="episodes recorded per second (0: all at once)"
    )
    parser.add_argument(
        "--export-batch", type=int, default=0, help="spans per export() (default: start_run's)"
    )
    args = parser.parse_args()

    import prime_runs_otel
    from prime_runs_otel.testing import FakePlatform

    # Compiled as pip compiles every installed package (prime-runs included):
    # under PYTHONDONTWRITEBYTECODE a checkout would compile afresh in each run.
    compileall.compile_dir(os.path.dirname(prime_runs_otel.__file__), quiet=1)
    print(machine())
    pace = f"{args.rate:g} per second" if args.rate > 0 else "as fast as each side takes them"
    print(
        f"work: {args.episodes} episodes of ~{args.size} bytes, recorded {pace}, "
        f"{args.rounds} interleaved rounds"
    )
    with FakePlatform() as fake:
        env = {
            **{k: v for k, v in os.environ.items() if not k.startswith(("PRIME_", "OTEL_"))},
            **fake.client_env(),
        }
        results: dict[str, list[dict[str, Any]]] = {"otel": [], "sdk": []}
        for round_number in range(args.rounds):
            for side in ("otel", "sdk") if round_number % 2 == 0 else ("sdk", "otel"):
                results[side].append(run_side(side, args, env, seed=round_number))
                print(f"  round {round_number + 1}: {side} done", file=sys.stderr)
        figures = {
            side: summarize(fake, samples, args.episodes) for side, samples in results.items()
        }

    print_side_by_side(
        "in_process",
        figures,
        lambda name: UNITS.get(name, "ms" if name.endswith("_ms") or "_ms_" in name else ""),
    )


def print_side_by_side(
    prefix: str, figures: dict[str, dict[str, float]], unit_of: Callable[[str], str]
) -> None:
    """The table of both sides and their ratio, then one ``name value unit``
    line per figure (``prefix.side.figure``, ``prefix.ratio.figure``)."""
    names = list(figures["otel"])
    width = max(len(name) for name in names) + 1
    print(f"\n{'figure':<{width}} {'otel':>12} {'sdk':>12} {'otel/sdk':>9}")
    for name in names:
        ours, theirs = figures["otel"][name], figures["sdk"][name]
        ratio = ours / theirs if theirs else float("nan")
        print(f"{name:<{width}} {ours:>12.3f} {theirs:>12.3f} {ratio:>9.2f}")
    print()
    for side in ("otel", "sdk"):
        for name in names:
            print(f"{prefix}.{side}.{name} {figures[side][name]:.4f} {unit_of(name)}".rstrip())
    for name in names:
        theirs = figures["sdk"][name]
        if theirs:
            print(f"{prefix}.ratio.{name} {figures['otel'][name] / theirs:.3f} x")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == CHILD_FLAG:
        child_main(
            sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), float(sys.argv[6])
        )
    else:
        main()
