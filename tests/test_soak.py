"""Platform faults, overload and kills at once, with exact accounting.

Producers (threads, one OpenTelemetry SDK pipeline per run) → the real
collector (``OTELCOL_BIN``, the shipped gateway.yaml, with more queue
consumers than ``serve`` takes calls at once) → ``serve --workers 1`` → the
fake platform, which answers 500, 503 and 429, loses answers after acting,
is slow, and goes away for a while. Meanwhile ``serve`` is killed -9 and
started again, more than once in the long version.

At the end every episode a producer recorded is accounted for: delivered
to the platform exactly once, or counted somewhere a user can see it (the
producer's exporter, the collector's log, the run's counters in ``serve``'s
spool). Every fault here is one that delivery must ride out, so the count
of the second kind must be zero: sent = delivered, nothing silent.

The suite runs the short version (a few runs, one kill, under 30 s); ``make
soak`` runs the long one (``SOAK=long``: hundreds of runs, repeated kills).
"""

from __future__ import annotations

import functools
import os
import signal
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from test_collector import resource
from test_collector_config import CONFIG_DIR
from test_otelcol import Otelcol, overlay
from test_receiver import ServeProcess, serve_env, wait_for

from prime_runs_otel import emit_run_end, emit_run_start, record_episode
from prime_runs_otel import semconv as sc
from prime_runs_otel.config import DEFAULT_SPOOL_MAX_BYTES
from prime_runs_otel.deliver.spool import Spool
from prime_runs_otel.produce.synthetic import synthetic_episodes
from prime_runs_otel.testing import FakePlatform

TOKEN = "soak-token"


@dataclass(frozen=True)
class Scale:
    runs: int
    episodes_per_run: int
    #: serve is killed -9 and started again this many times while producing.
    kills: int
    #: How long the platform is away, once, in seconds.
    outage: float
    #: The whole soak, bounded: past it the test fails with what is missing.
    deadline: float


#: The deadline bounds a hang, not a speed: the short soak takes seconds alone,
#: and its 25 s of old were overrun on two cores shared with the whole suite.
SHORT = Scale(runs=6, episodes_per_run=12, kills=1, outage=1.0, deadline=240.0)
LONG = Scale(runs=120, episodes_per_run=40, kills=6, outage=8.0, deadline=900.0)
SCALE = LONG if os.environ.get("SOAK") == "long" else SHORT


class CountingExporter(SpanExporter):
    """The producer's OTLP exporter, counting the episodes of each batch the
    collector acknowledged or refused: what the producer knows it sent."""

    def __init__(self, inner: SpanExporter) -> None:
        self._inner = inner
        self._lock = threading.Lock()
        self.acknowledged = 0
        self.refused = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        episodes = sum(sc.EPISODE_ID in (span.attributes or {}) for span in spans)
        result = self._inner.export(spans)
        with self._lock:
            if result is SpanExportResult.SUCCESS:
                self.acknowledged += episodes
            else:
                self.refused += episodes
        return result

    def shutdown(self) -> None:
        self._inner.shutdown()

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return self._inner.force_flush(timeout_millis)


@dataclass
class Producer:
    """One run's producer: start, episodes in parts, end."""

    name: str
    records: list[dict[str, Any]]
    exporter: CountingExporter
    provider: TracerProvider
    recorded: int = 0
    flushed: list[bool] = field(default_factory=list)

    @classmethod
    def to(cls, endpoint: str, name: str, records: list[dict[str, Any]]) -> Producer:
        exporter = CountingExporter(OTLPSpanExporter(endpoint=endpoint, insecure=True, timeout=60))
        provider = TracerProvider(resource=resource(name))
        provider.add_span_processor(
            BatchSpanProcessor(exporter, max_queue_size=100_000, max_export_batch_size=16)
        )
        producer = cls(name, records, exporter, provider)
        emit_run_start(provider.get_tracer("soak"), {"soak": name})
        return producer

    def send(self, part: slice) -> None:
        tracer = self.provider.get_tracer("soak")
        for record in self.records[part]:
            record_episode(tracer, record, child_spans=False)
            self.recorded += 1
        self.flushed.append(self.provider.force_flush(60_000))

    def end(self) -> None:
        emit_run_end(
            self.provider.get_tracer("soak"), "completed", episodes_recorded=len(self.records)
        )
        self.flushed.append(self.provider.force_flush(60_000))
        self.provider.shutdown()


def _gateway(root: Path, serve: ServeProcess, started: list[Any]) -> Otelcol:
    """gateway.yaml as shipped, except: retries every 100 ms to 1 s (the
    outages here last seconds), and 16 queue consumers with small batches,
    four times what ``serve --workers 1`` takes at once: the overload."""
    exporter = {
        "retry_on_failure": {"initial_interval": "100ms", "max_interval": "1s"},
        "sending_queue": {"num_consumers": 16, "batch": {"min_size": 1, "max_size": 8}},
    }
    faster = overlay(root, "soak-gateway", {"exporters": {"otlphttp/serve": exporter}})
    collector = Otelcol(
        root,
        "soak-gateway",
        [CONFIG_DIR / "gateway.yaml", faster],
        {"PRIME_RUNS_OTEL_SERVE_URL": serve.url, "PRIME_RUNS_OTEL_SERVE_TOKEN": TOKEN},
    )
    started.append(collector)
    return collector.start()


def _inject_faults(platform: FakePlatform, runs: int) -> None:
    """Faults delivery must ride out, spread over the run: refusals that
    say "not now", answers lost after the work was done, slowness."""
    uploads = r"^/api/v1/traces$"
    platform.fail_next(runs, status=503, path=uploads, retry_after=0.2)
    platform.fail_next(runs, status=500, path=uploads)
    platform.fail_next(runs, status=429, path=uploads, retry_after=0.1)
    platform.ambiguous_next(max(2, runs // 2), path=uploads)
    platform.fail_next(max(2, runs // 3), status=503, method="POST", path=r"/evaluations/?$")
    platform.ambiguous_next(max(1, runs // 4), path=r"/finalize$")
    platform.set_latency(0.01)


def _outage(platform: FakePlatform, seconds: float) -> threading.Thread:
    def away() -> None:
        with platform.outage():
            time.sleep(seconds)

    thread = threading.Thread(target=away, name="platform-outage")
    thread.start()
    return thread


def _counters(serve: ServeProcess) -> dict[str, dict[str, int]]:
    """What serve's spool counted per run as not delivered."""
    spool = Spool(serve.root / "serve-spool" / "spool.sqlite3", max_bytes=DEFAULT_SPOOL_MAX_BYTES)
    try:
        return {
            run.local_id: {
                "corrupt": run.corrupt,
                "rejected": run.rejected,
                "failed": run.failed,
                "uncertain": run.uncertain,
                "unencodable": run.unencodable,
            }
            for run in spool.reading.runs()
        }
    finally:
        spool.close()


@pytest.mark.timeout(SCALE.deadline + 120)
def test_faults_overload_and_kills_together_lose_nothing(
    tmp_path: Path, platform: FakePlatform, started: list[Any]
) -> None:
    began = time.monotonic()
    serve = ServeProcess(
        tmp_path, serve_env(tmp_path, platform), "--token", TOKEN, "--workers", "1"
    ).start()
    started.append(serve)
    collector = _gateway(tmp_path, serve, started)
    _inject_faults(platform, SCALE.runs)

    producers = [
        Producer.to(
            collector.endpoint,
            f"soak-{n}",
            list(synthetic_episodes(SCALE.episodes_per_run, seed=1000 + n)),
        )
        for n in range(SCALE.runs)
    ]
    parts = SCALE.kills + 1
    step = -(-SCALE.episodes_per_run // parts)
    outage: threading.Thread | None = None
    for index in range(parts):
        part = slice(index * step, (index + 1) * step)
        _all_at_once([functools.partial(producer.send, part) for producer in producers])
        if index == parts // 2 and outage is None:
            outage = _outage(platform, SCALE.outage)
        if index < SCALE.kills:
            serve.stop(signal.SIGKILL)  # mid-run: what it took is in its spool
            time.sleep(0.3)  # the gateway queues meanwhile, on disk
            serve.start()
    _all_at_once([producer.end for producer in producers])
    if outage is not None:
        outage.join()

    names = {producer.name for producer in producers}

    def all_closed() -> bool:
        closed = {
            run.name
            for run in platform.runs()
            if run.status in ("COMPLETED", "FAILED", "CANCELLED")
        }
        return names <= closed

    remaining = max(5.0, SCALE.deadline - (time.monotonic() - began))
    wait_for(all_closed, remaining, f"{len(names)} runs to close on the platform")

    # -- the accounting --------------------------------------------------------------
    recorded = sum(producer.recorded for producer in producers)
    acknowledged = sum(producer.exporter.acknowledged for producer in producers)
    refused_at_producer = sum(producer.exporter.refused for producer in producers)
    dropped_by_collector = sum("Dropping data" in line for line in collector.log().splitlines())
    counted_by_serve = {
        key: counts for key, counts in _counters(serve).items() if any(counts.values())
    }
    by_name = {run.name: run for run in platform.runs()}
    delivered = 0
    for producer in producers:
        run = by_name[producer.name]
        assert run.status == "COMPLETED", (producer.name, run.status, run.error_message)
        deliveries = platform.episode_deliveries(run.id)
        assert set(deliveries.values()) <= {1}, f"{producer.name}: an episode stored twice"
        assert set(deliveries) <= {record["id"] for record in producer.records}
        delivered += len(deliveries)
    report = (
        f"recorded {recorded}, acknowledged by the collector {acknowledged}, refused to the "
        f"producers {refused_at_producer}, dropped by the collector {dropped_by_collector} "
        f"batch(es), counted by serve {counted_by_serve}, delivered {delivered}"
    )
    assert all(flushed for producer in producers for flushed in producer.flushed), report
    assert recorded == SCALE.runs * SCALE.episodes_per_run, report
    assert acknowledged == recorded, report  # nothing lost before the collector
    assert refused_at_producer == 0 and dropped_by_collector == 0, report
    assert counted_by_serve == {}, report
    assert delivered == recorded, report  # sent = delivered, nothing silent
    assert len(platform.runs()) == SCALE.runs, "a run was created twice"


def _all_at_once(calls: Sequence[Any]) -> None:
    threads = [threading.Thread(target=call) for call in calls]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
