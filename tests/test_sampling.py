"""A sampler never loses a run's episodes: the run's own spans are always
recorded whatever ``OTEL_TRACES_SAMPLER`` says, other tracers of the run's
provider keep that sampler, and ``OTEL_SDK_DISABLED=true`` means what
``PRIME_RUNS_MODE=disabled`` means.

Each case runs a real run (``start_run``, the SDK's TracerProvider and
BatchSpanProcessor, the exporter, the local spool) and checks what the run
recorded and what reached an in-memory exporter beside it.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from prime_runs_otel import semconv as sc
from prime_runs_otel import start_run
from prime_runs_otel.produce.episode import record_episode
from prime_runs_otel.produce.synthetic import synthetic_episodes
from prime_runs_otel.run import RunResult

EPISODES = 12


def run_under_sampler(
    monkeypatch: pytest.MonkeyPatch, sampler: str, argument: str = ""
) -> tuple[RunResult, InMemorySpanExporter]:
    """A local run of EPISODES episodes with ``sampler`` in the environment,
    and one span of another tracer inside each episode's context and one
    outside any (what an instrumentation of the user's would make)."""
    monkeypatch.setenv("PRIME_RUNS_MODE", "local")
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", sampler)
    if argument:
        monkeypatch.setenv("OTEL_TRACES_SAMPLER_ARG", argument)
    seen = InMemorySpanExporter()
    run = start_run(name="sampled", environments=["gsm8k"], finish_timeout=30, child_spans=False)
    run.tracer_provider.add_span_processor(SimpleSpanProcessor(seen))
    other = run.tracer_provider.get_tracer("the-users-instrumentation")
    for record in synthetic_episodes(EPISODES, seed=5):
        record_episode(run.tracer, record, child_spans=False)
        with other.start_as_current_span("outside any episode"):
            pass
    with run.tracer.start_as_current_span(sc.episode_span_name("gsm8k")) as episode:
        with other.start_as_current_span("inside an episode"):
            pass
        assert episode.is_recording()
    result = run.finish()
    return result, seen


def names(exporter: InMemorySpanExporter) -> list[str]:
    """Span names, every episode span as ``episode``."""
    return [
        "episode" if span.name.startswith("episode") else span.name
        for span in exporter.get_finished_spans()
    ]


def test_traceidratio_keeps_every_episode(monkeypatch: pytest.MonkeyPatch) -> None:
    result, seen = run_under_sampler(monkeypatch, "traceidratio", "0")
    assert result.status == "completed" and result.closed
    assert result.episodes == EPISODES
    recorded = names(seen)
    assert recorded.count("episode") == EPISODES + 1
    assert "prime.run.end" in recorded  # (its start came before this exporter was added)
    # The user's own spans keep the user's sampler: a ratio of 0 drops them.
    assert "outside any episode" not in recorded and "inside an episode" not in recorded


def test_always_off_keeps_every_episode(monkeypatch: pytest.MonkeyPatch) -> None:
    result, seen = run_under_sampler(monkeypatch, "always_off")
    assert result.closed and result.episodes == EPISODES
    recorded = names(seen)
    assert recorded.count("episode") == EPISODES + 1
    assert "outside any episode" not in recorded and "inside an episode" not in recorded


@pytest.mark.parametrize(
    ("sampler", "argument"),
    [("parentbased_always_off", ""), ("parentbased_traceidratio", "0")],
)
def test_parentbased_samplers_keep_every_episode_and_what_runs_inside_it(
    monkeypatch: pytest.MonkeyPatch, sampler: str, argument: str
) -> None:
    result, seen = run_under_sampler(monkeypatch, sampler, argument)
    assert result.closed and result.episodes == EPISODES
    recorded = names(seen)
    assert recorded.count("episode") == EPISODES + 1
    # A root span of the user's is dropped; one inside a (sampled) episode
    # follows its parent, as a parent-based sampler says.
    assert "outside any episode" not in recorded
    assert recorded.count("inside an episode") == 1


def test_otel_sdk_disabled_means_disabled_said_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    caplog.set_level(logging.WARNING)
    results = []
    for name in ("first", "second"):
        with start_run(name=name, environments=["gsm8k"], mode="local") as run:
            for record in synthetic_episodes(3, seed=2):
                run.record_episode(record)
        assert run.result is not None
        results.append(run.result)
    # Nothing waited for a delivery that could not come, nothing was stored.
    assert all(r.mode == "disabled" and r.closed and r.pending == 0 for r in results)
    assert not (tmp_path / "spool").exists()
    said = [r for r in caplog.records if "OTEL_SDK_DISABLED" in r.getMessage()]
    assert len(said) == 1
    assert "PRIME_RUNS_MODE=disabled" in said[0].getMessage()


def test_a_provider_of_ones_own_says_when_its_sampler_drops_an_episode(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Where the package does not own the provider, a dropped episode is
    counted and said, never lost in silence."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.sampling import ALWAYS_OFF

    from prime_runs_otel.produce import episode
    from prime_runs_otel.sampling import DroppedEpisodes

    # A count of this test's own (the process's is shared by every test).
    dropped = DroppedEpisodes()
    monkeypatch.setattr(episode, "dropped_episodes", dropped)
    caplog.set_level(logging.WARNING)
    provider = TracerProvider(sampler=ALWAYS_OFF)
    for record in synthetic_episodes(3, seed=8):
        record_episode(provider.get_tracer("mine"), record)
    assert dropped.count == 3
    said = [r.getMessage() for r in caplog.records if "was not recorded" in r.getMessage()]
    assert said and "parentbased_always_on" in said[0]


ZERO_CODE = textwrap.dedent(
    """
    from opentelemetry import trace
    from prime_runs_otel import episode_span, score_episode

    tracer = trace.get_tracer("user-code")
    for example in range(4):
        with episode_span(tracer, example_id=example) as span:
            score_episode(span, 1.0)
    """
)


def zero_code(script: Path, home: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """``opentelemetry-instrument python script`` with spans to this package
    (``OTEL_TRACES_EXPORTER`` unless ``env`` names others), a home and spool
    of its own, no metrics or logs, and ``env`` on top."""
    launcher = Path(sys.executable).parent / "opentelemetry-instrument"
    return subprocess.run(
        [str(launcher), sys.executable, str(script)],
        env={
            "HOME": str(home),
            "PATH": os.environ.get("PATH", ""),
            "PRIME_RUNS_OTEL_DIR": str(home / "spool"),
            "OTEL_TRACES_EXPORTER": "prime_runs",
            "OTEL_METRICS_EXPORTER": "none",
            "OTEL_LOGS_EXPORTER": "none",
            **env,
        },
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_zero_code_warns_about_a_sampler_that_drops_episodes(tmp_path: Path) -> None:
    """Under opentelemetry-instrument the SDK's configurator builds the
    provider with the environment's sampler: the exporter says so at start,
    and each dropped episode is counted and said."""
    script = tmp_path / "rollouts.py"
    script.write_text(ZERO_CODE)
    done = zero_code(
        script,
        tmp_path,
        PRIME_RUNS_MODE="local",
        OTEL_TRACES_SAMPLER="always_off",
        OTEL_RESOURCE_ATTRIBUTES="prime.run.id=zero-code-sampled,prime.run.environments=gsm8k",
    )
    assert done.returncode == 0, done.stderr
    assert "OTEL_TRACES_SAMPLER=always_off may drop episode spans" in done.stderr
    assert "was not recorded: the tracer's sampler dropped its span" in done.stderr
    assert "4 episode span(s) were dropped by the tracer's sampler" in done.stderr
