"""Secrets never appear in logs, errors, spans or the spool."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import prime_runs_otel as pro
from prime_runs_otel.produce.synthetic import synthetic_episodes
from prime_runs_otel.testing import FakePlatform

SECRET = "pk-secret-7f3a9c1e5b"


def test_api_key_is_in_no_log_spool_or_span(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, isolated_environment: Path
) -> None:
    with FakePlatform(api_key=SECRET) as platform:
        for name, value in platform.client_env().items():
            monkeypatch.setenv(name, value)
        # A refusal first, so error paths log too.
        platform.fail_next(2, status=503)
        caplog.set_level(logging.DEBUG)
        run = pro.start_run(name="secret", environments=["env-a"])
        for record in synthetic_episodes(5):
            run.record_episode(record)
        result = run.finish(timeout=60)
        assert result.closed

        memory = InMemorySpanExporter()
        provider = TracerProvider(resource=pro.run_resource(environments=["env-a"]))
        provider.add_span_processor(SimpleSpanProcessor(memory))
        pro.record_episode(provider.get_tracer("t"), next(synthetic_episodes(1)))

    assert SECRET not in caplog.text
    assert SECRET not in repr(run.settings)
    assert SECRET not in result.describe()
    for span in memory.get_finished_spans():
        assert SECRET not in span.to_json()
    for path in (isolated_environment / "spool").iterdir():
        assert SECRET.encode() not in path.read_bytes(), path.name


def test_wrong_key_error_does_not_echo_it(
    platform: FakePlatform, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    for name, value in platform.client_env().items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("PRIME_API_KEY", SECRET)
    caplog.set_level(logging.DEBUG)
    run = pro.start_run(environments=["env-a"])
    run.record_episode(next(synthetic_episodes(1)))
    result = run.finish(timeout=10)

    assert not result.closed
    assert result.error and "401" in result.error
    assert SECRET not in caplog.text
    assert SECRET not in result.describe()
