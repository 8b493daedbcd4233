"""Small contradictions a new user meets on the command line: an empty RUN
that matched every run, a spool folder that is a file listed as empty, a
viewer address no browser opens, a ``doctor`` that created the store it
checked, ``replay`` naming the endpoint for a file it could not read, and
``prune`` and ``compact`` disagreeing on the same file. Each command runs
as a real subprocess against a real spool."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx

import prime_runs_otel as pro
from prime_runs_otel.produce.synthetic import synthetic_episodes

TIMEOUT = 180


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "prime_runs_otel.cli", *args],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )


def _local_run(name: str, episodes: int = 5) -> str:
    run = pro.start_run(name=name, model="m", environments=["env-a"])
    for record in synthetic_episodes(episodes, seed=2):
        run.record_episode(record)
    return run.finish(timeout=60).local_id


def test_an_empty_run_is_a_usage_error_not_every_run() -> None:
    _local_run("one")
    _local_run("two")
    for args in (["show", ""], ["export", " "], ["rm", ""]):
        done = _cli(*args)
        assert done.returncode == 2, (args, done.stdout)
        assert "RUN is empty" in done.stderr, (args, done.stderr)


def test_a_spool_folder_that_is_a_file_or_missing_is_an_error(tmp_path: Path) -> None:
    a_file = tmp_path / "passwd"
    a_file.write_text("root:x:0:0::/root:/bin/sh\n")
    for command in (["runs"], ["show", "x"], ["export", "x"], ["prune", "--older-than", "1d"]):
        done = _cli(*command, "--spool-dir", str(a_file))
        assert done.returncode == 2, (command, done.stdout)
        assert f"{a_file} is a file, not a store folder" in done.stderr, done.stderr
        missing = _cli(*command, "--spool-dir", str(tmp_path / "nowhere"))
        assert missing.returncode == 2 and "no folder" in missing.stderr, missing.stderr
    # Nothing recorded yet where the settings point (a fresh install) is no error.
    fresh = _cli("runs")
    assert fresh.returncode == 0 and "no runs yet" in fresh.stdout


def test_the_viewer_on_every_interface_prints_an_address_a_browser_opens() -> None:
    _local_run("seen")
    viewer = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "prime_runs_otel.cli",
            "ui",
            "--host",
            "0.0.0.0",
            "--token",
            "secret-token",
            "--port",
            "0",
            "--no-browser",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert viewer.stdout is not None
        first = viewer.stdout.readline()
        second = viewer.stdout.readline()
        url = first.rsplit(": ", 1)[1].strip()
        assert url.startswith("http://127.0.0.1:") and "0.0.0.0" not in first, first
        assert second.startswith("from other machines: http://"), second
        page = httpx.get(url, timeout=60, follow_redirects=True)  # the token, then the page
        assert page.status_code == 200 and "seen" in page.text
    finally:
        viewer.terminate()
        viewer.communicate(timeout=60)


def test_doctor_creates_nothing(tmp_path: Path) -> None:
    store = Path(os.environ["PRIME_RUNS_OTEL_DIR"])
    assert not store.exists()
    done = _cli("doctor", "--json")
    checks = {check["name"]: check for check in json.loads(done.stdout)}
    assert not store.exists(), "doctor created the store it was checking"
    assert checks["spool"]["status"] == "ok"
    assert "no store at" in checks["spool"]["detail"]


def test_replay_names_the_file_it_cannot_read_not_the_endpoint() -> None:
    # A file that opens but cannot be read: the kernel answers EIO at offset 0.
    for extra in (["--otlp-endpoint", "http://127.0.0.1:9"], ["--otlp"], []):
        done = _cli("replay", "/proc/self/mem", *extra)
        assert done.returncode == 2, (extra, done.stderr)
        assert "cannot read /proc/self/mem" in done.stderr, (extra, done.stderr)
        assert "Traceback" not in done.stderr and "endpoint" not in done.stderr


def test_prune_and_compact_agree_on_what_they_freed() -> None:
    kept = _local_run("kept", episodes=60)
    _local_run("pruned", episodes=60)
    pruned = _cli("prune", "--older-than", "0s", "--status", "stored", "--json")
    assert pruned.returncode == 0, pruned.stderr
    removed = json.loads(pruned.stdout)
    assert {item["id"] for item in removed["removed"]} != {kept}
    assert removed["bytes_after"] < removed["bytes_before"]
    compacted = _cli("compact", "--json")
    assert compacted.returncode == 0, compacted.stderr
    report = json.loads(compacted.stdout)
    # compact starts from the size prune left, and finds nothing more to give back.
    assert report["bytes_before"] == removed["bytes_after"], (removed, report)
    assert report["bytes_after"] == report["bytes_before"]
    told = _cli("compact")
    assert "0 B given back" in told.stdout, told.stdout
    assert "from now on" not in told.stdout  # rm and prune already did, before it


def test_demo_with_telemetry_disabled_says_nothing_is_kept() -> None:
    store = Path(os.environ["PRIME_RUNS_OTEL_DIR"])
    for switch in ({"OTEL_SDK_DISABLED": "true"}, {"PRIME_RUNS_MODE": "disabled"}):
        done = subprocess.run(
            [sys.executable, "-m", "prime_runs_otel.cli", "demo", "--episodes", "5"],
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
            env={**os.environ, **switch},
        )
        assert done.returncode == 0, done.stderr
        assert "telemetry is disabled" in done.stdout, done.stdout
        assert "5 recorded, none sent or kept" in done.stdout
        for false_statement in ("kept locally", "stored", " show ", "where to look"):
            assert false_statement not in done.stdout, (switch, done.stdout)
        assert not store.exists(), "a disabled run left a store behind"
