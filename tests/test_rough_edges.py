"""Rough edges a new user hits, each fixed: one clear line instead of a
traceback, no run left looking busy after its process is gone, replays that
land where their options say, a wrong file refused before any run exists,
and space given back after ``rm``. Each command runs as a real subprocess
against a real spool (and the fake platform on loopback where it delivers)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

from prime_runs_otel.produce.synthetic import synthetic_episodes
from prime_runs_otel.testing import FakePlatform

TIMEOUT = 120
CLI = [sys.executable, "-m", "prime_runs_otel.cli"]


def _cli(*args: str, **extra_env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, *args],
        env={**os.environ, **extra_env},
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )


def _ok(*args: str, **extra_env: str) -> str:
    done = _cli(*args, **extra_env)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def _json(*args: str, **extra_env: str) -> Any:
    return json.loads(_ok(*args, "--json", **extra_env))


def _one_error_line(done: subprocess.CompletedProcess[str]) -> str:
    """The command failed with one line on stderr, not a traceback."""
    assert "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("error: "), lines
    return lines[0]


def _write_traces(folder: Path, count: int, seed: int = 5) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "traces.jsonl"
    with path.open("w") as handle:
        for record in synthetic_episodes(count, seed=seed):
            handle.write(json.dumps(record) + "\n")
    return path


# -- one line instead of a traceback ----------------------------------------------------


def test_export_to_a_missing_folder_is_one_line(tmp_path: Path) -> None:
    run = _json("replay", str(_write_traces(tmp_path / "run", 3)), "--environment", "e")
    missing = tmp_path / "missing" / "dir" / "x.jsonl"
    done = _cli("export", run["id"], "-o", str(missing))
    assert done.returncode == 2
    line = _one_error_line(done)
    assert "does not exist" in line and "mkdir -p" in line
    assert not missing.parent.exists()


def test_fake_platform_on_a_taken_port_is_one_line() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        for command in (
            [sys.executable, "-m", "prime_runs_otel.testing", "--port", port],
            [*CLI, "fake-platform", "--port", port],
        ):
            done = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT)
            assert done.returncode == 2
            line = _one_error_line(done)
            assert "in use" in line and "--port" in line


# -- replays land where their options say -----------------------------------------------


def test_replay_under_other_options_is_another_run(tmp_path: Path) -> None:
    path = str(_write_traces(tmp_path / "run", 4))
    plain = _json("replay", path)
    named = _json("replay", path, "--name", "second-look")
    model = _json("replay", path, "--model", "other/m")
    environment = _json("replay", path, "--environment", "env-b")
    ids = {plain["id"], named["id"], model["id"], environment["id"]}
    assert len(ids) == 4
    assert named["name"] == "second-look" and model["model"] == "other/m"
    assert environment["environments"] == ["env-b"]
    # The same options again: the same run, nothing stored twice.
    again = _json("replay", path, "--name", "second-look")
    assert again["id"] == named["id"] and again["episodes"] == 4
    runs = _json("runs")
    assert len(runs) == 4 and all(run["episodes"] == 4 for run in runs)


def test_replaying_a_file_without_episodes_makes_no_run(tmp_path: Path) -> None:
    log = tmp_path / "eval.log"
    log.write_text("".join(f"INFO step {number} done\n" for number in range(23)))
    samples = tmp_path / "samples.jsonl"
    samples.write_text(_ok("export", _json("replay", str(_write_traces(tmp_path / "r", 3)))["id"]))
    before = _json("runs")
    for wrong, lines in ((log, 23), (samples, len(samples.read_text().splitlines()))):
        for extra in ((), ("--otlp-endpoint", "http://127.0.0.1:9")):
            done = _cli("replay", str(wrong), *extra)
            assert done.returncode == 2, done.stdout + done.stderr
            line = _one_error_line(done)
            assert wrong.name in line and "holds no episodes" in line and "traces.jsonl" in line
            assert f"{lines} line(s)" in line and "no run was made" in line
    assert _json("runs") == before


# -- a replay after Ctrl-C completes the run ----------------------------------------------


def _interrupted_replay(path: Path, *extra: str, **extra_env: str) -> None:
    """A replay of ``path`` stopped by Ctrl-C once it is recording."""
    process = subprocess.Popen(
        [*CLI, "replay", str(path), "--environment", "e", *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **extra_env},
    )
    assert process.stderr is not None
    for line in process.stderr:
        if line.startswith("replaying episodes"):
            break
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=TIMEOUT)
    assert process.returncode == 130, err


def test_replaying_again_after_ctrl_c_completes_the_run(tmp_path: Path) -> None:
    path = _write_traces(tmp_path / "big", 3000)
    _interrupted_replay(path)
    [cancelled] = _json("runs")
    assert cancelled["status"] == "cancelled" and cancelled["episodes"] < 3000

    done = _cli("replay", str(path), "--environment", "e", "--json")
    assert done.returncode == 0, done.stderr
    run = json.loads(done.stdout)
    assert run["id"] == cancelled["id"]
    assert (run["status"], run["state"], run["episodes"]) == ("completed", "stored", 3000)
    assert run["error"] is None and run["late"] == 0
    assert "reopened" in done.stderr and "cancelled" in done.stderr


def test_a_run_closed_on_the_platform_stays_cancelled_and_says_why(
    tmp_path: Path, platform: FakePlatform
) -> None:
    online = platform.client_env()
    path = _write_traces(tmp_path / "big", 3000)
    _interrupted_replay(path, **online)
    [cancelled] = _json("runs")
    assert cancelled["status"] == "cancelled" and cancelled["closed"]

    done = _cli("replay", str(path), "--environment", "e", "--json", **online)
    run = json.loads(done.stdout)
    assert run["id"] == cancelled["id"] and run["status"] == "cancelled"
    assert run["episodes"] == 3000 and run["late"] == 3000 - cancelled["episodes"]
    assert "stays cancelled" in done.stderr and "--run-key" in done.stderr
