"""``PrimeRunsSpanExporter.shutdown(timeout_millis)``: the exporter keeps the
SDK's shutdown contract. The SDK's batch processor hands an exporter whose
``shutdown`` takes ``timeout_millis`` what is left of its own budget, and
the exporter returns within it even with the platform down, leaving what is
not delivered in the spool (and saying how to deliver it)."""

from __future__ import annotations

import inspect
import logging
import threading

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

from prime_runs_otel import PrimeRunsSpanExporter, record_episode
from prime_runs_otel.produce.resource import run_resource
from prime_runs_otel.produce.run_spans import emit_run_end, emit_run_start
from prime_runs_otel.produce.synthetic import synthetic_episodes
from prime_runs_otel.testing import FakePlatform


def test_the_sdk_hands_the_exporter_its_budget() -> None:
    """What the SDK's batch processor checks before passing a budget on."""
    assert "timeout_millis" in inspect.getfullargspec(PrimeRunsSpanExporter.shutdown).args


def test_shutdown_with_the_platform_down_keeps_to_the_budget_it_is_given(
    online: FakePlatform, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    online.start_outage()
    exporter = PrimeRunsSpanExporter()  # as the SDK's configurator builds it: 30 s of its own
    provider = TracerProvider(resource=run_resource(run_id="budgeted", environments=["gsm8k"]))
    processor = BatchSpanProcessor(exporter)
    provider.add_span_processor(processor)
    tracer = provider.get_tracer("t")
    start = emit_run_start(tracer, {})
    for record in synthetic_episodes(3, seed=17):
        record_episode(tracer, record, link=start)
    emit_run_end(tracer, "completed", episodes_recorded=3, link=start)
    processor.force_flush()

    stopping = threading.Thread(target=exporter.shutdown, kwargs={"timeout_millis": 300})
    stopping.start()
    stopping.join(20)  # a guard against a hang, far below the exporter's own 30 s
    assert not stopping.is_alive()

    run = exporter.spool.reading.run("budgeted")
    assert run is not None and not run.closed and run.episodes == 3
    assert exporter.spool.reading.pending_count("budgeted") == 3
    told = [
        r.getMessage() for r in caplog.records if "not closed on the platform" in r.getMessage()
    ]
    assert told and "prime-runs-otel push budgeted" in told[0]
    online.end_outage()
    provider.shutdown()
