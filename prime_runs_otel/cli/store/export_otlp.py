"""``prime-runs-otel export RUN --otlp URL``: a stored run's spans sent to
any tracing backend (Jaeger, Tempo, Phoenix, Langfuse, a collector) after
the fact, without recording the run again.

The spans are the ones the run's producer would have made: the run's
Resource, its start and end, each training step's metrics, and each episode
with its agent and model-call spans (message content included: that is what
a backend is opened for), at the times the records hold. They go through
:class:`~prime_runs_otel.tracing.TracingExporter`, which leaves the record
and config blobs out and sends batches under the OTLP limits, and the
pipeline is flushed every few hundred episodes, so a run of any length goes
out in bounded memory and no span is dropped from a full queue.
"""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Sequence

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

from ..._json import loads as fast_loads
from ...deliver.spool import RunRow, Spool
from ...produce.episode import record_episode
from ...produce.resource import run_resource
from ...produce.run_spans import emit_metrics, emit_run_end, emit_run_start
from ...tracing import TracingExporter
from ..exits import EXIT_INCOMPLETE, EXIT_OK
from ..output import Progress

__all__ = ["export_otlp"]

#: Episodes between two flushes of the pipeline: what the queue holds at most.
FLUSH_EVERY = 200
#: Seconds the OTLP exporter keeps retrying one request; past it the export stops.
SEND_TIMEOUT = 10
_QUEUE_SPANS = 8192


class _Tally(SpanExporter):
    """Counts what the backend took and refused (the batch processor would
    otherwise drop a refusal without a word)."""

    def __init__(self, inner: SpanExporter) -> None:
        self.inner = inner
        self.sent = 0
        self.refused = 0
        self._lock = threading.Lock()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        result = self.inner.export(spans)
        with self._lock:
            if result is SpanExportResult.SUCCESS:
                self.sent += len(spans)
            else:
                self.refused += len(spans)
        return result

    def shutdown(self) -> None:
        self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.inner.force_flush(timeout_millis)


def export_otlp(spool: Spool, run: RunRow, endpoint: str) -> int:
    """The stored run sent to an OTLP/HTTP traces endpoint as the spans its
    producer would have emitted; ``EXIT_INCOMPLETE`` when any were refused."""
    resource = _export_resource(run)
    tally = _Tally(TracingExporter(OTLPSpanExporter(endpoint=endpoint, timeout=SEND_TIMEOUT)))
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(
        BatchSpanProcessor(tally, max_queue_size=_QUEUE_SPANS, max_export_batch_size=512)
    )
    progress = Progress(f"sending spans to {endpoint}", run.episodes, sys.stderr)
    try:
        sent = _send(spool, run, provider, tally, progress)
    finally:
        provider.force_flush()
        provider.shutdown()
        progress.close()
    return _report(run, endpoint, tally, sent)


def _export_resource(run: RunRow) -> Resource:
    """The run's Resource as its producer made it, from what the store kept."""
    identity = run.identity
    return run_resource(
        run_id=run.local_id,
        kind=run.kind,
        name=identity.name,
        model=identity.model,
        environments=identity.environments,
        framework=identity.framework,
        tags=identity.tags,
        description=identity.description,
        team_id=identity.team_id,
        max_steps=identity.max_steps,
        batch_size=identity.batch_size,
        rollouts_per_example=identity.rollouts_per_example,
        seq_len=identity.seq_len,
    )


def _send(
    spool: Spool, run: RunRow, provider: TracerProvider, tally: _Tally, progress: Progress
) -> int:
    """The run's start, metrics rows, episodes and end as spans, until the
    endpoint refuses some; returns the episodes sent."""
    tracer = provider.get_tracer("prime_runs_otel.export")
    sent = 0
    emit_run_start(tracer, run.config or {})
    for metrics in spool.reading.metrics_rows(run.local_id):
        values = json.loads(metrics.row)
        if not metrics.verbatim:
            values.pop("_timestamp", None)
        emit_metrics(tracer, values, step=metrics.step, verbatim=metrics.verbatim)
    for episode in spool.reading.iter_episodes(run.local_id):
        record_episode(tracer, fast_loads(episode.record), capture_content=True)
        sent += 1
        progress.advance()
        if sent % FLUSH_EVERY == 0:
            provider.force_flush()
            if tally.refused:  # unreachable or refusing: the rest would fare no better
                break
    if run.end_status is not None and not tally.refused:
        emit_run_end(tracer, run.end_status, run.end_error, episodes_recorded=run.episodes)
    return sent


def _report(run: RunRow, endpoint: str, tally: _Tally, sent: int) -> int:
    """What was sent, what the store no longer had, and what to check when
    the endpoint refused; the command's exit status."""
    missing = 0 if tally.refused else run.episodes - sent
    print(
        f"sent run {run.local_id}: {sent} episode(s), {tally.sent} span(s) to {endpoint}"
        + (f"; {tally.refused} span(s) refused or not delivered" if tally.refused else "")
    )
    if missing > 0:
        print(
            f"note: {missing} episode(s) have no body kept in the local store and were not sent",
            file=sys.stderr,
        )
    if tally.refused:
        print(
            "the backend refused or could not be reached for some spans: check the URL (an "
            "OTLP/HTTP traces endpoint, e.g. http://127.0.0.1:4318/v1/traces) and that it runs",
            file=sys.stderr,
        )
        return EXIT_INCOMPLETE
    return EXIT_OK
