"""Model calls traced by another instrumentation, in the producer's process,
without episode spans: a run fed only those must not close "completed, 0
episodes" without a word, and plain instrumented code can opt in to one
episode per root trace."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from openinference.instrumentation.openai import OpenAIInstrumentor

import prime_runs_otel
from prime_runs_otel.testing.fake_openai import FakeOpenAI

WARNING = "arrived under no episode span and make no episode"


@pytest.fixture
def fake() -> Iterator[FakeOpenAI]:
    with FakeOpenAI(accuracy=1.0) as server:
        yield server


def _instrumented(run: prime_runs_otel.Run) -> Iterator[None]:
    instrumentor = OpenAIInstrumentor()
    instrumentor.instrument(tracer_provider=run.tracer_provider)
    try:
        yield
    finally:
        instrumentor.uninstrument()


def _app(run: prime_runs_otel.Run, fake: FakeOpenAI, questions: list[tuple[int, int]]) -> None:
    """A plain instrumented app: one request span per question, two model
    calls in it, and one root span that calls no model."""
    # Here, not at the top: openai takes 1.8 s of CPU to import, and every
    # test worker imports each test module while only one runs these tests.
    import openai

    client = openai.OpenAI(base_url=fake.base_url, api_key="k", max_retries=0)
    for index, (a, b) in enumerate(questions):
        with run.tracer.start_as_current_span(f"handle request {index}"):
            messages: list[Any] = [{"role": "user", "content": f"What is {a} + {b}?"}]
            first = client.chat.completions.create(model="policy", messages=messages)
            messages += [
                {"role": "assistant", "content": first.choices[0].message.content},
                {"role": "user", "content": "Are you sure?"},
            ]
            client.chat.completions.create(model="policy", messages=messages)
    with run.tracer.start_as_current_span("health check"):
        pass


def _stored(run_id: str) -> list[dict[str, Any]]:
    done = subprocess.run(
        [sys.executable, "-m", "prime_runs_otel.cli", "export", run_id, "--what", "episodes"],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ),
    )
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines() if line.strip()]


def test_model_calls_under_no_episode_are_reported_in_process(
    fake: FakeOpenAI, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    run = prime_runs_otel.start_run(name="plain", environments=["arith"], mode="local")
    for _ in _instrumented(run):
        _app(run, fake, [(1, 2), (3, 4)])
    result = run.finish()

    assert result.episodes == 0
    warnings = [r.getMessage() for r in caplog.records if WARNING in r.getMessage()]
    assert warnings, "the run closed with no episodes and nothing said why"
    # Said once the requests' traces closed (in process: when their root span
    # ends), not only after a timeout; the total covers both requests.
    assert "(4 so far)" in warnings[-1]
    assert "PRIME_RUNS_OTEL_ROOT_TRACES_AS_EPISODES" in warnings[0]


def test_root_traces_become_episodes_when_asked(
    fake: FakeOpenAI, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PRIME_RUNS_OTEL_ROOT_TRACES_AS_EPISODES", "true")
    caplog.set_level(logging.WARNING)
    run = prime_runs_otel.start_run(name="plain", environments=["arith"], mode="local")
    for _ in _instrumented(run):
        _app(run, fake, [(1, 2), (3, 4), (5, 6)])
    result = run.finish()

    # Three request traces with model calls; the health check is no episode.
    assert result.episodes == 3
    assert not [r for r in caplog.records if WARNING in r.getMessage()]
    records = _stored(run.id)
    assert sorted(record["task"]["data"]["idx"] for record in records) == [0, 1, 2]
    for record in records:
        [trace] = record["traces"]
        assert len(trace["calls"]) == 2
        assert [node["message"]["role"] for node in trace["nodes"]] == [
            "user",
            "assistant",
            "user",
            "assistant",
        ]
        assert record["env"]["name"] == "arith"
    prompts = sorted(record["task"]["data"]["prompt"] for record in records)
    assert prompts == ["What is 1 + 2?", "What is 3 + 4?", "What is 5 + 6?"]
