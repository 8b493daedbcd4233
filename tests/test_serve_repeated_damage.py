"""Copies of one damaged episode span cost ``serve``'s log a line a window,
not a line each, while every copy is still counted (``/metrics``, ``show``).

A real serve on loopback in local mode; the copies go in as a collector (or
a hostile client) would send them, over several OTLP/HTTP requests. The
window itself is driven with a hand-wound clock in process.
"""

from __future__ import annotations

import json
import logging
import re
import subprocess
import sys
from pathlib import Path

import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from test_receiver import ServeProcess, post, serve_env
from test_serve_metrics import scrape

from prime_runs_otel import emit_run_start, record_episode, run_resource
from prime_runs_otel import semconv as sc
from prime_runs_otel.produce.synthetic import synthetic_episode
from prime_runs_otel.read.repeats import MAX_KINDS, RepeatedLines

RUN = "damaged-copies"
REQUESTS = 4
COPIES = 500
FULL_LINE = re.compile(r"episode \S+ arrived damaged and is counted as lost")
SUMMARY = re.compile(r"episodes arrived damaged: (\d+) more like it in the last")


def damaged_copies(copies: int) -> bytes:
    """A run start and ``copies`` copies of one episode span whose record no
    longer matches its digest (a limit on the way cut it)."""
    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=run_resource(run_id=RUN, name=RUN, environments=["m"]))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("copies")
    emit_run_start(tracer, {"temperature": 0.5})
    record_episode(tracer, synthetic_episode(1, seed=3))
    request: ExportTraceServiceRequest = encode_spans(memory.get_finished_spans())
    spans = request.resource_spans[0].scope_spans[0].spans
    (episode,) = [s for s in spans if any(a.key == sc.EPISODE_ID for a in s.attributes)]
    for attribute in episode.attributes:
        if attribute.key == sc.blob_sha256_key(sc.EPISODE_RECORD):
            attribute.value.string_value = "0" * 64
    for _ in range(copies - 1):
        spans.add().CopyFrom(episode)
    return request.SerializeToString()


def test_copies_of_a_damaged_episode_are_one_line_a_window_and_each_counted(
    tmp_path: Path,
) -> None:
    env = serve_env(tmp_path, None)
    serve = ServeProcess(tmp_path, env).start()
    try:
        body = damaged_copies(COPIES)
        for _ in range(REQUESTS):
            answer = post(serve.traces_url, body)
            assert answer.status_code == 200, answer.text
        metrics = scrape(serve)
        refused = 'prime_runs_otel_episodes_refused_total{reason="refused_alone"}'
        assert metrics[refused] == REQUESTS * COPIES
    finally:
        assert serve.stop() == 0
    log = serve.log()
    full = len(FULL_LINE.findall(log))
    summed = sum(int(n) for n in SUMMARY.findall(log))
    # One line in full per window (a window may close between requests on a
    # slow machine), the rest summed up by the time serve stops.
    assert 1 <= full <= REQUESTS
    assert full + summed == REQUESTS * COPIES
    shown = subprocess.run(
        [sys.executable, "-m", "prime_runs_otel.cli", "show", RUN, "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["corrupt"] == REQUESTS * COPIES


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [record.getMessage() for record in caplog.records]


def test_the_window_sums_up_once_an_interval_and_names_each_run(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    lines = RepeatedLines(logging.getLogger("repeats-test"), interval=60.0, clock=clock)
    with caplog.at_level(logging.WARNING, logger="repeats-test"):
        for n in range(100):
            lines.log(logging.ERROR, "things broke", "a", "Run a: thing %d broke", n)
        lines.log(logging.ERROR, "things broke", "b", "Run b: thing %d broke", 0)
        clock.now += 30
        lines.flush()  # the window is still open: nothing yet
        assert _lines(caplog) == ["Run a: thing 0 broke", "Run b: thing 0 broke"]
        clock.now += 31
        lines.flush()
        assert _lines(caplog)[2:] == [
            "Run a: things broke: 99 more like it in the last 61 s, each counted on its run"
        ]
        lines.log(logging.ERROR, "things broke", "a", "Run a: thing %d broke", 100)
        lines.log(logging.ERROR, "things broke", "a", "Run a: thing %d broke", 101)
        clock.now += 61  # the next one after the window closes the window first
        lines.log(logging.ERROR, "things broke", "a", "Run a: thing %d broke", 102)
        assert _lines(caplog)[3:] == [
            "Run a: thing 100 broke",
            "Run a: things broke: 1 more like it in the last 61 s, each counted on its run",
            "Run a: thing 102 broke",
        ]


def test_made_up_run_keys_share_one_window_past_the_bound(
    caplog: pytest.LogCaptureFixture,
) -> None:
    lines = RepeatedLines(logging.getLogger("repeats-test"), clock=Clock())
    with caplog.at_level(logging.WARNING, logger="repeats-test"):
        for n in range(MAX_KINDS + 1000):
            lines.log(logging.ERROR, "things broke", f"run-{n}", "Run run-%d: broke", n)
        lines.flush(everything=True)
    messages = _lines(caplog)
    assert len(messages) == MAX_KINDS + 2
    assert (
        messages[-1]
        == "Other runs: things broke: 999 more like it in the last 1 s, each counted on its run"
    )
