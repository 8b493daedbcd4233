"""Settings from outside the process (``OTEL_BSP_*``, ``OTEL_RESOURCE_ATTRIBUTES``)
and zero-code runs nobody named: bad input gets a warning and a sane default
or a clear message, and no episode is dropped for a missing run id."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.sdk.resources import OTELResourceDetector
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from prime_runs_otel.batching import (
    BSP_DEFAULTS,
    SHORTEST_DELAY_MILLIS,
    CountedBatchProcessor,
    bsp_settings,
)
from prime_runs_otel.config import cut_resource_attributes
from prime_runs_otel.deliver.spool import Spool
from prime_runs_otel.read.checks import run_identity

INSTRUMENT = Path(sys.executable).parent / "opentelemetry-instrument"


# -- 9. OTEL_BSP_* as the SDK treats them ------------------------------------------------


def test_bad_bsp_values_warn_and_fall_back(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("OTEL_BSP_MAX_QUEUE_SIZE", "lots")
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "-5")
    monkeypatch.setenv("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "100")
    with caplog.at_level(logging.WARNING):
        chosen = bsp_settings()
    assert chosen.max_queue_size == BSP_DEFAULTS["max_queue_size"][1]
    assert chosen.schedule_delay_millis == BSP_DEFAULTS["schedule_delay_millis"][1]
    assert chosen.max_export_batch_size == 100
    assert "OTEL_BSP_MAX_QUEUE_SIZE='lots'" in caplog.text
    assert "OTEL_BSP_SCHEDULE_DELAY='-5'" in caplog.text


def test_start_run_survives_a_bad_bsp_value(monkeypatch: pytest.MonkeyPatch) -> None:
    import prime_runs_otel as pro

    monkeypatch.setenv("OTEL_BSP_EXPORT_TIMEOUT", "30s")
    run = pro.start_run(name="bsp", environments=["env-a"])
    result = run.finish(timeout=30)
    assert result.closed


@settings(max_examples=200, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from([variable for variable, _ in BSP_DEFAULTS.values()]),
        st.one_of(
            st.text(max_size=12).filter(lambda text: "\x00" not in text),
            st.integers(min_value=-2, max_value=100_000).map(str),
        ),
    )
)
def test_any_bsp_text_gives_usable_settings(values: dict[str, str]) -> None:
    """Whatever the variables say, the SDK's batch processor takes what
    they are read as (0 for the delay among them: the specification allows it)."""
    saved = {name: os.environ.get(name) for name in values}
    try:
        os.environ.update(values)
        chosen = bsp_settings()
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    processor = CountedBatchProcessor(InMemorySpanExporter(), chosen)
    processor.shutdown()
    assert 1 <= chosen.max_export_batch_size <= chosen.max_queue_size
    assert chosen.export_timeout_millis >= 0


def test_a_schedule_delay_of_0_means_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """``OTEL_BSP_SCHEDULE_DELAY=0`` is valid by the specification (export as
    soon as a span ends); the SDK refuses a delay of 0, so the run gets its
    shortest one instead of a ValueError out of ``start_run``."""
    import prime_runs_otel as pro
    from prime_runs_otel.produce.synthetic import synthetic_episode

    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "0")
    assert bsp_settings().schedule_delay_millis == SHORTEST_DELAY_MILLIS
    run = pro.start_run(name="at-once", environments=["env-a"])
    run.record_episode(synthetic_episode(0))
    result = run.finish(timeout=30)
    assert result.closed and result.episodes == 1


# -- 8. a list value in OTEL_RESOURCE_ATTRIBUTES ------------------------------------------


def test_a_comma_in_a_value_is_warned_about_and_pct2c_keeps_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    [message] = cut_resource_attributes("prime.run.id=r1,prime.run.environments=gsm8k,math")
    assert "'math'" in message and "prime.run.environments=...%2Cmath" in message

    monkeypatch.setenv(
        "OTEL_RESOURCE_ATTRIBUTES", "prime.run.id=r1,prime.run.environments=gsm8k%2Cmath"
    )
    assert cut_resource_attributes() == []
    identity = run_identity(dict(OTELResourceDetector().detect().attributes))
    assert identity is not None and identity.environments == ("gsm8k", "math")


@given(st.text(max_size=200))
def test_the_check_never_fails_on_any_text(raw: str) -> None:
    for message in cut_resource_attributes(raw):
        assert "has no '='" in message


# -- 10. zero-code without prime.run.id --------------------------------------------------


def test_zero_code_without_a_run_id_keeps_every_episode(tmp_path: Path) -> None:
    script = tmp_path / "unnamed_eval.py"
    script.write_text(
        "from opentelemetry import trace\n"
        "import prime_runs_otel\n"
        "from prime_runs_otel.produce.synthetic import synthetic_episodes\n"
        "tracer = trace.get_tracer('unnamed')\n"
        "for episode in synthetic_episodes(7):\n"
        "    prime_runs_otel.record_episode(tracer, episode)\n"
    )
    env = {
        **os.environ,
        "OTEL_TRACES_EXPORTER": "prime_runs",
        "OTEL_METRICS_EXPORTER": "none",
        "OTEL_LOGS_EXPORTER": "none",
        "OTEL_SERVICE_NAME": "unnamed-eval",
        "OTEL_RESOURCE_ATTRIBUTES": "prime.run.environments=gsm8k,math",
    }
    done = subprocess.run(
        [str(INSTRUMENT), sys.executable, str(script)],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr
    assert "no prime.run.id" in done.stderr
    assert "'math' has no '='" in done.stderr
    summary = [line for line in done.stderr.splitlines() if "prime-runs-otel: run" in line]
    assert summary and "unnamed-eval" in summary[0] and "7 episode(s)" in summary[0]

    spool_path = Path(os.environ["PRIME_RUNS_OTEL_DIR"]) / "spool.sqlite3"
    [run] = Spool(spool_path, max_bytes=1 << 30).reading.runs()
    assert (run.name, run.episodes, run.end_status) == ("unnamed-eval", 7, "completed")
    assert run.identity.environments == ("gsm8k",)
