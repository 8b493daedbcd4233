"""Zero-code: OTEL_TRACES_EXPORTER=prime_runs under opentelemetry-instrument,
the run named by OTEL_RESOURCE_ATTRIBUTES, exactly as a user would run it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from prime_runs_otel.testing import FakePlatform

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
INSTRUMENT = Path(sys.executable).parent / "opentelemetry-instrument"


def _instrumented(script: Path, run_id: str, *extra: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "OTEL_TRACES_EXPORTER": "prime_runs",
        "OTEL_METRICS_EXPORTER": "none",
        "OTEL_LOGS_EXPORTER": "none",
        "OTEL_SERVICE_NAME": "zero-code-eval",
        "OTEL_RESOURCE_ATTRIBUTES": (
            f"prime.run.id={run_id},prime.run.name=zero-code,"
            "prime.run.environments=gsm8k-demo,prime.run.model=demo/model"
        ),
    }
    return subprocess.run(
        [str(INSTRUMENT), sys.executable, str(script), *extra],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )


def test_entry_point_is_registered() -> None:
    from importlib.metadata import entry_points

    [entry] = entry_points(group="opentelemetry_traces_exporter", name="prime_runs")
    from prime_runs_otel import PrimeRunsSpanExporter

    assert entry.load() is PrimeRunsSpanExporter


def test_zero_code_run_completes_on_the_platform(online: FakePlatform) -> None:
    done = _instrumented(EXAMPLES / "zero_code.py", "zero-code-001")
    assert done.returncode == 0, done.stderr
    [platform_run] = online.runs()
    assert platform_run.name == "zero-code"
    assert platform_run.status == "COMPLETED", platform_run.error_message
    assert platform_run.create_payload["model_name"] == "demo/model"
    assert len(online.episodes(platform_run.id)) == 15


def test_zero_code_unhandled_exception_fails_the_run(online: FakePlatform, tmp_path: Path) -> None:
    script = tmp_path / "broken_eval.py"
    script.write_text(
        "from opentelemetry import trace\n"
        "import prime_runs_otel\n"
        "from prime_runs_otel.produce.synthetic import synthetic_episodes\n"
        "tracer = trace.get_tracer('broken')\n"
        "for episode in synthetic_episodes(3):\n"
        "    prime_runs_otel.record_episode(tracer, episode)\n"
        "raise RuntimeError('grader crashed')\n"
    )
    done = _instrumented(script, "zero-code-002")
    assert done.returncode != 0
    [platform_run] = online.runs()
    assert platform_run.status == "FAILED"
    assert "grader crashed" in (platform_run.error_message or "")
    assert len(online.episodes(platform_run.id)) == 3
