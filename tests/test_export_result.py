"""What ``PrimeRunsSpanExporter.export()`` returns, read with the SpanExporter
contract and docs/delivery.md: SUCCESS only when every episode of the batch
is in the spool (acknowledged), FAILURE when any is not, and never a raise.

Real parts: spans from the SDK's TracerProvider, the exporter and its SQLite
spool; the spool's cap is lowered to what it holds, as a spool that filled
up would be.
"""

from __future__ import annotations

from pathlib import Path

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import prime_runs_otel as pro
from prime_runs_otel.produce.synthetic import synthetic_episode


def _spans(count: int) -> tuple[str, list[ReadableSpan]]:
    """A run's start span and ``count`` episode spans, as the SDK ends them."""
    ended = InMemorySpanExporter()
    resource = pro.run_resource(name="capped", environments=["env-a"])
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(SimpleSpanProcessor(ended))
    tracer = provider.get_tracer("prime_runs_otel")
    pro.emit_run_start(tracer, {})
    for index in range(count):
        pro.record_episode(tracer, synthetic_episode(index, target_bytes=20_000), child_spans=False)
    provider.shutdown()
    return str(resource.attributes["prime.run.id"]), list(ended.get_finished_spans())


def test_success_means_every_episode_is_kept_and_failure_that_one_is_not(
    isolated_environment: Path,
) -> None:
    local_id, spans = _spans(6)
    exporter = pro.PrimeRunsSpanExporter(mode="local", deliver=False, shutdown_timeout=0)
    try:
        assert exporter.export(spans[:3]) is SpanExportResult.SUCCESS  # start + 2 episodes
        spool = exporter.spool
        spool.max_bytes = spool.housekeeping.used_bytes() + 1  # full: no room for another episode

        assert exporter.export(spans[3:]) is SpanExportResult.FAILURE
        run = spool.reading.run(local_id)
        assert run is not None
        assert (run.episodes, run.rejected) == (2, 4)

        # A batch already in the spool is acknowledged again, cap or not.
        assert exporter.export(spans[:3]) is SpanExportResult.SUCCESS
    finally:
        exporter.shutdown()
