"""One way into the spool: the same spans, exported in process and sent over
OTLP to ``serve``, cost the same. A damaged record is counted on its run and
refused alone; an item the spool cannot store is refused alone and the rest
of its batch is kept; what differs is only what each sender can be told (a
``SpanExportResult``, an OTLP partial success).

The spool is real, and so is the item it cannot store: a trigger in the
spool's own SQLite file refuses one episode row, as a value SQLite cannot
take would.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import prime_runs_otel as pro
from prime_runs_otel import semconv as sc
from prime_runs_otel.collector.intake import SpanIntake
from prime_runs_otel.config import resolve_settings
from prime_runs_otel.deliver.spool import Spool
from prime_runs_otel.exporter import PrimeRunsSpanExporter
from prime_runs_otel.produce.episode import record_episode
from prime_runs_otel.produce.synthetic import synthetic_episodes

RUN = "one-delivery"


def _spans() -> list[ReadableSpan]:
    """Two good episodes, one the spool will refuse, one with a damaged record."""
    provider = TracerProvider(resource=pro.run_resource(run_id=RUN))
    memory = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("test")
    for episode_id, record in zip(
        ("good-1", "poison", "good-2"), synthetic_episodes(3, seed=21), strict=True
    ):
        record["id"] = episode_id
        record_episode(tracer, record, child_spans=False)
    damaged = {sc.EPISODE_ID: "damaged", sc.EPISODE_RECORD: "{not json"}
    tracer.start_span("episode", attributes=damaged).end()
    return list(memory.get_finished_spans())


def _poison(path: Path) -> None:
    """The spool refuses the row of episode ``poison``, and only it."""
    db = sqlite3.connect(path)
    try:
        db.execute(
            "CREATE TRIGGER poison BEFORE INSERT ON episodes WHEN NEW.episode_id = 'poison' "
            "BEGIN SELECT RAISE(ABORT, 'this row cannot be stored'); END"
        )
        db.commit()
    finally:
        db.close()


def _what_the_spool_holds(spool: Spool) -> tuple[set[str], int, int, int]:
    run = spool.reading.run(RUN)
    assert run is not None
    stored = {row.episode_id for row in spool.reading.iter_episodes(RUN)}
    return stored, run.episodes, run.corrupt, run.rejected


def test_the_same_bad_spans_cost_the_same_in_process_and_over_otlp(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    spans = _spans()

    monkeypatch.setenv("PRIME_RUNS_OTEL_DIR", str(tmp_path / "in-process"))
    exporter = PrimeRunsSpanExporter(deliver=False, shutdown_timeout=0.0, mode="local")
    _poison(exporter.spool.path)
    result = exporter.export(spans)
    in_process = _what_the_spool_holds(exporter.spool)
    exporter.shutdown()

    settings = resolve_settings(spool_dir=str(tmp_path / "serve"), mode="local")
    spool = Spool(settings.spool_path, max_bytes=10**9)
    _poison(spool.path)
    intake = SpanIntake(spool, settings, None)
    verdict = intake.accept(encode_spans(spans))
    over_otlp = _what_the_spool_holds(spool)

    assert in_process == over_otlp == ({"good-1", "good-2"}, 2, 1, 0)
    # Each bad span cost itself only: the rest is acknowledged to each sender.
    assert result is SpanExportResult.SUCCESS
    assert verdict.outcome == "accepted" and verdict.rejected == 2
    assert caplog.text.count("refused episode poison that cannot be stored") == 2


def test_a_batch_refused_at_the_cap_costs_what_its_sender_can_bear(tmp_path: Path) -> None:
    """Over OTLP the sender retries: refused whole, counted nowhere. In
    process nobody sends it again: what fits is kept, the rest counted on
    the run as rejected, and ``export()`` says FAILURE."""
    spans = _spans()[:3]  # the three episodes that would be stored
    caps: list[Any] = []
    for place in ("in-process", "serve"):
        settings = resolve_settings(spool_dir=str(tmp_path / place), mode="local")
        probe = Spool(settings.spool_path, max_bytes=10**9)
        caps.append((settings, probe.housekeeping.used_bytes() + 1))
        probe.close()

    settings, cap = caps[0]
    exporter = PrimeRunsSpanExporter(
        settings=resolve_settings(
            spool_dir=str(tmp_path / "in-process"), mode="local", spool_max_bytes=cap
        ),
        deliver=False,
        shutdown_timeout=0.0,
    )
    assert exporter.export(spans) is SpanExportResult.FAILURE
    run = exporter.spool.reading.run(RUN)
    assert run is not None and run.episodes + run.rejected == 3 and run.rejected >= 1
    exporter.shutdown()

    settings, cap = caps[1]
    intake = SpanIntake(Spool(settings.spool_path, max_bytes=cap), settings, None)
    verdict = intake.accept(encode_spans(spans))
    assert verdict.outcome == "full" and verdict.retry_after
    run = intake.spool.reading.run(RUN)
    assert run is None or (run.episodes, run.rejected) == (0, 0)
