"""`prime-runs-otel demo`, as the README's main command runs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "prime_runs_otel.cli", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ),
    )


def test_demo_into_the_local_store() -> None:
    done = _cli("demo", "--episodes", "40")
    assert done.returncode == 0, done.stderr
    assert "into the local store" in done.stdout
    assert "40 stored, 0 pending, 0 failed" in done.stdout
    assert "where to look:" in done.stdout and "prime-runs-otel show" in done.stdout
    [run] = json.loads(_cli("runs", "--json").stdout)
    assert (run["mode"], run["status"], run["episodes"]) == ("local", "completed", 40)
    # Dated from now, so a tracing backend's "recent traces" view shows the demo.
    samples = _cli("export", run["id"], "--what", "samples").stdout.splitlines()
    starts = [json.loads(line)["timing"]["start"] for line in samples]
    assert len(starts) == 40
    assert time.time() - 3600 < min(starts) <= max(starts) < time.time()


def test_demo_against_a_fake_platform() -> None:
    done = _cli("demo", "--episodes", "30", "--fake-platform")
    assert done.returncode == 0, done.stderr
    assert "fake platform listening on http://127.0.0.1:" in done.stdout
    assert "status COMPLETED" in done.stdout
    assert "episodes in Prime Traces: 30" in done.stdout
