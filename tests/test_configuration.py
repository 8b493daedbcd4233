"""Configuration precedence (argument → environment → ~/.prime/config.json, as
the prime CLI does) and the OpenTelemetry settings start_run honours."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import prime_runs_otel as pro
from prime_runs_otel.config import resolve_settings
from prime_runs_otel.errors import ConfigError
from prime_runs_otel.produce.synthetic import synthetic_episode


def _write_config(home: Path, **values: object) -> None:
    folder = home / ".prime"
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text(json.dumps(values))


def test_config_file_then_environment_then_argument(
    isolated_environment: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = isolated_environment / "home"
    _write_config(
        home,
        api_key="from-file",
        base_url="https://file.example/api/v1",
        team_id="team-file",
        traces_opt_out=True,
    )
    settings = resolve_settings()
    assert (settings.api_key, settings.base_url, settings.team_id) == (
        "from-file",
        "https://file.example",
        "team-file",
    )
    assert settings.traces_opt_out and settings.mode == "online"

    monkeypatch.setenv("PRIME_API_KEY", "from-env")
    monkeypatch.setenv("PRIME_API_BASE_URL", "https://env.example")
    monkeypatch.setenv("PRIME_TRACES_OPT_OUT", "false")
    settings = resolve_settings()
    assert (settings.api_key, settings.base_url) == ("from-env", "https://env.example")
    assert not settings.traces_opt_out

    settings = resolve_settings(api_key="from-arg", base_url="https://arg.example/")
    assert (settings.api_key, settings.base_url) == ("from-arg", "https://arg.example")
    assert "from-arg" not in repr(settings)


def test_mode_defaults_and_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    assert resolve_settings().mode == "local"
    assert resolve_settings(api_key="k").mode == "online"
    monkeypatch.setenv("PRIME_RUNS_MODE", "online")
    with pytest.raises(ConfigError, match="needs an API key"):
        resolve_settings()
    monkeypatch.setenv("PRIME_RUNS_MODE", "offline")
    with pytest.raises(ConfigError, match="not one of online, local or disabled"):
        resolve_settings()
    monkeypatch.setenv("PRIME_RUNS_MODE", "disabled")
    assert resolve_settings().mode == "disabled"


def test_bad_numbers_are_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PRIME_RUNS_OTEL_FINISH_TIMEOUT", "soon")
    with pytest.raises(ConfigError, match="PRIME_RUNS_OTEL_FINISH_TIMEOUT='soon'"):
        resolve_settings()


def _queue_settings(run: pro.Run) -> tuple[int, int]:
    assert run._queue is not None
    settings = run._queue.settings
    return settings.max_queue_size, settings.max_export_batch_size


def test_start_run_chooses_bsp_settings_unless_otel_bsp_says_otherwise(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    run = pro.start_run(environments=["env-a"])
    assert _queue_settings(run) == (8192, 64)
    run.finish(timeout=10)

    monkeypatch.setenv("OTEL_BSP_MAX_QUEUE_SIZE", "4096")
    monkeypatch.setenv("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "256")
    run = pro.start_run(environments=["env-a"])
    assert _queue_settings(run) == (4096, 256)
    run.finish(timeout=10)


def test_a_run_adds_genai_child_spans_once_somebody_else_listens() -> None:
    listener = InMemorySpanExporter()
    run = pro.start_run(environments=["env-a"])
    run.record_episode(synthetic_episode(0))
    assert run.child_spans is False

    run.tracer_provider.add_span_processor(SimpleSpanProcessor(listener))
    run.record_episode(synthetic_episode(1))
    result = run.finish(timeout=30)

    spans = listener.get_finished_spans()
    names = [span.name for span in spans]
    assert run.child_spans is True
    assert any(name.startswith("invoke_agent ") for name in names)
    assert any(name.startswith("chat ") for name in names)
    # The listener may see the first episode's span too (it is built on the
    # run's producer thread, perhaps after the listener came), but only the
    # episode recorded after it came has children.
    with_children = {
        span.attributes["prime.episode.id"]
        for span in spans
        if span.name.startswith("episode ")
        and any(child.parent and child.parent.span_id == span.context.span_id for child in spans)
    }
    assert with_children == {synthetic_episode(1)["id"]}
    assert result.episodes == 2


@pytest.mark.parametrize(("value", "expected"), [("true", True), ("off", False)])
def test_child_spans_follow_the_argument_then_the_environment(
    monkeypatch: pytest.MonkeyPatch, value: str, expected: bool
) -> None:
    monkeypatch.setenv("PRIME_RUNS_OTEL_CHILD_SPANS", value)
    run = pro.start_run(environments=["env-a"])
    forced = pro.start_run(environments=["env-a"], child_spans=not expected)
    try:
        assert (run.child_spans, forced.child_spans) == (expected, not expected)
    finally:
        run.finish(timeout=10)
        forced.finish(timeout=10)


def test_a_child_spans_setting_that_is_not_a_boolean_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PRIME_RUNS_OTEL_CHILD_SPANS", "sometimes")
    with pytest.raises(ConfigError, match="PRIME_RUNS_OTEL_CHILD_SPANS='sometimes' is not one of"):
        pro.start_run(environments=["env-a"])


def test_disabled_mode_records_nothing(
    monkeypatch: pytest.MonkeyPatch, isolated_environment: Path
) -> None:
    monkeypatch.setenv("PRIME_RUNS_MODE", "disabled")
    run = pro.start_run(environments=["env-a"])
    run.record_episode({"id": "e1", "traces": []})
    result = run.finish()
    assert result.mode == "disabled" and result.closed
    assert not (isolated_environment / "spool").exists()


def test_unwritable_spool_says_what_to_do(
    isolated_environment: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocker = isolated_environment / "not-a-folder"
    blocker.write_text("a file where the spool folder should be")
    monkeypatch.setenv("PRIME_RUNS_OTEL_DIR", str(blocker / "spool"))
    with pytest.raises(pro.PrimeRunsOtelError, match="PRIME_RUNS_OTEL_DIR"):
        pro.start_run(environments=["env-a"])


def test_settings_with_overrides_beside_them_are_refused_by_name(
    isolated_environment: Path,
) -> None:
    """``settings=`` is final: a ``mode=`` or ``spool_dir=`` beside it would
    be ignored, so it is refused, naming them, before anything opens."""
    settings = resolve_settings()
    elsewhere = isolated_environment / "elsewhere"
    with pytest.raises(TypeError, match=r"start_run\(\) got settings= and also mode=, spool_dir="):
        pro.start_run(environments=["env-a"], settings=settings, mode="local", spool_dir=elsewhere)
    with pytest.raises(
        TypeError, match=r"PrimeRunsSpanExporter\(\) got settings= and also api_key="
    ):
        pro.PrimeRunsSpanExporter(settings=settings, api_key="k")
    assert not elsewhere.exists() and not settings.spool_path.exists()
    # Either alone is as before.
    run = pro.start_run(environments=["env-a"], settings=settings)
    assert run.settings.spool_dir == settings.spool_dir
    run.finish(timeout=10)
