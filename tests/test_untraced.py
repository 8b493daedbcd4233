"""The package's own network calls are never traced, on any thread it runs
them on: with the real httpx instrumentation installed (what
``opentelemetry-bootstrap -a install`` adds, httpx being a dependency), a
run's uploads to the platform make no spans, in process, from ``push``, and
under ``opentelemetry-instrument``.

Each test first shows the instrumentation is live (an httpx call of the
test's own is traced), then that the package's calls were not.
"""

from __future__ import annotations

import json
import textwrap
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from opentelemetry.instrumentation.httpx import HTTPXClientInstrumentor
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from test_sampling import zero_code

import prime_runs_otel as pro
from prime_runs_otel.cli.main import main
from prime_runs_otel.produce.synthetic import synthetic_episodes
from prime_runs_otel.testing import FakePlatform


@pytest.fixture
def traced_httpx() -> Iterator[InMemorySpanExporter]:
    """httpx instrumented for the whole process, its spans kept in memory."""
    spans = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    instrumentor = HTTPXClientInstrumentor()
    instrumentor.instrument(tracer_provider=provider)
    try:
        yield spans
    finally:
        instrumentor.uninstrument()
        provider.shutdown()


def prove_live(spans: InMemorySpanExporter, platform: FakePlatform) -> None:
    with httpx.Client() as client:
        client.get(f"{platform.url}/api/v1/control")
    assert [span.name for span in spans.get_finished_spans()] == ["GET"]
    spans.clear()


def test_a_run_s_uploads_make_no_spans(
    online: FakePlatform, traced_httpx: InMemorySpanExporter
) -> None:
    prove_live(traced_httpx, online)
    with pro.start_run(name="untraced", environments=["gsm8k"]) as run:
        for record in synthetic_episodes(6, seed=3):
            run.record_episode(record)
    assert run.result is not None and run.result.closed and run.result.pending == 0
    assert online.requests()  # the run did talk to the platform
    assert list(traced_httpx.get_finished_spans()) == []


def test_push_makes_no_spans(
    platform: FakePlatform, traced_httpx: InMemorySpanExporter, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = pro.start_run(name="pushed", environments=["gsm8k"], mode="local")
    for record in synthetic_episodes(4, seed=6):
        run.record_episode(record)
    local = run.finish()
    prove_live(traced_httpx, platform)

    for name, value in platform.client_env().items():
        monkeypatch.setenv(name, value)
    assert main(["push", local.local_id]) == 0  # delivery on this (the main) thread
    assert [r.status for r in platform.runs()] == ["COMPLETED"]
    assert list(traced_httpx.get_finished_spans()) == []


ZERO_CODE = textwrap.dedent(
    """
    import httpx
    from opentelemetry import trace
    from prime_runs_otel import record_episode
    from prime_runs_otel.produce.synthetic import synthetic_episodes

    httpx.get(CONTROL_URL)  # the application's own call: traced
    tracer = trace.get_tracer("user-code")
    for record in synthetic_episodes(3, seed=9):
        record_episode(tracer, record)
    """
)


def test_a_zero_code_run_files_none_of_its_own_traffic(
    platform: FakePlatform, tmp_path: Path
) -> None:
    """The issue as it was met: ``opentelemetry-instrument`` with the httpx
    instrumentation installed, spans to the platform and to the console."""
    script = tmp_path / "eval.py"
    script.write_text(f"CONTROL_URL = {platform.url + '/api/v1/control'!r}\n" + ZERO_CODE)
    done = zero_code(
        script,
        tmp_path,
        **platform.client_env(),
        OTEL_TRACES_EXPORTER="prime_runs,console",
        OTEL_RESOURCE_ATTRIBUTES="prime.run.id=zero-code-untraced,prime.run.environments=gsm8k",
    )
    assert done.returncode == 0, done.stderr
    [platform_run] = platform.runs()
    assert platform_run.status == "COMPLETED"
    spans = json.loads("[" + done.stdout.replace("}\n{", "},\n{") + "]")
    http = [
        span["name"]
        for span in spans
        if {"http.request.method", "http.method"} & set(span["attributes"])
    ]
    assert http == ["GET"]  # the application's own call, and not one of the run's
