"""`prime-runs-otel doctor`, run as a user would: a subprocess, read its words."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from prime_runs_otel.testing import FakePlatform


def _doctor(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "prime_runs_otel.cli", "doctor", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=dict(os.environ),
    )


def test_all_good_against_the_platform(online: FakePlatform) -> None:
    done = _doctor("--json")
    assert done.returncode == 0, done.stderr
    checks = {check["name"]: check for check in json.loads(done.stdout)}
    assert set(checks) == {"configuration", "spool", "platform API", "Prime Traces"}
    assert checks["platform API"]["status"] == "ok"
    assert checks["spool"]["status"] == "ok"
    assert "API key set" in checks["configuration"]["detail"]
    assert "test-key" not in done.stdout + done.stderr


def test_wrong_key_is_a_failure_with_a_fix(
    online: FakePlatform, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PRIME_API_KEY", "pk-not-the-right-one")
    done = _doctor()
    assert done.returncode == 1
    assert "refused (401)" in done.stdout and "check PRIME_API_KEY" in done.stdout
    assert "pk-not-the-right-one" not in done.stdout + done.stderr


def test_unreachable_platform(monkeypatch: pytest.MonkeyPatch) -> None:
    with FakePlatform() as platform:
        env = platform.client_env()
    for name, value in env.items():
        monkeypatch.setenv(name, value)  # the platform is gone: nothing listens there now
    done = _doctor()
    assert done.returncode == 1
    assert "unreachable" in done.stdout


def test_local_mode_warns_and_passes() -> None:
    done = _doctor()
    assert done.returncode == 0
    assert "runs are kept in the local store" in done.stdout
    assert "set PRIME_API_KEY" in done.stdout


def test_bad_setting_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PRIME_RUNS_MODE", "sometimes")
    done = _doctor()
    assert done.returncode == 1
    assert "PRIME_RUNS_MODE='sometimes'" in done.stdout
