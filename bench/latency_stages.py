"""Where the time goes between ``record_episode`` and the platform's receipt,
stage by stage, at a steady rate below the machine's capacity.

One run (``start_run`` defaults) against the fake platform on loopback; each
episode is timed when recorded, when the run's producer thread takes it from
the hand-off, when its span has ended, when the ``export()`` holding it
begins and commits, when the uploader begins the upload holding it, and when
the platform receives that upload. Printed: p50 / p99 of each stage's share,
in milliseconds, and the load of the machine before and after.

    python bench/latency_stages.py [--episodes 500] [--rate 100]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from in_process import fresh_copy, paced, percentile

CHILD_FLAG = "--child"
STAGES = ("recorded", "taken", "span_ended", "export_began", "committed", "upload_began")


def measure(episodes: int, rate: float) -> dict[str, Any]:
    import prime_runs_otel
    from prime_runs_otel.deliver.sinks.traces import TracesSink
    from prime_runs_otel.exporter import PrimeRunsSpanExporter
    from prime_runs_otel.produce.synthetic import synthetic_episodes
    from prime_runs_otel.run import Run
    from prime_runs_otel.semconv import EPISODE_ID

    stamps: dict[str, dict[str, float]] = {}
    original_produce = Run._produce
    original_export = PrimeRunsSpanExporter.export
    original_send = TracesSink.send

    def produce(self: Run, item: Any) -> None:
        episode_id = item[1]
        stamps[episode_id]["taken"] = time.time()
        try:
            original_produce(self, item)
        finally:
            stamps[episode_id]["span_ended"] = time.time()

    def export(self: PrimeRunsSpanExporter, spans: Any) -> Any:
        began = time.time()
        ids = [
            str(span.attributes[EPISODE_ID])
            for span in spans
            if span.attributes and EPISODE_ID in span.attributes
        ]
        try:
            return original_export(self, spans)
        finally:
            committed = time.time()
            for episode_id in ids:
                if episode_id in stamps:
                    stamps[episode_id]["export_began"] = began
                    stamps[episode_id]["committed"] = committed

    def send(self: TracesSink, run: Any, rows: Any) -> None:
        began = time.time()
        for row in rows:
            if row.episode_id in stamps:
                stamps[row.episode_id]["upload_began"] = began
        original_send(self, run, rows)

    Run._produce = produce  # type: ignore[method-assign]
    PrimeRunsSpanExporter.export = export  # type: ignore[method-assign]
    TracesSink.send = send  # type: ignore[method-assign]

    pool = list(synthetic_episodes(min(episodes, 2000), seed=1))
    records = [fresh_copy(pool[n % len(pool)], n) for n in range(episodes)]
    run = prime_runs_otel.start_run(name="stages", environments=["bench-env"])
    for record in paced(records, rate):
        stamps[record["id"]] = {"recorded": time.time()}
        run.record_episode(record)
    result = run.finish(timeout=600)
    return {"platform_id": result.platform_id, "stamps": stamps}


def run_child(episodes: int, rate: float) -> dict[str, dict[str, float]]:
    """The run in a process of its own (the fake platform stays in this one,
    as a platform would be elsewhere); its stamps, with the receipts added."""
    from prime_runs_otel.testing import FakePlatform

    with FakePlatform() as fake, tempfile.TemporaryDirectory() as spool:
        # OTEL_BSP_* is kept: the batch processor's settings are what one compares.
        env = {
            k: v
            for k, v in os.environ.items()
            if k.startswith("OTEL_BSP_") or not k.startswith(("PRIME_", "OTEL_"))
        }
        env.update({**fake.client_env(), "PRIME_RUNS_OTEL_DIR": spool})
        done = subprocess.run(
            [sys.executable, __file__, CHILD_FLAG, str(episodes), str(rate)],
            env=env,
            capture_output=True,
            text=True,
            timeout=1800,
            check=False,
        )
        if done.returncode != 0:
            raise SystemExit(f"the run failed:\n{done.stderr[-3000:]}")
        measured = json.loads(done.stdout.strip().splitlines()[-1])
        stamps: dict[str, dict[str, float]] = measured["stamps"]
        for upload in fake.uploads:
            if measured["platform_id"] in upload.run_ids:
                for episode_id in upload.record_ids:
                    if episode_id in stamps:
                        stamps[episode_id].setdefault("received", upload.received_at)
    return stamps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=500)
    parser.add_argument("--rate", type=float, default=100.0)
    args = parser.parse_args()
    load_before = os.getloadavg()
    stamps = run_child(args.episodes, args.rate)
    load_after = os.getloadavg()
    complete = [s for s in stamps.values() if len(s) == len(STAGES) + 1]
    print(f"load before {load_before[0]:.1f}, after {load_after[0]:.1f}")
    print(f"{len(complete)} of {len(stamps)} episodes timed at every stage\n")
    print(f"{'stage':<32} {'p50 ms':>8} {'p99 ms':>8}")
    steps = (*STAGES, "received")
    for before, after in itertools.pairwise(steps):
        shares = [1000 * (s[after] - s[before]) for s in complete]
        print(
            f"{before + ' → ' + after:<32} {percentile(shares, 0.5):>8.1f} "
            f"{percentile(shares, 0.99):>8.1f}"
        )
    total = [1000 * (s["received"] - s["recorded"]) for s in complete]
    p50, p99 = percentile(total, 0.5), percentile(total, 0.99)
    print(f"{'recorded → received':<32} {p50:>8.1f} {p99:>8.1f}")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == CHILD_FLAG:
        print(json.dumps(measure(int(sys.argv[2]), float(sys.argv[3]))))
    else:
        main()
