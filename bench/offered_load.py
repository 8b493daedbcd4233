"""Offered load: episodes recorded at a fixed rate for a fixed time, with the
SDK's default BatchSpanProcessor settings and with the ones start_run chooses.

For each (settings, rate) a fresh subprocess records against one fake platform
on loopback and reports: the rate it achieved, episode spans the SDK dropped
before the exporter saw them, episodes delivered to the platform, and the
BatchSpanProcessor queue depth (max and mean, sampled every 50 ms).

    python bench/offered_load.py [--rates 500,2000,8000] [--duration 30]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from in_process import fresh_copy, machine, percentile

CHILD_FLAG = "--child"


class PlainRun:
    """The SDK's defaults, as code that owns its TracerProvider gets them: a
    BatchSpanProcessor with the SDK's settings, no backpressure (its queue
    counted, never waited on)."""

    def __init__(self, name: str) -> None:
        from opentelemetry.sdk.trace import TracerProvider

        import prime_runs_otel
        from prime_runs_otel.batching import BspSettings, CountedBatchProcessor

        self._pro = prime_runs_otel
        resource = prime_runs_otel.run_resource(name=name, environments=["bench-env"])
        self.id = str(resource.attributes["prime.run.id"])
        self.exporter = prime_runs_otel.PrimeRunsSpanExporter(shutdown_timeout=0)
        self._provider = TracerProvider(resource=resource)
        # The SDK's own defaults: 2,048 spans, 5 s, batches of 512.
        self._queue = CountedBatchProcessor(self.exporter, BspSettings(2048, 5000, 512, 30000))
        self._provider.add_span_processor(self._queue)
        self.tracer = self._provider.get_tracer("bench")
        self.count = 0
        prime_runs_otel.emit_run_start(self.tracer, {})

    def record_episode(self, record: dict[str, Any]) -> None:
        self.count += 1
        self._pro.record_episode(self.tracer, record)

    def finish(self, timeout: float) -> Any:
        self._pro.emit_run_end(self.tracer, "completed", episodes_recorded=self.count)
        self._provider.force_flush()
        run = self.exporter.wait_closed(self.id, timeout)
        self._provider.shutdown()
        return run


def child(rate: int, duration: float, plain: bool) -> dict[str, Any]:
    from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor

    import prime_runs_otel
    from prime_runs_otel.produce.synthetic import synthetic_episodes

    class CountEpisodes(SpanProcessor):
        """Counts episode spans as they end, before any queue can drop them."""

        def __init__(self) -> None:
            self.ended = 0

        def on_end(self, span: ReadableSpan) -> None:
            if span.attributes and "prime.episode.id" in span.attributes:
                self.ended += 1

    export_ms: list[float] = []
    original_export = prime_runs_otel.PrimeRunsSpanExporter.export

    def timed_export(self: Any, spans: Any) -> Any:
        started = time.perf_counter()
        try:
            return original_export(self, spans)
        finally:
            export_ms.append(1000 * (time.perf_counter() - started))

    prime_runs_otel.PrimeRunsSpanExporter.export = timed_export  # type: ignore[method-assign]
    pool = list(synthetic_episodes(2000, seed=1))
    # child_spans=False: what start_run does by itself; the counting processor
    # added below would otherwise count as somebody listening for them.
    run: Any = (
        PlainRun(f"load-{rate}")
        if plain
        else prime_runs_otel.start_run(
            name=f"load-{rate}", environments=["bench-env"], child_spans=False
        )
    )
    counter = CountEpisodes()
    provider = run._provider
    provider.add_span_processor(counter)
    processor = run._queue  # the run's ProducerBatches: spans waiting for their batch (public)
    depths: list[int] = []
    sampling = threading.Event()

    def sample() -> None:
        while not sampling.wait(0.05):
            depths.append(processor.queued)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    started = time.perf_counter()
    sent = 0
    while True:
        now = time.perf_counter() - started
        if now >= duration:
            break
        # Catch up in bursts of at most 50 ms worth of episodes, so a producer
        # that cannot keep the rate still stops at the deadline.
        due = min(int(now * rate) + 1, sent + max(1, rate // 20))
        while sent < due:
            record = fresh_copy(pool[sent % len(pool)], sent)
            run.record_episode(record)
            sent += 1
        ahead = sent / rate - (time.perf_counter() - started)
        if ahead > 0:
            time.sleep(ahead)
    elapsed = time.perf_counter() - started
    sampling.set()
    result = run.finish(timeout=900)
    stored = result.episodes
    return {
        "offered": rate,
        "achieved": sent / elapsed,
        "recorded": sent,
        "episode_spans_ended": counter.ended,
        "stored": stored,
        "dropped": counter.ended - stored,
        "delivered_closed": result.closed,
        "platform_id": result.platform_id,
        "queue_max": max(depths) if depths else 0,
        "queue_mean": sum(depths) / len(depths) if depths else 0.0,
        "queue_capacity": processor.settings.max_queue_size,
        "batch_size": processor.settings.max_export_batch_size,
        "export_p50_ms": percentile(export_ms, 0.5),
        "export_p99_ms": percentile(export_ms, 0.99),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", default="500,2000,8000")
    parser.add_argument("--duration", type=float, default=30.0)
    args = parser.parse_args()
    rates = [int(rate) for rate in args.rates.split(",")]

    from prime_runs_otel.testing import FakePlatform

    print(machine())
    rows = []
    with FakePlatform() as fake:
        base = {k: v for k, v in os.environ.items() if not k.startswith(("PRIME_", "OTEL_"))}
        for label in ("sdk-defaults", "start_run"):
            for rate in rates:
                with tempfile.TemporaryDirectory() as spool:
                    env = {**base, **fake.client_env(), "PRIME_RUNS_OTEL_DIR": spool}
                    done = subprocess.run(
                        [
                            sys.executable,
                            __file__,
                            CHILD_FLAG,
                            str(rate),
                            str(args.duration),
                            label,
                        ],
                        env=env,
                        capture_output=True,
                        text=True,
                        timeout=3600,
                        check=False,
                    )
                if done.returncode != 0:
                    raise SystemExit(f"{label} at {rate}/s failed:\n{done.stderr[-3000:]}")
                row = json.loads(done.stdout.strip().splitlines()[-1])
                row["settings"] = label
                row["delivered"] = len(fake.episodes(row["platform_id"] or ""))
                rows.append(row)
                print(f"  {label} {rate}/s done", file=sys.stderr)

    print(
        f"\n{'settings':<13} {'offered/s':>9} {'achieved/s':>10} {'recorded':>9} "
        f"{'dropped':>8} {'delivered':>9} {'queue max':>9} {'queue mean':>10} {'capacity':>8} "
        f"{'batch':>5} {'export p50':>10} {'export p99':>10}"
    )
    for row in rows:
        print(
            f"{row['settings']:<13} {row['offered']:>9} {row['achieved']:>10.0f} "
            f"{row['recorded']:>9} {row['dropped']:>8} {row['delivered']:>9} "
            f"{row['queue_max']:>9} {row['queue_mean']:>10.0f} {row['queue_capacity']:>8} "
            f"{row['batch_size']:>5} {row['export_p50_ms']:>10.1f} {row['export_p99_ms']:>10.1f}"
        )
    print()
    for row in rows:
        prefix = f"offered_load.{row['settings']}.{row['offered']}"
        print(f"{prefix}.achieved {row['achieved']:.1f} episodes/s")
        print(f"{prefix}.dropped {row['dropped']} episodes")
        print(f"{prefix}.delivered {row['delivered']} episodes")
        print(f"{prefix}.queue_max {row['queue_max']} spans")
        print(f"{prefix}.export_p50 {row['export_p50_ms']:.1f} ms")
        print(f"{prefix}.export_p99 {row['export_p99_ms']:.1f} ms")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == CHILD_FLAG:
        plain = sys.argv[4] == "sdk-defaults"
        print(json.dumps(child(int(sys.argv[2]), float(sys.argv[3]), plain)))
    else:
        main()
