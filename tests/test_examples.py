"""The examples in examples/ run as a user would run them: as scripts."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from prime_runs_otel.testing import FakePlatform

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


@pytest.mark.parametrize("script", ["eval_in_process.py", "own_tracer_provider.py"])
def test_example_runs_into_the_local_store(script: str) -> None:
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / script)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    listing = subprocess.run(
        [sys.executable, "-m", "prime_runs_otel.cli", "runs", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    [run] = json.loads(listing.stdout)
    assert run["mode"] == "local"
    assert run["status"] == "completed" and run["closed"]
    assert run["episodes"] in (20, 40)


def test_example_delivers_to_the_platform(online: FakePlatform) -> None:
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / "eval_in_process.py")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    [platform_run] = online.runs()
    assert platform_run.status == "COMPLETED"
    assert len(online.episodes(platform_run.id)) == 40
